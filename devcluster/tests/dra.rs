//! Fake DRA devices (`devcluster::dra`) against the real kube-scheduler and the real
//! ResourceClaim controller: a pod's claim asks for one GPU, an H200 first and an H100
//! second (`firstAvailable`), and gets the first alternative that is free, or waits with
//! the scheduler's reason when neither is.
//!
//! Each test starts a control plane of its own with the devices on (the test run's
//! shared one has none), so nextest runs them one at a time (.config/nextest.toml).

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use std::time::{Duration, Instant};

use devcluster::dra::{DEVICE_CLASS, DRIVER, DraDevices};
use devcluster::nodes::GpuNodes;
use devcluster::{ControlPlane, Identity, Options, wait};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{
    DeviceClass, DeviceRequestAllocationResult, ResourceClaim, ResourceClaimTemplate, ResourceSlice,
};
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;

const H100: &str = "NVIDIA-H100";
const H200: &str = "NVIDIA-H200";
/// Node `gpu-node-1` is the only H200 node; 0 and 2 are H100s. Two H100 nodes to one
/// H200: a scheduler that ignored the order of the alternatives would pick an H100 node
/// for a pod that could have an H200 two times in three.
const PRODUCTS: [&str; 3] = [H100, H200, H100];
const GPUS_PER_NODE: u16 = 2;
const H200_NODE: &str = "gpu-node-1";
/// The claim template's one request (its alternatives: `h200`, then `h100`).
const REQUEST: &str = "gpu";
const TEMPLATE: &str = "h200-else-h100";
const WAIT: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(250);

async fn cluster() -> ControlPlane {
    ControlPlane::start(Options {
        gpu_nodes: GpuNodes {
            count: u16::try_from(PRODUCTS.len()).unwrap(),
            gpus_per_node: GPUS_PER_NODE,
            products: PRODUCTS.iter().map(|p| (*p).to_owned()).collect(),
            ..GpuNodes::default()
        },
        dra: Some(DraDevices::default()),
        ..Options::default()
    })
    .await
    .expect("control plane with fake DRA devices")
}

/// A namespace with the ResourceClaimTemplate every pod here uses: one device of the
/// class, an H200 (subrequest `h200`) if one is free, else an H100 (`h100`). Each
/// alternative also asks for its product's memory, so the `memory` capacity is read by
/// the scheduler's CEL too (a device without it would match neither).
async fn namespace(cluster: &ControlPlane, prefix: &str) -> (Api<Pod>, Api<ResourceClaim>) {
    let ns = cluster.create_namespace(prefix).await.unwrap();
    let client = cluster.client(Identity::Admin).await.unwrap();
    let alternative = |name: &str, product: &str, memory: &str| {
        json!({
            "name": name,
            "deviceClassName": DEVICE_CLASS,
            "selectors": [
                {"cel": {"expression": format!(
                    "device.attributes[{DRIVER:?}].productName == {product:?}"
                )}},
                {"cel": {"expression": format!(
                    "device.capacity[{DRIVER:?}].memory.compareTo(quantity({memory:?})) >= 0"
                )}},
            ],
        })
    };
    let template: ResourceClaimTemplate = serde_json::from_value(json!({
        "metadata": {"name": TEMPLATE},
        "spec": {"spec": {"devices": {"requests": [{
            "name": REQUEST,
            "firstAvailable": [
                alternative("h200", H200, "141Gi"),
                alternative("h100", H100, "80Gi"),
            ],
        }]}}},
    }))
    .unwrap();
    Api::<ResourceClaimTemplate>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &template)
        .await
        .unwrap();
    (
        Api::namespaced(client.clone(), &ns),
        Api::namespaced(client, &ns),
    )
}

/// Creates a pod whose claim comes from the template; it runs for an hour once placed,
/// so its device stays taken.
async fn create_pod(pods: &Api<Pod>, name: &str) {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": false,
            "resourceClaims": [{"name": REQUEST, "resourceClaimTemplateName": TEMPLATE}],
            "containers": [{
                "name": "main", "image": "busybox",
                "env": [{"name": "SIM_DURATION_SECONDS", "value": "3600"}],
                "resources": {"claims": [{"name": REQUEST}]},
            }],
        },
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
}

/// The pod once it runs: kwok prepares no device, so a pod with an allocated claim is
/// made Running like any other.
async fn running(pods: &Api<Pod>, name: &str) -> Pod {
    wait::until(&format!("pod {name} to be Running"), WAIT, POLL, || {
        let pods = pods.clone();
        async move {
            let pod = pods.get(name).await.ok()?;
            (pod.status.as_ref()?.phase.as_deref() == Some("Running")).then_some(pod)
        }
    })
    .await
    .unwrap()
}

/// The claim the ResourceClaim controller made for `pod` from the template (it records
/// the name in the pod's status).
async fn claim_of(pods: &Api<Pod>, claims: &Api<ResourceClaim>, pod: &str) -> ResourceClaim {
    let name = wait::until(&format!("the claim of pod {pod}"), WAIT, POLL, || {
        let pods = pods.clone();
        async move {
            let p = pods.get(pod).await.ok()?;
            p.status?
                .resource_claim_statuses?
                .into_iter()
                .find(|s| s.name == REQUEST)?
                .resource_claim_name
        }
    })
    .await
    .unwrap();
    claims.get(&name).await.unwrap()
}

/// The one device result of a claim's allocation.
fn allocated(claim: &ResourceClaim) -> DeviceRequestAllocationResult {
    let results = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.clone())
        .unwrap_or_default();
    assert_eq!(results.len(), 1, "one device allocated: {:?}", claim.status);
    results.into_iter().next().unwrap()
}

/// Runs pod `name` to Running and checks where its device came from: subrequest
/// `alternative`, a device of its own node, reserved for it. Returns the device as
/// `node/device`.
async fn runs_with(
    pods: &Api<Pod>,
    claims: &Api<ResourceClaim>,
    name: &str,
    alternative: &str,
    product: &str,
) -> String {
    create_pod(pods, name).await;
    let pod = running(pods, name).await;
    let node = pod.spec.as_ref().unwrap().node_name.clone().unwrap();
    let claim = claim_of(pods, claims, name).await;
    let result = allocated(&claim);
    assert_eq!(
        result.request,
        format!("{REQUEST}/{alternative}"),
        "pod {name} on {node}"
    );
    assert_eq!(result.driver, DRIVER);
    assert_eq!(result.pool, node, "a device of the pod's own node");
    let on = (0..PRODUCTS.len())
        .find(|i| GpuNodes::name(u16::try_from(*i).unwrap()) == node)
        .map(|i| PRODUCTS[i]);
    assert_eq!(on, Some(product), "pod {name} on {node}");
    let reserved = claim.status.as_ref().unwrap().reserved_for.clone();
    assert!(
        reserved
            .unwrap_or_default()
            .iter()
            .any(|r| r.resource == "pods" && r.name == name),
        "the claim is reserved for pod {name}"
    );
    format!("{node}/{}", result.device)
}

#[tokio::test]
async fn dra_a_claim_gets_an_h200_when_one_is_free() {
    let started = Instant::now();
    let cluster = cluster().await;
    let client = cluster.client(Identity::Admin).await.unwrap();
    // What devcluster published: the class, one slice per node, one device per GPU.
    let class = Api::<DeviceClass>::all(client.clone())
        .get(DEVICE_CLASS)
        .await
        .unwrap();
    assert_eq!(class.metadata.name.as_deref(), Some(DEVICE_CLASS));
    let slices = Api::<ResourceSlice>::all(client.clone())
        .list(&Default::default())
        .await
        .unwrap();
    assert_eq!(slices.items.len(), PRODUCTS.len());
    for s in &slices.items {
        assert_eq!(s.spec.driver, DRIVER);
        assert_eq!(
            s.spec.devices.as_ref().map(Vec::len),
            Some(usize::from(GPUS_PER_NODE))
        );
    }

    let (pods, claims) = namespace(&cluster, "dra-free").await;
    let device = runs_with(&pods, &claims, "first", "h200", H200).await;
    assert!(device.starts_with(&format!("{H200_NODE}/")), "{device}");
    println!("took {:.1}s", started.elapsed().as_secs_f64());
}

#[tokio::test]
async fn dra_a_claim_gets_an_h100_when_every_h200_is_taken() {
    let started = Instant::now();
    let cluster = cluster().await;
    let (pods, claims) = namespace(&cluster, "dra-second").await;
    // The H200s, one pod at a time: each takes one, a different one.
    let mut h200s = std::collections::BTreeSet::new();
    for i in 0..GPUS_PER_NODE {
        h200s.insert(runs_with(&pods, &claims, &format!("h200-{i}"), "h200", H200).await);
    }
    assert_eq!(h200s.len(), usize::from(GPUS_PER_NODE), "{h200s:?}");

    // None left: the same claim is allocated its second alternative.
    runs_with(&pods, &claims, "next", "h100", H100).await;
    println!("took {:.1}s", started.elapsed().as_secs_f64());
}

#[tokio::test]
async fn dra_a_claim_waits_with_the_schedulers_reason_when_neither_is_free() {
    let started = Instant::now();
    let cluster = cluster().await;
    let (pods, claims) = namespace(&cluster, "dra-none").await;
    // Every device taken: the H200s first, then the H100s.
    for i in 0..GPUS_PER_NODE {
        runs_with(&pods, &claims, &format!("h200-{i}"), "h200", H200).await;
    }
    let h100s = (PRODUCTS.len() - 1) * usize::from(GPUS_PER_NODE);
    for i in 0..h100s {
        runs_with(&pods, &claims, &format!("h100-{i}"), "h100", H100).await;
    }

    create_pod(&pods, "waiting").await;
    // The scheduler's own verdict on the pod: unschedulable, because no node can
    // allocate its claim (a first look may say the claim is not made yet: wait for the
    // verdict on the claim).
    let message = wait::until(
        "pod waiting to be Unschedulable for its claim",
        WAIT,
        POLL,
        || {
            let pods = pods.clone();
            async move {
                let pod = pods.get("waiting").await.ok()?;
                let c = pod
                    .status?
                    .conditions?
                    .into_iter()
                    .find(|c| c.type_ == "PodScheduled")?;
                let message = c.message.unwrap_or_default();
                (c.status == "False"
                    && c.reason.as_deref() == Some("Unschedulable")
                    && message.contains("cannot allocate all claims"))
                .then_some(message)
            }
        },
    )
    .await
    .unwrap();
    println!("the scheduler's message: {message}");
    let nodes = PRODUCTS.len();
    assert!(
        message.contains(&format!("0/{nodes} nodes are available")),
        "{message}"
    );
    let pod = pods.get("waiting").await.unwrap();
    assert_eq!(
        pod.status.as_ref().unwrap().phase.as_deref(),
        Some("Pending")
    );
    assert_eq!(pod.spec.as_ref().unwrap().node_name, None);
    let claim = claim_of(&pods, &claims, "waiting").await;
    assert!(
        claim
            .status
            .as_ref()
            .and_then(|s| s.allocation.as_ref())
            .is_none(),
        "nothing allocated: {:?}",
        claim.status
    );

    // It waits, it has not failed: once an H200 pod goes (and the ResourceClaim
    // controller frees its claim), the waiting pod gets that H200.
    pods.delete("h200-0", &DeleteParams::default())
        .await
        .unwrap();
    let pod = running(&pods, "waiting").await;
    assert_eq!(
        pod.spec.as_ref().unwrap().node_name.as_deref(),
        Some(H200_NODE)
    );
    let claim = claims
        .get(claim.metadata.name.as_deref().unwrap())
        .await
        .unwrap();
    assert_eq!(allocated(&claim).request, format!("{REQUEST}/h200"));
    println!("took {:.1}s", started.elapsed().as_secs_f64());
}
