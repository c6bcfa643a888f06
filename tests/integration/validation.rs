//! Bad input is refused by the API server's schema, with a message naming the field.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use crate::support;

use gpujob_operator::api::GpuJob;
use kube::Resource;
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use serde_json::json;
use support::TestEnv;

fn dynamic(env: &TestEnv) -> Api<DynamicObject> {
    let ar = ApiResource::erase::<GpuJob>(&());
    Api::namespaced_with(env.admin.clone(), &env.ns, &ar)
}

fn object(name: &str, spec: serde_json::Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": GpuJob::api_version(&()), "kind": "GpuJob",
        "metadata": {"name": name}, "spec": spec,
    }))
    .unwrap()
}

#[tokio::test]
async fn the_schema_refuses_bad_specs_naming_the_field() {
    let env = TestEnv::new("validation").await;
    let api = dynamic(&env);
    let cases = [
        ("gpus-zero", json!({"image": "i", "gpus": 0}), "spec.gpus"),
        (
            "gpus-negative",
            json!({"image": "i", "gpus": -1}),
            "spec.gpus",
        ),
        (
            "gpus-too-many",
            json!({"image": "i", "gpus": 65}),
            "spec.gpus",
        ),
        (
            "gpus-string",
            json!({"image": "i", "gpus": "two"}),
            "spec.gpus",
        ),
        (
            "gpus-fraction",
            json!({"image": "i", "gpus": 1.5}),
            "spec.gpus",
        ),
        ("gpus-missing", json!({"image": "i"}), "spec.gpus"),
        ("image-missing", json!({"gpus": 1}), "spec.image"),
        ("image-empty", json!({"image": "", "gpus": 1}), "spec.image"),
        (
            "retries-negative",
            json!({"image": "i", "gpus": 1, "maxRetries": -1}),
            "spec.maxRetries",
        ),
        (
            "retries-too-many",
            json!({"image": "i", "gpus": 1, "maxRetries": 101}),
            "spec.maxRetries",
        ),
        (
            "deadline-zero",
            json!({"image": "i", "gpus": 1, "activeDeadlineSeconds": 0}),
            "spec.activeDeadlineSeconds",
        ),
        // CEL (x-kubernetes-validations): across fields.
        (
            "product-disagrees",
            json!({"image": "i", "gpus": 1,
                   "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
                   "v2": {"gpuProduct": "NVIDIA-A100-SXM4-80GB"}}),
            "spec.nodeSelector",
        ),
        (
            "product-empty",
            json!({"image": "i", "gpus": 1, "v2": {"gpuProduct": ""}}),
            "spec.v2.gpuProduct",
        ),
        (
            "product-not-a-label-value",
            json!({"image": "i", "gpus": 1, "v2": {"gpuProduct": "A100 80GB"}}),
            "spec.v2.gpuProduct",
        ),
    ];
    for (name, spec, field) in cases {
        let err = api
            .create(&PostParams::default(), &object(name, spec.clone()))
            .await
            .expect_err(&format!("{name}: {spec} must be refused"));
        let kube::Error::Api(status) = err else {
            panic!("{name}: not an API error: {err:?}");
        };
        assert_eq!(status.code, 422, "{name}: {}", status.message);
        assert!(
            status.message.contains(field),
            "{name}: message does not name {field}: {}",
            status.message
        );
    }
    assert!(
        api.list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty(),
        "nothing was stored"
    );
    // The rules refuse only what they name: a product that agrees with the selector,
    // or is set in one place, is stored.
    for (name, spec) in [
        (
            "product-agrees",
            json!({"image": "i", "gpus": 1,
                   "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
                   "v2": {"gpuProduct": "NVIDIA-A100-SXM4-80GB"}}),
        ),
        (
            "product-alone",
            json!({"image": "i", "gpus": 1, "nodeSelector": {"zone": "a"},
                   "v2": {"gpuProduct": "NVIDIA-A100-SXM4-80GB"}}),
        ),
        (
            "selector-alone",
            json!({"image": "i", "gpus": 1,
                   "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}}),
        ),
    ] {
        api.create(&PostParams::default(), &object(name, spec.clone()))
            .await
            .unwrap_or_else(|e| panic!("{name}: {spec} must be stored: {e}"));
    }
}

#[tokio::test]
async fn defaults_apply_and_unknown_fields_are_pruned() {
    let env = TestEnv::new("pruning").await;
    let api = dynamic(&env);
    let spec = json!({"image": "i", "gpus": 1, "gpuType": "a100", "command": ["run"]});
    api.create(&PostParams::default(), &object("extra", spec))
        .await
        .unwrap();
    let stored = api.get("extra").await.unwrap();
    let spec = &stored.data["spec"];
    assert!(spec.get("gpuType").is_none(), "unknown field kept: {spec}");
    assert_eq!(spec["maxRetries"], 3, "default maxRetries");
    assert_eq!(spec["command"], json!(["run"]));
}
