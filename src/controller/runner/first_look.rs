//! How long a hand-over takes, shard by shard. A gained shard's first look plans every
//! GpuJob of it from the caches at once (`from_caches.rs`); only those that need the API
//! server wait for a worker.
//!
//! Timed from this replica gaining a shard: to every GpuJob the shard had then planned
//! once (`gpujob_shard_first_plan_seconds{shard}`), and to each looked at once through to
//! an outcome, whatever it was.
//! A shard's GpuJobs are known when both caches cover it: at the gain when they did
//! already (one shard of many, or one kept warm), or when its list completes (a cold
//! one). Looks that land before that still count. Exported as
//! `gpujob_shard_first_look_seconds{shard}` and logged; a shard lost before it completes
//! reports nothing. The GpuJobs observed before the gain (work under way) are also timed
//! apart, `gpujob_shard_first_look_observed_seconds{shard}`: the never-observed ones are
//! new work, whose looks cost their Job and first status on the budget.

use std::collections::{BTreeMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;
use tracing::info;

use super::Key;
use crate::controller::view::ObservedOrNew;
use crate::metrics::Metrics;

#[derive(Debug)]
struct Pending {
    since: Instant,
    /// The GpuJobs still to be looked at, once known.
    left: Option<Left>,
    /// Looked at before the shard's GpuJobs were known.
    early: HashSet<Key>,
}

#[derive(Debug)]
struct Left {
    /// Every GpuJob the shard had, not looked at yet.
    all: HashSet<Key>,
    /// Those of them observed before the gain (work under way), not looked at yet;
    /// `None` once reported.
    observed: Option<HashSet<Key>>,
    /// How many GpuJobs, and how many observed, the shard had when they became known.
    total: usize,
    total_observed: usize,
    /// Every one not planned yet: not ended by a look, from the caches or a worker's,
    /// nor queued by a look from the caches.
    unplanned: HashSet<Key>,
    /// Every one planned once, reported.
    planned: bool,
}

/// The shards gained whose GpuJobs are not all looked at yet.
#[derive(Debug, Default)]
pub struct FirstLooks {
    pending: Mutex<BTreeMap<u32, Pending>>,
}

/// Which of a gained shard's GpuJobs a [`Done`] is about, and how far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    /// Every one planned once from the caches: ended there, or queued with what it asks
    /// of the API server (or looked at through to an outcome, which plans it too).
    Planned,
    /// Looked at through to an outcome, those observed before the gain (a status written by a replica): the work its last
    /// holder had under way. Their look costs requests only where something changed.
    Observed,
    /// Looked at through to an outcome, every one, the never-observed too: those are new
    /// work (their Job and first status to write), on the same budget as this replica's
    /// own new work.
    All,
}

/// A shard whose GpuJobs (`which` of them) have all been planned or looked at since it was
/// gained.
#[derive(Debug, PartialEq, Eq)]
pub struct Done {
    pub shard: u32,
    pub which: Which,
    pub gpujobs: usize,
    pub after: Duration,
}

impl FirstLooks {
    /// Shard `shard` was gained at `now` (a new term: whatever was pending restarts).
    pub fn gained(&self, shard: u32, now: Instant) {
        self.lock().insert(
            shard,
            Pending {
                since: now,
                left: None,
                early: HashSet::new(),
            },
        );
    }

    /// Shard `shard` went: nothing to report for it.
    pub fn lost(&self, shard: u32) {
        self.lock().remove(&shard);
    }

    /// Has `shard` been gained, and not all of its GpuJobs looked at since?
    pub fn pending(&self, shard: u32) -> bool {
        self.lock().contains_key(&shard)
    }

    /// Is `key` of `shard` still to have its first look: the shard gained, and the key
    /// one of its GpuJobs not looked at yet (any not looked at yet, while they are not
    /// known)? One not among them when they became known (created since) is new work,
    /// not part of the first look.
    pub fn awaits(&self, shard: u32, key: &Key) -> bool {
        match self.lock().get(&shard) {
            None => false,
            Some(Pending {
                left: Some(left), ..
            }) => left.all.contains(key),
            Some(Pending { early, .. }) => !early.contains(key),
        }
    }

    /// Is `shard` waiting for its GpuJobs to be known?
    pub fn unknown(&self, shard: u32) -> bool {
        self.lock().get(&shard).is_some_and(|p| p.left.is_none())
    }

    /// Both caches cover `shard` now, holding `keys`. Done at once for those (or all)
    /// looked at already, or when there are none.
    pub fn known(&self, shard: u32, keys: &ObservedOrNew, now: Instant) -> Vec<Done> {
        let mut pending = self.lock();
        let Some(p) = pending.get_mut(&shard) else {
            return Vec::new();
        };
        if p.left.is_some() {
            return Vec::new();
        }
        let early = std::mem::take(&mut p.early);
        let observed: HashSet<Key> = keys
            .observed
            .iter()
            .filter(|k| !early.contains(*k))
            .cloned()
            .collect();
        let all: HashSet<Key> = keys
            .new
            .iter()
            .filter(|k| !early.contains(*k))
            .cloned()
            .chain(observed.iter().cloned())
            .collect();
        p.left = Some(Left {
            unplanned: all.clone(),
            all,
            observed: Some(observed),
            total: keys.observed.len() + keys.new.len(),
            total_observed: keys.observed.len(),
            planned: false,
        });
        Self::settle(&mut pending, shard, now)
    }

    /// `key` of shard `shard` was looked at, at `now`.
    pub fn looked(&self, shard: u32, key: &Key, now: Instant) -> Vec<Done> {
        let mut pending = self.lock();
        let Some(p) = pending.get_mut(&shard) else {
            return Vec::new();
        };
        match &mut p.left {
            None => {
                p.early.insert(key.clone());
                Vec::new()
            }
            Some(left) => {
                left.unplanned.remove(key);
                if !left.all.remove(key) {
                    return Vec::new();
                }
                if let Some(observed) = &mut left.observed {
                    observed.remove(key);
                }
                Self::settle(&mut pending, shard, now)
            }
        }
    }

    /// `key` of shard `shard` was planned from the caches at `now`, and queued for a
    /// worker with what it asks of the API server (`from_caches::look_from_caches`).
    pub fn planned(&self, shard: u32, key: &Key, now: Instant) -> Vec<Done> {
        let mut pending = self.lock();
        let Some(left) = pending.get_mut(&shard).and_then(|p| p.left.as_mut()) else {
            return Vec::new();
        };
        if !left.unplanned.remove(key) {
            return Vec::new();
        }
        Self::settle(&mut pending, shard, now)
    }

    /// What of `shard` is done now that its known GpuJobs changed.
    fn settle(pending: &mut BTreeMap<u32, Pending>, shard: u32, now: Instant) -> Vec<Done> {
        let mut done = Vec::new();
        let Some(p) = pending.get_mut(&shard) else {
            return done;
        };
        let after = now.saturating_duration_since(p.since);
        let Some(left) = &mut p.left else {
            return done;
        };
        if left.observed.as_ref().is_some_and(HashSet::is_empty) {
            left.observed = None;
            // A shard with no work under way reports none (a zero would read as fast).
            if left.total_observed > 0 {
                done.push(Done {
                    shard,
                    which: Which::Observed,
                    gpujobs: left.total_observed,
                    after,
                });
            }
        }
        if left.unplanned.is_empty() && !left.planned {
            left.planned = true;
            done.push(Done {
                shard,
                which: Which::Planned,
                gpujobs: left.total,
                after,
            });
        }
        if left.all.is_empty() {
            done.push(Done {
                shard,
                which: Which::All,
                gpujobs: left.total,
                after,
            });
            pending.remove(&shard);
        }
        done
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u32, Pending>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Done {
    /// Into `gpujob_shard_first_plan_seconds` (every GpuJob planned once),
    /// `gpujob_shard_first_look_seconds` (every GpuJob looked at) or
    /// `gpujob_shard_first_look_observed_seconds` (those observed before), and the log.
    pub fn report(&self, metrics: &Metrics) {
        let (histogram, what) = match self.which {
            Which::Planned => (
                &metrics.shard_first_plan,
                "shard's first plan: every GpuJob it had when gained planned once from the caches",
            ),
            Which::All => (
                &metrics.shard_first_look,
                "shard handed over: every GpuJob it had when gained is looked at",
            ),
            Which::Observed => (
                &metrics.shard_first_look_observed,
                "shard's work under way looked at: every GpuJob it had when gained that was observed before",
            ),
        };
        let seconds = self.after.as_secs_f64();
        histogram
            .with_label_values(&[self.shard.to_string().as_str()])
            .observe(seconds);
        info!(
            shard = self.shard,
            gpujobs = self.gpujobs,
            seconds,
            "{what}"
        );
    }
}

/// Reports each of `done`.
pub fn report(done: Vec<Done>, metrics: &Metrics) {
    for d in done {
        d.report(metrics);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(names: &[&str]) -> Vec<Key> {
        names.iter().map(|n| Key::new("ns", n)).collect()
    }

    /// `observed` observed before the gain, `new` never.
    fn sorted(observed: &[&str], new: &[&str]) -> ObservedOrNew {
        ObservedOrNew {
            observed: keys(observed),
            new: keys(new),
        }
    }

    fn done(shard: u32, which: Which, gpujobs: usize, after: Duration) -> Done {
        Done {
            shard,
            which,
            gpujobs,
            after,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_warm_shard_is_done_when_its_last_gpujob_is_looked_at() {
        let looks = FirstLooks::default();
        let t0 = Instant::now();
        assert!(!looks.pending(3));
        looks.gained(3, t0);
        assert!(looks.unknown(3) && looks.pending(3));
        assert_eq!(looks.known(3, &sorted(&["a", "b"], &[]), t0), []);
        assert!(!looks.unknown(3) && looks.pending(3));
        let later = t0 + Duration::from_millis(700);
        assert_eq!(looks.looked(3, &Key::new("ns", "a"), later), []);
        assert_eq!(
            looks.looked(3, &Key::new("ns", "other"), later),
            [],
            "a GpuJob created after the gain is not waited for"
        );
        assert_eq!(
            looks.looked(4, &Key::new("ns", "b"), later),
            [],
            "another shard"
        );
        let at = Duration::from_secs(2);
        assert_eq!(
            looks.looked(3, &Key::new("ns", "b"), t0 + at),
            [
                done(3, Which::Observed, 2, at),
                done(3, Which::Planned, 2, at),
                done(3, Which::All, 2, at)
            ]
        );
        assert_eq!(
            looks.looked(3, &Key::new("ns", "a"), later),
            [],
            "reported once"
        );
        assert!(!looks.pending(3), "over");
    }

    /// The work under way is timed apart from the new work the shard brought: here the
    /// observed GpuJob is looked at first, then the never-observed one.
    #[tokio::test(start_paused = true)]
    async fn the_observed_gpujobs_are_timed_apart_from_the_new_ones() {
        let looks = FirstLooks::default();
        let t0 = Instant::now();
        looks.gained(0, t0);
        assert_eq!(looks.known(0, &sorted(&["old"], &["new"]), t0), []);
        assert_eq!(
            looks.looked(0, &Key::new("ns", "old"), t0 + Duration::from_secs(1)),
            [done(0, Which::Observed, 1, Duration::from_secs(1))]
        );
        assert!(looks.pending(0), "the new one is still to be looked at");
        assert_eq!(
            looks.looked(0, &Key::new("ns", "new"), t0 + Duration::from_secs(9)),
            [
                done(0, Which::Planned, 2, Duration::from_secs(9)),
                done(0, Which::All, 2, Duration::from_secs(9))
            ]
        );
        // The other way round: the observed one last ends both.
        looks.gained(1, t0);
        looks.known(1, &sorted(&["old"], &["new"]), t0);
        assert_eq!(looks.looked(1, &Key::new("ns", "new"), t0), []);
        let at = Duration::from_secs(3);
        assert_eq!(
            looks.looked(1, &Key::new("ns", "old"), t0 + at),
            [
                done(1, Which::Observed, 1, at),
                done(1, Which::Planned, 2, at),
                done(1, Which::All, 2, at)
            ]
        );
        // No observed GpuJob at all: nothing to report of that part.
        looks.gained(2, t0);
        assert_eq!(looks.known(2, &sorted(&[], &["n"]), t0), []);
        assert_eq!(
            looks.looked(2, &Key::new("ns", "n"), t0),
            [
                done(2, Which::Planned, 1, Duration::ZERO),
                done(2, Which::All, 1, Duration::ZERO)
            ]
        );
    }

    /// Every GpuJob planned once (most ended from the caches, the rest queued) is
    /// reported apart, once, before they are all looked at through to an outcome.
    #[tokio::test(start_paused = true)]
    async fn a_shard_planned_whole_is_reported_before_its_last_look() {
        let looks = FirstLooks::default();
        let t0 = Instant::now();
        looks.gained(5, t0);
        let (settled, busy, new) = (
            Key::new("ns", "settled"),
            Key::new("ns", "busy"),
            Key::new("ns", "new"),
        );
        assert_eq!(
            looks.planned(5, &busy, t0),
            [],
            "its GpuJobs are not known yet: the plan is not counted"
        );
        looks.known(5, &sorted(&["settled", "busy"], &["new"]), t0);
        let t1 = t0 + Duration::from_millis(300);
        // Ended from the caches; the other two queued for a worker.
        assert_eq!(looks.looked(5, &settled, t1), []);
        assert_eq!(looks.planned(5, &busy, t1), []);
        assert_eq!(
            looks.planned(5, &Key::new("other", "x"), t1),
            [],
            "not the shard's"
        );
        assert_eq!(
            looks.planned(5, &new, t1),
            [done(5, Which::Planned, 3, Duration::from_millis(300))]
        );
        assert_eq!(looks.planned(5, &new, t1), [], "reported once");
        let t2 = t0 + Duration::from_secs(4);
        assert_eq!(
            looks.looked(5, &busy, t2),
            [done(5, Which::Observed, 2, Duration::from_secs(4))]
        );
        assert_eq!(
            looks.looked(5, &new, t2),
            [done(5, Which::All, 3, Duration::from_secs(4))],
            "planned was reported already"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn looks_before_a_cold_shard_is_listed_count_and_an_empty_shard_is_done_when_known() {
        let looks = FirstLooks::default();
        let t0 = Instant::now();
        looks.gained(1, t0);
        looks.gained(2, t0);
        assert_eq!(looks.looked(1, &Key::new("ns", "a"), t0), []);
        let listed = t0 + Duration::from_secs(5);
        let after = Duration::from_secs(5);
        assert_eq!(
            looks.known(1, &sorted(&["a"], &[]), listed),
            [
                done(1, Which::Observed, 1, after),
                done(1, Which::Planned, 1, after),
                done(1, Which::All, 1, after)
            ]
        );
        assert_eq!(
            looks.known(2, &sorted(&[], &[]), listed),
            [
                done(2, Which::Planned, 0, after),
                done(2, Which::All, 0, after)
            ]
        );
    }

    /// A GpuJob awaits its first look from the gain until it is looked at; one created
    /// after the shard's GpuJobs were known never does (it is new work).
    #[tokio::test(start_paused = true)]
    async fn a_gpujob_awaits_its_first_look_until_looked_at() {
        let looks = FirstLooks::default();
        let t0 = Instant::now();
        let (a, b) = (Key::new("ns", "a"), Key::new("ns", "b"));
        assert!(!looks.awaits(1, &a), "not gained");
        looks.gained(1, t0);
        assert!(looks.awaits(1, &a), "not known yet: every one awaits");
        looks.looked(1, &a, t0);
        assert!(!looks.awaits(1, &a), "looked at before the shard was known");
        assert!(looks.awaits(1, &b));
        looks.known(1, &sorted(&["a"], &["b", "c"]), t0);
        assert!(!looks.awaits(1, &a));
        assert!(looks.awaits(1, &b));
        looks.looked(1, &b, t0);
        assert!(!looks.awaits(1, &b));
        assert!(
            !looks.awaits(1, &Key::new("ns", "later")),
            "created after the shard was known"
        );
        assert!(looks.pending(1), "c is still to be looked at");
    }

    #[tokio::test(start_paused = true)]
    async fn a_shard_lost_or_regained_starts_over() {
        let looks = FirstLooks::default();
        let t0 = Instant::now();
        looks.gained(0, t0);
        looks.known(0, &sorted(&["a", "b"], &[]), t0);
        looks.looked(0, &Key::new("ns", "a"), t0);
        looks.lost(0);
        assert_eq!(looks.looked(0, &Key::new("ns", "b"), t0), [], "lost");
        let t1 = t0 + Duration::from_secs(10);
        looks.gained(0, t1);
        looks.known(0, &sorted(&["a", "b"], &[]), t1);
        assert_eq!(
            looks.looked(0, &Key::new("ns", "b"), t1),
            [],
            "a needed again"
        );
        let done = looks.looked(0, &Key::new("ns", "a"), t1 + Duration::from_secs(1));
        assert_eq!(
            done.iter().map(|d| d.after).collect::<Vec<_>>(),
            [Duration::from_secs(1); 3]
        );
    }
}
