//! Attempts Kueue's MultiKueue dispatches (`spec.managedBy: kueue.x-k8s.io/multikueue`):
//! their pods wait at the gate on a worker cluster, where the operator lets them go only
//! when given that cluster (`--multikueue-worker`) and when the attempt's pods need
//! nothing made on this cluster.

use super::gate::{LATER, Seen, attempt_one, made, pod};
use super::*;
use crate::seen_pod::SeenPod;
use crate::status::MANAGED_ELSEWHERE;

/// Attempt 1's Job as MultiKueue leaves it once admitted (managed by it, unsuspended)
/// and its copy on the worker started: the copy's status, copied back.
fn dispatched(g: &GpuJob) -> Job {
    let mut j = not_started(g);
    j.status = Some(k8s_openapi::api::batch::v1::JobStatus {
        active: Some(1),
        ready: Some(0),
        start_time: Some(Time(t(T0))),
        ..Default::default()
    });
    j
}

/// Attempt 1's Job admitted, its copy on the worker not started yet: no status.
fn not_started(g: &GpuJob) -> Job {
    let mut j = made(g, 1);
    let spec = j.spec.as_mut().unwrap();
    spec.managed_by = Some(crate::seen_job::MULTIKUEUE.into());
    spec.suspend = Some(false);
    j
}

/// Attempt 1 recorded, then its Job seen dispatched by MultiKueue: the look that saw it
/// recorded that too (`multiKueueDispatched`), before any pod there may go.
fn attempt_one_dispatched() -> GpuJob {
    let g = attempt_one(&in_queue(gpujob(3), "team"));
    assert!(!g.status.as_ref().unwrap().multi_kueue_dispatched);
    let jobs = [not_started(&g)];
    let p = Seen::new(&g, &jobs)
        .multikueue()
        .cached(&[on_worker(0)])
        .plan(LATER);
    assert!(p.status.multi_kueue_dispatched);
    assert!(ungated_on(&p).is_empty(), "{:?}", p.actions);
    with_status(g, &p)
}

/// Attempt 1's pod on the worker cluster `worker`, at the gate.
fn on_worker(n: u8) -> SeenPod {
    SeenPod {
        cluster: Some("worker".into()),
        ..pod(1, n)
    }
}

/// The plan of an operator given workers, with `pod` on a worker both cached and read.
fn with_worker_pod_read(g: &GpuJob, jobs: &[Job], pod: &SeenPod) -> Plan {
    Seen::new(g, jobs)
        .multikueue()
        .cached(std::slice::from_ref(pod))
        .read(std::slice::from_ref(pod))
        .plan(LATER)
}

fn ungated_on(p: &Plan) -> Vec<(&str, Option<&str>)> {
    p.actions
        .iter()
        .filter_map(|a| match a {
            Action::UngatePod { name, cluster, .. } => Some((name.as_str(), cluster.as_deref())),
            _ => None,
        })
        .collect()
}

#[test]
fn a_dispatched_attempts_pod_is_let_go_on_its_worker_only_when_the_operator_has_it() {
    let g = attempt_one_dispatched();
    let jobs = [dispatched(&g)];
    let waiting = on_worker(0);
    // Given the workers: the cache asks for a read, the read lets the pod go there.
    let p = Seen::new(&g, &jobs)
        .multikueue()
        .cached(std::slice::from_ref(&waiting))
        .plan(LATER);
    assert_eq!(p.actions, vec![Action::ReadPods { workers: true }]);
    let p = with_worker_pod_read(&g, &jobs, &waiting);
    assert_eq!(ungated_on(&p), vec![("train-1-0", Some("worker"))]);
    assert_eq!(ready(&p).1, crate::status::JOB_RUNNING);
    assert_eq!(p.status.phase, Some(Phase::Running));

    // Without them, the read changes nothing: it waits there, and the GpuJob says why.
    let p = Seen::new(&g, &jobs)
        .cached(std::slice::from_ref(&waiting))
        .read(std::slice::from_ref(&waiting))
        .plan(LATER);
    assert!(ungated_on(&p).is_empty(), "{:?}", p.actions);
    assert_eq!(ready(&p).1, MANAGED_ELSEWHERE);
    assert!(ready(&p).0 == ConditionStatus::False);
    assert!(
        p.status
            .condition(READY)
            .unwrap()
            .message
            .contains("--multikueue-worker"),
        "{:?}",
        p.status.condition(READY)
    );
}

#[test]
fn a_worker_pod_of_an_older_copy_of_the_job_holds_the_gate_until_it_is_gone() {
    let g = attempt_one_dispatched();
    let jobs = [dispatched(&g)];
    // MultiKueue dispatched the Job again (the worker evicted it, say): the first
    // copy's pod still runs there, its Job's uid not the live copy's.
    let older = SeenPod {
        name: "train-1-old".into(),
        uid: Some("pod-old".into()),
        job_uid: Some("worker-copy-1".into()),
        gated: false,
        bound: true,
        ..on_worker(9)
    };
    let waiting = on_worker(0);
    let p = Seen::new(&g, &jobs)
        .multikueue()
        .cached(&[waiting.clone(), older.clone()])
        .read(&[waiting, older])
        .plan(LATER);
    assert!(ungated_on(&p).is_empty(), "{:?}", p.actions);
    assert_eq!(ready(&p).1, crate::plan::OLD_ATTEMPT_STOPPING);
}

#[test]
fn a_dispatched_attempt_that_needs_objects_of_this_cluster_is_not_let_go_there() {
    // Its pods would need its Service (multi-node) or its claim template (DRA): made
    // on this cluster only.
    let g = attempt_one_dispatched();
    let mut multi_node = dispatched(&g);
    let spec = multi_node.spec.as_mut().unwrap();
    spec.completion_mode = Some("Indexed".into());
    spec.completions = Some(2);
    spec.parallelism = Some(2);
    let jobs = [multi_node];
    let seen = crate::seen_job::SeenJob::of(&jobs[0]).unwrap();
    assert_eq!(seen.nodes, Some(2), "the Job says it is multi-node");
    let waiting = on_worker(0);
    let p = with_worker_pod_read(&g, &jobs, &waiting);
    assert!(ungated_on(&p).is_empty(), "{:?}", p.actions);
    assert_eq!(ready(&p).1, MANAGED_ELSEWHERE);
    assert!(
        p.status
            .condition(READY)
            .unwrap()
            .message
            .contains("multi-node"),
        "{:?}",
        p.status.condition(READY)
    );
}

#[test]
fn a_worker_pod_stopping_there_is_waited_for_without_a_node_of_this_cluster() {
    let g = attempt_one_dispatched();
    let jobs = [dispatched(&g)];
    // The older copy's pod is being deleted on the worker's node gpu-1; this cluster
    // may have a Node of that name, another machine.
    let stopping = SeenPod {
        name: "train-1-old".into(),
        uid: Some("pod-old".into()),
        job_uid: Some("worker-copy-1".into()),
        gated: false,
        bound: true,
        deleting: true,
        node: Some("gpu-1".into()),
        ..on_worker(9)
    };
    let waiting = on_worker(0);
    let pods = [waiting, stopping];
    let p = Seen::new(&g, &jobs)
        .multikueue()
        .reads(Reads::default())
        .cached(&pods)
        .plan(LATER);
    assert!(
        !p.actions
            .iter()
            .any(|a| matches!(a, Action::Read(Read::Node { .. }))),
        "{:?}",
        p.actions
    );
    // Even with a Node of that name gone here, the pod is only stopping.
    let p = Seen::new(&g, &jobs)
        .multikueue()
        .node("gpu-1", Some(NodeState::Gone))
        .cached(&pods)
        .read(&pods)
        .plan(LATER);
    assert!(ungated_on(&p).is_empty(), "{:?}", p.actions);
    assert_eq!(ready(&p).1, crate::plan::OLD_ATTEMPT_STOPPING);
}

#[test]
fn an_attempt_whose_job_has_live_copies_on_two_workers_lets_no_pod_go() {
    // MultiKueue took worker-a for lost and dispatched the Job to worker-b; the copy on
    // worker-a still runs, and the read counts both copies' pods as the Job's.
    let g = attempt_one_dispatched();
    let jobs = [dispatched(&g)];
    let first = SeenPod {
        name: "train-1-a".into(),
        uid: Some("pod-a".into()),
        cluster: Some("worker-a".into()),
        gated: false,
        bound: true,
        ..pod(1, 1)
    };
    let second = SeenPod {
        cluster: Some("worker-b".into()),
        ..pod(1, 0)
    };
    let pods = [first, second.clone()];
    let p = Seen::new(&g, &jobs)
        .multikueue()
        .cached(&pods)
        .read(&pods)
        .plan(LATER);
    assert!(ungated_on(&p).is_empty(), "{:?}", p.actions);
    assert_eq!(ready(&p).1, crate::plan::OLD_ATTEMPT_STOPPING);
    assert!(
        p.status
            .condition(READY)
            .unwrap()
            .message
            .contains("worker-a, worker-b"),
        "{:?}",
        p.status.condition(READY)
    );
    // The first copy gone: the second's pod goes.
    let p = Seen::new(&g, &jobs)
        .multikueue()
        .cached(std::slice::from_ref(&second))
        .read(std::slice::from_ref(&second))
        .plan(LATER);
    assert_eq!(ungated_on(&p), vec![("train-1-0", Some("worker-b"))]);
}

#[test]
fn a_stray_pod_on_a_worker_is_deleted_there() {
    // Attempt 1 failed and is kept; its Job's pod, made as the Job controller raced its
    // end, waits at the gate on the worker while attempt 2 runs.
    let g = running(&in_queue(gpujob(3), "team"), 2, 1);
    let mut failed = dispatched(&g);
    failed.status = job(&g, 1, Some(("Failed", "BackoffLimitExceeded", T0))).status;
    let mut second = made(&g, 2);
    let spec = second.spec.as_mut().unwrap();
    spec.managed_by = Some(crate::seen_job::MULTIKUEUE.into());
    spec.suspend = Some(false);
    let jobs = [failed, second];
    let stray = on_worker(3);
    let p = Seen::new(&g, &jobs)
        .multikueue()
        .cached(std::slice::from_ref(&stray))
        .read(std::slice::from_ref(&stray))
        .plan(LATER);
    let deletes: Vec<_> = p
        .actions
        .iter()
        .filter_map(|a| match a {
            Action::DeletePod { name, cluster, .. } => Some((name.as_str(), cluster.as_deref())),
            _ => None,
        })
        .collect();
    assert_eq!(
        deletes,
        vec![("train-1-3", Some("worker"))],
        "{:?}",
        p.actions
    );
}

#[test]
fn a_dispatched_attempt_is_pending_until_its_copy_on_the_worker_has_started() {
    let g = attempt_one_dispatched();
    let jobs = [not_started(&g)];
    let p = Seen::new(&g, &jobs).multikueue().plan(LATER);
    assert_eq!(p.status.phase, Some(Phase::Pending));
    assert_eq!(ready(&p).1, crate::status::DISPATCHING);
    // Its pod at the gate there is let go all the same: the copy starts with it.
    let waiting = on_worker(0);
    let p = with_worker_pod_read(&g, &jobs, &waiting);
    assert_eq!(ungated_on(&p), vec![("train-1-0", Some("worker"))]);
    // Its pod placed there, before any status came back (MultiKueue copies it only once
    // the copy changes): Running.
    let placed = SeenPod {
        gated: false,
        bound: true,
        ..on_worker(0)
    };
    let p = Seen::new(&g, &jobs)
        .multikueue()
        .cached(std::slice::from_ref(&placed))
        .plan(LATER);
    assert_eq!(p.status.phase, Some(Phase::Running));
    // A placed pod of another Job there says nothing of this one.
    let other = SeenPod {
        job_uid: Some("worker-copy-0".into()),
        ..placed
    };
    let p = Seen::new(&g, &jobs)
        .multikueue()
        .cached(std::slice::from_ref(&other))
        .plan(LATER);
    assert_eq!(ready(&p).1, crate::status::DISPATCHING);
    // Started there: Running.
    let jobs = [dispatched(&g)];
    let p = Seen::new(&g, &jobs).multikueue().plan(LATER);
    assert_eq!(p.status.phase, Some(Phase::Running));
    assert_eq!(ready(&p).1, crate::status::JOB_RUNNING);
}

#[test]
fn a_worker_pod_waits_while_the_management_job_is_still_suspended() {
    // MultiKueue made the copy, and its pod, before the manager's Kueue started the
    // Job here: letting it go now could let it end before the manager takes its status.
    let g = attempt_one_dispatched();
    let mut suspended = not_started(&g);
    suspended.spec.as_mut().unwrap().suspend = Some(true);
    let jobs = [suspended];
    let waiting = on_worker(0);
    let p = with_worker_pod_read(&g, &jobs, &waiting);
    assert!(ungated_on(&p).is_empty(), "{:?}", p.actions);
    assert_eq!(ready(&p).1, crate::status::QUEUED);
}

#[test]
fn a_dispatched_attempts_pod_goes_only_once_the_status_says_the_workers_are_read() {
    let g = attempt_one(&in_queue(gpujob(3), "team"));
    let jobs = [dispatched(&g)];
    let waiting = on_worker(0);
    // Not recorded yet: this look records it, and lets nothing go.
    let p = with_worker_pod_read(&g, &jobs, &waiting);
    assert!(ungated_on(&p).is_empty(), "{:?}", p.actions);
    assert!(p.status.multi_kueue_dispatched);
    // The next look, from the status written: the pod goes.
    let g = with_status(g, &p);
    let p = with_worker_pod_read(&g, &jobs, &waiting);
    assert_eq!(ungated_on(&p), vec![("train-1-0", Some("worker"))]);
}

/// Attempt 1 ran on a worker; the queue now runs attempt 2 on this cluster. Attempt 1's
/// Job is gone here, and the worker pod cache may not have the copy's pod (its watch
/// still listing, or cut off): the status alone says the workers must be read, and the
/// pod still stopping there holds attempt 2's.
#[test]
fn a_later_attempt_on_this_cluster_reads_the_workers_an_earlier_one_ran_on() {
    let mut g = attempt_one_dispatched();
    if let Some(s) = g.status.as_mut() {
        s.attempts = 2;
        s.active_job = Some("train-2".into());
    }
    // Admitted by a queue of this cluster.
    let mut two = made(&g, 2);
    two.spec.as_mut().unwrap().suspend = Some(false);
    let jobs = [two];
    let here = pod(2, 0);
    let p = Seen::new(&g, &jobs)
        .multikueue()
        .cached(std::slice::from_ref(&here))
        .plan(LATER);
    assert_eq!(p.actions, vec![Action::ReadPods { workers: true }]);
    let stopping = SeenPod {
        gated: false,
        bound: true,
        deleting: true,
        job_uid: Some("worker-copy-1".into()),
        ..on_worker(9)
    };
    let p = Seen::new(&g, &jobs)
        .multikueue()
        .cached(std::slice::from_ref(&here))
        .read(&[here.clone(), stopping])
        .plan(LATER);
    assert!(ungated_on(&p).is_empty(), "{:?}", p.actions);
    assert_eq!(ready(&p).1, crate::plan::OLD_ATTEMPT_STOPPING);
    // A GpuJob never dispatched reads this cluster only.
    let local = attempt_one(&gpujob(3));
    let p = Seen::new(&local, &[made(&local, 1)])
        .multikueue()
        .cached(&[pod(1, 0)])
        .plan(LATER);
    assert_eq!(p.actions, vec![Action::ReadPods { workers: false }]);
}
