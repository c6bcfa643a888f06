//! Work queue throughput: add → get → done cycles, with few keys and with 100k keys
//! queued. Run: `cargo bench -p gpujob-benches`.

use std::hint::black_box;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use futures::FutureExt;
use gpujob_operator::queue::{Backoff, Queue};

fn add_get_done(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let _guard = rt.enter();

    let mut group = c.benchmark_group("queue");
    group.throughput(Throughput::Elements(1));
    group.bench_function("add_get_done/one_key", |b| {
        let q: Queue<u64> = Queue::new(Backoff::default());
        b.iter(|| {
            q.add(black_box(7));
            let k = q.get().now_or_never().flatten().expect("ready");
            q.done(&k);
        })
    });
    group.bench_function("add_get_done/100k_queued", |b| {
        let q: Queue<u64> = Queue::new(Backoff::default());
        for k in 0..100_000 {
            q.add(k);
        }
        let mut next = 100_000u64;
        b.iter(|| {
            // Steady state: one in, one out, 100k waiting.
            q.add(black_box(next));
            next += 1;
            let k = q.get().now_or_never().flatten().expect("ready");
            q.done(&k);
        })
    });
    group.bench_function("add_duplicate/100k_queued", |b| {
        let q: Queue<u64> = Queue::new(Backoff::default());
        for k in 0..100_000 {
            q.add(k);
        }
        b.iter(|| q.add(black_box(50_000)))
    });
    group.throughput(Throughput::Elements(100_000));
    group.sample_size(10);
    group.bench_function("fill_and_drain/100k", |b| {
        b.iter_batched(
            || Queue::<u64>::new(Backoff::default()),
            |q| {
                for k in 0..100_000 {
                    q.add(k);
                }
                while let Some(Some(k)) = q.get().now_or_never() {
                    q.done(&k);
                }
            },
            BatchSize::LargeInput,
        )
    });
    group.finish();
}

criterion_group!(benches, add_get_done);
criterion_main!(benches);
