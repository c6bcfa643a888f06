//! The pods of every GpuJob's attempts, indexed by the GpuJob's uid from their
//! `gpujob.dev/uid` label, fed by a watch of pods with that label. It only tells a plan
//! that a pod waits at the gate, or that the scheduler found no node for one, so that a
//! read is due: the gate itself lets a pod go only after a quorum read (`plan/gate.rs`),
//! never from this cache, which may lag; the scheduler's words are read afresh too.

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::Event;
use tracing::error;

use super::JobIndex;
use super::record;
use super::table::{self, Owned, Record};
use crate::controller::Key;
use crate::controller::seen_pod::SeenPod;
use crate::controller::view::scope::Scope;

/// A cached pod, in one allocation ([`record`]): the GpuJob's uid, the namespace, the
/// controlling Job's name, the pod's name, its uid, resourceVersion, Job's uid and node
/// (empty when not bound), then two bytes of flags and, when it has one, its attempt (4
/// bytes): about 170 bytes for real names and uids, plus the node's name (measured
/// before it was kept). `benches/examples/footprint.rs` measures the index whole.
#[derive(Debug, Clone, PartialEq)]
pub(in crate::controller) struct Cached(Box<[u8]>);

const GATED: u16 = 1;
const BOUND: u16 = 1 << 1;
const TERMINAL: u16 = 1 << 2;
const DELETING: u16 = 1 << 3;
// Which optional strings are there (an empty field and a missing one differ).
const HAS_UID: u16 = 1 << 4;
const HAS_RESOURCE_VERSION: u16 = 1 << 5;
const HAS_JOB: u16 = 1 << 6;
const HAS_JOB_UID: u16 = 1 << 7;
const UNSCHEDULABLE: u16 = 1 << 8;

/// The strings of a [`Cached`] pod, and its flags and attempt.
struct Fields<'a> {
    owner_uid: &'a str,
    namespace: &'a str,
    job: Option<&'a str>,
    name: &'a str,
    uid: Option<&'a str>,
    resource_version: Option<&'a str>,
    job_uid: Option<&'a str>,
    /// Empty: not bound (a node's name is never empty).
    node: Option<&'a str>,
    flags: u16,
    attempt: Option<i32>,
}

impl Cached {
    /// `None` for a pod without a name or namespace, or without the GpuJob uid label.
    pub(in crate::controller) fn of_pod(pod: &Pod) -> Option<Cached> {
        Cached::of(&SeenPod::of(pod)?)
    }

    pub(in crate::controller) fn of(seen: &SeenPod) -> Option<Cached> {
        let flag = |on: bool, bit: u16| if on { bit } else { 0 };
        let flags = flag(seen.gated, GATED)
            | flag(seen.bound, BOUND)
            | flag(seen.terminal, TERMINAL)
            | flag(seen.deleting, DELETING)
            | flag(seen.uid.is_some(), HAS_UID)
            | flag(seen.resource_version.is_some(), HAS_RESOURCE_VERSION)
            | flag(seen.job.is_some(), HAS_JOB)
            | flag(seen.job_uid.is_some(), HAS_JOB_UID)
            | flag(seen.unschedulable, UNSCHEDULABLE);
        let mut tail = flags.to_le_bytes().to_vec();
        if let Some(attempt) = seen.attempt {
            tail.extend_from_slice(&attempt.to_le_bytes());
        }
        let fields = [
            seen.owner_uid.as_str(),
            &seen.namespace,
            seen.job.as_deref().unwrap_or_default(),
            &seen.name,
            seen.uid.as_deref().unwrap_or_default(),
            seen.resource_version.as_deref().unwrap_or_default(),
            seen.job_uid.as_deref().unwrap_or_default(),
            seen.node.as_deref().unwrap_or_default(),
        ];
        match record::pack(fields, &tail) {
            Some(packed) => Some(Cached(packed)),
            None => {
                // Cannot happen for a pod the API server accepted; if it did, the pod
                // would be missing from the cache rather than the process gone.
                error!(
                    pod = seen.name,
                    namespace = seen.namespace,
                    "cannot cache the pod: a name or uid longer than 64 KiB"
                );
                None
            }
        }
    }

    fn fields(&self) -> Option<Fields<'_>> {
        let (
            [
                owner_uid,
                namespace,
                job,
                name,
                uid,
                resource_version,
                job_uid,
                node,
            ],
            tail,
        ) = record::unpack(&self.0)?;
        let (flags, attempt) = tail.split_first_chunk::<2>()?;
        let flags = u16::from_le_bytes(*flags);
        let attempt = match attempt {
            [] => None,
            bytes => Some(i32::from_le_bytes(bytes.try_into().ok()?)),
        };
        Some(Fields {
            owner_uid,
            namespace,
            job: present(flags, HAS_JOB, job),
            name,
            uid: present(flags, HAS_UID, uid),
            resource_version: present(flags, HAS_RESOURCE_VERSION, resource_version),
            job_uid: present(flags, HAS_JOB_UID, job_uid),
            node: (!node.is_empty()).then_some(node),
            flags,
            attempt,
        })
    }

    /// The pod as the plan sees it.
    pub(in crate::controller) fn seen(&self) -> Option<SeenPod> {
        let f = self.fields()?;
        let owned = |s: Option<&str>| s.map(str::to_owned);
        Some(SeenPod {
            name: f.name.to_owned(),
            namespace: f.namespace.to_owned(),
            owner_uid: f.owner_uid.to_owned(),
            uid: owned(f.uid),
            resource_version: owned(f.resource_version),
            attempt: f.attempt,
            job: owned(f.job),
            job_uid: owned(f.job_uid),
            gated: f.flags & GATED != 0,
            bound: f.flags & BOUND != 0,
            unschedulable: f.flags & UNSCHEDULABLE != 0,
            node: owned(f.node),
            terminal: f.flags & TERMINAL != 0,
            deleting: f.flags & DELETING != 0,
            cluster: None,
        })
    }
}

/// `field` if `flags` has `bit`.
fn present(flags: u16, bit: u16, field: &str) -> Option<&str> {
    (flags & bit != 0).then_some(field)
}

impl Record for Cached {
    fn names(&self) -> Option<table::Names<'_>> {
        let f = self.fields()?;
        Some(table::Names {
            owner_uid: f.owner_uid,
            namespace: f.namespace,
            name: f.name,
        })
    }
}

/// Of a pod that was `old` and is `new` (`None`: not there), the versions whose
/// GpuJob's gate has something to do: `new` newly seen waiting at the gate (a read may
/// let it go); `old` gone, or `new` no longer able to run when `old` could (an attempt
/// waiting for another's pods to stop may go on), or its deletion begun on its node.
/// Also `new` newly found unplaceable by the scheduler: the plan reads why
/// (`Read::Placement`). Anything else (scheduled, Running,
/// Ready, a new resourceVersion) changes nothing the plan reads. A name taken by another
/// pod (another uid) is the old one gone and a new one seen.
fn gate_cares<'a>(old: Option<&'a SeenPod>, new: Option<&'a SeenPod>) -> Vec<&'a SeenPod> {
    match (old, new) {
        (Some(o), Some(n)) if o.uid != n.uid => {
            let mut due = gate_cares(Some(o), None);
            due.extend(gate_cares(None, Some(n)));
            due
        }
        (None, Some(n)) => (n.waits_at_gate() || n.unschedulable)
            .then_some(n)
            .into_iter()
            .collect(),
        (Some(o), None) => vec![o],
        // Or a pod that may run begins its deletion on a node: the next attempt may
        // wait for it, and says where (a lost node: `plan/gate.rs`).
        (Some(o), Some(n)) => ((o.may_run() && !n.may_run())
            || (o.stopping_on().is_none() && n.stopping_on().is_some())
            || (!o.unschedulable && n.unschedulable))
            .then_some(n)
            .into_iter()
            .collect(),
        (None, None) => Vec::new(),
    }
}

/// The GpuJob whose attempt `attempt`'s Job is named `job` (`<gpujob>-<attempt>`, when
/// that name was not shortened).
fn gpujob_named(job: &str, attempt: Option<i32>) -> Option<String> {
    let k = attempt?;
    let gpujob = job.strip_suffix(&format!("-{k}"))?;
    (crate::controller::job::job_name(gpujob, k) == job).then(|| gpujob.to_owned())
}

/// The cached pods, found by their GpuJob's uid and by their own namespace and name.
#[derive(Debug, Default)]
pub struct PodIndex {
    table: Owned<Cached>,
}

impl PodIndex {
    /// Applies one event of the watch of `part` (everything, or one shard); returns the
    /// GpuJobs to reconcile because of it: those of the pods the gate cares about
    /// ([`gate_cares`]): of an event, or, when a relist completes, of each pod of `part`
    /// it changed. A GpuJob is found through its pod's controlling Job in `jobs`: a
    /// pod whose Job is not cached yet queues nothing (the Job's own event will, and
    /// that reconcile finds the pod here, cached before `jobs` was asked).
    pub fn apply(&self, event: &Event<Pod>, part: &Scope, jobs: &JobIndex) -> Vec<Key> {
        // (namespace, Job, the GpuJob its name says when the pod ended) of each pod the
        // gate cares about: noted under the write lock, looked up in `jobs` after it.
        let mut due: BTreeSet<(String, String, Option<String>)> = BTreeSet::new();
        self.table.apply(event, part, Cached::of_pod, |old, new| {
            let (old, new) = (old.and_then(Cached::seen), new.and_then(Cached::seen));
            for pod in gate_cares(old.as_ref(), new.as_ref()) {
                let ended = !pod.may_run() || new.as_ref().is_none_or(|n| n.uid != pod.uid);
                if let Some(job) = &pod.job {
                    let named = ended.then(|| gpujob_named(job, pod.attempt)).flatten();
                    due.insert((pod.namespace.clone(), job.clone(), named));
                }
            }
        });
        // A pod that outlived its Job (deleted in the background, say, its pod left
        // stopping on a lost node) ends unheard through `jobs`: its Job's name says
        // whose it was. (A GpuJob of that name that is gone, or another, is looked at for
        // nothing.)
        let keys: BTreeSet<Key> = due
            .iter()
            .filter_map(|(namespace, job, named)| {
                jobs.gpujob_of(namespace, job)
                    .or_else(|| named.as_ref().map(|n| Key::new(namespace, n)))
            })
            .collect();
        keys.into_iter().collect()
    }

    /// The watch of `part` stopped: what it filled goes (and its relist, if one was
    /// under way).
    pub fn drop_part(&self, part: &Scope) {
        self.table.drop_part(part);
    }

    /// The pods labelled with the GpuJob uid `uid`.
    pub fn pods_of(&self, uid: &str) -> Vec<Arc<SeenPod>> {
        self.table.of_owner(uid, |c| c.seen().map(Arc::new))
    }

    /// How many pods are cached.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{LABEL_ATTEMPT, LABEL_UID, SCHEDULING_GATE};
    use k8s_openapi::api::batch::v1::Job;
    use k8s_openapi::api::core::v1::{PodCondition, PodSchedulingGate, PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
    use std::collections::BTreeMap;

    fn owner(kind: &str, name: &str, uid: &str) -> OwnerReference {
        let api_version = if kind == "Job" {
            "batch/v1"
        } else {
            "gpujob.dev/v1"
        };
        OwnerReference {
            api_version: api_version.into(),
            kind: kind.into(),
            name: name.into(),
            uid: uid.into(),
            controller: Some(true),
            block_owner_deletion: None,
        }
    }

    /// Job `name` of GpuJob `gpujob` (uid `uid`), in `ns`.
    fn job(ns: &str, name: &str, gpujob: &str, uid: &str) -> Job {
        let mut j = Job::default();
        j.metadata.name = Some(name.into());
        j.metadata.namespace = Some(ns.into());
        j.metadata.owner_references = Some(vec![owner("GpuJob", gpujob, uid)]);
        j
    }

    /// Pod `name` of Job `job` (uid `<job>-uid`) and GpuJob uid `uid`, in `ns`, at
    /// resourceVersion 1: created gated, as every attempt's pod is.
    fn pod(ns: &str, name: &str, job: &str, uid: &str) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some(name.into());
        p.metadata.namespace = Some(ns.into());
        p.metadata.uid = Some(format!("{name}-uid"));
        p.metadata.resource_version = Some("1".into());
        p.metadata.labels = Some(BTreeMap::from([
            (LABEL_UID.into(), uid.into()),
            (LABEL_ATTEMPT.into(), "1".into()),
        ]));
        p.metadata.owner_references = Some(vec![owner("Job", job, &format!("{job}-uid"))]);
        p.spec = Some(PodSpec {
            scheduling_gates: Some(vec![PodSchedulingGate {
                name: SCHEDULING_GATE.into(),
            }]),
            ..PodSpec::default()
        });
        p
    }

    /// `p` at resourceVersion `rv`, changed by `change`.
    fn next(p: &Pod, rv: &str, change: impl FnOnce(&mut Pod)) -> Pod {
        let mut p = p.clone();
        p.metadata.resource_version = Some(rv.into());
        change(&mut p);
        p
    }

    fn ungated(p: &mut Pod) {
        if let Some(s) = p.spec.as_mut() {
            s.scheduling_gates = None;
        }
    }

    fn bound(p: &mut Pod) {
        ungated(p);
        if let Some(s) = p.spec.as_mut() {
            s.node_name = Some("gpu-1".into());
        }
    }

    fn phase(phase: &str) -> impl FnOnce(&mut Pod) {
        move |p: &mut Pod| {
            p.status = Some(PodStatus {
                phase: Some(phase.into()),
                ..PodStatus::default()
            })
        }
    }

    /// The scheduler found no node for it.
    fn unplaceable(p: &mut Pod) {
        p.status.get_or_insert_default().conditions = Some(vec![PodCondition {
            type_: "PodScheduled".into(),
            status: "False".into(),
            reason: Some("Unschedulable".into()),
            message: Some("0/3 nodes are available".into()),
            ..Default::default()
        }]);
    }

    fn deleting(p: &mut Pod) {
        p.metadata.deletion_timestamp = Some(Time("2026-12-05T00:00:00Z".parse().unwrap()));
    }

    /// A Job index that knows Job `a-1` of GpuJob `a` (uid `u1`) in `ns`.
    fn jobs_of_a(ns: &str) -> JobIndex {
        let jobs = JobIndex::default();
        jobs.apply(&Event::Apply(job(ns, "a-1", "a", "u1")), &Scope::All);
        jobs
    }

    #[test]
    fn a_pod_queues_its_gpujob_only_for_what_the_gate_reads() {
        let jobs = jobs_of_a("ns");
        let idx = PodIndex::default();
        let a = vec![Key::new("ns", "a")];
        let apply = |p: &Pod| idx.apply(&Event::Apply(p.clone()), &Scope::All, &jobs);

        let gated = pod("ns", "a-1-x", "a-1", "u1");
        assert_eq!(apply(&gated), a, "newly seen, waiting at the gate");
        assert_eq!(idx.pods_of("u1").len(), 1);
        assert!(
            apply(&next(&gated, "2", |_| {})).is_empty(),
            "still waiting"
        );
        // Let go, placed, running, ready: status churn.
        let free = next(&gated, "3", ungated);
        assert!(apply(&free).is_empty());
        // Unless the scheduler finds no node for it: the plan reads why, once.
        let unplaced = next(&free, "3a", unplaceable);
        assert_eq!(apply(&unplaced), a, "newly unschedulable");
        assert!(apply(&next(&unplaced, "3b", |_| {})).is_empty(), "still");
        assert!(idx.pods_of("u1")[0].unschedulable);
        let placed = next(&free, "4", bound);
        assert!(apply(&placed).is_empty());
        let running = next(&placed, "5", phase("Running"));
        assert!(apply(&running).is_empty());
        let ready = next(&running, "6", |p| {
            if let Some(s) = p.status.as_mut() {
                s.pod_ip = Some("10.0.0.7".into());
            }
        });
        assert!(apply(&ready).is_empty());
        // Bound and being deleted: its kubelet may still run it, and the next attempt
        // may wait for it (on a lost node, says so).
        let stopping = next(&ready, "7", deleting);
        assert_eq!(apply(&stopping), a);
        assert!(apply(&next(&stopping, "7a", |_| {})).is_empty());
        // Finished: it could run and no longer can.
        let failed = next(&stopping, "8", phase("Failed"));
        assert_eq!(apply(&failed), a);
        assert!(apply(&next(&failed, "9", |_| {})).is_empty());
        assert_eq!(
            idx.apply(&Event::Delete(failed), &Scope::All, &jobs),
            a,
            "gone"
        );
        assert!(idx.pods_of("u1").is_empty());

        // A gated pod whose deletion begins never runs: the gate may go on.
        let other = pod("ns", "a-1-y", "a-1", "u1");
        assert_eq!(apply(&other), a);
        assert_eq!(apply(&next(&other, "2", deleting)), a);
        // A pod that never waited (let go before this replica saw it) queues nothing
        // when first seen.
        let seen_running = next(&pod("ns", "a-1-z", "a-1", "u1"), "3", bound);
        assert!(apply(&seen_running).is_empty());
        // One first seen when the scheduler had already found no node for it (a relist, a
        // shard's first list) queues its GpuJob.
        let seen_unplaced = next(&pod("ns", "a-1-w", "a-1", "u1"), "3", |p| {
            ungated(p);
            unplaceable(p);
        });
        assert_eq!(apply(&seen_unplaced), a);
        assert_eq!(
            idx.apply(&Event::Delete(seen_unplaced), &Scope::All, &jobs),
            a
        );
        // The label taken off: gone from the cache, as if deleted.
        let unlabelled = next(&seen_running, "4", |p| p.metadata.labels = None);
        assert_eq!(apply(&unlabelled), a);
        assert_eq!(idx.len(), 1);
    }

    #[test]
    fn a_pod_whose_job_is_unknown_queues_only_its_end_and_is_cached_all_the_same() {
        let jobs = jobs_of_a("ns");
        let idx = PodIndex::default();
        let unknown = pod("ns", "b-1-x", "b-1", "u2");
        assert!(
            idx.apply(&Event::Apply(unknown.clone()), &Scope::All, &jobs)
                .is_empty(),
            "the Job's own event queues the GpuJob"
        );
        assert_eq!(idx.pods_of("u2").len(), 1, "which then finds the pod here");
        // The same for a pod of no Job at all, or of a Job of another namespace (whose
        // end is heard by its Job's name, below).
        let orphan = next(&pod("ns", "c-x", "c", "u3"), "1", |p| {
            p.metadata.owner_references = None;
        });
        let elsewhere = pod("other", "a-1-x", "a-1", "u1");
        for (p, at_end) in [(orphan, vec![]), (elsewhere, vec![Key::new("other", "a")])] {
            assert!(
                idx.apply(&Event::Apply(p.clone()), &Scope::All, &jobs)
                    .is_empty()
            );
            assert_eq!(idx.apply(&Event::Delete(p), &Scope::All, &jobs), at_end);
        }
        // A pod of an attempt whose Job is gone: its end is heard through its Job's name
        // (attempt label 1, Job b-1: GpuJob b); its arrival is not.
        let outlived = next(&pod("ns", "b-1-y", "b-1", "u2"), "1", |p| {
            if let Some(l) = p.metadata.labels.as_mut() {
                l.insert(LABEL_ATTEMPT.into(), "1".into());
            }
            bound(p);
        });
        assert!(
            idx.apply(&Event::Apply(outlived.clone()), &Scope::All, &jobs)
                .is_empty()
        );
        assert_eq!(
            idx.apply(&Event::Delete(outlived), &Scope::All, &jobs),
            vec![Key::new("ns", "b")]
        );
        assert_eq!(gpujob_named("b-1", Some(2)), None);
        assert_eq!(gpujob_named("b-1", None), None);
        // Once the Job is cached, the pod's going is heard.
        jobs.apply(&Event::Apply(job("ns", "b-1", "b", "u2")), &Scope::All);
        assert_eq!(
            idx.apply(&Event::Delete(unknown), &Scope::All, &jobs),
            vec![Key::new("ns", "b")]
        );
    }

    #[test]
    fn a_name_taken_by_another_pod_is_one_gone_and_one_new() {
        let jobs = jobs_of_a("ns");
        jobs.apply(&Event::Apply(job("ns", "b-1", "b", "u2")), &Scope::All);
        let idx = PodIndex::default();
        let running = next(&pod("ns", "p", "a-1", "u1"), "2", bound);
        idx.apply(&Event::Apply(running), &Scope::All, &jobs);
        let replaced = next(&pod("ns", "p", "b-1", "u2"), "3", |p| {
            p.metadata.uid = Some("another".into());
        });
        assert_eq!(
            idx.apply(&Event::Apply(replaced), &Scope::All, &jobs),
            vec![Key::new("ns", "a"), Key::new("ns", "b")]
        );
        assert!(idx.pods_of("u1").is_empty());
        assert_eq!(idx.pods_of("u2").len(), 1);
    }

    #[test]
    fn a_shards_relist_replaces_its_pods_alone_and_queues_what_the_gate_cares_about() {
        use crate::controller::view::scope::ns_of;
        use crate::shard::ShardMap;
        let map = Arc::new(ShardMap::even(2));
        let (a, b) = (ns_of(0, 2), ns_of(1, 2));
        let (zero, one) = (Scope::single(0, map.clone()), Scope::single(1, map));
        let jobs = JobIndex::default();
        for (ns, gpujob, uid) in [(&a, "g", "u1"), (&a, "h", "u2"), (&b, "k", "u3")] {
            let name = format!("{gpujob}-1");
            jobs.apply(&Event::Apply(job(ns, &name, gpujob, uid)), &Scope::All);
        }
        let idx = PodIndex::default();
        let list = |part: &Scope, pods: &[Pod]| {
            idx.apply(&Event::Init, part, &jobs);
            for p in pods {
                idx.apply(&Event::InitApply(p.clone()), part, &jobs);
            }
            idx.apply(&Event::InitDone, part, &jobs)
        };
        let waiting = pod(&a, "g-1-w", "g-1", "u1");
        let running = next(&pod(&a, "g-1-r", "g-1", "u1"), "2", bound);
        let gone = pod(&a, "h-1-x", "h-1", "u2");
        let stays = pod(&b, "k-1-s", "k-1", "u3");
        assert_eq!(
            list(&zero, &[waiting.clone(), running.clone(), gone]),
            vec![Key::new(&a, "g"), Key::new(&a, "h")],
            "the first list: the pods waiting at the gate"
        );
        assert_eq!(list(&one, &[stays]), vec![Key::new(&b, "k")]);

        // Shard 0 lists again: `waiting` as it was, `running` running on (another
        // resourceVersion), h's pod gone.
        let running_on = next(&running, "9", phase("Running"));
        assert_eq!(
            list(&zero, &[waiting.clone(), running_on.clone()]),
            vec![Key::new(&a, "h")]
        );
        // Again: `running` finished, `waiting` deleted before it ran.
        let finished = next(&running_on, "10", phase("Succeeded"));
        let withdrawn = next(&waiting, "11", deleting);
        assert_eq!(list(&zero, &[withdrawn, finished]), vec![Key::new(&a, "g")]);
        assert_eq!(idx.pods_of("u1").len(), 2);
        assert!(idx.pods_of("u2").is_empty());
        assert_eq!(idx.pods_of("u3").len(), 1, "shard 1's pods untouched");
        assert!(
            list(&zero, &[]).contains(&Key::new(&a, "g")),
            "pods gone in a relist"
        );

        idx.drop_part(&one);
        assert!(idx.is_empty());
        // A relist begun and abandoned leaves nothing behind.
        idx.apply(&Event::Init, &one, &jobs);
        idx.drop_part(&one);
        assert!(
            idx.apply(&Event::InitDone, &one, &jobs).is_empty(),
            "no relist under way"
        );
        assert!(idx.is_empty());
    }

    #[test]
    fn a_cached_pod_reads_back_as_seen() {
        let full = next(&pod("ns", "a-2-x", "a-2", "u1"), "17", |p| {
            bound(p);
            deleting(p);
            phase("Failed")(p);
            if let Some(l) = p.metadata.labels.as_mut() {
                l.insert(LABEL_ATTEMPT.into(), "2".into());
                l.insert("team".into(), "a".into());
            }
        });
        let bare = next(&pod("ns", "a-x", "a-1", "u1"), "1", |p| {
            p.metadata.uid = None;
            p.metadata.resource_version = None;
            p.metadata.owner_references = None;
            p.spec = None;
            if let Some(l) = p.metadata.labels.as_mut() {
                l.remove(LABEL_ATTEMPT);
            }
        });
        // Empty strings are kept apart from missing ones.
        let empty = next(&pod("ns", "a-e", "", "u1"), "", |p| {
            p.metadata.uid = Some(String::new());
            if let Some(o) = p.metadata.owner_references.as_mut() {
                o[0].uid = String::new();
            }
        });
        let gated = pod("ns", "a-1-x", "a-1", "u1");
        let unplaced = next(&pod("ns", "a-1-u", "a-1", "u1"), "5", |p| {
            ungated(p);
            unplaceable(p);
        });
        let mut seen_all = Vec::new();
        for p in [full, bare, empty, gated, unplaced] {
            let seen = SeenPod::of(&p).expect("labelled with its GpuJob's uid");
            let cached = Cached::of(&seen).expect("packed");
            assert_eq!(cached.seen().as_ref(), Some(&seen), "{}", seen.name);
            assert_eq!(Cached::of_pod(&p), Some(cached));
            seen_all.push(seen);
        }
        assert_eq!(
            (seen_all[0].attempt, seen_all[0].bound, seen_all[0].terminal),
            (Some(2), true, true)
        );
        assert!(seen_all[0].node.is_some() && seen_all[1].node.is_none());
        assert_eq!(
            (seen_all[1].uid.as_deref(), seen_all[1].job.as_deref()),
            (None, None)
        );
        assert_eq!(seen_all[2].uid.as_deref(), Some(""));
        assert!(seen_all[3].waits_at_gate());
        assert!(seen_all[4].unschedulable && !seen_all[3].unschedulable);

        // Through the index, from an event and from a relist alike.
        for via_relist in [false, true] {
            let idx = PodIndex::default();
            let jobs = JobIndex::default();
            let all = [
                pod("ns", "a-1-x", "a-1", "u1"),
                next(&pod("ns", "a-1-y", "a-1", "u1"), "2", bound),
            ];
            if via_relist {
                idx.apply(&Event::Init, &Scope::All, &jobs);
                for p in &all {
                    idx.apply(&Event::InitApply(p.clone()), &Scope::All, &jobs);
                }
                idx.apply(&Event::InitDone, &Scope::All, &jobs);
            } else {
                for p in &all {
                    idx.apply(&Event::Apply(p.clone()), &Scope::All, &jobs);
                }
            }
            let mut cached: Vec<SeenPod> =
                idx.pods_of("u1").iter().map(|p| (**p).clone()).collect();
            cached.sort_by(|x, y| x.name.cmp(&y.name));
            let expected: Vec<SeenPod> = all.iter().filter_map(SeenPod::of).collect();
            assert_eq!(cached, expected);
        }
        let mut unlabelled = pod("ns", "x", "x-1", "u9");
        unlabelled.metadata.labels = None;
        assert_eq!(Cached::of_pod(&unlabelled), None, "not a GpuJob's pod");
    }
}
