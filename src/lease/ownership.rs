//! What this replica may act on, and until when: the shards it holds, each with its own
//! tenure. Published on a watch channel by the lease loop; read by the runner (which
//! keys to take, which reconciles to cancel), the executor and the API client's fence.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::watch;
use tokio::time::Instant;

use crate::shard::ShardMap;

/// One held shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenure {
    /// No write for this shard may start at or after this instant (the monotonic time
    /// the last successful renewal was sent + the renew deadline). `None`: unfenced.
    pub deadline: Option<Instant>,
    /// Changes on every gain, so a loss followed by a regain is never "unchanged"
    /// (unique within this process).
    pub epoch: u64,
    /// The term, for logs: `<lease name>/<leaseTransitions>`, which grows with every
    /// gain of one Lease object. Not a fencing token: recreating the Lease (an uninstall
    /// deletes its namespace) starts it again from 0, so quota calls carry a sequence of
    /// the GpuJob's own (`quota::fencing_token`). `None` without election.
    pub token: Option<String>,
}

impl Tenure {
    /// A new term: a fresh epoch.
    pub fn gained(deadline: Option<Instant>, token: Option<String>) -> Tenure {
        static EPOCHS: AtomicU64 = AtomicU64::new(1);
        Tenure {
            deadline,
            epoch: EPOCHS.fetch_add(1, Ordering::Relaxed),
            token,
        }
    }

    /// May a write start at `now`?
    pub fn valid_at(&self, now: Instant) -> bool {
        self.deadline.is_none_or(|d| now < d)
    }
}

/// The shards held, out of those of `map`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ownership {
    pub held: BTreeMap<u32, Tenure>,
    /// How namespaces map to shards (a GpuJob's shard is `map.shard_of(namespace)`).
    pub map: Arc<ShardMap>,
    /// Shards held elsewhere that this replica would take if their holder were gone
    /// (`balance::successor_of`), and for a while those it gave up, lost to their renew
    /// deadline or left when the heartbeat failed (`coordinator/warm.rs`): watched with sharded watches, so a takeover finds them
    /// cached. Nothing is decided or written for them.
    pub warm: BTreeSet<u32>,
    /// No write starts at or after this instant whatever shard it is for: the renew
    /// deadline of the member heartbeat's last renewal that went through (others judge
    /// this replica gone only a lease duration after it). `None`: there is no heartbeat
    /// (one shard, or no election).
    pub heartbeat: Option<Instant>,
}

impl Ownership {
    /// Nothing held, of one shard.
    pub fn none() -> Ownership {
        Ownership::nothing_of(1)
    }

    /// Nothing held, of `shards` equal ranges.
    pub fn nothing_of(shards: u32) -> Ownership {
        Ownership::nothing_in(Arc::new(ShardMap::even(shards)))
    }

    /// Nothing held, of the shards of `map`.
    pub fn nothing_in(map: Arc<ShardMap>) -> Ownership {
        Ownership {
            held: BTreeMap::new(),
            map,
            warm: BTreeSet::new(),
            heartbeat: None,
        }
    }

    /// Everything, forever: a single replica running without election.
    pub fn unfenced() -> Ownership {
        Ownership {
            held: BTreeMap::from([(0, Tenure::gained(None, None))]),
            map: Arc::new(ShardMap::even(1)),
            warm: BTreeSet::new(),
            heartbeat: None,
        }
    }

    /// How many shards there are.
    pub fn shards(&self) -> u32 {
        self.map.shards()
    }

    pub fn holds_any(&self) -> bool {
        !self.held.is_empty()
    }

    /// The shard of GpuJobs (and their Jobs and Events) in `namespace`.
    pub fn shard_of(&self, namespace: &str) -> u32 {
        self.map.shard_of(namespace)
    }

    pub fn tenure(&self, shard: u32) -> Option<&Tenure> {
        self.held.get(&shard)
    }

    /// Is `shard` still held in the term `epoch` (not lost, nor lost and gained again)?
    pub fn in_term(&self, shard: u32, epoch: u64) -> bool {
        self.tenure(shard).is_some_and(|t| t.epoch == epoch)
    }

    /// The tenure covering objects in `namespace`, if that shard is held.
    pub fn tenure_for(&self, namespace: &str) -> Option<&Tenure> {
        self.tenure(self.shard_of(namespace))
    }

    pub fn holds_namespace(&self, namespace: &str) -> bool {
        self.tenure_for(namespace).is_some()
    }

    /// Whether the member heartbeat (if any) still allows a write at `now`.
    pub fn heartbeat_valid_at(&self, now: Instant) -> bool {
        self.heartbeat.is_none_or(|d| now < d)
    }

    /// `shard`'s tenure if a write under it may start at `now`: held, before its
    /// deadline and before the heartbeat's. The one test every write passes.
    pub fn valid_tenure(&self, shard: u32, now: Instant) -> Option<&Tenure> {
        self.tenure(shard)
            .filter(|t| t.valid_at(now) && self.heartbeat_valid_at(now))
    }

    /// May a write to an object in `namespace` start at `now`? (`None`: not namespaced;
    /// allowed while any shard is validly held.)
    pub fn may_write(&self, namespace: Option<&str>, now: Instant) -> bool {
        match namespace {
            Some(ns) => self.valid_tenure(self.shard_of(ns), now).is_some(),
            None => self
                .held
                .keys()
                .any(|s| self.valid_tenure(*s, now).is_some()),
        }
    }

    /// Epoch of each held shard.
    pub fn epochs(&self) -> BTreeMap<u32, u64> {
        self.held.iter().map(|(s, t)| (*s, t.epoch)).collect()
    }
}

/// Reconciles running, per shard: a shard given up is released only once none of its
/// reconciles runs any more (they are cancelled when the shard leaves the ownership).
#[derive(Debug, Clone)]
pub struct InFlight {
    counts: Arc<watch::Sender<BTreeMap<u32, usize>>>,
}

impl Default for InFlight {
    fn default() -> InFlight {
        InFlight {
            counts: Arc::new(watch::channel(BTreeMap::new()).0),
        }
    }
}

impl InFlight {
    /// Counts one reconcile of `shard` until the guard is dropped.
    pub fn enter(&self, shard: u32) -> InFlightGuard {
        self.counts
            .send_modify(|c| *c.entry(shard).or_insert(0) += 1);
        InFlightGuard {
            counts: self.counts.clone(),
            shard,
        }
    }

    /// Resolves once no reconcile of `shard` runs.
    pub async fn idle(&self, shard: u32) {
        let mut rx = self.counts.subscribe();
        let _ = rx
            .wait_for(|c| c.get(&shard).copied().unwrap_or(0) == 0)
            .await;
    }
}

#[derive(Debug)]
pub struct InFlightGuard {
    counts: Arc<watch::Sender<BTreeMap<u32, usize>>>,
    shard: u32,
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.counts.send_modify(|c| {
            if let Some(n) = c.get_mut(&self.shard) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    c.remove(&self.shard);
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shard::shard_of;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn a_write_is_allowed_only_before_the_deadline_of_its_own_shard() {
        let now = Instant::now();
        let mut o = Ownership::nothing_of(8);
        let a = "default";
        let b = (0..100_000)
            .map(|i| format!("ns-{i}"))
            .find(|ns| shard_of(ns, 8) == shard_of(a, 8))
            .unwrap();
        let c = (0..100_000)
            .map(|i| format!("ns-{i}"))
            .find(|ns| shard_of(ns, 8) != shard_of(a, 8))
            .unwrap();
        o.held.insert(
            o.shard_of(a),
            Tenure::gained(Some(now + Duration::from_secs(2)), None),
        );
        assert!(o.may_write(Some(a), now));
        assert!(o.may_write(Some(&b), now), "same shard");
        assert!(!o.may_write(Some(&c), now), "a shard not held");
        assert!(o.may_write(None, now));
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(!o.may_write(Some(a), Instant::now()), "past its deadline");
        assert!(!o.may_write(None, Instant::now()));
    }

    #[tokio::test(start_paused = true)]
    async fn no_write_starts_past_the_member_heartbeats_deadline_whatever_the_shards_say() {
        let now = Instant::now();
        let mut o = Ownership::nothing_of(1);
        o.held
            .insert(0, Tenure::gained(Some(now + Duration::from_secs(10)), None));
        assert!(o.may_write(Some("ns"), now), "no heartbeat (one shard)");
        o.heartbeat = Some(now + Duration::from_secs(2));
        assert!(o.may_write(Some("ns"), now));
        assert!(o.valid_tenure(0, now).is_some());
        tokio::time::advance(Duration::from_secs(2)).await;
        let later = Instant::now();
        assert!(
            !o.may_write(Some("ns"), later),
            "the heartbeat's deadline passed"
        );
        assert!(!o.may_write(None, later));
        assert!(o.valid_tenure(0, later).is_none());
        assert!(
            o.tenure(0).is_some_and(|t| t.valid_at(later)),
            "the shard's has not"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_shard_is_idle_once_its_last_reconcile_ends() {
        let f = InFlight::default();
        let a = f.enter(3);
        let b = f.enter(3);
        let _other = f.enter(4);
        let idle = f.idle(3);
        tokio::pin!(idle);
        drop(a);
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(10), &mut idle)
                .await
                .is_err(),
            "one still runs"
        );
        drop(b);
        idle.await;
        f.idle(5).await;
    }

    #[test]
    fn every_gain_is_a_new_epoch() {
        let a = Tenure::gained(None, None);
        let b = Tenure::gained(None, None);
        assert_ne!(a.epoch, b.epoch);
        assert!(Ownership::unfenced().may_write(Some("any"), Instant::now()));
        assert!(!Ownership::none().may_write(Some("any"), Instant::now()));
    }
}
