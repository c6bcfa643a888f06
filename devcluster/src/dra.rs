//! Fake Dynamic Resource Allocation (DRA, `resource.k8s.io/v1`) devices for the fake GPU
//! nodes, so that the real kube-scheduler allocates ResourceClaims on them.
//!
//! What a DRA driver's kubelet plugin would publish, devcluster publishes once: a
//! DeviceClass [`DEVICE_CLASS`] that selects the devices of driver [`DRIVER`], and for
//! each fake GPU node one ResourceSlice (pool named after the node, `nodeName` the node)
//! with one device per GPU. Each device has the attribute `productName` (the node's
//! product, as its `nvidia.com/gpu.product` label says) and the capacity `memory` (a
//! quantity, from [`DraDevices::memory`]), the two names NVIDIA's DRA driver uses, so a
//! claim selects by CEL:
//!
//! ```text
//! device.attributes["gpu.devcluster.dev"].productName == "NVIDIA-H200"
//! device.capacity["gpu.devcluster.dev"].memory.compareTo(quantity("80Gi")) >= 0
//! ```
//!
//! No driver runs behind them: kwok plays the kubelet and prepares nothing, so a pod whose
//! claims are allocated runs as any other pod on a fake node does. The ResourceClaim
//! controller (kube-controller-manager's `resourceclaim-controller`, which devcluster
//! runs when these devices are on) makes claims from a pod's ResourceClaimTemplates and
//! frees them when the pod is done; kube-scheduler's DynamicResources plugin allocates.
//!
//! The devices are a book of their own: a pod that asks for `nvidia.com/gpu` (the
//! extended resource the nodes also advertise) and a claim allocated a device of the same
//! node do not count against each other.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{DeviceClass, ResourceSlice};
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::Error;
use crate::nodes::GpuNodes;

/// The fake driver's name: the devices' driver and the domain of their attributes and
/// capacities.
pub const DRIVER: &str = "gpu.devcluster.dev";
/// The DeviceClass that selects every device of [`DRIVER`].
pub const DEVICE_CLASS: &str = "gpu.devcluster.dev";
/// The first Kubernetes minor version that serves `resource.k8s.io/v1` (with the
/// DynamicResourceAllocation gate on by default); 1.33 serves only v1beta1 and v1beta2,
/// and those only when asked.
pub const SERVED_SINCE: u32 = 34;
/// The most devices one ResourceSlice may list (the API server refuses more).
pub const MAX_DEVICES_PER_SLICE: u16 = 128;
const FIELD_MANAGER: &str = "devcluster";

/// The GPU memory of the products devcluster names, as a quantity: the default products
/// ([`crate::nodes::DEFAULT_PRODUCTS`]) and the H200. The data sheets say 80 GB (A100 80GB, H100 SXM) and 141 GB
/// (H200); binary units, as memory quantities usually are: a fake needs only the order.
pub const KNOWN_MEMORY: [(&str, &str); 3] = [
    ("NVIDIA-A100-SXM4-80GB", "80Gi"),
    ("NVIDIA-H100", "80Gi"),
    ("NVIDIA-H200", "141Gi"),
];

/// The fake DRA devices of a control plane: one per fake GPU (`GpuNodes::gpus_per_node`
/// on each node), with its node's product.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DraDevices {
    /// The `memory` capacity of a device, by product ([`KNOWN_MEMORY`] by default). A
    /// node whose product is not here is an error at start, not a device without memory
    /// that no memory selector would ever match.
    pub memory: BTreeMap<String, String>,
}

impl Default for DraDevices {
    fn default() -> DraDevices {
        DraDevices {
            memory: KNOWN_MEMORY
                .iter()
                .map(|(p, m)| ((*p).to_owned(), (*m).to_owned()))
                .collect(),
        }
    }
}

impl DraDevices {
    /// The DeviceClass [`DEVICE_CLASS`]: every device of [`DRIVER`].
    pub fn device_class() -> serde_json::Value {
        json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": DEVICE_CLASS},
            "spec": {"selectors": [{"cel": {
                "expression": format!("device.driver == {DRIVER:?}"),
            }}]},
        })
    }

    /// The ResourceSlice of node `node`: `devices` devices `gpu-0`, `gpu-1`, … of
    /// `product`, in a pool of that one slice named after the node.
    pub fn slice(
        &self,
        node: &str,
        product: &str,
        devices: u16,
    ) -> Result<serde_json::Value, Error> {
        if devices > MAX_DEVICES_PER_SLICE {
            return Err(Error::invalid(
                format!("fake DRA devices of node {node}"),
                format!(
                    "{devices} GPUs, but one ResourceSlice holds at most {MAX_DEVICES_PER_SLICE} devices"
                ),
            ));
        }
        let memory = self.memory.get(product).ok_or_else(|| {
            Error::invalid(
                format!("fake DRA devices of node {node}"),
                format!(
                    "no memory known for product {product:?}; give it (`devcluster up --dra-memory {product}=80Gi`, or DraDevices::memory)"
                ),
            )
        })?;
        let devices: Vec<serde_json::Value> = (0..devices)
            .map(|i| {
                json!({
                    "name": format!("gpu-{i}"),
                    "attributes": {"productName": {"string": product}},
                    "capacity": {"memory": {"value": memory}},
                })
            })
            .collect();
        Ok(json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": slice_name(node)},
            "spec": {
                "driver": DRIVER,
                "nodeName": node,
                // One slice per pool, never rewritten: generation 1 stays the newest.
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "devices": devices,
            },
        }))
    }

    /// The ResourceSlices of `nodes`, one per node. Fails, before anything is written,
    /// on a node without a product or whose product has no memory here.
    pub fn slices(&self, nodes: &GpuNodes) -> Result<Vec<serde_json::Value>, Error> {
        (0..nodes.count)
            .map(|i| {
                let name = GpuNodes::name(i);
                let product = nodes.product(i).ok_or_else(|| {
                    Error::invalid(
                        format!("fake DRA devices of node {name}"),
                        "the node has no GPU product, and a device needs its productName",
                    )
                })?;
                self.slice(&name, product, nodes.gpus_per_node)
            })
            .collect()
    }

    /// Creates (or updates) the DeviceClass and the ResourceSlice of each of `nodes`.
    pub async fn apply(&self, client: kube::Client, nodes: &GpuNodes) -> Result<(), Error> {
        let slices = self.slices(nodes)?;
        let classes: Api<DeviceClass> = Api::all(client.clone());
        let params = PatchParams::apply(FIELD_MANAGER).force();
        classes
            .patch(DEVICE_CLASS, &params, &Patch::Apply(Self::device_class()))
            .await
            .map_err(Error::kube(format!("creating DeviceClass {DEVICE_CLASS}")))?;
        for slice in &slices {
            put_slice(client.clone(), slice).await?;
        }
        Ok(())
    }
}

/// The name of node `node`'s ResourceSlice.
pub fn slice_name(node: &str) -> String {
    format!("{node}.{DRIVER}")
}

/// Creates (or updates) one ResourceSlice from its object ([`DraDevices::slice`]), e.g.
/// for a node a test adds on its own.
pub async fn put_slice(client: kube::Client, slice: &serde_json::Value) -> Result<(), Error> {
    let api: Api<ResourceSlice> = Api::all(client);
    let name = slice["metadata"]["name"].as_str().unwrap_or_default();
    api.patch(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(slice),
    )
    .await
    .map_err(Error::kube(format!("creating ResourceSlice {name}")))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(products: &[&str]) -> GpuNodes {
        GpuNodes {
            count: 3,
            gpus_per_node: 2,
            products: products.iter().map(|p| (*p).to_owned()).collect(),
            ..GpuNodes::default()
        }
    }

    #[test]
    fn one_slice_per_node_one_device_per_gpu_with_the_nodes_product_and_its_memory() {
        let slices = DraDevices::default()
            .slices(&nodes(&["NVIDIA-H100", "NVIDIA-H200"]))
            .unwrap();
        assert_eq!(slices.len(), 3);
        let s = &slices[1];
        assert_eq!(s["metadata"]["name"], "gpu-node-1.gpu.devcluster.dev");
        assert_eq!(s["spec"]["driver"], DRIVER);
        assert_eq!(s["spec"]["nodeName"], "gpu-node-1");
        assert_eq!(s["spec"]["pool"]["name"], "gpu-node-1");
        assert_eq!(s["spec"]["pool"]["resourceSliceCount"], 1);
        let devices = s["spec"]["devices"].as_array().unwrap();
        assert_eq!(devices.len(), 2);
        assert_eq!(devices[1]["name"], "gpu-1");
        assert_eq!(
            devices[1]["attributes"]["productName"]["string"],
            "NVIDIA-H200"
        );
        assert_eq!(devices[1]["capacity"]["memory"]["value"], "141Gi");
        // Products in turn, as the nodes' labels.
        assert_eq!(
            slices[2]["spec"]["devices"][0]["attributes"]["productName"]["string"],
            "NVIDIA-H100"
        );
    }

    #[test]
    fn a_product_without_memory_or_a_node_without_product_is_refused() {
        let err = DraDevices::default()
            .slices(&nodes(&["NVIDIA-X1"]))
            .unwrap_err();
        assert!(err.to_string().contains("--dra-memory NVIDIA-X1="), "{err}");
        let err = DraDevices::default().slices(&nodes(&[])).unwrap_err();
        assert!(err.to_string().contains("no GPU product"), "{err}");
        let too_many = GpuNodes {
            count: 1,
            gpus_per_node: MAX_DEVICES_PER_SLICE + 1,
            products: vec!["NVIDIA-H100".to_owned()],
            ..GpuNodes::default()
        };
        assert!(DraDevices::default().slices(&too_many).is_err());
    }

    #[test]
    fn the_class_selects_the_drivers_devices() {
        let class = DraDevices::device_class();
        assert_eq!(
            class["spec"]["selectors"][0]["cel"]["expression"],
            r#"device.driver == "gpu.devcluster.dev""#
        );
    }
}
