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

use super::{Context, Intake, first_look, worker};
use crate::controller::view::ObservedOrNew;
use crate::controller::{Looked, Reach, reconcile};

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
        // Its term over meanwhile: the next term's own look has the key (`worker::of_term`).
        let Some(looked) = worker::of_term(Some(looked), &intake.own.borrow(), shard, epoch) else {
            continue;
        };
        match looked {
            Ok(Looked::Ended(next)) => {
                ctx.metrics.first_looks_from_caches.inc();
                worker::ended(&ctx, &intake.queue, &intake.looks, shard, &key, Ok(next));
            }
            Ok(Looked::NeedsApi) => {
                let now = Instant::now();
                first_look::report(intake.looks.planned(shard, &key, now), &ctx.metrics);
                intake.add_found(key, observed);
            }
            // A worker looks through to an outcome; an error here (the term ended, say)
            // is its to meet and report.
            Err(_) => intake.add_found(key, observed),
        }
    }
}
