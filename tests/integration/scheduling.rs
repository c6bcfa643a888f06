//! GPUs as the real kube-scheduler hands them out on devcluster's fake GPU nodes: an
//! attempt whose pod fits no node is Pending with the scheduler's reason (not Running,
//! not failed, not retried), and attempts queued for GPUs run once others free them.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use crate::support;

use std::time::Duration;

use gpujob_operator::api::Phase;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;
use support::nodes::OwnNode;
use support::{TestEnv, phase, ready, sim_env, with_reasons};

/// A GpuJob spec for `node`: `gpus` GPUs, running `seconds`.
fn on(node: &OwnNode, gpus: i32, seconds: &str) -> serde_json::Value {
    node.place(json!({
        "image": "i", "gpus": gpus,
        "env": sim_env(&[("SIM_DURATION_SECONDS", seconds)]),
    }))
}

fn reason(g: &gpujob_operator::api::GpuJob) -> String {
    ready(g).map(|(_, r, _)| r).unwrap_or_default()
}

#[tokio::test]
async fn a_gpujob_asking_for_more_gpus_than_any_node_has_stays_pending_saying_why() {
    let env = TestEnv::new("sched-toobig").await;
    let mut settings = env.settings();
    // More than the 8 of any fake node, within what this operator allows.
    settings.plan.limits.max_gpus = 16;
    let op = env.operator("sched-toobig", settings).await;
    env.create("huge", json!({"image": "i", "gpus": 16})).await;
    let pending = env
        .wait_gpujob("huge", "Pending: Unschedulable", |g| {
            phase(g) == Some(Phase::Pending) && reason(g) == "Unschedulable"
        })
        .await;
    let (status, _, message) = ready(&pending).unwrap();
    assert_eq!(status, "False");
    assert!(
        message.contains("attempt 1 waits for a node")
            && message.contains("Insufficient nvidia.com/gpu"),
        "{message}"
    );
    let s = pending.status.clone().unwrap();
    // Its one attempt waits: not failed, not retried, its Job kept.
    assert_eq!((s.attempts, s.failures), (1, 0));
    assert_eq!(s.active_job.as_deref(), Some("huge-1"));
    let events = env
        .events_of("huge", with_reasons(&["Unschedulable"]))
        .await;
    let unschedulable: Vec<_> = events
        .iter()
        .filter(|(t, r, _, _)| t == "Warning" && r == "Unschedulable")
        .collect();
    assert_eq!(unschedulable.len(), 1, "{events:?}");
    assert!(unschedulable[0].2.contains("Insufficient nvidia.com/gpu"));
    op.stop().await;
}

#[tokio::test]
async fn an_attempt_queued_for_gpus_runs_once_another_frees_them() {
    let env = TestEnv::new("sched-queue").await;
    let node = OwnNode::create(&env, 2).await;
    let op = env.operator("sched-queue", env.settings()).await;
    // The first holds the node's two GPUs until the test suspends it: no race between
    // its end and the second being judged.
    env.create("first", on(&node, 2, "3600")).await;
    // Its pod running on the node (the GpuJob says Running a little earlier, while the
    // scheduler has its grace): only then is the second sure to be the one that waits.
    let jobs = env.jobs();
    devcluster::wait::until(
        "first's pod running",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || {
            let jobs = jobs.clone();
            async move {
                let job = jobs.get_opt("first-1").await.ok()??;
                (job.status?.ready? == 1).then_some(())
            }
        },
    )
    .await
    .unwrap();
    env.create("second", on(&node, 2, "1")).await;
    let queued = env
        .wait_gpujob("second", "Pending: Unschedulable", |g| {
            reason(g) == "Unschedulable"
        })
        .await;
    assert_eq!(phase(&queued), Some(Phase::Pending));
    let (_, _, message) = ready(&queued).unwrap();
    assert!(message.contains("Insufficient nvidia.com/gpu"), "{message}");
    let first = env.gpujobs().get("first").await.unwrap();
    assert_eq!(phase(&first), Some(Phase::Running), "the GPUs' holder");

    // The first stops (suspended: its Job and pod go), its GPUs free up, and the second
    // is placed and runs to the end.
    let freed_from = jiff::Timestamp::now();
    env.gpujobs()
        .patch(
            "first",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"suspend": true}})),
        )
        .await
        .unwrap();
    let done = env
        .wait_gpujob("second", "Succeeded", |g| {
            phase(g) == Some(Phase::Succeeded)
        })
        .await;
    let s = done.status.unwrap();
    assert_eq!((s.attempts, s.failures), (1, 0));
    let first = env
        .wait_gpujob("first", "Suspended", |g| phase(g) == Some(Phase::Suspended))
        .await;
    assert_eq!(first.status.unwrap().failures, 0);
    // On the node, one after the other: the second's pod started only once the first
    // was being stopped (times in whole seconds, as the API keeps them).
    let pods: Api<Pod> = Api::namespaced(env.admin.clone(), &env.ns);
    let second = pods
        .list(&ListParams::default().labels("job-name=second-1"))
        .await
        .unwrap();
    let second_start = second
        .items
        .iter()
        .filter_map(|p| p.status.as_ref()?.start_time.as_ref().map(|t| t.0))
        .min()
        .unwrap();
    let freed_from = jiff::Timestamp::from_second(freed_from.as_second()).unwrap();
    assert!(
        second_start >= freed_from,
        "the second started at {second_start}, before the first was stopped at {freed_from}"
    );
    op.stop().await;
    node.remove(&env).await;
}
