//! The reads a plan asks for, made by the executor beside its writes: with the read of
//! the object that holds a stable name after a create's 409 (`writes.rs`: a write's
//! answer), the only reads of the API server a reconcile makes (the watches feed the
//! caches). A read of where a term began that fails is not an error: it is logged, and
//! the shard's GpuJobs are confirmed one by one meanwhile. Each read is made
//! while the reconcile's shard is still held (`Writer::check`), so a replica that lost
//! a shard stops reading its GpuJobs as it stops writing them. What a read found goes
//! back as an outcome (for the view) and an answer (for the next plan).

use std::sync::Arc;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate};
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use kube::core::GroupVersionKind;
use tracing::{debug, info, warn};

use crate::api::{GpuJob, LABEL_ATTEMPT, LABEL_UID};
use crate::controller::multikueue::{self, Copy, WorkerClusters};
use crate::controller::view::Outcome;
use crate::controller::{Key, claims};

use super::{Answer, End, Execution};
use crate::controller::error::{ApiCall, Error};
use crate::controller::job::job_name;
use crate::controller::plan::{
    Found, FoundJob, NodeHealth, NodeState, QueueWait, Read, node_state_of, termination_of,
    unschedulable_of, workload_wait,
};
use crate::controller::seen_job::SeenJob;
use crate::controller::seen_pod::SeenPod;

/// GpuJobs per page of a term start's list: a page's metadata is well under a MiB.
const TERM_START_PAGE: u32 = 500;

/// Where a term began in one namespace ([`Reader::term_start`]).
#[derive(Debug)]
pub struct TermStart {
    pub start: u64,
    /// The namespace's GpuJobs then: (name, resourceVersion).
    pub listed: Vec<(String, String)>,
}

/// Reads of the API server, on the operator's client, and of the pods on MultiKueue's
/// worker clusters, on theirs.
#[derive(Clone)]
pub struct Reader {
    client: Client,
    workers: WorkerClusters,
}

impl std::fmt::Debug for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader").finish_non_exhaustive()
    }
}

impl Reader {
    pub fn new(client: Client) -> Reader {
        Reader {
            client,
            workers: WorkerClusters::default(),
        }
    }

    /// Reads the pods of dispatched attempts on `workers` too.
    pub fn with_workers(self, workers: WorkerClusters) -> Reader {
        Reader { workers, ..self }
    }

    /// The GpuJob as the API server has it now (a quorum read); `None` when it is gone,
    /// or replaced by a new GpuJob of the same name (another `uid`).
    pub async fn gpujob(&self, key: &Key, uid: &str) -> Result<Option<GpuJob>, Error> {
        let api: Api<GpuJob> = Api::namespaced(self.client.clone(), &key.namespace);
        let current = api
            .get_opt(&key.name)
            .await
            .map_err(Error::kube(ApiCall::ReadGpuJob))?;
        Ok(current.filter(|g| g.metadata.uid.as_deref() == Some(uid)))
    }

    /// The pods labelled with GpuJob uid `uid`: a list without a resourceVersion, which
    /// the API server answers with what is current (a quorum read); on this cluster, and
    /// on every MultiKueue worker cluster the operator was given when `on_workers` (the
    /// plan's `Action::ReadPods`: an attempt of the GpuJob was dispatched, and may still
    /// have pods stopping there). A worker's pods as the gate must see them
    /// ([`multikueue::as_managed`]), from the GpuJob's Jobs MultiKueue dispatched
    /// (`dispatched`: name and uid of each) and the worker's copies of them, read after
    /// the pods (a copy made after the pod list has no pod in it).
    pub async fn pods(
        &self,
        ns: &str,
        uid: &str,
        dispatched: &[(String, String)],
        on_workers: bool,
    ) -> Result<Vec<SeenPod>, Error> {
        let selector = format!("{LABEL_UID}={uid}");
        let list = pods_labelled(&self.client, ns, &selector).await?;
        let mut pods: Vec<SeenPod> = list.iter().filter_map(SeenPod::of).collect();
        let workers = self.workers.iter().filter(|_| on_workers);
        for worker in workers {
            let named = Error::on_worker(Some(&worker.name));
            let there = pods_labelled(&worker.client, ns, &selector)
                .await
                .map_err(named)?;
            if there.is_empty() {
                continue;
            }
            let copies = match dispatched {
                // Nothing to count as a Job here: every pod there is another Job's.
                [] => Vec::new(),
                _ => copies(&worker.client, ns, &selector)
                    .await
                    .map_err(Error::on_worker(Some(&worker.name)))?,
            };
            let seen = there.iter().filter_map(SeenPod::of).collect();
            pods.extend(multikueue::as_managed(
                seen,
                &worker.name,
                &copies,
                dispatched,
            ));
        }
        Ok(pods)
    }

    /// Where a term that began now begins, read in namespace `ns`: the store's
    /// resourceVersion, from a quorum list of the metadata of `ns`'s GpuJobs (the
    /// GpuJob's own namespace: one this replica may list whatever its install's
    /// scope), with the version each GpuJob was at (name, resourceVersion). Its pages
    /// are one snapshot (a continued list is served at the first page's version).
    /// `None`, said in a warning, when it cannot be read.
    pub async fn term_start(&self, ns: &str, shard: u32) -> Option<TermStart> {
        let api: Api<GpuJob> = Api::namespaced(self.client.clone(), ns);
        let mut start = None;
        let mut listed = Vec::new();
        let mut params = ListParams::default().limit(TERM_START_PAGE);
        loop {
            let page = match api.list_metadata(&params).await {
                Ok(page) => page,
                Err(e) => {
                    warn!(
                        shard,
                        namespace = ns,
                        error = %e,
                        "could not read where this term of the shard began in the namespace; its GpuJobs are read one by one from the API server before their first Job or quota call until it is known"
                    );
                    return None;
                }
            };
            if start.is_none() {
                let version = page.metadata.resource_version.unwrap_or_default();
                // Not a number: never taken for a start (`term_start.rs`).
                let Ok(v) = version.parse::<u64>() else {
                    warn!(
                        shard,
                        namespace = ns,
                        version,
                        "the list of the namespace's GpuJobs gave a resourceVersion that is not a number; its GpuJobs are read one by one from the API server before their first Job or quota call"
                    );
                    return None;
                };
                start = Some(v);
            }
            listed.extend(
                page.items
                    .into_iter()
                    .filter_map(|g| Some((g.metadata.name?, g.metadata.resource_version?))),
            );
            match page.metadata.continue_ {
                Some(next) if !next.is_empty() => params = params.continue_token(&next),
                _ => break,
            }
        }
        let read = TermStart {
            start: start?,
            listed,
        };
        debug!(
            shard,
            namespace = ns,
            start = read.start,
            gpujobs = read.listed.len(),
            "read where this term of the shard began in the namespace"
        );
        Some(read)
    }

    /// One of the plan's reads ([`Read`]) for the GpuJob `key` with uid `uid`.
    pub async fn read(&self, key: &Key, uid: &str, read: &Read) -> Result<Found, Error> {
        let ns = &key.namespace;
        Ok(match read {
            Read::Job { attempt } => {
                let api: Api<Job> = Api::namespaced(self.client.clone(), ns);
                let found = api
                    .get_opt(&job_name(&key.name, *attempt))
                    .await
                    .map_err(Error::kube(ApiCall::ReadJob))?;
                let job = match found.as_ref().map(SeenJob::of) {
                    None => FoundJob::Absent,
                    Some(Some(job)) if job.is_controlled_by(uid) => FoundJob::Ours(Box::new(job)),
                    Some(_) => FoundJob::Foreign,
                };
                Found::Job {
                    attempt: *attempt,
                    job,
                }
            }
            Read::Termination {
                attempt,
                job_uid,
                dispatched,
            } => {
                let pods = self
                    .pods_of_job(ns, uid, *attempt, job_uid, *dispatched)
                    .await?;
                let pods: Vec<Pod> = pods.into_iter().map(|(_, pod)| pod).collect();
                Found::Termination {
                    attempt: *attempt,
                    termination: termination_of(*attempt, &pods),
                }
            }
            Read::Placement {
                attempt,
                job_uid,
                dispatched,
            } => {
                let found = self
                    .pods_of_job(ns, uid, *attempt, job_uid, *dispatched)
                    .await?;
                let seen = found
                    .iter()
                    .filter_map(|(cluster, pod)| {
                        let cluster = cluster.clone();
                        SeenPod::of(pod).map(|p| SeenPod { cluster, ..p })
                    })
                    .collect();
                let pods: Vec<Pod> = found.into_iter().map(|(_, pod)| pod).collect();
                Found::Placement {
                    attempt: *attempt,
                    unschedulable: unschedulable_of(*attempt, &pods),
                    pods: seen,
                }
            }
            Read::Workload { attempt, job_uid } => {
                Found::Workload(self.workload(ns, job_uid, *attempt).await?)
            }
            Read::Node { name } => Found::Node(NodeHealth {
                name: name.clone(),
                state: self.node(name).await?,
            }),
            Read::Devices { attempt } => Found::Devices {
                attempt: *attempt,
                claims: self.claims(ns, uid, *attempt).await?,
            },
            Read::ClaimTemplate { attempt, name } => {
                let api: Api<ResourceClaimTemplate> = Api::namespaced(self.client.clone(), ns);
                let found = match api.get_opt(name).await {
                    Ok(found) => found,
                    // No resource.k8s.io/v1: no template holds the name.
                    Err(kube::Error::Api(e)) if e.code == 404 => None,
                    Err(e) => return Err(Error::kube(ApiCall::ReadClaimTemplate)(e)),
                };
                Found::ClaimTemplate {
                    attempt: *attempt,
                    foreign: found.is_some_and(|t| !claims::is_owned_by(&t, uid)),
                }
            }
        })
    }

    /// What each ResourceClaim of the GpuJob's (uid `uid`) attempt was allocated: its
    /// pods' claims carry the template's labels. None where the cluster serves no
    /// `resource.k8s.io/v1`.
    async fn claims(
        &self,
        ns: &str,
        uid: &str,
        attempt: i32,
    ) -> Result<Vec<Option<String>>, Error> {
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), ns);
        let selector = format!("{LABEL_UID}={uid},{LABEL_ATTEMPT}={attempt}");
        match api.list(&ListParams::default().labels(&selector)).await {
            Ok(list) => Ok(list.items.iter().map(claims::alternative).collect()),
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(Vec::new()),
            Err(e) => Err(Error::kube(ApiCall::ReadClaims)(e)),
        }
    }

    /// Whether the Node `name` can still stop its pods. An install that may not read
    /// Nodes (the chart's namespaced mode without its ClusterRole: 403) is not an
    /// error: the node's state is unknown, and the GpuJob says only that the old pod
    /// is stopping.
    async fn node(&self, name: &str) -> Result<NodeState, Error> {
        let api: Api<Node> = Api::all(self.client.clone());
        match api.get_opt(name).await {
            Ok(Some(node)) => Ok(node_state_of(&node)),
            Ok(None) => Ok(NodeState::Gone),
            Err(kube::Error::Api(e)) if e.code == 403 => {
                debug!(
                    node = name,
                    "may not read Nodes: the node's state is unknown"
                );
                Ok(NodeState::Unreadable)
            }
            Err(e) => Err(Error::kube(ApiCall::ReadNode)(e)),
        }
    }

    /// The pods of attempt `attempt`'s Job (uid `job_uid`) of the GpuJob with uid `uid`:
    /// by the Job's `controller-uid` label; one MultiKueue dispatched (`dispatched`), on
    /// every worker cluster by the GpuJob's uid and the attempt (a copy there has a uid
    /// of its own).
    async fn pods_of_job(
        &self,
        ns: &str,
        uid: &str,
        attempt: i32,
        job_uid: &str,
        dispatched: bool,
    ) -> Result<Vec<(Option<String>, Pod)>, Error> {
        if !dispatched {
            let here =
                pods_labelled(&self.client, ns, &format!("controller-uid={job_uid}")).await?;
            return Ok(here.into_iter().map(|pod| (None, pod)).collect());
        }
        let selector = format!("{LABEL_UID}={uid},{LABEL_ATTEMPT}={attempt}");
        let mut pods = Vec::new();
        for worker in self.workers.iter() {
            let there = pods_labelled(&worker.client, ns, &selector)
                .await
                .map_err(Error::on_worker(Some(&worker.name)))?;
            pods.extend(
                there
                    .into_iter()
                    .map(|pod| (Some(worker.name.clone()), pod)),
            );
        }
        Ok(pods)
    }

    /// Why Kueue holds the Job with uid `job_uid`, from its Workload (found by Kueue's
    /// label `kueue.x-k8s.io/job-uid`). A cluster without Kueue's API says so.
    async fn workload(&self, ns: &str, job_uid: &str, attempt: i32) -> Result<QueueWait, Error> {
        // Kueue's Workloads (`kueue.x-k8s.io/v1beta2`, served from Kueue 0.15).
        let workloads = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("kueue.x-k8s.io", "v1beta2", "Workload"),
            "workloads",
        );
        let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), ns, &workloads);
        let listed = api
            .list(&ListParams::default().labels(&format!("kueue.x-k8s.io/job-uid={job_uid}")))
            .await;
        let list = match listed {
            Ok(list) => list,
            Err(kube::Error::Api(e)) if e.code == 404 => {
                return Ok(QueueWait {
                    attempt,
                    reason: "KueueNotInstalled".to_owned(),
                    message: "the cluster serves no kueue.x-k8s.io/v1beta2 Workloads: is Kueue (0.15 or later) installed?".to_owned(),
                });
            }
            Err(e) => return Err(Error::kube(ApiCall::ReadWorkload)(e)),
        };
        Ok(match list.items.first() {
            Some(workload) => workload_wait(&workload.data, attempt),
            None => QueueWait {
                attempt,
                reason: "NoWorkload".to_owned(),
                message: "Kueue has made no Workload for the Job yet".to_owned(),
            },
        })
    }
}

async fn pods_labelled(client: &Client, ns: &str, selector: &str) -> Result<Vec<Pod>, Error> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let list = api
        .list(&ListParams::default().labels(selector))
        .await
        .map_err(Error::kube(ApiCall::ReadPods))?;
    Ok(list.items)
}

/// The Jobs labelled `selector` on a worker cluster (their metadata).
async fn copies(client: &Client, ns: &str, selector: &str) -> Result<Vec<Copy>, Error> {
    let api: Api<Job> = Api::namespaced(client.clone(), ns);
    let list = api
        .list_metadata(&ListParams::default().labels(selector))
        .await
        .map_err(Error::kube(ApiCall::ReadJobCopies))?;
    Ok(list
        .items
        .into_iter()
        .filter_map(|j| {
            Some(Copy {
                name: j.metadata.name?,
                uid: j.metadata.uid?,
                deleting: j.metadata.deletion_timestamp.is_some(),
            })
        })
        .collect())
}

impl Execution<'_> {
    /// A confirming read of the GpuJob: `None` when the run's view of it is current (the
    /// run goes on); else how the run ends: the GpuJob moved on (the view takes the
    /// read GpuJob; plan again), or is gone.
    pub(super) async fn confirm(&mut self, key: &Key) -> Result<Option<End>, Error> {
        self.ctx.writer.check(self.fence)?;
        let uid = self.gpujob.metadata.uid.clone().unwrap_or_default();
        let seen = self
            .gpujob
            .metadata
            .resource_version
            .clone()
            .unwrap_or_default();
        let Some(current) = self.ctx.reader.gpujob(key, &uid).await? else {
            self.outcomes.push(Outcome::GpuJobGone);
            return Ok(Some(End::Gone));
        };
        let now_current = current.metadata.resource_version.as_deref() == Some(seen.as_str());
        if !now_current {
            info!(
                seen = %seen,
                current = current.metadata.resource_version.as_deref().unwrap_or("-"),
                "the cached GpuJob was behind the API server; deciding again from the current one"
            );
        }
        self.outcomes.push(Outcome::GpuJobRead {
            seen,
            read: Arc::new(current),
        });
        self.confirmed = now_current;
        Ok((!now_current).then_some(End::Asked))
    }

    /// One of the plan's reads: what it found goes to the next plan, and a Job of ours
    /// the cache lacked to the view too.
    pub(super) async fn read(&mut self, key: &Key, read: &Read) -> Result<(), Error> {
        self.ctx.writer.check(self.fence)?;
        let uid = self.gpujob.metadata.uid.as_deref().unwrap_or_default();
        let found = self.ctx.reader.read(key, uid, read).await?;
        if let Found::Job {
            job: FoundJob::Ours(job),
            ..
        } = &found
        {
            self.outcomes.push(Outcome::JobRead(job.clone()));
        }
        self.answers.push(Answer::Found(read.clone(), found));
        Ok(())
    }

    /// Where the term of the reconcile's shard began, for the view.
    pub(super) async fn read_term_start(&mut self, key: &Key) -> Result<(), Error> {
        self.ctx.writer.check(self.fence)?;
        let read = self
            .ctx
            .reader
            .term_start(&key.namespace, self.fence.shard)
            .await;
        self.outcomes.push(match read {
            Some(TermStart { start, listed }) => Outcome::TermStart {
                start: Some(start),
                listed,
            },
            None => Outcome::TermStart {
                start: None,
                listed: Vec::new(),
            },
        });
        Ok(())
    }

    /// The GpuJob's pods, for the next plan: on the worker clusters too when the plan
    /// asks (`on_workers`: an attempt was dispatched there, and may still be stopping
    /// there while the next one runs here).
    pub(super) async fn read_pods(&mut self, key: &Key, on_workers: bool) -> Result<(), Error> {
        self.ctx.writer.check(self.fence)?;
        let uid = self.gpujob.metadata.uid.as_deref().unwrap_or_default();
        let dispatched: Vec<(String, String)> = self
            .snap
            .jobs
            .iter()
            .filter(|j| j.dispatched())
            .filter_map(|j| Some((j.name.clone(), j.uid.clone()?)))
            .collect();
        let pods = self
            .ctx
            .reader
            .pods(&key.namespace, uid, &dispatched, on_workers)
            .await?;
        self.answers.push(Answer::Pods(pods));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{Request, Response};
    use kube::client::Body;

    /// A client whose API server answers every request with `status` and `body`.
    fn answering(status: u16, body: serde_json::Value) -> Client {
        let service = tower::service_fn(move |_req: Request<Body>| {
            let body = body.to_string();
            async move {
                Response::builder()
                    .status(status)
                    .header("content-type", "application/json")
                    .body(Body::from(body.into_bytes()))
            }
        });
        Client::new(service, "default")
    }

    fn status(code: u16, reason: &str) -> serde_json::Value {
        serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
            "message": format!("nodes \"gpu-7\" is {reason}"), "reason": reason, "code": code})
    }

    #[tokio::test]
    async fn a_node_read_says_ready_not_ready_gone_or_unreadable() {
        let node = |ready: &str| {
            serde_json::json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-7"},
                "status": {"conditions": [{"type": "Ready", "status": ready, "reason": "NodeStatusUnknown"}]}})
        };
        let read = |client| async move { Reader::new(client).node("gpu-7").await };
        assert_eq!(
            read(answering(200, node("True"))).await.unwrap(),
            NodeState::Ready
        );
        assert_eq!(
            read(answering(200, node("Unknown"))).await.unwrap(),
            NodeState::NotReady {
                status: "Unknown".into(),
                reason: "NodeStatusUnknown".into()
            }
        );
        assert_eq!(
            read(answering(404, status(404, "NotFound"))).await.unwrap(),
            NodeState::Gone
        );
        // An install that may not read Nodes: not an error, the state is unknown.
        assert_eq!(
            read(answering(403, status(403, "Forbidden")))
                .await
                .unwrap(),
            NodeState::Unreadable
        );
        // Anything else is an error of the reconcile (retried with backoff).
        let e = read(answering(500, status(500, "InternalError")))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("Node"), "{e}");
    }
}
