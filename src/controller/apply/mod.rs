//! The executor: the only place that writes or calls the outside world. It carries out
//! a plan's actions in order, each fenced (`writes.rs`: no write starts unless the
//! reconcile's shard is still held in the same term, before its deadline), remembers
//! what it wrote (`memory`) so that the next plan sees it before the caches do, writes
//! the status once at the end (only when it changed) and publishes the Events its
//! transitions deserve (`recorder.rs`). Nothing here decides: an answer from the
//! outside (quota, a refused Job, the GpuJob's pods) goes back to the plan.

mod recorder;
mod writes;

use std::sync::Arc;

use tracing::{info, warn};

use super::error::Error;
use super::events::transitions;
use super::observe::{self, Snapshot};
use super::plan::{
    Action, FinalizerRemoval, INVALID_SPEC, JOB_NAME_CONFLICT, JobDeletion, Plan, QuotaAnswer,
    Refusal,
};
use super::{Context, Fence, Key};
use crate::api::{FINALIZER_QUOTA, GpuJob, GpuJobStatus};
use crate::failpoint;
use crate::quota::{QuotaError, Reserve};
pub use writes::{Created, Writer};

/// How far a plan got.
#[derive(Debug)]
pub enum Executed {
    /// Every action ran and the status is written (if it changed).
    Done,
    /// An action got an answer the plan must hear; nothing after it ran.
    Heard(Answer),
    /// The GpuJob is gone (read before a quota call): nothing more to do.
    Gone,
}

/// An answer from outside the plan.
#[derive(Debug)]
pub enum Answer {
    Quota(QuotaAnswer),
    /// The release failed; the error is reported once the failure is recorded.
    ReleaseFailed(QuotaError),
    JobRefused(Refusal),
    /// The GpuJob's pods that have not terminated.
    Pods(Vec<super::plan::LivePod>),
    /// The GpuJob read before a quota call had moved past the plan's view; the write
    /// memory now holds it, and the rest of the snapshot is as old as the view was.
    Moved,
}

/// Carries out `plan` for the GpuJob `key` in the term `fence`. `snap` follows every
/// write, so a plan made again after an answer starts from what is now true.
pub async fn execute(
    ctx: &Context,
    fence: &Fence,
    key: &Key,
    snap: &mut Snapshot,
    plan: &Plan,
) -> Result<Executed, Error> {
    let w = &ctx.writer;
    for action in &plan.actions {
        match action {
            Action::RecordStatus(status) => write_status(ctx, fence, key, snap, status).await?,
            Action::AddFinalizer => {
                let updated = w.set_finalizer(fence, &snap.gpujob, true).await?;
                remember(ctx, fence, key, snap, updated);
            }
            Action::RemoveFinalizer(why) => {
                match why {
                    FinalizerRemoval::Released => {}
                    FinalizerRemoval::QuotaDisabled => warn!(
                        "quota is disabled but the GpuJob still holds {FINALIZER_QUOTA}; removing it (any reservation is abandoned)"
                    ),
                    FinalizerRemoval::ReleaseSkipped => warn!(
                        reservation = snap
                            .gpujob
                            .status
                            .as_ref()
                            .and_then(|s| s.reservation_id.as_deref())
                            .unwrap_or("-"),
                        "deletion allowed without releasing GPU quota (annotation); the reservation is abandoned"
                    ),
                }
                let updated = w.set_finalizer(fence, &snap.gpujob, false).await?;
                remember(ctx, fence, key, snap, updated);
            }
            Action::Confirm => {
                if snap.confirmed {
                    // Known current in this term (read, or written by this replica
                    // with a resourceVersion precondition).
                    continue;
                }
                let uid = snap.gpujob.metadata.uid.clone().unwrap_or_default();
                let Some(current) = observe::confirm(ctx, key, &uid).await? else {
                    info!("the GpuJob is gone (read from the API server); nothing is done for it");
                    ctx.memory.forget(key);
                    return Ok(Executed::Gone);
                };
                let seen = &snap.gpujob.metadata.resource_version;
                if current.metadata.resource_version == *seen {
                    // Current: so is this view for the rest of the term.
                    ctx.memory
                        .mark_current(key, fence.epoch, seen.as_deref().unwrap_or_default());
                    snap.confirmed = true;
                    continue;
                }
                info!(
                    seen = seen.as_deref().unwrap_or("-"),
                    current = current.metadata.resource_version.as_deref().unwrap_or("-"),
                    "the cached GpuJob was behind the API server; deciding again from the current one"
                );
                remember(ctx, fence, key, snap, current);
                return Ok(Executed::Heard(Answer::Moved));
            }
            Action::Reserve(req, sequence) => {
                failpoint::hit("before-reserve");
                return Ok(Executed::Heard(Answer::Quota(
                    match w.reserve(fence, req, *sequence).await? {
                        Reserve::Granted { id } => {
                            failpoint::hit("after-reserve");
                            info!(reservation = %id, gpus = req.gpus, "GPU quota reserved");
                            QuotaAnswer::Reserved { id }
                        }
                        Reserve::Refused { reason, message } => {
                            ctx.metrics.quota_refusals.inc();
                            info!(reason = %reason, "GPU quota refused: {message}; asking again with backoff");
                            QuotaAnswer::Refused { reason, message }
                        }
                    },
                )));
            }
            Action::Release(sequence) => {
                let uid = snap.gpujob.metadata.uid.clone().unwrap_or_default();
                let reservation = snap
                    .gpujob
                    .status
                    .as_ref()
                    .and_then(|s| s.reservation_id.clone());
                return match w.release(fence, &uid, *sequence).await {
                    Ok(()) => {
                        failpoint::hit("after-release");
                        info!(
                            reservation = reservation.as_deref().unwrap_or("-"),
                            "GPU quota released"
                        );
                        Ok(Executed::Heard(Answer::Quota(QuotaAnswer::Released)))
                    }
                    Err(Error::Quota(e)) => {
                        warn!(
                            reservation = reservation.as_deref().unwrap_or("-"),
                            "releasing GPU quota failed: {e}; retrying with backoff"
                        );
                        Ok(Executed::Heard(Answer::ReleaseFailed(e)))
                    }
                    Err(e) => Err(e),
                };
            }
            Action::CheckPods => {
                let uid = snap.gpujob.metadata.uid.clone().unwrap_or_default();
                let pods = observe::live_pods(ctx, &key.namespace, &uid).await?;
                return Ok(Executed::Heard(Answer::Pods(pods)));
            }
            Action::CreateJob { attempt, job } => {
                if let Some(refusal) = create_job(ctx, fence, key, snap, *attempt, job).await? {
                    return Ok(Executed::Heard(Answer::JobRefused(refusal)));
                }
            }
            Action::StartJob {
                name,
                resource_version,
            } => {
                w.start_job(fence, &key.namespace, name, resource_version)
                    .await
                    .map_err(|e| job_write_refused(ctx, key, name, e))?;
                info!(job = %name, "started the attempt's Job (created suspended)");
                ctx.memory
                    .job_started(key, &snap.gpujob, name.clone(), resource_version.clone());
                show_remembered_jobs(ctx, key, snap);
            }
            Action::DeleteJob {
                name,
                uid,
                resource_version,
                why,
            } => {
                let foreground = why.foreground();
                w.delete_job(
                    fence,
                    &key.namespace,
                    name,
                    uid,
                    resource_version,
                    foreground,
                )
                .await
                .map_err(|e| job_write_refused(ctx, key, name, e))?;
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
                ctx.memory
                    .job_deleted(key, &snap.gpujob, name.clone(), uid.clone(), foreground);
                show_remembered_jobs(ctx, key, snap);
            }
            Action::DeleteGpuJob {
                uid,
                resource_version,
            } => {
                w.delete_gpujob(fence, &snap.gpujob, uid, resource_version)
                    .await?;
                info!("deleted: finished, and its time to live after finishing is over");
                return Ok(Executed::Done);
            }
            Action::Publish(note) => {
                w.publish(fence, &snap.gpujob, std::slice::from_ref(note));
            }
        }
    }
    write_status(ctx, fence, key, snap, &plan.status).await?;
    Ok(Executed::Done)
}

/// Creates the attempt's Job; `Some(refusal)` when the API server will not have it.
async fn create_job(
    ctx: &Context,
    fence: &Fence,
    key: &Key,
    snap: &mut Snapshot,
    attempt: i32,
    job: &k8s_openapi::api::batch::v1::Job,
) -> Result<Option<Refusal>, Error> {
    let owner = snap.gpujob.clone();
    let uid = owner.metadata.uid.as_deref().unwrap_or_default();
    let (job, how) = match ctx.writer.create_job(fence, uid, job).await? {
        Created::Job(job) => {
            failpoint::hit("after-job-create");
            ctx.metrics.attempts_started.inc();
            (job, "attempt started")
        }
        Created::Adopted(job) => (
            job,
            "attempt's Job already existed (created by an earlier run); adopted",
        ),
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
            warn!(attempt, "{message}; looking again in a while");
            return Ok(Some(Refusal {
                attempt,
                reason: JOB_NAME_CONFLICT,
                message,
            }));
        }
    };
    info!(
        attempt,
        job = job.metadata.name.as_deref().unwrap_or_default(),
        "{how}"
    );
    ctx.memory.job_created(key, &owner, &job);
    snap.jobs.push(Arc::new(*job));
    Ok(None)
}

/// A write to Job `name` failed: refused for its resourceVersion, a copy the memory
/// kept is stale and goes, so the next look reads the Job again.
fn job_write_refused(ctx: &Context, key: &Key, name: &str, e: Error) -> Error {
    if matches!(e, Error::Conflict { .. }) {
        ctx.memory.job_stale(key, name);
    }
    e
}

/// The snapshot's Jobs as the memory now shows them, after a Job write it recorded.
fn show_remembered_jobs(ctx: &Context, key: &Key, snap: &mut Snapshot) {
    let uid = snap.gpujob.metadata.uid.clone().unwrap_or_default();
    let shown = std::mem::take(&mut snap.jobs);
    snap.jobs = ctx.memory.jobs(key, &uid, || shown);
}

/// One status patch from the GpuJob as last seen to `status` (nothing when equal), then
/// its Events. The snapshot and the write memory follow the written object.
async fn write_status(
    ctx: &Context,
    fence: &Fence,
    key: &Key,
    snap: &mut Snapshot,
    status: &GpuJobStatus,
) -> Result<(), Error> {
    let current = snap.gpujob.status.clone().unwrap_or_default();
    if *status == current {
        return Ok(());
    }
    let written = ctx.writer.patch_status(fence, &snap.gpujob, status).await?;
    if status.phase != current.phase {
        let phase = status.phase.map_or("-".to_owned(), |p| format!("{p:?}"));
        info!(
            phase,
            attempts = status.attempts,
            failures = status.failures,
            "phase changed"
        );
    }
    let newly_failed = status.failures - current.failures;
    if newly_failed > 0 {
        ctx.metrics
            .attempts_failed
            .inc_by(u64::try_from(newly_failed).unwrap_or(0));
    }
    remember(ctx, fence, key, snap, written);
    // Only transitions this term recorded, published while it still holds.
    ctx.writer
        .publish(fence, &snap.gpujob, &transitions(&current, status));
    Ok(())
}

/// The snapshot and the write memory follow a GpuJob this replica just wrote or read
/// from the API server: until the cache catches up, reconciles see this one.
/// Kept without managedFields, as the cache keeps GpuJobs: nothing reads them.
fn remember(ctx: &Context, fence: &Fence, key: &Key, snap: &mut Snapshot, mut written: GpuJob) {
    written.metadata.managed_fields = None;
    let replaced = snap
        .gpujob
        .metadata
        .resource_version
        .clone()
        .unwrap_or_default();
    let rv = written
        .metadata
        .resource_version
        .clone()
        .unwrap_or_default();
    ctx.memory.mark_current(key, fence.epoch, &rv);
    ctx.memory.status_written(key, replaced, written.clone());
    snap.gpujob = Arc::new(written);
    snap.confirmed = true;
}
