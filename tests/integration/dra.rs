//! GPUs by Dynamic Resource Allocation (`resources.devices`), against the real
//! kube-scheduler, the real ResourceClaim controller and garbage collector, and devcluster's
//! fake DRA devices: each attempt's pods claim their GPUs from a ResourceClaimTemplate
//! the operator makes for the attempt before its Job, an attempt gets the first
//! alternative that is free, the second when the first is taken, and waits with the
//! scheduler's reason when neither is; status says which alternative it got.
//!
//! Each test starts a control plane of its own with the devices on (the test run's
//! shared one has none).

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use crate::support;

use devcluster::dra::{DEVICE_CLASS, DRIVER};
use devcluster::nodes::GpuNodes;
use gpujob_operator::api::{DeviceAllocation, GPU_RESOURCE, GpuJob, LABEL_UID, Phase};
use gpujob_operator::controller::status::{CLAIM_TEMPLATE_NAME_CONFLICT, UNSCHEDULABLE};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;
use support::{TestEnv, phase, ready, sim_env};

const H100: &str = "NVIDIA-H100";
const H200: &str = "NVIDIA-H200";
/// `gpu-node-1` is the only H200 node; 0 and 2 are H100s, two GPUs each, and each
/// publishes its GPUs as fake DRA devices.
fn dra() -> devcluster::Options {
    devcluster::Options {
        gpu_nodes: GpuNodes {
            count: 3,
            gpus_per_node: 2,
            products: [H100, H200, H100].map(str::to_owned).to_vec(),
            ..GpuNodes::default()
        },
        dra: Some(devcluster::dra::DraDevices::default()),
        ..devcluster::Options::default()
    }
}
const H200_NODE: &str = "gpu-node-1";

/// Two devices on one node: the H200s if both are free, else two H100s.
fn h200_else_h100() -> serde_json::Value {
    let alternative = |name: &str, product: &str| {
        json!({
            "name": name, "deviceClassName": DEVICE_CLASS, "count": 2,
            "selectors": [{"cel": {"expression": format!(
                "device.attributes[{DRIVER:?}].productName == {product:?}"
            )}}],
        })
    };
    json!({"firstAvailable": [alternative("h200", H200), alternative("h100", H100)]})
}

/// The name of the ResourceClaimTemplate of the attempt whose Job is `job`, for
/// [`h200_else_h100`].
fn template_of(job: &str) -> String {
    let devices = serde_json::from_value(h200_else_h100()).unwrap();
    gpujob_operator::controller::claims::template_name(job, &devices)
}

/// A GpuJob (v1's spelling: `gpus` holds the largest count) whose attempt runs for an
/// hour once placed, so its devices stay taken.
async fn create(env: &TestEnv, name: &str) -> GpuJob {
    env.create(
        name,
        json!({"image": "i", "gpus": 2, "maxRetries": 0,
               "env": sim_env(&[("SIM_DURATION_SECONDS", "3600")]),
               "v2": {"devices": h200_else_h100()}}),
    )
    .await
}

/// Waits until GpuJob `name` is Pending with Ready reason `why`; returns it and Ready's
/// message.
async fn pending(env: &TestEnv, name: &str, why: &str) -> (GpuJob, String) {
    let g = env
        .wait_gpujob(name, &format!("Pending, reason {why}"), |g| {
            ready(g).is_some_and(|(_, r, _)| r == why) && phase(g) == Some(Phase::Pending)
        })
        .await;
    let message = ready(&g).map(|(_, _, m)| m);
    (g, message.unwrap_or_default())
}

fn devices(g: &GpuJob) -> Option<&DeviceAllocation> {
    g.status.as_ref()?.devices.as_ref()
}

/// Waits until GpuJob `name` runs and says which alternative it got; returns that and
/// the node its pod runs on.
async fn got(env: &TestEnv, name: &str) -> (Vec<String>, String) {
    let g = env
        .wait_gpujob(name, "running, its devices said", |g| {
            phase(g) == Some(Phase::Running) && devices(g).is_some()
        })
        .await;
    let uid = g.metadata.uid.clone().unwrap();
    let pods = env.running_pods(&format!("{LABEL_UID}={uid}")).await;
    assert_eq!(pods.len(), 1, "{pods:?}");
    let pod = &pods[0];
    let spec = pod.spec.as_ref().unwrap();
    let main = &spec.containers[0];
    let limits = main
        .resources
        .as_ref()
        .unwrap()
        .limits
        .clone()
        .unwrap_or_default();
    assert!(
        !limits.contains_key(GPU_RESOURCE),
        "no nvidia.com/gpu: {limits:?}"
    );
    let devices = devices(&g).unwrap();
    assert_eq!(devices.attempt, 1);
    (
        devices.alternatives.clone(),
        spec.node_name.clone().unwrap(),
    )
}

#[tokio::test]
async fn an_attempt_gets_the_first_free_alternative_and_waits_with_a_reason_when_none_is() {
    let env = TestEnv::private_with_cluster("dra", dra()).await;
    let _op = env.operator("dra", env.settings()).await;
    let templates: Api<ResourceClaimTemplate> = Api::namespaced(env.admin.clone(), &env.ns);

    // The H200 node is free: the first alternative.
    let first = create(&env, "first").await;
    assert_eq!(
        got(&env, "first").await,
        (vec!["h200".to_owned()], H200_NODE.to_owned())
    );
    // Its template is the attempt's: named like its Job, owned by the GpuJob.
    let template = templates.get(&template_of("first-1")).await.unwrap();
    let owner = &template.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str()),
        ("GpuJob", first.metadata.uid.as_deref().unwrap())
    );

    // The H200s are taken: the second alternative, on an H100 node each.
    create(&env, "second").await;
    create(&env, "third").await;
    let (second, second_node) = got(&env, "second").await;
    let (third, third_node) = got(&env, "third").await;
    assert_eq!(
        (second, third),
        (vec!["h100".to_owned()], vec!["h100".to_owned()])
    );
    assert_ne!(second_node, third_node);
    assert!(![&second_node, &third_node].contains(&&H200_NODE.to_owned()));

    // Neither alternative is free: Pending, with the scheduler's reason.
    create(&env, "fourth").await;
    let (waiting, message) = pending(&env, "fourth", UNSCHEDULABLE).await;
    assert!(
        message.contains("claim"),
        "the scheduler's words: {message}"
    );
    assert_eq!(devices(&waiting), None);

    // The first GpuJob goes: its Job and template go with it (garbage collection), its
    // pod's claim goes with the pod and frees its devices, and the waiting attempt gets
    // the H200s.
    env.gpujobs()
        .delete("first", &DeleteParams::foreground())
        .await
        .unwrap();
    assert_eq!(
        got(&env, "fourth").await,
        (vec!["h200".to_owned()], H200_NODE.to_owned())
    );
    devcluster::wait::until(
        "the first GpuJob's template to be collected with it",
        support::WAIT,
        support::POLL,
        || {
            let templates = templates.clone();
            async move {
                templates
                    .get_opt(&template_of("first-1"))
                    .await
                    .unwrap()
                    .is_none()
                    .then_some(())
            }
        },
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn a_foreign_template_under_the_attempts_name_keeps_it_from_starting_until_it_goes() {
    let env = TestEnv::private_with_cluster("dra-taken", dra()).await;
    let _op = env.operator("dra-taken", env.settings()).await;
    let templates: Api<ResourceClaimTemplate> = Api::namespaced(env.admin.clone(), &env.ns);
    // Someone else's template holds the name of attempt 1's, asking for anything.
    let foreign: ResourceClaimTemplate = serde_json::from_value(json!({
        "metadata": {"name": template_of("taken-1")},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpus",
            "exactly": {"deviceClassName": DEVICE_CLASS, "count": 1}}]}}},
    }))
    .unwrap();
    templates
        .create(&PostParams::default(), &foreign)
        .await
        .unwrap();

    let g = create(&env, "taken").await;
    let (_, message) = pending(&env, "taken", CLAIM_TEMPLATE_NAME_CONFLICT).await;
    assert!(message.contains("ResourceClaimTemplate"), "{message}");
    // The attempt did not start: no Job, so no pod whose claim that template could make.
    assert!(env.jobs().get_opt("taken-1").await.unwrap().is_none());
    let pods: Api<Pod> = Api::namespaced(env.admin.clone(), &env.ns);
    let uid = g.metadata.uid.clone().unwrap();
    let listed = pods
        .list(&ListParams::default().labels(&format!("{LABEL_UID}={uid}")))
        .await
        .unwrap();
    assert!(listed.items.is_empty(), "{:?}", listed.items);

    // The foreign template goes: the attempt's own is made, then its Job, and its pod
    // runs on the devices its own template asks for.
    templates
        .delete(&template_of("taken-1"), &DeleteParams::default())
        .await
        .unwrap();
    assert_eq!(
        got(&env, "taken").await,
        (vec!["h200".to_owned()], H200_NODE.to_owned())
    );
    let template = templates.get(&template_of("taken-1")).await.unwrap();
    assert_eq!(
        template.metadata.owner_references.as_ref().unwrap()[0].uid,
        uid
    );
}
