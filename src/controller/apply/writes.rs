//! Every call that changes something: to the API server (Jobs, pods' scheduling gates,
//! GpuJob status and finalizers, Events) and to the quota service. Each is fenced: it
//! starts only while the reconcile's shard is still held in the same term and before
//! that term's deadline. Events are queued so, and written by their own client, which
//! is not fenced: they report what the term recorded, and are written also after the
//! shard moved.
//!
//! Which writes are safe when late (sent after the deadline anyway, by a process paused
//! between the last fence check and the socket): status and finalizer patches carry the
//! resourceVersion they were computed from; deletes carry uid and resourceVersion
//! preconditions; the removal of a pod's scheduling gate carries the pod's
//! resourceVersion; Event series updates carry the Event's resourceVersion; quota calls
//! carry the GpuJob's fencing token (a sequence recorded in its status, with a
//! resourceVersion precondition, before the call). Such a late write either fails, or
//! lands on an object no other replica has written since it was read (a new Event is
//! such an object: it reports a transition this replica recorded while it held the
//! shard). Job creates use stable names (adopted only when the controller owner uid
//! matches) but carry no precondition: a name refuses a second create only while the
//! first Job exists, so a late create can bring back the Job of an attempt that the
//! successor ended and deleted. So the fence is at the pods: every Job's pods are
//! created with the operator's scheduling gate, and only the plan's gate
//! (`core/src/plan/gate.rs`) removes it, from the current attempt's pods; the plan
//! deletes every Job that is not the current attempt's.

use std::sync::atomic::{AtomicBool, Ordering};

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use kube::Client;
use kube::api::{
    Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions, PropagationPolicy,
};
use kube::core::DynamicObject;
use serde_json::json;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::error;

use super::recorder::Recorder;
use crate::api::{FINALIZER_QUOTA, GpuJob, GpuJobStatus, LABEL_KUEUE_QUEUE, SCHEDULING_GATE};
use crate::client::FIELD_MANAGER;
use crate::controller::Fence;
use crate::controller::error::{ApiCall, Error, api_code};
use crate::controller::events::Note;
use crate::controller::job::{generation_of, is_controlled_by, name_taken, same_controller};
use crate::controller::multikueue::WorkerClusters;
use crate::controller::status::merge_patch;
use crate::controller::{claims, gang, rendezvous};
use crate::lease::{Ownership, Tenure};
use crate::quota::{Call, Provider, QuotaProvider, Reserve, ReserveRequest, fencing_token};

#[derive(Clone)]
pub struct Writer {
    client: Client,
    /// MultiKueue's worker clusters: the pods of dispatched attempts are written there.
    workers: WorkerClusters,
    ownership: watch::Receiver<Ownership>,
    recorder: std::sync::Arc<Recorder>,
    quota: Provider,
}

/// A pod as a plan's read found it, on the cluster it is on (`None`: this one).
#[derive(Debug, Clone, Copy)]
pub struct PodRef<'a> {
    pub name: &'a str,
    pub uid: &'a str,
    pub resource_version: &'a str,
    pub cluster: Option<&'a str>,
}

impl<'a> PodRef<'a> {
    pub fn new(
        name: &'a str,
        uid: &'a str,
        resource_version: &'a str,
        cluster: &'a Option<String>,
    ) -> PodRef<'a> {
        PodRef {
            name,
            uid,
            resource_version,
            cluster: cluster.as_deref(),
        }
    }
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer")
            .field("quota", &self.quota)
            .finish_non_exhaustive()
    }
}

/// The object a delete is for, as it was read.
struct Target<'a> {
    what: &'static str,
    ns: &'a str,
    name: &'a str,
    uid: &'a str,
    resource_version: &'a str,
}

/// What creating one of an attempt's own objects (its Service, ResourceClaimTemplate or
/// PodGroup) came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owned {
    /// Created now, or by an earlier run of the same step.
    Done,
    /// A foreign object holds the name: what to tell the user.
    Taken(String),
    /// The API server refuses it (or does not serve its kind): what it said.
    Invalid(String),
}

/// What a create under a stable name found ([`Writer::create_or_read`]).
enum Made<K> {
    Created(K),
    /// The object that already holds the name, read after the 409.
    Exists(K),
    /// Any other answer, for the caller to judge.
    Refused(kube::Error),
}

/// What became of a Job create.
#[derive(Debug)]
pub enum Created {
    /// Created now.
    Job(Box<Job>),
    /// Found already created for this GpuJob (an earlier run of the same step).
    Adopted(Box<Job>),
    /// A Job of this GpuJob holds the name but is not this create's: being deleted, or
    /// built from another generation (a create that landed late). Not adopted.
    Other(Box<Job>),
    /// The API server refused it as invalid (422): terminal for this spec.
    Invalid(String),
    /// The name is taken by a Job this GpuJob does not control.
    NameTaken(String),
}

impl Writer {
    /// `events`: the client Events are written with, on a budget of its own.
    pub fn new(
        client: Client,
        events: Client,
        ownership: watch::Receiver<Ownership>,
        identity: &str,
        quota: Provider,
        event_counts: prometheus::IntCounterVec,
    ) -> Writer {
        Writer {
            recorder: std::sync::Arc::new(Recorder::spawn(events, identity, event_counts)),
            client,
            workers: WorkerClusters::default(),
            ownership,
            quota,
        }
    }

    /// Writes the pods of dispatched attempts on `workers`.
    pub fn with_workers(self, workers: WorkerClusters) -> Writer {
        Writer { workers, ..self }
    }

    /// The client of the cluster a pod is on.
    fn client_of(&self, pod: &PodRef<'_>) -> Result<&Client, Error> {
        match pod.cluster {
            None => Ok(&self.client),
            Some(name) => self
                .workers
                .client(name)
                .ok_or_else(|| Error::UnknownCluster {
                    name: name.to_owned(),
                }),
        }
    }

    /// Events waiting to be written: (state changes, others).
    pub fn events_queued(&self) -> (usize, usize) {
        self.recorder.queued()
    }

    pub fn quota_enabled(&self) -> bool {
        self.quota.enabled()
    }

    /// The term under which objects in `namespace` may be written now; `NotLeader` when
    /// their shard is not held (or its deadline passed).
    pub fn fence_for(&self, namespace: &str) -> Result<Fence, Error> {
        let own = self.ownership.borrow();
        let shard = own.shard_of(namespace);
        match own.valid_tenure(shard, Instant::now()) {
            Some(t) => Ok(Fence {
                shard,
                epoch: t.epoch,
            }),
            _ => Err(Error::NotLeader),
        }
    }

    /// `Err(NotLeader)` unless `fence`'s term still holds: checked before every write
    /// and every call to the outside world.
    pub fn check(&self, fence: &Fence) -> Result<Tenure, Error> {
        let own = self.ownership.borrow();
        match own.valid_tenure(fence.shard, Instant::now()) {
            Some(t) if t.epoch == fence.epoch => Ok(t.clone()),
            _ => Err(Error::NotLeader),
        }
    }

    /// A failed write is `NotLeader` when the term ended meanwhile (the client's own
    /// fence refused it just before sending, or its answer no longer matters).
    fn failed(&self, fence: &Fence, call: ApiCall, e: kube::Error) -> Error {
        match self.check(fence) {
            Err(not_leader) => not_leader,
            Ok(_) => Error::kube(call)(e),
        }
    }

    /// Queues Events on the GpuJob while the term holds; they are written in the
    /// background, also after the shard has moved (the Events client is not fenced: a
    /// new Event is safe when late, and reports what this term recorded). An Event that
    /// cannot be written is logged and dropped: it must never hold up the work it
    /// describes.
    pub fn publish(&self, fence: &Fence, gj: &GpuJob, notes: &[Note]) {
        if self.check(fence).is_err() {
            return;
        }
        self.publish_recorded(gj, notes);
    }

    /// Queues the Events of changes a status write of this term recorded (it went
    /// through): whether the term still holds or not, they happened, and the next
    /// holder sends none for them.
    pub fn publish_recorded(&self, gj: &GpuJob, notes: &[Note]) {
        for n in notes {
            self.recorder.publish(gj, n);
        }
    }

    /// Adds or removes the quota finalizer: one merge patch of `metadata.finalizers`,
    /// carrying the resourceVersion it was computed from.
    pub async fn set_finalizer(
        &self,
        fence: &Fence,
        gj: &GpuJob,
        present: bool,
    ) -> Result<GpuJob, Error> {
        let mut finalizers: Vec<String> = gj.metadata.finalizers.clone().unwrap_or_default();
        finalizers.retain(|f| f != FINALIZER_QUOTA);
        if present {
            finalizers.push(FINALIZER_QUOTA.to_owned());
        }
        let patch = json!({"metadata": {"finalizers": finalizers}});
        self.patch_gpujob(fence, gj, patch, false).await
    }

    /// One merge patch of the status subresource turning `from.status` into `status`,
    /// carrying `from`'s resourceVersion: if anything changed since, the API server
    /// answers 409 and nothing is overwritten.
    pub async fn patch_status(
        &self,
        fence: &Fence,
        from: &GpuJob,
        status: &GpuJobStatus,
    ) -> Result<GpuJob, Error> {
        let serialize = |source| Error::Serialize {
            what: "status",
            source,
        };
        let old =
            serde_json::to_value(from.status.clone().unwrap_or_default()).map_err(serialize)?;
        let new = serde_json::to_value(status).map_err(serialize)?;
        let patch = json!({"status": merge_patch(&old, &new)});
        let written = self.patch_gpujob(fence, from, patch, true).await?;
        // Serialized again only when the answer differs from what was sent.
        if written.status.as_ref() == Some(status) || PRUNING_SAID.load(Ordering::Relaxed) {
            return Ok(written);
        }
        let stored =
            serde_json::to_value(written.status.clone().unwrap_or_default()).map_err(serialize)?;
        let pruned = pruned(&new, &stored);
        if !pruned.is_empty() && !PRUNING_SAID.swap(true, Ordering::Relaxed) {
            // Said once per process: every status write of such a field is pruned again.
            error!(
                fields = %pruned.join(", "),
                "the API server dropped status fields this operator wrote: the GpuJob CRD is older than the operator; apply this release's CRD (deploy/crd/crd.yaml, or the chart's). Until then what those fields record is lost (with status.multiKueueDispatched, pods of attempts MultiKueue dispatched wait at the gate)"
            );
        }
        Ok(written)
    }

    /// One fenced merge patch of GpuJob `gj`, or of its status subresource, always with
    /// `gj`'s resourceVersion as its precondition (term_start.rs relies on every GpuJob
    /// write carrying one). A 409 means the GpuJob moved on: re-read, never overwrite.
    async fn patch_gpujob(
        &self,
        fence: &Fence,
        gj: &GpuJob,
        patch: serde_json::Value,
        status: bool,
    ) -> Result<GpuJob, Error> {
        let ns = gj.metadata.namespace.as_deref().unwrap_or_default();
        let name = gj.metadata.name.as_deref().unwrap_or_default();
        let rv = gj.metadata.resource_version.as_deref();
        let patch = with_precondition(rv, patch).ok_or_else(|| Error::Unconditioned {
            what: format!("GpuJob {ns}/{name}"),
        })?;
        let api: Api<GpuJob> = Api::namespaced(self.client.clone(), ns);
        let pp = PatchParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PatchParams::default()
        };
        self.check(fence)?;
        let sent = if status {
            api.patch_status(name, &pp, &Patch::Merge(&patch)).await
        } else {
            api.patch(name, &pp, &Patch::Merge(&patch)).await
        };
        match sent {
            Ok(updated) => Ok(updated),
            Err(e) if api_code(&e) == Some(409) => Err(Error::Conflict {
                what: format!("GpuJob {ns}/{name}"),
            }),
            Err(e) => Err(self.failed(
                fence,
                if status {
                    ApiCall::PatchStatus
                } else {
                    ApiCall::PatchFinalizers
                },
                e,
            )),
        }
    }

    /// Creates `object` under its stable name, fenced. A 409 reads the object that holds
    /// the name (`read` labels that read's failure): most likely it comes from an earlier
    /// run of this same step, and the caller adopts it only if it is really its own.
    async fn create_or_read<K>(
        &self,
        fence: &Fence,
        api: &Api<K>,
        object: &K,
        read: ApiCall,
    ) -> Result<Made<K>, Error>
    where
        K: kube::Resource
            + Clone
            + serde::de::DeserializeOwned
            + serde::Serialize
            + std::fmt::Debug,
    {
        let pp = PostParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PostParams::default()
        };
        self.check(fence)?;
        match api.create(&pp, object).await {
            Ok(created) => Ok(Made::Created(created)),
            Err(e) if api_code(&e) == Some(409) => {
                let name = object.meta().name.as_deref().unwrap_or_default();
                let existing = api.get(name).await.map_err(Error::kube(read))?;
                Ok(Made::Exists(existing))
            }
            Err(e) => Ok(Made::Refused(e)),
        }
    }

    pub async fn create_job(
        &self,
        fence: &Fence,
        owner_uid: &str,
        job: &Job,
    ) -> Result<Created, Error> {
        let ns = job.metadata.namespace.as_deref().unwrap_or_default();
        let name = job.metadata.name.as_deref().unwrap_or_default();
        let api: Api<Job> = Api::namespaced(self.client.clone(), ns);
        match self
            .create_or_read(fence, &api, job, ApiCall::ReadJob)
            .await?
        {
            Made::Created(created) => Ok(Created::Job(Box::new(created))),
            Made::Exists(existing) if is_controlled_by(&existing, owner_uid) => {
                let same = existing.metadata.deletion_timestamp.is_none()
                    && generation_of(&existing) == generation_of(job);
                Ok(if same {
                    Created::Adopted(Box::new(existing))
                } else {
                    Created::Other(Box::new(existing))
                })
            }
            Made::Exists(_) => Ok(Created::NameTaken(name_taken(ns, name))),
            Made::Refused(kube::Error::Api(s)) if s.code == 422 => Ok(Created::Invalid(s.message)),
            Made::Refused(e) => Err(self.failed(fence, ApiCall::CreateJob, e)),
        }
    }

    /// Creates a multi-node attempt's headless Service (owned by its Job). A foreign one
    /// under its name is `Taken`, and the pods are not let go.
    pub async fn create_service(&self, fence: &Fence, service: &Service) -> Result<Owned, Error> {
        let ns = service.metadata.namespace.as_deref().unwrap_or_default();
        let api: Api<Service> = Api::namespaced(self.client.clone(), ns);
        let taken = rendezvous::name_taken;
        self.create_owned(fence, &api, service, ApiCall::CreateService, taken, None)
            .await
    }

    /// Creates an attempt's ResourceClaimTemplate, before its Job (owned by the
    /// GpuJob). A foreign one under its name is `Taken`, and the Job is not created; a
    /// cluster without `resource.k8s.io/v1`, or one that refuses the request (its CEL
    /// selectors, say), is `Invalid`: the spec cannot run here. An attempt that never
    /// starts leaves only an unused template, collected with the GpuJob.
    pub async fn create_claim_template(
        &self,
        fence: &Fence,
        template: &ResourceClaimTemplate,
    ) -> Result<Owned, Error> {
        let ns = template.metadata.namespace.as_deref().unwrap_or_default();
        let api: Api<ResourceClaimTemplate> = Api::namespaced(self.client.clone(), ns);
        let (call, taken) = (ApiCall::CreateClaimTemplate, claims::name_taken);
        let not_served = "the cluster serves no resource.k8s.io/v1 ResourceClaimTemplates (Dynamic Resource Allocation: Kubernetes 1.34 or later): spec.resources.devices cannot run here; ask for resources.gpus instead";
        self.create_owned(fence, &api, template, call, taken, Some(not_served))
            .await
    }

    /// Creates a multi-node attempt's PodGroup (owned by its Job). A foreign one under
    /// its name is `Taken`, and the pods are not let go.
    pub async fn create_pod_group(
        &self,
        fence: &Fence,
        group: &DynamicObject,
    ) -> Result<Owned, Error> {
        let ns = group.metadata.namespace.as_deref().unwrap_or_default();
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), ns, &gang::resource());
        let (call, taken) = (ApiCall::CreatePodGroup, gang::name_taken);
        self.create_owned(fence, &api, group, call, taken, None)
            .await
    }

    /// Creates one of an attempt's objects, owned by its controller owner reference. One
    /// of that name with the same controller exists already (an earlier run of this
    /// step): `Done`. A foreign one: `Taken` with `taken(namespace, name)`. Refused as
    /// invalid (422), or not served (404, when `not_served` says what that means):
    /// `Invalid`. The objects are named for what they hold (the template by a hash of
    /// its request), so an object of the same name and owner is the same object.
    async fn create_owned<K>(
        &self,
        fence: &Fence,
        api: &Api<K>,
        object: &K,
        call: ApiCall,
        taken: fn(&str, &str) -> String,
        not_served: Option<&str>,
    ) -> Result<Owned, Error>
    where
        K: kube::Resource
            + Clone
            + serde::de::DeserializeOwned
            + serde::Serialize
            + std::fmt::Debug,
    {
        let meta = object.meta();
        let ns = meta.namespace.as_deref().unwrap_or_default();
        let name = meta.name.as_deref().unwrap_or_default();
        match self.create_or_read(fence, api, object, call).await? {
            Made::Created(_) => Ok(Owned::Done),
            Made::Exists(existing) if same_controller(existing.meta(), meta) => Ok(Owned::Done),
            Made::Exists(_) => Ok(Owned::Taken(taken(ns, name))),
            Made::Refused(kube::Error::Api(s)) if s.code == 422 => Ok(Owned::Invalid(s.message)),
            Made::Refused(kube::Error::Api(s)) if s.code == 404 && not_served.is_some() => {
                Ok(Owned::Invalid(not_served.unwrap_or_default().to_owned()))
            }
            Made::Refused(e) => Err(self.failed(fence, call, e)),
        }
    }

    /// Lets pod `name` go: removes the operator's scheduling gate (a strategic merge
    /// patch deleting that gate by name; other gates stay), with the resourceVersion the
    /// plan's read found as precondition. Changed or gone since: `Conflict`, so the pods
    /// are read and decided again.
    pub async fn ungate_pod(&self, fence: &Fence, ns: &str, pod: &PodRef<'_>) -> Result<(), Error> {
        let api: Api<Pod> = Api::namespaced(self.client_of(pod)?.clone(), ns);
        let patch = json!({
            "metadata": {"resourceVersion": pod.resource_version},
            "spec": {"schedulingGates": [{"$patch": "delete", "name": SCHEDULING_GATE}]},
        });
        let what = match pod.cluster {
            None => format!("pod {ns}/{}", pod.name),
            Some(worker) => format!("pod {ns}/{} on worker cluster {worker}", pod.name),
        };
        self.patch_precondition(fence, &api, &what, pod.name, &patch, ApiCall::UngatePod)
            .await
            .map_err(Error::on_worker(pod.cluster))
    }

    /// Puts the operator's scheduling gate on the pod template of Job `name`, which an
    /// earlier version created suspended without it, and either gives it Kueue
    /// LocalQueue `queue`'s label (Kueue admits and starts it) or, without one,
    /// unsuspends it: one patch with the Job's resourceVersion as precondition. The API
    /// server lets the scheduling gates of a suspended Job's template change while the
    /// Job has never run.
    pub async fn gate_job(
        &self,
        fence: &Fence,
        ns: &str,
        name: &str,
        resource_version: &str,
        queue: Option<&str>,
    ) -> Result<(), Error> {
        let api: Api<Job> = Api::namespaced(self.client.clone(), ns);
        let mut patch = json!({
            "metadata": {"resourceVersion": resource_version},
            "spec": {"template": {"spec": {"schedulingGates": [{"name": SCHEDULING_GATE}]}}},
        });
        match queue {
            Some(queue) => patch["metadata"]["labels"] = json!({LABEL_KUEUE_QUEUE: queue}),
            None => patch["spec"]["suspend"] = json!(false),
        }
        let what = format!("Job {ns}/{name}");
        self.patch_precondition(fence, &api, &what, name, &patch, ApiCall::GateJob)
            .await
    }

    /// One fenced strategic merge patch of `name` (`what`: its kind, namespace and name,
    /// for the error) carrying a resourceVersion precondition; the object changed or gone
    /// since it was read is `Conflict`.
    async fn patch_precondition<K>(
        &self,
        fence: &Fence,
        api: &Api<K>,
        what: &str,
        name: &str,
        patch: &serde_json::Value,
        call: ApiCall,
    ) -> Result<(), Error>
    where
        K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        let pp = PatchParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PatchParams::default()
        };
        self.check(fence)?;
        match api.patch(name, &pp, &Patch::Strategic(patch)).await {
            Ok(_) => Ok(()),
            Err(e) if matches!(api_code(&e), Some(404 | 409)) => Err(Error::Conflict {
                what: what.to_owned(),
            }),
            Err(e) => Err(self.failed(fence, call, e)),
        }
    }

    /// Deletes a Job with uid and resourceVersion preconditions: a finished attempt's Job
    /// with background propagation (batch/v1 would orphan its pods otherwise), a running
    /// attempt's Job being replaced or stopped, or a stray one, in the foreground (the Job
    /// stays until its pods are gone; one MultiKueue dispatched has none here, and its
    /// copy's pods on the worker are waited for by the gate). Gone already: done. Changed since it was read (409, precondition
    /// failed): `Conflict`, so the GpuJob is read again and decided again; never "done".
    pub async fn delete_job(
        &self,
        fence: &Fence,
        ns: &str,
        name: &str,
        uid: &str,
        resource_version: &str,
        foreground: bool,
    ) -> Result<(), Error> {
        let api: Api<Job> = Api::namespaced(self.client.clone(), ns);
        let propagation = if foreground {
            PropagationPolicy::Foreground
        } else {
            PropagationPolicy::Background
        };
        let target = Target {
            what: "Job",
            ns,
            name,
            uid,
            resource_version,
        };
        self.delete(fence, &api, &target, propagation, ApiCall::DeleteJob)
            .await
    }

    /// Deletes a pod that waits at the gate and is not the current attempt's, with uid and
    /// resourceVersion preconditions (changed since it was read: `Conflict`, read again).
    /// It was never placed, so it goes at once.
    pub async fn delete_pod(&self, fence: &Fence, ns: &str, pod: &PodRef<'_>) -> Result<(), Error> {
        let api: Api<Pod> = Api::namespaced(self.client_of(pod)?.clone(), ns);
        let target = Target {
            what: "pod",
            ns,
            name: pod.name,
            uid: pod.uid,
            resource_version: pod.resource_version,
        };
        self.delete(
            fence,
            &api,
            &target,
            PropagationPolicy::Background,
            ApiCall::DeletePod,
        )
        .await
        .map_err(Error::on_worker(pod.cluster))
    }

    /// Deletes the GpuJob itself, with uid and resourceVersion preconditions (a GpuJob
    /// changed since it was read, a rerun asked for say, is decided again). Its Jobs go
    /// with it (owner references); a quota finalizer still holds it until released.
    pub async fn delete_gpujob(
        &self,
        fence: &Fence,
        gj: &GpuJob,
        uid: &str,
        resource_version: &str,
    ) -> Result<(), Error> {
        let ns = gj.metadata.namespace.as_deref().unwrap_or_default();
        let name = gj.metadata.name.as_deref().unwrap_or_default();
        let api: Api<GpuJob> = Api::namespaced(self.client.clone(), ns);
        let target = Target {
            what: "GpuJob",
            ns,
            name,
            uid,
            resource_version,
        };
        self.delete(
            fence,
            &api,
            &target,
            PropagationPolicy::Background,
            ApiCall::DeleteGpuJob,
        )
        .await
    }

    /// One fenced delete carrying the uid and resourceVersion it was decided on.
    async fn delete<K>(
        &self,
        fence: &Fence,
        api: &Api<K>,
        t: &Target<'_>,
        propagation: PropagationPolicy,
        call: ApiCall,
    ) -> Result<(), Error>
    where
        K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        let dp = DeleteParams {
            propagation_policy: Some(propagation),
            preconditions: Some(Preconditions {
                uid: Some(t.uid.to_owned()),
                resource_version: Some(t.resource_version.to_owned()),
            }),
            ..DeleteParams::default()
        };
        self.check(fence)?;
        match api.delete(t.name, &dp).await {
            Ok(_) => Ok(()),
            Err(e) if api_code(&e) == Some(404) => Ok(()),
            Err(e) if api_code(&e) == Some(409) => Err(Error::Conflict {
                what: format!("{} {}/{}", t.what, t.ns, t.name),
            }),
            Err(e) => Err(self.failed(fence, call, e)),
        }
    }

    /// The quota call context: the GpuJob's fencing token for this call, and the
    /// term's deadline (a call still unanswered then is abandoned).
    fn call(&self, fence: &Fence, uid: &str, sequence: i64) -> Result<Call, Error> {
        let tenure = self.check(fence)?;
        Ok(Call {
            token: Some(fencing_token(uid, sequence)),
            deadline: tenure.deadline,
        })
    }

    pub async fn reserve(
        &self,
        fence: &Fence,
        req: &ReserveRequest,
        sequence: i64,
    ) -> Result<Reserve, Error> {
        let call = self.call(fence, &req.uid, sequence)?;
        Ok(self.quota.reserve(req, &call).await?)
    }

    pub async fn release(&self, fence: &Fence, uid: &str, sequence: i64) -> Result<(), Error> {
        let call = self.call(fence, uid, sequence)?;
        Ok(self.quota.release(uid, &call).await?)
    }
}

/// Whether the pruning of status fields was logged (once per process).
static PRUNING_SAID: AtomicBool = AtomicBool::new(false);

/// The top-level fields of status `sent` that `stored`, the API server's answer to the
/// write, does not have: pruned by a CRD schema without them.
fn pruned(sent: &serde_json::Value, stored: &serde_json::Value) -> Vec<String> {
    let (Some(sent), Some(stored)) = (sent.as_object(), stored.as_object()) else {
        return Vec::new();
    };
    sent.keys()
        .filter(|k| !stored.contains_key(*k))
        .cloned()
        .collect()
}

/// `patch` with `metadata.resourceVersion` set to `rv`, the version of the GpuJob it was
/// computed from: the API server applies it only while the GpuJob is still at that
/// version. `None` without a version (a view that did not come from the API server):
/// such a patch would apply to any version.
fn with_precondition(rv: Option<&str>, mut patch: serde_json::Value) -> Option<serde_json::Value> {
    let rv = rv.filter(|v| !v.is_empty())?;
    let body = patch.as_object_mut()?;
    let metadata = body
        .entry("metadata")
        .or_insert_with(|| json!({}))
        .as_object_mut()?;
    metadata.insert("resourceVersion".to_owned(), json!(rv));
    Some(patch)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_gpujob_patch_carries_the_version_it_was_computed_from() {
        let status = with_precondition(Some("42"), json!({"status": {"attempts": 2}}));
        assert_eq!(
            status,
            Some(json!({"metadata": {"resourceVersion": "42"}, "status": {"attempts": 2}}))
        );
        let finalizers = with_precondition(Some("43"), json!({"metadata": {"finalizers": ["f"]}}));
        assert_eq!(
            finalizers,
            Some(json!({"metadata": {"finalizers": ["f"], "resourceVersion": "43"}}))
        );
    }

    #[test]
    fn status_fields_an_older_crd_prunes_are_found() {
        let sent = json!({"attempts": 1, "multiKueueDispatched": true, "phase": "Running"});
        let stored = json!({"attempts": 1, "phase": "Running"});
        assert_eq!(pruned(&sent, &stored), vec!["multiKueueDispatched"]);
        assert!(pruned(&sent, &sent).is_empty());
        // Values the API server stores otherwise are not pruning.
        let other = json!({"attempts": 2, "multiKueueDispatched": true, "phase": "Pending"});
        assert!(pruned(&sent, &other).is_empty());
    }

    #[test]
    fn a_view_without_a_version_is_never_patched() {
        assert_eq!(with_precondition(None, json!({"status": {}})), None);
        assert_eq!(with_precondition(Some(""), json!({"status": {}})), None);
    }
}
