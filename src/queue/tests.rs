use std::time::Duration;

use super::fair::UNDER_WAY_PER_NEW;
use super::*;

fn queue() -> Queue<&'static str> {
    Queue::new(Backoff {
        base: Duration::from_millis(5),
        max: Duration::from_secs(1),
        ..Backoff::default()
    })
}

async fn next(q: &Queue<&'static str>) -> Option<&'static str> {
    tokio::time::timeout(Duration::from_millis(1), q.get())
        .await
        .ok()
        .flatten()
}

/// Every key handed out, in order, each done at once, until none is ready.
async fn drain(q: &Queue<&'static str>) -> Vec<&'static str> {
    let mut order = Vec::new();
    while let Some(k) = next(q).await {
        q.done(&k);
        order.push(k);
    }
    order
}

#[tokio::test(start_paused = true)]
async fn a_key_is_in_flight_from_its_get_to_its_done() {
    let q = queue();
    q.add("a");
    assert!(!q.in_flight(&"a"), "queued, not with a worker");
    assert_eq!(next(&q).await, Some("a"));
    assert!(q.in_flight(&"a"), "with a worker");
    q.add("a");
    assert!(q.in_flight(&"a"), "added again while with a worker");
    q.done(&"a");
    assert!(!q.in_flight(&"a"), "done; queued again");
    assert_eq!(next(&q).await, Some("a"));
    assert!(q.in_flight(&"a"));
    q.done(&"a");
    assert!(!q.in_flight(&"a"));
}

#[tokio::test(start_paused = true)]
async fn a_key_is_queued_once() {
    let q = queue();
    q.add("a");
    q.add("a");
    q.add("b");
    assert_eq!(q.len(), 2);
    assert_eq!(next(&q).await, Some("a"));
    assert_eq!(next(&q).await, Some("b"));
    assert_eq!(next(&q).await, None);
}

#[tokio::test(start_paused = true)]
async fn prompt_keys_go_before_the_backlog() {
    let q = queue();
    q.add("resync-1");
    q.add("resync-2");
    q.add_prompt("new-1");
    q.add_prompt("new-2");
    // Already in the prompt lane: it keeps its place (and is not queued twice).
    q.add_prompt("new-1");
    assert_eq!(q.len(), 4);
    let order = drain(&q).await;
    assert_eq!(order, ["new-1", "new-2", "resync-1", "resync-2"]);
}

/// A key waiting in the normal lane (an echo of its own writes) that is then asked for
/// as new work (its pod at the gate) moves ahead of the backlog, once; so does one asked
/// for as a first look. Neither is handed out twice, and the depth counts each once.
#[tokio::test(start_paused = true)]
async fn a_key_in_the_backlog_asked_for_as_new_work_moves_ahead() {
    let q = queue();
    for k in ["backlog-1", "echo", "backlog-2", "gained"] {
        q.add(k);
    }
    q.add_prompt("new");
    q.add_prompt("echo");
    q.add_first_look("gained");
    // Asked for again: it stays where it moved to.
    q.add_prompt("echo");
    q.add("echo");
    assert_eq!(q.len(), 5);
    let mut order = Vec::new();
    while let Some(k) = next(&q).await {
        order.push(k);
        q.done(&k);
        assert!(q.len() <= 5 - order.len(), "{order:?}: {}", q.len());
    }
    assert_eq!(order, ["gained", "new", "echo", "backlog-1", "backlog-2"]);
    // Queued again in the normal lane, and moved again: still once each.
    q.add("echo");
    q.add("backlog-1");
    q.add_prompt("echo");
    assert_eq!(next(&q).await, Some("echo"));
    q.done(&"echo");
    assert_eq!(next(&q).await, Some("backlog-1"));
    q.done(&"backlog-1");
    assert_eq!(next(&q).await, None);
    assert!(q.is_empty());
}

/// In a tenant's turn, work under way (a pod at the gate) goes before work not begun (a
/// new GpuJob), first in, first out within each; the tenants still take turns. A key
/// in flight asked for as both runs again as work under way.
#[tokio::test(start_paused = true)]
async fn work_under_way_goes_before_new_work_in_its_tenants_turn() {
    let q = Queue::new(Backoff::default()).fair_by(|k: &&'static str| &k[..1]);
    for k in ["a-new-1", "a-new-2", "b-new-1"] {
        q.add_prompt(k);
    }
    q.add("a-echo");
    q.add_under_way("a-gate-1");
    q.add_under_way("a-echo");
    q.add_under_way("a-gate-2");
    let order = drain(&q).await;
    assert_eq!(
        order,
        [
            "a-gate-1", "b-new-1", "a-echo", "a-gate-2", "a-new-1", "a-new-2"
        ]
    );
    // Queued as work not begun (its own write's echo came while it was new), then asked
    // for as work under way (its pod at the gate): it moves ahead of its tenant's new work.
    for k in ["a-new-5", "a-echo-2", "a-new-6"] {
        q.add_prompt(k);
    }
    q.add_under_way("a-echo-2");
    q.add_under_way("a-echo-2");
    assert_eq!(q.len(), 3);
    assert_eq!(next(&q).await, Some("a-echo-2"));
    q.done(&"a-echo-2");
    q.add_prompt("a-echo-2");
    assert_eq!(next(&q).await, Some("a-new-5"));
    assert_eq!(next(&q).await, Some("a-new-6"));
    assert_eq!(
        next(&q).await,
        Some("a-echo-2"),
        "queued again behind the stale copy"
    );
    assert_eq!(next(&q).await, None);
    for k in ["a-new-5", "a-new-6", "a-echo-2"] {
        q.done(&k);
    }
    q.add_prompt("a-new-3");
    assert_eq!(next(&q).await, Some("a-new-3"));
    q.add_prompt("a-new-3");
    q.add_under_way("a-new-3");
    q.add_prompt("a-new-3");
    q.add_prompt("a-new-4");
    q.done(&"a-new-3");
    q.add_under_way("a-gate-3");
    assert_eq!(next(&q).await, Some("a-new-3"), "under way, and first in");
    assert_eq!(next(&q).await, Some("a-gate-3"));
    assert_eq!(next(&q).await, Some("a-new-4"));
}

/// A steady stream of work under way does not starve a tenant's new work: one of it
/// goes after every `UNDER_WAY_PER_NEW` under way.
#[tokio::test(start_paused = true)]
async fn new_work_gets_a_turn_among_a_stream_of_work_under_way() {
    let q: Queue<String> = Queue::new(Backoff::default());
    q.add_prompt("new-1".to_owned());
    q.add_prompt("new-2".to_owned());
    let mut order = Vec::new();
    for i in 0..10 {
        q.add_under_way(format!("gate-{i}"));
        q.add_under_way(format!("gate-{i}b"));
        let k = tokio::time::timeout(Duration::from_millis(1), q.get())
            .await
            .ok()
            .flatten();
        if let Some(k) = k {
            q.done(&k);
            order.push(k);
        }
    }
    let at = |k: &str| order.iter().position(|o| o == k);
    let n = usize::try_from(UNDER_WAY_PER_NEW).unwrap_or(usize::MAX);
    assert_eq!(at("new-1"), Some(n), "{order:?}");
    assert_eq!(at("new-2"), Some(2 * n + 1), "{order:?}");
}

#[tokio::test(start_paused = true)]
async fn a_gained_shards_first_look_goes_before_the_backlog_and_takes_turns_with_new_work() {
    let q = queue();
    for k in ["echo-1", "echo-2"] {
        q.add(k);
    }
    for k in ["new-1", "new-2", "new-3"] {
        q.add_prompt(k);
    }
    for k in ["gained-1", "gained-2"] {
        q.add_first_look(k);
    }
    // One in the backlog asked for as a first look moves to that lane.
    q.add_first_look("echo-2");
    assert_eq!(q.len(), 7);
    let mut order = Vec::new();
    while let Some(k) = next(&q).await {
        order.push(k);
    }
    assert_eq!(
        order,
        vec![
            "gained-1", "new-1", "gained-2", "new-2", "echo-2", "new-3", "echo-1"
        ],
        "first looks and new work take turns (every look here takes no time: a tie each \
         time); the backlog waits for both"
    );
    // No new work: a first look still goes before the backlog.
    q.add("echo-3");
    q.add_first_look("gained-3");
    assert_eq!(next(&q).await, Some("gained-3"));
    assert_eq!(next(&q).await, Some("echo-3"));
}

/// The two lanes share the workers' time, not turns: first looks with nothing to write
/// (done at once) all go while new work waits on its budget.
#[tokio::test(start_paused = true)]
async fn first_looks_that_take_no_time_go_while_new_work_waits_on_its_budget() {
    let q = queue();
    for k in ["new-1", "new-2"] {
        q.add_prompt(k);
    }
    for k in ["gained-1", "gained-2", "gained-3", "gained-4"] {
        q.add_first_look(k);
    }
    // Even at first: the lanes alternate.
    assert_eq!(next(&q).await, Some("gained-1"));
    q.done(&"gained-1");
    // One worker takes new work, whose writes wait 100 ms on the API budget.
    assert_eq!(next(&q).await, Some("new-1"));
    tokio::time::advance(Duration::from_millis(100)).await;
    // Meanwhile another looks at the gained GpuJobs, each done at once: none waits
    // behind new-2 (in turns, two would have).
    let mut order = Vec::new();
    for _ in 0..3 {
        let k = next(&q).await.expect("a key");
        order.push(k);
        q.done(&k);
    }
    assert_eq!(order, ["gained-2", "gained-3", "gained-4"]);
    assert_eq!(next(&q).await, Some("new-2"));
}

/// A lane whose keys hold workers long does not keep the other waiting: a first look
/// that takes a second lets new work go meanwhile.
#[tokio::test(start_paused = true)]
async fn a_lane_whose_keys_hold_workers_long_lets_the_other_go() {
    let q = queue();
    for k in ["new-1", "new-2", "new-3"] {
        q.add_prompt(k);
    }
    for k in ["gained-1", "gained-2"] {
        q.add_first_look(k);
    }
    assert_eq!(next(&q).await, Some("gained-1"));
    tokio::time::advance(Duration::from_secs(1)).await;
    let mut order = Vec::new();
    for _ in 0..3 {
        let k = next(&q).await.expect("a key");
        order.push(k);
        q.done(&k);
    }
    assert_eq!(
        order,
        ["new-1", "new-2", "new-3"],
        "gained-1 has held a worker for a second: new work's turns"
    );
    q.done(&"gained-1");
    assert_eq!(next(&q).await, Some("gained-2"));
}

/// Time served while the other lane had nothing is no credit: when both have keys
/// again they start even.
#[tokio::test(start_paused = true)]
async fn time_served_while_the_other_lane_was_empty_is_no_credit() {
    let q = queue();
    q.add_prompt("new-1");
    assert_eq!(next(&q).await, Some("new-1"));
    tokio::time::advance(Duration::from_secs(10)).await;
    q.done(&"new-1");
    for k in ["gained-1", "gained-2"] {
        q.add_first_look(k);
    }
    for k in ["new-2", "new-3"] {
        q.add_prompt(k);
    }
    let order = drain(&q).await;
    assert_eq!(order, ["gained-1", "new-2", "gained-2", "new-3"]);
}

/// A key added to the prompt or the first-look lane while it is processed runs again in
/// that lane, not behind the backlog.
#[tokio::test(start_paused = true)]
async fn a_key_added_to_a_lane_while_processed_runs_again_in_that_lane() {
    let q = queue();
    q.add("gained");
    assert_eq!(next(&q).await, Some("gained"));
    for k in ["echo-1", "echo-2"] {
        q.add(k);
    }
    // Its shard's first look asks for it while a worker still has it: an add to the
    // normal lane first does not change that.
    q.add("gained");
    q.add_first_look("gained");
    q.done(&"gained");
    assert_eq!(next(&q).await, Some("gained"), "ahead of the backlog");
    q.done(&"gained");
    // Only normal adds: back of the normal lane, as before.
    q.add("gained");
    assert_eq!(next(&q).await, Some("echo-1"));
    q.add("echo-1");
    q.done(&"echo-1");
    assert_eq!(next(&q).await, Some("echo-2"));
    assert_eq!(next(&q).await, Some("gained"));
    assert_eq!(next(&q).await, Some("echo-1"));
}

/// A first look asked for while the key is processed for that look does not bring it
/// back ahead of the backlog once the look is over; new work asked for meanwhile still
/// does, whichever came first.
#[tokio::test(start_paused = true)]
async fn a_key_whose_first_look_is_over_runs_again_in_the_normal_lane() {
    let q = queue();
    q.add_first_look("gained");
    assert_eq!(next(&q).await, Some("gained"));
    q.add("echo-1");
    // An echo of the look's own write, queued for the shard's first look.
    q.add_first_look("gained");
    q.first_look_over(&"gained");
    q.done(&"gained");
    assert_eq!(next(&q).await, Some("echo-1"), "behind the backlog");
    q.done(&"echo-1");
    assert_eq!(next(&q).await, Some("gained"));
    q.done(&"gained");
    // Its pod at the gate (new work) after the echo: the prompt lane.
    q.add_first_look("new-work");
    assert_eq!(next(&q).await, Some("new-work"));
    q.add("echo-2");
    q.add_first_look("new-work");
    q.add_prompt("new-work");
    q.first_look_over(&"new-work");
    q.done(&"new-work");
    assert_eq!(next(&q).await, Some("new-work"), "ahead of the backlog");
    q.done(&"new-work");
    // A look that did not end (its term ended): the first look runs again, ahead.
    q.add_first_look("cancelled");
    assert_eq!(next(&q).await, Some("cancelled"));
    q.add_first_look("cancelled");
    q.done(&"cancelled");
    assert_eq!(next(&q).await, Some("cancelled"), "ahead of the backlog");
    q.done(&"cancelled");
    assert_eq!(next(&q).await, Some("echo-2"));
}

#[tokio::test(start_paused = true)]
async fn the_prompt_lane_takes_turns_between_tenants() {
    let q = queue().fair_by(|k: &&'static str| k.split('/').next().unwrap_or_default());
    for k in ["a/1", "a/2", "a/3", "b/1", "a/4", "c/1", "b/2"] {
        q.add_prompt(k);
    }
    q.add("a/resync");
    assert_eq!(q.len(), 8);
    let order = drain(&q).await;
    // One of each tenant in turn (first come, first served within one), then the
    // normal lane: a burst in one namespace does not hold back another's new work.
    assert_eq!(
        order,
        ["a/1", "b/1", "c/1", "a/2", "b/2", "a/3", "a/4", "a/resync"]
    );
}

#[tokio::test(start_paused = true)]
async fn a_key_added_while_processing_runs_once_more_after_done() {
    let q = queue();
    q.add("a");
    let k = next(&q).await.unwrap();
    q.add("a");
    q.add("a");
    assert_eq!(next(&q).await, None, "never to two workers at once");
    q.done(&k);
    assert_eq!(next(&q).await, Some("a"));
    q.done(&"a");
    assert_eq!(next(&q).await, None, "and only once more");
}

#[tokio::test(start_paused = true)]
async fn delayed_adds_wait_and_the_earliest_wins() {
    let q = queue();
    q.add_after("a", Duration::from_secs(10));
    q.add_after("a", Duration::from_secs(3));
    q.add_after("a", Duration::from_secs(20));
    assert_eq!(next(&q).await, None);
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(next(&q).await, None);
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(next(&q).await, Some("a"));
    q.done(&"a");
    tokio::time::advance(Duration::from_secs(30)).await;
    assert_eq!(
        next(&q).await,
        None,
        "the later delays were merged into the earliest"
    );
}

#[tokio::test(start_paused = true)]
async fn a_blocked_get_wakes_for_a_delayed_key() {
    let q = queue();
    let worker = tokio::spawn({
        let q = q.clone();
        async move { q.get().await }
    });
    tokio::task::yield_now().await;
    q.add_after("a", Duration::from_secs(5));
    let started = Instant::now();
    assert_eq!(worker.await.unwrap(), Some("a"));
    assert_eq!(started.elapsed(), Duration::from_secs(5));
}

#[tokio::test(start_paused = true)]
async fn failures_back_off_exponentially_until_forgotten() {
    let q = queue();
    let delays: Vec<_> = (0..4).map(|_| q.add_rate_limited("a")).collect();
    assert_eq!(delays, [5, 10, 20, 40].map(Duration::from_millis).to_vec());
    assert_eq!(q.failures(&"a"), 4);
    q.forget(&"a");
    assert_eq!(q.failures(&"a"), 0);
    assert_eq!(q.add_rate_limited("a"), Duration::from_millis(5));
}

/// The keys of shards lost leave every lane, the delayed adds and the failure counts;
/// one with a worker finishes and is not queued again, and the others come out as
/// before.
#[tokio::test(start_paused = true)]
async fn the_keys_named_leave_the_queue() {
    let q = queue();
    for k in ["lost-backoff", "kept-backoff"] {
        q.add_rate_limited(k);
    }
    q.add("lost-in-flight");
    assert_eq!(next(&q).await, Some("lost-in-flight"));
    q.add("lost-in-flight");
    q.add("lost-normal");
    q.add("kept-normal");
    q.add("lost-moved");
    q.add_under_way("lost-moved");
    q.add_prompt("lost-new");
    q.add_under_way("kept-gate");
    q.add_first_look("lost-look");
    q.drop_where(|k| k.starts_with("lost"));
    assert_eq!(q.len(), 2);
    assert_eq!(q.failures(&"lost-backoff"), 0);
    assert_eq!(q.failures(&"kept-backoff"), 1);
    q.done(&"lost-in-flight");
    tokio::time::advance(Duration::from_secs(2)).await;
    let order = drain(&q).await;
    assert_eq!(order, ["kept-gate", "kept-normal", "kept-backoff"]);
}

#[test]
fn backoff_is_capped() {
    let b = Backoff::default();
    assert_eq!(b.delay(1), Duration::from_millis(5));
    assert_eq!(
        b.delay(18),
        Duration::from_secs(655) + Duration::from_millis(360)
    );
    assert_eq!(b.delay(19), Duration::from_secs(1000));
    assert_eq!(b.delay(u32::MAX), Duration::from_secs(1000));
}

#[tokio::test(start_paused = true)]
async fn shutdown_releases_every_waiting_worker() {
    let q = queue();
    let workers: Vec<_> = (0..3)
        .map(|_| {
            let q = q.clone();
            tokio::spawn(async move { q.get().await })
        })
        .collect();
    tokio::task::yield_now().await;
    q.add_after("late", Duration::from_secs(1));
    q.shut_down();
    for w in workers {
        assert_eq!(w.await.unwrap(), None);
    }
    q.add("x");
    assert_eq!(next(&q).await, None, "nothing is queued after shutdown");
}

#[tokio::test(start_paused = true)]
async fn several_workers_share_a_burst() {
    let q: Queue<u32> = Queue::new(Backoff::default());
    for k in 0..100 {
        q.add(k);
    }
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let q = q.clone();
            tokio::spawn(async move {
                let mut seen = Vec::new();
                while let Ok(Some(k)) = tokio::time::timeout(Duration::from_secs(1), q.get()).await
                {
                    seen.push(k);
                    tokio::task::yield_now().await;
                    q.done(&k);
                }
                seen
            })
        })
        .collect();
    let mut all = Vec::new();
    for w in workers {
        all.extend(w.await.unwrap());
    }
    all.sort_unstable();
    assert_eq!(all, (0..100).collect::<Vec<_>>(), "each key exactly once");
}

#[tokio::test(start_paused = true)]
async fn retries_share_an_overall_bucket() {
    // Per-key backoff alone would retry 200 distinct keys after 5 ms; the bucket
    // (10 qps, burst 100) spreads the last 100 over the next 10 seconds.
    let q: Queue<u32> = Queue::new(Backoff::default());
    let delays: Vec<Duration> = (0..200).map(|k| q.add_rate_limited(k)).collect();
    assert!(delays[..100].iter().all(|d| *d == Duration::from_millis(5)));
    assert_eq!(delays[100], Duration::from_millis(100));
    assert_eq!(delays[199], Duration::from_secs(10));
}

#[tokio::test(start_paused = true)]
async fn metrics_follow_the_queue() {
    let m = crate::metrics::Metrics::new();
    let q: Queue<&'static str> = Queue::with_metrics(Backoff::default(), Some(m.queue.clone()));
    q.add("a");
    q.add("a");
    q.add("b");
    assert_eq!(
        m.queue.adds.get(),
        2,
        "as client-go counts: a duplicate of a waiting key is no add"
    );
    assert_eq!(m.queue.depth.get(), 2);
    tokio::time::advance(Duration::from_secs(2)).await;
    let k = next(&q).await.unwrap();
    assert_eq!(m.queue.depth.get(), 1);
    assert_eq!(m.queue.queue_duration.get_sample_count(), 1);
    assert!(m.queue.queue_duration.get_sample_sum() >= 2.0);
    tokio::time::advance(Duration::from_secs(3)).await;
    q.update_gauges();
    assert_eq!(m.queue.longest_running.get(), 3.0);
    assert_eq!(m.queue.unfinished_work.get(), 3.0);
    q.add(k);
    assert_eq!(
        m.queue.adds.get(),
        3,
        "an add while processing counts: it runs again"
    );
    q.done(&k);
    assert_eq!(m.queue.work_duration.get_sample_count(), 1);
    q.add_rate_limited("c");
    assert_eq!(m.queue.retries.get(), 1);
    assert_eq!(
        m.queue.adds.get(),
        3,
        "a delayed add counts when it becomes ready"
    );
    tokio::time::advance(Duration::from_millis(5)).await;
    q.update_gauges();
    let _ = next(&q).await;
    assert_eq!(m.queue.adds.get(), 4);
}

mod properties {
    use std::collections::{BTreeMap, BTreeSet};
    use std::time::Duration;

    use futures::FutureExt;
    use proptest::prelude::*;

    use super::super::{Backoff, Queue};

    #[derive(Debug, Clone)]
    enum Op {
        Add(u8),
        AddPrompt(u8),
        AddUnderWay(u8),
        AddFirstLook(u8),
        AddAfter(u8, u16),
        Get,
        Done(u8),
        Fail(u8),
        Forget(u8),
        Drop(u8),
        Advance(u16),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (0u8..6).prop_map(Op::Add),
            2 => (0u8..6).prop_map(Op::AddPrompt),
            1 => (0u8..6).prop_map(Op::AddUnderWay),
            1 => (0u8..6).prop_map(Op::AddFirstLook),
            1 => ((0u8..6), (1u16..2000)).prop_map(|(k, ms)| Op::AddAfter(k, ms)),
            4 => Just(Op::Get),
            2 => (0u8..6).prop_map(Op::Done),
            1 => (0u8..6).prop_map(Op::Fail),
            1 => (0u8..6).prop_map(Op::Forget),
            1 => (0u8..6).prop_map(Op::Drop),
            1 => (1u16..3000).prop_map(Op::Advance),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Under any sequence: a key is never handed to two workers at once, never
        /// queued twice, and no add is lost (every key added after it was last handed
        /// out is handed out again once time has passed).
        #[test]
        fn invariants_hold_under_random_operations(ops in proptest::collection::vec(op(), 1..120)) {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .unwrap();
            rt.block_on(async move {
                let q: Queue<u8> = Queue::new(Backoff {
                    base: Duration::from_millis(5),
                    max: Duration::from_secs(1),
                    qps: 1000.0,
                    burst: 1000,
                })
                .fair_by(|k| if k % 2 == 0 { "even" } else { "odd" });
                let mut processing: BTreeSet<u8> = BTreeSet::new();
                // Keys that must be handed out (again), with the earliest time they may be.
                let mut owed: BTreeMap<u8, tokio::time::Instant> = BTreeMap::new();
                for op in ops {
                    let now = tokio::time::Instant::now();
                    match op {
                        Op::Add(k) => { q.add(k); owed.entry(k).or_insert(now); }
                        Op::AddPrompt(k) => { q.add_prompt(k); owed.entry(k).or_insert(now); }
                        Op::AddUnderWay(k) => { q.add_under_way(k); owed.entry(k).or_insert(now); }
                        Op::AddFirstLook(k) => { q.add_first_look(k); owed.entry(k).or_insert(now); }
                        Op::AddAfter(k, ms) => {
                            q.add_after(k, Duration::from_millis(u64::from(ms)));
                            owed.entry(k).or_insert(now + Duration::from_millis(u64::from(ms)));
                        }
                        Op::Get => {
                            if let Some(Some(k)) = q.get().now_or_never() {
                                prop_assert!(processing.insert(k), "key {k} handed out twice at once");
                                owed.remove(&k);
                            }
                        }
                        Op::Done(k) => {
                            if processing.remove(&k) { q.done(&k); }
                        }
                        Op::Fail(k) => {
                            if processing.remove(&k) {
                                let d = q.add_rate_limited(k);
                                q.done(&k);
                                owed.entry(k).or_insert(now + d);
                            }
                        }
                        Op::Forget(k) => q.forget(&k),
                        // Its shard lost: owed no more.
                        Op::Drop(k) => { q.drop_where(|d| *d == k); owed.remove(&k); }
                        Op::Advance(ms) => tokio::time::advance(Duration::from_millis(u64::from(ms))).await,
                    }
                    // Never more ready keys than distinct keys.
                    prop_assert!(q.len() <= 6);
                }
                // Finish what is in hand, let every delay pass, then drain.
                for k in std::mem::take(&mut processing) {
                    q.done(&k);
                }
                tokio::time::advance(Duration::from_secs(10)).await;
                let mut delivered = BTreeSet::new();
                while let Some(Some(k)) = q.get().now_or_never() {
                    prop_assert!(delivered.insert(k), "key {k} queued twice");
                    q.done(&k);
                }
                prop_assert_eq!(q.len(), 0, "drained, yet counted as queued");
                let owed: BTreeSet<u8> = owed.keys().copied().collect();
                prop_assert!(owed.is_subset(&delivered), "lost adds: owed {owed:?}, delivered {delivered:?}");
                Ok(())
            })?;
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_resync_does_not_cut_a_backoff_short() {
    let q = queue();
    q.add_rate_limited("a");
    q.add_unless_backing_off("a");
    q.add_unless_backing_off("b");
    assert_eq!(next(&q).await, Some("b"), "an idle key is queued");
    assert_eq!(
        next(&q).await,
        None,
        "the backing-off key waits for its retry"
    );
    tokio::time::advance(Duration::from_millis(5)).await;
    assert_eq!(next(&q).await, Some("a"));
}

#[tokio::test(start_paused = true)]
async fn a_resync_queues_a_failed_key_whose_retry_is_not_scheduled() {
    // The retry ran and its reconcile was cancelled (ownership lost): the key keeps its
    // failure count, but nothing will bring it back. The resync must.
    let q = queue();
    q.add_rate_limited("a");
    tokio::time::advance(Duration::from_millis(5)).await;
    let k = next(&q).await.unwrap();
    q.done(&k);
    assert_eq!(q.failures(&"a"), 1);
    q.add_unless_backing_off("a");
    assert_eq!(next(&q).await, Some("a"));
}
