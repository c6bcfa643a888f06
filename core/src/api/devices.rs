//! GPUs by Dynamic Resource Allocation (`resource.k8s.io/v1`): v2
//! `spec.resources.devices`, kept in v1 as `spec.v2.devices`.
//!
//! Shaped as one request of a ResourceClaim (`DeviceRequest`: `exactly` or
//! `firstAvailable`, each with `deviceClassName`, `count` and CEL `selectors`), so that
//! what a user knows of DRA reads the same here, and the operator copies it into each
//! attempt's ResourceClaimTemplate without translating. Narrower than `DeviceRequest`:
//! only an exact count (no `allocationMode: All`, whose device count quota could not
//! know ahead), no admin access, no tolerations; what is left out can be added later
//! without changing what is here.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The name of the one request in each attempt's ResourceClaimTemplate, of the pod's
/// claim that uses it, and of the `main` container's claim: `gpus`. A firstAvailable
/// alternative is allocated as `gpus/<alternative>`.
pub const DEVICE_REQUEST: &str = "gpus";
/// Most alternatives (`firstAvailable`), as resource.k8s.io/v1 allows.
pub const MAX_ALTERNATIVES: usize = 8;
/// Most selectors per request or alternative, as resource.k8s.io/v1 allows.
pub const MAX_SELECTORS: usize = 32;
/// Longest CEL expression, as resource.k8s.io/v1 allows.
pub const MAX_EXPRESSION: usize = 10 * 1024;

/// The devices each of an attempt's pods gets (per node, as `gpus` is): either exactly
/// one kind (`exactly`), or the first of several alternatives the scheduler can
/// allocate (`firstAvailable`, in order of preference).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "has(self.exactly) != has(self.firstAvailable)",
    "message": "set exactly one of exactly and firstAvailable",
    "reason": "FieldValueInvalid",
}]))]
pub struct Devices {
    /// Devices of one DeviceClass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exactly: Option<ExactDevices>,
    /// Alternatives in order of preference: each attempt's pod gets the first one the
    /// scheduler can allocate on some node (`status.devices` says which). Quota counts
    /// the largest `count` of them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(min = 1, max = 8), extend("x-kubernetes-list-type" = "atomic"))]
    pub first_available: Vec<DeviceAlternative>,
}

/// Devices of one DeviceClass, as resource.k8s.io/v1's `ExactDeviceRequest`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExactDevices {
    /// The DeviceClass the devices are of (the cluster's DRA driver publishes it, e.g.
    /// `gpu.nvidia.com`).
    #[schemars(length(min = 1, max = 253))]
    pub device_class_name: String,
    /// How many devices (default 1).
    #[serde(default = "one")]
    #[schemars(range(min = 1, max = 64))]
    pub count: i32,
    /// CEL selectors every device must match, e.g. on its product or memory.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub selectors: Vec<DeviceSelector>,
}

/// One alternative of `firstAvailable`, as resource.k8s.io/v1's `DeviceSubRequest`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeviceAlternative {
    /// Its name (a DNS label), as `status.devices` reports it.
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub name: String,
    /// The DeviceClass the devices are of.
    #[schemars(length(min = 1, max = 253))]
    pub device_class_name: String,
    /// How many devices (default 1).
    #[serde(default = "one")]
    #[schemars(range(min = 1, max = 64))]
    pub count: i32,
    /// CEL selectors every device must match.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub selectors: Vec<DeviceSelector>,
}

/// A device selector, as resource.k8s.io/v1's `DeviceSelector` (CEL only).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct DeviceSelector {
    pub cel: CelSelector,
}

/// A CEL expression over a device (`device.driver`, `device.attributes`,
/// `device.capacity`) that must be true for the device to be allocated.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct CelSelector {
    #[schemars(length(min = 1, max = 10240))]
    pub expression: String,
}

fn one() -> i32 {
    1
}

impl Devices {
    /// The most devices one pod may get: what quota counts per node.
    pub fn max_count(&self) -> i32 {
        match &self.exactly {
            Some(e) => e.count,
            None => self
                .first_available
                .iter()
                .map(|a| a.count)
                .max()
                .unwrap_or(0),
        }
    }

    /// The alternative an allocation result's request names (`gpus/<alternative>`);
    /// `None` for `gpus` itself (an `exactly` request) or another request.
    pub fn alternative_of(request: &str) -> Option<&str> {
        request
            .strip_prefix(DEVICE_REQUEST)?
            .strip_prefix('/')
            .filter(|a| !a.is_empty())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use serde_json::json;

    use super::*;

    #[test]
    fn quota_counts_the_largest_alternative() {
        let d: Devices = serde_json::from_value(json!({"firstAvailable": [
            {"name": "h200", "deviceClassName": "gpu.example.com", "count": 4},
            {"name": "h100", "deviceClassName": "gpu.example.com", "count": 8},
            {"name": "any", "deviceClassName": "gpu.example.com"},
        ]}))
        .unwrap();
        assert_eq!(d.max_count(), 8);
        assert_eq!(d.first_available[2].count, 1, "count defaults to 1");
        let d: Devices =
            serde_json::from_value(json!({"exactly": {"deviceClassName": "c", "count": 2}}))
                .unwrap();
        assert_eq!(d.max_count(), 2);
    }

    #[test]
    fn an_allocation_names_its_alternative_after_the_request() {
        assert_eq!(Devices::alternative_of("gpus/h100"), Some("h100"));
        assert_eq!(Devices::alternative_of("gpus"), None);
        assert_eq!(Devices::alternative_of("gpus/"), None);
        assert_eq!(Devices::alternative_of("other/h100"), None);
        assert_eq!(Devices::alternative_of("gpusx/h100"), None);
    }
}
