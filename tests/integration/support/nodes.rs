//! A fake GPU node of one test's own on a shared control plane: a product label and a
//! taint nothing else has, so only that test's attempts (which select and tolerate
//! them) go there and no other test's pod takes its GPUs.

use devcluster::nodes::{GpuNodes, put};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams};
use serde_json::{Value, json};

use super::TestEnv;

const DEDICATED: &str = "devcluster.dev/dedicated";

pub struct OwnNode {
    /// Also its product label and its taint's value.
    pub name: String,
}

impl OwnNode {
    /// Creates the node `gpu-<namespace>` with `gpus` GPUs.
    pub async fn create(env: &TestEnv, gpus: u16) -> OwnNode {
        let name = format!("gpu-{}", env.ns);
        let mut node = GpuNodes {
            count: 1,
            gpus_per_node: gpus,
            products: vec![name.clone()],
            ..GpuNodes::default()
        }
        .node(0);
        node["metadata"]["name"] = json!(name);
        node["metadata"]["labels"]["kubernetes.io/hostname"] = json!(name);
        node["spec"]["taints"] = json!([{"key": DEDICATED, "value": name, "effect": "NoSchedule"}]);
        put(env.admin.clone(), &node).await.unwrap();
        OwnNode { name }
    }

    /// A v1 GpuJob `spec` whose attempts run on this node (and nowhere else): its
    /// product selected, its taint tolerated (through the pod template, `spec.v2`).
    pub fn place(&self, mut spec: Value) -> Value {
        spec["nodeSelector"] = json!({"nvidia.com/gpu.product": self.name});
        spec["v2"] = json!({"template": {"spec": {"tolerations": [
            {"key": DEDICATED, "operator": "Equal", "value": self.name, "effect": "NoSchedule"},
        ]}}});
        spec
    }

    /// Creates a second node like this one (`<name>-b`, the same product and taint), so
    /// that an attempt can run elsewhere when one of the two is lost; returns its name.
    pub async fn add_twin(&self, env: &TestEnv, gpus: u16) -> String {
        let twin = format!("{}-b", self.name);
        let mut node = GpuNodes {
            count: 1,
            gpus_per_node: gpus,
            products: vec![self.name.clone()],
            ..GpuNodes::default()
        }
        .node(0);
        node["metadata"]["name"] = json!(twin);
        node["metadata"]["labels"]["kubernetes.io/hostname"] = json!(twin);
        node["spec"]["taints"] =
            json!([{"key": DEDICATED, "value": self.name, "effect": "NoSchedule"}]);
        put(env.admin.clone(), &node).await.unwrap();
        twin
    }

    pub async fn remove(self, env: &TestEnv) {
        Api::<Node>::all(env.admin.clone())
            .delete(&self.name, &DeleteParams::default())
            .await
            .unwrap();
    }
}
