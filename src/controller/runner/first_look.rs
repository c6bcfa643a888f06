//! How long a hand-over takes, shard by shard: from this replica gaining a shard to each
//! GpuJob the shard had then looked at once (reconciled to an outcome, whatever it was).
//! A shard's GpuJobs are known when both caches cover it: at the gain when they did
//! already (one shard of many, or one kept warm), or when its list completes (a cold
//! one). Looks that land before that still count. Exported as
//! `gpujob_shard_first_look_seconds{shard}` and logged; a shard lost before it completes
//! reports nothing.

use std::collections::{BTreeMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;
use tracing::info;

use super::Key;
use crate::metrics::Metrics;

#[derive(Debug)]
struct Pending {
    since: Instant,
    /// The GpuJobs still to be looked at, once known.
    left: Option<HashSet<Key>>,
    /// Looked at before the shard's GpuJobs were known.
    early: HashSet<Key>,
    /// How many GpuJobs the shard had when they became known.
    total: usize,
}

/// The shards gained whose GpuJobs are not all looked at yet.
#[derive(Debug, Default)]
pub struct FirstLooks {
    pending: Mutex<BTreeMap<u32, Pending>>,
}

/// A shard whose GpuJobs have all been looked at since it was gained.
#[derive(Debug, PartialEq, Eq)]
pub struct Done {
    pub shard: u32,
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
                total: 0,
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

    /// Is `shard` waiting for its GpuJobs to be known?
    pub fn unknown(&self, shard: u32) -> bool {
        self.lock().get(&shard).is_some_and(|p| p.left.is_none())
    }

    /// Both caches cover `shard` now, holding `keys`. Done at once if every one was
    /// looked at already (or there are none).
    pub fn known(&self, shard: u32, keys: Vec<Key>, now: Instant) -> Option<Done> {
        let mut pending = self.lock();
        let p = pending.get_mut(&shard)?;
        if p.left.is_some() {
            return None;
        }
        let early = std::mem::take(&mut p.early);
        let left: HashSet<Key> = keys.into_iter().filter(|k| !early.contains(k)).collect();
        let gpujobs = left.len() + early.len();
        if left.is_empty() {
            let since = p.since;
            pending.remove(&shard);
            return Some(Done {
                shard,
                gpujobs,
                after: now.saturating_duration_since(since),
            });
        }
        p.left = Some(left);
        p.total = gpujobs;
        None
    }

    /// `key` of shard `shard` was looked at, at `now`.
    pub fn looked(&self, shard: u32, key: &Key, now: Instant) -> Option<Done> {
        let mut pending = self.lock();
        let p = pending.get_mut(&shard)?;
        match &mut p.left {
            None => {
                p.early.insert(key.clone());
                None
            }
            Some(left) => {
                if !left.remove(key) || !left.is_empty() {
                    return None;
                }
                let done = Done {
                    shard,
                    gpujobs: p.total,
                    after: now.saturating_duration_since(p.since),
                };
                pending.remove(&shard);
                Some(done)
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u32, Pending>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Done {
    /// Into `gpujob_shard_first_look_seconds` and the log.
    pub fn report(&self, metrics: &Metrics) {
        metrics
            .shard_first_look
            .with_label_values(&[self.shard.to_string().as_str()])
            .observe(self.after.as_secs_f64());
        info!(
            shard = self.shard,
            gpujobs = self.gpujobs,
            seconds = self.after.as_secs_f64(),
            "shard handed over: every GpuJob it had when gained is looked at"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(names: &[&str]) -> Vec<Key> {
        names.iter().map(|n| Key::new("ns", n)).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_warm_shard_is_done_when_its_last_gpujob_is_looked_at() {
        let looks = FirstLooks::default();
        let t0 = Instant::now();
        assert!(!looks.pending(3));
        looks.gained(3, t0);
        assert!(looks.unknown(3) && looks.pending(3));
        assert_eq!(looks.known(3, keys(&["a", "b"]), t0), None);
        assert!(!looks.unknown(3) && looks.pending(3));
        let later = t0 + Duration::from_millis(700);
        assert_eq!(looks.looked(3, &Key::new("ns", "a"), later), None);
        assert_eq!(
            looks.looked(3, &Key::new("ns", "other"), later),
            None,
            "a GpuJob created after the gain is not waited for"
        );
        assert_eq!(
            looks.looked(4, &Key::new("ns", "b"), later),
            None,
            "another shard"
        );
        let done = looks.looked(3, &Key::new("ns", "b"), t0 + Duration::from_secs(2));
        assert_eq!(
            done,
            Some(Done {
                shard: 3,
                gpujobs: 2,
                after: Duration::from_secs(2)
            })
        );
        assert_eq!(
            looks.looked(3, &Key::new("ns", "a"), later),
            None,
            "reported once"
        );
        assert!(!looks.pending(3), "over");
    }

    #[tokio::test(start_paused = true)]
    async fn looks_before_a_cold_shard_is_listed_count_and_an_empty_shard_is_done_when_known() {
        let looks = FirstLooks::default();
        let t0 = Instant::now();
        looks.gained(1, t0);
        looks.gained(2, t0);
        assert_eq!(looks.looked(1, &Key::new("ns", "a"), t0), None);
        let listed = t0 + Duration::from_secs(5);
        assert_eq!(
            looks.known(1, keys(&["a"]), listed),
            Some(Done {
                shard: 1,
                gpujobs: 1,
                after: Duration::from_secs(5)
            })
        );
        assert_eq!(
            looks.known(2, Vec::new(), listed),
            Some(Done {
                shard: 2,
                gpujobs: 0,
                after: Duration::from_secs(5)
            })
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_shard_lost_or_regained_starts_over() {
        let looks = FirstLooks::default();
        let t0 = Instant::now();
        looks.gained(0, t0);
        looks.known(0, keys(&["a", "b"]), t0);
        looks.looked(0, &Key::new("ns", "a"), t0);
        looks.lost(0);
        assert_eq!(looks.looked(0, &Key::new("ns", "b"), t0), None, "lost");
        let t1 = t0 + Duration::from_secs(10);
        looks.gained(0, t1);
        looks.known(0, keys(&["a", "b"]), t1);
        assert_eq!(
            looks.looked(0, &Key::new("ns", "b"), t1),
            None,
            "a needed again"
        );
        let done = looks.looked(0, &Key::new("ns", "a"), t1 + Duration::from_secs(1));
        assert_eq!(done.map(|d| d.after), Some(Duration::from_secs(1)));
    }
}
