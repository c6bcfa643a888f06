//! Fake GPU nodes: Node objects that advertise `nvidia.com/gpu`, so the real
//! kube-scheduler places pods by their GPU requests (and leaves them Pending, with its
//! own `Unschedulable` reason, when no node has room). No kubelet runs behind them: kwok
//! plays it for the pods bound to them; the annotation `kwok.x-k8s.io/node: fake` (kwok's
//! convention) hands each node to it.
//!
//! No node-lifecycle controller runs either, so a node stays Ready without heartbeats;
//! devcluster lifts the not-ready taint admission gives a new node, as that controller
//! would. A test makes a node lost ([`lose`]: NotReady, as that controller would once
//! its kubelet stopped) and marks it out of service ([`mark_out_of_service`]).
//!
//! Every node also sits in a fake three-level network topology ([`Topology`]): a host
//! (its [`HOST_LABEL`], the node's name) in a rack ([`RACK_LABEL`]) in a block
//! ([`BLOCK_LABEL`]), as the labels a cloud's or a cluster's topology discovery puts on
//! GPU nodes, so that topology-aware placement (kube-scheduler's
//! TopologyAwareWorkloadScheduling, Kueue's TopologyAwareScheduling) has domains to keep
//! a gang in.

use std::num::NonZeroU16;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::Error;
use crate::kwok::{NODE_ANNOTATION, NODE_ANNOTATION_VALUE};

/// The GPU products ([`PRODUCT_LABEL`]) the nodes carry, in turn.
pub const DEFAULT_PRODUCTS: [&str; 2] = ["NVIDIA-A100-SXM4-80GB", "NVIDIA-H100"];
/// The node label naming a node's GPU product (GPU feature discovery's).
pub const PRODUCT_LABEL: &str = "nvidia.com/gpu.product";
/// Marks the nodes devcluster made.
pub const FAKE_NODE_LABEL: &str = "devcluster.dev/fake-node";
/// The node label naming a node's block, the topmost level (a group of racks, e.g. one
/// spine switch's). No well-known Kubernetes label names a block or a rack
/// (`topology.kubernetes.io/` has only `zone` and `region`, and the `kubernetes.io`
/// domains are Kubernetes' own), so devcluster's own domain, as a cloud uses its own.
pub const BLOCK_LABEL: &str = "topology.devcluster.dev/block";
/// The node label naming a node's rack, the middle level. Its values are unique in the
/// cluster (`rack-0`, `rack-1`, … counted across blocks), not only within a block:
/// kube-scheduler's topology-aware placement groups nodes by this label's value alone.
pub const RACK_LABEL: &str = "topology.devcluster.dev/rack";
/// The lowest level, the host: the label every kubelet sets to its node's host name
/// (here the node's name). Kueue's TopologyAwareScheduling assigns each pod to a node
/// by it when a Topology's lowest level is this label.
pub const HOST_LABEL: &str = "kubernetes.io/hostname";
const FIELD_MANAGER: &str = "devcluster";

/// The fake nodes of a control plane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuNodes {
    /// How many nodes.
    pub count: u16,
    /// `nvidia.com/gpu` each node has.
    pub gpus_per_node: u16,
    /// Node `i` gets `products[i % len]`; empty: no product label.
    pub products: Vec<String>,
    /// The racks and blocks the nodes are in.
    pub topology: Topology,
}

impl Default for GpuNodes {
    /// Four nodes of eight GPUs, A100 and H100 in turn, two to a rack, two racks to a
    /// block.
    fn default() -> GpuNodes {
        GpuNodes {
            count: 4,
            gpus_per_node: 8,
            products: DEFAULT_PRODUCTS.iter().map(|p| (*p).to_owned()).collect(),
            topology: Topology::default(),
        }
    }
}

/// The shape of the fake topology: nodes fill racks in order (nodes 0 and 1 in rack 0,
/// 2 and 3 in rack 1, … by default), racks fill blocks in order; the last rack or block
/// may be partly filled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Topology {
    /// Nodes (hosts) per rack.
    pub hosts_per_rack: NonZeroU16,
    /// Racks per block.
    pub racks_per_block: NonZeroU16,
}

impl Default for Topology {
    /// Two hosts to a rack, two racks to a block: the default four nodes are two racks
    /// of one block, so even the smallest cluster has more than one rack to choose from.
    fn default() -> Topology {
        const TWO: NonZeroU16 = NonZeroU16::new(2).expect("2 is not zero");
        Topology {
            hosts_per_rack: TWO,
            racks_per_block: TWO,
        }
    }
}

impl Topology {
    /// The rack of node `i`, counted across blocks.
    pub fn rack_index(&self, i: u16) -> u16 {
        i / self.hosts_per_rack.get()
    }

    /// The block of node `i`.
    pub fn block_index(&self, i: u16) -> u16 {
        self.rack_index(i) / self.racks_per_block.get()
    }

    /// The [`RACK_LABEL`] value of node `i`: `rack-<n>`, unique in the cluster.
    pub fn rack(&self, i: u16) -> String {
        format!("rack-{}", self.rack_index(i))
    }

    /// The [`BLOCK_LABEL`] value of node `i`: `block-<n>`.
    pub fn block(&self, i: u16) -> String {
        format!("block-{}", self.block_index(i))
    }
}

impl GpuNodes {
    /// The pool of the test control planes: more GPUs than the tests running at once
    /// ask for, so no test waits on another's GPUs. A test about scarcity makes a node
    /// of its own with a product label nothing else asks for.
    pub fn for_tests() -> GpuNodes {
        GpuNodes {
            count: 64,
            ..GpuNodes::default()
        }
    }

    /// The name of node `i`.
    pub fn name(i: u16) -> String {
        format!("gpu-node-{i}")
    }

    /// The GPU product of node `i` (its `nvidia.com/gpu.product` label; also the
    /// `productName` of its fake DRA devices, [`crate::dra`]); `None` when `products`
    /// is empty.
    pub fn product(&self, i: u16) -> Option<&str> {
        if self.products.is_empty() {
            return None;
        }
        Some(&self.products[usize::from(i) % self.products.len()])
    }

    /// The Node object (status included) for node `i`.
    pub fn node(&self, i: u16) -> serde_json::Value {
        let name = Self::name(i);
        let mut labels = json!({
            HOST_LABEL: name,
            RACK_LABEL: self.topology.rack(i),
            BLOCK_LABEL: self.topology.block(i),
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "nvidia.com/gpu.count": self.gpus_per_node.to_string(),
            FAKE_NODE_LABEL: "true",
        });
        if let Some(product) = self.product(i) {
            labels[PRODUCT_LABEL] = json!(product);
        }
        // CPU, memory and pod slots far beyond what tests ask for: only GPUs are scarce.
        let resources = json!({
            "cpu": "256",
            "memory": "2Ti",
            "pods": "5000",
            "ephemeral-storage": "10Ti",
            "nvidia.com/gpu": self.gpus_per_node.to_string(),
        });
        json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": labels,
                "annotations": {NODE_ANNOTATION: NODE_ANNOTATION_VALUE},
            },
            "spec": {},
            "status": {
                "capacity": resources,
                "allocatable": resources,
                "conditions": [{
                    "type": "Ready", "status": "True", "reason": "DevclusterFakeNode",
                    "message": "a devcluster fake node: kwok plays its kubelet",
                }],
                "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
                "nodeInfo": {
                    "architecture": "amd64", "operatingSystem": "linux",
                    "kubeletVersion": "devcluster", "kubeProxyVersion": "",
                    "containerRuntimeVersion": "devcluster://kwok",
                    "bootID": "", "kernelVersion": "", "machineID": "", "osImage": "",
                    "systemUUID": "",
                },
            },
        })
    }

    /// Creates (or updates) every node and its status.
    pub async fn apply(&self, client: kube::Client) -> Result<(), Error> {
        for i in 0..self.count {
            put(client.clone(), &self.node(i)).await?;
        }
        Ok(())
    }
}

/// Creates (or updates) one fake node from its object ([`GpuNodes::node`], changed as a
/// caller needs): the object, its status, and exactly the taints its `spec.taints` lists.
pub async fn put(client: kube::Client, node: &serde_json::Value) -> Result<(), Error> {
    let api: Api<Node> = Api::all(client);
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let name = node["metadata"]["name"].as_str().unwrap_or_default();
    api.patch(name, &params, &Patch::Apply(node))
        .await
        .map_err(Error::kube(format!("creating fake node {name}")))?;
    // The status of an existing Node is only written through its subresource.
    api.patch_status(name, &params, &Patch::Apply(node))
        .await
        .map_err(Error::kube(format!(
            "setting the status of fake node {name}"
        )))?;
    // Admission (TaintNodesByCondition) taints a new node not-ready; the node-lifecycle
    // controller, which does not run here, would lift it once the node reports Ready. It
    // is, so lift it here, keeping only the node's own.
    let taints = node["spec"].get("taints").cloned().unwrap_or(json!(null));
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"taints": taints}})),
    )
    .await
    .map_err(Error::kube(format!("untainting fake node {name}")))?;
    Ok(())
}

/// Marks a node whose kubelet is gone, as the node-lifecycle controller (which does not
/// run here) would: kwok no longer reports it Ready (its node Stage skips a node with
/// this annotation), and it is made Ready=Unknown and tainted unreachable. kwok still
/// plays the pods bound to it by their `SIM_*` env (a pod that should hang while it is
/// deleted there sets `SIM_TERMINATION_SECONDS` and its grace period long). With
/// [`OUT_OF_SERVICE_TAINT`] added (non-graceful node shutdown), kube-controller-manager's
/// pod garbage collector deletes its terminating pods.
pub const LOST_ANNOTATION: &str = "devcluster.dev/lost";
/// `node.kubernetes.io/out-of-service`: a person's word that the node is down.
pub const OUT_OF_SERVICE_TAINT: &str = "node.kubernetes.io/out-of-service";

/// Makes node `name` lost ([`LOST_ANNOTATION`]): its Ready condition Unknown, tainted
/// `node.kubernetes.io/unreachable` (NoSchedule and NoExecute; no taint-eviction
/// controller runs here, so the pods stay).
pub async fn lose(client: kube::Client, name: &str) -> Result<(), Error> {
    let api: Api<Node> = Api::all(client);
    let unreachable = ["NoSchedule", "NoExecute"]
        .map(|effect| json!({"key": UNREACHABLE_TAINT, "effect": effect}));
    let (taints, _) = taints_with(&api, name, UNREACHABLE_TAINT, &unreachable).await?;
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({
            "metadata": {"annotations": {LOST_ANNOTATION: "true"}},
            "spec": {"taints": taints},
        })),
    )
    .await
    .map_err(Error::kube(format!("marking node {name} lost")))?;
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Strategic(json!({"status": {"conditions": [{
            "type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
            "message": "Kubelet stopped posting node status.",
        }]}})),
    )
    .await
    .map_err(Error::kube(format!("making node {name} NotReady")))?;
    Ok(())
}

/// Adds [`OUT_OF_SERVICE_TAINT`] (`nodeshutdown:NoExecute`) to node `name`, as the
/// runbook of a lost node says.
pub async fn mark_out_of_service(client: kube::Client, name: &str) -> Result<(), Error> {
    let api: Api<Node> = Api::all(client);
    let taint =
        json!({"key": OUT_OF_SERVICE_TAINT, "value": "nodeshutdown", "effect": "NoExecute"});
    let (taints, resource_version) =
        taints_with(&api, name, OUT_OF_SERVICE_TAINT, &[taint]).await?;
    // The resourceVersion read: a taint another writer added meanwhile is not lost.
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({
            "metadata": {"resourceVersion": resource_version},
            "spec": {"taints": taints},
        })),
    )
    .await
    .map_err(Error::kube(format!("marking node {name} out of service")))?;
    Ok(())
}

const UNREACHABLE_TAINT: &str = "node.kubernetes.io/unreachable";

/// Node `name`'s taints with those of `key` replaced by `added`, and the resourceVersion
/// they were read at.
async fn taints_with(
    api: &Api<Node>,
    name: &str,
    key: &str,
    added: &[serde_json::Value],
) -> Result<(Vec<serde_json::Value>, Option<String>), Error> {
    let node = api
        .get(name)
        .await
        .map_err(Error::kube(format!("reading node {name}")))?;
    let mut taints: Vec<serde_json::Value> = node
        .spec
        .and_then(|s| s.taints)
        .unwrap_or_default()
        .into_iter()
        .filter(|t| t.key != key)
        .map(|t| json!({"key": t.key, "value": t.value, "effect": t.effect}))
        .collect();
    taints.extend_from_slice(added);
    Ok((taints, node.metadata.resource_version))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_take_products_in_turn_and_advertise_their_gpus() {
        let nodes = GpuNodes::default();
        let labels = |i| nodes.node(i)["metadata"]["labels"]["nvidia.com/gpu.product"].clone();
        assert_eq!(labels(0), "NVIDIA-A100-SXM4-80GB");
        assert_eq!(labels(1), "NVIDIA-H100");
        assert_eq!(labels(2), "NVIDIA-A100-SXM4-80GB");
        let n = nodes.node(3);
        assert_eq!(n["metadata"]["name"], "gpu-node-3");
        assert_eq!(n["status"]["allocatable"]["nvidia.com/gpu"], "8");
        assert_eq!(n["status"]["capacity"]["nvidia.com/gpu"], "8");
        assert_eq!(n["metadata"]["annotations"]["kwok.x-k8s.io/node"], "fake");
    }

    #[test]
    fn nodes_fill_racks_and_racks_fill_blocks_in_order() {
        let nodes = GpuNodes {
            count: 12,
            topology: Topology {
                hosts_per_rack: NonZeroU16::new(3).unwrap(),
                racks_per_block: NonZeroU16::new(2).unwrap(),
            },
            ..GpuNodes::default()
        };
        let at = |i| {
            let n = nodes.node(i);
            let l = &n["metadata"]["labels"];
            (
                l[BLOCK_LABEL].as_str().unwrap().to_owned(),
                l[RACK_LABEL].as_str().unwrap().to_owned(),
                l[HOST_LABEL].as_str().unwrap().to_owned(),
            )
        };
        let t = |b: &str, r: &str, h: &str| (b.to_owned(), r.to_owned(), h.to_owned());
        assert_eq!(at(0), t("block-0", "rack-0", "gpu-node-0"));
        assert_eq!(at(2), t("block-0", "rack-0", "gpu-node-2"));
        assert_eq!(at(3), t("block-0", "rack-1", "gpu-node-3"));
        assert_eq!(at(5), t("block-0", "rack-1", "gpu-node-5"));
        // Rack numbers go on across blocks: a rack's value alone names it.
        assert_eq!(at(6), t("block-1", "rack-2", "gpu-node-6"));
        assert_eq!(at(11), t("block-1", "rack-3", "gpu-node-11"));
        // The default: two to a rack, two racks to a block.
        let d = GpuNodes::default();
        assert_eq!(d.node(1)["metadata"]["labels"][RACK_LABEL], "rack-0");
        assert_eq!(d.node(2)["metadata"]["labels"][RACK_LABEL], "rack-1");
        assert_eq!(d.node(3)["metadata"]["labels"][BLOCK_LABEL], "block-0");
        assert_eq!(d.topology.block(4), "block-1");
    }

    #[test]
    fn no_products_no_product_label() {
        let nodes = GpuNodes {
            count: 1,
            gpus_per_node: 2,
            products: vec![],
            ..GpuNodes::default()
        };
        let n = nodes.node(0);
        assert!(
            n["metadata"]["labels"]
                .get("nvidia.com/gpu.product")
                .is_none()
        );
        assert_eq!(n["status"]["allocatable"]["nvidia.com/gpu"], "2");
    }
}
