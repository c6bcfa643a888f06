//! The three watches: GpuJobs, the Jobs they control and their attempts' pods, each
//! event fed to the view (`view/`). Each GpuJob or Job event queues the GpuJob it
//! concerns; a relist queues every GpuJob it changed (one that came, went, or has
//! another resourceVersion, or whose Jobs did), and for Jobs also every GpuJob whose
//! Jobs the view's write memory still speaks of. One the relist left as cached was
//! looked at already, as it is: queueing it again would make every relist (a watch that
//! could not resume, a shard starting its watch) look at every GpuJob it covers once
//! more. A pod event, or a pod relist, queues a GpuJob only when its gate has something
//! to do (a pod newly waiting at the gate, one that could run and no longer can, one
//! gone, one the scheduler newly found no node for: `View::pod_event`); a pod's status
//! otherwise changes nothing the plan reads.
//! New work goes to the queue's prompt lane: a GpuJob without a status (never looked at),
//! and, ahead of those of its namespace as work under way, a Job that has finished (its
//! GpuJob's next step is due) and a pod event the gate acts on.
//!
//! With more than one shard (and every namespace watched), the watches ask only for the
//! objects of the shards this replica holds, when the API server can select them (the
//! sharded list and watch, KEP-5866; told by the selector it echoes on a list, not by its
//! version): each shard held, or kept warm for a takeover (`Ownership::warm`), has a
//! watch of its GpuJobs, one of its Jobs and one of its pods, each with that shard's range
//! as selector. A shard newly held or kept warm starts its own three (listing that shard
//! alone); a shard neither held nor kept warm any longer stops them and leaves the
//! caches (a shard given up or lost lingers warm a while: `coordinator/warm.rs`); the
//! other shards' watches
//! go on untouched, so a takeover of a warm shard lists nothing. Otherwise the watches
//! receive everything, as with one shard.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use tokio::task::{AbortHandle, JoinHandle, JoinSet};
use tracing::{debug, info, warn};

use super::{Context, Intake, Key, first_look, from_caches};
use crate::api::{GpuJob, LABEL_UID};
use crate::client::selecting;
use crate::controller::multikueue::WorkerCluster;
use crate::controller::plan::{JobState, job_state};
use crate::controller::view::scope::{Cached, Scope};
use crate::health::Status;
use crate::lease::Ownership;
use crate::shard::ShardMap;

fn api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// Starts the watches; they run until the returned task is aborted. `status` learns of
/// GpuJob lists that fail before the caches synced (see `Status::readiness`).
pub(super) fn spawn(
    client: &Client,
    ctx: &Arc<Context>,
    intake: &Intake,
    status: &Arc<Status>,
) -> JoinHandle<()> {
    tokio::spawn(supervise(
        client.clone(),
        ctx.clone(),
        intake.clone(),
        status.clone(),
    ))
}

/// How long the watches wait after a change of the shards held before starting again:
/// a replica gains or loses several shards within a look, and each start lists anew.
const SETTLE: Duration = Duration::from_millis(200);

async fn supervise(client: Client, ctx: Arc<Context>, intake: Intake, status: Arc<Status>) {
    // Whatever this replica holds, for as long as the watches run (dropped with them).
    let mut on_workers = JoinSet::new();
    for worker in ctx.settings.multikueue.iter() {
        on_workers.spawn(worker_pods(worker.clone(), ctx.clone(), intake.clone()));
    }
    let mut own = intake.own.clone();
    let mut map = own.borrow().map.clone();
    let mut tasks = JoinSet::new();
    let sharded = map.shards() > 1
        && ctx.settings.namespace.is_none()
        && selects(&client, &status, &map).await;
    ctx.metrics.sharded_watch.set(i64::from(sharded));
    if !sharded {
        start(&mut tasks, &client, &ctx, &intake, &status, Scope::All);
        while tasks.join_next().await.is_some() {}
        return;
    }
    // Each shard watched has a watch of its GpuJobs, one of its Jobs and one of its pods.
    let mut running: BTreeMap<u32, Vec<AbortHandle>> = BTreeMap::new();
    let mut current: Option<Scope> = None;
    loop {
        let wanted = scope_of(&own.borrow_and_update(), ctx.settings.warm_shards);
        if let Scope::Shards { map: next, .. } = &wanted
            && *next != map
        {
            // The kept map moved a cut: every shard's watches start again under the new
            // ranges, and no GpuJob is reconciled until both caches cover its shard
            // again (a pause of a list; shards whose range did not change too).
            info!(
                cuts = %next.cuts_text(),
                "shard map changed: watching the shards held and kept warm under the new ranges"
            );
            let stopping: HashSet<_> = std::mem::take(&mut running)
                .into_values()
                .flatten()
                .map(|task| {
                    task.abort();
                    task.id()
                })
                .collect();
            join_stopped(&mut tasks, stopping).await;
            ctx.view.watching(&wanted);
            ctx.view.drop_part(&Scope::Shards {
                held: (0..map.shards()).collect(),
                map: map.clone(),
            });
            map = next.clone();
            current = None;
        }
        if current.as_ref() != Some(&wanted) {
            let parts: BTreeMap<u32, Scope> = wanted
                .shards()
                .into_iter()
                .map(|s| (s, Scope::single(s, map.clone())))
                .collect();
            // A shard no longer wanted: its watches stop before the caches hear of the
            // new scope (no event of it arrives after), then what they filled goes.
            let gone: Vec<u32> = running
                .keys()
                .filter(|s| !parts.contains_key(s))
                .copied()
                .collect();
            let mut stopping = HashSet::new();
            for shard in &gone {
                for task in running.remove(shard).unwrap_or_default() {
                    task.abort();
                    stopping.insert(task.id());
                }
            }
            // Until they have ended: one in the middle of applying a list would otherwise
            // finish it after the caches let go of its shard.
            join_stopped(&mut tasks, stopping).await;
            ctx.view.watching(&wanted);
            for shard in gone {
                ctx.view.drop_part(&Scope::single(shard, map.clone()));
            }
            if wanted.is_empty() {
                ctx.view.watch_nothing(&wanted);
            } else {
                info!(
                    shards = ?parts.keys().collect::<Vec<_>>(),
                    "watching the GpuJobs, Jobs and pods of the shards held and kept warm"
                );
            }
            // A shard newly wanted: its own watches, with its own selector.
            for (shard, part) in parts {
                if running.contains_key(&shard) {
                    continue;
                }
                let selecting = selecting(&client, &part.selector().unwrap_or_default());
                let handles = start(&mut tasks, &selecting, &ctx, &intake, &status, part);
                running.insert(shard, handles);
            }
            current = Some(wanted);
        }
        if own.changed().await.is_err() {
            return;
        }
        tokio::time::sleep(SETTLE).await;
    }
}

/// Waits until the tasks `stopping` (aborted) have ended.
async fn join_stopped(tasks: &mut JoinSet<()>, mut stopping: HashSet<tokio::task::Id>) {
    while !stopping.is_empty() {
        match tasks.join_next_with_id().await {
            Some(Ok((id, ()))) => stopping.remove(&id),
            Some(Err(e)) => stopping.remove(&e.id()),
            None => break,
        };
    }
}

/// The shards `own` holds, and with `warm`, those it keeps warm for a takeover.
fn scope_of(own: &Ownership, warm: bool) -> Scope {
    let kept = if warm { Some(&own.warm) } else { None };
    Scope::Shards {
        held: own
            .held
            .keys()
            .chain(kept.into_iter().flatten())
            .copied()
            .collect(),
        map: own.map.clone(),
    }
}

/// Starts the watches of `part` (everything, or one shard); returns their handles.
fn start(
    tasks: &mut JoinSet<()>,
    client: &Client,
    ctx: &Arc<Context>,
    intake: &Intake,
    status: &Arc<Status>,
    part: Scope,
) -> Vec<AbortHandle> {
    let ns = ctx.settings.namespace.as_deref();
    vec![
        tasks.spawn(gpujobs(
            api::<GpuJob>(client, ns),
            ctx.clone(),
            intake.clone(),
            status.clone(),
            part.clone(),
        )),
        tasks.spawn(jobs(
            api::<Job>(client, ns),
            ctx.clone(),
            intake.clone(),
            part.clone(),
        )),
        tasks.spawn(pods(
            api::<Pod>(client, ns),
            ctx.clone(),
            intake.clone(),
            part,
        )),
    ]
}

const PROBE_WAIT_MAX: Duration = Duration::from_secs(30);

/// Does the API server apply shard selectors? Asked once, by a list of one Job with a
/// selector of every shard: a server that applies it echoes it (`metadata.shardInfo`),
/// one without the feature ignores the parameter. Jobs, not GpuJobs: Kubernetes 1.37
/// filters custom resources by the selector too but echoes it only on built-in lists
/// (its unstructured lists have no `shardInfo` to set); objects of other shards that
/// arrive anyway are counted and dropped ([`in_scope`]). Retried until the API server
/// answers (each failure counts as a failed GpuJob list, for readiness).
async fn selects(client: &Client, status: &Status, map: &ShardMap) -> bool {
    let Some(every) = map.selector(0..map.shards()) else {
        return false;
    };
    let probe = selecting(client, &every);
    let url = format!("{}?limit=1", Api::<Job>::all(probe.clone()).resource_url());
    let mut wait = Duration::from_millis(500);
    loop {
        let request = http::Request::get(url.as_str()).body(Vec::new());
        let answer = match request {
            Ok(request) => probe.request::<serde_json::Value>(request).await,
            Err(e) => {
                warn!(
                    "shard selector probe: the request could not be built ({e}); watching everything"
                );
                return false;
            }
        };
        match answer {
            Ok(list) => {
                let echoed = list
                    .pointer("/metadata/shardInfo/selector")
                    .and_then(serde_json::Value::as_str);
                if let Some(echoed) = echoed
                    && echoed != every
                {
                    warn!(
                        sent = every,
                        echoed,
                        "the API server echoed another shard selector than the one sent; watching everything"
                    );
                    return false;
                }
                if echoed.is_none() {
                    info!(
                        "the API server does not select objects by shard (no shardInfo on a sharded list of Jobs: feature gate ShardedListAndWatch off, or Kubernetes before 1.36); watching every GpuJob and Job and keeping them all"
                    );
                }
                return echoed.is_some();
            }
            Err(e) => {
                status.gpujob_list_failed();
                warn!(
                    "shard selector probe: listing Jobs failed: {}; retrying in {:?}",
                    crate::apierror::describe(&e),
                    wait
                );
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(PROBE_WAIT_MAX);
            }
        }
    }
}

/// The API server ends each watch before the client's read timeout could. Lists come
/// in pages of [`LIST_PAGE`].
fn config(ctx: &Context) -> watcher::Config {
    let secs = u32::try_from(ctx.settings.watch_timeout.as_secs()).unwrap_or(u32::MAX);
    watcher::Config::default()
        .timeout(secs.max(1))
        .page_size(LIST_PAGE)
}

/// Objects per page of a list (at start, and when a watch cannot resume). With
/// kube-runtime's 500, a replica started among many GpuJobs keeps far more memory than
/// one that saw them arrive one by one: each page's answer and decoded objects are freed
/// between the small cache records kept from it, and the allocator cannot give those
/// pages back. 100 keeps the two alike (the figures: loadtest/REPORT.md), for five
/// times as many list requests.
const LIST_PAGE: u32 = 100;

/// The events of a watch of `api` with `config`, of `scope` alone: an object from
/// outside it (the API server did not apply the selector) is counted as foreign and
/// dropped ([`in_scope`]); the objects kept are counted as received, as `resource`.
fn watch_events<K>(
    api: Api<K>,
    config: watcher::Config,
    ctx: &Context,
    scope: &Scope,
    resource: &str,
) -> BoxStream<'static, Result<watcher::Event<K>, watcher::Error>>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
    K::DynamicType: Default,
{
    let foreign = ctx.metrics.watch_foreign.with_label_values(&[resource]);
    let received = ctx.metrics.watch_objects.with_label_values(&[resource]);
    let filter = scope.clone();
    watcher(api, config)
        .default_backoff()
        .filter(move |event| std::future::ready(in_scope(event, &filter, &foreign)))
        .inspect(move |event| {
            if let Ok(event) = event {
                received.inc_by(objects_in(event));
            }
        })
        .boxed()
}

async fn gpujobs(
    api: Api<GpuJob>,
    ctx: Arc<Context>,
    intake: Intake,
    status: Arc<Status>,
    scope: Scope,
) {
    let mut events = watch_events(api, config(&ctx), &ctx, &scope, "gpujobs").modify(trim_gpujob);
    // A relist reaches the store only when complete (InitDone); then every GpuJob it
    // changed is looked at.
    let mut changed: Vec<Key> = Vec::new();
    while let Some(event) = events.next().await {
        if let Ok(event) = &event {
            changed = ctx.view.gpujob_event(event, &scope);
        }
        match event {
            Ok(watcher::Event::Apply(gj)) if never_observed(&gj) => {
                intake.add_prompt(Key::of(&gj));
            }
            Ok(watcher::Event::Apply(gj)) => {
                intake.add(Key::of(&gj));
            }
            Ok(watcher::Event::Delete(gj)) => {
                intake.add(Key::of(&gj));
            }
            Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => {}
            Ok(watcher::Event::InitDone) => {
                // The shards both caches now cover for the first time (when the Job
                // list completed first): every GpuJob of them has its first look there.
                let new = ctx.view.listed(Cached::GpuJobs, &scope);
                let mut changed = std::mem::take(&mut changed);
                // Only those both caches covered before this list: one of a shard not
                // covered yet has its first look when the shard is (the task below may
                // run after that, and would look a second time).
                changed.retain(|k| {
                    ctx.view.covers(&k.namespace)
                        && !new.as_ref().is_some_and(|n| n.contains(&k.namespace))
                });
                // The others the list changed (a relist that could not resume, or a
                // cold gain's list while the Job cache still lists the shard).
                tokio::spawn(from_caches::look_from_caches(
                    ctx.clone(),
                    intake.clone(),
                    ctx.view.sort_observed(changed),
                ));
                if let Some(new) = new {
                    newly_covered(&ctx, &intake, &new);
                }
            }
            Err(e) => {
                status.gpujob_list_failed();
                warn!(
                    "GpuJob watch: {}; retrying with backoff",
                    crate::apierror::describe_watch(&e)
                );
            }
        }
    }
}

/// A GpuJob the operator never recorded a status of (no `observedGeneration`): new work
/// (as `domain::Facts::observed` says of a cached one).
fn never_observed(gj: &GpuJob) -> bool {
    gj.status
        .as_ref()
        .and_then(|s| s.observed_generation)
        .is_none_or(|g| g <= 0)
}

async fn jobs(api: Api<Job>, ctx: Arc<Context>, intake: Intake, scope: Scope) {
    let mut events = watch_events(api, config(&ctx).labels(LABEL_UID), &ctx, &scope, "jobs");
    while let Some(event) = events.next().await {
        match event {
            Ok(event) => {
                let finished = matches!(
                    &event,
                    watcher::Event::Apply(job) if job_state(job) != JobState::Active
                );
                let keys = ctx.view.job_event(&event, &scope);
                // The shards both caches now cover for the first time: every GpuJob of
                // them, those without Jobs too, has its first look from the caches
                // (`newly_covered`), so the list's touches do not queue them as well.
                let new = match event {
                    watcher::Event::InitDone => ctx.view.listed(Cached::Jobs, &scope),
                    _ => None,
                };
                let looked_at_below =
                    |k: &Key| new.as_ref().is_some_and(|n| n.contains(&k.namespace));
                for key in keys.touched {
                    debug!(gpujob = %key, event = event_name(&event), finished, "Job event");
                    if looked_at_below(&key) {
                        continue;
                    }
                    if finished {
                        intake.add_under_way(key);
                    } else {
                        intake.add(key);
                    }
                }
                // Jobs this replica created or deleted may have come and gone between
                // two lists, unseen: their GpuJobs are looked at again.
                for key in keys.relisted {
                    if !looked_at_below(&key) {
                        intake.add(key);
                    }
                }
                if let Some(new) = new {
                    newly_covered(&ctx, &intake, &new);
                }
            }
            Err(e) => warn!(
                "Job watch: {}; retrying with backoff",
                crate::apierror::describe_watch(&e)
            ),
        }
    }
}

/// The pods of the GpuJobs (label `gpujob.dev/uid`, as every attempt's pod has): the pod
/// cache says when a GpuJob's pod waits at the gate, so that its plan reads the pods and
/// lets the gate go, or finds no node, so that its plan reads why; a pod event queues the
/// GpuJob only then, or when a pod ends or goes ([`View::pod_event`]). Not
/// part of what a reconcile waits for (`Coverage`): the gate acts only on a read.
///
/// [`View::pod_event`]: crate::controller::view::View::pod_event
async fn pods(api: Api<Pod>, ctx: Arc<Context>, intake: Intake, scope: Scope) {
    let mut events = watch_events(api, config(&ctx).labels(LABEL_UID), &ctx, &scope, "pods");
    while let Some(event) = events.next().await {
        match event {
            Ok(event) => {
                // Work under way: a pod waiting at the gate is an attempt to let go, one that
                // can no longer run may free the next attempt, and one that finds no node
                // is a reason to say.
                for key in ctx.view.pod_event(&event, &scope) {
                    debug!(gpujob = %key, event = event_name(&event), "pod event");
                    intake.add_under_way(key);
                }
            }
            Err(e) => warn!(
                "pod watch: {}; retrying with backoff",
                crate::apierror::describe_watch(&e)
            ),
        }
    }
}

/// The pods of the GpuJobs on MultiKueue worker cluster `worker`, into its pod cache:
/// as [`pods`], for the attempts MultiKueue dispatched there. Every such pod, whatever
/// the shards held (a worker's API server is not asked to select by shard); a GpuJob of
/// a shard not held is not queued.
async fn worker_pods(worker: WorkerCluster, ctx: Arc<Context>, intake: Intake) {
    let api = api::<Pod>(&worker.client, ctx.settings.namespace.as_deref());
    let config = config(&ctx).labels(LABEL_UID);
    let mut events = watch_events(api, config, &ctx, &Scope::All, "pods");
    while let Some(event) = events.next().await {
        match event {
            Ok(event) => {
                for key in ctx.view.worker_pod_event(&worker.name, &event) {
                    debug!(gpujob = %key, worker = %worker.name, event = event_name(&event), "pod event on a MultiKueue worker");
                    intake.add_under_way(key);
                }
            }
            Err(e) => warn!(
                worker = %worker.name,
                "pod watch on a MultiKueue worker cluster: {}; retrying with backoff",
                crate::apierror::describe_watch(&e)
            ),
        }
    }
}

/// Both caches cover the shards of `new` for the first time: a shard gained cold learns
/// which GpuJobs it has to look at, and every GpuJob of them has its first look
/// (`from_caches::look_from_caches`: planned from the caches, and queued if it needs the
/// API server: one observed before in the first-look lane while it has not had its
/// first look, one never observed in the prompt lane).
fn newly_covered(ctx: &Arc<Context>, intake: &Intake, new: &Scope) {
    let own = intake.own.borrow().clone();
    let at = tokio::time::Instant::now();
    for shard in 0..own.shards() {
        if new.contains_shard(shard) && intake.looks.unknown(shard) {
            let keys = ctx.view.keys_where(|ns| own.shard_of(ns) == shard);
            first_look::report(intake.looks.known(shard, &keys, at), &ctx.metrics);
        }
    }
    tokio::spawn(from_caches::look_from_caches(
        ctx.clone(),
        intake.clone(),
        ctx.view.keys_where(|ns| new.contains(ns)),
    ));
}

/// Keeps an event unless it carries an object from outside `scope` (the API server did
/// not apply the selector): those are counted and dropped.
fn in_scope<K: ResourceExt>(
    event: &Result<watcher::Event<K>, watcher::Error>,
    scope: &Scope,
    foreign: &prometheus::IntCounter,
) -> bool {
    let object = match event {
        Ok(watcher::Event::Apply(o) | watcher::Event::Delete(o) | watcher::Event::InitApply(o)) => {
            o
        }
        _ => return true,
    };
    let inside = scope.contains(object.namespace().as_deref().unwrap_or_default());
    if !inside {
        foreign.inc();
    }
    inside
}

/// Objects an event carries: one for a change, a deletion or a listed object; none for
/// the start and end of a list.
fn objects_in<K>(event: &watcher::Event<K>) -> u64 {
    match event {
        watcher::Event::Apply(_) | watcher::Event::Delete(_) | watcher::Event::InitApply(_) => 1,
        watcher::Event::Init | watcher::Event::InitDone => 0,
    }
}

fn event_name<K: ResourceExt>(event: &watcher::Event<K>) -> String {
    match event {
        watcher::Event::Apply(o) => format!("apply {}", o.name_any()),
        watcher::Event::Delete(o) => format!("delete {}", o.name_any()),
        watcher::Event::Init => "relist".to_owned(),
        watcher::Event::InitApply(o) => format!("relisted {}", o.name_any()),
        watcher::Event::InitDone => "relist done".to_owned(),
    }
}

/// What the cache keeps of a GpuJob: all but its managedFields and the copy of the whole
/// object `kubectl apply` leaves in an annotation (nothing reads either; together they
/// can be most of a GpuJob's size). Status writes are patches of the status alone, so
/// nothing written is computed from what is dropped here.
fn trim_gpujob(gj: &mut GpuJob) {
    gj.managed_fields_mut().clear();
    gj.annotations_mut().remove(LAST_APPLIED);
}

const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_counts_its_objects_not_its_start_and_end() {
        let gj: GpuJob = serde_json::from_value(serde_json::json!({
            "apiVersion": "gpujob.dev/v1", "kind": "GpuJob",
            "metadata": {"name": "a"}, "spec": {"image": "i", "gpus": 1},
        }))
        .unwrap();
        let events = [
            watcher::Event::Init,
            watcher::Event::InitApply(gj.clone()),
            watcher::Event::InitApply(gj.clone()),
            watcher::Event::InitDone,
            watcher::Event::Apply(gj.clone()),
            watcher::Event::Delete(gj),
        ];
        assert_eq!(events.iter().map(objects_in).sum::<u64>(), 4);
    }

    #[test]
    fn the_gpujob_cache_drops_what_nothing_reads() {
        let mut gj: GpuJob = serde_json::from_value(serde_json::json!({
            "apiVersion": "gpujob.dev/v1",
            "kind": "GpuJob",
            "metadata": {
                "name": "a",
                "annotations": {LAST_APPLIED: "{...}", "gpujob.dev/rerun": "1"},
                "managedFields": [{"manager": "kubectl"}],
            },
            "spec": {"image": "i", "gpus": 1},
        }))
        .unwrap();
        trim_gpujob(&mut gj);
        assert!(gj.metadata.managed_fields.is_none_or(|m| m.is_empty()));
        let annotations = gj.metadata.annotations.unwrap();
        assert!(!annotations.contains_key(LAST_APPLIED));
        assert_eq!(annotations["gpujob.dev/rerun"], "1", "the others stay");
    }
}
