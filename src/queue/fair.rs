//! The prompt lane: it takes turns between tenants (for GpuJobs, their namespace), first
//! in, first out within each, work under way before work not begun; a key of the work not
//! begun can move to the work under way ([`Fifo::take`]).

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;

use super::fifo::Fifo;

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
    /// Keys waiting.
    pub(super) len: usize,
}

impl<K: Clone + Eq + Hash> FairLane<K> {
    pub(super) fn new() -> FairLane<K> {
        FairLane {
            by_tenant: HashMap::new(),
            turns: VecDeque::new(),
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
            turn.new.push(key);
        }
        self.len += 1;
    }

    /// `key`, waiting among the work not begun, moves to the work under way. False when
    /// it is not waiting there.
    pub(super) fn move_under_way(&mut self, key: &K, tenant: fn(&K) -> &str) -> bool {
        let Some(turn) = self.by_tenant.get_mut(tenant(key)) else {
            return false;
        };
        if !turn.new.take(key) {
            return false;
        }
        turn.under_way.push_back(key.clone());
        true
    }

    pub(super) fn pop(&mut self) -> Option<K> {
        let tenant = self.turns.pop_front()?;
        let turn = self.by_tenant.get_mut(&tenant)?;
        let key = turn.next();
        if turn.is_empty() {
            self.by_tenant.remove(&tenant);
        } else {
            self.turns.push_back(tenant);
        }
        self.len -= usize::from(key.is_some());
        key
    }

    pub(super) fn retain(&mut self, keep: impl Fn(&K) -> bool) {
        self.by_tenant.retain(|_, turn| {
            turn.under_way.retain(&keep);
            turn.new.retain(&keep);
            !turn.is_empty()
        });
        let by_tenant = &self.by_tenant;
        self.turns.retain(|t| by_tenant.contains_key(t));
        self.len = by_tenant
            .values()
            .map(|t| t.under_way.len() + t.new.len())
            .sum();
    }

    pub(super) fn clear(&mut self) {
        self.by_tenant.clear();
        self.turns.clear();
        self.len = 0;
    }
}

/// A tenant's keys in the prompt lane.
#[derive(Debug)]
struct Turn<K> {
    under_way: VecDeque<K>,
    new: Fifo<K>,
    /// Keys of work under way handed out since the last of work not begun.
    under_way_run: u32,
}

impl<K> Default for Turn<K> {
    fn default() -> Turn<K> {
        Turn {
            under_way: VecDeque::new(),
            new: Fifo::default(),
            under_way_run: 0,
        }
    }
}

impl<K: Clone + Eq + Hash> Turn<K> {
    fn is_empty(&self) -> bool {
        self.under_way.is_empty() && self.new.is_empty()
    }

    /// This tenant's next key: work under way first, but one of work not begun after
    /// every [`UNDER_WAY_PER_NEW`].
    fn next(&mut self) -> Option<K> {
        if self.under_way_run < UNDER_WAY_PER_NEW || self.new.is_empty() {
            if let Some(k) = self.under_way.pop_front() {
                self.under_way_run = self.under_way_run.saturating_add(1);
                return Some(k);
            }
        }
        let k = self.new.pop()?;
        self.under_way_run = 0;
        Some(k)
    }
}
