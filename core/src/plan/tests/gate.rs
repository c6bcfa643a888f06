//! The gate at the pods (`plan/gate.rs`): every Job is created running with gated pods,
//! and only the plan lets a pod go, after a read, as the current attempt's. Also how
//! attempts are recognized (a Job this operator could not have made is a stray) and the
//! paths that went around the start gates before there was one at the pods.

use super::*;
use crate::api::{LABEL_KUEUE_QUEUE, SCHEDULING_GATE, UpdatePolicy};
use crate::seen_pod::SeenPod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// Attempt `attempt`'s Job as created: running, its pods gated.
pub(super) fn made(g: &GpuJob, attempt: i32) -> Job {
    let mut j = desired_job(g, attempt);
    j.metadata.uid = Some(format!("job-uid-{attempt}"));
    j.metadata.resource_version = Some(format!("{attempt}01"));
    j
}

/// A pod of attempt `attempt`'s Job (uid `job-uid-<attempt>`), gated unless `ungated`.
pub(super) fn pod(attempt: i32, n: u8) -> SeenPod {
    SeenPod {
        name: format!("train-{attempt}-{n}"),
        namespace: "ns".into(),
        owner_uid: "uid-1".into(),
        uid: Some(format!("pod-{attempt}-{n}")),
        resource_version: Some(format!("{attempt}{n}7")),
        attempt: Some(attempt),
        job: Some(format!("train-{attempt}")),
        job_uid: Some(format!("job-uid-{attempt}")),
        gated: true,
        bound: false,
        unschedulable: false,
        node: None,
        terminal: false,
        deleting: false,
        cluster: None,
    }
}

pub(super) fn ungated(mut p: SeenPod) -> SeenPod {
    p.gated = false;
    p.bound = true;
    p
}

/// What the plan sees: `cached` in the pod cache, `read` from a pod read (if any), the
/// reads this reconcile has made and the Nodes they found.
pub(super) struct Seen<'a> {
    g: &'a GpuJob,
    jobs: &'a [Job],
    cached: Vec<SeenPod>,
    read: Option<Vec<SeenPod>>,
    confirmed: bool,
    quota: bool,
    answer: Option<QuotaAnswer>,
    refused: Option<Refusal>,
    reads: Reads,
    nodes: Vec<NodeHealth>,
    settings: PlanSettings,
}

impl<'a> Seen<'a> {
    pub(super) fn new(g: &'a GpuJob, jobs: &'a [Job]) -> Seen<'a> {
        Seen {
            g,
            jobs,
            cached: Vec::new(),
            read: None,
            confirmed: true,
            quota: false,
            answer: None,
            refused: None,
            reads: Reads::every(),
            nodes: Vec::new(),
            settings: settings(),
        }
    }

    /// The operator reads and lets go pods on MultiKueue's worker clusters.
    pub(super) fn multikueue(mut self) -> Self {
        self.settings.multikueue = true;
        self
    }

    pub(super) fn cached(mut self, pods: &[SeenPod]) -> Self {
        self.cached = pods.to_vec();
        self
    }

    pub(super) fn read(mut self, pods: &[SeenPod]) -> Self {
        self.read = Some(pods.to_vec());
        self
    }

    /// The reads this reconcile has made (default: every one).
    pub(super) fn reads(mut self, reads: Reads) -> Self {
        self.reads = reads;
        self
    }

    /// Node `name`, as a Node read found it (`None`: not read).
    pub(super) fn node(mut self, name: &str, state: Option<NodeState>) -> Self {
        self.nodes = state
            .into_iter()
            .map(|state| NodeHealth {
                name: name.into(),
                state,
            })
            .collect();
        self
    }

    /// The API server refused a create of this reconcile so.
    fn refused(mut self, attempt: i32, reason: &'static str, message: &str) -> Self {
        self.refused = Some(Refusal {
            attempt,
            reason,
            message: message.to_owned(),
        });
        self
    }

    fn unconfirmed(mut self) -> Self {
        self.confirmed = false;
        self
    }

    pub(super) fn with_quota(mut self, answer: Option<QuotaAnswer>) -> Self {
        self.quota = true;
        self.answer = answer;
        self
    }

    pub(super) fn plan(&self, now: &str) -> Plan {
        let jobs = seen(self.jobs);
        plan(
            &Observed {
                gpujob: self.g,
                jobs: jobs.iter().collect(),
                termination: None,
                unschedulable: None,
                queue_wait: None,
                refused: self.refused.clone(),
                quota_required: self.quota,
                quota: self.answer.clone(),
                pods: self.read.clone(),
                cached_pods: self.cached.iter().collect(),
                confirmed: self.confirmed,
                term_start_due: false,
                reads: self.reads.clone(),
                nodes: self.nodes.clone(),
                now: t(now),
            },
            &self.settings,
        )
    }
}

pub(super) fn kinds(p: &Plan) -> Vec<&'static str> {
    p.actions.iter().map(Action::name).collect()
}

/// The pods the plan lets go: (name, resourceVersion).
fn ungates(p: &Plan) -> Vec<(&str, &str)> {
    p.actions
        .iter()
        .filter_map(|a| match a {
            Action::UngatePod {
                name,
                resource_version,
                ..
            } => Some((name.as_str(), resource_version.as_str())),
            _ => None,
        })
        .collect()
}

fn stray_deletes(p: &Plan) -> Vec<&str> {
    p.actions
        .iter()
        .filter_map(|a| match a {
            Action::DeleteJob {
                name,
                why: JobDeletion::Stray,
                ..
            } => Some(name.as_str()),
            _ => None,
        })
        .collect()
}

/// `g` after its first plan (attempt 1 created and recorded).
pub(super) fn attempt_one(g: &GpuJob) -> GpuJob {
    let p = run(g, &[], None, T0);
    assert_eq!(creates(&p), vec![1]);
    with_status(g.clone(), &p)
}

pub(super) const LATER: &str = "2026-11-30T06:00:02Z";

#[test]
fn a_new_attempts_job_is_created_running_with_its_pods_gated() {
    let g = gpujob(3);
    let p = run(&g, &[], None, T0);
    let Some(Action::CreateJob { job, .. }) = p.actions.first() else {
        panic!("{:?}", p.actions)
    };
    let spec = job.spec.as_ref().unwrap();
    assert_eq!(spec.suspend, None, "no second write starts it");
    let gates = spec
        .template
        .spec
        .as_ref()
        .unwrap()
        .scheduling_gates
        .clone();
    assert_eq!(
        gates
            .unwrap()
            .iter()
            .map(|g| g.name.as_str())
            .collect::<Vec<_>>(),
        vec![SCHEDULING_GATE]
    );
    assert_eq!(
        kinds(&p),
        vec!["CreateJob"],
        "then the status, written at the end"
    );
}

#[test]
fn a_pod_waiting_at_the_gate_is_read_then_let_go_on_the_version_read() {
    let g = attempt_one(&gpujob(3));
    let jobs = [made(&g, 1)];
    // No pod yet: nothing to do, nothing to write.
    let p = Seen::new(&g, &jobs).plan(LATER);
    assert!(p.actions.is_empty(), "{:?}", p.actions);
    assert_eq!(Some(&p.status), g.status.as_ref());
    // The cache shows a gated pod: read them (the cache may lag).
    let waiting = pod(1, 0);
    let p = Seen::new(&g, &jobs)
        .cached(std::slice::from_ref(&waiting))
        .plan(LATER);
    assert_eq!(p.actions, vec![Action::ReadPods { workers: false }]);
    // The read shows it gated: let go, with the version read, and nothing else.
    let mut read = waiting.clone();
    read.resource_version = Some("999".into());
    let p = Seen::new(&g, &jobs)
        .cached(std::slice::from_ref(&waiting))
        .read(&[read])
        .plan(LATER);
    assert_eq!(ungates(&p), vec![("train-1-0", "999")]);
    assert_eq!(p.actions.len(), 1, "{:?}", p.actions);
    assert_eq!(Some(&p.status), g.status.as_ref(), "the status stays");
    // The read shows it let go already (the cache lagged): nothing.
    let p = Seen::new(&g, &jobs)
        .cached(&[waiting])
        .read(&[ungated(pod(1, 0))])
        .plan(LATER);
    assert!(p.actions.is_empty(), "{:?}", p.actions);
}

#[test]
fn a_gate_goes_only_from_a_view_confirmed_in_the_term() {
    let g = attempt_one(&gpujob(3));
    let jobs = [made(&g, 1)];
    let p = Seen::new(&g, &jobs)
        .cached(&[pod(1, 0)])
        .unconfirmed()
        .plan(LATER);
    assert_eq!(kinds(&p), vec!["Confirm", "ReadPods"]);
}

#[test]
fn no_pod_is_let_go_while_a_pod_of_another_job_may_run() {
    // Attempt 1 failed; attempt 2 is recorded and its pod waits. What attempt 1 left:
    let g = gpujob(3);
    let g2 = running(&g, 2, 1);
    let jobs = [made(&g, 2)];
    let waiting = pod(2, 0);
    let plan_with = |other: SeenPod| {
        Seen::new(&g2, &jobs)
            .cached(std::slice::from_ref(&waiting))
            .read(&[other, waiting.clone()])
            .plan("2026-11-30T06:01:00Z")
    };
    let mut bound_stopping = ungated(pod(1, 0));
    bound_stopping.deleting = true;
    let still_gated = pod(1, 0);
    let mut ungated_unbound = pod(1, 0);
    ungated_unbound.gated = false;
    for (other, words) in [
        (bound_stopping, "is stopping"),
        (still_gated, "waits at the gate until it is deleted"),
        (ungated_unbound, "has not stopped"),
    ] {
        let p = plan_with(other);
        assert!(ungates(&p).is_empty(), "{:?}", p.actions);
        assert_eq!(p.status.phase, Some(Phase::Pending));
        assert_eq!(p.next, Next::Backoff);
        let c = p.status.condition(READY).unwrap();
        assert_eq!(c.reason, OLD_ATTEMPT_STOPPING);
        assert!(
            c.message.contains("pod train-1-0 (attempt 1)") && c.message.contains(words),
            "{}",
            c.message
        );
    }
    // Finished, or deleted before it was ever placed: it cannot run. Let go.
    let mut finished = ungated(pod(1, 0));
    finished.terminal = true;
    let mut deleted_gated = pod(1, 1);
    deleted_gated.deleting = true;
    let p = Seen::new(&g2, &jobs)
        .cached(std::slice::from_ref(&waiting))
        .read(&[finished, deleted_gated, waiting.clone()])
        .plan("2026-11-30T06:01:00Z");
    assert_eq!(ungates(&p), vec![("train-2-0", "207")]);
    // An earlier Job of the same number (a stray made from another spec) counts as
    // another Job: its pods are never this attempt's.
    let mut same_number = pod(2, 1);
    same_number.job_uid = Some("job-uid-2-old".into());
    let p = Seen::new(&g2, &jobs)
        .cached(std::slice::from_ref(&waiting))
        .read(&[same_number, waiting])
        .plan("2026-11-30T06:01:00Z");
    assert!(ungates(&p).is_empty(), "{:?}", p.actions);
}

#[test]
fn only_the_current_attempts_pods_are_let_go() {
    let g = gpujob(3);
    let g2 = running(&g, 2, 1);
    let jobs = [made(&g, 2)];
    // A pod labelled attempt 1 under attempt 2's Job (a forged label), and a deleted
    // one of attempt 2: neither goes; attempt 2's own gated pod does.
    let mut mislabelled = pod(2, 1);
    mislabelled.attempt = Some(1);
    let mut deleting = pod(2, 2);
    deleting.deleting = true;
    let p = Seen::new(&g2, &jobs)
        .cached(&[pod(2, 0)])
        .read(&[mislabelled, deleting, pod(2, 0)])
        .plan("2026-11-30T06:01:00Z");
    assert_eq!(ungates(&p), vec![("train-2-0", "207")]);
}

#[test]
fn the_gate_holds_until_the_status_records_the_attempt() {
    // Attempt 2's Job exists and its pod waits, but the status still says attempt 1
    // (its create landed; the status write did not, or not yet).
    let g = gpujob(3);
    let one = job(&g, 1, Some(("Failed", "BackoffLimitExceeded", T0)));
    let mut g1 = running(&g, 1, 0);
    g1.metadata.generation = Some(1);
    let jobs = [one, made(&g, 2)];
    let p = Seen::new(&g1, &jobs)
        .cached(&[pod(2, 0)])
        .read(&[pod(2, 0)])
        .plan("2026-11-30T06:10:00Z");
    assert!(ungates(&p).is_empty(), "{:?}", p.actions);
    assert!(
        creates(&p).is_empty(),
        "adopted, not created again: {:?}",
        p.actions
    );
    assert_eq!(
        p.status.attempts, 2,
        "recorded now; the next look lets it go"
    );
    // Recorded: let go.
    let g2 = with_status(g1, &p);
    let p = Seen::new(&g2, &jobs)
        .cached(&[pod(2, 0)])
        .read(&[pod(2, 0)])
        .plan("2026-11-30T06:10:01Z");
    assert_eq!(ungates(&p), vec![("train-2-0", "207")]);
}

#[test]
fn a_job_being_replaced_stopped_or_deleted_never_has_a_pod_let_go() {
    let g1 = attempt_one(&gpujob(3));
    let waiting = [pod(1, 0)];
    // A spec change under Recreate: replaced, not let go.
    let mut g2 = g1.clone();
    g2.metadata.generation = Some(2);
    let jobs = [made(&g1, 1)];
    let p = Seen::new(&g2, &jobs)
        .cached(&waiting)
        .read(&waiting)
        .plan(LATER);
    assert!(ungates(&p).is_empty(), "{:?}", p.actions);
    assert!(
        p.actions.iter().any(|a| matches!(
            a,
            Action::DeleteJob {
                why: JobDeletion::Replaced,
                ..
            }
        )),
        "{:?}",
        p.actions
    );
    // Suspended.
    let mut gs = g1.clone();
    gs.spec.suspend = true;
    let p = Seen::new(&gs, &jobs)
        .cached(&waiting)
        .read(&waiting)
        .plan(LATER);
    assert!(ungates(&p).is_empty(), "{:?}", p.actions);
    // Its Job being deleted.
    let mut deleting = made(&g1, 1);
    deleting.metadata.deletion_timestamp = Some(Time(t("2026-11-30T06:00:01Z")));
    let jobs = [deleting];
    let p = Seen::new(&g1, &jobs)
        .cached(&waiting)
        .read(&waiting)
        .plan(LATER);
    assert!(ungates(&p).is_empty(), "{:?}", p.actions);
}

#[test]
fn an_attempt_that_keeps_its_spec_is_let_go() {
    // OnNextAttempt: the running attempt keeps the spec it was made from.
    let mut g = gpujob(3);
    g.spec.update_policy = UpdatePolicy::OnNextAttempt;
    let g1 = attempt_one(&g);
    let jobs = [made(&g1, 1)];
    let mut g2 = g1.clone();
    g2.metadata.generation = Some(2);
    let p = Seen::new(&g2, &jobs)
        .cached(&[pod(1, 0)])
        .read(&[pod(1, 0)])
        .plan(LATER);
    assert_eq!(ungates(&p), vec![("train-1-0", "107")]);
    // Recreate with an invalid change: the change cannot apply, the attempt goes on.
    let g1 = attempt_one(&gpujob(3));
    let mut g2 = g1.clone();
    g2.metadata.generation = Some(2);
    g2.spec.image = "Not A Valid Image".into();
    let p = Seen::new(&g2, &jobs)
        .cached(&[pod(1, 0)])
        .read(&[pod(1, 0)])
        .plan(LATER);
    assert_eq!(ungates(&p), vec![("train-1-0", "107")]);
}

fn nodes(mut g: GpuJob, nodes: i32) -> GpuJob {
    g.spec.v2 = Some(V2Only {
        nodes: Some(nodes),
        ..V2Only::default()
    });
    g
}

#[test]
fn a_multi_node_attempts_service_exists_before_any_of_its_pods_goes() {
    let g = attempt_one(&nodes(gpujob(3), 2));
    let jobs = [made(&g, 1)];
    let pods = [pod(1, 0), pod(1, 1)];
    let p = Seen::new(&g, &jobs).cached(&pods).read(&pods).plan(LATER);
    assert_eq!(kinds(&p), vec!["CreateService", "UngatePod", "UngatePod"]);
    let Action::CreateService {
        attempt: 1,
        service,
    } = &p.actions[0]
    else {
        panic!("{:?}", p.actions)
    };
    assert_eq!(service.metadata.name.as_deref(), Some("train-1"));
    let owner = &service.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str()),
        ("Job", "job-uid-1")
    );
    // A foreign Service under its name: no pod goes; said, and looked at again.
    let message = "Service ns/train-1 exists and is not this attempt's".to_owned();
    let p = Seen::new(&g, &jobs)
        .cached(&pods)
        .read(&pods)
        .refused(1, SERVICE_NAME_CONFLICT, &message)
        .plan(LATER);
    assert!(ungates(&p).is_empty(), "{:?}", p.actions);
    assert_eq!(ready(&p).1, SERVICE_NAME_CONFLICT);
    assert_eq!(p.status.last_error.as_deref(), Some(message.as_str()));
    assert_eq!(p.next, Next::After(Duration::from_secs(30)));
}

/// The Service of a multi-node attempt refused as invalid (422: an admission policy, a
/// field this API server does not take): no pod goes, Ready says why, and nothing is
/// asked again in this look (before, the plan asked the create again until it gave up,
/// and wrote no status). The next look asks again, and once the Service is made the pods
/// go.
#[test]
fn a_multi_node_attempts_service_refused_as_invalid_keeps_its_pods_gated_and_says_why() {
    let g = attempt_one(&nodes(gpujob(3), 2));
    let jobs = [made(&g, 1)];
    let pods = [pod(1, 0), pod(1, 1)];
    let message = "Service \"train-1\" is invalid: denied by policy".to_owned();
    let p = Seen::new(&g, &jobs)
        .cached(&pods)
        .read(&pods)
        .refused(1, INVALID_SPEC, &message)
        .plan(LATER);
    assert!(p.actions.is_empty(), "{:?}", p.actions);
    assert_eq!(ready(&p).1, INVALID_SPEC);
    assert_eq!(p.status.phase, Some(Phase::Pending));
    assert_eq!(p.status.last_error.as_deref(), Some(message.as_str()));
    assert_eq!(p.next, Next::Done);
    // Looked at again (a resync), the Service is made: the pods go.
    let g = with_status(g, &p);
    let p = Seen::new(&g, &jobs).cached(&pods).read(&pods).plan(LATER);
    assert_eq!(kinds(&p), vec!["CreateService", "UngatePod", "UngatePod"]);
    assert_eq!(ready(&p).1, "JobRunning", "no longer InvalidSpec");
}

#[test]
fn a_job_an_earlier_version_created_suspended_gets_the_gate_then_starts() {
    let g = attempt_one(&gpujob(3));
    let mut old = made(&g, 1);
    if let Some(spec) = old.spec.as_mut() {
        spec.suspend = Some(true);
        if let Some(p) = spec.template.spec.as_mut() {
            p.scheduling_gates = None;
        }
    }
    let p = Seen::new(&g, std::slice::from_ref(&old)).plan(LATER);
    assert_eq!(
        p.actions,
        vec![Action::GateJob {
            name: "train-1".into(),
            resource_version: "101".into(),
            queue: None,
        }]
    );
    // Of a GpuJob with spec.queueName, not yet handed over (that version labelled it
    // only when it started it): gated and handed to its queue, left suspended for Kueue.
    let queued = in_queue(g.clone(), "team-a");
    let p = Seen::new(&queued, std::slice::from_ref(&old)).plan(LATER);
    assert!(
        matches!(p.actions.as_slice(), [Action::GateJob { queue: Some(q), .. }] if q == "team-a"),
        "{:?}",
        p.actions
    );
    // Handed to Kueue by that version: gated, left suspended for Kueue.
    old.metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert(LABEL_KUEUE_QUEUE.into(), "team-a".into());
    let p = Seen::new(&g, std::slice::from_ref(&old)).plan(LATER);
    assert!(
        matches!(p.actions.as_slice(), [Action::GateJob { queue: Some(q), .. }] if q == "team-a"),
        "{:?}",
        p.actions
    );
    // Started by that version (running, ungated): its pods run already; nothing.
    if let Some(spec) = old.spec.as_mut() {
        spec.suspend = Some(false);
    }
    let p = Seen::new(&g, std::slice::from_ref(&old)).plan(LATER);
    assert!(p.actions.is_empty(), "{:?}", p.actions);
}

#[test]
fn a_job_kueue_labels_by_default_still_waits_at_the_gate() {
    // No spec.queueName, but the namespace has a LocalQueue named default: Kueue's
    // webhook labelled and suspended the Job. While Kueue holds it, nothing; admitted
    // (unsuspended by Kueue), its pods wait at the gate like any attempt's.
    let g = attempt_one(&gpujob(3));
    let mut defaulted = made(&g, 1);
    defaulted
        .metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert(LABEL_KUEUE_QUEUE.into(), "default".into());
    defaulted.spec.as_mut().unwrap().suspend = Some(true);
    let jobs = [defaulted.clone()];
    let p = Seen::new(&g, &jobs).plan(LATER);
    assert!(p.actions.is_empty(), "{:?}", p.actions);
    assert_eq!(ready(&p).1, QUEUED);
    defaulted.spec.as_mut().unwrap().suspend = Some(false);
    let jobs = [defaulted];
    let p = Seen::new(&g, &jobs)
        .cached(&[pod(1, 0)])
        .read(&[pod(1, 0)])
        .plan(LATER);
    assert_eq!(ungates(&p), vec![("train-1-0", "107")]);
    assert_eq!(
        p.status.condition(ADMITTED).map(|c| c.status),
        Some(ConditionStatus::True)
    );
}

#[test]
fn a_queued_gpujobs_job_is_created_suspended_in_its_queue() {
    let g = in_queue(gpujob(3), "team-a");
    let p = run(&g, &[], None, T0);
    let Some(Action::CreateJob { job, .. }) = p.actions.first() else {
        panic!("{:?}", p.actions)
    };
    assert_eq!(job.spec.as_ref().unwrap().suspend, Some(true));
    assert_eq!(
        job.metadata
            .labels
            .as_ref()
            .unwrap()
            .get(LABEL_KUEUE_QUEUE)
            .map(String::as_str),
        Some("team-a")
    );
    assert_eq!(
        kinds(&p),
        vec!["CreateJob"],
        "no second write hands it over"
    );
}

mod quota_at_the_gate {
    use super::*;
    use crate::api::FINALIZER_QUOTA;

    fn reserved(g: &GpuJob, gpus: i32) -> GpuJob {
        let mut g = g.clone();
        g.metadata.finalizers = Some(vec![FINALIZER_QUOTA.to_owned()]);
        let p = Seen::new(&g, &[])
            .with_quota(Some(QuotaAnswer::Reserved {
                id: "r-1".into(),
                gpus,
            }))
            .plan(T0);
        assert_eq!(creates(&p), vec![1], "{:?}", p.actions);
        with_status(g, &p)
    }

    #[test]
    fn a_reservation_that_does_not_cover_the_job_keeps_its_pods_gated() {
        let g = reserved(&gpujob(3), 1);
        assert_eq!(g.status.as_ref().unwrap().reservation_gpus, Some(1));
        let jobs = [made(&g, 1)];
        let p = Seen::new(&g, &jobs)
            .with_quota(None)
            .cached(&[pod(1, 0)])
            .read(&[pod(1, 0)])
            .plan(LATER);
        assert_eq!(ungates(&p), vec![("train-1-0", "107")]);
        // A release pending (its answer unknown): the reservation may be gone.
        let mut pending = g.clone();
        if let Some(s) = pending.status.as_mut() {
            s.quota_call = Some(crate::api::QuotaCall {
                op: crate::api::QuotaOp::Release,
                sequence: 2,
                pending: true,
            });
        }
        let p = Seen::new(&pending, &jobs)
            .with_quota(None)
            .cached(&[pod(1, 0)])
            .read(&[pod(1, 0)])
            .plan(LATER);
        assert!(ungates(&p).is_empty(), "{:?}", p.actions);
        // A Job that asks for more GPUs than the reservation holds.
        let mut big = g.clone();
        big.spec.gpus = 8;
        let jobs = [made(&big, 1)];
        let p = Seen::new(&g, &jobs)
            .with_quota(None)
            .cached(&[pod(1, 0)])
            .read(&[pod(1, 0)])
            .plan(LATER);
        assert!(ungates(&p).is_empty(), "{:?}", p.actions);
    }

    #[test]
    fn a_gpus_edit_reserves_again_before_the_next_attempt() {
        // Attempt 1 ran on a 1-GPU reservation and failed; the spec now asks for 8.
        let g = reserved(&gpujob(3), 1);
        let one = job(&g, 1, Some(("Failed", "BackoffLimitExceeded", T0)));
        let mut g8 = g.clone();
        g8.spec.gpus = 8;
        g8.metadata.generation = Some(2);
        let jobs = [one];
        let later = "2026-11-30T06:10:00Z";
        // The next attempt waits; the pods are read before the old reservation goes.
        let p = Seen::new(&g8, &jobs).with_quota(None).plan(later);
        assert!(creates(&p).is_empty(), "{:?}", p.actions);
        assert_eq!(kinds(&p), vec!["ReadPods"]);
        let p = Seen::new(&g8, &jobs).with_quota(None).read(&[]).plan(later);
        assert!(creates(&p).is_empty(), "{:?}", p.actions);
        assert_eq!(kinds(&p), vec!["RecordStatus", "Release"]);
        let c = p.status.condition(READY).unwrap();
        assert!(
            c.message.contains("holds 1 GPUs") && c.message.contains("asks for 8"),
            "{c:?}"
        );
        // Released and recorded; then reserved anew, for 8, before attempt 2.
        let p = Seen::new(&g8, &jobs)
            .with_quota(Some(QuotaAnswer::Released))
            .read(&[])
            .plan(later);
        assert_eq!(p.status.reservation_id, None);
        assert_eq!(p.status.reservation_gpus, None);
        let g8 = with_status(g8, &p);
        let p = Seen::new(&g8, &jobs).with_quota(None).plan(later);
        let Some(Action::Reserve(req, _)) = p.actions.last() else {
            panic!("{:?}", p.actions)
        };
        assert_eq!(req.gpus, 8);
        let p = Seen::new(&g8, &jobs)
            .with_quota(Some(QuotaAnswer::Reserved {
                id: "r-1".into(),
                gpus: 8,
            }))
            .plan(later);
        assert_eq!(creates(&p), vec![2]);
        assert_eq!(p.status.reservation_gpus, Some(8));
    }

    #[test]
    fn a_grant_is_recorded_no_larger_than_asked_nor_than_held() {
        let gpus = |a: QuotaAnswer| match a {
            QuotaAnswer::Reserved { gpus, .. } => gpus,
            other => panic!("{other:?}"),
        };
        assert_eq!(gpus(QuotaAnswer::granted("r".into(), Some(1), 2)), 1);
        assert_eq!(gpus(QuotaAnswer::granted("r".into(), Some(4), 2)), 2);
        assert_eq!(gpus(QuotaAnswer::granted("r".into(), None, 2)), 2);
    }

    /// The protocol model's counterexample with the grant recorded at the size asked:
    /// a reserve whose answer was lost, then an edit that asks for more GPUs. The
    /// repeated reserve (the same fencing number) is answered with the reservation the
    /// service made for the old size. Recorded as held, it covers no attempt of the new
    /// spec: none starts on it, and it is released to be made anew.
    #[test]
    fn a_reserve_repeated_after_an_edit_starts_nothing_on_the_old_size() {
        let mut g = gpujob(3);
        g.metadata.finalizers = Some(vec![FINALIZER_QUOTA.to_owned()]);
        let p = Seen::new(&g, &[]).with_quota(None).plan(T0);
        let Some(Action::Reserve(req, sequence)) = p.actions.last().cloned() else {
            panic!("{:?}", p.actions)
        };
        assert_eq!(req.gpus, 1);
        // Its answer is lost; the spec now asks for 2.
        let mut g2 = with_status(g, &p);
        g2.spec.gpus = 2;
        g2.metadata.generation = Some(2);
        let p = Seen::new(&g2, &[]).with_quota(None).plan(T0);
        assert_eq!(
            p.actions.last(),
            Some(&Action::Reserve(
                ReserveRequest { gpus: 2, ..req },
                sequence
            ))
        );
        let held = QuotaAnswer::granted("r-1".into(), Some(1), 2);
        let p = Seen::new(&g2, &[]).with_quota(Some(held)).plan(T0);
        assert!(creates(&p).is_empty(), "{:?}", p.actions);
        assert_eq!(p.status.reservation_gpus, Some(1));
        let g2 = with_status(g2, &p);
        let p = Seen::new(&g2, &[]).with_quota(None).read(&[]).plan(T0);
        assert!(creates(&p).is_empty(), "{:?}", p.actions);
        assert!(
            matches!(p.actions.last(), Some(Action::Release(_))),
            "{:?}",
            p.actions
        );
    }

    /// A resize's release that failed (or whose answer was lost) may not have landed:
    /// the service may still hold the old size, and a PUT of the new one would return it
    /// unchanged. So nothing is reserved until the release is confirmed: the release is
    /// asked again, with backoff, and only once it is confirmed comes the reserve.
    #[test]
    fn a_gpus_edit_reserves_again_only_once_the_release_is_confirmed() {
        let g = reserved(&gpujob(3), 1);
        let jobs = [job(&g, 1, Some(("Failed", "BackoffLimitExceeded", T0)))];
        let mut g8 = g.clone();
        g8.spec.gpus = 8;
        g8.metadata.generation = Some(2);
        let later = "2026-11-30T06:10:00Z";
        let p = Seen::new(&g8, &jobs).with_quota(None).read(&[]).plan(later);
        assert_eq!(kinds(&p), vec!["RecordStatus", "Release"]);
        let sequence = p.status.quota_call.as_ref().unwrap().sequence;
        let g8 = with_status(g8, &p);
        let reserves = |p: &Plan| {
            p.actions
                .iter()
                .filter(|a| matches!(a, Action::Reserve(..)))
                .count()
        };
        let failed = Some(QuotaAnswer::ReleaseFailed {
            message: "quota service release answered 503".into(),
        });
        let p = Seen::new(&g8, &jobs)
            .with_quota(failed)
            .read(&[])
            .plan(later);
        assert_eq!(reserves(&p), 0, "{:?}", p.actions);
        assert!(creates(&p).is_empty());
        assert_eq!(p.next, Next::Backoff);
        assert!(p.status.release_failing_since.is_some());
        // The next look asks the release again, with the same fencing number.
        let g8 = with_status(g8, &p);
        let p = Seen::new(&g8, &jobs).with_quota(None).read(&[]).plan(later);
        assert_eq!(reserves(&p), 0, "{:?}", p.actions);
        assert_eq!(p.actions.last(), Some(&Action::Release(sequence)));
        // Confirmed: reserved anew, for 8.
        let p = Seen::new(&g8, &jobs)
            .with_quota(Some(QuotaAnswer::Released))
            .read(&[])
            .plan(later);
        let Some(Action::Reserve(req, _)) = p.actions.last() else {
            panic!("{:?}", p.actions)
        };
        assert_eq!(req.gpus, 8);
    }

    /// A GpuJob being deleted with a gated pod no Job will take (of attempt 1's kept,
    /// failed Job: the Job controller raced its end): the pod is deleted, then the
    /// reservation released. Left, it would hold the deletion for good: the garbage
    /// collector takes the kept Job and its pods only once the GpuJob is gone, which
    /// waits for the release, which waits for the pod.
    #[test]
    fn a_deleted_gpujobs_gated_stray_pod_is_deleted_before_the_release() {
        let mut g = reserved(&gpujob(3), 1);
        g.metadata.deletion_timestamp = Some(Time(t("2026-11-30T06:05:00Z")));
        let jobs = [job(&g, 1, Some(("Failed", "BackoffLimitExceeded", T0)))];
        let race = pod(1, 9);
        let now = "2026-11-30T06:05:01Z";
        let p = Seen::new(&g, &jobs)
            .with_quota(None)
            .cached(std::slice::from_ref(&race))
            .read(std::slice::from_ref(&race))
            .plan(now);
        assert!(
            p.actions
                .iter()
                .any(|a| matches!(a, Action::DeletePod { name, .. } if name == "train-1-9")),
            "{:?}",
            p.actions
        );
        assert!(
            !p.actions.iter().any(|a| matches!(a, Action::Release(_))),
            "{:?}",
            p.actions
        );
        assert_eq!(p.next, Next::Backoff, "looked at again");
        // Deleted (never placed): the release.
        let mut going = race;
        going.deleting = true;
        let p = Seen::new(&g, &jobs)
            .with_quota(None)
            .cached(std::slice::from_ref(&going))
            .read(std::slice::from_ref(&going))
            .plan(now);
        assert_eq!(kinds(&p), vec!["RecordStatus", "Release"]);
    }

    #[test]
    fn a_running_attempt_keeps_its_reservation_through_a_gpus_edit() {
        let mut g = gpujob(3);
        g.spec.update_policy = UpdatePolicy::OnNextAttempt;
        let g = reserved(&g, 1);
        let mut g8 = g.clone();
        g8.spec.gpus = 8;
        g8.metadata.generation = Some(2);
        let jobs = [made(&g, 1)];
        let p = Seen::new(&g8, &jobs)
            .with_quota(None)
            .cached(&[pod(1, 0)])
            .read(&[pod(1, 0)])
            .plan(LATER);
        assert!(
            !p.actions.iter().any(|a| matches!(a, Action::Release(_))),
            "{:?}",
            p.actions
        );
        assert_eq!(
            ungates(&p),
            vec![("train-1-0", "107")],
            "the Job asks for 1"
        );
    }

    #[test]
    fn a_finished_gpujob_releases_only_once_no_pod_may_run() {
        // Succeeded; a stray (a late create of attempt 2) is still there.
        let g = reserved(&gpujob(3), 1);
        let done = job(&g, 1, Some(("Complete", "", "2026-11-30T06:05:00Z")));
        let stray = made(&g, 2);
        let now = "2026-11-30T06:05:01Z";
        let jobs = [done.clone(), stray];
        let p = Seen::new(&g, &jobs).with_quota(None).plan(now);
        assert_eq!(p.status.phase, Some(Phase::Succeeded));
        assert_eq!(stray_deletes(&p), vec!["train-2"]);
        assert!(
            !p.actions.iter().any(|a| matches!(a, Action::Release(_))),
            "not while the stray's Job is there: {:?}",
            p.actions
        );
        // Its Job gone: its pods are read first.
        let g = with_status(g, &p);
        let jobs = [done];
        let p = Seen::new(&g, &jobs).with_quota(None).plan(now);
        assert_eq!(kinds(&p), vec!["ReadPods"]);
        let mut lingering = ungated(pod(2, 0));
        lingering.deleting = true;
        let p = Seen::new(&g, &jobs)
            .with_quota(None)
            .read(&[lingering])
            .plan(now);
        assert!(
            !p.actions.iter().any(|a| matches!(a, Action::Release(_))),
            "{:?}",
            p.actions
        );
        assert_eq!(p.next, Next::Backoff);
        let p = Seen::new(&g, &jobs).with_quota(None).read(&[]).plan(now);
        assert_eq!(kinds(&p), vec!["RecordStatus", "Release"]);
    }
}

mod recognized_attempts {
    use super::*;
    use crate::api::LABEL_ATTEMPT;

    fn labelled(g: &GpuJob, name: &str, attempt: &str) -> Job {
        let mut j = made(g, 1);
        j.metadata.name = Some(name.into());
        j.metadata.uid = Some(format!("uid-{name}"));
        j.metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert(LABEL_ATTEMPT.into(), attempt.into());
        j
    }

    #[test]
    fn a_job_numbered_past_the_next_attempt_is_a_stray_whatever_its_label() {
        let g = attempt_one(&gpujob(3));
        let forged = labelled(&g, "train-2147483647", "2147483647");
        let jobs = [made(&g, 1), forged];
        let p = Seen::new(&g, &jobs).plan(LATER);
        assert_eq!(p.status.attempts, 1, "not taken for the current attempt");
        assert_eq!(stray_deletes(&p), vec!["train-2147483647"]);
        let warned = p.actions.iter().any(|a| {
            matches!(a, Action::Publish(n) if n.reason == "UnrecognizedJobDeleted"
                && n.note.contains("train-2147483647") && n.note.contains("2147483647"))
        });
        assert!(warned, "{:?}", p.actions);
        // Two past the recorded: a stray too.
        let jobs = [made(&g, 1), labelled(&g, "train-3", "3")];
        let p = Seen::new(&g, &jobs).plan(LATER);
        assert_eq!(stray_deletes(&p), vec!["train-3"]);
        // The current attempt's number on a Job of another name: a stray.
        let jobs = [made(&g, 1), labelled(&g, "not-train", "1")];
        let p = Seen::new(&g, &jobs).plan(LATER);
        assert_eq!(stray_deletes(&p), vec!["not-train"]);
        assert_eq!(p.status.attempts, 1);
    }

    #[test]
    fn attempt_numbers_at_the_end_of_the_range_do_not_overflow() {
        let g = gpujob(3);
        let mut last = running(&g, i32::MAX, 1);
        last.status.as_mut().unwrap().run_first_attempt = Some(i32::MIN);
        let failed = labelled(&g, &format!("train-{}", i32::MAX), &i32::MAX.to_string());
        let mut failed = failed;
        failed.status = job(&g, 1, Some(("Failed", "BackoffLimitExceeded", T0))).status;
        let p = Seen::new(&last, &[failed]).plan("2026-11-30T07:00:00Z");
        assert!(creates(&p).is_empty(), "{:?}", p.actions);
        assert_eq!(ready(&p).1, "AttemptsExhausted");
    }

    #[test]
    fn a_late_next_attempt_is_not_run_after_a_change_that_forbids_it() {
        // Attempt 1 failed; its successor's Job (attempt 2) was created by a replica
        // that lost the shard, from generation 1. Generation 2 then changed things.
        let g = gpujob(3);
        let one = job(&g, 1, Some(("Failed", "BackoffLimitExceeded", T0)));
        let late = made(&g, 2);
        let later = "2026-11-30T06:10:00Z";
        let g1 = running(&g, 1, 0);
        // An invalid change: nothing may start; the late Job is a stray.
        let mut invalid = g1.clone();
        invalid.metadata.generation = Some(2);
        invalid.spec.image = "Not A Valid Image".into();
        let jobs = [one.clone(), late.clone()];
        let p = Seen::new(&invalid, &jobs).plan(later);
        assert_eq!(p.status.attempts, 1);
        assert_eq!(stray_deletes(&p), vec!["train-2"]);
        // OnNextAttempt: the next attempt runs the new spec, not the late Job's.
        let mut next = g1.clone();
        next.metadata.generation = Some(2);
        next.spec.update_policy = UpdatePolicy::OnNextAttempt;
        next.spec.image = "img:2".into();
        let p = Seen::new(&next, &jobs).plan(later);
        assert_eq!(p.status.attempts, 1);
        assert!(creates(&p).is_empty(), "its name is taken: {:?}", p.actions);
        assert_eq!(stray_deletes(&p), vec!["train-2"]);
        // Once it is gone, attempt 2 is created from generation 2.
        let p = Seen::new(&next, std::slice::from_ref(&one)).plan(later);
        assert_eq!(creates(&p), vec![2]);
        let Some(Action::CreateJob { job, .. }) = p
            .actions
            .iter()
            .find(|a| matches!(a, Action::CreateJob { .. }))
        else {
            panic!()
        };
        assert_eq!(
            job.metadata.annotations.as_ref().unwrap()[crate::api::ANNOTATION_GENERATION],
            "2"
        );
        // While it is being deleted, nothing is created under its name.
        let mut going = late;
        going.metadata.deletion_timestamp = Some(Time(t(later)));
        let p = Seen::new(&next, &[one.clone(), going]).plan(later);
        assert!(creates(&p).is_empty(), "{:?}", p.actions);
        assert_eq!(ready(&p).1, OLD_ATTEMPT_STOPPING);
        // Suspended, or with quota not reserved: not taken either.
        let mut suspended = g1.clone();
        suspended.spec.suspend = true;
        let p = Seen::new(&suspended, &[one, made(&g, 2)]).plan(later);
        assert_eq!(p.status.attempts, 1);
        assert_eq!(stray_deletes(&p), vec!["train-2"]);
    }

    #[test]
    fn a_late_next_attempt_with_quota_not_reserved_is_a_stray() {
        let g = gpujob(3);
        let one = job(&g, 1, Some(("Failed", "BackoffLimitExceeded", T0)));
        let mut g1 = running(&g, 1, 0);
        g1.metadata.finalizers = Some(vec![crate::api::FINALIZER_QUOTA.to_owned()]);
        let jobs = [one, made(&g, 2)];
        // No reservation recorded (a release went through meanwhile): reserve first.
        let p = Seen::new(&g1, &jobs)
            .with_quota(Some(QuotaAnswer::Refused {
                reason: "InsufficientQuota".into(),
                message: "no GPUs left".into(),
            }))
            .plan("2026-11-30T06:10:00Z");
        assert_eq!(p.status.attempts, 1);
        assert_eq!(stray_deletes(&p), vec!["train-2"]);
    }

    #[test]
    fn a_stray_is_deleted_only_from_a_confirmed_view() {
        // After a takeover whose GpuJob watch lags: the view says finished, a rerun
        // since runs attempt 2. The delete waits for a confirming read.
        let g = gpujob(3);
        let mut finished = running(&g, 1, 0);
        finished.status.as_mut().unwrap().phase = Some(Phase::Succeeded);
        let jobs = [job(&g, 1, Some(("Complete", "", T0))), made(&g, 2)];
        let p = Seen::new(&finished, &jobs).unconfirmed().plan(LATER);
        let kinds = kinds(&p);
        let confirm = kinds.iter().position(|k| *k == "Confirm");
        let delete = kinds.iter().position(|k| *k == "DeleteJob");
        assert!(
            confirm.is_some() && confirm < delete,
            "confirmed before the delete: {kinds:?}"
        );
    }

    #[test]
    fn a_multi_node_attempt_whose_host_names_no_longer_fit_does_not_start() {
        // 59 characters fit up to attempt 9 with 2 nodes (59 + 1 + 1 + 1 + 1 = 63).
        let mut g = nodes(gpujob(3), 2);
        g.metadata.name = Some("a".repeat(59));
        let p = run(&g, &[], None, T0);
        assert_eq!(creates(&p), vec![1]);
        // Attempt 9 failed (disruptions before it were not counted): attempt 10 is next.
        let g9 = running(&g, 9, 0);
        let nine = job(&g, 9, Some(("Failed", "BackoffLimitExceeded", T0)));
        let p = run(&g9, &[nine], None, "2026-11-30T07:00:00Z");
        assert!(creates(&p).is_empty(), "{:?}", p.actions);
        let c = p.status.condition(READY).unwrap();
        assert_eq!(c.reason, INVALID_SPEC);
        assert!(c.message.contains("64 characters"), "{}", c.message);
    }
}

#[test]
fn a_gated_pod_of_another_attempt_whose_job_stays_is_deleted_then_the_gate_goes() {
    // Attempt 1 failed and its Job is kept; a pod made from it (the Job controller
    // racing its end) waits at the gate. Attempt 2 is current and its pod waits too.
    let g = gpujob(3);
    let g2 = running(&g, 2, 1);
    let one = job(&g, 1, Some(("Failed", "BackoffLimitExceeded", T0)));
    let jobs = [one, made(&g, 2)];
    let race = pod(1, 9);
    let now = "2026-11-30T06:01:00Z";
    let p = Seen::new(&g2, &jobs)
        .cached(&[race.clone(), pod(2, 0)])
        .plan(now);
    assert_eq!(kinds(&p), vec!["ReadPods"]);
    let p = Seen::new(&g2, &jobs)
        .cached(&[race.clone(), pod(2, 0)])
        .read(&[race.clone(), pod(2, 0)])
        .plan(now);
    assert!(
        ungates(&p).is_empty(),
        "not while it may run: {:?}",
        p.actions
    );
    assert!(
        p.actions.iter().any(
            |a| matches!(a, Action::DeletePod { name, resource_version, .. }
            if name == "train-1-9" && resource_version == "197")
        ),
        "{:?}",
        p.actions
    );
    assert!(
        p.actions
            .iter()
            .any(|a| matches!(a, Action::Publish(n) if n.reason == "StrayPodDeleted")),
        "{:?}",
        p.actions
    );
    // Deleted (never placed): the gate goes.
    let mut going = race;
    going.deleting = true;
    let p = Seen::new(&g2, &jobs)
        .cached(&[going.clone(), pod(2, 0)])
        .read(&[going, pod(2, 0)])
        .plan(now);
    assert_eq!(ungates(&p), vec![("train-2-0", "207")]);
    assert!(
        !p.actions
            .iter()
            .any(|a| matches!(a, Action::DeletePod { .. })),
        "{:?}",
        p.actions
    );
}

#[test]
fn the_pods_of_a_stray_job_go_with_it() {
    // A stray Job (attempt 1 back, late) is deleted in the foreground: its gated pods
    // go with it, no pod delete of their own.
    let g = gpujob(3);
    let g2 = running(&g, 2, 1);
    let mut late = made(&g, 1);
    late.metadata.uid = Some("job-uid-1".into());
    let jobs = [late, made(&g, 2)];
    let p = Seen::new(&g2, &jobs)
        .cached(&[pod(1, 0)])
        .read(&[pod(1, 0)])
        .plan("2026-11-30T06:01:00Z");
    assert_eq!(stray_deletes(&p), vec!["train-1"]);
    assert!(
        !p.actions
            .iter()
            .any(|a| matches!(a, Action::DeletePod { .. })),
        "{:?}",
        p.actions
    );
}

#[test]
fn a_finished_late_job_of_the_next_attempt_from_another_spec_is_deleted_not_waited_for() {
    // Attempt 1 failed; a late create of attempt 2 from generation 1 has failed too (its
    // deadline passed at the gate); the spec is at generation 2. It must go, or attempt
    // 2 would wait for its name forever.
    let g = gpujob(3);
    let one = job(&g, 1, Some(("Failed", "BackoffLimitExceeded", T0)));
    let late = job(&g, 2, Some(("Failed", "DeadlineExceeded", T0)));
    let mut g2 = running(&g, 1, 0);
    g2.metadata.generation = Some(2);
    let p = run(&g2, &[one, late], None, "2026-11-30T06:10:00Z");
    assert!(creates(&p).is_empty(), "{:?}", p.actions);
    assert!(
        p.actions
            .iter()
            .any(|a| matches!(a, Action::DeleteJob { name, .. } if name == "train-2")),
        "{:?}",
        p.actions
    );
    assert_eq!(ready(&p).1, OLD_ATTEMPT_STOPPING);
}

#[test]
fn a_finished_job_that_is_no_attempt_is_deleted_too() {
    let g = attempt_one(&gpujob(3));
    let mut forged = job(&g, 1, Some(("Failed", "BackoffLimitExceeded", T0)));
    forged.metadata.name = Some("train-2147483647".into());
    forged
        .metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert(crate::api::LABEL_ATTEMPT.into(), i32::MAX.to_string());
    let jobs = [made(&g, 1), forged];
    let p = Seen::new(&g, &jobs).plan(LATER);
    assert_eq!(stray_deletes(&p), vec!["train-2147483647"]);
    assert_eq!(p.status.attempts, 1);
}
