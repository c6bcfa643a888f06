//! The Jobs of every GpuJob, indexed by the owning GpuJob's UID, fed by a watch of Jobs
//! labelled `gpujob.dev/uid`. Only Jobs with a controller owner reference to a GpuJob
//! count; labels alone can be copied by anyone.

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::api::batch::v1::{Job, JobCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::watcher::Event;
use serde::{Deserialize, Serialize};
use tracing::error;

use super::record;
use super::table::{self, Owned, Record};
use crate::api::{Devices, Topology};
use crate::controller::Key;
use crate::controller::job::controller_of;
use crate::controller::seen_job::{SeenJob, SeenJobStatus};
use crate::controller::view::scope::Scope;

/// A cached Job controlled by a GpuJob, in one allocation ([`record`]): the owner's uid,
/// the namespace, the owner's name and the Job's name, then the JSON of the rest of what
/// the plan reads ([`Kept`]): a few hundred bytes, where even a `Job` stripped to the
/// same fields keeps inline room for a spec, label and annotation maps and a small
/// allocation per string. `benches/examples/footprint.rs` measures the index whole.
#[derive(Debug, Clone, PartialEq)]
pub(in crate::controller) struct Cached(Box<[u8]>);

/// The identifying strings of a [`Cached`] Job.
struct Fields<'a> {
    owner_uid: &'a str,
    namespace: &'a str,
    owner: &'a str,
    name: &'a str,
}

/// A [`SeenJob`] besides its names, in short JSON keys: what a plan reads.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Kept {
    #[serde(rename = "u", default, skip_serializing_if = "Option::is_none")]
    uid: Option<String>,
    #[serde(rename = "r", default, skip_serializing_if = "Option::is_none")]
    resource_version: Option<String>,
    #[serde(rename = "d", default, skip_serializing_if = "Option::is_none")]
    deletion_timestamp: Option<Time>,
    /// Only while true: a running Job says nothing.
    #[serde(rename = "p", default, skip_serializing_if = "std::ops::Not::not")]
    suspended: bool,
    /// Only while false: every Job this version builds is gated.
    #[serde(rename = "ng", default, skip_serializing_if = "std::ops::Not::not")]
    ungated: bool,
    #[serde(rename = "gp", default, skip_serializing_if = "Option::is_none")]
    gpus: Option<i32>,
    #[serde(rename = "a", default, skip_serializing_if = "Option::is_none")]
    attempt: Option<i32>,
    #[serde(rename = "g", default, skip_serializing_if = "Option::is_none")]
    generation: Option<i64>,
    #[serde(rename = "f", default, skip_serializing_if = "Option::is_none")]
    failure_rules: Option<String>,
    #[serde(rename = "k", default, skip_serializing_if = "Option::is_none")]
    nodes: Option<i32>,
    #[serde(rename = "q", default, skip_serializing_if = "Option::is_none")]
    queue: Option<String>,
    #[serde(rename = "dv", default, skip_serializing_if = "Option::is_none")]
    devices: Option<Devices>,
    #[serde(rename = "pg", default, skip_serializing_if = "Option::is_none")]
    pod_group: Option<String>,
    #[serde(rename = "tp", default, skip_serializing_if = "Option::is_none")]
    topology: Option<Topology>,
    #[serde(rename = "mb", default, skip_serializing_if = "Option::is_none")]
    managed_by: Option<String>,
    #[serde(rename = "c", default, skip_serializing_if = "Vec::is_empty")]
    conditions: Vec<JobCondition>,
    #[serde(rename = "t", default, skip_serializing_if = "Option::is_none")]
    completion_time: Option<Time>,
    #[serde(rename = "n", default, skip_serializing_if = "Option::is_none")]
    active: Option<i32>,
    #[serde(rename = "y", default, skip_serializing_if = "Option::is_none")]
    ready: Option<i32>,
    #[serde(rename = "st", default, skip_serializing_if = "Option::is_none")]
    start_time: Option<Time>,
    #[serde(rename = "m", default, skip_serializing_if = "Option::is_none")]
    terminating: Option<i32>,
}

impl Cached {
    /// `None` for a Job without a name or namespace, or not controlled by a GpuJob.
    pub(in crate::controller) fn of_job(job: &Job) -> Option<Cached> {
        Cached::of(&SeenJob::of(job)?)
    }

    pub(in crate::controller) fn of(seen: &SeenJob) -> Option<Cached> {
        let status = &seen.status;
        let kept = Kept {
            uid: seen.uid.clone(),
            resource_version: seen.resource_version.clone(),
            deletion_timestamp: seen.deletion_timestamp.clone(),
            suspended: seen.suspended,
            ungated: !seen.gated,
            gpus: seen.gpus,
            attempt: seen.attempt,
            generation: seen.generation,
            failure_rules: seen.failure_rules.clone(),
            nodes: seen.nodes,
            queue: seen.queue.clone(),
            devices: seen.devices.clone(),
            pod_group: seen.pod_group.clone(),
            topology: seen.topology.clone(),
            managed_by: seen.managed_by.clone(),
            conditions: status.conditions.clone(),
            completion_time: status.completion_time.clone(),
            active: status.active,
            ready: status.ready,
            start_time: status.start_time.clone(),
            terminating: status.terminating,
        };
        let names = [
            seen.owner_uid.as_str(),
            &seen.namespace,
            &seen.owner,
            &seen.name,
        ];
        let packed = serde_json::to_vec(&kept)
            .map_err(|e| e.to_string())
            .and_then(|json| {
                record::pack(names, &json)
                    .ok_or_else(|| "a name or uid longer than 64 KiB".to_owned())
            });
        match packed {
            Ok(packed) => Some(Cached(packed)),
            Err(e) => {
                // Cannot happen for a value the API server accepted; if it did, the Job
                // would be missing from the cache rather than the process gone.
                error!(
                    job = seen.name,
                    namespace = seen.namespace,
                    "cannot cache the Job: {e}"
                );
                None
            }
        }
    }

    fn fields(&self) -> Option<(Fields<'_>, &[u8])> {
        let ([owner_uid, namespace, owner, name], kept) = record::unpack(&self.0)?;
        Some((
            Fields {
                owner_uid,
                namespace,
                owner,
                name,
            },
            kept,
        ))
    }

    /// The names and the decoded rest.
    fn kept(&self) -> Option<(Fields<'_>, Kept)> {
        let (names, kept) = self.fields()?;
        match serde_json::from_slice(kept) {
            Ok(kept) => Some((names, kept)),
            Err(e) => {
                error!(
                    job = names.name,
                    namespace = names.namespace,
                    "cannot read the cached Job: {e}"
                );
                None
            }
        }
    }

    /// The Job as the plan sees it.
    pub(in crate::controller) fn seen(&self) -> Option<SeenJob> {
        let (names, kept) = self.kept()?;
        Some(SeenJob {
            name: names.name.to_owned(),
            namespace: names.namespace.to_owned(),
            owner: names.owner.to_owned(),
            owner_uid: names.owner_uid.to_owned(),
            uid: kept.uid,
            resource_version: kept.resource_version,
            deletion_timestamp: kept.deletion_timestamp,
            suspended: kept.suspended,
            gated: !kept.ungated,
            gpus: kept.gpus,
            attempt: kept.attempt,
            generation: kept.generation,
            failure_rules: kept.failure_rules,
            nodes: kept.nodes,
            queue: kept.queue,
            devices: kept.devices,
            pod_group: kept.pod_group,
            topology: kept.topology,
            managed_by: kept.managed_by,
            status: SeenJobStatus {
                conditions: kept.conditions,
                completion_time: kept.completion_time,
                active: kept.active,
                ready: kept.ready,
                start_time: kept.start_time,
                terminating: kept.terminating,
            },
        })
    }

    pub(in crate::controller) fn uid(&self) -> Option<String> {
        self.kept()?.1.uid
    }

    fn owner(&self) -> Option<Key> {
        self.fields().map(|(n, _)| Key::new(n.namespace, n.owner))
    }
}

impl Record for Cached {
    fn names(&self) -> Option<table::Names<'_>> {
        let (n, _) = self.fields()?;
        Some(table::Names {
            owner_uid: n.owner_uid,
            namespace: n.namespace,
            name: n.name,
        })
    }
}

/// The cached Jobs, found by their controlling GpuJob's uid and by their own namespace
/// and name.
#[derive(Debug, Default)]
pub struct JobIndex {
    table: Owned<Cached>,
}

/// The GpuJob that controls `job`, as (key, uid).
pub fn owner_of(job: &Job) -> Option<(Key, String)> {
    let ns = job.metadata.namespace.as_deref()?;
    let owner = controller_of(job)?;
    Some((Key::new(ns, &owner.name), owner.uid.clone()))
}

impl JobIndex {
    /// Applies one event of the watch of `part` (everything, or one shard); returns the
    /// GpuJobs to reconcile because of it: the one that had the Job (an owner reference
    /// can be rewritten) and the one that has it now. A relist (the watch started again,
    /// or could not resume, e.g. kube-apiserver restarted) is applied at once when
    /// complete, replacing everything of `part`, and then every GpuJob whose Jobs it
    /// changed is returned: one that had or has a Job that came, went or differs (another
    /// resourceVersion) from the one cached.
    pub fn apply(&self, event: &Event<Job>, part: &Scope) -> Vec<Key> {
        let mut keys = BTreeSet::new();
        self.table.apply(event, part, Cached::of_job, |old, new| {
            keys.extend(old.and_then(Cached::owner));
            keys.extend(new.and_then(Cached::owner));
        });
        if let Event::Apply(job) | Event::Delete(job) = event {
            // Its controller, even when the Job is not (or no longer) kept.
            keys.extend(owner_of(job).map(|(k, _)| k));
        }
        keys.into_iter().collect()
    }

    /// The watch of `part` stopped: what it filled goes (and its relist, if one was
    /// under way).
    pub fn drop_part(&self, part: &Scope) {
        self.table.drop_part(part);
    }

    /// The Jobs controlled by the GpuJob with `uid`.
    pub fn jobs_of(&self, uid: &str) -> Vec<Arc<SeenJob>> {
        self.table.of_owner(uid, |c| c.seen().map(Arc::new))
    }

    /// The GpuJob that controls the cached Job `namespace/name` (a pod's Job, say).
    pub fn gpujob_of(&self, namespace: &str, name: &str) -> Option<Key> {
        self.table.find(namespace, name, Cached::owner)
    }

    /// The cached Job `namespace/name`.
    pub fn job(&self, namespace: &str, name: &str) -> Option<SeenJob> {
        self.table.find(namespace, name, Cached::seen)
    }

    /// How many Jobs are cached.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Resolves once the first list has been loaded.
    pub async fn wait_ready(&self) {
        self.table.wait_ready().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{
        ANNOTATION_FAILURE_RULES, ANNOTATION_GENERATION, LABEL_ATTEMPT, LABEL_KUEUE_QUEUE,
    };
    use k8s_openapi::api::batch::v1::{JobSpec, JobStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use std::collections::BTreeMap;

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
        assert!(idx.apply(&Event::Init, &Scope::All).is_empty());
        assert!(
            idx.apply(
                &Event::InitApply(job("a-1", Some(("a", "u1")))),
                &Scope::All
            )
            .is_empty()
        );
        idx.apply(&Event::InitApply(job("stray", None)), &Scope::All);
        assert!(
            idx.jobs_of("u1").is_empty(),
            "a relist shows only when complete"
        );
        assert_eq!(
            idx.apply(&Event::InitDone, &Scope::All),
            vec![Key::new("ns", "a")],
            "then its owners are reconciled"
        );
        assert_eq!(idx.jobs_of("u1").len(), 1);
        assert_eq!(idx.gpujob_of("ns", "a-1"), Some(Key::new("ns", "a")));
        assert_eq!(idx.gpujob_of("ns", "stray"), None, "not kept");
        assert_eq!(idx.gpujob_of("other", "a-1"), None);

        assert_eq!(
            idx.apply(&Event::Apply(job("a-2", Some(("a", "u1")))), &Scope::All),
            vec![Key::new("ns", "a")]
        );
        assert_eq!(idx.jobs_of("u1").len(), 2);
        idx.apply(&Event::Delete(job("a-1", Some(("a", "u1")))), &Scope::All);
        let names: Vec<_> = idx.jobs_of("u1").iter().map(|j| j.name.clone()).collect();
        assert_eq!(names, vec!["a-2"]);
        // An owner reference rewritten to another GpuJob moves the Job.
        idx.apply(&Event::Apply(job("a-2", Some(("b", "u2")))), &Scope::All);
        assert!(idx.jobs_of("u1").is_empty());
        assert_eq!(idx.jobs_of("u2").len(), 1);
        assert_eq!(idx.gpujob_of("ns", "a-2"), Some(Key::new("ns", "b")));
        // A relist replaces everything; owners that lost or gained Jobs are reconciled.
        idx.apply(&Event::Init, &Scope::All);
        idx.apply(
            &Event::InitApply(job("c-1", Some(("c", "u3")))),
            &Scope::All,
        );
        assert_eq!(
            idx.apply(&Event::InitDone, &Scope::All),
            vec![Key::new("ns", "b"), Key::new("ns", "c")]
        );
        assert!(idx.jobs_of("u2").is_empty());
    }

    #[test]
    fn a_relist_names_only_the_gpujobs_whose_jobs_it_changed() {
        let at = |name: &str, owner: (&str, &str), rv: &str| {
            let mut j = job(name, Some(owner));
            j.metadata.resource_version = Some(rv.into());
            j
        };
        let idx = JobIndex::default();
        idx.apply(
            &Event::Apply(at("same-1", ("same", "u1"), "1")),
            &Scope::All,
        );
        idx.apply(
            &Event::Apply(at("moved-1", ("moved", "u2"), "2")),
            &Scope::All,
        );
        idx.apply(
            &Event::Apply(at("gone-1", ("gone", "u3"), "3")),
            &Scope::All,
        );
        idx.apply(
            &Event::Apply(at("regone-1", ("regone", "u4"), "4")),
            &Scope::All,
        );
        idx.apply(&Event::Init, &Scope::All);
        idx.apply(
            &Event::InitApply(at("same-1", ("same", "u1"), "1")),
            &Scope::All,
        );
        idx.apply(
            &Event::InitApply(at("moved-1", ("moved", "u2"), "7")),
            &Scope::All,
        );
        idx.apply(
            &Event::InitApply(at("new-1", ("new", "u5"), "8")),
            &Scope::All,
        );
        // The same Job, now controlled by another GpuJob: both are named.
        idx.apply(
            &Event::InitApply(at("regone-1", ("other", "u6"), "4")),
            &Scope::All,
        );
        assert_eq!(
            idx.apply(&Event::InitDone, &Scope::All),
            ["gone", "moved", "new", "other", "regone"]
                .map(|n| Key::new("ns", n))
                .to_vec()
        );
        assert_eq!(idx.jobs_of("u1").len(), 1, "kept as listed");
        assert!(idx.jobs_of("u3").is_empty());
    }

    #[test]
    fn a_shards_relist_replaces_its_jobs_alone_and_a_stopped_shard_leaves() {
        use crate::controller::view::scope::ns_of;
        use crate::shard::ShardMap;
        let map = Arc::new(ShardMap::even(2));
        let (a, b) = (ns_of(0, 2), ns_of(1, 2));
        let at = |ns: &str, name: &str, owner: (&str, &str)| {
            let mut j = job(name, Some(owner));
            j.metadata.namespace = Some(ns.to_owned());
            j
        };
        let (zero, one) = (Scope::single(0, map.clone()), Scope::single(1, map));
        let idx = JobIndex::default();
        idx.apply(&Event::Init, &zero);
        idx.apply(&Event::InitApply(at(&a, "p-1", ("p", "u1"))), &zero);
        idx.apply(&Event::InitDone, &zero);
        idx.apply(&Event::Init, &one);
        idx.apply(&Event::InitApply(at(&b, "q-1", ("q", "u2"))), &one);
        idx.apply(&Event::InitDone, &one);
        // Shard 1 lists again and finds nothing: q's Job went, p's stays.
        idx.apply(&Event::Init, &one);
        assert_eq!(idx.apply(&Event::InitDone, &one), vec![Key::new(&b, "q")]);
        assert_eq!(idx.jobs_of("u1").len(), 1);
        assert!(idx.jobs_of("u2").is_empty());
        idx.drop_part(&zero);
        assert!(idx.is_empty());
    }

    #[test]
    fn a_cached_job_reads_back_as_what_the_plan_reads_of_it() {
        let time = |s: &str| Time(s.parse().unwrap());
        let mut plain = job("a-1", Some(("a", "u1")));
        let mut full = plain.clone();
        full.metadata.uid = Some("j1".into());
        full.metadata.resource_version = Some("7".into());
        full.metadata.deletion_timestamp = Some(time("2026-12-01T10:00:03Z"));
        full.metadata.labels = Some(BTreeMap::from([
            (LABEL_ATTEMPT.into(), "1".into()),
            ("team".into(), "a".into()),
            (LABEL_KUEUE_QUEUE.into(), "team-a".into()),
        ]));
        full.metadata.annotations = Some(BTreeMap::from([
            (
                ANNOTATION_FAILURE_RULES.into(),
                "FailGpuJob,Disruption".into(),
            ),
            (ANNOTATION_GENERATION.into(), "3".into()),
            ("note".into(), "x".into()),
        ]));
        if let Some(owners) = full.metadata.owner_references.as_mut() {
            owners[0].api_version = "gpujob.dev/v2".into();
            owners[0].block_owner_deletion = Some(true);
            owners.insert(
                0,
                OwnerReference {
                    api_version: "v1".into(),
                    kind: "ConfigMap".into(),
                    name: "c".into(),
                    uid: "u9".into(),
                    ..OwnerReference::default()
                },
            );
        }
        full.status = Some(JobStatus {
            active: Some(1),
            ready: Some(0),
            // Not kept: must not read back.
            failed: Some(1),
            start_time: Some(time("2026-12-01T10:00:00Z")),
            terminating: Some(2),
            completion_time: Some(time("2026-12-01T10:00:02Z")),
            conditions: Some(vec![JobCondition {
                type_: "Failed".into(),
                status: "True".into(),
                reason: Some("BackoffLimitExceeded".into()),
                message: Some("Job has reached the specified backoff limit".into()),
                last_transition_time: Some(time("2026-12-01T10:00:01Z")),
                ..JobCondition::default()
            }]),
            ..JobStatus::default()
        });
        plain.status = Some(JobStatus {
            terminating: Some(0),
            ..JobStatus::default()
        });
        let mut no_status = job("a-2", Some(("a", "u1")));
        // Created suspended and not started yet: kept; started: the same as no spec.
        let mut started = no_status.clone();
        no_status.spec = Some(JobSpec {
            suspend: Some(true),
            parallelism: Some(1),
            ..JobSpec::default()
        });
        started.spec = Some(JobSpec {
            suspend: Some(false),
            ..JobSpec::default()
        });
        let seen_full = SeenJob::of(&full).expect("controlled by a GpuJob");
        assert_eq!(
            (
                seen_full.owner.as_str(),
                seen_full.attempt,
                seen_full.generation
            ),
            ("a", Some(1), Some(3)),
            "the GpuJob controller, not the first owner"
        );
        assert_eq!(seen_full.status.terminating, Some(2));
        assert_eq!(seen_full.queue.as_deref(), Some("team-a"));
        assert_eq!(
            SeenJob::of(&plain).map(|s| s.status),
            Some(Default::default())
        );
        assert!(SeenJob::of(&no_status).is_some_and(|s| s.suspended));
        assert!(SeenJob::of(&started).is_some_and(|s| !s.suspended));
        for j in [full, plain, no_status, started] {
            let seen = SeenJob::of(&j).expect("controlled by a GpuJob");
            let cached = Cached::of(&seen).expect("packed");
            assert_eq!(cached.seen(), Some(seen), "a cached Job reads back as seen");
            assert_eq!(cached.uid(), j.metadata.uid);
        }
        assert_eq!(
            Cached::of_job(&job("stray", None)),
            None,
            "not controlled by a GpuJob"
        );
    }

    #[test]
    fn the_cache_keeps_what_the_plan_reads_and_drops_the_rest() {
        use crate::api::GpuJob;
        use crate::controller::job::{attempt_of, desired_job};
        use crate::controller::plan::{JobState, seen_state};
        use k8s_openapi::api::batch::v1::{JobCondition, JobStatus};
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;

        // With every part a Job may say: devices, a topology, a gang, another manager.
        let mut gj = GpuJob::new(
            "a",
            serde_json::from_value(serde_json::json!({"image": "i", "gpus": 1, "v2": {
                "nodes": 2,
                "devices": {"exactly": {"deviceClassName": "gpu.example.com"}},
                "topology": {"level": "example.com/rack"},
            }}))
            .unwrap(),
        );
        gj.metadata.namespace = Some("ns".into());
        gj.metadata.uid = Some("u1".into());
        gj.metadata.generation = Some(4);
        let mut full = desired_job(&gj, 2);
        crate::controller::job::join_gang(&mut full);
        if let Some(spec) = full.spec.as_mut() {
            spec.managed_by = Some("example.com/elsewhere".into());
        }
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
                idx.apply(&Event::Init, &Scope::All);
                idx.apply(&Event::InitApply(full.clone()), &Scope::All);
                idx.apply(&Event::InitDone, &Scope::All);
            } else {
                idx.apply(&Event::Apply(full.clone()), &Scope::All);
            }
            let cached = idx.jobs_of("u1");
            let cached = cached.first().expect("indexed by its owner");
            assert_eq!(
                Some(cached.as_ref()),
                SeenJob::of(&full).as_ref(),
                "the same as the full Job seen"
            );
            assert!(
                !cached.suspended && cached.gated,
                "created running, its pods gated"
            );
            assert_eq!(cached.gpus, Some(2), "one device on each of two nodes");
            assert!(cached.devices.is_some() && cached.topology.is_some());
            assert_eq!(cached.pod_group.as_deref(), Some("a-2"));
            assert_eq!(cached.managed_by.as_deref(), Some("example.com/elsewhere"));
            assert_eq!(cached.name, "a-2");
            assert_eq!(cached.uid.as_deref(), Some("j1"));
            assert_eq!(cached.resource_version.as_deref(), Some("7"));
            assert_eq!(cached.attempt, attempt_of(&full));
            assert_eq!(cached.generation, Some(4));
            assert!(matches!(seen_state(cached), JobState::Complete { .. }));
        }
    }
}
