//! The two watches: GpuJobs and the Jobs they control, each event fed to the view
//! (`view/`). Each event queues the GpuJob it concerns; a relist queues every GpuJob
//! that was or is there, since anything may have changed while nobody watched (for
//! Jobs, also every GpuJob whose Jobs the view's write memory still speaks of).
//! New work goes to the queue's prompt lane: a GpuJob without a status (never looked at),
//! and a Job that has finished (its GpuJob's next step is due).

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use tokio::task::JoinHandle;
use tracing::{debug, warn};

use super::{Context, Intake, Key};
use crate::api::{GpuJob, LABEL_UID};
use crate::controller::plan::{JobState, job_state};
use crate::health::Status;

fn api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// Starts both watches; they run until aborted. `status` learns of GpuJob lists that
/// fail before the caches synced (see `Status::readiness`).
pub(super) fn spawn(
    client: &Client,
    ctx: &Arc<Context>,
    intake: &Intake,
    status: &Arc<Status>,
) -> [JoinHandle<()>; 2] {
    let ns = ctx.settings.namespace.as_deref();
    [
        tokio::spawn(gpujobs(
            api::<GpuJob>(client, ns),
            ctx.clone(),
            intake.clone(),
            status.clone(),
        )),
        tokio::spawn(jobs(api::<Job>(client, ns), ctx.clone(), intake.clone())),
    ]
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

async fn gpujobs(api: Api<GpuJob>, ctx: Arc<Context>, intake: Intake, status: Arc<Status>) {
    let stream = watcher(api, config(&ctx))
        .default_backoff()
        .modify(trim_gpujob);
    let mut events = stream.boxed();
    // A relist reaches the store only when complete (InitDone); then every GpuJob it had
    // before or has now is looked at.
    let mut before: Vec<Key> = Vec::new();
    let received = ctx.metrics.watch_objects.with_label_values(&["gpujobs"]);
    while let Some(event) = events.next().await {
        if let Ok(event) = &event {
            received.inc_by(objects_in(event));
            ctx.view.gpujob_event(event);
        }
        match event {
            Ok(watcher::Event::Apply(gj)) if gj.status.is_none() => {
                intake.add_prompt(Key::of(&gj));
            }
            Ok(watcher::Event::Apply(gj)) => {
                intake.add(Key::of(&gj));
            }
            Ok(watcher::Event::Delete(gj)) => {
                intake.add(Key::of(&gj));
            }
            Ok(watcher::Event::Init) => {
                before = ctx.view.keys();
            }
            Ok(watcher::Event::InitApply(_)) => {}
            Ok(watcher::Event::InitDone) => {
                for key in std::mem::take(&mut before) {
                    intake.add(key);
                }
                for key in ctx.view.keys() {
                    intake.add(key);
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

async fn jobs(api: Api<Job>, ctx: Arc<Context>, intake: Intake) {
    let stream = watcher(api, config(&ctx).labels(LABEL_UID)).default_backoff();
    let mut events = stream.boxed();
    let received = ctx.metrics.watch_objects.with_label_values(&["jobs"]);
    while let Some(event) = events.next().await {
        match event {
            Ok(event) => {
                received.inc_by(objects_in(&event));
                let finished = matches!(
                    &event,
                    watcher::Event::Apply(job) if job_state(job) != JobState::Active
                );
                let keys = ctx.view.job_event(&event);
                for key in keys.touched {
                    debug!(gpujob = %key, event = event_name(&event), finished, "Job event");
                    if finished {
                        intake.add_prompt(key);
                    } else {
                        intake.add(key);
                    }
                }
                // Jobs this replica created or deleted may have come and gone between
                // two lists, unseen: their GpuJobs are looked at again.
                for key in keys.relisted {
                    intake.add(key);
                }
            }
            Err(e) => warn!(
                "Job watch: {}; retrying with backoff",
                crate::apierror::describe_watch(&e)
            ),
        }
    }
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
