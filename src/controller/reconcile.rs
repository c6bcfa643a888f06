//! One reconcile: observe → plan (pure) → apply (the only writes) → one status patch,
//! only when the status differs.

use std::time::Duration;

use jiff::Timestamp;
use tracing::{info, warn};

use super::apply::Created;
use super::error::Error;
use super::observe::{Snapshot, observe};
use super::plan::{Action, INVALID_SPEC, Observed, Plan, Refusal, plan};
use super::{Context, Key};
use crate::api::GpuJob;

/// Retry interval while a foreign Job holds an attempt's name.
const NAME_CONFLICT_RETRY: Duration = Duration::from_secs(60);

/// Reconciles one GpuJob. `Ok(Some(d))`: look again after `d` even without an event.
pub async fn reconcile(ctx: &Context, key: &Key) -> Result<Option<Duration>, Error> {
    let Some(snap) = observe(ctx, key).await? else {
        return Ok(None);
    };
    let now = Timestamp::now();
    let first = plan_with(ctx, &snap, None, now);
    let (plan, refused) = match execute(ctx, key, &snap.gpujob, &first).await? {
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
    let current = snap.gpujob.status.clone().unwrap_or_default();
    if plan.status != current {
        let written = ctx.writer.patch_status(&snap.gpujob, &plan.status).await?;
        if plan.status.phase != current.phase {
            let phase = plan
                .status
                .phase
                .map_or("-".to_owned(), |p| format!("{p:?}"));
            info!(
                phase,
                attempts = plan.status.attempts,
                failures = plan.status.failures,
                "phase changed"
            );
        }
        let replaced = snap
            .gpujob
            .metadata
            .resource_version
            .clone()
            .unwrap_or_default();
        ctx.memory.status_written(key, replaced, written);
        let newly_failed = plan.status.failures - current.failures;
        if newly_failed > 0 {
            ctx.metrics
                .attempts_failed
                .inc_by(u64::try_from(newly_failed).unwrap_or(0));
        }
    }
    let retry = refused
        .filter(|r| r.reason != INVALID_SPEC)
        .map(|_| NAME_CONFLICT_RETRY);
    Ok(retry.or(plan.requeue_after))
}

fn plan_with(ctx: &Context, snap: &Snapshot, refused: Option<Refusal>, now: Timestamp) -> Plan {
    plan(
        &Observed {
            gpujob: &snap.gpujob,
            jobs: snap.jobs.iter().map(AsRef::as_ref).collect(),
            termination: snap.termination.clone(),
            refused,
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
    owner: &GpuJob,
    plan: &Plan,
) -> Result<Option<Refusal>, Error> {
    let uid = owner.metadata.uid.as_deref().unwrap_or_default();
    for action in &plan.actions {
        match action {
            Action::CreateJob { attempt, job } => match ctx.writer.create_job(uid, job).await? {
                Created::Job(job) => {
                    info!(
                        attempt,
                        job = job.metadata.name.as_deref().unwrap_or_default(),
                        "attempt started"
                    );
                    ctx.metrics.attempts_started.inc();
                    ctx.memory.job_created(key, owner, *job);
                }
                Created::Adopted(job) => {
                    info!(
                        attempt,
                        job = job.metadata.name.as_deref().unwrap_or_default(),
                        "attempt's Job already existed (created by an earlier run); adopted"
                    );
                    ctx.memory.job_created(key, owner, *job);
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
            } => {
                ctx.writer
                    .delete_job(&key.namespace, name, job_uid, resource_version)
                    .await?;
                info!(job = %name, "deleted an old attempt's Job");
                ctx.memory
                    .job_deleted(key, owner, name.clone(), job_uid.clone());
            }
        }
    }
    Ok(None)
}
