//! Resident memory of the replica's caches per GpuJob: N converged GpuJobs, their
//! running Jobs and each Job's one running pod, decoded from the JSON the API server
//! sends (managedFields included, as on the wire), loaded through a relist as the
//! watches do, measured as the growth of VmRSS (allocator overhead and fragmentation
//! included, as in production).
//!
//! `cargo run --release -p gpujob-benches --example footprint -- [N] [gpujobs|jobs|pods|all]`
//! (one cache per process gives each its own figure; `both`, the older name, is `all`).

#![allow(clippy::unwrap_used)] // a measurement: a panic is the report
use gpujob_operator::api::GpuJob;
use gpujob_operator::controller::view::cache::{GpuJobCache, JobIndex, PodIndex};
use gpujob_operator::controller::view::scope::Scope;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
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

/// Job `gj-<i>-1`'s pod, bound and running (let go through the gate long ago).
fn pod(i: usize) -> serde_json::Value {
    let job = format!("gj-{i:05}-1");
    let uid = format!("0b8a9c3e-6f1d-4c2a-9e7b-{i:012}");
    let job_uid = format!("1c8a9c3e-6f1d-4c2a-9e7b-{i:012}");
    json!({
      "apiVersion": "v1", "kind": "Pod",
      "metadata": {"name": format!("{job}-x7k2p"), "generateName": format!("{job}-"), "namespace": format!("load-{}", i % 50),
        "uid": format!("2d8a9c3e-6f1d-4c2a-9e7b-{i:012}"), "resourceVersion": format!("{}", 300000 + i),
        "creationTimestamp": "2026-12-01T10:00:02Z",
        "labels": {"gpujob.dev/name": format!("gj-{i:05}"), "gpujob.dev/uid": uid, "gpujob.dev/attempt": "1",
          "batch.kubernetes.io/controller-uid": job_uid, "batch.kubernetes.io/job-name": job,
          "controller-uid": job_uid, "job-name": job},
        "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": job, "uid": job_uid, "controller": true, "blockOwnerDeletion": true}],
        "managedFields": [{"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1", "time": "2026-12-01T10:00:02Z", "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:labels": {}}}},
                          {"manager": "kubelet", "operation": "Update", "apiVersion": "v1", "time": "2026-12-01T10:00:04Z", "fieldsType": "FieldsV1", "subresource": "status", "fieldsV1": {"f:status": {"f:phase": {}}}}]},
      "spec": {"restartPolicy": "Never", "nodeName": format!("gpu-{}", i % 200), "schedulerName": "default-scheduler",
        "containers": [{"name": "main", "image": "busybox:1.36", "command": ["sh", "-c", "sleep 3600"],
          "env": [{"name": "GPUJOB_ATTEMPT", "value": "1"}], "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
      "status": {"phase": "Running", "podIP": "10.0.0.7", "hostIP": "172.18.0.3", "startTime": "2026-12-01T10:00:03Z",
        "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-12-01T10:00:03Z"},
                       {"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-01T10:00:04Z"}],
        "containerStatuses": [{"name": "main", "image": "busybox:1.36", "imageID": "", "ready": true, "restartCount": 0,
          "started": true, "state": {"running": {"startedAt": "2026-12-01T10:00:04Z"}}}]}
    })
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(10000);
    let what = std::env::args().nth(2).unwrap_or_else(|| "all".into());
    let all = what == "all" || what == "both";
    let base = rss_kib();
    let gpujobs = GpuJobCache::default();
    let jobs = JobIndex::default();
    let pods = PodIndex::default();
    if what == "gpujobs" || all {
        gpujobs.apply(&Event::Init, &Scope::All);
        for i in 0..n {
            let mut gj: GpuJob = serde_json::from_value(gpujob(i)).unwrap();
            gj.metadata.managed_fields = None;
            gpujobs.apply(&Event::InitApply(gj), &Scope::All);
        }
        gpujobs.apply(&Event::InitDone, &Scope::All);
    }
    let after_gj = rss_kib();
    if what == "jobs" || all {
        jobs.apply(&Event::Init, &Scope::All);
        for i in 0..n {
            let j: Job = serde_json::from_value(job(i)).unwrap();
            jobs.apply(&Event::InitApply(j), &Scope::All);
        }
        jobs.apply(&Event::InitDone, &Scope::All);
    }
    let after_jobs = rss_kib();
    if what == "pods" || all {
        pods.apply(&Event::Init, &Scope::All, &jobs);
        for i in 0..n {
            let p: Pod = serde_json::from_value(pod(i)).unwrap();
            pods.apply(&Event::InitApply(p), &Scope::All, &jobs);
        }
        pods.apply(&Event::InitDone, &Scope::All, &jobs);
    }
    let after_pods = rss_kib();
    let each = |from: u64, to: u64| to.saturating_sub(from) as f64 * 1024.0 / n as f64;
    println!(
        "n={n} GpuJob cache: {:.0} B each; Job index: {:.0} B each; pod index: {:.0} B each ({} GpuJobs, {} Jobs, {} pods cached)",
        each(base, after_gj),
        each(after_gj, after_jobs),
        each(after_jobs, after_pods),
        gpujobs.len(),
        jobs.len(),
        pods.len()
    );
}
