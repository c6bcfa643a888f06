//! A lost node (issue 44): the next attempt waits for an old attempt's pod being deleted
//! on a node that is not Ready. Its kubelet will never confirm the stop, so the GpuJob
//! says so (Ready reason `WaitingForLostNode`, the node named, a Warning Event), and a
//! person ends the wait by marking the node out of service
//! (`node.kubernetes.io/out-of-service=nodeshutdown:NoExecute`): the pod garbage
//! collector deletes the pod, and the next attempt runs, never beside it.
//!
//! devcluster makes the node lost (`devcluster::nodes::lose`: Ready=Unknown, kwok no
//! longer reports it Ready); the pod hangs Terminating because its env and grace period
//! make kwok's stop take an hour, as a pod whose kubelet is gone would.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use std::collections::BTreeSet;
use std::time::Duration;

use devcluster::nodes::{lose, mark_out_of_service};
use gpujob_operator::api::{LABEL_UID, Phase};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams};
use serde_json::json;

use crate::late_create::{until, watch_attempts};
use crate::support::nodes::OwnNode;
use crate::support::{TestEnv, phase, ready, sim_env, with_reasons};

/// The first pod of GpuJob `gj` once it is bound: its name and its node.
async fn bound_pod(env: &TestEnv, gj: &gpujob_operator::api::GpuJob) -> (String, String) {
    let pods: Api<Pod> = Api::namespaced(env.admin.clone(), &env.ns);
    let selector = format!("{LABEL_UID}={}", gj.metadata.uid.as_deref().unwrap());
    devcluster::wait::until(
        "the GpuJob's pod bound",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || {
            let pods = pods.clone();
            let selector = selector.clone();
            async move {
                let list = pods
                    .list(&ListParams::default().labels(&selector))
                    .await
                    .ok()?;
                let pod = list.items.into_iter().next()?;
                let node = pod.spec.as_ref()?.node_name.clone()?;
                Some((pod.metadata.name.clone()?, node))
            }
        },
    )
    .await
    .unwrap()
}

#[tokio::test]
async fn a_next_attempt_held_by_a_lost_nodes_pod_says_so_and_runs_once_it_is_out_of_service() {
    let env = TestEnv::new("lost-node").await;
    // Two nodes only this test's attempts go to: one to lose, one to run the next
    // attempt on.
    let node = OwnNode::create(&env, 1).await;
    let twin = node.add_twin(&env, 1).await;
    let op = env.operator("lost-node", env.settings()).await;
    let mut spec = node.place(json!({
        "image": "i", "gpus": 1, "maxRetries": 3,
        "env": sim_env(&[("SIM_DURATION_SECONDS", "3600"), ("SIM_TERMINATION_SECONDS", "3600")]),
    }));
    // Deleted, its pod takes an hour to stop (kwok plays the stop within the grace).
    spec["v2"]["template"]["spec"]["terminationGracePeriodSeconds"] = json!(3600);
    let gj = env.create("train", spec).await;
    let mut seen = watch_attempts(&env, &gj);
    until(
        &mut seen,
        "attempt 1 to run",
        Duration::from_secs(60),
        |s| s.live_jobs() == BTreeSet::from(["train-1".to_owned()]),
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(env.admin.clone(), &env.ns);
    let (old_pod, lost) = bound_pod(&env, &gj).await;

    // The node is lost, and the attempt's Job is deleted (as a person would, in the
    // background): the garbage collector deletes the pod, which hangs Terminating.
    lose(env.admin.clone(), &lost).await.unwrap();
    env.jobs()
        .delete("train-1", &DeleteParams::background())
        .await
        .unwrap();
    let waiting = env
        .wait_gpujob("train", "attempt 2 waiting for the lost node", |g| {
            ready(g).is_some_and(|(_, reason, _)| reason == "WaitingForLostNode")
        })
        .await;
    let (_, _, message) = ready(&waiting).unwrap();
    assert!(
        message.contains(&format!("node {lost}")) && message.contains(&old_pod),
        "{message}"
    );
    assert!(
        message.contains("node.kubernetes.io/out-of-service=nodeshutdown:NoExecute"),
        "{message}"
    );
    assert_eq!(phase(&waiting), Some(Phase::Pending));
    assert_eq!(waiting.status.as_ref().unwrap().attempts, 2);
    let events = env
        .events_of("train", with_reasons(&["WaitingForLostNode"]))
        .await;
    let said: Vec<_> = events
        .iter()
        .filter(|e| e.1 == "WaitingForLostNode")
        .collect();
    assert_eq!(said.len(), 1, "{events:?}");
    assert_eq!(said[0].0, "Warning");
    assert!(said[0].2.contains(&lost), "{}", said[0].2);
    // Still held: the old pod is there, attempt 2's waits at the gate.
    let s = seen.borrow().clone();
    assert_eq!(
        s.live_jobs(),
        BTreeSet::from(["train-1".to_owned()]),
        "{s:#?}"
    );
    assert!(
        s.overlaps.is_empty(),
        "two attempts could run at once: {s:#?}"
    );

    // A person confirms the node is down and marks it out of service.
    let marked = std::time::Instant::now();
    mark_out_of_service(env.admin.clone(), &lost).await.unwrap();
    let s = until(
        &mut seen,
        "attempt 2 to run, alone, once the node is out of service",
        Duration::from_secs(90),
        |s| s.live_jobs() == BTreeSet::from(["train-2".to_owned()]),
    )
    .await;
    assert!(
        s.overlaps.is_empty(),
        "two attempts could run at once: {s:#?}"
    );
    let running = env
        .wait_gpujob("train", "attempt 2 running", |g| {
            phase(g) == Some(Phase::Running)
        })
        .await;
    assert_eq!(running.status.as_ref().unwrap().attempts, 2);
    // The figure for loadtest/REPORT.md: from the taint to the next attempt running.
    println!(
        "lost node: attempt 2 running {:.1} s after the node was marked out of service",
        marked.elapsed().as_secs_f64()
    );
    let new_pod = pods
        .list(&ListParams::default().labels("job-name=train-2"))
        .await
        .unwrap();
    // Attempt 1 ran on either node: attempt 2 runs on the other.
    let other = if lost == twin { &node.name } else { &twin };
    assert_eq!(
        new_pod.items[0].spec.as_ref().unwrap().node_name.as_deref(),
        Some(other.as_str()),
        "not on the lost node"
    );

    op.stop().await;
    env.gpujobs()
        .delete("train", &DeleteParams::default())
        .await
        .unwrap();
    Api::<Node>::all(env.admin.clone())
        .delete(&twin, &DeleteParams::default())
        .await
        .unwrap();
    node.remove(&env).await;
}

/// A GpuJob holding a quota reservation, deleted while its pod is on a lost node: the
/// release (and with it the finalizer, so the deletion) waits for that pod, and Ready
/// says which node holds it. Once a person marks the node out of service, the pod goes,
/// the reservation is released, and the GpuJob is gone.
#[tokio::test]
async fn a_deleted_gpujob_held_by_a_lost_nodes_pod_says_so_and_goes_once_it_is_out_of_service() {
    use crate::support::quota::FakeQuota;
    let env = TestEnv::new("lost-node-del").await;
    let fake = FakeQuota::start().await;
    let token = crate::support::namespace_temp(crate::support::QUOTA_TOKEN, &env.ns);
    let mut settings = env.settings();
    settings.quota = fake.provider(&token);
    let node = OwnNode::create(&env, 1).await;
    let op = env.operator("lost-node-del", settings).await;
    let mut spec = node.place(json!({
        "image": "i", "gpus": 1,
        "env": sim_env(&[("SIM_DURATION_SECONDS", "3600"), ("SIM_TERMINATION_SECONDS", "3600")]),
    }));
    spec["v2"]["template"]["spec"]["terminationGracePeriodSeconds"] = json!(3600);
    let gj = env.create("train", spec).await;
    let uid = gj.metadata.uid.clone().unwrap();
    env.wait_gpujob("train", "Running", |g| phase(g) == Some(Phase::Running))
        .await;
    let (pod, lost) = bound_pod(&env, &gj).await;
    assert!(fake.live().contains_key(&uid), "reserved");

    lose(env.admin.clone(), &lost).await.unwrap();
    env.gpujobs()
        .delete("train", &DeleteParams::default())
        .await
        .unwrap();
    let waiting = env
        .wait_gpujob("train", "the deletion waiting for the lost node", |g| {
            ready(g).is_some_and(|(_, reason, _)| reason == "WaitingForLostNode")
        })
        .await;
    let (_, _, message) = ready(&waiting).unwrap();
    for words in [
        "GPU quota released, only once",
        pod.as_str(),
        &format!("node {lost}"),
        "out-of-service",
    ] {
        assert!(message.contains(words), "{words}: {message}");
    }
    assert!(fake.live().contains_key(&uid), "not released under the pod");

    mark_out_of_service(env.admin.clone(), &lost).await.unwrap();
    let gpujobs = env.gpujobs();
    devcluster::wait::until(
        "the GpuJob gone once the node is out of service",
        Duration::from_secs(120),
        Duration::from_millis(250),
        || {
            let gpujobs = gpujobs.clone();
            async move { gpujobs.get_opt("train").await.ok()?.is_none().then_some(()) }
        },
    )
    .await
    .unwrap();
    assert!(!fake.live().contains_key(&uid), "released");
    op.stop().await;
    node.remove(&env).await;
}
