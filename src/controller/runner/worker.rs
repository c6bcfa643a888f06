//! A worker: takes a key of a held shard, reconciles it in that shard's current term
//! (cancelled if the term ends; an outcome that comes as it ends counts in no term), and
//! tells the queue what comes next. It takes a key
//! only with a permit of the pool (`sizing.rs`): the workers allowed at once.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tracing::{debug, error, info};

use super::first_look::{self, FirstLooks};
use super::sizing::Permits;
use super::{Context, Intake, Key};
use crate::controller::error::Error;
use crate::controller::plan::Next;
use crate::controller::{Looked, Reach, reconcile};
use crate::lease::Ownership;
use crate::metrics::Metrics;
use crate::queue::Queue;

pub(super) async fn run(
    ctx: Arc<Context>,
    intake: Intake,
    mut stopping: watch::Receiver<bool>,
    pool: Arc<Permits>,
) {
    let queue = &intake.queue;
    let mut own = intake.own.clone();
    let mut lost = intake.own.clone();
    loop {
        // A standby waits for a shard, or for shutdown (nothing to drain then).
        tokio::select! {
            held = own.wait_for(Ownership::holds_any) => if held.is_err() { return },
            _ = stopping.wait_for(|s| *s) => return,
        }
        // Held until this key is done.
        let _permit = tokio::select! {
            permit = pool.acquire() => match permit {
                Some(permit) => permit,
                None => return,
            },
            _ = stopping.wait_for(|s| *s) => return,
        };
        let key = tokio::select! {
            key = queue.get() => match key {
                Some(key) => key,
                None => return,
            },
            _ = lost.wait_for(|o| !o.holds_any()) => continue,
        };
        // Done however this key's turn ends, a panic included: a key never done would
        // stay in flight, and count against its lane's share of the workers for good.
        let _done = Done { queue, key: &key };
        let (shard, epoch) = {
            let o = own.borrow();
            let shard = o.shard_of(&key.namespace);
            (shard, o.tenure(shard).map(|t| t.epoch))
        };
        let Some(epoch) = epoch else {
            // Its shard went meanwhile: the key comes back with the shard.
            continue;
        };
        if !ctx.view.covers(&key.namespace) {
            // Its shard was just gained and the watches are still listing it: the key
            // comes back when both caches have it (`watches.rs`).
            debug!(gpujob = %key, shard, "not reconciled yet: the caches are still listing its shard");
            continue;
        }
        let started = tokio::time::Instant::now();
        // Every line a reconcile logs carries the GpuJob and its shard; `attempt` is
        // filled in once known.
        let span = tracing::info_span!("reconcile", namespace = %key.namespace, name = %key.name,
            shard, attempt = tracing::field::Empty);
        let term_ended = |o: &Ownership| !o.in_term(shard, epoch);
        let running = ctx.settings.in_flight.enter(shard);
        let outcome = tokio::select! {
            result = tracing::Instrument::instrument(reconcile(&ctx, &key, Reach::Api), span) => Some(result),
            _ = lost.wait_for(term_ended) => None,
        };
        ctx.metrics
            .reconcile_time
            .observe(started.elapsed().as_secs_f64());
        count(&ctx.metrics, &intake, shard, epoch, &key, outcome);
        // Counted or dropped: a shard being given up may be released now.
        drop(running);
    }
}

/// What a worker's reconcile of `key`, run in `shard`'s term `epoch`, came to
/// (`None`: cancelled as the term ended). It counts only in that term: one that ended
/// just as the term did (both ready at once) is dropped like one cancelled. Were the
/// shard lost and gained again, it would otherwise count as the new term's first look
/// of its key, and withdraw the look that term asked for. The term is checked and the
/// outcome counted under one borrow of the ownership, so no other term is published
/// between the two; the hand-over starts a term's first look only once it sees the term
/// published. Nothing here may borrow the ownership again, or send it.
pub(super) fn count(
    metrics: &Metrics,
    intake: &Intake,
    shard: u32,
    epoch: u64,
    key: &Key,
    outcome: Option<Result<Looked, Error>>,
) {
    let Intake { queue, own, looks } = intake;
    let own = own.borrow();
    match outcome.filter(|_| own.in_term(shard, epoch)) {
        None => {
            info!(gpujob = %key, shard, "reconcile cancelled, or ended as this replica's term for the shard did: its outcome counts in no term")
        }
        Some(Ok(Looked::NeedsApi)) => {
            // Not with `Reach::Api`; should it ever be, the key looks again.
            queue.add(key.clone());
        }
        Some(Ok(Looked::Ended(next))) => ended(metrics, queue, looks, shard, key, Ok(next)),
        Some(Err(e)) => ended(metrics, queue, looks, shard, key, Err(e)),
    }
}

/// `key` of `shard` was reconciled to `result`: what comes next is queued, and a gained
/// shard's first look counts it.
pub(super) fn ended(
    metrics: &Metrics,
    queue: &Queue<Key>,
    looks: &FirstLooks,
    shard: u32,
    key: &Key,
    result: Result<Next, Error>,
) {
    follow_up(metrics, queue, key, result);
    first_look::report(
        looked(queue, looks, shard, key, tokio::time::Instant::now()),
        metrics,
    );
}

/// `key` of `shard` was looked at through to an outcome (an error is one: its retry
/// backs off as any GpuJob's), at `now`: a gained shard's first look counts it, and a
/// first look asked for meanwhile was this one. In that order: an add between the two
/// finds the key looked at, and queues it as any GpuJob.
pub(super) fn looked(
    queue: &Queue<Key>,
    looks: &FirstLooks,
    shard: u32,
    key: &Key,
    now: tokio::time::Instant,
) -> Vec<first_look::Done> {
    let done = looks.looked(shard, key, now);
    queue.first_look_over(key);
    done
}

/// Marks its key done when dropped.
struct Done<'a> {
    queue: &'a Queue<Key>,
    key: &'a Key,
}

impl Drop for Done<'_> {
    fn drop(&mut self) {
        self.queue.done(self.key);
    }
}

/// How soon a key whose writes were refused past its shard's deadline looks again:
/// within the renew deadline the shard is either renewed (same term) or lost, so a key
/// costs a few refused looks at most.
const NOT_LEADER_RECHECK: Duration = Duration::from_secs(1);

/// What the queue does with `key` after its reconcile.
fn follow_up(m: &Metrics, queue: &Queue<Key>, key: &Key, result: Result<Next, Error>) {
    debug!(gpujob = %key, outcome = ?result.as_ref().map_err(Error::metric_label), "reconciled");
    match result {
        Ok(Next::Done) => {
            queue.forget(key);
            m.reconcile_total.with_label_values(&["success"]).inc();
        }
        Ok(Next::After(after)) => {
            queue.forget(key);
            m.reconcile_total
                .with_label_values(&["requeue_after"])
                .inc();
            queue.add_after(key.clone(), after);
        }
        Ok(Next::Backoff) => {
            // Not an error, but waiting on the outside: the backoff keeps growing.
            m.reconcile_total.with_label_values(&["requeue"]).inc();
            queue.add_rate_limited(key.clone());
        }
        Err(e) => {
            m.reconcile_total.with_label_values(&["error"]).inc();
            m.reconcile_errors.inc();
            m.reconcile_errors_by_kind
                .with_label_values(&[e.metric_label()])
                .inc();
            match &e {
                // The term may still hold: a renewal sent before the deadline can land
                // after it (a paused process, a slow answer) and keep the epoch, and then
                // no hand-over would bring the key back. It looks again shortly; if the
                // shard went, the worker drops it then (it comes back with the shard).
                Error::NotLeader => {
                    debug!(gpujob = %key, "{e}; looking again in {NOT_LEADER_RECHECK:?}");
                    queue.add_after(key.clone(), NOT_LEADER_RECHECK);
                }
                e if e.is_conflict() => {
                    let delay = queue.add_rate_limited(key.clone());
                    info!(gpujob = %key, "{e}: in {delay:?}");
                }
                _ => {
                    let delay = queue.add_rate_limited(key.clone());
                    error!(gpujob = %key, error = e.metric_label(), "reconcile failed: {e}; retrying in {delay:?}");
                }
            }
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::controller::view::ObservedOrNew;
    use crate::lease::Tenure;
    use crate::queue::Backoff;

    /// The intake of a replica holding shard 0 of 4 in `term`, with shard 0 gained at
    /// `at` and `key` its one GpuJob still to have its first look.
    pub(in crate::controller::runner) fn gained(
        term: &Tenure,
        key: &Key,
        at: tokio::time::Instant,
    ) -> (Intake, watch::Sender<Ownership>) {
        let mut own = Ownership::nothing_of(4);
        own.held.insert(0, term.clone());
        let (tx, rx) = watch::channel(own);
        let intake = Intake {
            queue: Queue::new(Backoff::default()),
            own: rx,
            looks: Arc::default(),
        };
        intake.looks.gained(0, at);
        let keys = ObservedOrNew {
            observed: vec![key.clone()],
            new: Vec::new(),
        };
        assert!(intake.looks.known(0, &keys, at).is_empty());
        (intake, tx)
    }

    /// The shard of `own` lost and gained again: a new term, whose first look asks for
    /// `key` again (as the hand-over starts it).
    pub(in crate::controller::runner) fn lost_and_gained_again(
        intake: &Intake,
        own: &watch::Sender<Ownership>,
        key: &Key,
        at: tokio::time::Instant,
    ) -> Tenure {
        let again = Tenure::gained(None, None);
        own.send_modify(|o| {
            o.held.insert(0, again.clone());
        });
        intake.looks.gained(0, at);
        let keys = ObservedOrNew {
            observed: vec![key.clone()],
            new: Vec::new(),
        };
        assert!(intake.looks.known(0, &keys, at).is_empty());
        again
    }

    fn successes(metrics: &Metrics) -> u64 {
        metrics
            .reconcile_total
            .with_label_values(&["success"])
            .get()
    }

    /// An outcome of the term it ran in counts: the key's first look is over. One that
    /// ended as the term did, the shard lost and gained again, counts in no term: the new
    /// term still asks for the key's first look, and no reconcile is counted.
    #[tokio::test(start_paused = true)]
    async fn an_outcome_counts_only_in_the_term_it_ran_in() {
        let key = Key::new("ns", "a");
        let at = tokio::time::Instant::now();
        let first = Tenure::gained(None, None);
        let (intake, own) = gained(&first, &key, at);
        let metrics = Metrics::new();
        let second = lost_and_gained_again(&intake, &own, &key, at);
        let done = || Some(Ok(Looked::Ended(Next::Done)));
        count(&metrics, &intake, 0, first.epoch, &key, done());
        assert!(
            intake.looks.awaits(0, &key),
            "the new term's look is still asked for"
        );
        assert_eq!(successes(&metrics), 0);
        count(&metrics, &intake, 0, second.epoch, &key, done());
        assert!(!intake.looks.awaits(0, &key), "looked at in its term");
        assert_eq!(successes(&metrics), 1);
        // Cancelled: nothing counts.
        count(&metrics, &intake, 0, second.epoch, &key, None);
        assert_eq!(successes(&metrics), 1);
        // The shard lost: nothing counts.
        own.send_modify(|o| {
            o.held.remove(&0);
        });
        count(&metrics, &intake, 0, second.epoch, &key, done());
        assert_eq!(successes(&metrics), 1);
    }
}
