//! Pure: the ResourceClaimTemplate through which an attempt's pods get their GPUs by
//! Dynamic Resource Allocation (v2 `spec.resources.devices`). One per attempt and
//! request: named after its Job and a hash of the request ([`template_name`], which each
//! pod's claim `gpus` names), so a template made for another spec (a create that lands
//! late, a spec changed between a refused Job and its retry) is never taken for this
//! one's; one request `gpus` as the spec says. The ResourceClaim controller makes one claim per pod from it, and
//! kube-scheduler allocates each claim on the pod's node.
//!
//! It is made before the attempt's Job, so it is owned by the GpuJob (the Job has no uid
//! yet) and the garbage collector deletes it with the GpuJob. Made after the Job, it
//! could come too late: the ResourceClaim controller makes a pod's claim from whatever
//! template holds the name when the pod appears, so a foreign template under that name
//! would hand the pods its devices. Made first, a foreign one is a refusal before any
//! pod exists.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{
    CELDeviceSelector, DeviceClaim, DeviceRequest, DeviceSelector as K8sDeviceSelector,
    DeviceSubRequest, ExactDeviceRequest, ResourceClaim, ResourceClaimSpec, ResourceClaimTemplate,
    ResourceClaimTemplateSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::api::{DEVICE_REQUEST, DeviceSelector, Devices, GpuJob};
pub use crate::job::claim_template_name as template_name;
use crate::job::{job_name, labels, owner_reference};

/// How every count is allocated: exactly that many devices.
const EXACT_COUNT: &str = "ExactCount";

/// The ResourceClaimTemplate of `gpujob`'s attempt `attempt`; `None` unless its spec
/// asks for devices. Labelled as the attempt's Job and pods are, and so are the claims
/// made from it.
pub fn template(gpujob: &GpuJob, attempt: i32) -> Option<ResourceClaimTemplate> {
    let devices = gpujob.spec.devices()?;
    let labels: BTreeMap<String, String> = labels(gpujob, attempt);
    let job = job_name(gpujob.metadata.name.as_deref().unwrap_or_default(), attempt);
    let name = template_name(&job, devices);
    Some(ResourceClaimTemplate {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: gpujob.metadata.namespace.clone(),
            labels: Some(labels.clone()),
            owner_references: Some(vec![owner_reference(gpujob)]),
            ..ObjectMeta::default()
        },
        spec: Some(ResourceClaimTemplateSpec {
            // The claims carry the attempt's labels: `kubectl get resourceclaims -l`.
            metadata: Some(ObjectMeta {
                labels: Some(labels),
                ..ObjectMeta::default()
            }),
            spec: Some(ResourceClaimSpec {
                devices: Some(DeviceClaim {
                    requests: Some(vec![request(devices)]),
                    ..DeviceClaim::default()
                }),
            }),
        }),
    })
}

/// The one request `gpus`, as the spec says it (the shapes are resource.k8s.io/v1's).
fn request(devices: &Devices) -> DeviceRequest {
    let selectors = |s: &[DeviceSelector]| {
        (!s.is_empty()).then(|| {
            s.iter()
                .map(|s| K8sDeviceSelector {
                    cel: Some(CELDeviceSelector {
                        expression: s.cel.expression.clone(),
                    }),
                })
                .collect()
        })
    };
    DeviceRequest {
        name: DEVICE_REQUEST.to_owned(),
        exactly: devices.exactly.as_ref().map(|e| ExactDeviceRequest {
            device_class_name: e.device_class_name.clone(),
            allocation_mode: Some(EXACT_COUNT.to_owned()),
            count: Some(i64::from(e.count)),
            selectors: selectors(&e.selectors),
            ..ExactDeviceRequest::default()
        }),
        first_available: (!devices.first_available.is_empty()).then(|| {
            devices
                .first_available
                .iter()
                .map(|a| DeviceSubRequest {
                    name: a.name.clone(),
                    device_class_name: a.device_class_name.clone(),
                    allocation_mode: Some(EXACT_COUNT.to_owned()),
                    count: Some(i64::from(a.count)),
                    selectors: selectors(&a.selectors),
                    ..DeviceSubRequest::default()
                })
                .collect()
        }),
    }
}

/// What a ResourceClaimTemplate name held by a foreign template says, wherever it is
/// found.
pub fn name_taken(ns: &str, name: &str) -> String {
    format!(
        "ResourceClaimTemplate {ns}/{name} exists and is not this GpuJob's; the attempt's pods would get the devices that template asks for, so the attempt waits, not started; delete or rename that ResourceClaimTemplate"
    )
}

/// Whether `template` is owned (as its controller) by the GpuJob with `uid`: this
/// GpuJob's, not a foreign one under the name.
pub fn is_owned_by(template: &ResourceClaimTemplate, uid: &str) -> bool {
    template
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && o.kind == "GpuJob" && o.uid == uid)
}

/// The `firstAvailable` alternative a claim was allocated (from its allocation result
/// for request `gpus`); `None` while it is not allocated, or for an `exactly` request.
pub fn alternative(claim: &ResourceClaim) -> Option<String> {
    claim
        .status
        .as_ref()?
        .allocation
        .as_ref()?
        .devices
        .as_ref()?
        .results
        .iter()
        .flatten()
        .find_map(|r| Devices::alternative_of(&r.request))
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use serde_json::json;

    use super::*;
    use crate::api::{LABEL_ATTEMPT, V2Only};

    fn with(devices: serde_json::Value) -> GpuJob {
        let mut g = crate::job::tests::gpujob("train");
        g.spec.v2 = Some(V2Only {
            devices: serde_json::from_value(devices).unwrap(),
            ..V2Only::default()
        });
        g
    }

    #[test]
    fn an_attempt_with_alternatives_gets_a_template_named_like_its_job() {
        let g = with(json!({"firstAvailable": [
            {"name": "h200", "deviceClassName": "gpu.example.com", "count": 4,
             "selectors": [{"cel": {"expression": "device.attributes[\"gpu.example.com\"].productName == \"H200\""}}]},
            {"name": "h100", "deviceClassName": "gpu.example.com", "count": 8},
        ]}));
        let t = template(&g, 3).expect("an attempt with devices");
        let m = &t.metadata;
        let name = m.name.clone().unwrap();
        assert!(
            name.starts_with("train-3-") && name.len() == "train-3-".len() + 10,
            "{name}"
        );
        assert_eq!(name, template_name("train-3", g.spec.devices().unwrap()));
        // Another request, another name: a template made for another spec is not this
        // one's.
        let mut other = g.clone();
        other
            .spec
            .v2
            .as_mut()
            .unwrap()
            .devices
            .as_mut()
            .unwrap()
            .first_available[1]
            .count = 4;
        assert_ne!(template(&other, 3).unwrap().metadata.name.unwrap(), name);
        assert_eq!(m.namespace.as_deref(), Some("team-a"));
        let owner = &m.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
            ("GpuJob", "train", "uid-1")
        );
        let spec = t.spec.unwrap();
        let as_json = serde_json::to_value(&spec.spec).unwrap();
        assert_eq!(
            as_json,
            json!({"devices": {"requests": [{"name": "gpus", "firstAvailable": [
                {"name": "h200", "deviceClassName": "gpu.example.com", "count": 4,
                 "allocationMode": "ExactCount",
                 "selectors": [{"cel": {"expression": "device.attributes[\"gpu.example.com\"].productName == \"H200\""}}]},
                {"name": "h100", "deviceClassName": "gpu.example.com", "count": 8,
                 "allocationMode": "ExactCount"},
            ]}]}})
        );
        let labels = spec.metadata.unwrap().labels.unwrap();
        assert_eq!(labels[LABEL_ATTEMPT], "3");
    }

    #[test]
    fn an_exact_request_is_copied_as_is() {
        let g = with(json!({"exactly": {"deviceClassName": "gpu.example.com", "count": 2}}));
        let t = template(&g, 1).unwrap();
        assert_eq!(
            serde_json::to_value(t.spec.unwrap().spec).unwrap(),
            json!({"devices": {"requests": [{"name": "gpus", "exactly":
                {"deviceClassName": "gpu.example.com", "count": 2, "allocationMode": "ExactCount"}}]}})
        );
    }

    #[test]
    fn an_attempt_of_nvidia_gpus_has_none() {
        assert_eq!(template(&with(serde_json::Value::Null), 1), None);
    }

    #[test]
    fn the_alternative_is_read_from_the_allocation() {
        let claim = |results: serde_json::Value| -> ResourceClaim {
            serde_json::from_value(json!({
                "metadata": {"name": "c"},
                "spec": {},
                "status": {"allocation": {"devices": {"results": results}}},
            }))
            .unwrap()
        };
        let result = |request: &str| json!({"request": request, "driver": "d", "pool": "p", "device": "gpu-0"});
        assert_eq!(
            alternative(&claim(json!([result("gpus/h100"), result("gpus/h100")]))),
            Some("h100".to_owned())
        );
        assert_eq!(alternative(&claim(json!([result("gpus")]))), None);
        let unallocated: ResourceClaim =
            serde_json::from_value(json!({"metadata": {"name": "c"}, "spec": {}})).unwrap();
        assert_eq!(alternative(&unallocated), None);
    }
}
