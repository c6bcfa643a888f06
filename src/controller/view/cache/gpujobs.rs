//! The GpuJob cache: every GpuJob the watch delivered, as it was last delivered (without
//! managedFields and kubectl's last-applied copy: see the watch), each one allocation
//! ([`record`]): namespace and name, what the domain gauges need of it ([`Facts`], so a
//! scrape decodes nothing), then its JSON compressed by LZ4 against a
//! dictionary of typical GpuJobs ([`dictionary`]), decoded when read. A decoded `GpuJob`
//! is large inline before its strings, maps and conditions, most of them small
//! allocations of their own; its JSON is smaller, and compresses well: field names,
//! timestamps' shape and the operator's own messages are in the dictionary. Reads are
//! per reconcile (one GpuJob); a decompress costs far less than the JSON decode after it. The
//! figures: `benches/examples/footprint.rs` and loadtest/REPORT.md.

use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, LazyLock, RwLock};

use hashbrown::HashTable;
use kube::runtime::watcher::Event;
use tokio::sync::watch;
use tracing::error;

use super::{Relists, record};
use crate::api::GpuJob;
use crate::controller::Key;
use crate::controller::domain::Facts;
use crate::controller::view::scope::Scope;

#[derive(Debug)]
pub struct GpuJobCache {
    inner: RwLock<Inner>,
    ready: watch::Sender<bool>,
}

#[derive(Debug, Default)]
struct Inner {
    table: Table,
    /// The relists in progress, one per watch (of everything, or of one shard).
    relists: Relists<Table>,
}

/// The GpuJobs, each one allocation ([`record`]): namespace and name, then the tail: the
/// gauges' [`Facts`] and the compressed JSON.
#[derive(Debug, Default)]
struct Table {
    records: HashTable<Box<[u8]>>,
    hasher: RandomState,
}

/// A record's namespace, name and tail (facts, then the compressed JSON).
fn fields(record: &[u8]) -> Option<(&str, &str, &[u8])> {
    let ([namespace, name], tail) = record::unpack(record)?;
    Some((namespace, name, tail))
}

fn key_hash(hasher: &RandomState, namespace: &str, name: &str) -> u64 {
    hasher.hash_one((namespace, name))
}

fn record_hash(hasher: &RandomState, record: &[u8]) -> u64 {
    fields(record).map_or(0, |(ns, name, _)| key_hash(hasher, ns, name))
}

fn is_key(record: &[u8], key: &Key) -> bool {
    fields(record).is_some_and(|(ns, name, _)| ns == key.namespace && name == key.name)
}

impl Table {
    /// Files a record under its own namespace and name.
    fn insert_record(&mut self, record: Box<[u8]>) {
        let Some((ns, name, _)) = fields(&record) else {
            return;
        };
        let key = Key::new(ns, name);
        self.insert(&key, record);
    }

    /// Drops every record of the namespaces `part` holds.
    fn remove_part(&mut self, part: &Scope) {
        self.records
            .retain(|r| !fields(r).is_some_and(|(ns, _, _)| part.contains(ns)));
    }

    fn insert(&mut self, key: &Key, record: Box<[u8]>) {
        let Table { records, hasher } = self;
        let hash = key_hash(hasher, &key.namespace, &key.name);
        match records.entry(hash, |r| is_key(r, key), |r| record_hash(hasher, r)) {
            hashbrown::hash_table::Entry::Occupied(mut old) => *old.get_mut() = record,
            hashbrown::hash_table::Entry::Vacant(slot) => {
                slot.insert(record);
            }
        }
    }

    fn remove(&mut self, key: &Key) {
        let hash = key_hash(&self.hasher, &key.namespace, &key.name);
        if let Ok(found) = self.records.find_entry(hash, |r| is_key(r, key)) {
            found.remove();
        }
    }

    fn get(&self, key: &Key) -> Option<&[u8]> {
        let hash = key_hash(&self.hasher, &key.namespace, &key.name);
        let record = self.records.find(hash, |r| is_key(r, key))?;
        fields(record).map(|(_, _, tail)| tail)
    }

    /// Every GpuJob as (namespace, name, tail).
    fn iter(&self) -> impl Iterator<Item = (&str, &str, &[u8])> {
        self.records.iter().filter_map(|r| fields(r))
    }
}

/// The GpuJobs of `part` in one table and not the other, or in both as different
/// records (packed alike, so equal bytes are the same delivery of the same object).
fn differing(old: &Table, new: &Table, part: &Scope) -> Vec<Key> {
    let mut keys: Vec<Key> = new
        .iter()
        .filter(|(ns, name, tail)| old.get(&Key::new(ns, name)) != Some(*tail))
        .map(|(ns, name, _)| Key::new(ns, name))
        .collect();
    keys.extend(
        old.iter()
            .filter(|(ns, _, _)| part.contains(ns))
            .map(|(ns, name, _)| Key::new(ns, name))
            .filter(|key| new.get(key).is_none()),
    );
    keys
}

impl Default for GpuJobCache {
    fn default() -> GpuJobCache {
        GpuJobCache {
            inner: RwLock::default(),
            ready: watch::channel(false).0,
        }
    }
}

impl GpuJobCache {
    /// Applies one event of the watch of `part` (everything, or one shard), as
    /// kube-runtime's reflector does: a relist shows only when complete (InitDone), and
    /// then replaces everything of `part`. Returns, at the end of a relist, the GpuJobs
    /// it changed: those that came, went, or differ from what was cached (another
    /// resourceVersion); nothing for any other event.
    pub fn apply(&self, event: &Event<GpuJob>, part: &Scope) -> Vec<Key> {
        let mut inner = self.inner.write().unwrap_or_else(|p| p.into_inner());
        match event {
            Event::Init => {
                inner.relists.begin(part);
            }
            Event::InitApply(gj) => {
                let key = Key::of(gj);
                let relist = inner.relists.get_mut(part);
                if let Some((relist, packed)) = relist.zip(pack(&key, gj)) {
                    relist.insert(&key, packed);
                }
            }
            Event::InitDone => {
                let mut changed = Vec::new();
                if let Some(mut relist) = inner.relists.finish(part) {
                    changed = differing(&inner.table, &relist, part);
                    if *part == Scope::All {
                        let Table { records, hasher } = &mut relist;
                        records.shrink_to_fit(|r| record_hash(hasher, r));
                        inner.table = relist;
                    } else {
                        inner.table.remove_part(part);
                        for record in relist.records {
                            inner.table.insert_record(record);
                        }
                    }
                }
                drop(inner);
                self.ready.send_replace(true);
                return changed;
            }
            Event::Apply(gj) => {
                let key = Key::of(gj);
                if let Some(packed) = pack(&key, gj) {
                    inner.table.insert(&key, packed);
                }
            }
            Event::Delete(gj) => inner.table.remove(&Key::of(gj)),
        }
        Vec::new()
    }

    /// The watch of `part` stopped: what it filled goes (and its relist, if one was
    /// under way).
    pub fn drop_part(&self, part: &Scope) {
        let mut inner = self.inner.write().unwrap_or_else(|p| p.into_inner());
        inner.relists.abandon(part);
        inner.table.remove_part(part);
        let Table { records, hasher } = &mut inner.table;
        records.shrink_to_fit(|r| record_hash(hasher, r));
    }

    /// The GpuJob as last delivered.
    pub fn get(&self, key: &Key) -> Option<Arc<GpuJob>> {
        let inner = self.inner.read().unwrap_or_else(|p| p.into_inner());
        inner
            .table
            .get(key)
            .and_then(|p| unpack(&key.namespace, &key.name, p))
    }

    /// Whether the cache holds a GpuJob of this key (nothing decoded).
    pub fn contains(&self, key: &Key) -> bool {
        let inner = self.inner.read().unwrap_or_else(|p| p.into_inner());
        inner.table.get(key).is_some()
    }

    /// Every cached GpuJob's key.
    pub fn keys(&self) -> Vec<Key> {
        self.keys_where(|_| true)
    }

    /// Keys of the GpuJobs in namespaces for which `pick` holds, each with whether the
    /// operator ever observed it ([`Facts::observed`]; nothing decoded).
    pub fn keys_observed_where(&self, pick: impl Fn(&str) -> bool) -> Vec<(Key, bool)> {
        let inner = self.inner.read().unwrap_or_else(|p| p.into_inner());
        inner
            .table
            .iter()
            .filter(|(ns, _, _)| pick(ns))
            .map(|(ns, name, tail)| {
                let observed = Facts::from_bytes(tail).is_some_and(|(f, _)| f.observed());
                (Key::new(ns, name), observed)
            })
            .collect()
    }

    /// Which of `keys` the operator ever observed ([`Facts::observed`]). A key not cached
    /// (its GpuJob gone) counts as observed: it is no new work.
    pub fn observed(&self, keys: Vec<Key>) -> Vec<(Key, bool)> {
        let inner = self.inner.read().unwrap_or_else(|p| p.into_inner());
        keys.into_iter()
            .map(|key| {
                let observed = inner
                    .table
                    .get(&key)
                    .and_then(Facts::from_bytes)
                    .is_none_or(|(f, _)| f.observed());
                (key, observed)
            })
            .collect()
    }

    /// Keys of the GpuJobs in namespaces for which `pick` holds.
    pub fn keys_where(&self, pick: impl Fn(&str) -> bool) -> Vec<Key> {
        let inner = self.inner.read().unwrap_or_else(|p| p.into_inner());
        inner
            .table
            .iter()
            .filter(|(ns, _, _)| pick(ns))
            .map(|(ns, name, _)| Key::new(ns, name))
            .collect()
    }

    /// Runs `f` over the gauges' facts of the cached GpuJobs of the namespaces for which
    /// `pick` holds, with each one's namespace: kept beside its JSON, so nothing is
    /// decoded. Watch events wait meanwhile.
    pub fn facts_where<R>(
        &self,
        pick: impl Fn(&str) -> bool,
        f: impl FnOnce(&mut dyn Iterator<Item = (&str, Facts)>) -> R,
    ) -> R {
        let inner = self.inner.read().unwrap_or_else(|p| p.into_inner());
        let mut each = inner
            .table
            .iter()
            .filter(|(ns, _, _)| pick(ns))
            .filter_map(|(ns, _, tail)| Facts::from_bytes(tail).map(|(facts, _)| (ns, facts)));
        f(&mut each)
    }

    pub fn len(&self) -> usize {
        let inner = self.inner.read().unwrap_or_else(|p| p.into_inner());
        inner.table.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Resolves once the first list has been loaded.
    pub async fn wait_ready(&self) {
        let mut rx = self.ready.subscribe();
        let _ = rx.wait_for(|ready| *ready).await;
    }
}

fn pack(key: &Key, gj: &GpuJob) -> Option<Box<[u8]>> {
    let packed = serde_json::to_vec(gj)
        .map_err(|e| e.to_string())
        .and_then(|json| {
            let mut tail = Facts::of(gj).to_bytes().to_vec();
            tail.extend(lz4_flex::block::compress_prepend_size_with_dict(
                &json,
                &DICTIONARY,
            ));
            record::pack([&key.namespace, &key.name], &tail)
                .ok_or_else(|| "a name longer than 64 KiB".to_owned())
        });
    match packed {
        Ok(packed) => Some(packed),
        Err(e) => {
            // Cannot happen for a value that was just decoded; if it did, the GpuJob
            // would be missing from the cache rather than the process gone.
            error!(gpujob = %key, "cannot cache the GpuJob: {e}; it is looked at again with its next event");
            None
        }
    }
}

fn unpack(namespace: &str, name: &str, tail: &[u8]) -> Option<Arc<GpuJob>> {
    let decoded = Facts::from_bytes(tail)
        .ok_or_else(|| "a record cut short".to_owned())
        .and_then(|(_, compressed)| {
            lz4_flex::block::decompress_size_prepended_with_dict(compressed, &DICTIONARY)
                .map_err(|e| e.to_string())
        })
        .and_then(|json| serde_json::from_slice(&json).map_err(|e| e.to_string()));
    match decoded {
        Ok(gj) => Some(Arc::new(gj)),
        Err(e) => {
            error!(
                gpujob = format_args!("{namespace}/{name}"),
                "cannot read the cached GpuJob: {e}"
            );
            None
        }
    }
}

static DICTIONARY: LazyLock<Vec<u8>> = LazyLock::new(dictionary);

/// What LZ4 finds repeats of in a cached GpuJob's JSON: typical GpuJobs (pending,
/// running, backing off, succeeded), serialized as the cache serializes them, so field
/// names and their order follow the types. Fixed for the life of the process: the
/// records never leave it.
fn dictionary() -> Vec<u8> {
    let meta = |phase: &str| {
        serde_json::json!({"name": "gpujob-00000", "namespace": "default",
            "uid": "00000000-0000-0000-0000-000000000000", "resourceVersion": "100000",
            "generation": 1, "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": {"app.kubernetes.io/name": phase},
            "finalizers": ["gpujob.dev/quota-release"]})
    };
    let spec = serde_json::json!({"image": "nvcr.io/nvidia/pytorch:24.01-py3",
        "command": ["sh", "-c", "python train.py"], "gpus": 1, "maxRetries": 3,
        "updatePolicy": "OnNextAttempt", "nodeSelector": {"nvidia.com/gpu.product": "A100"},
        "env": [{"name": "EPOCHS", "value": "1"}]});
    let ready = |status: &str, reason: &str, message: &str| {
        serde_json::json!([{"type": "Ready", "status": status, "reason": reason,
            "message": message, "lastTransitionTime": "2026-01-01T00:00:00Z",
            "observedGeneration": 1}])
    };
    let samples = [
        serde_json::json!({"metadata": meta("pending"), "spec": spec,
            "status": {"observedGeneration": 1, "phase": "Pending", "attempts": 1,
                "failures": 1, "nextAttemptTime": "2026-01-01T00:00:00.000000000Z",
                "lastError": "attempt 1 failed: exit code 1 (Error)",
                "lastFailure": {"attempt": 1, "time": "2026-01-01T00:00:00Z",
                    "exitCode": 1, "reason": "Error", "message": "attempt 1 failed: exit code 1 (Error)"},
                "conditions": ready("False", "BackingOff",
                    "attempt 1 failed: exit code 1 (Error); attempt 2 starts at 2026-01-01T00:00:00Z")}}),
        serde_json::json!({"metadata": meta("succeeded"), "spec": spec,
            "status": {"observedGeneration": 1, "phase": "Succeeded", "attempts": 1,
                "failures": 0, "reservationId": "gpujob-00000-0000", "startTime": "2026-01-01T00:00:00Z",
                "completionTime": "2026-01-01T00:00:00Z",
                "conditions": [{"type": "Complete", "status": "True", "reason": "Succeeded",
                    "message": "attempt 1 succeeded", "lastTransitionTime": "2026-01-01T00:00:00Z",
                    "observedGeneration": 1}]}}),
        serde_json::json!({"metadata": meta("running"), "spec": spec,
            "status": {"observedGeneration": 1, "phase": "Running", "attempts": 1,
                "failures": 0, "activeJob": "gpujob-00000-1", "startTime": "2026-01-01T00:00:00Z",
                "conditions": ready("False", "JobRunning", "attempt 1 is running (Job gpujob-00000-1)")}}),
    ];
    let mut dictionary = Vec::new();
    for sample in samples {
        let mut sample = sample;
        if let Some(object) = sample.as_object_mut() {
            object.insert("apiVersion".into(), "gpujob.dev/v1".into());
            object.insert("kind".into(), "GpuJob".into());
        }
        // Through the type, so the bytes are as `pack` writes them; a sample the type
        // rejects is left out (a unit test sees to it that none is).
        let typed = serde_json::from_value::<GpuJob>(sample).and_then(|gj| serde_json::to_vec(&gj));
        match typed {
            Ok(bytes) => dictionary.extend(bytes),
            Err(e) => error!("a sample GpuJob of the cache's dictionary does not decode: {e}"),
        }
    }
    dictionary
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GpuJob with every kind of field the API server sends back.
    fn gpujob(name: &str, rv: &str) -> GpuJob {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "gpujob.dev/v1", "kind": "GpuJob",
            "metadata": {"name": name, "namespace": "ns", "uid": format!("u-{name}"),
                "resourceVersion": rv, "generation": 3,
                "creationTimestamp": "2026-12-01T10:00:00Z",
                "labels": {"team": "a"}, "annotations": {"gpujob.dev/rerun": "2"},
                "finalizers": ["gpujob.dev/quota-release"]},
            "spec": {"image": "i", "command": ["sh", "-c", "exit 1"], "gpus": 2,
                "maxRetries": 1, "updatePolicy": "OnNextAttempt",
                "nodeSelector": {"gpu": "a100"}, "env": [{"name": "A", "value": "b"}]},
            "status": {"observedGeneration": 3, "phase": "Pending", "attempts": 2,
                "failures": 1, "nextAttemptTime": "2026-12-01T10:00:05.123456789Z",
                "lastError": "attempt 1 failed", "reservationId": "r-1",
                "startTime": "2026-12-01T10:00:01.5Z",
                "lastFailure": {"attempt": 1, "time": "2026-12-01T10:00:03Z",
                    "exitCode": 1, "reason": "Error", "message": "attempt 1 failed"},
                "conditions": [{"type": "Ready", "status": "False", "reason": "BackingOff",
                    "message": "m", "lastTransitionTime": "2026-12-01T10:00:03Z",
                    "observedGeneration": 3}]},
        }))
        .unwrap()
    }

    #[test]
    fn a_cached_gpujob_reads_back_exactly_as_delivered() {
        // The plan compares the status it computes with the cached one to decide
        // whether to write: a field changed by the packing would be written every time.
        let cache = GpuJobCache::default();
        let gj = gpujob("a", "7");
        cache.apply(&Event::Apply(gj.clone()), &Scope::All);
        let read = cache.get(&Key::new("ns", "a")).expect("cached");
        assert_eq!(*read, gj);
        assert_eq!(cache.get(&Key::new("ns", "b")), None);
    }

    #[test]
    fn events_and_relists_are_applied_as_the_reflector_does() {
        let cache = GpuJobCache::default();
        cache.apply(&Event::Apply(gpujob("a", "1")), &Scope::All);
        cache.apply(&Event::Apply(gpujob("a", "2")), &Scope::All);
        let rv = |c: &GpuJobCache, name: &str| {
            c.get(&Key::new("ns", name))
                .and_then(|g| g.metadata.resource_version.clone())
        };
        assert_eq!(rv(&cache, "a").as_deref(), Some("2"), "the newest wins");
        cache.apply(&Event::Apply(gpujob("b", "3")), &Scope::All);
        cache.apply(&Event::Delete(gpujob("b", "3")), &Scope::All);
        assert_eq!(cache.keys(), vec![Key::new("ns", "a")]);

        cache.apply(&Event::Init, &Scope::All);
        cache.apply(&Event::InitApply(gpujob("c", "4")), &Scope::All);
        assert_eq!(
            cache.keys(),
            vec![Key::new("ns", "a")],
            "a relist shows only when complete"
        );
        cache.apply(&Event::InitDone, &Scope::All);
        assert_eq!(cache.keys(), vec![Key::new("ns", "c")], "then replaces all");
        assert_eq!(cache.keys_where(|ns| ns == "ns").len(), 1);
        assert!(cache.keys_where(|ns| ns == "other").is_empty());
        let facts: Vec<(String, Facts)> = cache.facts_where(
            |_| true,
            |each| each.map(|(ns, f)| (ns.to_owned(), f)).collect(),
        );
        assert_eq!(facts, vec![("ns".to_owned(), Facts::of(&gpujob("c", "4")))]);
        assert!(cache.facts_where(|ns| ns == "other", |each| each.count()) == 0);
        let mut fresh = gpujob("d", "5");
        fresh.status = None;
        cache.apply(&Event::Apply(fresh), &Scope::All);
        let mut observed = cache.keys_observed_where(|ns| ns == "ns");
        observed.sort();
        assert_eq!(
            observed,
            vec![(Key::new("ns", "c"), true), (Key::new("ns", "d"), false)],
            "one with observedGeneration was observed; one without a status, never"
        );
        let keys = vec![
            Key::new("ns", "d"),
            Key::new("ns", "c"),
            Key::new("ns", "gone"),
        ];
        assert_eq!(
            cache.observed(keys),
            vec![
                (Key::new("ns", "d"), false),
                (Key::new("ns", "c"), true),
                (Key::new("ns", "gone"), true)
            ]
        );
    }

    #[test]
    fn a_relist_names_only_the_gpujobs_it_changed() {
        // Watches start again whenever the shards held or kept warm change: a relist
        // that named every GpuJob would have each looked at again, for nothing.
        let cache = GpuJobCache::default();
        for (name, rv) in [("same", "1"), ("moved", "2"), ("gone", "3")] {
            cache.apply(&Event::Apply(gpujob(name, rv)), &Scope::All);
        }
        cache.apply(&Event::Init, &Scope::All);
        for (name, rv) in [("same", "1"), ("moved", "5"), ("new", "6")] {
            assert!(
                cache
                    .apply(&Event::InitApply(gpujob(name, rv)), &Scope::All)
                    .is_empty()
            );
        }
        let mut changed = cache.apply(&Event::InitDone, &Scope::All);
        changed.sort();
        assert_eq!(
            changed,
            ["gone", "moved", "new"].map(|n| Key::new("ns", n)).to_vec()
        );
        // The first list names everything it found.
        let fresh = GpuJobCache::default();
        fresh.apply(&Event::Init, &Scope::All);
        fresh.apply(&Event::InitApply(gpujob("same", "1")), &Scope::All);
        assert_eq!(
            fresh.apply(&Event::InitDone, &Scope::All),
            vec![Key::new("ns", "same")]
        );
    }

    #[test]
    fn a_shards_relist_replaces_that_shard_alone_and_a_stopped_shard_leaves() {
        use crate::controller::view::scope::ns_of;
        use crate::shard::ShardMap;
        let map = Arc::new(ShardMap::even(2));
        let (a, b) = (ns_of(0, 2), ns_of(1, 2));
        let at = |ns: &str, name: &str, rv: &str| {
            let mut gj = gpujob(name, rv);
            gj.metadata.namespace = Some(ns.to_owned());
            gj
        };
        let (zero, one) = (Scope::single(0, map.clone()), Scope::single(1, map));
        let cache = GpuJobCache::default();
        for (ns, part) in [(&a, &zero), (&b, &one)] {
            cache.apply(&Event::Init, part);
            cache.apply(&Event::InitApply(at(ns, "x", "1")), part);
            cache.apply(&Event::InitApply(at(ns, "y", "1")), part);
            assert_eq!(cache.apply(&Event::InitDone, part).len(), 2);
        }
        // Shard 1 lists again (its watch could not resume) while shard 0's events go on.
        cache.apply(&Event::Init, &one);
        cache.apply(&Event::InitApply(at(&b, "x", "2")), &one);
        cache.apply(&Event::Apply(at(&a, "z", "3")), &zero);
        assert_eq!(
            cache.apply(&Event::InitDone, &one),
            vec![Key::new(&b, "x"), Key::new(&b, "y")],
            "x changed, y went; shard 0 is not this relist's"
        );
        let mut keys = cache.keys();
        keys.sort();
        let mut want = vec![
            Key::new(&a, "x"),
            Key::new(&a, "y"),
            Key::new(&a, "z"),
            Key::new(&b, "x"),
        ];
        want.sort();
        assert_eq!(keys, want);
        cache.drop_part(&zero);
        assert_eq!(cache.keys(), vec![Key::new(&b, "x")]);
    }

    #[test]
    fn every_sample_of_the_dictionary_is_a_gpujob() {
        let dictionary = String::from_utf8(dictionary()).expect("JSON");
        for phase in ["Pending", "Succeeded", "Running"] {
            assert!(
                dictionary.contains(&format!("\"phase\":\"{phase}\"")),
                "the {phase} sample decoded as a GpuJob"
            );
        }
        // The samples' fields survive the round trip through the type: none dropped as
        // unknown, so the dictionary holds what cached GpuJobs hold.
        for field in [
            "\"lastFailure\"",
            "\"reservationId\"",
            "\"nodeSelector\"",
            "\"finalizers\"",
        ] {
            assert!(dictionary.contains(field), "{field} kept");
        }
    }

    #[tokio::test]
    async fn ready_once_the_first_list_is_loaded() {
        let cache = GpuJobCache::default();
        let waiting = tokio::time::timeout(std::time::Duration::ZERO, cache.wait_ready());
        assert!(waiting.await.is_err(), "not ready before a list");
        cache.apply(&Event::Init, &Scope::All);
        cache.apply(&Event::InitDone, &Scope::All);
        cache.wait_ready().await;
        assert!(cache.is_empty());
    }
}
