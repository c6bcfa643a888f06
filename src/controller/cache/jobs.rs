//! The Jobs of every GpuJob, indexed by the owning GpuJob's UID, fed by a watch of Jobs
//! labelled `gpujob.dev/uid`. Only Jobs with a controller owner reference to a GpuJob
//! count; labels alone can be copied by anyone.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, RwLock};

use k8s_openapi::api::batch::v1::{Job, JobStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::watcher::Event;
use tokio::sync::watch;
use tracing::error;

use crate::api::{ANNOTATION_GENERATION, LABEL_ATTEMPT};
use crate::controller::Key;
use crate::controller::job::controller_of;

#[derive(Debug, Default)]
struct Inner {
    /// owner uid → the owner and its Jobs (a handful at most: attempts kept)
    by_owner: HashMap<Box<str>, Owned>,
    /// job "ns/name" → owner uid, to move or drop a Job whose owner changed
    owner_of: HashMap<Box<str>, Box<str>>,
    /// A relist in progress: the new contents, swapped in at InitDone.
    relist: Option<Vec<Indexed>>,
}

#[derive(Debug)]
struct Owned {
    owner: Key,
    jobs: Vec<Cached>,
}

/// A Job with what indexes it: its controlling GpuJob (key and uid).
#[derive(Debug)]
struct Indexed {
    owner: Key,
    uid: Box<str>,
    job: Cached,
}

impl Indexed {
    fn of(job: &Job) -> Option<Indexed> {
        let (owner, uid) = owner_of(job)?;
        Some(Indexed {
            owner,
            uid: uid.into(),
            job: Cached::of(job)?,
        })
    }
}

/// A cached Job: what the plan reads of it ([`trimmed`]), kept as its JSON and decoded
/// when read. Ten thousand GpuJobs mean ten thousand of these; a `Job`, even trimmed,
/// keeps inline room for a spec (2.2 KB), and its label and annotation maps a node with
/// room for eleven entries each, and its strings and conditions are small allocations of
/// their own: 4.8 KB per cached Job as a trimmed `Job`, 1.7 KB in fields of its own, about
/// 0.8 KB packed (`benches/examples/footprint.rs`).
#[derive(Debug, Clone, PartialEq)]
pub(in crate::controller) struct Cached {
    name: Box<str>,
    packed: Box<[u8]>,
}

impl Cached {
    /// `None` for a Job without a name.
    pub(in crate::controller) fn of(job: &Job) -> Option<Cached> {
        let name = job.metadata.name.as_deref()?;
        match serde_json::to_vec(&trimmed(job)) {
            Ok(bytes) => Some(Cached {
                name: name.into(),
                packed: bytes.into_boxed_slice(),
            }),
            Err(e) => {
                // Cannot happen for a value that was just decoded; if it did, the Job
                // would be missing from the cache rather than the process gone.
                error!(job = name, "cannot cache the Job: {e}");
                None
            }
        }
    }

    /// The Job as the plan sees it (no spec, only the kept metadata and status).
    pub(in crate::controller) fn job(&self) -> Option<Job> {
        match serde_json::from_slice(&self.packed) {
            Ok(job) => Some(job),
            Err(e) => {
                error!(job = %self.name, "cannot read the cached Job: {e}");
                None
            }
        }
    }

    pub(in crate::controller) fn name(&self) -> &str {
        &self.name
    }

    pub(in crate::controller) fn uid(&self) -> Option<String> {
        self.job()?.metadata.uid
    }
}

#[derive(Debug)]
pub struct JobIndex {
    inner: RwLock<Inner>,
    ready: watch::Sender<bool>,
}

impl Default for JobIndex {
    fn default() -> JobIndex {
        JobIndex {
            inner: RwLock::default(),
            ready: watch::channel(false).0,
        }
    }
}

/// The GpuJob that controls `job`, as (key, uid).
pub fn owner_of(job: &Job) -> Option<(Key, String)> {
    let ns = job.metadata.namespace.as_deref()?;
    let owner = controller_of(job)?;
    Some((Key::new(ns, &owner.name), owner.uid.clone()))
}

fn job_key(job: &Job) -> String {
    format!(
        "{}/{}",
        job.metadata.namespace.as_deref().unwrap_or_default(),
        job.metadata.name.as_deref().unwrap_or_default()
    )
}

impl JobIndex {
    /// Applies one watch event; returns the GpuJobs to reconcile because of it. A relist
    /// (after a watch could not resume, e.g. kube-apiserver restarted) is applied at
    /// once when complete, and then every GpuJob that had or has a Job is returned: its
    /// Jobs may have changed while nobody was watching.
    pub fn apply(&self, event: &Event<Job>) -> Vec<Key> {
        let mut inner = self.inner.write().unwrap_or_else(|p| p.into_inner());
        match event {
            Event::Init => {
                inner.relist = Some(Vec::new());
                Vec::new()
            }
            Event::InitApply(job) => {
                if let Some((relist, indexed)) = inner.relist.as_mut().zip(Indexed::of(job)) {
                    relist.push(indexed);
                }
                Vec::new()
            }
            Event::InitDone => {
                let owners = |inner: &Inner| -> Vec<Key> {
                    inner.by_owner.values().map(|o| o.owner.clone()).collect()
                };
                let mut keys: BTreeSet<Key> = owners(&inner).into_iter().collect();
                let jobs = inner.relist.take().unwrap_or_default();
                inner.by_owner.clear();
                inner.owner_of.clear();
                // Let go of the room the old contents needed (the relist may be smaller).
                inner.by_owner.shrink_to_fit();
                inner.owner_of.shrink_to_fit();
                for job in jobs {
                    insert(&mut inner, job);
                }
                keys.extend(owners(&inner));
                drop(inner);
                self.ready.send_replace(true);
                keys.into_iter().collect()
            }
            Event::Apply(job) => {
                remove(&mut inner, &job_key(job));
                let key = owner_of(job).map(|(k, _)| k);
                if let Some(indexed) = Indexed::of(job) {
                    insert(&mut inner, indexed);
                }
                key.into_iter().collect()
            }
            Event::Delete(job) => {
                remove(&mut inner, &job_key(job));
                owner_of(job).map(|(k, _)| k).into_iter().collect()
            }
        }
    }

    /// The Jobs controlled by the GpuJob with `uid`.
    pub fn jobs_of(&self, uid: &str) -> Vec<Arc<Job>> {
        let inner = self.inner.read().unwrap_or_else(|p| p.into_inner());
        inner
            .by_owner
            .get(uid)
            .map(|o| {
                o.jobs
                    .iter()
                    .filter_map(Cached::job)
                    .map(Arc::new)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Resolves once the first list has been loaded.
    pub async fn wait_ready(&self) {
        let mut rx = self.ready.subscribe();
        let _ = rx.wait_for(|ready| *ready).await;
    }
}

/// What the plan reads of a Job, and nothing else: name, uid and resourceVersion (delete
/// preconditions), deletion, the controlling owner, the attempt label, the generation
/// annotation, and the conditions and completion time.
fn trimmed(job: &Job) -> Job {
    let m = &job.metadata;
    let only = |map: &Option<BTreeMap<String, String>>, key: &str| {
        map.as_ref()
            .and_then(|map| map.get_key_value(key))
            .map(|(k, v)| BTreeMap::from([(k.clone(), v.clone())]))
    };
    Job {
        metadata: ObjectMeta {
            name: m.name.clone(),
            namespace: m.namespace.clone(),
            uid: m.uid.clone(),
            resource_version: m.resource_version.clone(),
            deletion_timestamp: m.deletion_timestamp.clone(),
            labels: only(&m.labels, LABEL_ATTEMPT),
            annotations: only(&m.annotations, ANNOTATION_GENERATION),
            owner_references: controller_of(job).map(|o| vec![o.clone()]),
            ..ObjectMeta::default()
        },
        spec: None,
        status: job.status.as_ref().map(|s| JobStatus {
            conditions: s.conditions.clone(),
            completion_time: s.completion_time.clone(),
            ..JobStatus::default()
        }),
    }
}

fn insert(inner: &mut Inner, indexed: Indexed) {
    let Indexed { owner, uid, job } = indexed;
    let key: Box<str> = format!("{}/{}", owner.namespace, job.name).into();
    inner.owner_of.insert(key, uid.clone());
    let owned = inner.by_owner.entry(uid).or_insert_with(|| Owned {
        owner,
        jobs: Vec::new(),
    });
    owned.jobs.retain(|j| j.name != job.name);
    owned.jobs.push(job);
}

fn remove(inner: &mut Inner, key: &str) {
    let name = key.split_once('/').map_or(key, |(_, name)| name);
    if let Some(uid) = inner.owner_of.remove(key)
        && let Some(owned) = inner.by_owner.get_mut(&uid)
    {
        owned.jobs.retain(|j| &*j.name != name);
        if owned.jobs.is_empty() {
            inner.by_owner.remove(&uid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    fn job(name: &str, owner: Option<(&str, &str)>) -> Job {
        let mut j = Job::default();
        j.metadata.name = Some(name.into());
        j.metadata.namespace = Some("ns".into());
        j.metadata.owner_references = owner.map(|(n, uid)| {
            vec![OwnerReference {
                api_version: "gpujob.dev/v1".into(),
                kind: "GpuJob".into(),
                name: n.into(),
                uid: uid.into(),
                controller: Some(true),
                block_owner_deletion: None,
            }]
        });
        j
    }

    #[test]
    fn indexes_by_controller_owner_and_follows_events() {
        let idx = JobIndex::default();
        assert!(idx.apply(&Event::Init).is_empty());
        assert!(
            idx.apply(&Event::InitApply(job("a-1", Some(("a", "u1")))))
                .is_empty()
        );
        idx.apply(&Event::InitApply(job("stray", None)));
        assert!(
            idx.jobs_of("u1").is_empty(),
            "a relist shows only when complete"
        );
        assert_eq!(
            idx.apply(&Event::InitDone),
            vec![Key::new("ns", "a")],
            "then its owners are reconciled"
        );
        assert_eq!(idx.jobs_of("u1").len(), 1);

        assert_eq!(
            idx.apply(&Event::Apply(job("a-2", Some(("a", "u1"))))),
            vec![Key::new("ns", "a")]
        );
        assert_eq!(idx.jobs_of("u1").len(), 2);
        idx.apply(&Event::Delete(job("a-1", Some(("a", "u1")))));
        let names: Vec<_> = idx
            .jobs_of("u1")
            .iter()
            .map(|j| j.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(names, vec!["a-2"]);
        // An owner reference rewritten to another GpuJob moves the Job.
        idx.apply(&Event::Apply(job("a-2", Some(("b", "u2")))));
        assert!(idx.jobs_of("u1").is_empty());
        assert_eq!(idx.jobs_of("u2").len(), 1);
        // A relist replaces everything, and owners that lost Jobs are reconciled too.
        idx.apply(&Event::Init);
        idx.apply(&Event::InitApply(job("c-1", Some(("c", "u3")))));
        assert_eq!(
            idx.apply(&Event::InitDone),
            vec![Key::new("ns", "b"), Key::new("ns", "c")]
        );
        assert!(idx.jobs_of("u2").is_empty());
    }

    #[test]
    fn the_cache_keeps_what_the_plan_reads_and_drops_the_rest() {
        use crate::api::GpuJob;
        use crate::controller::job::{attempt_of, desired_job, generation_of};
        use crate::controller::plan::{JobState, job_state};
        use k8s_openapi::api::batch::v1::{JobCondition, JobStatus};
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;

        let mut gj = GpuJob::new(
            "a",
            serde_json::from_value(serde_json::json!({"image": "i", "gpus": 1})).unwrap(),
        );
        gj.metadata.namespace = Some("ns".into());
        gj.metadata.uid = Some("u1".into());
        gj.metadata.generation = Some(4);
        let mut full = desired_job(&gj, 2);
        full.metadata.managed_fields = Some(vec![ManagedFieldsEntry::default()]);
        full.metadata.uid = Some("j1".into());
        full.metadata.resource_version = Some("7".into());
        full.status = Some(JobStatus {
            conditions: Some(vec![JobCondition {
                type_: "Complete".into(),
                status: "True".into(),
                ..JobCondition::default()
            }]),
            ..JobStatus::default()
        });
        assert!(full.spec.is_some());
        for via_relist in [false, true] {
            let idx = JobIndex::default();
            if via_relist {
                idx.apply(&Event::Init);
                idx.apply(&Event::InitApply(full.clone()));
                idx.apply(&Event::InitDone);
            } else {
                idx.apply(&Event::Apply(full.clone()));
            }
            let cached = idx.jobs_of("u1");
            let cached = cached.first().expect("indexed by its owner");
            assert_eq!(cached.spec, None, "the pod template is not kept");
            assert_eq!(cached.metadata.managed_fields, None);
            assert_eq!(
                cached.metadata.labels.as_ref().map(BTreeMap::len),
                Some(1),
                "of the labels, only the attempt"
            );
            assert_eq!(cached.metadata.name, full.metadata.name);
            assert_eq!(cached.metadata.uid.as_deref(), Some("j1"));
            assert_eq!(cached.metadata.resource_version.as_deref(), Some("7"));
            assert_eq!(attempt_of(cached), attempt_of(&full));
            assert_eq!(generation_of(cached), Some(4));
            assert_eq!(owner_of(cached), owner_of(&full));
            assert!(matches!(job_state(cached), JobState::Complete { .. }));
        }
    }
}
