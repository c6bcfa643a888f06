//! The executor's writes of an attempt's objects: its Job, its headless Service, its
//! ResourceClaimTemplate, its PodGroup, its pods' gate. Each is fenced (`writes.rs`) and logged with what it means; what the API
//! server accepted is an outcome for the view.

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use kube::core::DynamicObject;
use tracing::{info, warn};

use super::writes::Owned;
use super::{Created, Execution, PodRef};
use crate::controller::Key;
use crate::controller::error::Error;
use crate::controller::plan::{
    CLAIM_TEMPLATE_NAME_CONFLICT, INVALID_SPEC, JOB_NAME_CONFLICT, JobDeletion,
    OLD_ATTEMPT_STOPPING, POD_GROUP_NAME_CONFLICT, Refusal, SERVICE_NAME_CONFLICT,
};
use crate::controller::view::Outcome;
use crate::failpoint;

impl Execution<'_> {
    /// Creates the attempt's Job; `Some(refusal)` when the API server will not have it.
    pub(super) async fn create_job(
        &mut self,
        attempt: i32,
        job: &Job,
    ) -> Result<Option<Refusal>, Error> {
        let uid = self.gpujob.metadata.uid.as_deref().unwrap_or_default();
        let (job, how) = match self.ctx.writer.create_job(self.fence, uid, job).await? {
            Created::Job(job) => {
                failpoint::hit("after-job-create");
                self.ctx.metrics.attempts_started.inc();
                (job, "attempt started")
            }
            Created::Adopted(job) => (
                job,
                "attempt's Job already existed (created by an earlier run); adopted",
            ),
            Created::Other(job) => {
                let name = job.metadata.name.clone().unwrap_or_default();
                let message = format!(
                    "Job {name} of this GpuJob holds attempt {attempt}'s name but is {}; attempt {attempt} is created once it is gone",
                    if job.metadata.deletion_timestamp.is_some() {
                        "being deleted"
                    } else {
                        "built from another generation of the spec"
                    }
                );
                info!(attempt, "{message}");
                self.outcomes.push(Outcome::JobCreated(job));
                return Ok(Some(Refusal {
                    attempt,
                    reason: OLD_ATTEMPT_STOPPING,
                    message,
                }));
            }
            Created::Invalid(message) => {
                warn!(
                    attempt,
                    "Job refused as invalid: {message}; waiting for a spec change"
                );
                return Ok(Some(Refusal {
                    attempt,
                    reason: INVALID_SPEC,
                    message,
                }));
            }
            Created::NameTaken(message) => {
                return Ok(Some(name_taken(attempt, JOB_NAME_CONFLICT, message)));
            }
        };
        info!(
            attempt,
            job = job.metadata.name.as_deref().unwrap_or_default(),
            "{how}"
        );
        self.outcomes.push(Outcome::JobCreated(job));
        Ok(None)
    }

    /// A write to Job `name` ended with `result`: refused for its resourceVersion, a
    /// copy the view kept is stale and goes, so the next look reads the Job again.
    fn job_write(&mut self, name: &str, result: Result<(), Error>) -> Result<(), Error> {
        if let Err(Error::Conflict { .. }) = &result {
            self.outcomes.push(Outcome::JobConflict {
                name: name.to_owned(),
            });
        }
        result
    }

    /// Creates a multi-node attempt's headless Service; `Some(refusal)` when a foreign
    /// one holds its name.
    pub(super) async fn create_service(
        &mut self,
        attempt: i32,
        service: &Service,
    ) -> Result<Option<Refusal>, Error> {
        let made = self.ctx.writer.create_service(self.fence, service).await?;
        Ok(owned(
            attempt,
            "headless Service",
            made,
            SERVICE_NAME_CONFLICT,
        ))
    }

    /// Creates the ResourceClaimTemplate of an attempt whose pods get GPUs by DRA;
    /// `Some(refusal)` when a foreign one holds its name, or the API server will not
    /// have it.
    pub(super) async fn create_claim_template(
        &mut self,
        attempt: i32,
        template: &ResourceClaimTemplate,
    ) -> Result<Option<Refusal>, Error> {
        let made = self
            .ctx
            .writer
            .create_claim_template(self.fence, template)
            .await?;
        let conflict = CLAIM_TEMPLATE_NAME_CONFLICT;
        Ok(owned(attempt, "ResourceClaimTemplate", made, conflict))
    }

    /// Creates a multi-node attempt's PodGroup (its gang); `Some(refusal)` when a
    /// foreign one holds its name.
    pub(super) async fn create_pod_group(
        &mut self,
        attempt: i32,
        group: &DynamicObject,
    ) -> Result<Option<Refusal>, Error> {
        let made = self.ctx.writer.create_pod_group(self.fence, group).await?;
        Ok(owned(attempt, "PodGroup", made, POD_GROUP_NAME_CONFLICT))
    }

    /// Lets the current attempt's pod go.
    pub(super) async fn ungate_pod(&mut self, key: &Key, pod: &PodRef<'_>) -> Result<(), Error> {
        self.ctx
            .writer
            .ungate_pod(self.fence, &key.namespace, pod)
            .await?;
        failpoint::hit("after-ungate");
        self.ctx.metrics.pods_ungated.inc();
        info!(pod = %pod.name, pod_uid = %pod.uid, worker = pod.cluster.unwrap_or("-"), "let the current attempt's pod go (removed the scheduling gate)");
        self.outcomes.push(Outcome::PodUngated {
            uid: pod.uid.to_owned(),
        });
        Ok(())
    }

    /// Deletes a gated pod that is not the current attempt's.
    pub(super) async fn delete_pod(&mut self, key: &Key, pod: &PodRef<'_>) -> Result<(), Error> {
        self.ctx
            .writer
            .delete_pod(self.fence, &key.namespace, pod)
            .await?;
        warn!(pod = %pod.name, worker = pod.cluster.unwrap_or("-"), "deleted a pod that waited at the scheduling gate and is not the current attempt's (it never ran)");
        Ok(())
    }

    /// Gates a Job an earlier version created suspended.
    pub(super) async fn gate_job(
        &mut self,
        key: &Key,
        name: &str,
        resource_version: &str,
        queue: &Option<String>,
    ) -> Result<(), Error> {
        let gated = self
            .ctx
            .writer
            .gate_job(
                self.fence,
                &key.namespace,
                name,
                resource_version,
                queue.as_deref(),
            )
            .await;
        self.job_write(name, gated)?;
        match queue {
            Some(queue) => info!(
                job = %name,
                queue = %queue,
                "a Job an earlier version created suspended got the scheduling gate and its Kueue LocalQueue; Kueue starts it on admission"
            ),
            None => info!(
                job = %name,
                "a Job an earlier version created suspended got the scheduling gate and was started"
            ),
        }
        self.outcomes.push(Outcome::JobGated {
            name: name.to_owned(),
            replaced: resource_version.to_owned(),
            queue: queue.clone(),
        });
        Ok(())
    }

    /// Deletes a Job, as `why` says.
    pub(super) async fn delete_job(
        &mut self,
        key: &Key,
        name: &str,
        uid: &str,
        resource_version: &str,
        why: JobDeletion,
    ) -> Result<(), Error> {
        let foreground = why.foreground();
        let deleted = self
            .ctx
            .writer
            .delete_job(
                self.fence,
                &key.namespace,
                name,
                uid,
                resource_version,
                foreground,
            )
            .await;
        self.job_write(name, deleted)?;
        match why {
            JobDeletion::Replaced => {
                info!(job = %name, "deleting the running attempt's Job to replace it (spec changed)")
            }
            JobDeletion::Suspended => {
                info!(job = %name, "deleting the running attempt's Job to stop it (suspended)")
            }
            JobDeletion::Stray => {
                warn!(job = %name, "deleting a Job that is not the current attempt's and has not finished (attempts run one at a time; a create delivered late can bring one back); no attempt starts until its pods are gone")
            }
            JobDeletion::Old => info!(job = %name, "deleted an old attempt's Job"),
            JobDeletion::GpuJobDeleted => {
                info!(job = %name, "deleting the running attempt's Job (the GpuJob is being deleted); GPU quota is released once its pods are gone")
            }
        }
        self.outcomes.push(Outcome::JobDeleted {
            name: name.to_owned(),
            uid: uid.to_owned(),
            foreground,
        });
        Ok(())
    }
}

/// What creating `attempt`'s `kind` came to, as the plan hears it: nothing when made
/// (now or before), else a refusal (`conflict` for a foreign object under the name).
fn owned(attempt: i32, kind: &str, made: Owned, conflict: &'static str) -> Option<Refusal> {
    match made {
        Owned::Done => {
            info!(
                attempt,
                "the attempt's {kind} exists (created now or before)"
            );
            None
        }
        Owned::Taken(message) => Some(name_taken(attempt, conflict, message)),
        Owned::Invalid(message) => {
            warn!(
                attempt,
                "the attempt's {kind} refused as invalid: {message}; waiting for a spec change"
            );
            Some(Refusal {
                attempt,
                reason: INVALID_SPEC,
                message,
            })
        }
    }
}

/// A foreign object holds the name of `attempt`'s Job, Service or ResourceClaimTemplate:
/// said, and looked at
/// again later (`reason` says which).
fn name_taken(attempt: i32, reason: &'static str, message: String) -> Refusal {
    warn!(attempt, "{message}; looking again in a while");
    Refusal {
        attempt,
        reason,
        message,
    }
}
