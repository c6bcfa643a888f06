//! Unit tests of the pure parts: the attempts table, the `why` paragraph, the pod a
//! `logs` picks, the patches and their messages, decoding either served version.

use gpujob_core::api::v2::GpuJob;
use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

use crate::snapshot::{SeenEvent, Snapshot};
use crate::{actions, attempts, cluster, logs, why};

const UID: &str = "uid-1";

fn now() -> Timestamp {
    "2026-12-05T10:00:00Z".parse().unwrap()
}

fn gpujob(spec: Value, status: Value) -> GpuJob {
    let mut spec_full = json!({"image": "train:1", "resources": {"gpus": 8}});
    if let (Some(base), Some(more)) = (spec_full.as_object_mut(), spec.as_object()) {
        base.extend(more.clone());
    }
    serde_json::from_value(json!({
        "apiVersion": "gpujob.dev/v2", "kind": "GpuJob",
        "metadata": {"name": "train", "namespace": "team-a", "uid": UID, "generation": 1},
        "spec": spec_full,
        "status": status,
    }))
    .unwrap()
}

fn ready(reason: &str, message: &str) -> Value {
    json!({"type": "Ready", "status": "False", "reason": reason, "message": message,
           "lastTransitionTime": "2026-12-05T09:58:00Z"})
}

/// Job `train-<k>` of attempt k with `conditions` (Job condition JSON).
fn job(k: i32, status: Value, annotations: Value) -> Job {
    serde_json::from_value(json!({
        "metadata": {
            "name": format!("train-{k}"), "namespace": "team-a", "uid": format!("job-{k}"),
            "creationTimestamp": "2026-12-05T09:00:00Z",
            "labels": {"gpujob.dev/uid": UID, "gpujob.dev/attempt": k.to_string()},
            "annotations": annotations,
            "ownerReferences": [{"apiVersion": "gpujob.dev/v1", "kind": "GpuJob", "name": "train",
                                 "uid": UID, "controller": true}],
        },
        "status": status,
    }))
    .unwrap()
}

fn pod(k: i32, rank: i32, name: &str, node: Option<&str>, status: Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {
            "name": name, "namespace": "team-a",
            "creationTimestamp": "2026-12-05T09:00:00Z",
            "labels": {"gpujob.dev/uid": UID, "gpujob.dev/attempt": k.to_string()},
            "annotations": {"batch.kubernetes.io/job-completion-index": rank.to_string()},
        },
        "spec": {"containers": [{"name": "main"}], "nodeName": node},
        "status": status,
    }))
    .unwrap()
}

fn terminated(phase: &str, code: i32, reason: &str) -> Value {
    json!({"phase": phase, "containerStatuses": [{
        "name": "main", "image": "train:1", "imageID": "", "ready": false, "restartCount": 0,
        "state": {"terminated": {"exitCode": code, "reason": reason}},
    }]})
}

fn event(type_: &str, reason: &str, note: &str, at: &str) -> SeenEvent {
    SeenEvent {
        type_: type_.to_owned(),
        reason: reason.to_owned(),
        note: note.to_owned(),
        time: Some(at.parse().unwrap()),
        count: 1,
    }
}

fn snapshot(gpujob: GpuJob) -> Snapshot {
    Snapshot {
        gpujob,
        jobs: vec![],
        pods: vec![],
        events: vec![],
    }
}

/// The paragraph on one line, for `contains` checks.
fn why_of(s: &Snapshot) -> String {
    why::sentences(s, now()).join(" ")
}

#[test]
fn attempts_rows_come_from_jobs_pods_status_and_events() {
    let mut s = snapshot(gpujob(
        json!({}),
        json!({"phase": "Running", "attempts": 3, "failures": 1, "activeJob": "train-3",
               "conditions": [ready("JobRunning", "attempt 3 is running (Job train-3)")]}),
    ));
    // Attempt 1: its Job is gone (older than --keep-jobs); its Events remain.
    s.events.push(event(
        "Normal",
        "AttemptStarted",
        "attempt 1 started (Job train-1)",
        "2026-12-05T09:00:01Z",
    ));
    s.events.push(event(
        "Warning",
        "AttemptFailed",
        "attempt 1 failed: exit code 137 (OOMKilled)",
        "2026-12-05T09:10:00Z",
    ));
    // Attempt 2: disrupted (the operator's own rule, index 0 when the GpuJob has none).
    s.jobs.push(job(
        2,
        json!({"startTime": "2026-12-05T09:11:00Z", "conditions": [{
            "type": "Failed", "status": "True", "reason": "PodFailurePolicy",
            "message": "Pod team-a/train-2-x has condition DisruptionTarget matching FailJob rule at index 0",
            "lastTransitionTime": "2026-12-05T09:20:00Z"}]}),
        json!({}),
    ));
    s.pods.push(pod(
        2,
        0,
        "train-2-x",
        Some("gpu-1"),
        terminated("Failed", 143, "Error"),
    ));
    // Attempt 3: two nodes, running.
    s.jobs.push(job(
        3,
        json!({"startTime": "2026-12-05T09:21:00Z", "active": 2}),
        json!({}),
    ));
    s.pods.push(pod(
        3,
        1,
        "train-3-1-b",
        Some("gpu-4"),
        json!({"phase": "Running"}),
    ));
    s.pods.push(pod(
        3,
        0,
        "train-3-0-a",
        Some("gpu-3"),
        json!({"phase": "Running"}),
    ));

    let rows = attempts::rows(&s);
    let got: Vec<Vec<&str>> = rows
        .iter()
        .map(|r| {
            vec![
                r.job.as_str(),
                &r.phase,
                &r.outcome,
                &r.nodes,
                &r.started,
                &r.ended,
                &r.counted,
            ]
        })
        .collect();
    assert_eq!(
        got,
        vec![
            vec![
                "train-1",
                "Failed",
                "exit 137 (OOMKilled)",
                "-",
                "2026-12-05T09:00:01Z",
                "2026-12-05T09:10:00Z",
                "yes"
            ],
            vec![
                "train-2",
                "Disrupted",
                "exit 143 (Error)",
                "gpu-1",
                "2026-12-05T09:11:00Z",
                "2026-12-05T09:20:00Z",
                "no"
            ],
            vec![
                "train-3",
                "Running",
                "-",
                "gpu-3,gpu-4",
                "2026-12-05T09:21:00Z",
                "-",
                "-"
            ],
        ]
    );
    let table = attempts::render(&rows);
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].starts_with("ATTEMPT  JOB      PHASE"), "{table}");
    assert_eq!(lines.len(), 4, "{table}");
}

#[test]
fn a_failure_rule_that_retries_without_counting_is_not_counted() {
    let mut s = snapshot(gpujob(
        json!({}),
        json!({"phase": "Pending", "attempts": 1, "conditions": [ready("BackingOff", "")]}),
    ));
    s.jobs.push(job(
        1,
        json!({"conditions": [{"type": "Failed", "status": "True", "reason": "PodFailurePolicy",
            "message": "Container main for pod team-a/train-1-x failed with exit code 3 matching FailJob rule at index 1"}]}),
        json!({"gpujob.dev/failure-rules": "FailGpuJob,RetryWithoutCounting,Disruption"}),
    ));
    s.pods.push(pod(
        1,
        0,
        "train-1-x",
        Some("gpu-2"),
        terminated("Failed", 3, "Error"),
    ));
    let rows = attempts::rows(&s);
    assert_eq!(
        (
            rows[0].phase.as_str(),
            rows[0].counted.as_str(),
            rows[0].outcome.as_str()
        ),
        ("Failed", "no", "exit 3 (Error)")
    );
    // The last failure as status recorded it decides for an attempt whose Job is gone.
    s.jobs.clear();
    s.gpujob.status.as_mut().unwrap().last_failure = Some(
        serde_json::from_value(json!({"attempt": 1, "time": "2026-12-05T09:30:00Z",
            "exitCode": 3, "reason": "Error", "message": "m", "counted": false}))
        .unwrap(),
    );
    let rows = attempts::rows(&s);
    assert_eq!(
        (
            rows[0].phase.as_str(),
            rows[0].counted.as_str(),
            rows[0].ended.as_str()
        ),
        ("Failed", "no", "2026-12-05T09:30:00Z")
    );
}

#[test]
fn an_attempt_stopped_by_a_suspend_or_a_spec_change_is_not_a_failure() {
    let mut s = snapshot(gpujob(
        json!({"suspend": true}),
        json!({"phase": "Suspended", "attempts": 2, "replacingAttempt": 2}),
    ));
    s.events.push(event(
        "Normal",
        "SpecChangeApplied",
        "the spec changed (generation 2): attempt 1 is replaced by a new attempt",
        "2026-12-05T09:10:00Z",
    ));
    // Attempt 2's Job is still being deleted; then it is gone.
    let mut deleting = job(2, json!({"active": 1}), json!({}));
    deleting.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now()));
    s.jobs.push(deleting);
    let phases = |s: &Snapshot| -> Vec<(String, String)> {
        attempts::rows(s)
            .into_iter()
            .map(|r| (r.phase, r.counted))
            .collect()
    };
    let pair = |p: &str, c: &str| (p.to_owned(), c.to_owned());
    assert_eq!(phases(&s), [pair("Stopped", "no"), pair("Stopping", "-")]);
    s.jobs.clear();
    assert_eq!(phases(&s), [pair("Stopped", "no"), pair("Stopped", "no")]);
}

#[test]
fn why_says_kueue_admission_with_kueues_words() {
    let s = snapshot(gpujob(
        json!({"queueName": "team-a"}),
        json!({"phase": "Pending", "attempts": 1, "conditions": [
            ready("Queued", "attempt 1 waits in LocalQueue team-a"),
            {"type": "Admitted", "status": "False", "reason": "Pending",
             "message": "insufficient unused quota for nvidia.com/gpu in flavor gpu, 8 more needed",
             "lastTransitionTime": "2026-12-05T09:58:00Z"}]}),
    ));
    let w = why_of(&s);
    assert!(
        w.contains("waits for Kueue admission: attempt 1 is queued in Kueue LocalQueue team-a (Pending: insufficient unused quota for nvidia.com/gpu in flavor gpu, 8 more needed)"),
        "{w}"
    );
}

#[test]
fn why_says_quota_nodes_lost_node_and_name_conflicts() {
    let cases = [
        (
            json!([ready("QuotaRefused", "the quota service refused: team over quota"),
                   {"type": "QuotaReserved", "status": "False", "reason": "OverQuota",
                    "message": "team-a has 0 GPUs left", "lastTransitionTime": "2026-12-05T09:00:00Z"}]),
            "waits for GPU quota from the quota service: the quota service refused: team over quota (OverQuota: team-a has 0 GPUs left)",
        ),
        (
            json!([ready(
                "Unschedulable",
                "attempt 1 waits for a node: 0/4 nodes are available: 4 Insufficient nvidia.com/gpu"
            )]),
            "waits for nodes: kube-scheduler finds no node for its pods: attempt 1 waits for a node: 0/4 nodes are available: 4 Insufficient nvidia.com/gpu",
        ),
        (
            json!([ready(
                "WaitingForLostNode",
                "pod train-1-x is being deleted on node gpu-7, which is not Ready"
            )]),
            "waits for a lost node: pod train-1-x is being deleted on node gpu-7, which is not Ready. Only a person ends this wait",
        ),
        (
            json!([ready(
                "JobNameConflict",
                "Job team-a/train-2 exists and is not controlled by this GpuJob; delete or rename it"
            )]),
            "waits for a name conflict to end: Job team-a/train-2 exists",
        ),
        (
            json!([ready(
                "ServiceNameConflict",
                "Service team-a/train-2 was not made by the operator"
            )]),
            "waits for a name conflict to end: Service team-a/train-2",
        ),
        (
            json!([ready(
                "Dispatching",
                "attempt 1's Job is admitted, and Kueue's MultiKueue runs it on a worker cluster; no pod of it is placed there yet, and no status has come back from there"
            )]),
            "waits for its Job's copy on a MultiKueue worker cluster to run: attempt 1's Job is admitted",
        ),
        (
            json!([ready(
                "ManagedElsewhere",
                "attempt 1's Job is managed by kueue.x-k8s.io/multikueue (Kueue's MultiKueue runs it on another cluster)"
            )]),
            "does not run: its Job is managed elsewhere: attempt 1's Job is managed by kueue.x-k8s.io/multikueue",
        ),
        (
            json!([ready(
                "InvalidSpec",
                "invalid spec: spec.image: not a reference"
            )]),
            "waits for a spec change: its spec is invalid: invalid spec: spec.image",
        ),
    ];
    for (conditions, want) in cases {
        let s = snapshot(gpujob(
            json!({}),
            json!({"phase": "Pending", "attempts": 1, "conditions": conditions}),
        ));
        let w = why_of(&s);
        assert!(w.contains(want), "want {want:?} in {w:?}");
    }
}

#[test]
fn why_names_an_old_attempts_pods_still_there() {
    let mut s = snapshot(gpujob(
        json!({}),
        json!({"phase": "Pending", "attempts": 2, "conditions": [
            ready("OldAttemptStopping", "attempt 2 waits until the pods of Job train-1 are gone")]}),
    ));
    let mut old = pod(
        1,
        0,
        "train-1-x",
        Some("gpu-5"),
        json!({"phase": "Running"}),
    );
    old.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now()));
    s.pods.push(old);
    s.pods.push(pod(
        1,
        0,
        "train-1-done",
        Some("gpu-5"),
        json!({"phase": "Failed"}),
    ));
    let mut never_bound = pod(1, 1, "train-1-unbound", None, json!({"phase": "Pending"}));
    never_bound.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now()));
    s.pods.push(never_bound);
    let w = why_of(&s);
    assert!(
        !w.contains("train-1-unbound"),
        "a pod deleted before it was bound is never placed: {w}"
    );
    assert!(
        w.contains("waits for an old attempt's pods to be gone before attempt 2 may run: attempt 2 waits until the pods of Job train-1 are gone; still there: pod train-1-x (attempt 1, Running, on node gpu-5, being deleted)."),
        "{w}"
    );
    assert!(
        !w.contains("train-1-done"),
        "a finished pod runs nothing: {w}"
    );
}

#[test]
fn why_says_backoff_suspend_finish_rerun_and_the_latest_warning() {
    let mut s = snapshot(gpujob(
        json!({}),
        json!({"phase": "Pending", "attempts": 1, "failures": 1,
               "nextAttemptTime": "2026-12-05T10:00:30Z",
               "lastFailure": {"attempt": 1, "time": "2026-12-05T09:59:50Z", "exitCode": 1,
                               "reason": "Error", "message": "attempt 1 failed: exit code 1 (Error)"},
               "conditions": [ready("BackingOff", "")]}),
    ));
    s.events.push(event(
        "Warning",
        "AttemptFailed",
        "attempt 1 failed: exit code 1 (Error)",
        "2026-12-05T09:59:50Z",
    ));
    let w = why_of(&s);
    assert!(
        w.contains("waits for its retry backoff until 2026-12-05T10:00:30Z (in 30s) after attempt 1 failed: exit code 1 (Error); then attempt 2 starts."),
        "{w}"
    );
    assert!(
        w.ends_with(
            "Latest Warning Event (10s ago): AttemptFailed: attempt 1 failed: exit code 1 (Error)."
        ),
        "{w}"
    );

    let s = snapshot(gpujob(
        json!({"suspend": true}),
        json!({"phase": "Suspended", "attempts": 1, "replacingAttempt": 1, "conditions": [
            ready("Suspended", "spec.suspend holds it"),
            {"type": "Suspended", "status": "True", "reason": "Suspended",
             "lastTransitionTime": "2026-12-05T09:50:00Z"}]}),
    ));
    let w = why_of(&s);
    assert!(
        w.contains("waits to be resumed: spec.suspend is true since 2026-12-05T09:50:00Z; attempt 1 is being stopped"),
        "{w}"
    );

    let mut done = gpujob(
        json!({}),
        json!({"phase": "Succeeded", "attempts": 2, "completionTime": "2026-12-05T09:40:00Z",
               "conditions": [{"type": "Ready", "status": "True", "reason": "Succeeded",
                               "lastTransitionTime": "2026-12-05T09:40:00Z"}]}),
    );
    let w = why_of(&snapshot(done.clone()));
    assert!(
        w.contains(
            "is Succeeded, attempt 2. It succeeded at 2026-12-05T09:40:00Z; it waits for nothing."
        ),
        "{w}"
    );
    done.metadata.annotations = Some([("gpujob.dev/rerun".to_owned(), "r1".to_owned())].into());
    let w = why_of(&snapshot(done));
    assert!(
        w.contains("A rerun is requested (gpujob.dev/rerun=r1) and not answered yet"),
        "{w}"
    );
}

#[test]
fn why_without_status_says_no_replica_looked() {
    let s = snapshot(gpujob(json!({}), json!(null)));
    let w = why_of(&s);
    assert!(
        w.contains("has no status yet: it waits for an operator replica"),
        "{w}"
    );
    // One paragraph, wrapped.
    let text = why::paragraph(&s, now(), 40);
    assert!(text.lines().all(|l| l.len() <= 40), "{text}");
    assert!(!text.contains("\n\n"), "{text}");
}

#[test]
fn logs_picks_the_newest_attempt_with_pods_and_the_pod_of_a_rank() {
    let mut s = snapshot(gpujob(
        json!({"nodes": 2}),
        json!({"phase": "Running", "attempts": 3}),
    ));
    s.pods.push(pod(
        2,
        0,
        "train-2-0",
        Some("gpu-1"),
        json!({"phase": "Failed"}),
    ));
    s.pods.push(pod(
        3,
        1,
        "train-3-1",
        Some("gpu-2"),
        json!({"phase": "Running"}),
    ));
    s.pods.push(pod(
        3,
        0,
        "train-3-0",
        Some("gpu-3"),
        json!({"phase": "Running"}),
    ));
    let c = logs::choose(&s, None, None).unwrap();
    assert_eq!((c.attempt, c.rank, c.ranks), (3, 0, 2));
    assert_eq!(c.pod.metadata.name.as_deref(), Some("train-3-0"));
    let c = logs::choose(&s, None, Some(1)).unwrap();
    assert_eq!(c.pod.metadata.name.as_deref(), Some("train-3-1"));
    let c = logs::choose(&s, Some(2), None).unwrap();
    assert_eq!(c.pod.metadata.name.as_deref(), Some("train-2-0"));
    let e = logs::choose(&s, Some(3), Some(5)).unwrap_err().to_string();
    assert_eq!(
        e,
        "attempt 3 of GpuJob team-a/train has no pod of rank 5 (ranks: 0, 1)"
    );
    let e = logs::choose(&s, Some(1), None).unwrap_err().to_string();
    assert_eq!(
        e,
        "attempt 1 of GpuJob team-a/train has no pods (attempts with pods: 2, 3)"
    );
}

#[test]
fn suspend_resume_and_rerun_patch_what_the_api_documents() {
    assert_eq!(
        actions::suspend_patch(true),
        json!({"spec": {"suspend": true}})
    );
    assert_eq!(
        actions::rerun_patch("t1"),
        json!({"metadata": {"annotations": {"gpujob.dev/rerun": "t1"}}})
    );
    let running = gpujob(
        json!({}),
        json!({"phase": "Running", "attempts": 1, "activeJob": "train-1", "rerunToken": "t0"}),
    );
    assert!(actions::suspend_needed(&running, true).is_ok());
    assert_eq!(
        actions::suspend_needed(&running, false).unwrap_err(),
        "GpuJob team-a/train is already not suspended (spec.suspend: false); nothing changed"
    );
    assert_eq!(
        actions::suspend_done(&running, true),
        "GpuJob team-a/train suspended (spec.suspend: true): no new attempt starts; its running attempt (Job train-1) is stopped, not counted as a failure"
    );
    assert!(actions::rerun_needed(&running, "t0").is_err());
    assert_eq!(
        actions::rerun_done(&running, "t1"),
        "GpuJob team-a/train: rerun requested (gpujob.dev/rerun=t1); it has not finished (Running): run 2 starts once it has"
    );
    assert_eq!(
        actions::suspend_done(&running, false),
        "GpuJob team-a/train resumed (spec.suspend: false): the next attempt starts, after what remains of a retry backoff"
    );
    let done = gpujob(json!({}), json!({"phase": "Failed", "attempts": 4}));
    assert_eq!(
        actions::suspend_done(&done, false),
        "GpuJob team-a/train resumed (spec.suspend: false); it has finished (Failed), so no attempt starts: `kubectl gpujob rerun` starts a new run"
    );
    assert_eq!(
        actions::rerun_done(&done, "t1"),
        "GpuJob team-a/train: rerun requested (gpujob.dev/rerun=t1); run 2 starts with attempt 5 (retries counted from 0 again)"
    );
}

#[test]
fn a_v1_gpujob_decodes_as_v2() {
    let gj = cluster::decode(json!({
        "apiVersion": "gpujob.dev/v1", "kind": "GpuJob",
        "metadata": {"name": "train", "namespace": "team-a"},
        "spec": {"image": "train:1", "gpus": 2, "maxRetries": 1, "suspend": true,
                 "v2": {"nodes": 2, "queueName": "q"}},
        "status": {"phase": "Suspended", "attempts": 1},
    }))
    .unwrap();
    assert_eq!(
        (gj.spec.resources.gpus, gj.spec.nodes, gj.spec.suspend),
        (Some(2), 2, true)
    );
    assert_eq!(gj.spec.queue_name.as_deref(), Some("q"));
    assert_eq!(gj.status.unwrap().attempts, 1);
    assert!(cluster::decode(json!({"apiVersion": "gpujob.dev/v2", "spec": 3})).is_err());
}
