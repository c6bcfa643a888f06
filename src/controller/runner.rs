//! Runs the controller: watches fill the caches and the queue, workers reconcile while
//! this replica owns work, ownership changes hand work over, shutdown drains.

use std::future::Future;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use kube::api::Api;
use kube::runtime::reflector;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use tokio::sync::watch;
use tracing::{error, info, warn};

use super::error::Error;
use super::reconcile::{Next, reconcile};
use super::{Context, Key, Settings, apply, cache, domain, memory};
use crate::api::{GpuJob, LABEL_UID};
use crate::lease::Ownership;
use crate::queue::Queue;
use crate::server::Status;

/// Where watch events and resyncs put keys: the work queue, while this replica owns
/// work. A standby keeps its caches warm but queues nothing (gaining ownership queues
/// every GpuJob), so its queue metrics stay true.
struct Intake {
    queue: Queue<Key>,
    own: watch::Receiver<Ownership>,
}

impl Intake {
    fn add(&self, key: Key) {
        if self.own.borrow().holds_any() {
            self.queue.add(key);
        }
    }

    fn resync(&self, key: Key) {
        if self.own.borrow().holds_any() {
            self.queue.add_unless_backing_off(key);
        }
    }
}

fn api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// Runs the controller without an election: this process owns everything (one replica,
/// tests). Same as [`run`] with an ownership that never expires.
pub async fn run_unfenced(
    client: Client,
    settings: Settings,
    status: Arc<Status>,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let (tx, rx) = watch::channel(Ownership::unfenced());
    // Alone, this replica leads: say so, or "no leader" alerts would fire.
    status
        .metrics
        .leader
        .with_label_values(&[crate::metrics::CONTROLLER])
        .set(1);
    status.metrics.shards_held.set(1);
    let result = run(client, settings, rx, status, shutdown).await;
    drop(tx);
    result
}

/// Runs the controller until `shutdown` resolves, then drains in-flight reconciles
/// (bounded by `drain_timeout`). Caches stay warm whether or not this replica owns
/// anything; workers reconcile only while `ownership` holds a shard, and a reconcile in
/// flight when ownership is lost is cancelled.
pub async fn run(
    client: Client,
    settings: Settings,
    ownership: watch::Receiver<Ownership>,
    status: Arc<Status>,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let metrics = status.metrics.clone();
    let ns = settings.namespace.clone();
    let (gpujobs, gj_writer) = reflector::store::<GpuJob>();
    let queue: Queue<Key> = Queue::with_metrics(settings.retry, Some(metrics.queue.clone()));
    let ctx = Arc::new(Context {
        client: client.clone(),
        gpujobs,
        jobs: cache::JobIndex::default(),
        memory: memory::WriteMemory::default(),
        writer: apply::Writer::new(client.clone(), ownership.clone(), &settings.identity),
        quota: settings.quota.clone(),
        settings,
        metrics,
    });

    let gj_watch = {
        let queue = Intake {
            queue: queue.clone(),
            own: ownership.clone(),
        };
        let store = ctx.gpujobs.clone();
        let stream = watcher(
            api::<GpuJob>(&client, ns.as_deref()),
            watcher::Config::default(),
        )
        .default_backoff()
        .modify(|gj| gj.managed_fields_mut().clear());
        tokio::spawn(async move {
            let mut events = reflector::reflector(gj_writer, stream).boxed();
            // A relist reaches the store only when complete (InitDone); then every
            // GpuJob it had before or has now is looked at: anything may have changed
            // while nobody was watching.
            let mut before: Vec<Key> = Vec::new();
            while let Some(event) = events.next().await {
                match event {
                    Ok(watcher::Event::Apply(gj) | watcher::Event::Delete(gj)) => {
                        queue.add(Key::of(&gj));
                    }
                    Ok(watcher::Event::Init) => {
                        before = store.state().iter().map(|g| Key::of(g)).collect();
                    }
                    Ok(watcher::Event::InitApply(_)) => {}
                    Ok(watcher::Event::InitDone) => {
                        for key in std::mem::take(&mut before) {
                            queue.add(key);
                        }
                        for gj in store.state() {
                            queue.add(Key::of(&gj));
                        }
                    }
                    Err(e) => warn!("GpuJob watch failed: {e}; retrying with backoff"),
                }
            }
        })
    };
    let job_watch = {
        let queue = Intake {
            queue: queue.clone(),
            own: ownership.clone(),
        };
        let ctx = ctx.clone();
        let stream = watcher(
            api::<Job>(&client, ns.as_deref()),
            watcher::Config::default().labels(LABEL_UID),
        )
        .default_backoff();
        tokio::spawn(async move {
            let mut events = stream.boxed();
            while let Some(event) = events.next().await {
                match event {
                    Ok(event) => {
                        for key in ctx.jobs.apply(&event) {
                            queue.add(key);
                        }
                    }
                    Err(e) => warn!("Job watch failed: {e}; retrying with backoff"),
                }
            }
        })
    };

    // Workers start only once both caches hold a full list, so the first reconcile of
    // every GpuJob sees its Jobs.
    let ready = async {
        let _ = ctx.gpujobs.wait_until_ready().await;
        ctx.jobs.wait_ready().await;
    };
    tokio::pin!(shutdown);
    tokio::select! {
        _ = ready => {
            info!(namespace = ns.as_deref().unwrap_or("*"), "caches synced");
            status.set_ready(true);
        }
        _ = &mut shutdown => {
            gj_watch.abort();
            job_watch.abort();
            return Ok(());
        }
    }

    // Gauges computed at scrape time: queue timings, and the domain view (leader only,
    // so that sums across replicas count each GpuJob once).
    {
        let queue = queue.clone();
        let ctx = ctx.clone();
        let own = ownership.clone();
        let first_seen = std::sync::Mutex::new(domain::FirstSeen::new());
        status.on_scrape(move || {
            queue.update_gauges();
            if own.borrow().holds_any() {
                let all = ctx.gpujobs.state();
                let mut seen = first_seen.lock().unwrap_or_else(|p| p.into_inner());
                let now = jiff::Timestamp::now();
                let snap = domain::snapshot(
                    all.iter().map(|g| g.as_ref()),
                    now,
                    ctx.settings.unconverged_after,
                    &mut seen,
                );
                ctx.metrics.set_domain(Some(&snap));
            } else {
                ctx.metrics.set_domain(None);
            }
        });
    }

    // Gaining ownership: look at everything (another replica may have changed it).
    // Losing it: forget what this replica wrote (its successor writes now).
    let handover = {
        let queue = queue.clone();
        let ctx = ctx.clone();
        let mut own = ownership.clone();
        tokio::spawn(async move {
            let mut held = false;
            loop {
                let now_held = own.borrow_and_update().holds_any();
                if now_held && !held {
                    info!("ownership gained: reconciling every GpuJob");
                    for gj in ctx.gpujobs.state() {
                        queue.add(Key::of(&gj));
                    }
                } else if !now_held && held {
                    info!("ownership lost: workers stopped, caches kept warm");
                    ctx.memory.clear();
                }
                held = now_held;
                if own.changed().await.is_err() {
                    return;
                }
            }
        })
    };

    let resync = {
        let queue = Intake {
            queue: queue.clone(),
            own: ownership.clone(),
        };
        let ctx = ctx.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(ctx.settings.resync);
            tick.tick().await;
            loop {
                tick.tick().await;
                for gj in ctx.gpujobs.state() {
                    // A GpuJob backing off (a failed call, refused quota) keeps its
                    // backoff: a long quota shortage costs few calls.
                    queue.resync(Key::of(&gj));
                }
            }
        })
    };

    let (stop_workers, stopping) = watch::channel(false);
    let workers: Vec<_> = (0..ctx.settings.workers.max(1))
        .map(|_| {
            tokio::spawn(worker(
                ctx.clone(),
                queue.clone(),
                ownership.clone(),
                stopping.clone(),
            ))
        })
        .collect();

    shutdown.await;
    info!("shutting down: no new work; draining in-flight reconciles");
    stop_workers.send_replace(true);
    queue.shut_down();
    resync.abort();
    handover.abort();
    let drain = futures::future::join_all(workers);
    if tokio::time::timeout(ctx.settings.drain_timeout, drain)
        .await
        .is_err()
    {
        warn!(
            "in-flight reconciles did not finish within {:?}; abandoning them (every write is safe to repeat)",
            ctx.settings.drain_timeout
        );
    }
    gj_watch.abort();
    job_watch.abort();
    Ok(())
}

async fn worker(
    ctx: Arc<Context>,
    queue: Queue<Key>,
    mut own: watch::Receiver<Ownership>,
    mut stopping: watch::Receiver<bool>,
) {
    let mut lost = own.clone();
    loop {
        // A standby waits for ownership, or for shutdown (nothing to drain then).
        tokio::select! {
            held = own.wait_for(Ownership::holds_any) => if held.is_err() { return },
            _ = stopping.wait_for(|s| *s) => return,
        }
        let key = tokio::select! {
            key = queue.get() => match key {
                Some(key) => key,
                None => return,
            },
            _ = lost.wait_for(|o| !o.holds_any()) => continue,
        };
        let started = tokio::time::Instant::now();
        // Every line a reconcile logs carries the GpuJob and its shard; `attempt` is
        // filled in once known.
        let span = tracing::info_span!("reconcile", namespace = %key.namespace, name = %key.name,
            shard = 0u32, attempt = tracing::field::Empty);
        let outcome = tokio::select! {
            result = tracing::Instrument::instrument(reconcile(&ctx, &key), span) => Some(result),
            _ = lost.wait_for(|o| !o.holds_any()) => None,
        };
        let m = &ctx.metrics;
        m.reconcile_time.observe(started.elapsed().as_secs_f64());
        match outcome {
            None => info!(gpujob = %key, "reconcile cancelled: ownership lost"),
            Some(Ok(Next::Done)) => {
                queue.forget(&key);
                m.reconcile_total.with_label_values(&["success"]).inc();
            }
            Some(Ok(Next::After(after))) => {
                queue.forget(&key);
                m.reconcile_total
                    .with_label_values(&["requeue_after"])
                    .inc();
                queue.add_after(key.clone(), after);
            }
            Some(Ok(Next::Backoff)) => {
                // Not an error, but waiting on the outside: the backoff keeps growing.
                m.reconcile_total.with_label_values(&["requeue"]).inc();
                queue.add_rate_limited(key.clone());
            }
            Some(Err(e)) => {
                m.reconcile_total.with_label_values(&["error"]).inc();
                m.reconcile_errors.inc();
                m.reconcile_errors_by_kind
                    .with_label_values(&[e.metric_label()])
                    .inc();
                match (&e, e.retry_after()) {
                    // Comes back with ownership (the hand-over adds every key).
                    (Error::NotLeader, _) => info!(gpujob = %key, "{e}"),
                    (_, Some(after)) => {
                        info!(gpujob = %key, "{e}");
                        queue.add_after(key.clone(), after);
                    }
                    (_, None) => {
                        let delay = queue.add_rate_limited(key.clone());
                        error!(gpujob = %key, error = e.metric_label(), "reconcile failed: {e}; retrying in {delay:?}");
                    }
                }
            }
        }
        queue.done(&key);
    }
}
