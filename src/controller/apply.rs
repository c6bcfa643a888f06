//! The only place that writes. Every write is idempotent and safe when late: Jobs have
//! stable names (a second create is refused), deletes carry uid and resourceVersion
//! preconditions, and status patches carry the resourceVersion they were computed from.

use k8s_openapi::api::batch::v1::Job;
use kube::Client;
use kube::api::{
    Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions, PropagationPolicy,
};
use serde_json::json;
use tokio::sync::watch;
use tokio::time::Instant;

use super::error::{Error, api_code};
use super::events::{Kind, Note};
use super::job::is_controlled_by;
use super::status::merge_patch;
use crate::api::{GpuJob, GpuJobStatus};
use crate::lease::Ownership;
use kube::Resource;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

/// Field manager recorded on every write.
pub const FIELD_MANAGER: &str = "gpujob-operator";

/// Every write checks the fence first: no write starts after the local lease
/// deadline. A write delayed past it anyway (a pause between check and send) cannot
/// win: it carries a resourceVersion or uid precondition, or a stable name.
#[derive(Clone)]
pub struct Writer {
    client: Client,
    ownership: watch::Receiver<Ownership>,
    recorder: Recorder,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer").finish_non_exhaustive()
    }
}

/// What became of a Job create.
#[derive(Debug)]
pub enum Created {
    /// Created now.
    Job(Box<Job>),
    /// Found already created for this GpuJob (an earlier run of the same step).
    Adopted(Box<Job>),
    /// The API server refused it as invalid (422): terminal for this spec.
    Invalid(String),
    /// The name is taken by a Job this GpuJob does not control.
    NameTaken(String),
}

impl Writer {
    pub fn new(client: Client, ownership: watch::Receiver<Ownership>, identity: &str) -> Writer {
        let reporter = Reporter {
            controller: "gpujob-operator".to_owned(),
            instance: Some(identity.to_owned()),
        };
        Writer {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            ownership,
        }
    }

    /// Publishes Events on the GpuJob. An Event that cannot be written is logged and
    /// dropped: it must never hold up the work it describes.
    pub async fn publish(&self, gj: &GpuJob, notes: &[Note]) {
        if notes.is_empty() || self.fence().is_err() {
            return;
        }
        let reference = gj.object_ref(&());
        for n in notes {
            let event = Event {
                type_: match n.kind {
                    Kind::Normal => EventType::Normal,
                    Kind::Warning => EventType::Warning,
                },
                reason: n.reason.to_owned(),
                note: Some(n.note.chars().take(1000).collect()),
                action: n.reason.to_owned(),
                secondary: None,
            };
            if let Err(e) = self.recorder.publish(&event, &reference).await {
                tracing::warn!(
                    reason = n.reason,
                    "cannot record an Event on the GpuJob: {e}; continuing without it"
                );
            }
        }
    }

    /// Adds or removes a finalizer: one merge patch of `metadata.finalizers`, carrying
    /// the resourceVersion it was computed from.
    pub async fn set_finalizer(
        &self,
        gj: &GpuJob,
        finalizer: &str,
        present: bool,
    ) -> Result<GpuJob, Error> {
        let ns = gj.metadata.namespace.as_deref().unwrap_or_default();
        let name = gj.metadata.name.as_deref().unwrap_or_default();
        let mut finalizers: Vec<String> = gj.metadata.finalizers.clone().unwrap_or_default();
        finalizers.retain(|f| f != finalizer);
        if present {
            finalizers.push(finalizer.to_owned());
        }
        let patch = json!({
            "metadata": {"resourceVersion": gj.metadata.resource_version, "finalizers": finalizers},
        });
        self.patch_gpujob(ns, name, &patch, false).await
    }

    /// One fenced merge patch of GpuJob `ns/name`, or of its status subresource. The
    /// patch carries the resourceVersion it was computed from, so a 409 means the
    /// GpuJob moved on: re-read, never overwrite.
    async fn patch_gpujob(
        &self,
        ns: &str,
        name: &str,
        patch: &serde_json::Value,
        status: bool,
    ) -> Result<GpuJob, Error> {
        let api: Api<GpuJob> = Api::namespaced(self.client.clone(), ns);
        let pp = PatchParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PatchParams::default()
        };
        self.fence()?;
        let sent = if status {
            api.patch_status(name, &pp, &Patch::Merge(patch)).await
        } else {
            api.patch(name, &pp, &Patch::Merge(patch)).await
        };
        match sent {
            Ok(updated) => Ok(updated),
            Err(e) if api_code(&e) == Some(409) => Err(Error::Conflict {
                what: format!("GpuJob {ns}/{name}"),
            }),
            Err(e) => Err(self.failed(
                if status {
                    "patch_status"
                } else {
                    "patch_finalizers"
                },
                e,
            )),
        }
    }

    /// `Err(NotLeader)` once ownership has lapsed: checked before every write, and
    /// before calls to the outside world (the quota service).
    pub fn fence(&self) -> Result<(), Error> {
        if self.ownership.borrow().valid_at(Instant::now()) {
            Ok(())
        } else {
            Err(Error::NotLeader)
        }
    }

    /// A failed write is `NotLeader` when ownership lapsed meanwhile (the client's own
    /// fence refused it just before sending, or its answer no longer matters).
    fn failed(&self, action: &'static str, e: kube::Error) -> Error {
        match self.fence() {
            Err(not_leader) => not_leader,
            Ok(()) => Error::kube(action)(e),
        }
    }

    pub async fn create_job(&self, owner_uid: &str, job: &Job) -> Result<Created, Error> {
        let ns = job.metadata.namespace.as_deref().unwrap_or_default();
        let name = job.metadata.name.as_deref().unwrap_or_default();
        let api: Api<Job> = Api::namespaced(self.client.clone(), ns);
        let pp = PostParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PostParams::default()
        };
        self.fence()?;
        match api.create(&pp, job).await {
            Ok(created) => Ok(Created::Job(Box::new(created))),
            Err(e) if api_code(&e) == Some(409) => {
                // Stable names: it exists, most likely from an earlier run of this same
                // step. Adopt it only if it is really ours.
                let existing = api.get(name).await.map_err(Error::kube("read_job"))?;
                if is_controlled_by(&existing, owner_uid) {
                    Ok(Created::Adopted(Box::new(existing)))
                } else {
                    Ok(Created::NameTaken(format!(
                        "Job {ns}/{name} exists and is not controlled by this GpuJob; delete or rename it"
                    )))
                }
            }
            Err(kube::Error::Api(s)) if s.code == 422 => Ok(Created::Invalid(s.message)),
            Err(e) => Err(self.failed("create_job", e)),
        }
    }

    /// Deletes an old attempt's Job and its pods (background propagation; batch/v1
    /// would orphan the pods otherwise). Gone already, or changed since it was read
    /// (precondition failed): nothing to do now, the next reconcile decides again.
    pub async fn delete_job(
        &self,
        ns: &str,
        name: &str,
        uid: &str,
        resource_version: &str,
        foreground: bool,
    ) -> Result<(), Error> {
        let api: Api<Job> = Api::namespaced(self.client.clone(), ns);
        let dp = DeleteParams {
            propagation_policy: Some(if foreground {
                PropagationPolicy::Foreground
            } else {
                PropagationPolicy::Background
            }),
            preconditions: Some(Preconditions {
                uid: Some(uid.to_owned()),
                resource_version: Some(resource_version.to_owned()),
            }),
            ..DeleteParams::default()
        };
        self.fence()?;
        match api.delete(name, &dp).await {
            Ok(_) => Ok(()),
            Err(e) if matches!(api_code(&e), Some(404) | Some(409)) => Ok(()),
            Err(e) => Err(self.failed("delete_job", e)),
        }
    }

    /// One merge patch of the status subresource turning `from.status` into `status`,
    /// carrying `from`'s resourceVersion: if anything changed since, the API server
    /// answers 409 and nothing is overwritten.
    pub async fn patch_status(
        &self,
        from: &GpuJob,
        status: &GpuJobStatus,
    ) -> Result<GpuJob, Error> {
        let ns = from.metadata.namespace.as_deref().unwrap_or_default();
        let name = from.metadata.name.as_deref().unwrap_or_default();
        let old =
            serde_json::to_value(from.status.clone().unwrap_or_default()).map_err(|source| {
                Error::Serialize {
                    what: "status",
                    source,
                }
            })?;
        let new = serde_json::to_value(status).map_err(|source| Error::Serialize {
            what: "status",
            source,
        })?;
        let patch = json!({
            "metadata": {"resourceVersion": from.metadata.resource_version},
            "status": merge_patch(&old, &new),
        });
        self.patch_gpujob(ns, name, &patch, true).await
    }
}
