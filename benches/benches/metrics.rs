//! What a scrape of /metrics costs with 10,000 GpuJobs cached: the domain snapshot over
//! the facts the GpuJob cache keeps beside each GpuJob (nothing decoded) plus the text
//! encoding; beside it, decoding every cached GpuJob, which each scrape did before the
//! facts. Run: `cargo bench -p gpujob-benches --bench metrics`.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use gpujob_operator::api::{GpuJob, GpuJobStatus, Phase};
use gpujob_operator::controller::domain::{FirstSeen, snapshot};
use gpujob_operator::controller::view::cache::GpuJobCache;
use gpujob_operator::controller::view::scope::Scope;
use gpujob_operator::metrics::Metrics;
use kube::runtime::watcher::Event;

fn gpujobs(n: usize) -> Vec<GpuJob> {
    (0..n)
        .map(|i| {
            let spec =
                serde_json::from_value(serde_json::json!({"image": "i", "gpus": 1})).expect("spec");
            let mut g = GpuJob::new(&format!("gj-{i}"), spec);
            g.metadata.uid = Some(format!("uid-{i}"));
            g.metadata.generation = Some(1);
            let phase = [
                Phase::Pending,
                Phase::Running,
                Phase::Succeeded,
                Phase::Failed,
            ][i % 4];
            g.status = Some(GpuJobStatus {
                phase: Some(phase),
                observed_generation: Some(1),
                ..Default::default()
            });
            g
        })
        .collect()
}

fn scrape(c: &mut Criterion) {
    let cache = GpuJobCache::default();
    for g in gpujobs(10_000) {
        cache.apply(&Event::Apply(g), &Scope::All);
    }
    let metrics = Metrics::new();
    let mut seen = FirstSeen::new();
    let now = jiff::Timestamp::now();
    let domain = |seen: &mut FirstSeen| {
        cache.facts_where(
            |_| true,
            |each| snapshot(each.map(|(_, f)| f), now, Duration::from_secs(600), seen),
        )
    };
    let body = {
        let snap = domain(&mut seen);
        metrics.publish_domain(Some(&snap));
        metrics.encode()
    };
    println!(
        "/metrics body with 10,000 GpuJobs cached: {} bytes",
        body.len()
    );
    c.bench_function("scrape/10k_gpujobs", |b| {
        b.iter(|| {
            let snap = domain(black_box(&mut seen));
            metrics.publish_domain(Some(&snap));
            black_box(metrics.encode())
        })
    });
}

/// What every scrape cost before the facts: each cached GpuJob decompressed and decoded.
fn decode_each(c: &mut Criterion) {
    let cache = GpuJobCache::default();
    for g in gpujobs(10_000) {
        cache.apply(&Event::Apply(g), &Scope::All);
    }
    let keys = cache.keys();
    c.bench_function("decode_each/10k_gpujobs", |b| {
        b.iter(|| {
            for k in &keys {
                black_box(cache.get(k));
            }
        })
    });
}

criterion_group!(benches, scrape, decode_each);
criterion_main!(benches);
