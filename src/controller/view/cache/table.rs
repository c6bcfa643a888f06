//! What the Job index and the pod index share: objects of GpuJobs, one packed record
//! each, found by their GpuJob's uid and by their own namespace and name, filled by the
//! watch of each part (everything, or one shard) and replaced part by part when that
//! watch lists anew. Each index says what it keeps of an object ([`Record`]) and what a
//! change means to it (the `changed` callback of [`Owned::apply`]).

use std::hash::{BuildHasher, RandomState};
use std::sync::RwLock;

use hashbrown::HashTable;
use kube::Resource;
use kube::runtime::watcher::Event;
use tokio::sync::watch;

use super::Relists;
use crate::controller::view::scope::Scope;

/// The names a record is found by.
#[derive(Debug, Clone, Copy)]
pub(super) struct Names<'a> {
    /// The uid of the GpuJob it belongs to.
    pub owner_uid: &'a str,
    pub namespace: &'a str,
    pub name: &'a str,
}

/// A record kept in an [`OwnedTable`].
pub(super) trait Record: PartialEq {
    /// Its names; `None` only for bytes that are not a record (never stored).
    fn names(&self) -> Option<Names<'_>>;
}

/// The records, one each in `slots`, found by their GpuJob's uid (`by_owner`) and by their
/// own namespace and name (`by_name`, to move or drop one whose owner changed or that
/// went). The two tables hold slot numbers, 4 bytes each, not copies of the keys.
#[derive(Debug)]
pub(super) struct OwnedTable<R> {
    slots: Vec<Option<R>>,
    /// Slots emptied by a removal, reused first.
    free: Vec<u32>,
    by_owner: HashTable<u32>,
    by_name: HashTable<u32>,
    hasher: RandomState,
}

impl<R> Default for OwnedTable<R> {
    fn default() -> OwnedTable<R> {
        OwnedTable {
            slots: Vec::new(),
            free: Vec::new(),
            by_owner: HashTable::new(),
            by_name: HashTable::new(),
            hasher: RandomState::new(),
        }
    }
}

/// The names of the record in `slot`.
fn names_at<R: Record>(slots: &[Option<R>], slot: u32) -> Option<Names<'_>> {
    slots.get(slot as usize)?.as_ref()?.names()
}

fn owner_hash(hasher: &RandomState, owner_uid: &str) -> u64 {
    hasher.hash_one(owner_uid)
}

fn name_hash(hasher: &RandomState, namespace: &str, name: &str) -> u64 {
    hasher.hash_one((namespace, name))
}

/// The hash `by_owner` files `slot` under.
fn owner_hash_at<R: Record>(hasher: &RandomState, slots: &[Option<R>], slot: u32) -> u64 {
    names_at(slots, slot).map_or(0, |n| owner_hash(hasher, n.owner_uid))
}

/// The hash `by_name` files `slot` under.
fn name_hash_at<R: Record>(hasher: &RandomState, slots: &[Option<R>], slot: u32) -> u64 {
    names_at(slots, slot).map_or(0, |n| name_hash(hasher, n.namespace, n.name))
}

impl<R: Record> OwnedTable<R> {
    /// Files `record`, replacing one of the same namespace and name.
    fn insert(&mut self, record: R) {
        let Some(names) = record.names() else {
            return;
        };
        let by_owner_hash = owner_hash(&self.hasher, names.owner_uid);
        let by_name_hash = name_hash(&self.hasher, names.namespace, names.name);
        self.remove(names.namespace, names.name);
        let slot = match self.free.pop() {
            Some(slot) => {
                self.slots[slot as usize] = Some(record);
                slot
            }
            None => {
                // Four billion objects in one replica's memory is not a case to handle.
                let slot = u32::try_from(self.slots.len()).unwrap_or(u32::MAX);
                self.slots.push(Some(record));
                slot
            }
        };
        let OwnedTable {
            slots,
            by_owner,
            by_name,
            hasher,
            ..
        } = self;
        by_owner.insert_unique(by_owner_hash, slot, |s| owner_hash_at(hasher, slots, *s));
        by_name.insert_unique(by_name_hash, slot, |s| name_hash_at(hasher, slots, *s));
    }

    /// Drops the record of `namespace/name`; returns it if it was there.
    fn remove(&mut self, namespace: &str, name: &str) -> Option<R> {
        let slots = &self.slots;
        let found = self
            .by_name
            .find_entry(name_hash(&self.hasher, namespace, name), |s| {
                names_at(slots, *s).is_some_and(|n| n.namespace == namespace && n.name == name)
            });
        let slot = found.ok()?.remove().0;
        let record = self.slots.get_mut(slot as usize)?.take()?;
        if let Some(names) = record.names()
            && let Ok(entry) = self
                .by_owner
                .find_entry(owner_hash(&self.hasher, names.owner_uid), |s| *s == slot)
        {
            entry.remove();
        }
        self.free.push(slot);
        Some(record)
    }

    /// The record of `namespace/name`.
    fn get(&self, namespace: &str, name: &str) -> Option<&R> {
        let slots = &self.slots;
        let slot = self
            .by_name
            .find(name_hash(&self.hasher, namespace, name), |s| {
                names_at(slots, *s).is_some_and(|n| n.namespace == namespace && n.name == name)
            })?;
        slots.get(*slot as usize)?.as_ref()
    }

    /// The records of the GpuJob with `uid`.
    fn of_owner(&self, uid: &str) -> impl Iterator<Item = &R> {
        self.by_owner
            .iter_hash(owner_hash(&self.hasher, uid))
            .filter(move |s| names_at(&self.slots, **s).is_some_and(|n| n.owner_uid == uid))
            .filter_map(|s| self.slots.get(*s as usize)?.as_ref())
    }

    /// Every record, with its names.
    fn records(&self) -> impl Iterator<Item = (Names<'_>, &R)> {
        self.slots
            .iter()
            .flatten()
            .filter_map(|r| Some((r.names()?, r)))
    }

    /// How many records are kept (every freed slot is on the free list).
    fn len(&self) -> usize {
        self.slots.len().saturating_sub(self.free.len())
    }

    /// Drops every record of the namespaces `part` holds.
    fn remove_part(&mut self, part: &Scope) {
        let names: Vec<(String, String)> = self
            .records()
            .filter(|(n, _)| part.contains(n.namespace))
            .map(|(n, _)| (n.namespace.to_owned(), n.name.to_owned()))
            .collect();
        for (namespace, name) in names {
            self.remove(&namespace, &name);
        }
    }

    /// Lets go of the room a relist's growth left over.
    fn shrink(&mut self) {
        let OwnedTable {
            slots,
            free,
            by_owner,
            by_name,
            hasher,
        } = self;
        // Slot numbers must stay; only the unused tail goes.
        if free.is_empty() {
            slots.shrink_to_fit();
        }
        by_owner.shrink_to_fit(|s| owner_hash_at(hasher, slots, *s));
        by_name.shrink_to_fit(|s| name_hash_at(hasher, slots, *s));
    }
}

/// For each object of `part` in one table and not the other, or in both as different
/// records: `changed(old, new)`.
fn differences<R: Record>(
    old: &OwnedTable<R>,
    new: &OwnedTable<R>,
    part: &Scope,
    changed: &mut impl FnMut(Option<&R>, Option<&R>),
) {
    for (names, record) in old.records() {
        if !part.contains(names.namespace) {
            continue;
        }
        let there = new.get(names.namespace, names.name);
        if there != Some(record) {
            changed(Some(record), there);
        }
    }
    for (names, record) in new.records() {
        if part.contains(names.namespace) && old.get(names.namespace, names.name).is_none() {
            changed(None, Some(record));
        }
    }
}

#[derive(Debug)]
struct Parts<R> {
    table: OwnedTable<R>,
    /// The relists in progress, one per watch (of everything, or of one shard).
    relists: Relists<OwnedTable<R>>,
}

impl<R> Default for Parts<R> {
    fn default() -> Parts<R> {
        Parts {
            table: OwnedTable::default(),
            relists: Relists::default(),
        }
    }
}

/// An [`OwnedTable`] fed by the watches of its parts, shared between them and the
/// reconciles that read it.
#[derive(Debug)]
pub(super) struct Owned<R> {
    inner: RwLock<Parts<R>>,
    ready: watch::Sender<bool>,
}

impl<R> Default for Owned<R> {
    fn default() -> Owned<R> {
        Owned {
            inner: RwLock::default(),
            ready: watch::channel(false).0,
        }
    }
}

impl<R: Record> Owned<R> {
    /// Applies one event of the watch of `part` (everything, or one shard); `record` is
    /// what is kept of an object (`None`: nothing). `changed(old, new)` hears what was
    /// kept of an object and what is kept now: on every change or deletion (`new`
    /// `None`), and when a relist completes, for each object of `part` it changed (one
    /// that came, went or differs). A relist (the watch started again, or could not
    /// resume, e.g. kube-apiserver restarted) is applied at once when complete, replacing
    /// everything of `part`. `changed` runs under the write lock: it only takes note.
    pub(super) fn apply<K: Resource>(
        &self,
        event: &Event<K>,
        part: &Scope,
        record: impl Fn(&K) -> Option<R>,
        mut changed: impl FnMut(Option<&R>, Option<&R>),
    ) {
        let mut inner = self.inner.write().unwrap_or_else(|p| p.into_inner());
        match event {
            Event::Init => inner.relists.begin(part),
            Event::InitApply(object) => {
                if let Some((relist, kept)) = inner.relists.get_mut(part).zip(record(object)) {
                    relist.insert(kept);
                }
            }
            Event::InitDone => {
                if let Some(mut table) = inner.relists.finish(part) {
                    differences(&inner.table, &table, part, &mut changed);
                    if *part == Scope::All {
                        table.shrink();
                        inner.table = table;
                    } else {
                        inner.table.remove_part(part);
                        for kept in table.slots.into_iter().flatten() {
                            inner.table.insert(kept);
                        }
                    }
                }
                drop(inner);
                self.ready.send_replace(true);
            }
            Event::Apply(object) | Event::Delete(object) => {
                let meta = object.meta();
                let namespace = meta.namespace.as_deref().unwrap_or_default();
                let name = meta.name.as_deref().unwrap_or_default();
                let old = inner.table.remove(namespace, name);
                let new = match event {
                    Event::Apply(_) => record(object),
                    _ => None,
                };
                changed(old.as_ref(), new.as_ref());
                if let Some(new) = new {
                    inner.table.insert(new);
                }
            }
        }
    }

    /// The watch of `part` stopped: what it filled goes (and its relist, if one was
    /// under way).
    pub(super) fn drop_part(&self, part: &Scope) {
        let mut inner = self.inner.write().unwrap_or_else(|p| p.into_inner());
        inner.relists.abandon(part);
        inner.table.remove_part(part);
        inner.table.shrink();
    }

    /// What `read` makes of each record of the GpuJob with `uid`.
    pub(super) fn of_owner<T>(&self, uid: &str, read: impl FnMut(&R) -> Option<T>) -> Vec<T> {
        let inner = self.inner.read().unwrap_or_else(|p| p.into_inner());
        inner.table.of_owner(uid).filter_map(read).collect()
    }

    /// What `read` makes of the record of `namespace/name`.
    pub(super) fn find<T>(
        &self,
        namespace: &str,
        name: &str,
        read: impl FnOnce(&R) -> Option<T>,
    ) -> Option<T> {
        let inner = self.inner.read().unwrap_or_else(|p| p.into_inner());
        inner.table.get(namespace, name).and_then(read)
    }

    /// How many records are kept.
    pub(super) fn len(&self) -> usize {
        let inner = self.inner.read().unwrap_or_else(|p| p.into_inner());
        inner.table.len()
    }

    /// Resolves once a first list has been loaded.
    pub(super) async fn wait_ready(&self) {
        let mut rx = self.ready.subscribe();
        let _ = rx.wait_for(|ready| *ready).await;
    }
}
