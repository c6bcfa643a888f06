//! A sharded replica's member heartbeat, `<lease-name>-member-<identity>`, renewed by a
//! task of its own every retry period, so a slow look (a list, takes, deletes under a
//! busy API server) does not delay it. Others judge a replica gone a lease duration
//! after its heartbeat last changed on their own clocks; so that "the others think I am
//! gone" implies "I hold nothing", this replica steps down from every shard the moment
//! its heartbeat has not gone through for a renew deadline (shorter than a lease
//! duration), and takes none until it goes through again. That deadline is also in the
//! published ownership (`Ownership::heartbeat`), so the fence every write passes refuses
//! writes past it even before the step-down has run.

use std::sync::Arc;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until, timeout};
use tracing::{info, warn};

use super::renew::next_try;
use super::{Attempt, Elector, Ownership, Timing, explain, gained_or_lost, jitter};
use crate::health::Status;

/// The running heartbeat of one replica.
pub(super) struct Heartbeat {
    member: Arc<Elector>,
    /// Where the heartbeat's deadline is published.
    tx: Arc<watch::Sender<Ownership>>,
    task: JoinHandle<()>,
    timing: Timing,
}

impl Heartbeat {
    /// Starts renewing `member`; stepping down means leaving every shard of `tx`.
    pub(super) fn start(
        member: Elector,
        tx: Arc<watch::Sender<Ownership>>,
        status: Arc<Status>,
    ) -> Heartbeat {
        let member = Arc::new(member);
        let timing = member.timing().clone();
        // Not through until the first renewal is.
        tx.send_modify(|o| o.heartbeat = Some(Instant::now()));
        let task = tokio::spawn(beat(member.clone(), tx.clone(), status));
        Heartbeat {
            member,
            tx,
            task,
            timing,
        }
    }

    /// Whether a renewal sent within the renew deadline before `now` went through: a
    /// look that starts so may take shards (its list comes after that renewal).
    pub(super) fn through(&self, now: Instant) -> bool {
        through(&self.tx.borrow(), now)
    }

    /// Stops renewing; deletes the member Lease, with the uid and resourceVersion of this
    /// replica's last write of it as preconditions (a successor of the same name keeps its
    /// own); when that is refused or fails, releases it, so it is not live for others at
    /// once and is deleted by them later. Nothing if it never went through.
    pub(super) async fn shut_down(self, namespace: &str) {
        self.task.abort();
        let member = &self.member;
        let deadline = self.timing.renew_deadline;
        match timeout(deadline, member.delete_own()).await {
            Ok(Ok(true)) => {
                info!(lease = %member.name(), "member heartbeat Lease deleted");
                return;
            }
            Ok(Ok(false)) => info!(
                lease = %member.name(),
                "member heartbeat Lease changed since this replica last wrote it: not deleted; releasing it"
            ),
            Ok(Err(e)) => warn!(
                lease = %member.name(),
                "deleting the member heartbeat Lease failed: {}; releasing it",
                explain(&e, namespace)
            ),
            Err(_) => warn!(
                lease = %member.name(),
                "deleting the member heartbeat Lease: no answer; releasing it"
            ),
        }
        let _ = timeout(deadline, member.release()).await;
    }
}

/// Renews (or first takes) the member Lease every retry period; at the renew deadline of
/// the last renewal that went through, steps down from every shard, even while a renewal
/// is still waiting for its answer.
async fn beat(member: Arc<Elector>, tx: Arc<watch::Sender<Ownership>>, status: Arc<Status>) {
    let timing = member.timing().clone();
    let namespace = member.namespace().to_owned();
    let mut held = false;
    loop {
        let (was_held, m) = (held, member.clone());
        let attempt = timeout(timing.renew_deadline, async move {
            if was_held {
                // Lost: released, or deleted by another replica that judged this one gone
                // (it was silent for many lease durations): a new term at once.
                match m.renew().await {
                    Ok(Attempt::Lost) => m.acquire().await,
                    other => other,
                }
            } else {
                m.acquire().await
            }
        });
        tokio::pin!(attempt);
        let stale_at = tx.borrow().heartbeat;
        let result = match stale_at {
            Some(at) => tokio::select! {
                r = &mut attempt => r,
                _ = sleep_until(at) => {
                    step_down(&tx, &status, member.name());
                    attempt.await
                }
            },
            None => attempt.await,
        };
        let through = matches!(result, Ok(Ok(Attempt::Held { .. })));
        match result {
            Ok(Ok(Attempt::Held { sent, .. })) => {
                held = true;
                tx.send_modify(|o| o.heartbeat = Some(sent + timing.renew_deadline));
            }
            Ok(Ok(Attempt::Lost)) => {
                held = false;
                warn!(
                    lease = %member.name(),
                    "member heartbeat: the Lease is held by another replica with this identity; identities must be unique"
                );
            }
            Ok(Err(e)) => warn!(
                "member heartbeat failed: {}: {}; retrying in a retry period",
                member.name(),
                explain(&e, &namespace)
            ),
            Err(_) => warn!(
                "member heartbeat failed: {}: no answer within {:?}; retrying in a retry period",
                member.name(),
                timing.renew_deadline
            ),
        }
        // Paced like a shard's renewals (`renew.rs`): at the latest when half the renew
        // deadline is left, and a retry period after a failure.
        let stale_at = tx.borrow().heartbeat;
        let next = match stale_at {
            Some(at) => next_try(at, !through, &timing),
            None => Instant::now() + jitter(timing.retry_period),
        };
        match stale_at.filter(|at| *at < next) {
            // Only this task moves the deadline: stale at `at` for sure.
            Some(at) => {
                sleep_until(at).await;
                step_down(&tx, &status, member.name());
                sleep_until(next).await;
            }
            None => sleep_until(next).await,
        }
    }
}

/// Whether the heartbeat published in `own` allows taking and writing at `now`.
pub(super) fn through(own: &Ownership, now: Instant) -> bool {
    own.heartbeat_valid_at(now)
}

/// Leaves every shard held: their reconciles stop and their writes are fenced; their
/// Leases run out (other replicas take them a lease duration after their last renewal).
/// With more than one shard they stay warm, as one whose renewals failed does
/// (`renew.rs`): their watches go on, so taking them back once the heartbeat goes
/// through again (after an API server outage, every replica at once) lists nothing.
fn step_down(tx: &watch::Sender<Ownership>, status: &Status, lease: &str) {
    // The shards left are read in the same step that leaves them: one lost meanwhile by
    // its renewal is counted there, not here too.
    let mut held: Vec<u32> = Vec::new();
    let left = tx.send_if_modified(|o| {
        held = o.held.keys().copied().collect();
        if o.map.shards() > 1 {
            o.warm.extend(o.held.keys().copied());
        }
        o.held.clear();
        !held.is_empty()
    });
    if left {
        warn!(
            lease = %lease,
            shards = ?held,
            "member heartbeat not through within the renew deadline: stepping down from every shard (other replicas would soon judge this one gone); taking shards again once it goes through"
        );
        gained_or_lost(&status.metrics, &tx.borrow(), held.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::Tenure;
    use crate::metrics::Metrics;

    /// Stepping down leaves every shard, and shows each warm: the lease loop's next
    /// publish keeps them so for a lease duration (`coordinator/warm.rs`), and their
    /// watches go on meanwhile. With one shard nothing is kept warm.
    #[test]
    fn stepping_down_keeps_the_shards_left_warm() {
        let status = Status::new(Metrics::new());
        let mut own = Ownership::nothing_of(4);
        own.held.insert(1, Tenure::gained(None, None));
        own.held.insert(3, Tenure::gained(None, None));
        own.warm.insert(2);
        let (tx, _rx) = watch::channel(own);
        step_down(&tx, &status, "gpujob-operator-member-a");
        let own = tx.borrow();
        assert!(!own.holds_any());
        assert_eq!(own.warm, [1, 2, 3].into());
        // Each shard left is a transition, as when each is lost on its own.
        assert_eq!(status.metrics.shard_transitions.get(), 2);
        assert_eq!(status.metrics.lease_transitions.get(), 2);

        let mut one = Ownership::nothing_of(1);
        one.held.insert(0, Tenure::gained(None, None));
        let (tx, _rx) = watch::channel(one);
        step_down(&tx, &status, "gpujob-operator-member-a");
        assert!(!tx.borrow().holds_any());
        assert!(tx.borrow().warm.is_empty());
    }
}
