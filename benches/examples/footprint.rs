//! Resident memory of the replica's caches per GpuJob: N converged GpuJobs and their
//! running Jobs, decoded from the JSON the API server sends (managedFields included, as
//! on the wire), loaded through a relist as the watches do, measured as the growth of
//! VmRSS (allocator overhead and fragmentation included, as in production).
//!
//! `cargo run --release -p gpujob-benches --example footprint -- [N] [gpujobs|jobs|both]`
//! (one cache per process gives each its own figure).

#![allow(clippy::unwrap_used)] // a measurement: a panic is the report
use gpujob_operator::api::GpuJob;
use gpujob_operator::controller::view::cache::{GpuJobCache, JobIndex};
use gpujob_operator::controller::view::scope::Scope;
use k8s_openapi::api::batch::v1::Job;
use kube::runtime::watcher::Event;
use serde_json::json;

fn rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap()
}

fn gpujob(i: usize) -> serde_json::Value {
    json!({
      "apiVersion": "gpujob.dev/v1", "kind": "GpuJob",
      "metadata": {"name": format!("gj-{i:05}"), "namespace": format!("load-{}", i % 50),
        "uid": format!("0b8a9c3e-6f1d-4c2a-9e7b-{i:012}"), "resourceVersion": format!("{}", 100000 + i),
        "generation": 1, "creationTimestamp": "2026-12-01T10:00:00Z",
        "managedFields": [{"manager": "loadtest", "operation": "Update", "apiVersion": "gpujob.dev/v1", "time": "2026-12-01T10:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {".": {}, "f:gpus": {}, "f:image": {}, "f:command": {}}}},
                          {"manager": "gpujob-operator", "operation": "Update", "apiVersion": "gpujob.dev/v1", "time": "2026-12-01T10:00:01Z", "fieldsType": "FieldsV1", "subresource": "status", "fieldsV1": {"f:status": {".": {}, "f:phase": {}, "f:attempts": {}, "f:conditions": {}}}}]},
      "spec": {"image": "busybox:1.36", "command": ["sh", "-c", "sleep 3600"], "gpus": 1, "maxRetries": 3},
      "status": {"observedGeneration": 1, "phase": "Running", "attempts": 1, "failures": 0,
        "activeJob": format!("gj-{i:05}-1"), "startTime": "2026-12-01T10:00:01Z",
        "conditions": [{"type": "Ready", "status": "False", "reason": "JobRunning",
          "message": format!("attempt 1 is running (Job gj-{i:05}-1)"), "lastTransitionTime": "2026-12-01T10:00:01Z", "observedGeneration": 1}]}
    })
}

fn job(i: usize) -> serde_json::Value {
    let name = format!("gj-{i:05}-1");
    let uid = format!("0b8a9c3e-6f1d-4c2a-9e7b-{i:012}");
    let labels = json!({"gpujob.dev/name": format!("gj-{i:05}"), "gpujob.dev/uid": uid, "gpujob.dev/attempt": "1"});
    json!({
      "apiVersion": "batch/v1", "kind": "Job",
      "metadata": {"name": name, "namespace": format!("load-{}", i % 50), "uid": format!("1c8a9c3e-6f1d-4c2a-9e7b-{i:012}"),
        "resourceVersion": format!("{}", 200000 + i), "creationTimestamp": "2026-12-01T10:00:01Z", "labels": labels,
        "annotations": {"gpujob.dev/generation": "1"},
        "ownerReferences": [{"apiVersion": "gpujob.dev/v1", "kind": "GpuJob", "name": format!("gj-{i:05}"), "uid": uid, "controller": true, "blockOwnerDeletion": true}]},
      "spec": {"backoffLimit": 0, "completions": 1, "parallelism": 1,
        "selector": {"matchLabels": {"controller-uid": "x"}},
        "template": {"metadata": {"labels": labels}, "spec": {"restartPolicy": "Never",
          "containers": [{"name": "gpujob", "image": "busybox:1.36", "command": ["sh", "-c", "sleep 3600"],
            "env": [{"name": "GPUJOB_ATTEMPT", "value": "1"}], "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}},
      "status": {"active": 1, "startTime": "2026-12-01T10:00:01Z"}
    })
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(10000);
    let what = std::env::args().nth(2).unwrap_or_else(|| "both".into());
    let base = rss_kib();
    let gpujobs = GpuJobCache::default();
    let jobs = JobIndex::default();
    if what == "gpujobs" || what == "both" {
        gpujobs.apply(&Event::Init, &Scope::All);
        for i in 0..n {
            let mut gj: GpuJob = serde_json::from_value(gpujob(i)).unwrap();
            gj.metadata.managed_fields = None;
            gpujobs.apply(&Event::InitApply(gj), &Scope::All);
        }
        gpujobs.apply(&Event::InitDone, &Scope::All);
    }
    let after_gj = rss_kib();
    if what == "jobs" || what == "both" {
        jobs.apply(&Event::Init, &Scope::All);
        for i in 0..n {
            let j: Job = serde_json::from_value(job(i)).unwrap();
            jobs.apply(&Event::InitApply(j), &Scope::All);
        }
        jobs.apply(&Event::InitDone, &Scope::All);
    }
    let after_jobs = rss_kib();
    println!(
        "n={n} GpuJob cache: {:.0} B each; Job index: {:.0} B each ({} GpuJobs cached)",
        (after_gj - base) as f64 * 1024.0 / n as f64,
        (after_jobs - after_gj) as f64 * 1024.0 / n as f64,
        gpujobs.len()
    );
}
