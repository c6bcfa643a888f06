//! The shards published as kept warm: those [`balance::successor_of`] computes, and
//! for one lease duration those it stopped computing. Mid-takeover the computed set can
//! drop a shard for a moment and add it back: a dead replica's member heartbeat may
//! outlive its shard Leases, and while it does the survivors split each other's shards
//! with it. Each drop would stop that shard's watches and drop its caches, and each
//! return would list it again; a shard kept a lease duration longer rides that out. A
//! shard this replica gives up is passed as computed too: its next keeper is often this
//! replica. So is one whose renewals failed past the renew deadline, and every shard
//! left when the member heartbeat failed: the renew loop (`renew.rs`), or the heartbeat's
//! step-down (`heartbeat.rs`), puts it in the ownership's warm set as it leaves the held
//! set, and the next publish, finding it there unpublished, keeps it as computed then.
//! The replica often takes such a shard back once the API server answers again.
//!
//! [`balance::successor_of`]: gpujob_core::balance::successor_of

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// The warm set with its grace.
#[derive(Debug, Default)]
pub(super) struct Warm {
    /// Each shard last computed warm, with the look that last computed it so.
    last_computed: BTreeMap<u32, Instant>,
    /// What the last publish returned (`None` before the first and after [`Warm::forget`]:
    /// then nothing shown is taken for a lost shard).
    published: Option<BTreeSet<u32>>,
}

impl Warm {
    /// The shards to publish as kept warm after a look at `now` that computed `computed`:
    /// those, and each shard computed within `grace` before `now`, but none `held` by
    /// this replica now (a held shard is watched anyway). `shown`: the warm set the
    /// ownership shows now; a shard in it that the last publish did not return was put
    /// there by the renew loop as it lost the shard, or by the heartbeat's step-down, and
    /// counts as computed now.
    pub(super) fn publish(
        &mut self,
        computed: &BTreeSet<u32>,
        shown: &BTreeSet<u32>,
        held: &BTreeSet<u32>,
        grace: Duration,
        now: Instant,
    ) -> BTreeSet<u32> {
        let lost: Vec<u32> = match &self.published {
            Some(published) => shown.difference(published).copied().collect(),
            None => Vec::new(),
        };
        for &s in computed.iter().chain(&lost) {
            self.last_computed.insert(s, now);
        }
        self.last_computed
            .retain(|s, at| !held.contains(s) && now.saturating_duration_since(*at) < grace);
        let published: BTreeSet<u32> = self.last_computed.keys().copied().collect();
        self.published = Some(published.clone());
        published
    }

    /// `shard` is held now: its grace ends, and it is no longer published (so a later
    /// loss of it shows as one).
    pub(super) fn taken(&mut self, shard: u32) {
        self.last_computed.remove(&shard);
        if let Some(published) = &mut self.published {
            published.remove(&shard);
        }
    }

    /// Forgets every shard (the shard map moved: every shard's watches start again).
    pub(super) fn forget(&mut self) {
        self.last_computed.clear();
        self.published = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRACE: Duration = Duration::from_secs(15);

    fn set(s: &[u32]) -> BTreeSet<u32> {
        s.iter().copied().collect()
    }

    /// The lease loop's looks, with the ownership's warm set as they leave it (and as
    /// the renew loop changes it between looks).
    #[derive(Default)]
    struct Looks {
        warm: Warm,
        shown: BTreeSet<u32>,
    }

    impl Looks {
        fn look(&mut self, computed: &[u32], held: &[u32], now: Instant) -> BTreeSet<u32> {
            self.shown = self
                .warm
                .publish(&set(computed), &self.shown, &set(held), GRACE, now);
            self.shown.clone()
        }
    }

    #[test]
    fn a_shard_dropped_for_a_moment_stays_warm() {
        let t0 = Instant::now();
        let mut l = Looks::default();
        assert_eq!(l.look(&[2, 3, 4, 5], &[], t0), set(&[2, 3, 4, 5]));
        // The flicker seen in a takeover: 4 left the computed set for one look.
        let t1 = t0 + Duration::from_millis(400);
        assert_eq!(l.look(&[1, 2, 3, 5], &[], t1), set(&[1, 2, 3, 4, 5]));
        let t2 = t1 + Duration::from_millis(400);
        assert_eq!(
            l.look(&[0, 1, 2, 3, 4, 5], &[], t2),
            set(&[0, 1, 2, 3, 4, 5])
        );
    }

    #[test]
    fn a_shard_no_longer_computed_goes_after_the_grace() {
        let t0 = Instant::now();
        let mut l = Looks::default();
        l.look(&[1, 2], &[], t0);
        let just_before = t0 + GRACE - Duration::from_millis(1);
        assert_eq!(l.look(&[1], &[], just_before), set(&[1, 2]));
        // Counted from the last look that computed it, not from the first.
        assert_eq!(l.look(&[1], &[], t0 + GRACE), set(&[1]));
    }

    #[test]
    fn a_shard_computed_again_counts_its_grace_anew() {
        let t0 = Instant::now();
        let mut l = Looks::default();
        l.look(&[3], &[], t0);
        let t1 = t0 + Duration::from_secs(10);
        l.look(&[3], &[], t1);
        assert_eq!(
            l.look(&[], &[], t0 + Duration::from_secs(20)),
            set(&[3]),
            "computed at t1, so warm until t1 + grace"
        );
        assert_eq!(l.look(&[], &[], t1 + GRACE), set(&[]));
    }

    #[test]
    fn a_shard_taken_leaves_the_warm_set_at_once_and_does_not_linger_from_before() {
        let t0 = Instant::now();
        let mut l = Looks::default();
        l.look(&[3, 4], &[], t0);
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(l.look(&[3], &[4], t1), set(&[3]));
        // No longer held, and not shown warm (given up in an earlier look, or its
        // holder's heartbeat stopped): not warm from the time before it was held.
        let t2 = t1 + Duration::from_secs(1);
        assert_eq!(l.look(&[3], &[], t2), set(&[3]));
    }

    #[test]
    fn a_shard_the_renew_loop_lost_stays_warm_a_grace_from_the_next_look() {
        let t0 = Instant::now();
        let mut l = Looks::default();
        assert_eq!(l.look(&[3], &[4], t0), set(&[3]));
        // Its renewals failed past the renew deadline: the renew loop shows it warm.
        l.shown.insert(4);
        let t1 = t0 + Duration::from_secs(10);
        assert_eq!(l.look(&[3], &[], t1), set(&[3, 4]));
        let just_before = t1 + GRACE - Duration::from_millis(1);
        assert_eq!(l.look(&[3], &[], just_before), set(&[3, 4]));
        assert_eq!(l.look(&[3], &[], t1 + GRACE), set(&[3]));
        // Lost again later, warm again; then taken back within the grace: held, so not
        // warm, and its grace ends.
        l.shown.insert(4);
        let t2 = t1 + GRACE + Duration::from_secs(1);
        assert_eq!(l.look(&[3], &[], t2), set(&[3, 4]));
        assert_eq!(l.look(&[3], &[4], t2), set(&[3]));
    }

    #[test]
    fn a_shard_taken_while_warm_is_lost_anew_when_its_renewals_fail() {
        let t0 = Instant::now();
        let mut l = Looks::default();
        assert_eq!(l.look(&[4], &[], t0), set(&[4]));
        // Taken after that look published it (the lease loop takes after publishing),
        // and lost to its renew deadline before the next look publishes.
        l.warm.taken(4);
        l.shown.remove(&4);
        l.shown.insert(4);
        let t1 = t0 + GRACE - Duration::from_secs(1);
        assert_eq!(l.look(&[], &[], t1), set(&[4]));
        // Its grace counts from that look, not from the one before it was taken.
        assert_eq!(l.look(&[], &[], t0 + GRACE), set(&[4]));
        assert_eq!(l.look(&[], &[], t1 + GRACE), set(&[]));
    }

    #[test]
    fn forgetting_drops_the_lingering_shards_and_takes_none_shown_for_lost() {
        let t0 = Instant::now();
        let mut l = Looks::default();
        l.look(&[1, 2], &[5], t0);
        l.warm.forget();
        // The ownership still shows the old map's warm set when the look comes, and a
        // shard the renew loop lost meanwhile: none is taken for one lost.
        l.shown.insert(5);
        assert_eq!(l.look(&[1], &[], t0), set(&[1]));
    }
}
