//! What this operator wrote and its caches have not seen yet.
//!
//! Watch events of the operator's own writes arrive in any order: the event of a Job it
//! just created often comes before the cache has its own status write, and the other way
//! round. Planning from such a cache would patch the status a second time or try to
//! create the Job again. So each write is remembered, keyed by the resourceVersion it
//! replaced, until the cache catches up; reconciles see cache + memory. The watches
//! forget a write as soon as they deliver what settles it, so under a burst (echoes
//! waiting behind new work) the memory holds only what the watches lag behind.
//!
//! resourceVersions are opaque (compared for equality only): a cached GpuJob whose
//! resourceVersion is one the operator itself replaced is stale, anything else is newer
//! than the memory and wins.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use k8s_openapi::api::batch::v1::Job;

use super::Key;
use super::cache::Cached;
use crate::api::GpuJob;
use crate::controller::seen_job::SeenJob;
use crate::controller::seen_pod::SeenPod;

#[derive(Debug, Default)]
struct Entry {
    uid: String,
    /// resourceVersions this operator's status writes replaced.
    replaced: HashSet<String>,
    /// The GpuJob as the last status write returned it.
    latest: Option<Arc<GpuJob>>,
    /// Jobs created, or read from the API server, that the cache has not shown yet, by
    /// name, until it does (or a relist or their deletion says they are gone), kept as
    /// the cache keeps Jobs.
    created: BTreeMap<String, Cached>,
    /// Jobs deleted (name → uid), until the cache drops them.
    deleted: BTreeMap<String, String>,
    /// Jobs being deleted in the foreground (name → uid): they stay until their pods
    /// are gone; shown as deleting until the cache says so.
    deleting: BTreeMap<String, String>,
    /// Jobs an earlier version made that got the scheduling gate (name → the patch): a
    /// cached copy at the version the patch replaced is shown gated, until the cache
    /// shows a newer one.
    gated: BTreeMap<String, Gating>,
    /// Pods (uids) whose scheduling gate this replica removed: shown let go until the
    /// pod cache shows them so (or not at all), so that a look in between does not read
    /// the pods again for nothing.
    ungated: HashSet<String>,
}

/// The scheduling gate put on a Job an earlier version made ([`WriteMemory::job_gated`]).
#[derive(Debug, Clone)]
struct Gating {
    /// The Job's resourceVersion the patch replaced.
    replaced: String,
    /// The Kueue LocalQueue it was handed to; `None`: it was started.
    queue: Option<String>,
}

impl Entry {
    /// Nothing remembered: the same as no entry, so it goes (a converged GpuJob costs
    /// no memory here).
    fn is_empty(&self) -> bool {
        self.replaced.is_empty()
            && self.latest.is_none()
            && self.created.is_empty()
            && self.deleted.is_empty()
            && self.deleting.is_empty()
            && self.gated.is_empty()
            && self.ungated.is_empty()
    }
}

/// Versions known current kept per GpuJob: a GpuJob written many times in one term
/// (retries) keeps only its newest, so the memory stays bounded.
const CURRENT_KEPT: usize = 4;

#[derive(Debug, Default)]
pub struct WriteMemory {
    entries: Mutex<HashMap<Key, Entry>>,
    /// Per GpuJob, the resourceVersions known current in this replica's term of its
    /// shard (the term's epoch, then the versions): read from the API server, or
    /// produced by this replica's own writes. Within a term only this replica writes a
    /// GpuJob's status, so a cached view at one of these versions has nothing of
    /// another replica's missing; any other view may predate the previous holder's
    /// writes. Only the newest few are kept: the cache shows one of them or a newer one.
    current: Mutex<HashMap<Key, (u64, VecDeque<String>)>>,
}

impl WriteMemory {
    fn lock(&self) -> MutexGuard<'_, HashMap<Key, Entry>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The freshest view of a GpuJob: the cached one (`read`), or what this operator
    /// last wrote when the cache still holds a version that write replaced; `None` when
    /// the cache has no such GpuJob. The cache is read under this memory's lock: the
    /// watch forgets a write only once the cache holds what replaced it
    /// ([`WriteMemory::gpujob_seen`]), so the two reads always agree.
    pub fn gpujob(
        &self,
        key: &Key,
        read: impl FnOnce() -> Option<Arc<GpuJob>>,
    ) -> Option<Arc<GpuJob>> {
        let mut entries = self.lock();
        let cached = read()?;
        let Some(entry) = entries.get_mut(key) else {
            return Some(cached);
        };
        Some(match seen(entry, &cached) {
            Some(latest) => latest,
            None => {
                if entry.is_empty() || entry.uid != uid_of(&cached) {
                    entries.remove(key);
                }
                cached
            }
        })
    }

    /// The GpuJob watch delivered `gj`, and the cache holds it: the status writes it
    /// shows (or moved past) are forgotten now rather than at the GpuJob's next
    /// reconcile, which under a burst waits behind new work for minutes.
    pub fn gpujob_seen(&self, key: &Key, gj: &GpuJob) {
        let mut entries = self.lock();
        let Some(entry) = entries.get_mut(key) else {
            return;
        };
        if seen(entry, gj).is_none() && (entry.is_empty() || entry.uid != uid_of(gj)) {
            entries.remove(key);
        }
    }

    /// Records a write (or a read from the API server past a lagging cache):
    /// `replaced_rv` was the version it was computed from.
    pub fn status_written(&self, key: &Key, replaced_rv: String, written: Arc<GpuJob>) {
        let mut entries = self.lock();
        let entry = entry(&mut entries, key, &written);
        entry.replaced.insert(replaced_rv);
        entry.latest = Some(written);
    }

    /// The GpuJob's Jobs: the cached ones (`read`, under this memory's lock as for
    /// [`WriteMemory::gpujob`]), plus created and minus deleted ones the cache has not
    /// seen yet (deletes are remembered only once the API server accepted them: a
    /// refused one leaves the Job in view, to be decided again).
    pub fn jobs(
        &self,
        key: &Key,
        uid: &str,
        read: impl FnOnce() -> Vec<Arc<SeenJob>>,
    ) -> Vec<Arc<SeenJob>> {
        let mut entries = self.lock();
        let cached = read();
        let Some(entry) = entries.get_mut(key).filter(|e| e.uid == uid) else {
            return cached;
        };
        let cached_names: HashMap<String, String> = cached
            .iter()
            .filter_map(|j| Some((j.name.clone(), j.uid.clone()?)))
            .collect();
        entry
            .created
            .retain(|name, _| !cached_names.contains_key(name));
        entry
            .deleted
            .retain(|name, uid| cached_names.get(name) == Some(uid));
        entry.deleting.retain(|name, uid| {
            cached
                .iter()
                .any(|j| j.name == *name && j.uid.as_deref() == Some(uid.as_str()) && !j.deleting())
        });
        entry.gated.retain(|name, start| {
            cached.iter().any(|j| {
                j.name == *name && j.resource_version.as_deref() == Some(start.replaced.as_str())
            })
        });
        let mut jobs: Vec<Arc<SeenJob>> =
            cached
                .into_iter()
                .filter(|j| !entry.deleted.contains_key(&j.name))
                .map(|j| {
                    let deleting = entry.deleting.contains_key(&j.name);
                    let gating = entry.gated.get(&j.name);
                    if !deleting && gating.is_none() {
                        return j;
                    }
                    let mut shown = (*j).clone();
                    if deleting {
                        // Accepted as deleting; the cache has not seen it yet.
                        shown.deletion_timestamp =
                            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                                jiff::Timestamp::now(),
                            ));
                    }
                    if let Some(gating) = gating {
                        // Gated (and started unless Kueue starts it); the cache still
                        // shows the version the patch replaced.
                        shown.gated = true;
                        match &gating.queue {
                            Some(queue) => shown.queue = Some(queue.clone()),
                            None => shown.suspended = false,
                        }
                    }
                    Arc::new(shown)
                })
                .collect();
        jobs.extend(
            entry
                .created
                .values()
                .filter_map(Cached::seen)
                .map(Arc::new),
        );
        if entry.is_empty() {
            entries.remove(key);
        }
        jobs
    }

    /// The Job watch delivered `job` (`gone`: its deletion), and the cache holds that:
    /// what is remembered about it goes now, as [`WriteMemory::jobs`] would drop it at
    /// the next reconcile.
    pub fn job_seen(&self, key: &Key, job: &Job, gone: bool) {
        let mut entries = self.lock();
        let Some(entry) = entries.get_mut(key) else {
            return;
        };
        let (Some(name), Some(uid)) = (job.metadata.name.as_deref(), job.metadata.uid.as_deref())
        else {
            return;
        };
        let same = |remembered: &String| remembered == uid;
        if gone {
            // Created and deleted before the cache could show it (the created copy is
            // trimmed but keeps its uid), or a delete the cache now agrees with.
            if entry.created.get(name).and_then(Cached::uid).as_deref() == Some(uid) {
                entry.created.remove(name);
            }
            entry.deleted.remove(name);
            entry.deleting.remove(name);
            entry.gated.remove(name);
        } else {
            entry.created.remove(name);
            if !entry.deleted.get(name).is_some_and(same) {
                entry.deleted.remove(name);
            }
            if !entry.deleting.get(name).is_some_and(same)
                || job.metadata.deletion_timestamp.is_some()
            {
                entry.deleting.remove(name);
            }
            if entry.gated.get(name).map(|s| s.replaced.as_str())
                != job.metadata.resource_version.as_deref()
            {
                entry.gated.remove(name);
            }
        }
        if entry.is_empty() {
            entries.remove(key);
        }
    }

    /// Records a Job this operator created, kept as the cache keeps Jobs (what the plan
    /// reads): under a burst thousands wait here for the cache, and a whole Job with
    /// its pod template and managedFields is several times larger.
    pub fn job_created(&self, key: &Key, owner: &GpuJob, job: &SeenJob) {
        let mut entries = self.lock();
        // Not packed (logged by `Cached::of`): the GpuJob waits for its cache.
        if let Some(cached) = Cached::of(job) {
            entry(&mut entries, key, owner)
                .created
                .insert(job.name.clone(), cached);
        }
    }

    /// Records a Job read from the API server because the cache did not have it (its
    /// watch lags or is relisting). Kept like a created one: if the Job goes before the
    /// cache ever shows it, no watch event will say so, but the relist that ends the
    /// lag names this GpuJob ([`WriteMemory::jobs_relisted`]), so it is looked at again.
    pub fn job_read(&self, key: &Key, owner: &GpuJob, job: &SeenJob) {
        self.job_created(key, owner, job);
    }

    /// A delete of Job `name` was refused for its resourceVersion: a copy kept here is
    /// stale. It goes, so the next look reads the Job again instead of retrying the
    /// same version until the watch catches up.
    pub fn job_stale(&self, key: &Key, name: &str) {
        let mut entries = self.lock();
        if let Some(entry) = entries.get_mut(key) {
            entry.created.remove(name);
            if entry.is_empty() {
                entries.remove(key);
            }
        }
    }

    /// Records the scheduling gate the API server accepted on Job `name` (made suspended
    /// by an earlier version; handed to Kueue LocalQueue `queue`, or without one
    /// started) at resourceVersion `replaced`: until the cache shows a newer version, the
    /// Job is shown so (else the next look would patch it again, and be refused).
    pub fn job_gated(
        &self,
        key: &Key,
        owner: &GpuJob,
        name: String,
        replaced: String,
        queue: Option<String>,
    ) {
        let mut entries = self.lock();
        entry(&mut entries, key, owner)
            .gated
            .insert(name, Gating { replaced, queue });
    }

    /// Records a delete the API server accepted. `foreground`: the Job stays, deleting,
    /// until its pods are gone.
    pub fn job_deleted(
        &self,
        key: &Key,
        owner: &GpuJob,
        name: String,
        uid: String,
        foreground: bool,
    ) {
        let mut entries = self.lock();
        let entry = entry(&mut entries, key, owner);
        // No longer a create the cache has yet to show.
        let unseen = entry.created.remove(&name);
        if foreground {
            // Not gone while its pods stop, and no attempt starts until it is: a copy
            // the cache has yet to show stays, deleting, until the cache shows the Job,
            // its deletion event arrives, or a relist says how things are.
            let deleting = unseen.and_then(|c| c.seen()).and_then(|mut j| {
                j.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    jiff::Timestamp::now(),
                ));
                Cached::of(&j)
            });
            if let Some(deleting) = deleting {
                entry.created.insert(name.clone(), deleting);
            }
            entry.deleting.insert(name, uid);
        } else {
            entry.deleted.insert(name, uid);
        }
    }

    /// Records that pod `pod_uid` of the GpuJob was let go (its gate removed).
    pub fn pod_ungated(&self, key: &Key, owner: &GpuJob, pod_uid: String) {
        let mut entries = self.lock();
        entry(&mut entries, key, owner).ungated.insert(pod_uid);
    }

    /// The GpuJob's cached pods (`read`), with those this replica let go shown so until
    /// the cache shows them let go or gone.
    pub fn pods(
        &self,
        key: &Key,
        uid: &str,
        read: impl FnOnce() -> Vec<Arc<SeenPod>>,
    ) -> Vec<Arc<SeenPod>> {
        let mut entries = self.lock();
        let cached = read();
        let Some(entry) = entries
            .get_mut(key)
            .filter(|e| e.uid == uid && !e.ungated.is_empty())
        else {
            return cached;
        };
        entry.ungated.retain(|pod| {
            cached
                .iter()
                .any(|p| p.uid.as_deref() == Some(pod) && p.gated)
        });
        let pods = cached
            .into_iter()
            .map(|p| match &p.uid {
                Some(u) if entry.ungated.contains(u) => {
                    let mut shown = (*p).clone();
                    shown.gated = false;
                    Arc::new(shown)
                }
                _ => p,
            })
            .collect();
        if entry.is_empty() {
            entries.remove(key);
        }
        pods
    }

    /// A relist of Jobs is complete for the GpuJobs for which `part` holds (the relisted
    /// watch's shards): the cache holds what the API server has for them, so what is
    /// remembered about their Jobs (created, deleted, being deleted, gated) goes. Other
    /// shards' watches did not relist, so what is remembered of theirs stays. Returns the
    /// GpuJobs it was about, to be looked at again: a Job may have come and gone between
    /// two lists, with no event the cache could pass on.
    pub fn jobs_relisted(&self, part: impl Fn(&Key) -> bool) -> Vec<Key> {
        let mut keys = Vec::new();
        self.lock().retain(|key, e| {
            if !part(key)
                || e.created.is_empty()
                    && e.deleted.is_empty()
                    && e.deleting.is_empty()
                    && e.gated.is_empty()
            {
                return true;
            }
            keys.push(key.clone());
            e.created.clear();
            e.deleted.clear();
            e.deleting.clear();
            e.gated.clear();
            !e.is_empty()
        });
        keys
    }

    /// Drops everything about GpuJobs for which `lost` holds (their shard changed
    /// hands: another replica may have written them).
    pub fn forget_where(&self, lost: impl Fn(&Key) -> bool) {
        self.lock().retain(|key, _| !lost(key));
        self.lock_current().retain(|key, _| !lost(key));
    }

    /// Drops everything about a GpuJob that is gone.
    pub fn forget(&self, key: &Key) {
        self.lock().remove(key);
        self.lock_current().remove(key);
    }

    fn lock_current(&self) -> MutexGuard<'_, HashMap<Key, (u64, VecDeque<String>)>> {
        self.current.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records that version `rv` of the GpuJob is current in term `epoch` (read from
    /// the API server, or written by this replica).
    pub fn mark_current(&self, key: &Key, epoch: u64, rv: &str) {
        let mut current = self.lock_current();
        let (term, versions) = current.entry(key.clone()).or_default();
        if *term > epoch {
            // Late news of an ended term: the current term's marks stay.
            return;
        }
        if *term != epoch {
            *term = epoch;
            versions.clear();
        }
        if !versions.iter().any(|v| v == rv) {
            if versions.len() == CURRENT_KEPT {
                versions.pop_front();
            }
            versions.push_back(rv.to_owned());
        }
    }

    /// Whether version `rv` of the GpuJob is known current in term `epoch`.
    pub fn is_current(&self, key: &Key, epoch: u64, rv: &str) -> bool {
        self.lock_current()
            .get(key)
            .is_some_and(|(term, versions)| *term == epoch && versions.iter().any(|v| v == rv))
    }

    /// GpuJobs with something remembered.
    #[cfg(test)]
    fn entries(&self) -> usize {
        self.lock().len()
    }
}

fn uid_of(gj: &GpuJob) -> &str {
    gj.metadata.uid.as_deref().unwrap_or_default()
}

/// What this operator last wrote, when `cached` is a version it replaced; otherwise
/// (the cache caught up or moved past, or a new GpuJob has the name) the status writes
/// are forgotten and `None`.
fn seen(entry: &mut Entry, cached: &GpuJob) -> Option<Arc<GpuJob>> {
    let rv = cached
        .metadata
        .resource_version
        .as_deref()
        .unwrap_or_default();
    match &entry.latest {
        Some(latest) if entry.uid == uid_of(cached) && entry.replaced.contains(rv) => {
            Some(latest.clone())
        }
        _ => {
            entry.replaced.clear();
            entry.latest = None;
            None
        }
    }
}

fn entry<'a>(entries: &'a mut HashMap<Key, Entry>, key: &Key, owner: &GpuJob) -> &'a mut Entry {
    let uid = owner.metadata.uid.clone().unwrap_or_default();
    let entry = entries.entry(key.clone()).or_default();
    if entry.uid != uid {
        *entry = Entry {
            uid,
            ..Entry::default()
        };
    }
    entry
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::GpuJobSpec;

    fn gj(rv: &str, uid: &str) -> GpuJob {
        let mut g = GpuJob::new(
            "a",
            serde_json::from_value::<GpuJobSpec>(serde_json::json!({"image": "i", "gpus": 1}))
                .unwrap(),
        );
        g.metadata.namespace = Some("ns".into());
        g.metadata.uid = Some(uid.into());
        g.metadata.resource_version = Some(rv.into());
        g
    }

    fn key() -> Key {
        Key::new("ns", "a")
    }

    #[test]
    fn versions_are_current_only_in_their_term_and_only_the_newest_are_kept() {
        let m = WriteMemory::default();
        assert!(!m.is_current(&key(), 1, "10"), "nothing known: not current");
        m.mark_current(&key(), 1, "10");
        assert!(m.is_current(&key(), 1, "10"));
        assert!(
            !m.is_current(&key(), 2, "10"),
            "another term may predate writes"
        );
        assert!(!m.is_current(&Key::new("ns", "b"), 1, "10"));
        for rv in 11..=14 {
            m.mark_current(&key(), 1, &rv.to_string());
        }
        assert!(!m.is_current(&key(), 1, "10"), "bounded: the oldest goes");
        assert!((11..=14).all(|rv| m.is_current(&key(), 1, &rv.to_string())));
        // A new term starts from nothing.
        m.mark_current(&key(), 2, "20");
        assert!(!m.is_current(&key(), 1, "14") && !m.is_current(&key(), 2, "14"));
        assert!(m.is_current(&key(), 2, "20"));
        // Gone, or its shard lost: forgotten.
        m.forget(&key());
        assert!(!m.is_current(&key(), 2, "20"));
        m.mark_current(&key(), 3, "30");
        m.forget_where(|k| k.namespace == "ns");
        assert!(!m.is_current(&key(), 3, "30"));
    }

    /// A Job as the operator creates them: controlled by a GpuJob.
    fn job(name: &str, uid: &str) -> Job {
        let mut j = Job::default();
        j.metadata.name = Some(name.into());
        j.metadata.namespace = Some("ns".into());
        j.metadata.uid = Some(uid.into());
        j.metadata.owner_references = Some(vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                api_version: "gpujob.dev/v1".into(),
                kind: "GpuJob".into(),
                name: "a".into(),
                uid: "gpujob-uid".into(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            },
        ]);
        j
    }

    /// [`job`] as the plan sees it.
    fn seen_job(name: &str, uid: &str) -> SeenJob {
        SeenJob::of(&job(name, uid)).unwrap()
    }

    fn names(jobs: &[Arc<SeenJob>]) -> Vec<String> {
        let mut n: Vec<_> = jobs.iter().map(|j| j.name.clone()).collect();
        n.sort();
        n
    }

    #[test]
    fn a_stale_cache_is_replaced_by_the_written_object_until_it_catches_up() {
        let m = WriteMemory::default();
        m.status_written(&key(), "10".into(), Arc::new(gj("11", "u")));
        assert_eq!(
            m.gpujob(&key(), || Some(Arc::new(gj("10", "u"))))
                .unwrap()
                .metadata
                .resource_version
                .as_deref(),
            Some("11")
        );
        // A second write computed from the remembered object: both old versions are stale.
        m.status_written(&key(), "11".into(), Arc::new(gj("12", "u")));
        assert_eq!(
            m.gpujob(&key(), || Some(Arc::new(gj("10", "u"))))
                .unwrap()
                .metadata
                .resource_version
                .as_deref(),
            Some("12")
        );
        assert_eq!(
            m.gpujob(&key(), || Some(Arc::new(gj("11", "u"))))
                .unwrap()
                .metadata
                .resource_version
                .as_deref(),
            Some("12")
        );
        // Caught up, or someone else wrote: the cache wins and the memory is dropped.
        assert_eq!(
            m.gpujob(&key(), || Some(Arc::new(gj("13", "u"))))
                .unwrap()
                .metadata
                .resource_version
                .as_deref(),
            Some("13")
        );
        assert_eq!(
            m.gpujob(&key(), || Some(Arc::new(gj("10", "u"))))
                .unwrap()
                .metadata
                .resource_version
                .as_deref(),
            Some("10")
        );
        assert_eq!(m.entries(), 0, "nothing left to remember, nothing kept");
    }

    #[test]
    fn a_recreated_gpujob_does_not_inherit_memory() {
        let m = WriteMemory::default();
        m.status_written(&key(), "10".into(), Arc::new(gj("11", "old")));
        assert_eq!(
            m.gpujob(&key(), || Some(Arc::new(gj("10", "new"))))
                .unwrap()
                .metadata
                .uid
                .as_deref(),
            Some("new")
        );
        assert_eq!(m.entries(), 0);
    }

    #[test]
    fn created_and_deleted_jobs_show_until_the_cache_agrees() {
        let m = WriteMemory::default();
        let owner = gj("1", "u");
        m.job_created(&key(), &owner, &seen_job("a-2", "j2"));
        m.job_deleted(&key(), &owner, "a-1".into(), "j1".into(), false);
        let cached = vec![Arc::new(seen_job("a-1", "j1"))];
        let shown = m.jobs(&key(), "u", || cached);
        assert_eq!(names(&shown), vec!["a-2"]);
        assert_eq!(*shown[0], seen_job("a-2", "j2"), "shown as it was created");
        // The cache catches up on both.
        let cached = vec![Arc::new(seen_job("a-2", "j2"))];
        assert_eq!(names(&m.jobs(&key(), "u", || cached)), vec!["a-2"]);
        let cached = vec![
            Arc::new(seen_job("a-1", "j1-recreated")),
            Arc::new(seen_job("a-2", "j2")),
        ];
        assert_eq!(
            names(&m.jobs(&key(), "u", || cached)),
            vec!["a-1", "a-2"],
            "memory was cleared when the cache caught up"
        );
        // Another GpuJob uid sees nothing remembered.
        assert!(m.jobs(&key(), "other", Vec::new).is_empty());
        assert_eq!(m.entries(), 0, "nothing left to remember, nothing kept");
    }

    #[test]
    fn a_job_deleted_in_the_foreground_shows_as_deleting_until_the_cache_says_so() {
        let m = WriteMemory::default();
        let owner = gj("1", "u");
        m.job_deleted(&key(), &owner, "a-1".into(), "j1".into(), true);
        let shown = m.jobs(&key(), "u", || vec![Arc::new(seen_job("a-1", "j1"))]);
        assert_eq!(names(&shown), vec!["a-1"], "it stays while its pods go");
        assert!(shown[0].deleting());
        let mut cached = seen_job("a-1", "j1");
        cached.deletion_timestamp = shown[0].deletion_timestamp.clone();
        let shown = m.jobs(&key(), "u", || vec![Arc::new(cached)]);
        assert!(shown[0].deleting());
        assert_eq!(m.entries(), 0, "the cache caught up: nothing kept");
    }

    #[test]
    fn a_job_deleted_in_the_foreground_before_the_cache_saw_it_shows_as_deleting_until_it_is_gone()
    {
        let m = WriteMemory::default();
        let owner = gj("1", "u");
        // Adopted (the cache had not seen it), then deleted to be replaced: its pods are
        // still stopping, so the next attempt must not take it for gone.
        m.job_created(&key(), &owner, &seen_job("a-1", "j1"));
        m.job_deleted(&key(), &owner, "a-1".into(), "j1".into(), true);
        let shown = m.jobs(&key(), "u", Vec::new);
        assert_eq!(names(&shown), vec!["a-1"]);
        assert!(shown[0].deleting(), "deleting");
        // Its deletion event says it is gone.
        m.job_seen(&key(), &job("a-1", "j1"), true);
        assert!(m.jobs(&key(), "u", Vec::new).is_empty());
        assert_eq!(m.entries(), 0);
        // Or a relist, when the watch missed it.
        m.job_created(&key(), &owner, &seen_job("a-1", "j1"));
        m.job_deleted(&key(), &owner, "a-1".into(), "j1".into(), true);
        assert_eq!(m.jobs_relisted(|_| true), vec![key()]);
        assert!(m.jobs(&key(), "u", Vec::new).is_empty());
        assert_eq!(m.entries(), 0);
        // A Job deleted in the background (finished) is gone at once.
        m.job_created(&key(), &owner, &seen_job("a-1", "j1"));
        m.job_deleted(&key(), &owner, "a-1".into(), "j1".into(), false);
        assert!(m.jobs(&key(), "u", Vec::new).is_empty());
    }

    #[test]
    fn a_pod_let_go_shows_so_until_the_cache_shows_it_let_go_or_gone() {
        let m = WriteMemory::default();
        let owner = gj("1", "u");
        let pod = |uid: &str, gated: bool| {
            Arc::new(SeenPod {
                name: format!("a-1-{uid}"),
                uid: Some(uid.into()),
                gated,
                ..SeenPod::default()
            })
        };
        m.pod_ungated(&key(), &owner, "p1".into());
        let shown = m.pods(&key(), "u", || vec![pod("p1", true), pod("p2", true)]);
        assert!(!shown[0].gated, "let go, though the cache lags");
        assert!(shown[1].gated, "another pod is as cached");
        assert_eq!(m.entries(), 1);
        // The cache shows it let go: nothing left to remember.
        let shown = m.pods(&key(), "u", || vec![pod("p1", false)]);
        assert!(!shown[0].gated);
        assert_eq!(m.entries(), 0);
        // Or gone.
        m.pod_ungated(&key(), &owner, "p1".into());
        assert!(m.pods(&key(), "u", Vec::new).is_empty());
        assert_eq!(m.entries(), 0);
        // Another GpuJob of the same name (another uid) is not shown anything.
        m.pod_ungated(&key(), &owner, "p1".into());
        let shown = m.pods(&key(), "other-uid", || vec![pod("p1", true)]);
        assert!(shown[0].gated);
    }

    #[test]
    fn a_gated_job_shows_gated_until_the_cache_shows_a_newer_version() {
        let m = WriteMemory::default();
        let owner = gj("1", "u");
        // Made suspended and without the gate by an earlier version.
        let suspended = |rv: &str| {
            let mut j = job("a-1", "j1");
            j.metadata.resource_version = Some(rv.into());
            j.spec = Some(k8s_openapi::api::batch::v1::JobSpec {
                suspend: Some(true),
                ..Default::default()
            });
            j
        };
        let cached = |rv: &str| vec![Arc::new(SeenJob::of(&suspended(rv)).unwrap())];
        m.job_gated(&key(), &owner, "a-1".into(), "5".into(), None);
        let shown = m.jobs(&key(), "u", || cached("5"));
        assert!(
            !shown[0].suspended && shown[0].gated,
            "gated and started, though the cache lags"
        );
        assert_eq!(shown[0].resource_version.as_deref(), Some("5"));
        // A newer version (suspended again by someone, say) is the cache's word.
        let shown = m.jobs(&key(), "u", || cached("6"));
        assert!(shown[0].suspended && !shown[0].gated);
        assert_eq!(m.entries(), 0, "nothing left to remember");
        // The watch delivering a newer version forgets it too, as does its deletion.
        m.job_gated(&key(), &owner, "a-1".into(), "5".into(), None);
        m.job_seen(&key(), &suspended("5"), false);
        assert_eq!(
            m.entries(),
            1,
            "the version the patch replaced settles nothing"
        );
        m.job_seen(&key(), &suspended("7"), false);
        assert_eq!(m.entries(), 0);
        m.job_gated(&key(), &owner, "a-1".into(), "5".into(), None);
        m.job_seen(&key(), &suspended("5"), true);
        assert_eq!(m.entries(), 0);
        // Handed to a Kueue queue: gated and queued, still suspended (Kueue starts it).
        m.job_gated(
            &key(),
            &owner,
            "a-1".into(),
            "5".into(),
            Some("team".into()),
        );
        let shown = m.jobs(&key(), "u", || cached("5"));
        assert!(shown[0].suspended && shown[0].gated && shown[0].queued());
        assert_eq!(shown[0].queue.as_deref(), Some("team"));
    }

    #[test]
    fn a_relist_of_jobs_drops_what_is_remembered_about_jobs_and_names_their_gpujobs() {
        let m = WriteMemory::default();
        let owner = gj("1", "u");
        m.job_created(&key(), &owner, &seen_job("a-2", "j2"));
        m.status_written(&key(), "1".into(), Arc::new(gj("2", "u")));
        let other = Key::new("ns", "b");
        m.job_deleted(&other, &gj("1", "v"), "b-1".into(), "k1".into(), true);
        let mut keys = m.jobs_relisted(|_| true);
        keys.sort();
        assert_eq!(keys, vec![key(), other.clone()]);
        // Jobs as the relist has them (none), not as remembered.
        assert!(m.jobs(&key(), "u", Vec::new).is_empty());
        assert!(m.jobs(&other, "v", Vec::new).is_empty());
        // The status write is still remembered until the GpuJob cache catches up.
        let stale = Arc::new(gj("1", "u"));
        let seen = m.gpujob(&key(), || Some(stale)).unwrap();
        assert_eq!(seen.metadata.resource_version.as_deref(), Some("2"));
        assert!(
            m.jobs_relisted(|_| true).is_empty(),
            "nothing about Jobs left"
        );
    }

    #[test]
    fn a_relist_of_one_shards_jobs_keeps_what_is_remembered_about_other_shards_jobs() {
        let m = WriteMemory::default();
        let here = Key::new("ns-a", "a");
        let there = Key::new("ns-b", "b");
        m.job_created(&here, &gj("1", "u"), &seen_job("a-1", "j1"));
        m.job_created(&there, &gj("1", "v"), &seen_job("b-1", "k1"));
        assert_eq!(
            m.jobs_relisted(|k| k.namespace == "ns-a"),
            vec![here.clone()]
        );
        assert!(
            m.jobs(&here, "u", Vec::new).is_empty(),
            "as the relist has them"
        );
        assert_eq!(
            names(&m.jobs(&there, "v", Vec::new)),
            vec!["b-1"],
            "the other shard's watch did not relist: its created Job still shows"
        );
    }

    #[test]
    fn a_job_read_past_a_lagging_cache_shows_until_the_cache_or_a_relist_speaks() {
        // The soak's stuck `Replacing`: the Job was read (the cache, relisting, did not
        // have it), deleted, and gone before the relist ended; with no event for a Job
        // the cache never had, only this memory could name the GpuJob again.
        let m = WriteMemory::default();
        let owner = gj("1", "u");
        m.job_read(&key(), &owner, &seen_job("a-1", "j1"));
        let names = |jobs: Vec<Arc<SeenJob>>| -> Vec<String> {
            jobs.iter().map(|j| j.name.clone()).collect()
        };
        assert_eq!(
            names(m.jobs(&key(), "u", Vec::new)),
            vec!["a-1"],
            "shown without a second read"
        );
        assert_eq!(
            m.jobs_relisted(|_| true),
            vec![key()],
            "the relist names its GpuJob"
        );
        assert!(
            m.jobs(&key(), "u", Vec::new).is_empty(),
            "as the relist has it"
        );

        // A delete refused for its resourceVersion drops the copy: read again next time.
        m.job_read(&key(), &owner, &seen_job("a-1", "j1"));
        m.job_stale(&key(), "a-1");
        assert!(m.jobs(&key(), "u", Vec::new).is_empty());
        assert_eq!(m.entries(), 0);
    }

    #[test]
    fn the_watch_forgets_writes_once_the_cache_holds_them_without_a_reconcile() {
        let m = WriteMemory::default();
        let owner = gj("1", "u");
        m.status_written(&key(), "1".into(), Arc::new(gj("2", "u")));
        m.status_written(&key(), "2".into(), Arc::new(gj("3", "u")));
        // An event of a version this operator replaced changes nothing.
        m.gpujob_seen(&key(), &gj("2", "u"));
        let seen = m.gpujob(&key(), || Some(Arc::new(gj("2", "u")))).unwrap();
        assert_eq!(seen.metadata.resource_version.as_deref(), Some("3"));
        // The written version (or a newer one) arrives: forgotten.
        m.gpujob_seen(&key(), &gj("3", "u"));
        assert_eq!(
            m.entries(),
            0,
            "nothing left once the cache holds the write"
        );

        m.job_created(&key(), &owner, &seen_job("a-1", "j1"));
        m.job_deleted(&key(), &owner, "a-0".into(), "j0".into(), false);
        m.job_deleted(&key(), &owner, "a-2".into(), "j2".into(), true);
        // Another Job's events, and a still-running view of the one being deleted,
        // keep what they do not answer.
        m.job_seen(&key(), &job("a-9", "j9"), false);
        m.job_seen(&key(), &job("a-2", "j2"), false);
        m.job_seen(&key(), &job("a-0", "j0"), false);
        assert_eq!(m.entries(), 1);
        m.job_seen(&key(), &job("a-1", "j1"), false);
        let mut deleting = job("a-2", "j2");
        deleting.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::now()),
        );
        m.job_seen(&key(), &deleting, false);
        m.job_seen(&key(), &job("a-0", "j0"), true);
        assert_eq!(
            m.entries(),
            0,
            "each Job's event settled what was remembered of it"
        );

        // Created and deleted before the cache showed it: the delete event settles it.
        m.job_created(&key(), &owner, &seen_job("a-3", "j3"));
        m.job_seen(&key(), &job("a-3", "other-uid"), true);
        assert_eq!(
            m.entries(),
            1,
            "a delete of another Job of that name settles nothing"
        );
        m.job_seen(&key(), &job("a-3", "j3"), true);
        assert_eq!(m.entries(), 0);
    }

    #[test]
    fn a_mark_of_an_ended_term_leaves_the_current_terms_marks() {
        let m = WriteMemory::default();
        m.mark_current(&key(), 2, "10");
        m.mark_current(&key(), 1, "9");
        assert!(m.is_current(&key(), 2, "10"));
        assert!(!m.is_current(&key(), 1, "9"));
        // A later term starts afresh.
        m.mark_current(&key(), 3, "11");
        assert!(!m.is_current(&key(), 2, "10") && m.is_current(&key(), 3, "11"));
    }

    #[test]
    fn forgetting_a_shard_keeps_the_others() {
        let m = WriteMemory::default();
        m.status_written(&key(), "10".into(), Arc::new(gj("11", "u")));
        let other = Key::new("other", "b");
        m.job_created(&other, &gj("1", "v"), &seen_job("b-1", "j"));
        m.forget_where(|k| k.namespace == "ns");
        assert_eq!(m.entries(), 1);
    }
}
