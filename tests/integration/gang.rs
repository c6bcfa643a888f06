//! Multi-node attempts as gangs, where kube-apiserver serves PodGroups (Kubernetes 1.37
//! with `GenericWorkload`; devcluster's `Options::gang`), against the real kube-scheduler
//! and devcluster's fake nodes in racks of two: the operator finds the API at start,
//! puts each multi-node attempt's pods in a PodGroup of its own (owned by the Job), and
//! the scheduler places all of them or none; `topology` keeps them in one rack. On
//! clusters without the API (the shared control plane, v1.33) the same GpuJobs run with
//! pods placed one by one (`batch::a_two_node_gpujob_…`, in the compatibility subset).
//!
//! Each test starts a control plane of its own.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use crate::support;

use std::collections::{BTreeMap, BTreeSet};

use devcluster::gang::GangScheduling;
use devcluster::nodes::{GpuNodes, RACK_LABEL};
use gpujob_operator::api::{LABEL_UID, Phase};
use gpujob_operator::controller::gang;
use gpujob_operator::controller::status::UNSCHEDULABLE;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::core::DynamicObject;
use serde_json::json;
use support::{TestEnv, phase, ready, sim_env};

/// Eight nodes of two GPUs, two to a rack: racks 0 to 3.
fn cluster() -> devcluster::Options {
    devcluster::Options {
        gpu_nodes: GpuNodes {
            count: 8,
            gpus_per_node: 2,
            ..GpuNodes::default()
        },
        gang: Some(GangScheduling::default()),
        ..devcluster::Options::default()
    }
}

/// Takes one GPU of each of `nodes` with a pod that runs for an hour: no whole-node pod
/// fits there any more.
async fn fill(env: &TestEnv, nodes: &[&str]) -> Vec<String> {
    let pods: Api<Pod> = Api::namespaced(env.admin.clone(), &env.ns);
    let mut names = Vec::new();
    for node in nodes {
        let name = format!("filler-{node}");
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"restartPolicy": "Never", "automountServiceAccountToken": false,
                "nodeSelector": {"kubernetes.io/hostname": node},
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                "containers": [{"name": "main", "image": "busybox",
                    "env": sim_env(&[("SIM_DURATION_SECONDS", "3600")]),
                    "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
        }))
        .unwrap();
        pods.create(&PostParams::default(), &pod).await.unwrap();
        names.push(name);
    }
    let selector = ListParams::default();
    devcluster::wait::until("the fillers to run", support::WAIT, support::POLL, || {
        let pods = pods.clone();
        let selector = selector.clone();
        let names = names.clone();
        async move {
            let list = pods.list(&selector).await.ok()?;
            let running = list
                .items
                .iter()
                .filter(|p| names.contains(p.metadata.name.as_ref().unwrap()))
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                .count();
            (running == names.len()).then_some(())
        }
    })
    .await
    .unwrap();
    names
}

/// A GpuJob of `nodes` whole-node pods (two GPUs each) that run for an hour.
async fn create(env: &TestEnv, name: &str, nodes: i32, topology: Option<serde_json::Value>) {
    let mut v2 = json!({"nodes": nodes});
    if let Some(t) = topology {
        v2["topology"] = t;
    }
    env.create(
        name,
        json!({"image": "i", "gpus": 2, "maxRetries": 0,
               "env": sim_env(&[("SIM_DURATION_SECONDS", "3600")]), "v2": v2}),
    )
    .await;
}

/// The GpuJob's pods, by name: the node each is bound to, if any.
async fn placed(env: &TestEnv, uid: &str) -> BTreeMap<String, Option<String>> {
    let pods: Api<Pod> = Api::namespaced(env.admin.clone(), &env.ns);
    pods.list(&ListParams::default().labels(&format!("{LABEL_UID}={uid}")))
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|p| {
            (
                p.metadata.name.clone().unwrap(),
                p.spec.and_then(|s| s.node_name),
            )
        })
        .collect()
}

async fn rack_of(env: &TestEnv) -> BTreeMap<String, String> {
    let nodes: Api<Node> = Api::all(env.admin.clone());
    nodes
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|n| {
            let rack = n.metadata.labels.as_ref()?.get(RACK_LABEL)?.clone();
            Some((n.metadata.name?, rack))
        })
        .collect()
}

#[tokio::test]
async fn a_multi_node_attempt_is_one_gang_placed_whole_in_the_one_rack_with_room() {
    let env = TestEnv::private_with_cluster("gang-rack", cluster()).await;
    let _op = env.operator("gang-rack", env.settings()).await;
    // Racks 0, 1 and 2 each keep one whole free node; only rack 3 keeps two. Pod by pod,
    // the first pod could take any of five free nodes, and its partner, kept in its
    // rack, would then find none.
    fill(&env, &["gpu-node-0", "gpu-node-2", "gpu-node-4"]).await;
    create(&env, "pair", 2, Some(json!({"level": RACK_LABEL}))).await;
    let running = env
        .wait_gpujob("pair", "running", |g| phase(g) == Some(Phase::Running))
        .await;
    let uid = running.metadata.uid.clone().unwrap();
    let racks = rack_of(&env).await;
    let pods = devcluster::wait::until(
        "both pods of the pair to be placed",
        support::WAIT,
        support::POLL,
        || {
            let env = &env;
            let uid = uid.clone();
            async move {
                let pods = placed(env, &uid).await;
                (pods.len() == 2 && pods.values().all(Option::is_some)).then_some(pods)
            }
        },
    )
    .await
    .unwrap();
    let used: BTreeSet<&str> = pods
        .values()
        .map(|n| racks[n.as_deref().unwrap()].as_str())
        .collect();
    assert_eq!(used, BTreeSet::from(["rack-3"]), "{pods:?}");

    // The attempt's gang: a PodGroup named like its Job, owned by it, of both pods, kept
    // in a rack.
    let groups: Api<DynamicObject> =
        Api::namespaced_with(env.admin.clone(), &env.ns, &gang::resource());
    let group = groups.get("pair-1").await.unwrap();
    let job = env.jobs().get("pair-1").await.unwrap();
    let owner = &group.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str()),
        ("Job", job.metadata.uid.as_deref().unwrap())
    );
    assert_eq!(
        group.data["spec"]["schedulingPolicy"]["gang"]["minCount"],
        2
    );
    assert_eq!(
        group.data["spec"]["schedulingConstraints"]["topology"][0]["key"],
        RACK_LABEL
    );
}

#[tokio::test]
async fn with_room_for_all_but_one_pod_no_pod_of_the_attempt_gets_a_node() {
    let env = TestEnv::private_with_cluster("gang-short", cluster()).await;
    let _op = env.operator("gang-short", env.settings()).await;
    // Two whole nodes free (6 and 7) for an attempt of three.
    let fillers = fill(
        &env,
        &[
            "gpu-node-0",
            "gpu-node-1",
            "gpu-node-2",
            "gpu-node-3",
            "gpu-node-4",
            "gpu-node-5",
        ],
    )
    .await;
    create(&env, "trio", 3, None).await;
    let waiting = env
        .wait_gpujob("trio", "waiting for nodes, with the reason", |g| {
            ready(g).is_some_and(|(_, r, _)| r == UNSCHEDULABLE)
        })
        .await;
    assert_eq!(phase(&waiting), Some(Phase::Pending));
    let uid = waiting.metadata.uid.clone().unwrap();
    // The scheduler has tried (the reason is its own), and placed none: no pod holds a
    // node waiting for the rest.
    let pods = placed(&env, &uid).await;
    assert_eq!(pods.len(), 3, "{pods:?}");
    assert!(
        pods.values().all(Option::is_none),
        "a partial gang: {pods:?}"
    );

    // A node frees up: all three are placed together.
    let pods_api: Api<Pod> = Api::namespaced(env.admin.clone(), &env.ns);
    pods_api
        .delete(&fillers[0], &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    env.wait_gpujob("trio", "running", |g| {
        ready(g).is_some_and(|(_, r, _)| r != UNSCHEDULABLE) && phase(g) == Some(Phase::Running)
    })
    .await;
    let pods = devcluster::wait::until("all three placed", support::WAIT, support::POLL, || {
        let env = &env;
        let uid = uid.clone();
        async move {
            let pods = placed(env, &uid).await;
            pods.values().all(Option::is_some).then_some(pods)
        }
    })
    .await
    .unwrap();
    let nodes: BTreeSet<&str> = pods.values().map(|n| n.as_deref().unwrap()).collect();
    assert_eq!(
        nodes,
        BTreeSet::from(["gpu-node-0", "gpu-node-6", "gpu-node-7"])
    );
}
