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

use super::{Context, Intake, first_look, from_caches};
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

pub(super) async fn run(ctx: Arc<Context>, intake: Intake) {
    let mut own = intake.own.clone();
    let looks = &intake.looks;
    let mut terms = Terms::default();
    loop {
        let now = own.borrow_and_update().clone();
        let changes = terms.update(&now);
        if !changes.lost.is_empty() {
            info!(shards = ?changes.lost, "shards lost: their reconciles stop, their GpuJobs are another replica's now");
            ctx.view
                .shards_lost(|key| changes.lost.contains(&now.shard_of(&key.namespace)));
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
