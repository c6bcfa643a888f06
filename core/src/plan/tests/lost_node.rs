//! A next attempt that waits for a pod being deleted on a node that is not Ready, or
//! gone: the plan reads that Node with its other reads, and says so in Ready
//! (`WaitingForLostNode`, the node named) instead of `OldAttemptStopping`.

use super::*;

const NODE: &str = "gpu-7";
const LATER: &str = "2026-11-30T06:10:00Z";

/// A pod of attempt `attempt`'s Job (uid `job-uid-<attempt>`), let go and placed on
/// [`NODE`], running.
fn placed(attempt: i32) -> SeenPod {
    let mut p = super::gate::pod(attempt, 0);
    p.gated = false;
    p.bound = true;
    p.node = Some(NODE.into());
    p
}

fn stopping(mut p: SeenPod) -> SeenPod {
    p.deleting = true;
    p
}

/// Attempt `attempt`'s pod, waiting at the gate.
fn gated(attempt: i32) -> SeenPod {
    let mut p = placed(attempt);
    p.gated = true;
    p.bound = false;
    p.node = None;
    p
}

fn not_ready(status: &str, reason: &str) -> NodeState {
    NodeState::NotReady {
        status: status.into(),
        reason: reason.into(),
    }
}

use super::gate::Seen;

/// Attempt 2 recorded, its Job made and its pod waiting at the gate; attempt 1's pod,
/// its Job gone, is `old`. The pod read shows both; the Node read found `node`.
fn gate_waits(g2: &GpuJob, jobs: &[Job], old: SeenPod, node: Option<NodeState>) -> Plan {
    let pods = vec![old, gated(2)];
    Seen::new(g2, jobs)
        .cached(&pods)
        .read(&pods)
        .node(NODE, node)
        .plan(LATER)
}

fn made(g: &GpuJob, attempt: i32) -> Job {
    let mut j = desired_job(g, attempt);
    j.metadata.uid = Some(format!("job-uid-{attempt}"));
    j.metadata.resource_version = Some(format!("{attempt}01"));
    j
}

fn ungates(p: &Plan) -> usize {
    p.actions
        .iter()
        .filter(|a| matches!(a, Action::UngatePod { .. }))
        .count()
}

#[test]
fn a_pod_stopping_on_a_node_has_that_node_read_with_the_other_reads() {
    let g = gpujob(3);
    let g2 = running(&g, 2, 1);
    let jobs = [made(&g, 2)];
    let asked = |cached: Vec<SeenPod>, reads: Reads| {
        let p = Seen::new(&g2, &jobs)
            .cached(&cached)
            .reads(reads)
            .plan(LATER);
        p.actions
            .iter()
            .filter_map(|a| match a {
                Action::Read(r) => Some(r.clone()),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    let node_read = Read::Node { name: NODE.into() };
    // Being deleted on its node: read it, and nothing else is planned before.
    assert_eq!(
        asked(vec![stopping(placed(1)), gated(2)], Reads::default()),
        vec![node_read.clone()]
    );
    // Two pods on the same node: one read.
    let mut twin = stopping(placed(1));
    twin.name = "train-1-1".into();
    assert_eq!(
        asked(vec![stopping(placed(1)), twin, gated(2)], Reads::default()),
        vec![node_read.clone()]
    );
    // Running and not deleted, finished, or deleted before it was placed: its node is
    // not what the next attempt waits on.
    let mut finished = stopping(placed(1));
    finished.terminal = true;
    for pod in [placed(1), finished, stopping(gated(1))] {
        assert_eq!(
            asked(vec![pod.clone(), gated(2)], Reads::default()),
            vec![],
            "{pod:?}"
        );
    }
    // Asked once per reconcile.
    let mut reads = Reads::default();
    reads.record(
        node_read.clone(),
        &Found::Node(NodeHealth {
            name: NODE.into(),
            state: NodeState::Ready,
        }),
    );
    assert_eq!(asked(vec![stopping(placed(1)), gated(2)], reads), vec![]);
    // A finished GpuJob waits for nothing.
    let mut done = g2.clone();
    if let Some(s) = done.status.as_mut() {
        s.phase = Some(Phase::Succeeded);
    }
    let p = Seen::new(&done, &jobs)
        .cached(&[stopping(placed(1))])
        .reads(Reads::default())
        .plan(LATER);
    assert!(
        !p.actions
            .iter()
            .any(|a| matches!(a, Action::Read(Read::Node { .. }))),
        "{:?}",
        p.actions
    );
}

#[test]
fn the_gate_says_which_lost_node_holds_the_next_attempt() {
    let g = gpujob(3);
    let g2 = running(&g, 2, 1);
    let jobs = [made(&g, 2)];
    for node in [
        not_ready("Unknown", "NodeStatusUnknown"),
        not_ready("False", "KubeletNotReady"),
        NodeState::Gone,
    ] {
        let p = gate_waits(&g2, &jobs, stopping(placed(1)), Some(node.clone()));
        assert_eq!(ungates(&p), 0, "{:?}", p.actions);
        assert_eq!(p.status.phase, Some(Phase::Pending));
        let c = p.status.condition(READY).unwrap();
        assert_eq!(c.reason, WAITING_FOR_LOST_NODE, "{node:?}");
        for words in [
            "attempt 2 starts once pod train-1-0 (attempt 1) is gone",
            "node gpu-7",
            "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute",
        ] {
            assert!(c.message.contains(words), "{words}: {}", c.message);
        }
        assert_eq!(
            p.next,
            Next::After(LOST_NODE_RECHECK),
            "nothing watches Nodes"
        );
    }
    let p = gate_waits(
        &g2,
        &jobs,
        stopping(placed(1)),
        Some(not_ready("Unknown", "NodeStatusUnknown")),
    );
    let message = &p.status.condition(READY).unwrap().message;
    assert!(
        message.contains("is not Ready (Ready=Unknown, NodeStatusUnknown)"),
        "{message}"
    );
    // A Ready node stops its pod itself; a node the operator may not read, or did not
    // read, is not known lost; a pod not being deleted is not waited for as a stopping
    // one. All of these say OldAttemptStopping, as before.
    for (old, node) in [
        (stopping(placed(1)), Some(NodeState::Ready)),
        (stopping(placed(1)), Some(NodeState::Unreadable)),
        (stopping(placed(1)), None),
        (placed(1), Some(not_ready("Unknown", "NodeStatusUnknown"))),
    ] {
        let p = gate_waits(&g2, &jobs, old.clone(), node.clone());
        assert_eq!(ungates(&p), 0, "{:?}", p.actions);
        let c = p.status.condition(READY).unwrap();
        assert_eq!(c.reason, OLD_ATTEMPT_STOPPING, "{old:?} {node:?}");
        assert_eq!(p.next, Next::Backoff);
    }
    // Once the pod has ended (its node back, or a person marked it out of service and
    // the pod garbage collector deleted it), the gate goes.
    let mut ended = stopping(placed(1));
    ended.terminal = true;
    let p = gate_waits(&g2, &jobs, ended, Some(NodeState::Gone));
    assert_eq!(ungates(&p), 1, "{:?}", p.actions);
}

#[test]
fn an_old_attempts_job_whose_pod_is_on_a_lost_node_says_so() {
    // Attempt 1 failed, its backoff is over, but its Job still counts a pod
    // terminating: it is being deleted on a node that is not Ready.
    let g = running(&gpujob(3), 1, 0);
    let mut failed = job(&g, 1, Some(("Failed", "BackoffLimitExceeded", T0)));
    if let Some(s) = failed.status.as_mut() {
        s.terminating = Some(1);
    }
    let jobs = [failed];
    let with = |cached: Vec<SeenPod>, node: Option<NodeState>| {
        Seen::new(&g, &jobs)
            .cached(&cached)
            .node(NODE, node)
            .plan(LATER)
    };
    let p = with(
        vec![stopping(placed(1))],
        Some(not_ready("False", "KubeletNotReady")),
    );
    assert!(creates(&p).is_empty(), "{:?}", p.actions);
    assert_eq!(p.status.phase, Some(Phase::Pending));
    let c = p.status.condition(READY).unwrap();
    assert_eq!(c.reason, WAITING_FOR_LOST_NODE);
    assert!(
        c.message.contains("node gpu-7") && c.message.contains("pod train-1-0 (attempt 1)"),
        "{}",
        c.message
    );
    assert_eq!(p.next, Next::After(LOST_NODE_RECHECK));
    // The node Ready: the Job's pods stop by themselves (the Job watch says when).
    let p = with(vec![stopping(placed(1))], Some(NodeState::Ready));
    assert_eq!(ready(&p).1, OLD_ATTEMPT_STOPPING);
    assert_eq!(p.next, Next::Done);
    // A pod of another Job (not the one waited for) on the lost node is not the reason.
    let mut other = stopping(placed(1));
    other.job_uid = Some("job-uid-9".into());
    let p = with(vec![other], Some(NodeState::Gone));
    assert_eq!(ready(&p).1, OLD_ATTEMPT_STOPPING);
}

/// A deleted GpuJob holding a quota reservation: its Job, deleted in the foreground,
/// waits for a pod being deleted on a node that is not Ready. The release (and with it
/// the finalizer, so the deletion) waits for that pod; the plan reads the Node and Ready
/// says which node holds it, as it does for a next attempt.
#[test]
fn a_deleted_gpujobs_release_says_which_lost_node_holds_it() {
    let mut g = running(&gpujob(3), 1, 0);
    g.metadata.finalizers = Some(vec![crate::api::FINALIZER_QUOTA.into()]);
    if let Some(s) = g.status.as_mut() {
        s.reservation_id = Some("r-1".into());
        s.reservation_gpus = Some(1);
    }
    g.metadata.deletion_timestamp = Some(Time(t("2026-11-30T06:05:00Z")));
    let mut going = made(&g, 1);
    going.metadata.deletion_timestamp = Some(Time(t("2026-11-30T06:05:01Z")));
    let jobs = [going];
    let pod = stopping(placed(1));
    let node_reads = |p: &Plan| {
        p.actions
            .iter()
            .filter(|a| matches!(a, Action::Read(Read::Node { .. })))
            .count()
    };
    let released = |p: &Plan| p.actions.iter().any(|a| matches!(a, Action::Release(_)));
    // Its Node is read.
    let p = Seen::new(&g, &jobs)
        .with_quota(None)
        .cached(std::slice::from_ref(&pod))
        .reads(Reads::default())
        .plan(LATER);
    assert_eq!(node_reads(&p), 1, "{:?}", p.actions);
    // Not Ready: said, nothing released, looked at again in a while.
    let p = Seen::new(&g, &jobs)
        .with_quota(None)
        .cached(std::slice::from_ref(&pod))
        .node(NODE, Some(not_ready("Unknown", "NodeStatusUnknown")))
        .plan(LATER);
    assert!(!released(&p), "{:?}", p.actions);
    let c = p.status.condition(READY).unwrap();
    assert_eq!(c.reason, WAITING_FOR_LOST_NODE);
    for words in [
        "the GpuJob is deleted, and its GPU quota released, only once pod train-1-0 (attempt 1) is gone",
        "node gpu-7",
        "out-of-service",
    ] {
        assert!(c.message.contains(words), "{words}: {}", c.message);
    }
    assert_eq!(p.next, Next::After(LOST_NODE_RECHECK));
    // The Job gone, the pod read still stopping there: the same.
    let p = Seen::new(&g, &[])
        .with_quota(None)
        .cached(std::slice::from_ref(&pod))
        .read(std::slice::from_ref(&pod))
        .node(NODE, Some(NodeState::Gone))
        .plan(LATER);
    assert!(!released(&p), "{:?}", p.actions);
    assert_eq!(ready(&p).1, WAITING_FOR_LOST_NODE);
    // A Ready node stops the pod itself: nothing said of a node.
    let p = Seen::new(&g, &jobs)
        .with_quota(None)
        .cached(std::slice::from_ref(&pod))
        .node(NODE, Some(NodeState::Ready))
        .plan(LATER);
    let reason = p.status.condition(READY).map(|c| c.reason.clone());
    assert_ne!(reason.as_deref(), Some(WAITING_FOR_LOST_NODE));
    // Said before, and the node came back: no longer said (nor counted, nor paged).
    let said = Seen::new(&g, &jobs)
        .with_quota(None)
        .cached(std::slice::from_ref(&pod))
        .node(NODE, Some(NodeState::Gone))
        .plan(LATER);
    let said = with_status(g.clone(), &said);
    assert_eq!(
        said.status
            .as_ref()
            .unwrap()
            .condition(READY)
            .unwrap()
            .reason,
        WAITING_FOR_LOST_NODE
    );
    let p = Seen::new(&said, &jobs)
        .with_quota(None)
        .cached(std::slice::from_ref(&pod))
        .node(NODE, Some(NodeState::Ready))
        .plan(LATER);
    assert_eq!(ready(&p).1, crate::status::DELETING);
    assert!(!released(&p), "{:?}", p.actions);
    // Without the finalizer (no quota to release) the deletion waits on nothing of the
    // operator's: no Node is read.
    let mut free = g.clone();
    free.metadata.finalizers = None;
    let p = Seen::new(&free, &jobs)
        .with_quota(None)
        .cached(std::slice::from_ref(&pod))
        .reads(Reads::default())
        .plan(LATER);
    assert_eq!(node_reads(&p), 0, "{:?}", p.actions);
}

/// A finished GpuJob holding a reservation, one of its pods still being deleted on a
/// node that is not Ready: the reservation is kept until that pod is gone, and
/// `QuotaReserved` says which node keeps it (Ready stays the final one). The node back,
/// it says `Reserved` again; the pod gone, the reservation is released.
#[test]
fn a_finished_gpujobs_reservation_says_which_lost_node_keeps_it() {
    let mut g = running(&gpujob(3), 1, 0);
    g.metadata.finalizers = Some(vec![crate::api::FINALIZER_QUOTA.into()]);
    if let Some(s) = g.status.as_mut() {
        s.phase = Some(Phase::Succeeded);
        s.reservation_id = Some("r-1".into());
        s.reservation_gpus = Some(1);
    }
    let pod = stopping(placed(1));
    let pods = std::slice::from_ref(&pod);
    let released = |p: &Plan| p.actions.iter().any(|a| matches!(a, Action::Release(_)));
    let quota = |p: &Plan| p.status.condition(crate::status::QUOTA_RESERVED).cloned();
    // Its Node is read.
    let p = Seen::new(&g, &[])
        .with_quota(None)
        .cached(pods)
        .reads(Reads::default())
        .plan(LATER);
    assert!(
        p.actions
            .iter()
            .any(|a| matches!(a, Action::Read(Read::Node { .. }))),
        "{:?}",
        p.actions
    );
    // Gone: kept, and said.
    let p = Seen::new(&g, &[])
        .with_quota(None)
        .cached(pods)
        .read(pods)
        .node(NODE, Some(NodeState::Gone))
        .plan(LATER);
    assert!(!released(&p), "{:?}", p.actions);
    let c = quota(&p).unwrap();
    assert_eq!(
        (c.status, c.reason.as_str()),
        (ConditionStatus::True, WAITING_FOR_LOST_NODE)
    );
    assert!(
        c.message.contains(
            "GPU quota reservation r-1 is released once pod train-1-0 (attempt 1) is gone"
        ),
        "{}",
        c.message
    );
    assert_eq!(p.status.phase, Some(Phase::Succeeded));
    assert_eq!(
        p.status.condition(READY),
        g.status.as_ref().unwrap().condition(READY),
        "Ready stays the final one"
    );
    assert_eq!(p.next, Next::After(LOST_NODE_RECHECK));
    // The node back, the pod still stopping: Reserved again.
    let kept = with_status(g.clone(), &p);
    let p = Seen::new(&kept, &[])
        .with_quota(None)
        .cached(pods)
        .read(pods)
        .node(NODE, Some(NodeState::Ready))
        .plan(LATER);
    assert!(!released(&p), "{:?}", p.actions);
    assert_eq!(quota(&p).unwrap().reason, "Reserved");
    // The pod gone: released.
    let p = Seen::new(&kept, &[]).with_quota(None).read(&[]).plan(LATER);
    assert!(released(&p), "{:?}", p.actions);
}
