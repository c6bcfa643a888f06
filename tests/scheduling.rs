//! GPUs as the real kube-scheduler hands them out on devcluster's fake GPU nodes: an
//! attempt whose pod fits no node is Pending with the scheduler's reason (not Running,
//! not failed, not retried), and attempts queued for GPUs run once others free them.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

mod support;

use devcluster::nodes::GpuNodes;
use gpujob_operator::api::Phase;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::json;
use support::{TestEnv, phase, ready, sim_env, with_reasons};

const DEDICATED: &str = "devcluster.dev/dedicated";

/// A fake node of `gpus` GPUs for this test alone: a product label nothing else asks
/// for, and a taint only this test's pods tolerate, so no other test's pod takes its
/// GPUs. Returns its product.
async fn own_node(env: &TestEnv, gpus: u16) -> String {
    let product = format!("test-{}", env.ns);
    let nodes = GpuNodes {
        count: 1,
        gpus_per_node: gpus,
        products: vec![product.clone()],
    };
    let mut node = nodes.node(0);
    let name = format!("gpu-{}", env.ns);
    node["metadata"]["name"] = json!(name);
    node["metadata"]["labels"]["kubernetes.io/hostname"] = json!(name);
    let api: Api<Node> = Api::all(env.admin.clone());
    let pp = PatchParams::apply("scheduling-test").force();
    api.patch(&name, &pp, &Patch::Apply(&node)).await.unwrap();
    api.patch_status(&name, &pp, &Patch::Apply(&node))
        .await
        .unwrap();
    // Only the dedication: admission's not-ready taint goes, as the node is Ready.
    let taints =
        json!({"spec": {"taints": [{"key": DEDICATED, "value": env.ns, "effect": "NoSchedule"}]}});
    api.patch(&name, &PatchParams::default(), &Patch::Merge(taints))
        .await
        .unwrap();
    product
}

async fn remove_own_node(env: &TestEnv) {
    let api: Api<Node> = Api::all(env.admin.clone());
    let _ = api
        .delete(&format!("gpu-{}", env.ns), &DeleteParams::default())
        .await;
}

/// A GpuJob spec for the test's own node: its product, tolerating its taint.
fn on_own_node(env: &TestEnv, product: &str, gpus: i32, seconds: &str) -> serde_json::Value {
    json!({
        "image": "i", "gpus": gpus,
        "nodeSelector": {"nvidia.com/gpu.product": product},
        "env": sim_env(&[("SIM_DURATION_SECONDS", seconds)]),
        "v2": {"template": {"spec": {"tolerations": [
            {"key": DEDICATED, "operator": "Equal", "value": env.ns, "effect": "NoSchedule"},
        ]}}},
    })
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
    let product = own_node(&env, 2).await;
    let op = env.operator("sched-queue", env.settings()).await;
    // Long enough that the second is judged (after the scheduler's grace) while the
    // first holds the node's two GPUs.
    env.create("first", on_own_node(&env, &product, 2, "12"))
        .await;
    env.wait_gpujob("first", "Running", |g| phase(g) == Some(Phase::Running))
        .await;
    env.create("second", on_own_node(&env, &product, 2, "1"))
        .await;
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

    // The first ends, its GPUs free up, the second is placed and runs to the end.
    for name in ["first", "second"] {
        let done = env
            .wait_gpujob(name, "Succeeded", |g| phase(g) == Some(Phase::Succeeded))
            .await;
        let s = done.status.unwrap();
        assert_eq!((s.attempts, s.failures), (1, 0), "{name}");
    }
    // On the node, one after the other: the second's container started only after
    // the first's ended.
    let first_end = env
        .ended_at(&env.jobs().get("first-1").await.unwrap())
        .await;
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
    assert!(
        second_start >= first_end,
        "the second started at {second_start}, before the first ended at {first_end}"
    );
    op.stop().await;
    remove_own_node(&env).await;
}
