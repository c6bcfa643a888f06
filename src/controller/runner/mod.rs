//! Runs the controller: watches fill the caches and the queue (`watches.rs`), workers
//! reconcile the keys of shards this replica holds (`worker.rs`), ownership changes hand
//! work over shard by shard (`handover.rs`), shutdown drains.

mod first_look;
mod from_caches;
mod handover;
mod sizing;
mod watches;
mod worker;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use kube::Client;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use super::view::View;
use super::{Context, GangScheduling, Key, Settings, apply, domain, init_metrics};
use crate::health::Status;
use crate::lease::Ownership;
use crate::queue::Queue;
use first_look::FirstLooks;

/// Where watch events and resyncs put keys: the work queue, for GpuJobs of shards this
/// replica holds. A standby queues nothing (gaining a shard queues those of its GpuJobs
/// that need the API server, `first_look.rs`), so its queue metrics stay true.
#[derive(Clone)]
struct Intake {
    queue: Queue<Key>,
    own: watch::Receiver<Ownership>,
    /// The shards gained whose GpuJobs are not all looked at yet.
    looks: Arc<FirstLooks>,
}

impl Intake {
    /// A GpuJob to look at again. One still to have its first look since its shard was
    /// gained goes to the first-look lane (one queued in the normal lane moves there):
    /// the list that follows a cold gain names every GpuJob of the shard, and queued
    /// here in the normal lane, the first look would wait behind the backlog. One
    /// looked at already (an echo of that look's writes) goes to the normal lane: in the
    /// first-look lane it would take the share of the workers' time that lane has over
    /// new work, while the shard's GpuJobs never observed wait in the prompt lane.
    fn add(&self, key: Key) {
        let own = self.own.borrow();
        if !own.holds_namespace(&key.namespace) {
            return;
        }
        if self.looks.awaits(own.shard_of(&key.namespace), &key) {
            self.queue.add_first_look(key);
        } else {
            self.queue.add(key);
        }
    }

    /// A GpuJob found by a gain or a list whose first look needs the API server
    /// (`from_caches::look_from_caches`): one `observed` before as `add` queues it (to the
    /// first look of a shard just gained), one never observed to the prompt lane, as new
    /// work on any replica is.
    fn add_found(&self, key: Key, observed: bool) {
        if observed {
            self.add(key);
        } else {
            self.add_prompt(key);
        }
    }

    /// New work not begun (a GpuJob never looked at): ahead of resyncs, retries and the
    /// echoes of this replica's own writes.
    fn add_prompt(&self, key: Key) {
        if self.own.borrow().holds_namespace(&key.namespace) {
            self.queue.add_prompt(key);
        }
    }

    /// The next step of work under way (an attempt that just finished, a pod newly
    /// waiting at the gate or newly unschedulable): in the prompt lane too, ahead of the
    /// work not begun of its namespace.
    fn add_under_way(&self, key: Key) {
        if self.own.borrow().holds_namespace(&key.namespace) {
            self.queue.add_under_way(key);
        }
    }

    fn resync(&self, key: Key) {
        if self.own.borrow().holds_namespace(&key.namespace) {
            self.queue.add_unless_backing_off(key);
        }
    }
}

/// Whether kube-apiserver serves PodGroups (`crate::controller::gang`), from its
/// discovery: then each multi-node attempt is one gang. Not served, or the question
/// keeps failing (it is asked [`DISCOVERY_TRIES`] times, a second apart): pods are
/// placed one by one, and the log says so.
async fn serves_pod_groups(client: &Client) -> bool {
    use crate::controller::gang;
    let group_version = format!("{}/{}", gang::GROUP, gang::VERSION);
    let mut answer = client.list_api_group_resources(&group_version).await;
    for _ in 1..DISCOVERY_TRIES {
        match &answer {
            Err(kube::Error::Api(e)) if e.code == 404 => break,
            Err(e) => warn!(
                "asking kube-apiserver whether it serves {group_version} PodGroups failed ({e}); asking again in a second"
            ),
            Ok(_) => break,
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        answer = client.list_api_group_resources(&group_version).await;
    }
    match answer {
        Ok(list) if list.resources.iter().any(|r| r.name == gang::PLURAL) => {
            info!(
                "kube-apiserver serves {group_version} PodGroups: each multi-node attempt is one gang"
            );
            true
        }
        Ok(_) => {
            info!(
                "kube-apiserver serves {group_version} without PodGroups: multi-node attempts' pods are placed one by one"
            );
            false
        }
        Err(kube::Error::Api(e)) if e.code == 404 => {
            info!(
                "kube-apiserver does not serve {group_version}: multi-node attempts' pods are placed one by one"
            );
            false
        }
        Err(e) => {
            warn!(
                "cannot tell whether kube-apiserver serves {group_version} PodGroups ({e}): multi-node attempts' pods are placed one by one until this replica restarts"
            );
            false
        }
    }
}

/// How often the start asks whether PodGroups are served before it takes no for an
/// answer (a replica that decides wrongly makes no gangs until it restarts).
const DISCOVERY_TRIES: u32 = 5;

/// Runs the controller without an election: this process owns everything (one replica,
/// tests). Same as [`run`] with an ownership that never expires.
pub async fn run_unfenced(
    client: Client,
    events: Client,
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
    status.metrics.shard_owner.with_label_values(&["0"]).set(1);
    let result = run(client, events, settings, rx, status, shutdown).await;
    drop(tx);
    result
}

/// Runs the controller until `shutdown` resolves, then drains in-flight reconciles
/// (bounded by `drain_timeout`). The caches hold every GpuJob and Job, or, where the
/// API server selects objects by shard, those of the shards held (`watches.rs`); workers
/// reconcile only keys of held shards that both caches cover, and a reconcile in flight when its shard is lost
/// (or lost and regained: a new term) is cancelled.
/// `events`: the client Events are written with, on a budget of its own.
pub async fn run(
    client: Client,
    events: Client,
    settings: Settings,
    ownership: watch::Receiver<Ownership>,
    status: Arc<Status>,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let mut settings = settings;
    tokio::pin!(shutdown);
    // Discovery retries for seconds when the API server fails; a shutdown meanwhile
    // stops here (nothing has been started to drain).
    settings.plan.gang = match settings.gang_scheduling {
        GangScheduling::Auto => tokio::select! {
            gang = serves_pod_groups(&client) => gang,
            _ = &mut shutdown => return Ok(()),
        },
        GangScheduling::Off => false,
    };
    let metrics = status.metrics.clone();
    init_metrics(&metrics);
    metrics.init_shards(ownership.borrow().shards());
    let queue = work_queue(&settings, Some(metrics.queue.clone()));
    settings.plan.multikueue = !settings.multikueue.is_empty();
    let workers = settings.multikueue.clone();
    let ctx = Arc::new(Context {
        view: View::with_workers(workers.iter().map(|w| w.name.as_str())),
        reader: crate::controller::apply::Reader::new(client.clone()).with_workers(workers.clone()),
        writer: apply::Writer::new(
            client.clone(),
            events,
            ownership.clone(),
            &settings.identity,
            settings.quota.clone(),
            metrics.events.clone(),
        )
        .with_workers(workers.clone()),
        settings,
        metrics,
    });
    let intake = Intake {
        queue: queue.clone(),
        own: ownership.clone(),
        looks: Arc::default(),
    };
    let watches = watches::spawn(&client, &ctx, &intake, &status);

    // Workers start only once both caches hold a full list, so the first reconcile of
    // every GpuJob sees its Jobs.
    let ready = ctx.view.wait_ready();
    tokio::select! {
        _ = ready => {
            let ns = ctx.settings.namespace.as_deref().unwrap_or("*");
            info!(namespace = ns, "caches synced");
            status.set_ready(true);
        }
        _ = &mut shutdown => {
            watches.abort();
            return Ok(());
        }
    }
    on_scrape(&status, &ctx, &queue, &ownership);
    let background = [
        tokio::spawn(handover::run(ctx.clone(), intake.clone())),
        tokio::spawn(resync(ctx.clone(), intake.clone())),
        tokio::spawn(count_load(ctx.clone(), ownership.clone())),
    ];
    let (stop_workers, stopping) = watch::channel(false);
    let pool = sizing::Pool::new(ctx.settings.workers.initial());
    let workers: Vec<_> = (0..ctx.settings.workers.most())
        .map(|_| {
            tokio::spawn(worker::run(
                ctx.clone(),
                intake.clone(),
                stopping.clone(),
                pool.permits(),
            ))
        })
        .collect();
    let sizing = tokio::spawn(sizing::follow(
        ctx.metrics.clone(),
        ctx.settings.workers,
        pool,
    ));

    shutdown.await;
    info!("shutting down: no new work; draining in-flight reconciles");
    stop_workers.send_replace(true);
    queue.shut_down();
    abort(&background);
    sizing.abort();
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
    watches.abort();
    Ok(())
}

fn abort(tasks: &[JoinHandle<()>]) {
    for t in tasks {
        t.abort();
    }
}

/// How often, at most, the domain gauges are computed again: each time walks the facts
/// of every cached GpuJob of the held shards under the cache's lock, while scrapers may
/// come every second (the load test does). A change of the shards held recomputes at
/// once.
const DOMAIN_REFRESH: std::time::Duration = std::time::Duration::from_secs(5);

/// Gauges computed at scrape time: queue timings, and the domain view of the GpuJobs of
/// held shards (so that sums across replicas count each GpuJob once).
fn on_scrape(
    status: &Status,
    ctx: &Arc<Context>,
    queue: &Queue<Key>,
    own: &watch::Receiver<Ownership>,
) {
    let queue = queue.clone();
    let ctx = ctx.clone();
    let own = own.clone();
    let first_seen = std::sync::Mutex::new(domain::FirstSeen::new());
    // When the domain gauges were last computed, and for which shards.
    let computed = std::sync::Mutex::new(None::<(tokio::time::Instant, BTreeMap<u32, u64>)>);
    status.on_scrape(move || {
        queue.update_gauges();
        let (state_changes, others) = ctx.writer.events_queued();
        for (lane, n) in [("state_change", state_changes), ("other", others)] {
            ctx.metrics
                .events_queued
                .with_label_values(&[lane])
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        let (gpujobs, jobs, pods) = ctx.view.cached();
        for (resource, n) in [("gpujobs", gpujobs), ("jobs", jobs), ("pods", pods)] {
            ctx.metrics
                .cached_objects
                .with_label_values(&[resource])
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        let own = own.borrow().clone();
        for s in 0..own.shards() {
            ctx.metrics
                .shard_cached
                .with_label_values(&[s.to_string().as_str()])
                .set(i64::from(ctx.view.covers_shard(s)));
        }
        {
            let mut computed = computed.lock().unwrap_or_else(|p| p.into_inner());
            let now = tokio::time::Instant::now();
            let epochs = own.epochs();
            if let Some((at, held)) = &*computed
                && *held == epochs
                && now.saturating_duration_since(*at) < DOMAIN_REFRESH
            {
                return;
            }
            *computed = Some((now, epochs));
        }
        if !own.holds_any() {
            ctx.metrics.publish_domain(None);
            for s in 0..own.shards() {
                let s = s.to_string();
                ctx.metrics
                    .gpujobs_per_shard
                    .with_label_values(&[s.as_str()])
                    .set(0);
                ctx.metrics
                    .namespaces_per_shard
                    .with_label_values(&[s.as_str()])
                    .set(0);
            }
            return;
        }
        let mut per_shard: BTreeMap<u32, i64> = own.held.keys().map(|s| (*s, 0)).collect();
        let mut namespaces: BTreeMap<u32, std::collections::BTreeSet<String>> = BTreeMap::new();
        let mut seen = first_seen.lock().unwrap_or_else(|p| p.into_inner());
        let snap = ctx.view.facts_where(
            |ns| own.holds_namespace(ns),
            |each| {
                let counted = each.map(|(ns, facts)| {
                    let shard = own.shard_of(ns);
                    if let Some(n) = per_shard.get_mut(&shard) {
                        *n += 1;
                        let seen = namespaces.entry(shard).or_default();
                        if !seen.contains(ns) {
                            seen.insert(ns.to_owned());
                        }
                    }
                    facts
                });
                domain::snapshot(
                    counted,
                    jiff::Timestamp::now(),
                    ctx.settings.unconverged_after,
                    &mut seen,
                )
            },
        );
        for s in 0..own.shards() {
            let n = per_shard.get(&s).copied().unwrap_or(0);
            let label = s.to_string();
            ctx.metrics
                .gpujobs_per_shard
                .with_label_values(&[label.as_str()])
                .set(n);
            let spaces = namespaces
                .get(&s)
                .map_or(0, std::collections::BTreeSet::len);
            ctx.metrics
                .namespaces_per_shard
                .with_label_values(&[label.as_str()])
                .set(i64::try_from(spaces).unwrap_or(i64::MAX));
        }
        ctx.metrics.publish_domain(Some(&snap));
    });
}

/// How often the GpuJobs per namespace held are counted for the kept shard map: four
/// times per default renewal, so a renewal states a count at most half a second old
/// (the first cut waits for the namespaces stated, `NAMESPACES_SETTLED`; a pass over the
/// cache takes milliseconds).
const LOAD_EVERY: std::time::Duration = std::time::Duration::from_millis(500);

/// Counts the GpuJobs per namespace of the shards held, every [`LOAD_EVERY`], for the
/// lease loop to state on their Leases (`lease::Load`). Nothing to count with one shard
/// or with cuts fixed by `--shard-cuts`.
async fn count_load(ctx: Arc<Context>, own: watch::Receiver<Ownership>) {
    if !ctx.settings.load.is_counted() {
        return;
    }
    let mut tick = tokio::time::interval(LOAD_EVERY);
    loop {
        tick.tick().await;
        let own = own.borrow().clone();
        if own.shards() < 2 {
            continue;
        }
        // Only shards both caches cover: one still listing would read as empty.
        let counted: BTreeMap<u32, u64> = own
            .held
            .iter()
            .filter(|(s, _)| ctx.view.covers_shard(**s))
            .map(|(s, t)| (*s, t.epoch))
            .collect();
        let counts = ctx.view.facts_where(
            |ns| counted.contains_key(&own.shard_of(ns)),
            |each| {
                let mut counts = BTreeMap::<u64, u64>::new();
                let mut last: Option<(&str, u64)> = None;
                for (ns, _) in each {
                    // The cache iterates a namespace's GpuJobs together: hash it once.
                    let h = match last {
                        Some((l, h)) if l == ns => h,
                        _ => gpujob_core::hash::fnv1a64(ns.as_bytes()),
                    };
                    *counts.entry(h).or_default() += 1;
                    last = Some((ns, h));
                }
                counts
            },
        );
        ctx.settings.load.set(counts, counted);
    }
}

/// The work queue. New work takes turns by namespace: a burst in some namespaces does
/// not hold back new GpuJobs in another. A GpuJob's own backoff (a failed call, refused
/// quota) is capped at `resync`, within which every GpuJob is looked at: one refused
/// quota asks again within that of the quota freeing up, and its refusals go on being
/// counted while it waits. (The overall retry budget can add to the wait when more
/// GpuJobs retry than it lets through in `resync`.)
fn work_queue(settings: &Settings, metrics: Option<crate::metrics::QueueMetrics>) -> Queue<Key> {
    Queue::with_metrics(settings.retry.at_most(settings.resync), metrics)
        .fair_by(|k: &Key| k.namespace.as_str())
}

/// Every GpuJob is looked at at least every `resync`. A GpuJob backing off keeps its
/// backoff, which never grows past `resync` (`work_queue`): a resync does not cut it short.
async fn resync(ctx: Arc<Context>, intake: Intake) {
    let mut tick = tokio::time::interval(ctx.settings.resync);
    tick.tick().await;
    loop {
        tick.tick().await;
        for key in ctx.view.keys() {
            intake.resync(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::view::ObservedOrNew;
    use crate::queue::Backoff;

    /// A GpuJob that keeps backing off (refused quota, a failing call) is looked at
    /// again within `--resync`, not after the 1000 s of the default backoff's cap.
    #[tokio::test(start_paused = true)]
    async fn a_gpujob_backing_off_waits_no_longer_than_the_resync() {
        let settings = Settings {
            resync: std::time::Duration::from_secs(120),
            ..Settings::default()
        };
        let queue = work_queue(&settings, None);
        let key = Key::new("ns", "refused");
        let delays: Vec<_> = (0..30)
            .map(|_| queue.add_rate_limited(key.clone()))
            .collect();
        assert_eq!(delays[0], std::time::Duration::from_millis(5));
        assert_eq!(delays.iter().max(), Some(&settings.resync), "{delays:?}");
        assert_eq!(delays[29], settings.resync);
    }

    /// The intake of a replica holding every namespace (unfenced), with an empty queue
    /// and no shard gained.
    fn intake() -> Intake {
        let (_tx, own) = watch::channel(Ownership::unfenced());
        Intake {
            queue: Queue::new(Backoff::default()),
            own,
            looks: Arc::default(),
        }
    }

    /// The list that follows a cold gain queues the GpuJobs of the shard observed before
    /// through `add`: until each has had its first look they go to the first-look lane,
    /// ahead of the backlog, and not behind it.
    #[tokio::test(start_paused = true)]
    async fn a_gained_shards_gpujobs_queue_for_their_first_look_until_it_is_over() {
        let intake = intake();
        let (queue, looks) = (intake.queue.clone(), intake.looks.clone());
        intake.add(Key::new("ns", "backlog"));
        looks.gained(0, tokio::time::Instant::now());
        intake.add(Key::new("ns", "gained"));
        assert_eq!(queue.get().await, Some(Key::new("ns", "gained")));
        assert_eq!(queue.get().await, Some(Key::new("ns", "backlog")));
        // Its first look over, the shard's GpuJobs queue in the normal lane again.
        let at = tokio::time::Instant::now();
        let keys = ObservedOrNew {
            observed: vec![Key::new("ns", "gained")],
            new: Vec::new(),
        };
        assert!(looks.known(0, &keys, at).is_empty());
        assert!(!looks.looked(0, &Key::new("ns", "gained"), at).is_empty());
        intake.add(Key::new("ns", "later"));
        intake.add_prompt(Key::new("ns", "new"));
        assert_eq!(queue.get().await, Some(Key::new("ns", "new")));
        assert_eq!(queue.get().await, Some(Key::new("ns", "later")));
    }

    /// While a gained shard's first look goes on, a GpuJob of it already looked at (an
    /// echo of its look's writes) queues in the normal lane; one still to be looked at,
    /// in the first-look lane, ahead of the backlog.
    #[tokio::test(start_paused = true)]
    async fn a_gained_gpujob_looked_at_already_queues_behind_the_backlog() {
        let intake = intake();
        let (queue, looks) = (intake.queue.clone(), intake.looks.clone());
        let at = tokio::time::Instant::now();
        looks.gained(0, at);
        let keys = ObservedOrNew {
            observed: vec![Key::new("ns", "looked"), Key::new("ns", "waiting")],
            new: vec![Key::new("ns", "new")],
        };
        assert!(looks.known(0, &keys, at).is_empty());
        assert!(looks.looked(0, &Key::new("ns", "looked"), at).is_empty());
        intake.add(Key::new("ns", "backlog"));
        intake.add(Key::new("ns", "looked"));
        intake.add(Key::new("ns", "waiting"));
        assert_eq!(queue.get().await, Some(Key::new("ns", "waiting")));
        assert_eq!(queue.get().await, Some(Key::new("ns", "backlog")));
        assert_eq!(queue.get().await, Some(Key::new("ns", "looked")));
    }

    /// An echo of a first look's own write, queued while the worker still has the key,
    /// does not bring it back ahead of the backlog once the worker has looked.
    #[tokio::test(start_paused = true)]
    async fn an_echo_during_a_first_look_runs_again_behind_the_backlog() {
        let intake = intake();
        let (queue, looks) = (intake.queue.clone(), intake.looks.clone());
        let at = tokio::time::Instant::now();
        looks.gained(0, at);
        let gained = Key::new("ns", "gained");
        let keys = ObservedOrNew {
            observed: vec![gained.clone()],
            new: Vec::new(),
        };
        assert!(looks.known(0, &keys, at).is_empty());
        intake.add(Key::new("ns", "backlog"));
        intake.add(gained.clone());
        assert_eq!(queue.get().await, Some(gained.clone()));
        intake.add(gained.clone());
        assert!(!worker::looked(&queue, &looks, 0, &gained, at).is_empty());
        queue.done(&gained);
        assert_eq!(queue.get().await, Some(Key::new("ns", "backlog")));
        assert_eq!(queue.get().await, Some(gained));
    }

    /// A gained shard's GpuJobs never observed are new work: in the prompt lane, where a
    /// pod that reaches the gate goes before its namespace's new GpuJobs. Those observed
    /// before share the workers with it from the first-look lane (in turns here, where
    /// every look takes no time).
    #[tokio::test(start_paused = true)]
    async fn a_gained_shards_new_gpujobs_come_after_pods_newly_at_the_gate() {
        let intake = intake();
        let queue = intake.queue.clone();
        intake.looks.gained(0, tokio::time::Instant::now());
        for (name, observed) in [("o1", true), ("o2", true), ("n1", false), ("n2", false)] {
            intake.add_found(Key::new("ns", name), observed);
        }
        let mut order = Vec::new();
        while !queue.is_empty() {
            let Some(key) = queue.get().await else { break };
            queue.done(&key);
            if key.name == "n1" && !order.contains(&key.name) {
                // The pod of n1's Job, at the gate once n1 was looked at: ahead of n2.
                intake.add_under_way(key.clone());
            }
            order.push(key.name);
        }
        assert_eq!(order, ["o1", "n1", "o2", "n1", "n2"]);
    }
}
