//! What the caches hold: every GpuJob and Job (one namespace's, or the cluster's), or
//! only those of some shards, when the API server selects them (the sharded list and
//! watch, KEP-5866). A cache covers a shard once a list of a scope with that shard has
//! completed and its watch still runs; a GpuJob is reconciled only when both caches
//! cover its shard, so its first reconcile in a term sees its Jobs.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use crate::shard::ShardMap;

/// The objects a watch asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Every object the watch's namespace (or the cluster) has.
    All,
    /// The objects of these shards of `map`.
    Shards {
        held: BTreeSet<u32>,
        map: Arc<ShardMap>,
    },
}

impl Scope {
    pub fn contains(&self, namespace: &str) -> bool {
        match self {
            Scope::All => true,
            Scope::Shards { held, map } => held.contains(&map.shard_of(namespace)),
        }
    }

    /// Does the scope hold shard `shard` (of its map)?
    pub fn contains_shard(&self, shard: u32) -> bool {
        match self {
            Scope::All => true,
            Scope::Shards { held, .. } => held.contains(&shard),
        }
    }

    /// The API server's shard selector for this scope; `None` for everything, and for
    /// no shard (nothing to watch).
    pub fn selector(&self) -> Option<String> {
        match self {
            Scope::All => None,
            Scope::Shards { held, map } => map.selector(held.iter().copied()),
        }
    }

    pub fn is_empty(&self) -> bool {
        matches!(self, Scope::Shards { held, .. } if held.is_empty())
    }

    /// The shards of a sharded scope (none for `All`).
    pub fn shards(&self) -> Vec<u32> {
        match self {
            Scope::All => Vec::new(),
            Scope::Shards { held, .. } => held.iter().copied().collect(),
        }
    }

    /// Shard `shard` of `map` alone: what one sharded watch asks for.
    pub fn single(shard: u32, map: Arc<ShardMap>) -> Scope {
        Scope::Shards {
            held: BTreeSet::from([shard]),
            map,
        }
    }

    /// What either scope holds (of one map; a scope of another map is replaced).
    fn join(&self, other: &Scope) -> Scope {
        match (self, other) {
            (Scope::All, _) | (_, Scope::All) => Scope::All,
            (
                Scope::Shards { held: a, map },
                Scope::Shards {
                    held: b,
                    map: other_map,
                },
            ) if map == other_map => Scope::Shards {
                held: a.union(b).copied().collect(),
                map: map.clone(),
            },
            (_, other) => other.clone(),
        }
    }

    /// What two scopes both hold.
    fn meet(&self, other: &Scope) -> Scope {
        match (self, other) {
            (Scope::All, s) | (s, Scope::All) => s.clone(),
            (
                Scope::Shards { held: a, map },
                Scope::Shards {
                    held: b,
                    map: other,
                },
            ) if map == other => Scope::Shards {
                held: a.intersection(b).copied().collect(),
                map: map.clone(),
            },
            (Scope::Shards { map, .. }, _) => Scope::Shards {
                held: BTreeSet::new(),
                map: map.clone(),
            },
        }
    }
}

/// The two caches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cached {
    GpuJobs,
    Jobs,
}

/// What both caches cover; `None` while one has not listed.
fn both(inner: &[Option<Scope>; 2]) -> Option<Scope> {
    Some(inner[0].as_ref()?.meet(inner[1].as_ref()?))
}

/// What each cache covers: `None` before its first list.
#[derive(Debug, Default)]
pub struct Coverage {
    inner: Mutex<[Option<Scope>; 2]>,
}

impl Coverage {
    fn slot(which: Cached) -> usize {
        match which {
            Cached::GpuJobs => 0,
            Cached::Jobs => 1,
        }
    }

    /// The watches are restarted for `next`: until its lists complete, each cache covers
    /// only what it covered and `next` still watches.
    pub fn watching(&self, next: &Scope) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        for slot in inner.iter_mut() {
            if let Some(now) = slot.as_ref() {
                *slot = Some(now.meet(next));
            }
        }
    }

    /// `which` completed a list of `scope` (one watch's part: everything, or a shard;
    /// it adds to what the cache covers). Returns the shards both caches cover now and
    /// did not before (`None`: none): their GpuJobs are due a look. Shards covered
    /// before stay as they were (a relist queues what it changed, `watches.rs`).
    pub fn listed(&self, which: Cached, scope: &Scope) -> Option<Scope> {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let before = both(&inner);
        let slot = &mut inner[Coverage::slot(which)];
        *slot = Some(match slot.as_ref() {
            Some(now) => now.join(scope),
            None => scope.clone(),
        });
        let after = both(&inner)?;
        let Some(before) = before else {
            return Some(after);
        };
        match (&after, &before) {
            (Scope::All, Scope::All) | (Scope::Shards { .. }, Scope::All) => None,
            (Scope::All, Scope::Shards { .. }) => Some(Scope::All),
            (Scope::Shards { held: a, map }, Scope::Shards { held: b, map: was }) => {
                let held: BTreeSet<u32> = if map == was {
                    a.difference(b).copied().collect()
                } else {
                    a.clone()
                };
                (!held.is_empty()).then(|| Scope::Shards {
                    held,
                    map: map.clone(),
                })
            }
        }
    }

    /// Do both caches cover shard `shard`?
    pub fn covers_shard(&self, shard: u32) -> bool {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner
            .iter()
            .all(|s| s.as_ref().is_some_and(|s| s.contains_shard(shard)))
    }

    /// Do both caches cover `namespace`?
    pub fn covers(&self, namespace: &str) -> bool {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner
            .iter()
            .all(|s| s.as_ref().is_some_and(|s| s.contains(namespace)))
    }
}

/// A namespace of shard `want` out of `of` (even ranges), for tests.
#[cfg(test)]
pub(crate) fn ns_of(want: u32, of: u32) -> String {
    (0..)
        .map(|i| format!("ns-{i}"))
        .find(|ns| crate::shard::shard_of(ns, of) == want)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shards(held: &[u32], of: u32) -> Scope {
        Scope::Shards {
            held: held.iter().copied().collect(),
            map: Arc::new(ShardMap::even(of)),
        }
    }

    #[test]
    fn a_shard_is_covered_once_both_caches_listed_it() {
        let c = Coverage::default();
        let (a, b) = (ns_of(0, 4), ns_of(1, 4));
        assert!(!c.covers(&a), "nothing before a list");
        let first = shards(&[0], 4);
        assert_eq!(
            c.listed(Cached::GpuJobs, &first),
            None,
            "Jobs not listed yet"
        );
        assert!(!c.covers(&a));
        assert_eq!(
            c.listed(Cached::Jobs, &first),
            Some(first.clone()),
            "both now: look at its GpuJobs"
        );
        assert!(c.covers(&a));
        assert!(!c.covers(&b));

        // Shard 1 gained: shard 0 stays covered while the new lists run, shard 1 is not
        // covered until both complete.
        let next = shards(&[0, 1], 4);
        c.watching(&next);
        assert!(c.covers(&a));
        assert!(!c.covers(&b));
        assert_eq!(c.listed(Cached::Jobs, &next), None);
        assert!(!c.covers(&b));
        assert_eq!(
            c.listed(Cached::GpuJobs, &next),
            Some(shards(&[1], 4)),
            "only shard 1 is new"
        );
        assert!(c.covers(&b));
        assert_eq!(
            c.listed(Cached::GpuJobs, &next),
            None,
            "a relist of the same scope"
        );

        // Shard 0 lost: no longer covered at once.
        c.watching(&shards(&[1], 4));
        assert!(!c.covers(&a));
        assert!(c.covers(&b));
    }

    #[test]
    fn everything_covers_every_namespace_and_a_new_count_covers_nothing_until_listed() {
        let c = Coverage::default();
        c.listed(Cached::GpuJobs, &Scope::All);
        assert!(!c.covers("a"));
        assert_eq!(c.listed(Cached::Jobs, &Scope::All), Some(Scope::All));
        assert!(c.covers("a"));
        c.watching(&shards(&[0], 2));
        assert!(c.covers(&ns_of(0, 2)));
        assert!(!c.covers(&ns_of(1, 2)));
        c.watching(&shards(&[0], 3));
        assert!(
            !c.covers(&ns_of(0, 3)),
            "another count: nothing carries over"
        );
    }

    #[test]
    fn selectors_of_scopes() {
        assert_eq!(Scope::All.selector(), None);
        assert_eq!(shards(&[], 4).selector(), None);
        assert!(shards(&[], 4).is_empty());
        assert_eq!(
            shards(&[2], 4).selector().as_deref(),
            Some(
                "shardRange(object.metadata.namespace, '0x8000000000000000', '0xc000000000000000')"
            )
        );
    }
}
