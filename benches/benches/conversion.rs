//! What the conversion webhook costs: one object converted each way (a small spec, and a
//! spec with a large pod template), and a whole review of 100 objects as `POST /convert`
//! answers it (parse, convert, encode: everything but TLS and HTTP).
//! Run: `cargo bench -p gpujob-benches --bench conversion`.

use std::hint::black_box;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use gpujob_operator::api::convert::convert;
use gpujob_operator::server::conversion::review;
use serde_json::{Value, json};

fn metadata(name: &str) -> Value {
    json!({
        "name": name, "namespace": "team-a", "uid": format!("uid-{name}"),
        "resourceVersion": "12345", "generation": 3,
        "creationTimestamp": "2026-12-01T10:00:00Z",
        "labels": {"team": "vision", "app": "train"},
    })
}

fn status() -> Value {
    json!({
        "observedGeneration": 3, "phase": "Running", "attempts": 2, "failures": 1,
        "activeJob": "train-2",
        "conditions": [{"type": "Ready", "status": "True", "observedGeneration": 3,
                        "lastTransitionTime": "2026-12-01T10:05:00Z", "reason": "Running",
                        "message": "attempt 2 is running"}],
    })
}

/// A v1 GpuJob as written by hand: a handful of fields, no `spec.v2`.
fn small_v1(name: &str) -> Value {
    json!({
        "apiVersion": "gpujob.dev/v1", "kind": "GpuJob", "metadata": metadata(name),
        "spec": {"image": "registry.example.com/train:1.2", "command": ["python", "train.py"],
                 "gpus": 2, "maxRetries": 3, "activeDeadlineSeconds": 5400,
                 "env": [{"name": "EPOCHS", "value": "10"}]},
        "status": status(),
    })
}

/// A v2 GpuJob with a large pod template: 20 volumes and mounts, 20 tolerations, node
/// affinity, 40 env vars, a sidecar (about 8 KB of JSON).
fn large_v2(name: &str) -> Value {
    let volumes: Vec<Value> = (0..20)
        .map(|i| json!({"name": format!("data-{i}"), "persistentVolumeClaim": {"claimName": format!("pvc-{i}")}}))
        .collect();
    let mounts: Vec<Value> = (0..20)
        .map(|i| json!({"name": format!("data-{i}"), "mountPath": format!("/data/{i}"), "readOnly": true}))
        .collect();
    let tolerations: Vec<Value> = (0..20)
        .map(|i| json!({"key": format!("dedicated-{i}"), "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}))
        .collect();
    let env: Vec<Value> = (0..40)
        .map(|i| json!({"name": format!("VAR_{i}"), "value": format!("value-{i}")}))
        .collect();
    json!({
        "apiVersion": "gpujob.dev/v2", "kind": "GpuJob", "metadata": metadata(name),
        "spec": {
            "image": "registry.example.com/train:1.2", "command": ["python", "train.py"],
            "resources": {"gpus": 8, "product": "NVIDIA-A100-SXM4-80GB"},
            "retryPolicy": {"maxRetries": 5, "backoffSeconds": 30},
            "attemptDeadline": "90m",
            "template": {
                "metadata": {"labels": {"team": "vision"}, "annotations": {"owner": "ml-platform"}},
                "spec": {
                    "volumes": volumes, "tolerations": tolerations,
                    "priorityClassName": "training",
                    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b", "c"]}]}]}}},
                    "containers": [
                        {"name": "main", "volumeMounts": mounts, "env": env,
                         "resources": {"requests": {"cpu": "16", "memory": "128Gi"}, "limits": {"memory": "128Gi"}}},
                        {"name": "sidecar", "image": "registry.example.com/logship:3", "args": ["--to", "loki"]},
                    ],
                },
            },
        },
        "status": status(),
    })
}

fn request(desired: &str, objects: Vec<Value>) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
        "request": {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "desiredAPIVersion": desired, "objects": objects},
    }))
    .expect("request")
}

fn one_object(c: &mut Criterion) {
    let small_v1 = small_v1("small");
    let small_v2 = convert(small_v1.clone(), "gpujob.dev/v2").expect("to v2");
    let large_v2 = large_v2("large");
    let large_v1 = convert(large_v2.clone(), "gpujob.dev/v1").expect("to v1");
    let mut group = c.benchmark_group("conversion/one_object");
    group.throughput(Throughput::Elements(1));
    for (name, object, desired) in [
        ("small/v1_to_v2", &small_v1, "gpujob.dev/v2"),
        ("small/v2_to_v1", &small_v2, "gpujob.dev/v1"),
        ("large_template/v1_to_v2", &large_v1, "gpujob.dev/v2"),
        ("large_template/v2_to_v1", &large_v2, "gpujob.dev/v1"),
    ] {
        group.bench_function(name, |b| {
            b.iter_batched(
                || object.clone(),
                |o| black_box(convert(o, desired).expect("converts")),
                BatchSize::SmallInput,
            )
        });
    }
    group.finish();
}

fn review_of_100(c: &mut Criterion) {
    // A list page as the API server sends it: half small, half with a large template,
    // all stored as v1 and read as v2, and back.
    let v1: Vec<Value> = (0..100)
        .map(|i| {
            if i % 2 == 0 {
                small_v1(&format!("gj-{i}"))
            } else {
                convert(large_v2(&format!("gj-{i}")), "gpujob.dev/v1").expect("to v1")
            }
        })
        .collect();
    let v2: Vec<Value> = v1
        .iter()
        .map(|o| convert(o.clone(), "gpujob.dev/v2").expect("to v2"))
        .collect();
    let mut group = c.benchmark_group("conversion/review_100");
    group.throughput(Throughput::Elements(100));
    for (name, body) in [
        ("v1_to_v2", request("gpujob.dev/v2", v1)),
        ("v2_to_v1", request("gpujob.dev/v1", v2)),
    ] {
        group.bench_function(name, |b| {
            b.iter(|| {
                let (code, answer) = review(black_box(&body));
                assert!(code.is_success());
                black_box(serde_json::to_vec(&answer).expect("encodes"))
            })
        });
    }
    group.finish();
}

criterion_group!(benches, one_object, review_of_100);
criterion_main!(benches);
