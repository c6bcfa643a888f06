use std::time::Duration;

use super::*;

fn queue() -> Queue<&'static str> {
    Queue::new(Backoff {
        base: Duration::from_millis(5),
        max: Duration::from_secs(1),
    })
}

async fn next(q: &Queue<&'static str>) -> Option<&'static str> {
    tokio::time::timeout(Duration::from_millis(1), q.get())
        .await
        .ok()
        .flatten()
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

#[test]
fn backoff_is_capped() {
    let b = Backoff {
        base: Duration::from_millis(5),
        max: Duration::from_secs(1000),
    };
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
