//! GpuJobs per namespace of the shards this replica holds, for the kept shard map: the
//! runner counts them from its cache every half second, and the lease loop states each
//! held shard's part on its Lease (`gpujob_core::recut::ANNOTATION_LOAD`), where the
//! keeper of the map reads them.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use gpujob_core::shard::HashRange;
use tokio::sync::Notify;

/// Shared between the runner (which fills it) and the lease loop (which reads it).
/// The default counts nothing: only a kept map ([`Load::counted`]) needs the counts.
#[derive(Debug, Clone, Default)]
pub struct Load {
    inner: Arc<Mutex<Counted>>,
    /// Told when the namespaces counted, or the shards, change (not a count alone): the
    /// lease loop then states them at once, so the keeper's first cut is not a few
    /// periods late (docs/ha-and-sharding.md, "The kept map").
    changed: Arc<Notify>,
    counting: bool,
}

#[derive(Debug, Default)]
struct Counted {
    /// GpuJobs per namespace hash.
    counts: BTreeMap<u64, u64>,
    /// The shards counted, each in the term (epoch) it was held in, from caches that
    /// covered it.
    shards: BTreeMap<u32, u64>,
}

impl Load {
    /// A load the runner counts: the replicas keep the shard map.
    pub fn counted() -> Load {
        Load {
            counting: true,
            ..Load::default()
        }
    }

    /// Whether the runner counts this load (fixed cuts and one shard need none).
    pub fn is_counted(&self) -> bool {
        self.counting
    }

    /// GpuJobs per namespace hash, of the namespaces of `shards` (shard, epoch of the
    /// term it was counted in: caches covered it).
    pub fn set(&self, counts: BTreeMap<u64, u64>, shards: BTreeMap<u32, u64>) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let changed = inner.shards != shards || !inner.counts.keys().eq(counts.keys());
        *inner = Counted { counts, shards };
        if changed {
            self.changed.notify_one();
        }
    }

    /// Resolves once the namespaces or shards counted changed since the last time it
    /// resolved (a change while nobody waits is kept for the next wait).
    pub async fn changed(&self) {
        self.changed.notified().await;
    }

    /// The counts of the namespaces in `range`, if shard `shard` was counted in the
    /// term `epoch`; `None` before (a shard just taken whose caches have not listed it
    /// must not read as empty).
    pub fn within(&self, shard: u32, epoch: u64, range: &HashRange) -> Option<BTreeMap<u64, u64>> {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if inner.shards.get(&shard) != Some(&epoch) {
            return None;
        }
        let end = u64::try_from(range.end).ok();
        Some(
            match end {
                Some(end) => inner.counts.range(range.start..end),
                None => inner.counts.range(range.start..),
            }
            .map(|(h, n)| (*h, *n))
            .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_reads_its_own_namespaces_only_once_counted_in_that_term() {
        let load = Load::default();
        load.set(
            BTreeMap::from([(1, 3), (5, 4), (u64::MAX, 2)]),
            BTreeMap::from([(0, 7), (1, 8)]),
        );
        let r = |start, end| HashRange { start, end };
        assert_eq!(load.within(0, 7, &r(0, 5)), Some(BTreeMap::from([(1, 3)])));
        assert_eq!(
            load.within(1, 8, &r(5, 1 << 64)),
            Some(BTreeMap::from([(5, 4), (u64::MAX, 2)]))
        );
        assert_eq!(load.within(0, 7, &r(2, 5)), Some(BTreeMap::new()));
        assert_eq!(load.within(0, 9, &r(0, 5)), None, "counted in another term");
        assert_eq!(load.within(2, 1, &r(0, 5)), None, "not counted");
    }

    #[tokio::test]
    async fn a_change_of_namespaces_or_shards_is_told_and_a_count_alone_is_not() {
        let told = |load: &Load| {
            let load = load.clone();
            async move {
                tokio::time::timeout(std::time::Duration::from_millis(50), load.changed())
                    .await
                    .is_ok()
            }
        };
        let load = Load::counted();
        load.set(BTreeMap::from([(1, 3)]), BTreeMap::from([(0, 7)]));
        assert!(told(&load).await, "the first namespace");
        load.set(BTreeMap::from([(1, 9)]), BTreeMap::from([(0, 7)]));
        assert!(!told(&load).await, "a count alone");
        load.set(BTreeMap::from([(1, 9), (4, 1)]), BTreeMap::from([(0, 7)]));
        assert!(told(&load).await, "a namespace more");
        load.set(BTreeMap::from([(1, 9), (4, 1)]), BTreeMap::from([(0, 8)]));
        assert!(told(&load).await, "a shard counted in a new term");
        assert!(!told(&load).await, "told once");
    }
}
