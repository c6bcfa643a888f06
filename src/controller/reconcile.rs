//! One reconcile: observe → quota reservation (external, before any Job) → plan (pure)
//! → apply (the only writes) → one status patch, only when the status differs → the
//! Events its transitions deserve.

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use tracing::{info, warn};

use super::apply::Created;
use super::error::Error;
use super::events::transitions;
use super::observe::{Snapshot, observe};
use super::plan::{Action, INVALID_SPEC, Observed, Plan, Refusal, plan};
use super::reservation;
use super::{Context, Key};
use crate::api::{GpuJob, GpuJobStatus};
use crate::failpoint;

/// Retry interval while a foreign Job holds an attempt's name.
const NAME_CONFLICT_RETRY: Duration = Duration::from_secs(60);

/// What the queue does with a key after a reconcile that did not fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Converged for now: wait for an event.
    Done,
    /// Look again after this long (a backoff between attempts ends).
    After(Duration),
    /// Waiting on something outside (quota refused): ask again with per-key
    /// exponential backoff, so a long shortage costs few calls.
    Backoff,
}

/// Reconciles one GpuJob.
pub async fn reconcile(ctx: &Context, key: &Key) -> Result<Next, Error> {
    let Some(mut snap) = observe(ctx, key).await? else {
        return Ok(Next::Done);
    };
    if let Some(next) = reservation::stage(ctx, key, &mut snap).await? {
        return Ok(next);
    }
    let now = Timestamp::now();
    let first = plan_with(ctx, &snap, None, now);
    let (plan, refused) = match execute(ctx, key, &mut snap, &first).await? {
        None => (first, None),
        Some(refusal) => {
            warn!(
                attempt = refusal.attempt,
                reason = refusal.reason,
                "Job refused: {}; {}",
                refusal.message,
                if refusal.reason == INVALID_SPEC {
                    "waiting for a spec change"
                } else {
                    "retrying in 60 s"
                }
            );
            // Plan again knowing the attempt did not start; its other actions already ran.
            (
                plan_with(ctx, &snap, Some(refusal.clone()), now),
                Some(refusal),
            )
        }
    };

    tracing::Span::current().record("attempt", plan.status.attempts);
    write_status(ctx, key, &mut snap, &plan.status).await?;
    let retry = refused
        .filter(|r| r.reason != INVALID_SPEC)
        .map(|_| NAME_CONFLICT_RETRY);
    Ok(match retry.or(plan.requeue_after) {
        Some(d) => Next::After(d),
        None => Next::Done,
    })
}

/// One status patch from the GpuJob as last seen to `status` (nothing when equal), then
/// its Events. The snapshot and the write memory follow the written object.
pub(super) async fn write_status(
    ctx: &Context,
    key: &Key,
    snap: &mut Snapshot,
    status: &GpuJobStatus,
) -> Result<(), Error> {
    let current = snap.gpujob.status.clone().unwrap_or_default();
    if *status == current {
        return Ok(());
    }
    let written = ctx.writer.patch_status(&snap.gpujob, status).await?;
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
    remember(ctx, key, snap, written);
    ctx.writer
        .publish(&snap.gpujob, &transitions(&current, status))
        .await;
    Ok(())
}

/// The snapshot and the write memory follow an object this replica just wrote.
pub(super) fn remember(ctx: &Context, key: &Key, snap: &mut Snapshot, written: GpuJob) {
    let replaced = snap
        .gpujob
        .metadata
        .resource_version
        .clone()
        .unwrap_or_default();
    ctx.memory.status_written(key, replaced, written.clone());
    snap.gpujob = Arc::new(written);
}

fn plan_with(ctx: &Context, snap: &Snapshot, refused: Option<Refusal>, now: Timestamp) -> Plan {
    plan(
        &Observed {
            gpujob: &snap.gpujob,
            jobs: snap.jobs.iter().map(AsRef::as_ref).collect(),
            termination: snap.termination.clone(),
            refused,
            quota_required: ctx.quota.enabled(),
            now,
        },
        &ctx.settings.plan,
    )
}

/// Runs the plan's actions in order. Returns the refusal when the API server refused a
/// Job for a reason that retrying will not fix.
async fn execute(
    ctx: &Context,
    key: &Key,
    snap: &mut Snapshot,
    plan: &Plan,
) -> Result<Option<Refusal>, Error> {
    for action in &plan.actions {
        let owner = snap.gpujob.clone();
        let uid = owner.metadata.uid.as_deref().unwrap_or_default();
        match action {
            Action::RecordStatus(status) => write_status(ctx, key, snap, status).await?,
            Action::CreateJob { attempt, job } => match ctx.writer.create_job(uid, job).await? {
                Created::Job(job) => {
                    failpoint::hit("after-job-create");
                    info!(
                        attempt,
                        job = job.metadata.name.as_deref().unwrap_or_default(),
                        "attempt started"
                    );
                    ctx.metrics.attempts_started.inc();
                    ctx.memory.job_created(key, &owner, *job);
                }
                Created::Adopted(job) => {
                    info!(
                        attempt,
                        job = job.metadata.name.as_deref().unwrap_or_default(),
                        "attempt's Job already existed (created by an earlier run); adopted"
                    );
                    ctx.memory.job_created(key, &owner, *job);
                }
                Created::Invalid(message) => {
                    return Ok(Some(Refusal {
                        attempt: *attempt,
                        reason: INVALID_SPEC,
                        message,
                    }));
                }
                Created::NameTaken(message) => {
                    return Ok(Some(Refusal {
                        attempt: *attempt,
                        reason: "JobNameConflict",
                        message,
                    }));
                }
            },
            Action::DeleteJob {
                name,
                uid: job_uid,
                resource_version,
                foreground,
            } => {
                ctx.writer
                    .delete_job(&key.namespace, name, job_uid, resource_version, *foreground)
                    .await?;
                if *foreground {
                    info!(job = %name, "deleting the running attempt's Job to replace it (spec changed)");
                } else {
                    info!(job = %name, "deleted an old attempt's Job");
                    ctx.memory
                        .job_deleted(key, &owner, name.clone(), job_uid.clone());
                }
            }
        }
    }
    Ok(None)
}
