//! What an operator run in the test process has done, read from its own metrics, and
//! waits on it: a check that the operator did nothing proves something only once it had
//! its chance (it looked, the watches delivered the change, the queue went quiet), and
//! a count of Events only once they left the queue.

use std::time::Duration;

use devcluster::wait;
use gpujob_operator::metrics::Metrics;

use super::{Operator, WAIT};

/// How many reconciles `op` has ended, whatever their result (a first look from the
/// caches counts too): the sign that it looked, for a test that checks it did nothing.
pub fn looks(op: &Operator) -> u64 {
    gpujob_operator::metrics::RESULTS
        .iter()
        .map(|r| {
            op.status
                .metrics
                .reconcile_total
                .with_label_values(&[r])
                .get()
        })
        .sum()
}

/// How many `resource` objects (`gpujobs`, `jobs`, `pods`) `op`'s watches received.
pub fn watched(op: &Operator, resource: &str) -> u64 {
    op.status
        .metrics
        .watch_objects
        .with_label_values(&[resource])
        .get()
}

/// Waits until `op`'s watches have received at least `at_least` `resource` objects
/// (`watched`), then until its work queue is quiet: nothing queued and nothing in
/// flight, at two looks 100 ms apart. A watch event updates the cache before it queues
/// its key, and a key it finds in flight runs again; so once quiet, a look that read
/// what that event brought has ended. For a check that the look did nothing.
pub async fn quiet_after(op: &Operator, resource: &str, at_least: u64) {
    wait::until(
        &format!("{at_least} {resource} received by the watches"),
        WAIT,
        Duration::from_millis(20),
        || std::future::ready((watched(op, resource) >= at_least).then_some(())),
    )
    .await
    .unwrap();
    let quiet = || {
        // A render runs the scrape hooks, which set the queue's gauges.
        let _ = op.status.render_metrics();
        let q = &op.status.metrics.queue;
        q.depth.get() == 0 && q.unfinished_work.get() == 0.0
    };
    wait::until(
        "the work queue to be quiet",
        WAIT,
        Duration::from_millis(100),
        || {
            let was = quiet();
            async move {
                tokio::time::sleep(Duration::from_millis(100)).await;
                (was && quiet()).then_some(())
            }
        },
    )
    .await
    .unwrap();
}

/// Waits until every shard `op` holds has reported its first look whole
/// (`gpujob_shard_first_look_seconds`): each GpuJob its shards had when gained was
/// looked at. `shards`: how many it holds (1 unsharded).
pub async fn first_looks_done(op: &Operator, shards: u64) {
    wait::until(
        &format!("{shards} shards' first looks"),
        WAIT,
        Duration::from_millis(50),
        || {
            let text = op.status.render_metrics();
            let done = devcluster::metrics::Metrics::parse(&text)
                .map(|m| m.sum("gpujob_shard_first_look_seconds_count", &[]))
                .unwrap_or(0.0);
            std::future::ready((done >= shards as f64).then_some(()))
        },
    )
    .await
    .unwrap();
}

/// Waits until `op` has ended `n` more reconciles than `before` (`looks`).
pub async fn looked(op: &Operator, before: u64, n: u64) {
    wait::until(
        &format!("{n} more reconciles"),
        WAIT,
        Duration::from_millis(20),
        || std::future::ready((looks(op) >= before + n).then_some(())),
    )
    .await
    .unwrap();
}

/// Waits until `n` Events have left an operator's Event queue (written, counted into a
/// series, failed or dropped) or were counted into an identical one that has: each
/// published Event counts once under one of these results. Events are written in the
/// background, after the status that caused them, so a test that counts them waits here
/// for the positive signal rather than for a duration.
pub async fn events_done(metrics: &Metrics, n: u64) {
    wait::until(
        &format!("{n} Events to leave the Event queue"),
        WAIT,
        Duration::from_millis(20),
        || {
            let done: u64 = gpujob_operator::metrics::EVENT_RESULTS
                .iter()
                .map(|r| metrics.events.with_label_values(&[r]).get())
                .sum();
            std::future::ready((done >= n).then_some(()))
        },
    )
    .await
    .unwrap();
}
