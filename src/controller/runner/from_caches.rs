//! A gained shard's first look, from the caches: every GpuJob of the shard is planned at
//! once, on no API budget. One that needs nothing from the API server (most, where the
//! shard's work was settled) is looked at then; only the others wait for a worker, in
//! the first-look lane (the never-observed ones in the prompt lane, as new work). So a
//! takeover is planned whole in about the time the caches take, whatever the survivor's
//! backlog, and its workers' time goes to what must be read or written. How long it all
//! takes is `first_look.rs`.

use std::sync::Arc;

use tokio::time::Instant;
use tracing::Instrument;

use super::{Context, Intake, Key, first_look, worker};
use crate::controller::error::Error;
use crate::controller::view::ObservedOrNew;
use crate::controller::{Looked, Reach, reconcile};
use crate::metrics::Metrics;

/// How many GpuJobs [`look_from_caches`] plans before it lets other tasks run.
const BATCH: usize = 64;

/// The first look at `keys`, the GpuJobs of shards just gained (or just listed after a
/// gain): each is reconciled from the caches alone ([`Reach::Caches`]), at once. One
/// that needs nothing from the API server ends there, as a worker's reconcile would (the
/// same plan, the same executor, which sends nothing); the others are queued as
/// [`Intake::add_found`] queues them, for a worker, which plans again from the caches as
/// they are then. A GpuJob whose shard is no longer in its first look is queued at once;
/// one whose shard is not listed yet is passed over (it comes back, with every GpuJob of
/// the shard, when both caches have it: `watches::newly_covered`).
///
/// A GpuJob is looked at in the term its shard is held in when the look reaches it, and
/// its outcome dropped if that term ended meanwhile (the next term's look has it).
/// A GpuJob a worker has is left to that look. Otherwise the key is not taken from the
/// queue: it may be queued already (a resync, a watch event), and a worker may take it
/// while this look runs. The look here sends nothing, so the worst is a look more.
/// Only a look made here counts a GpuJob as planned; one left to a worker counts when
/// the worker has looked.
pub(super) async fn look_from_caches(ctx: Arc<Context>, intake: Intake, keys: ObservedOrNew) {
    let observed = keys.observed.into_iter().map(|k| (k, true));
    let new = keys.new.into_iter().map(|k| (k, false));
    for (i, (key, observed)) in observed.chain(new).enumerate() {
        if i % BATCH == BATCH - 1 {
            tokio::task::yield_now().await;
        }
        let (shard, epoch) = {
            let own = intake.own.borrow();
            let shard = own.shard_of(&key.namespace);
            match own.tenure(shard) {
                Some(t) => (shard, t.epoch),
                None => continue,
            }
        };
        if !ctx.view.covers(&key.namespace) {
            // Its shard is still being listed: its GpuJobs come back, every one, when
            // both caches have it (`watches::newly_covered`). A worker would drop it too.
            continue;
        }
        // With a worker (a watch event came first): that look will do.
        if !intake.looks.pending(shard) || intake.queue.in_flight(&key) {
            intake.add_found(key, observed);
            continue;
        }
        let span = tracing::info_span!("reconcile", namespace = %key.namespace, name = %key.name,
            shard, attempt = tracing::field::Empty);
        let looked = reconcile(&ctx, &key, Reach::Caches).instrument(span).await;
        count(&ctx.metrics, &intake, shard, epoch, key, observed, looked);
    }
}

/// What the look from the caches at `key` (`observed` before its shard's gain, or not),
/// in `shard`'s term `epoch`, came to. It counts only in that term, checked and counted
/// under one borrow of the ownership as a worker's outcome is (`worker::count`); one
/// whose term ended meanwhile is dropped, and the next term's own look has the key. The
/// ones queued for a worker are queued once the borrow is let go: queueing borrows the
/// ownership itself.
fn count(
    metrics: &Metrics,
    intake: &Intake,
    shard: u32,
    epoch: u64,
    key: Key,
    observed: bool,
    looked: Result<Looked, Error>,
) {
    let own = intake.own.borrow();
    if !own.in_term(shard, epoch) {
        return;
    }
    match looked {
        Ok(Looked::Ended(next)) => {
            metrics.first_looks_from_caches.inc();
            worker::ended(metrics, &intake.queue, &intake.looks, shard, &key, Ok(next));
        }
        Ok(Looked::NeedsApi) => {
            let now = Instant::now();
            first_look::report(intake.looks.planned(shard, &key, now), metrics);
            drop(own);
            intake.add_found(key, observed);
        }
        // A worker looks through to an outcome; an error here (the term ended, say)
        // is its to meet and report.
        Err(_) => {
            drop(own);
            intake.add_found(key, observed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::plan::Next;
    use crate::controller::runner::worker::tests::{gained, lost_and_gained_again};
    use crate::lease::Tenure;

    /// A look from the caches whose shard was lost and gained again meanwhile counts in
    /// no term: the new term still asks for the key's first look. One in its term ends
    /// the key's first look there.
    #[tokio::test(start_paused = true)]
    async fn a_look_counts_only_in_the_term_it_ran_in() {
        let key = Key::new("ns", "a");
        let at = Instant::now();
        let first = Tenure::gained(None, None);
        let (intake, own) = gained(&first, &key, at);
        let metrics = Metrics::new();
        let second = lost_and_gained_again(&intake, &own, &key, at);
        let done = || Ok(Looked::Ended(Next::Done));
        count(&metrics, &intake, 0, first.epoch, key.clone(), true, done());
        assert!(
            intake.looks.awaits(0, &key),
            "the new term's look is still asked for"
        );
        assert_eq!(metrics.first_looks_from_caches.get(), 0);
        count(
            &metrics,
            &intake,
            0,
            second.epoch,
            key.clone(),
            true,
            done(),
        );
        assert!(!intake.looks.awaits(0, &key), "looked at in its term");
        assert_eq!(metrics.first_looks_from_caches.get(), 1);
    }
}
