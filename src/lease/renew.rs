//! The one renew loop: each held shard (the one Lease of `--shards 1` included) is
//! renewed by a task of its own, so renewing many shards never starves one.

use std::sync::Arc;

use tokio::sync::watch;
use tokio::time::{Instant, timeout};
use tracing::{info, warn};

use super::{Attempt, Elector, Ownership, Timing, explain, gained_or_lost, jitter};
use crate::health::Status;

/// Renews one held shard every retry period (jittered), at the latest when half the
/// renew deadline is left, and at once when the lease loop asks
/// ([`Elector::renew_soon`]: the number of the shard's namespaces changed), until a renewal is refused or the renew deadline passes
/// without one; then the shard leaves the ownership (its reconciles stop, its writes
/// are fenced). Ends at once if the term `epoch` is over.
pub(super) async fn renew(
    elector: Arc<Elector>,
    shard: u32,
    epoch: u64,
    timing: Timing,
    tx: Arc<watch::Sender<Ownership>>,
    status: Arc<Status>,
) {
    let lease = format!("{}/{}", elector.namespace(), elector.name());
    let mut failed = false;
    // Whether the term ended because no renewal went through by the renew deadline (not
    // because another replica holds the Lease now).
    let mut timed_out = false;
    // The term's deadline; `None` once it was given up.
    let deadline = || {
        tx.borrow()
            .tenure(shard)
            .filter(|t| t.epoch == epoch)
            .and_then(|t| t.deadline)
    };
    loop {
        let Some(due) = deadline() else {
            return;
        };
        tokio::select! {
            _ = tokio::time::sleep_until(next_try(due, failed, &timing)) => {}
            // After a failure, the next try keeps its period.
            _ = elector.renew_asked(), if !failed => {}
        }
        let Some(deadline) = deadline() else {
            return;
        };
        let left = deadline.saturating_duration_since(Instant::now());
        match timeout(left, elector.renew()).await {
            Ok(Ok(Attempt::Held { sent, .. })) => {
                failed = false;
                tx.send_modify(|o| {
                    if let Some(t) = o.held.get_mut(&shard).filter(|t| t.epoch == epoch) {
                        t.deadline = Some(sent + timing.renew_deadline);
                    }
                });
            }
            Ok(Ok(Attempt::Lost)) => {
                warn!(
                    shard, epoch, lease = %lease,
                    "lease held by another replica now; stepping down from the shard"
                );
                break;
            }
            Ok(Err(e)) if Instant::now() < deadline => {
                failed = true;
                warn!(
                    shard, lease = %lease,
                    "renewing the lease failed: {}; retrying until the renew deadline",
                    explain(&e, elector.namespace())
                );
            }
            Ok(Err(e)) => {
                warn!(
                    shard, lease = %lease,
                    "renewing the lease failed past the renew deadline: {}; stepping down from the shard",
                    explain(&e, elector.namespace())
                );
                timed_out = true;
                break;
            }
            Err(_) => {
                warn!(
                    shard, lease = %lease,
                    "no renewal of the lease within the renew deadline; stepping down from the shard"
                );
                timed_out = true;
                break;
            }
        }
    }
    // A shard whose renewals did not go through is kept warm (with sharded watches: one
    // shard has none) from here, and by the lease loop a lease duration more
    // (`coordinator/warm.rs`): the replica often takes it back once the API server
    // answers again, and would list it again otherwise.
    let lost = tx.send_if_modified(|o| {
        let lost = o.in_term(shard, epoch) && o.held.remove(&shard).is_some();
        if lost && timed_out && o.map.shards() > 1 {
            o.warm.insert(shard);
        }
        lost
    });
    if lost {
        info!(
            shard,
            epoch, "shard lost: its reconciles stop, its writes are fenced"
        );
        gained_or_lost(&status.metrics, &tx.borrow(), 1);
    }
}

/// When to try the next renewal of a term whose deadline is `deadline`: a retry period
/// (jittered) from now, and after a renewal that went through no later than when half
/// the renew deadline is left (a term that began late, after a slow acquire and the
/// second list, is renewed at once); after a failed one, a retry period from now, as
/// client-go retries, not at once.
pub(super) fn next_try(deadline: Instant, failed: bool, timing: &Timing) -> Instant {
    let period = Instant::now() + jitter(timing.retry_period);
    if failed {
        return period;
    }
    let latest = deadline
        .checked_sub(timing.renew_deadline / 2)
        .unwrap_or(deadline);
    period.min(latest)
}
