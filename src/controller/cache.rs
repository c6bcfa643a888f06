//! The Jobs of every GpuJob, indexed by the owning GpuJob's UID, fed by a watch of Jobs
//! labelled `gpujob.dev/uid`. Only Jobs with a controller owner reference to a GpuJob
//! count; labels alone can be copied by anyone.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, RwLock};

use k8s_openapi::api::batch::v1::{Job, JobCondition, JobStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use kube::runtime::watcher::Event;
use tokio::sync::watch;

use super::Key;
use super::job::controller_of;
use crate::api::{ANNOTATION_GENERATION, LABEL_ATTEMPT};

#[derive(Debug, Default)]
struct Inner {
    /// owner uid → its Jobs (a handful at most: attempts kept)
    by_owner: HashMap<Box<str>, Vec<Cached>>,
    /// job "ns/name" → owner uid, to move or drop a Job whose owner changed
    owner_of: HashMap<Box<str>, Box<str>>,
    /// A relist in progress: the new contents, swapped in at InitDone.
    relist: Option<Vec<Cached>>,
}

/// A cached Job: what the plan reads of it (see [`Cached::of`]), in fields of its own
/// rather than in a `Job`. Ten thousand GpuJobs mean ten thousand of these, and a `Job`,
/// even trimmed, keeps inline room for a spec (2.2 KB), and its label and annotation
/// maps a node with room for eleven entries each: 4.8 KB per cached Job, against about
/// 0.8 KB here (`examples/footprint.rs`).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Cached {
    name: Box<str>,
    namespace: Box<str>,
    uid: Option<Box<str>>,
    resource_version: Option<Box<str>>,
    deletion_timestamp: Option<Time>,
    /// The attempt label's value.
    attempt: Option<Box<str>>,
    /// The generation annotation's value.
    generation: Option<Box<str>>,
    /// The controlling GpuJob (always there for an indexed Job).
    owner: Option<Box<OwnerReference>>,
    /// `None`: the Job had no status; otherwise its conditions and completion time.
    status: Option<(Box<[JobCondition]>, Option<Time>)>,
}

impl Cached {
    /// What the plan reads of a Job, and nothing else: name, uid and resourceVersion
    /// (delete preconditions), deletion, the controlling owner, the attempt label, the
    /// generation annotation, and the conditions and completion time. `None` for a Job
    /// without a name.
    pub(super) fn of(job: &Job) -> Option<Cached> {
        let m = &job.metadata;
        let boxed = |s: &Option<String>| s.as_deref().map(Box::from);
        let value = |map: &Option<BTreeMap<String, String>>, key: &str| {
            map.as_ref()
                .and_then(|m| m.get(key))
                .map(|v| Box::from(v.as_str()))
        };
        Some(Cached {
            name: m.name.as_deref()?.into(),
            namespace: m.namespace.as_deref().unwrap_or_default().into(),
            uid: boxed(&m.uid),
            resource_version: boxed(&m.resource_version),
            deletion_timestamp: m.deletion_timestamp.clone(),
            attempt: value(&m.labels, LABEL_ATTEMPT),
            generation: value(&m.annotations, ANNOTATION_GENERATION),
            owner: controller_of(job).map(|o| Box::new(o.clone())),
            status: job.status.as_ref().map(|s| {
                (
                    s.conditions.clone().unwrap_or_default().into_boxed_slice(),
                    s.completion_time.clone(),
                )
            }),
        })
    }

    /// The Job as the plan sees it (no spec, only the kept metadata and status).
    pub(super) fn job(&self) -> Job {
        let one = |key: &str, value: &Option<Box<str>>| {
            value
                .as_ref()
                .map(|v| BTreeMap::from([(key.to_owned(), v.to_string())]))
        };
        let string = |s: &Option<Box<str>>| s.as_ref().map(|s| s.to_string());
        Job {
            metadata: ObjectMeta {
                name: Some(self.name.to_string()),
                namespace: Some(self.namespace.to_string()),
                uid: string(&self.uid),
                resource_version: string(&self.resource_version),
                deletion_timestamp: self.deletion_timestamp.clone(),
                labels: one(LABEL_ATTEMPT, &self.attempt),
                annotations: one(ANNOTATION_GENERATION, &self.generation),
                owner_references: self.owner.as_ref().map(|o| vec![(**o).clone()]),
                ..ObjectMeta::default()
            },
            spec: None,
            status: self
                .status
                .as_ref()
                .map(|(conditions, completion_time)| JobStatus {
                    conditions: (!conditions.is_empty()).then(|| conditions.to_vec()),
                    completion_time: completion_time.clone(),
                    ..JobStatus::default()
                }),
        }
    }

    pub(super) fn name(&self) -> &str {
        &self.name
    }

    pub(super) fn uid(&self) -> Option<&str> {
        self.uid.as_deref()
    }

    /// The GpuJob that controls it.
    fn owner_key(&self) -> Option<Key> {
        Some(Key::new(&self.namespace, &self.owner.as_ref()?.name))
    }

    /// "ns/name"
    fn key(&self) -> Box<str> {
        format!("{}/{}", self.namespace, self.name).into()
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
                if let Some((relist, cached)) = inner.relist.as_mut().zip(Cached::of(job)) {
                    relist.push(cached);
                }
                Vec::new()
            }
            Event::InitDone => {
                let owners = |inner: &Inner| -> Vec<Key> {
                    inner
                        .by_owner
                        .values()
                        .flatten()
                        .filter_map(Cached::owner_key)
                        .collect()
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
                if let Some(cached) = Cached::of(job) {
                    insert(&mut inner, cached);
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
            .map(|jobs| jobs.iter().map(|j| Arc::new(j.job())).collect())
            .unwrap_or_default()
    }

    /// Resolves once the first list has been loaded.
    pub async fn wait_ready(&self) {
        let mut rx = self.ready.subscribe();
        let _ = rx.wait_for(|ready| *ready).await;
    }
}

/// Indexes `job`, if a GpuJob controls it.
fn insert(inner: &mut Inner, job: Cached) {
    let Some(uid) = job.owner.as_ref().map(|o| Box::<str>::from(o.uid.as_str())) else {
        return;
    };
    inner.owner_of.insert(job.key(), uid.clone());
    let jobs = inner.by_owner.entry(uid).or_default();
    jobs.retain(|j| j.name != job.name);
    jobs.push(job);
}

fn remove(inner: &mut Inner, key: &str) {
    if let Some(uid) = inner.owner_of.remove(key)
        && let Some(jobs) = inner.by_owner.get_mut(&uid)
    {
        jobs.retain(|j| j.key().as_ref() != key);
        if jobs.is_empty() {
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
