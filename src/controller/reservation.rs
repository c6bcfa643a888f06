//! The external GPU quota around a GpuJob's life, in an order that survives a crash
//! anywhere: finalizer added → reservation made → reservation id recorded in status →
//! only then the first Job (the plan refuses to start one before). When the GpuJob is
//! finished or deleted: release → confirmed → finalizer removed. Every call is
//! idempotent by GpuJob UID, so a repeated step never doubles or leaks a reservation.

use jiff::Timestamp;
use tracing::{info, warn};

use super::error::Error;
use super::events::{CLEANUP_STUCK, Kind, Note, QUOTA_RESERVED};
use super::observe::Snapshot;
use super::reconcile::{Next, remember, write_status};
use super::status::{READY, remove_condition, seconds, set_condition};
use super::{Context, Key};
use crate::api::{ANNOTATION_SKIP_RELEASE, ConditionStatus, FINALIZER_QUOTA, GpuJobStatus, Phase};
use crate::failpoint;
use crate::quota::{QuotaProvider, Reserve, ReserveRequest};

/// Runs before planning. `Some(next)`: the reconcile ends here (deletion handled, quota
/// refused, or released after finishing); `None`: go on and plan the attempts.
pub async fn stage(ctx: &Context, key: &Key, snap: &mut Snapshot) -> Result<Option<Next>, Error> {
    let gj = snap.gpujob.clone();
    let status = gj.status.clone().unwrap_or_default();
    let deleting = gj.metadata.deletion_timestamp.is_some();
    if deleting {
        if !gj.holds_quota_finalizer() {
            return Ok(Some(Next::Done));
        }
        return release(ctx, key, snap, true).await.map(Some);
    }
    if !ctx.quota.enabled() {
        if gj.holds_quota_finalizer() {
            // Quota was switched off: nothing can be released any more.
            warn!(
                "quota is disabled but the GpuJob still holds {FINALIZER_QUOTA}; removing it (any reservation is abandoned)"
            );
            let updated = ctx
                .writer
                .set_finalizer(&gj, FINALIZER_QUOTA, false)
                .await?;
            remember(ctx, key, snap, updated);
        }
        return Ok(None);
    }
    if status.phase.is_some_and(Phase::is_final) {
        if status.reservation_id.is_some() || gj.holds_quota_finalizer() {
            return release(ctx, key, snap, false).await.map(Some);
        }
        return Ok(None);
    }
    if !gj.holds_quota_finalizer() {
        // Before anything exists outside the cluster, so that deletion waits for it.
        let updated = ctx.writer.set_finalizer(&gj, FINALIZER_QUOTA, true).await?;
        remember(ctx, key, snap, updated);
    }
    if status.reservation_id.is_some() {
        return Ok(None);
    }
    let req = ReserveRequest {
        uid: gj.metadata.uid.clone().unwrap_or_default(),
        namespace: key.namespace.clone(),
        name: key.name.clone(),
        gpus: gj.spec.gpus,
    };
    let now = seconds(Timestamp::now());
    let generation = gj.metadata.generation;
    ctx.writer.fence()?;
    match ctx.quota.reserve(&req).await? {
        Reserve::Granted { id } => {
            failpoint::hit("after-reserve");
            info!(reservation = %id, gpus = req.gpus, "GPU quota reserved");
            let mut next = status.clone();
            next.reservation_id = Some(id.clone());
            next.observed_generation = generation;
            set_condition(
                &mut next.conditions,
                QUOTA_RESERVED,
                ConditionStatus::True,
                "Reserved",
                format!("GPU quota reservation {id} ({} GPUs)", req.gpus),
                generation,
                now,
            );
            // Recorded before any Job exists; the plan starts attempts only after this.
            write_status(ctx, key, snap, &next).await?;
            Ok(None)
        }
        Reserve::Refused { reason, message } => {
            ctx.metrics.quota_refusals.inc();
            info!(reason = %reason, "GPU quota refused: {message}; asking again with backoff");
            let mut next = status.clone();
            next.observed_generation = generation;
            set_condition(
                &mut next.conditions,
                QUOTA_RESERVED,
                ConditionStatus::False,
                &reason,
                message.clone(),
                generation,
                now,
            );
            if status.attempts > 0 {
                // Quota was switched on while an attempt already ran: that attempt goes
                // on (the plan follows it); only new attempts wait for a reservation.
                write_status(ctx, key, snap, &next).await?;
                return Ok(None);
            }
            next.phase = Some(Phase::Pending);
            set_condition(
                &mut next.conditions,
                READY,
                ConditionStatus::False,
                "QuotaRefused",
                format!("waiting for GPU quota: {reason}: {message}"),
                generation,
                now,
            );
            write_status(ctx, key, snap, &next).await?;
            Ok(Some(Next::Backoff))
        }
    }
}

/// Releases the reservation (finished, or being deleted), then removes the finalizer.
/// A release that keeps failing is retried with backoff; past the cleanup timeout the
/// GpuJob says `CleanupStuck`. While being deleted, the annotation
/// `gpujob.dev/skip-quota-release: "true"` lets the finalizer go without a release.
async fn release(
    ctx: &Context,
    key: &Key,
    snap: &mut Snapshot,
    deleting: bool,
) -> Result<Next, Error> {
    let gj = snap.gpujob.clone();
    let status = gj.status.clone().unwrap_or_default();
    let uid = gj.metadata.uid.clone().unwrap_or_default();
    let skip = gj
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_SKIP_RELEASE))
        .is_some_and(|v| v == "true");
    if deleting && skip {
        let id = status
            .reservation_id
            .clone()
            .unwrap_or_else(|| format!("(unrecorded, key {uid})"));
        warn!(reservation = %id, "deletion allowed without releasing GPU quota ({ANNOTATION_SKIP_RELEASE}); the reservation is abandoned");
        let note = Note {
            kind: Kind::Warning,
            reason: "QuotaReleaseSkipped",
            note: format!(
                "GPU quota reservation {id} was NOT released ({ANNOTATION_SKIP_RELEASE}=true); release it in the quota service by hand"
            ),
        };
        ctx.writer.publish(&gj, &[note]).await;
        ctx.writer
            .set_finalizer(&gj, FINALIZER_QUOTA, false)
            .await?;
        return Ok(Next::Done);
    }
    let now = seconds(Timestamp::now());
    let generation = gj.metadata.generation;
    ctx.writer.fence()?;
    match ctx.quota.release(&uid).await {
        Ok(()) => {
            failpoint::hit("after-release");
            info!(
                reservation = status.reservation_id.as_deref().unwrap_or("-"),
                "GPU quota released"
            );
            let mut next = status.clone();
            next.reservation_id = None;
            next.release_failing_since = None;
            remove_condition(&mut next.conditions, CLEANUP_STUCK);
            if status.reservation_id.is_some() {
                set_condition(
                    &mut next.conditions,
                    QUOTA_RESERVED,
                    ConditionStatus::False,
                    "Released",
                    "GPU quota released".to_owned(),
                    generation,
                    now,
                );
            }
            write_status(ctx, key, snap, &next).await?;
            if snap.gpujob.holds_quota_finalizer() {
                let gj = snap.gpujob.clone();
                let updated = ctx
                    .writer
                    .set_finalizer(&gj, FINALIZER_QUOTA, false)
                    .await?;
                if !deleting {
                    remember(ctx, key, snap, updated);
                }
            }
            Ok(Next::Done)
        }
        Err(e) => {
            let since = status.release_failing_since.unwrap_or(now);
            let failing_for = now.duration_since(since);
            let stuck = failing_for.as_secs_f64() >= ctx.settings.cleanup_timeout.as_secs_f64();
            let mut next: GpuJobStatus = status.clone();
            next.release_failing_since = Some(since);
            next.last_error = Some(format!("releasing GPU quota failed: {e}"));
            if stuck {
                set_condition(
                    &mut next.conditions,
                    CLEANUP_STUCK,
                    ConditionStatus::True,
                    "ReleaseFailing",
                    format!(
                        "releasing GPU quota has failed since {since}: {e}; the finalizer stays; set {ANNOTATION_SKIP_RELEASE}=\"true\" to let deletion finish without it"
                    ),
                    generation,
                    now,
                );
            }
            write_status(ctx, key, snap, &next).await?;
            warn!(failing_since = %since, stuck, "releasing GPU quota failed: {e}; retrying with backoff");
            Err(e.into())
        }
    }
}
