//! Hand-over, shard by shard. Ownership arrives on a watch channel that keeps only its
//! latest value, so a shard lost and regained between two looks would seem unchanged;
//! comparing each shard's epoch (new on every gain) sees it as the two transitions it
//! is. Losing a shard forgets what this replica wrote there (its successor writes now);
//! gaining one gives its GpuJobs their first look from the caches
//! (`from_caches::look_from_caches`: those that need nothing from the API server end
//! there; the others are queued in the first-look lane, ahead of this replica's backlog,
//! and those never observed in the prompt lane, as new work). With sharded watches the
//! caches have a cold shard's GpuJobs only once it is listed, and the watches start
//! their first look then.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use tokio::time::Instant;
use tracing::info;

use super::{Context, Intake, Key, first_look, from_caches};
use crate::lease::Ownership;

/// The epoch of each shard as last seen.
#[derive(Debug, Default)]
pub struct Terms {
    epochs: BTreeMap<u32, u64>,
}

/// What changed since the last look: a shard lost and regained is in both.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Changes {
    pub lost: BTreeSet<u32>,
    pub gained: BTreeSet<u32>,
}

impl Terms {
    pub fn update(&mut self, own: &Ownership) -> Changes {
        let now = own.epochs();
        let mut changes = Changes::default();
        for (shard, epoch) in &self.epochs {
            if now.get(shard) != Some(epoch) {
                changes.lost.insert(*shard);
            }
        }
        for (shard, epoch) in &now {
            if self.epochs.get(shard) != Some(epoch) {
                changes.gained.insert(*shard);
            }
        }
        self.epochs = now;
        changes
    }
}

/// The GpuJobs whose shard was `lost`, and those of every namespace this replica no
/// longer holds, under the map now in force: what it wrote there is forgotten and they
/// leave its queue (another replica writes there now; a shard lost and regained between
/// two looks starts a new term, with a first look at all of them). Not only those of
/// the shards lost by the map now in force: a re-cut that comes with a loss moves some
/// of a lost shard's namespaces to shards that other replicas hold, and that map names
/// none of them as lost.
fn forgotten<'a>(now: &'a Ownership, lost: &'a BTreeSet<u32>) -> impl Fn(&Key) -> bool + 'a {
    move |key| !now.holds_namespace(&key.namespace) || lost.contains(&now.shard_of(&key.namespace))
}

pub(super) async fn run(ctx: Arc<Context>, intake: Intake) {
    let mut own = intake.own.clone();
    let looks = &intake.looks;
    let mut terms = Terms::default();
    loop {
        let now = own.borrow_and_update().clone();
        let changes = terms.update(&now);
        if !changes.lost.is_empty() {
            info!(shards = ?changes.lost, "shards lost: their reconciles stop, their GpuJobs are another replica's now");
            let gone = forgotten(&now, &changes.lost);
            ctx.view.shards_lost(&gone);
            intake.queue.drop_where(&gone);
            for shard in &changes.lost {
                looks.lost(*shard);
            }
        }
        if !changes.gained.is_empty() {
            let epochs: Vec<u64> = changes
                .gained
                .iter()
                .filter_map(|s| now.tenure(*s).map(|t| t.epoch))
                .collect();
            info!(shards = ?changes.gained, ?epochs, "shards gained: reconciling their GpuJobs");
            let at = Instant::now();
            for &shard in &changes.gained {
                looks.gained(shard, at);
                let keys = ctx.view.keys_where(|ns| now.shard_of(ns) == shard);
                // Not covered yet (sharded watches, a cold shard): its GpuJobs are known,
                // and looked at, when both caches have listed it (`watches.rs`); the
                // look here passes over them.
                if ctx.view.covers_shard(shard) {
                    first_look::report(looks.known(shard, &keys, at), &ctx.metrics);
                }
                tokio::spawn(from_caches::look_from_caches(
                    ctx.clone(),
                    intake.clone(),
                    keys,
                ));
            }
        }
        if own.changed().await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::Tenure;

    fn holding(shards: &[(u32, &Tenure)]) -> Ownership {
        let mut o = Ownership::nothing_of(4);
        for (s, t) in shards {
            o.held.insert(*s, (*t).clone());
        }
        o
    }

    #[test]
    fn a_loss_and_a_regain_between_two_looks_are_two_transitions() {
        let mut terms = Terms::default();
        let first = Tenure::gained(None, None);
        let changes = terms.update(&holding(&[(0, &first)]));
        assert_eq!(changes.gained, BTreeSet::from([0]));
        // Renewed: same term, nothing to do.
        assert_eq!(terms.update(&holding(&[(0, &first)])), Changes::default());
        // Lost and regained before this look: a booleans-only view ("held", "held")
        // would see nothing; the epoch says it is a new term.
        let second = Tenure::gained(None, None);
        let changes = terms.update(&holding(&[(0, &second)]));
        assert_eq!(changes.lost, BTreeSet::from([0]));
        assert_eq!(changes.gained, BTreeSet::from([0]));
    }

    /// A re-cut that comes with a loss: a namespace of the lost shard moved to a shard
    /// another replica holds, which the new map does not name as lost.
    #[test]
    fn a_namespace_a_recut_moved_away_with_a_lost_shard_is_forgotten() {
        use crate::shard::ShardMap;
        let in_shard = |prefix: &str, shard: u32| {
            (0..)
                .map(|i| format!("{prefix}-{i}"))
                .find(|n| ShardMap::even(3).shard_of(n) == shard)
                .unwrap_or_default()
        };
        let (moved, kept) = (in_shard("team", 0), in_shard("other", 2));
        let (a, b) = (Tenure::gained(None, None), Tenure::gained(None, None));
        let mut terms = Terms::default();
        let mut before = Ownership::nothing_of(3);
        before.held.insert(0, a);
        before.held.insert(2, b.clone());
        terms.update(&before);
        // The re-cut: shard 0 shrinks to nothing and shard 1 (another replica's) takes
        // its namespaces; shard 0 is let go, shard 2 kept.
        let cuts = [1, crate::shard::range_of(2, 3).start];
        let recut = ShardMap::with_cuts(&cuts).unwrap_or_else(|e| panic!("{e}"));
        let mut after = Ownership::nothing_in(Arc::new(recut));
        after.held.insert(2, b);
        let changes = terms.update(&after);
        assert_eq!(changes.lost, BTreeSet::from([0]));
        assert_eq!(
            after.shard_of(&moved),
            1,
            "not a shard the new map says was lost"
        );
        let gone = forgotten(&after, &changes.lost);
        assert!(gone(&Key::new(&moved, "x")));
        assert!(!gone(&Key::new(&kept, "x")), "still held here");
        // Shard 2 lost and regained between two looks: held, and forgotten all the same.
        let mut again = after.clone();
        again.held.insert(2, Tenure::gained(None, None));
        let changes = terms.update(&again);
        assert_eq!(changes.lost, BTreeSet::from([2]));
        assert!(forgotten(&again, &changes.lost)(&Key::new(&kept, "x")));
    }

    #[test]
    fn shards_change_hands_one_by_one() {
        let mut terms = Terms::default();
        let (a, b, c) = (
            Tenure::gained(None, None),
            Tenure::gained(None, None),
            Tenure::gained(None, None),
        );
        terms.update(&holding(&[(0, &a), (1, &b)]));
        let changes = terms.update(&holding(&[(1, &b), (2, &c)]));
        assert_eq!(changes.lost, BTreeSet::from([0]));
        assert_eq!(changes.gained, BTreeSet::from([2]));
        let changes = terms.update(&Ownership::nothing_of(4));
        assert_eq!(changes.lost, BTreeSet::from([1, 2]));
        assert!(changes.gained.is_empty());
    }
}
