//! Attempts Kueue's MultiKueue dispatches (`spec.managedBy: kueue.x-k8s.io/multikueue`):
//! their pods wait at the gate on a worker cluster, where the operator lets them go only
//! when given that cluster (`--multikueue-worker`) and when the attempt's pods need
//! nothing made on this cluster.

use super::gate::{LATER, Seen, attempt_one, made, pod};
use super::*;
use crate::seen_pod::SeenPod;
use crate::status::MANAGED_ELSEWHERE;

/// Attempt 1's Job as MultiKueue leaves it once admitted: managed by it, unsuspended.
fn dispatched(g: &GpuJob) -> Job {
    let mut j = made(g, 1);
    let spec = j.spec.as_mut().unwrap();
    spec.managed_by = Some(crate::seen_job::MULTIKUEUE.into());
    spec.suspend = Some(false);
    j
}

/// Attempt 1's pod on the worker cluster `worker`, at the gate.
fn on_worker(n: u8) -> SeenPod {
    SeenPod {
        cluster: Some("worker".into()),
        ..pod(1, n)
    }
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
    let g = attempt_one(&in_queue(gpujob(3), "team"));
    let jobs = [dispatched(&g)];
    let waiting = on_worker(0);
    // Given the workers: the cache asks for a read, the read lets the pod go there.
    let p = Seen::new(&g, &jobs)
        .multikueue()
        .cached(std::slice::from_ref(&waiting))
        .plan(LATER);
    assert_eq!(p.actions, vec![Action::ReadPods]);
    let p = Seen::new(&g, &jobs)
        .multikueue()
        .cached(std::slice::from_ref(&waiting))
        .read(std::slice::from_ref(&waiting))
        .plan(LATER);
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
    let g = attempt_one(&in_queue(gpujob(3), "team"));
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
    let g = attempt_one(&in_queue(gpujob(3), "team"));
    let mut multi_node = dispatched(&g);
    let spec = multi_node.spec.as_mut().unwrap();
    spec.completion_mode = Some("Indexed".into());
    spec.completions = Some(2);
    spec.parallelism = Some(2);
    let jobs = [multi_node];
    let seen = crate::seen_job::SeenJob::of(&jobs[0]).unwrap();
    assert_eq!(seen.nodes, Some(2), "the Job says it is multi-node");
    let waiting = on_worker(0);
    let p = Seen::new(&g, &jobs)
        .multikueue()
        .cached(std::slice::from_ref(&waiting))
        .read(std::slice::from_ref(&waiting))
        .plan(LATER);
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
    let g = attempt_one(&in_queue(gpujob(3), "team"));
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
