//! A first-in, first-out list of keys from which a key can be taken out of turn (moved
//! to a lane ahead): its copy stays in the list, passed over when reached, so taking it
//! costs no search. The normal lane is one; so is each tenant's work not begun in the
//! prompt lane.

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::Hash;

#[derive(Debug)]
pub(super) struct Fifo<K> {
    keys: VecDeque<K>,
    /// The keys whose place is here (a key taken out leaves its copy in `keys`).
    live: HashSet<K>,
    /// Copies in `keys` of keys taken out, per key: older than any copy queued since,
    /// so the first ones the list reaches are these.
    stale: HashMap<K, u32>,
}

impl<K> Default for Fifo<K> {
    fn default() -> Fifo<K> {
        Fifo {
            keys: VecDeque::new(),
            live: HashSet::new(),
            stale: HashMap::new(),
        }
    }
}

impl<K: Clone + Eq + Hash> Fifo<K> {
    pub(super) fn push(&mut self, key: K) {
        self.live.insert(key.clone());
        self.keys.push_back(key);
    }

    /// Takes `key` out of turn. False when its place is not here.
    pub(super) fn take(&mut self, key: &K) -> bool {
        if !self.live.remove(key) {
            return false;
        }
        *self.stale.entry(key.clone()).or_insert(0) += 1;
        true
    }

    pub(super) fn pop(&mut self) -> Option<K> {
        while let Some(k) = self.keys.pop_front() {
            if let Some(n) = self.stale.get_mut(&k) {
                *n -= 1;
                if *n == 0 {
                    self.stale.remove(&k);
                }
                continue;
            }
            self.live.remove(&k);
            return Some(k);
        }
        None
    }

    /// Keys whose place is here.
    pub(super) fn len(&self) -> usize {
        self.live.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    pub(super) fn retain(&mut self, keep: impl Fn(&K) -> bool) {
        self.keys.retain(&keep);
        self.live.retain(&keep);
        self.stale.retain(|k, _| keep(k));
    }

    pub(super) fn clear(&mut self) {
        self.keys.clear();
        self.live.clear();
        self.stale.clear();
    }
}
