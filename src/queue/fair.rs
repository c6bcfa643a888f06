//! The prompt lane: it takes turns between tenants (for GpuJobs, their namespace), first
//! in, first out within each, work under way before work not begun; a key moved from the
//! work not begun to the work under way leaves a stale copy, passed over when reached.

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::Hash;

/// In a tenant's turn of the prompt lane, at most this many keys of work under way go
/// before one of work not begun, when both wait: under way first, without starving a
/// namespace's new GpuJobs behind a steady stream of pods and finished attempts.
pub(super) const UNDER_WAY_PER_NEW: u32 = 4;

/// A lane that takes turns between tenants, first in, first out within each, work under
/// way before work not begun ([`UNDER_WAY_PER_NEW`]).
#[derive(Debug)]
pub(super) struct FairLane<K> {
    by_tenant: HashMap<String, Turn<K>>,
    /// Tenants with keys waiting, in the order of their next turn.
    turns: VecDeque<String>,
    /// The keys whose place is among the work not begun.
    new: HashSet<K>,
    /// Copies among the work not begun of keys moved to the work under way, per key:
    /// older than any copy queued since, so the first ones reached are these.
    stale: HashMap<K, u32>,
    /// Keys waiting (stale copies not counted).
    pub(super) len: usize,
}

impl<K: Clone + Eq + Hash> FairLane<K> {
    pub(super) fn new() -> FairLane<K> {
        FairLane {
            by_tenant: HashMap::new(),
            turns: VecDeque::new(),
            new: HashSet::new(),
            stale: HashMap::new(),
            len: 0,
        }
    }

    pub(super) fn push(&mut self, key: K, tenant: fn(&K) -> &str, under_way: bool) {
        let t = tenant(&key);
        let turn = match self.by_tenant.get_mut(t) {
            Some(turn) => turn,
            None => {
                let t = t.to_owned();
                self.turns.push_back(t.clone());
                self.by_tenant.entry(t).or_default()
            }
        };
        if under_way {
            turn.under_way.push_back(key);
        } else {
            self.new.insert(key.clone());
            turn.new.push_back(key);
        }
        self.len += 1;
    }

    /// `key`, waiting among the work not begun, moves to the work under way. False when
    /// it is not waiting there.
    pub(super) fn move_under_way(&mut self, key: &K, tenant: fn(&K) -> &str) -> bool {
        if !self.new.remove(key) {
            return false;
        }
        *self.stale.entry(key.clone()).or_insert(0) += 1;
        if let Some(turn) = self.by_tenant.get_mut(tenant(key)) {
            turn.under_way.push_back(key.clone());
        }
        true
    }

    pub(super) fn pop(&mut self) -> Option<K> {
        while let Some(tenant) = self.turns.pop_front() {
            let Some(turn) = self.by_tenant.get_mut(&tenant) else {
                continue;
            };
            let key = turn.next(&mut self.new, &mut self.stale);
            if turn.under_way.is_empty() && turn.new.is_empty() {
                self.by_tenant.remove(&tenant);
            } else {
                self.turns.push_back(tenant);
            }
            if key.is_some() {
                self.len -= 1;
                return key;
            }
        }
        None
    }

    pub(super) fn retain(&mut self, keep: impl Fn(&K) -> bool) {
        self.by_tenant.retain(|_, turn| {
            turn.under_way.retain(&keep);
            turn.new.retain(&keep);
            !(turn.under_way.is_empty() && turn.new.is_empty())
        });
        let by_tenant = &self.by_tenant;
        self.turns.retain(|t| by_tenant.contains_key(t));
        self.new.retain(&keep);
        self.stale.retain(|k, _| keep(k));
        self.len = self.new.len() + by_tenant.values().map(|t| t.under_way.len()).sum::<usize>();
    }

    pub(super) fn clear(&mut self) {
        self.by_tenant.clear();
        self.turns.clear();
        self.new.clear();
        self.stale.clear();
        self.len = 0;
    }
}

/// A tenant's keys in the prompt lane.
#[derive(Debug)]
struct Turn<K> {
    under_way: VecDeque<K>,
    new: VecDeque<K>,
    /// Keys of work under way handed out since the last of work not begun.
    under_way_run: u32,
}

impl<K> Default for Turn<K> {
    fn default() -> Turn<K> {
        Turn {
            under_way: VecDeque::new(),
            new: VecDeque::new(),
            under_way_run: 0,
        }
    }
}

impl<K: Eq + Hash> Turn<K> {
    /// This tenant's next key: work under way first, but one of work not begun after
    /// every [`UNDER_WAY_PER_NEW`]; `None` when only stale copies were left.
    fn next(&mut self, new: &mut HashSet<K>, stale: &mut HashMap<K, u32>) -> Option<K> {
        if self.under_way_run < UNDER_WAY_PER_NEW || !has_new(&mut self.new, stale) {
            if let Some(k) = self.under_way.pop_front() {
                self.under_way_run = self.under_way_run.saturating_add(1);
                return Some(k);
            }
        }
        has_new(&mut self.new, stale);
        let k = self.new.pop_front()?;
        new.remove(&k);
        self.under_way_run = 0;
        Some(k)
    }
}

/// Whether `keys` has a key that is not a stale copy: those in front are dropped.
fn has_new<K: Eq + Hash>(keys: &mut VecDeque<K>, stale: &mut HashMap<K, u32>) -> bool {
    while let Some(k) = keys.front() {
        match stale.get_mut(k) {
            Some(n) => {
                *n -= 1;
                if *n == 0 {
                    stale.remove(k);
                }
                keys.pop_front();
            }
            None => return true,
        }
    }
    false
}
