//! The shards published as kept warm: those [`balance::successor_of`] computes, and
//! for one lease duration those it stopped computing. Mid-takeover the computed set can
//! drop a shard for a moment and add it back: a dead replica's member heartbeat may
//! outlive its shard Leases, and while it does the survivors split each other's shards
//! with it. Each drop would stop that shard's watches and drop its caches, and each
//! return would list it again; a shard kept a lease duration longer rides that out. A
//! shard this replica gives up is passed as computed too: its next keeper is often this
//! replica. So is one it stopped holding otherwise (a renewal that failed past its
//! deadline): the replica often takes it back once the API server answers again.
//!
//! [`balance::successor_of`]: gpujob_core::balance::successor_of

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// The warm set with its grace.
#[derive(Debug, Default)]
pub(super) struct Warm {
    /// Each shard last computed warm, with the look that last computed it so.
    last_computed: BTreeMap<u32, Instant>,
    /// The shards held at the last look.
    last_held: BTreeSet<u32>,
}

impl Warm {
    /// The shards to publish as kept warm after a look at `now` that computed `computed`:
    /// those, and each shard computed within `grace` before `now` and not `held` by
    /// this replica now (a held shard is watched anyway). A shard held at the last look
    /// and not now counts as computed now.
    pub(super) fn publish(
        &mut self,
        computed: &BTreeSet<u32>,
        held: &BTreeSet<u32>,
        grace: Duration,
        now: Instant,
    ) -> BTreeSet<u32> {
        let no_longer_held = self.last_held.difference(held);
        for &s in computed.iter().chain(no_longer_held) {
            self.last_computed.insert(s, now);
        }
        self.last_held.clone_from(held);
        self.last_computed
            .retain(|s, at| !held.contains(s) && now.saturating_duration_since(*at) < grace);
        self.last_computed.keys().copied().collect()
    }

    /// Forgets every shard (the shard map moved: every shard's watches start again).
    pub(super) fn forget(&mut self) {
        self.last_computed.clear();
        self.last_held.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRACE: Duration = Duration::from_secs(15);

    fn set(s: &[u32]) -> BTreeSet<u32> {
        s.iter().copied().collect()
    }

    #[test]
    fn a_shard_dropped_for_a_moment_stays_warm() {
        let t0 = Instant::now();
        let mut w = Warm::default();
        let none = set(&[]);
        assert_eq!(
            w.publish(&set(&[2, 3, 4, 5]), &none, GRACE, t0),
            set(&[2, 3, 4, 5])
        );
        // The flicker seen in a takeover: 4 left the computed set for one look.
        let t1 = t0 + Duration::from_millis(400);
        assert_eq!(
            w.publish(&set(&[1, 2, 3, 5]), &none, GRACE, t1),
            set(&[1, 2, 3, 4, 5])
        );
        let t2 = t1 + Duration::from_millis(400);
        assert_eq!(
            w.publish(&set(&[0, 1, 2, 3, 4, 5]), &none, GRACE, t2),
            set(&[0, 1, 2, 3, 4, 5])
        );
    }

    #[test]
    fn a_shard_no_longer_computed_goes_after_the_grace() {
        let t0 = Instant::now();
        let mut w = Warm::default();
        let none = set(&[]);
        w.publish(&set(&[1, 2]), &none, GRACE, t0);
        let just_before = t0 + GRACE - Duration::from_millis(1);
        assert_eq!(
            w.publish(&set(&[1]), &none, GRACE, just_before),
            set(&[1, 2])
        );
        // Counted from the last look that computed it, not from the first.
        assert_eq!(w.publish(&set(&[1]), &none, GRACE, t0 + GRACE), set(&[1]));
    }

    #[test]
    fn a_shard_computed_again_counts_its_grace_anew() {
        let t0 = Instant::now();
        let mut w = Warm::default();
        let none = set(&[]);
        w.publish(&set(&[3]), &none, GRACE, t0);
        let t1 = t0 + Duration::from_secs(10);
        w.publish(&set(&[3]), &none, GRACE, t1);
        assert_eq!(
            w.publish(&set(&[]), &none, GRACE, t0 + Duration::from_secs(20)),
            set(&[3]),
            "computed at t1, so warm until t1 + grace"
        );
        assert_eq!(w.publish(&set(&[]), &none, GRACE, t1 + GRACE), set(&[]));
    }

    #[test]
    fn a_shard_taken_leaves_the_warm_set_at_once_and_lingers_from_when_it_is_lost() {
        let t0 = Instant::now();
        let mut w = Warm::default();
        w.publish(&set(&[3, 4]), &set(&[]), GRACE, t0);
        let t1 = t0 + Duration::from_secs(10);
        assert_eq!(w.publish(&set(&[3]), &set(&[4]), GRACE, t1), set(&[3]));
        assert_eq!(w.publish(&set(&[3]), &set(&[4]), GRACE, t1), set(&[3]));
        // Lost without being given up (its renewal failed): warm for a grace from the
        // look that found it gone, not from the time before it was held.
        let t2 = t1 + Duration::from_secs(10);
        assert_eq!(w.publish(&set(&[3]), &set(&[]), GRACE, t2), set(&[3, 4]));
        let just_before = t2 + GRACE - Duration::from_millis(1);
        assert_eq!(
            w.publish(&set(&[3]), &set(&[]), GRACE, just_before),
            set(&[3, 4])
        );
        assert_eq!(
            w.publish(&set(&[3]), &set(&[]), GRACE, t2 + GRACE),
            set(&[3])
        );
    }

    #[test]
    fn forgetting_drops_the_lingering_shards() {
        let t0 = Instant::now();
        let mut w = Warm::default();
        w.publish(&set(&[1, 2]), &set(&[5]), GRACE, t0);
        w.forget();
        assert_eq!(w.publish(&set(&[1]), &set(&[]), GRACE, t0), set(&[1]));
    }
}
