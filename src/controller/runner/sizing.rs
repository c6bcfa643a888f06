//! How many workers reconcile at once. Each worker waits for the API server's answer
//! before its next request, so a replica sends at most (workers) ÷ (answer time)
//! requests a second: with too few, the budget (`--api-qps`) goes unspent while keys
//! wait, and a busy API server answers slowly exactly when there is most to do. Unless
//! `--workers` fixes the number, it follows the answer time seen over the last
//! [`SIZE_EVERY`] (Little's law: requests in flight = rate × answer time), twice over for
//! the time a worker spends between requests, within a floor (`--api-qps` ÷ 16, at
//! least 4) and a ceiling (`--api-qps` ÷ 2, at most 256).
//!
//! More workers than the budget needs only wait at the client's rate limiter: the
//! budget, not the workers, bounds what the API server gets.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{Semaphore, SemaphorePermit};

use crate::controller::Workers;
use crate::metrics::Metrics;

/// How often the workers are sized again, over the answers of that span.
pub const SIZE_EVERY: Duration = Duration::from_secs(2);

/// Workers that spend `qps` when each request is answered in `answer`: twice
/// `qps × answer`, rounded up, within `floor..=ceiling`.
pub fn needed(qps: f64, answer: Duration, floor: usize, ceiling: usize) -> usize {
    let n = (qps * answer.as_secs_f64() * 2.0).ceil();
    // Finite and at most `ceiling` after the clamp, so the cast is exact.
    (n.clamp(floor as f64, ceiling.max(floor) as f64)) as usize
}

/// What the workers share: a permit per worker allowed, taken before each key and
/// given back after it, and how many permits are owed (the pool shrank while they were
/// held): a permit given back while some are owed is dropped instead, so a shrink takes
/// effect as workers finish their next keys, whoever waits for a permit meanwhile (an
/// idle worker holds its permit while it waits for a key).
#[derive(Debug)]
pub struct Permits {
    gate: Semaphore,
    owed: AtomicUsize,
}

/// A worker's permit, given back (or paid against what is owed) when dropped.
#[derive(Debug)]
pub struct Held<'a> {
    permits: &'a Permits,
    permit: Option<SemaphorePermit<'a>>,
}

impl Permits {
    /// A permit, once one is free; `None` once the gate is closed.
    pub async fn acquire(&self) -> Option<Held<'_>> {
        let permit = self.gate.acquire().await.ok()?;
        Some(Held {
            permits: self,
            permit: Some(permit),
        })
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        let Some(permit) = self.permit.take() else {
            return;
        };
        let owed = self
            .permits
            .owed
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if owed {
            permit.forget();
        }
    }
}

/// The workers allowed, and the permits that allow them.
#[derive(Debug)]
pub struct Pool {
    permits: Arc<Permits>,
    size: usize,
}

impl Pool {
    pub fn new(workers: usize) -> Pool {
        Pool {
            permits: Arc::new(Permits {
                gate: Semaphore::new(workers),
                owed: AtomicUsize::new(0),
            }),
            size: workers,
        }
    }

    pub fn permits(&self) -> Arc<Permits> {
        self.permits.clone()
    }

    /// Workers allowed now (after a shrink, more may still hold a permit until they
    /// finish their key).
    pub fn size(&self) -> usize {
        self.size
    }

    /// Allows `target` workers: a growth cancels what is owed, then adds permits; a
    /// shrink takes back the free permits and owes the rest.
    pub fn resize(&mut self, target: usize) {
        let p = &self.permits;
        if target > self.size {
            let grow = target - self.size;
            let mut cancelled = 0;
            let _ = p
                .owed
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                    cancelled = n.min(grow);
                    Some(n - cancelled)
                });
            p.gate.add_permits(grow - cancelled);
        } else if target < self.size {
            let shrink = self.size - target;
            let freed = p.gate.forget_permits(shrink);
            p.owed.fetch_add(shrink - freed, Ordering::SeqCst);
        }
        self.size = target;
    }
}

/// The answer times seen so far, summed over every request this replica sent (all its
/// clients: one API server answers them all).
fn answers(metrics: &Metrics) -> (f64, u64) {
    use prometheus::core::Collector;
    let mut sum = 0.0;
    let mut count = 0;
    for family in metrics.rest_latency.collect() {
        for m in family.get_metric() {
            let h = m.get_histogram();
            sum += h.get_sample_sum();
            count += h.get_sample_count();
        }
    }
    (sum, count)
}

/// Says `pool`'s size (`gpujob_workers`), then sizes it every [`SIZE_EVERY`] by the mean
/// answer time of that span (a span without answers: back to the floor), when the
/// workers follow the budget.
pub async fn follow(metrics: Metrics, workers: Workers, mut pool: Pool) {
    let publish = |pool: &Pool| {
        metrics
            .workers
            .set(i64::try_from(pool.size()).unwrap_or(i64::MAX));
    };
    publish(&pool);
    let Workers::ByBudget {
        qps,
        floor,
        ceiling,
    } = workers
    else {
        return;
    };
    let mut last = answers(&metrics);
    let mut tick = tokio::time::interval(SIZE_EVERY);
    tick.tick().await;
    loop {
        tick.tick().await;
        let now = answers(&metrics);
        let (seconds, count) = (now.0 - last.0, now.1.saturating_sub(last.1));
        last = now;
        if count > 0 {
            let answer = Duration::from_secs_f64((seconds / count as f64).max(0.0));
            pool.resize(needed(qps, answer, floor, ceiling));
        } else {
            // Nothing asked: back to the floor, free permits first.
            pool.resize(floor);
        }
        publish(&pool);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_follow_the_answer_time_within_floor_and_ceiling() {
        let ms = Duration::from_millis;
        // 50 qps: the floor of 4 spends it while answers take up to 40 ms.
        assert_eq!(needed(50.0, ms(10), 4, 25), 4);
        assert_eq!(needed(50.0, ms(40), 4, 25), 4);
        assert_eq!(needed(50.0, ms(100), 4, 25), 10);
        assert_eq!(needed(50.0, ms(1000), 4, 25), 25, "never above the ceiling");
        assert_eq!(
            needed(2000.0, ms(20), 125, 256),
            125,
            "never below the floor"
        );
        assert_eq!(needed(2000.0, ms(50), 125, 256), 200);
        assert_eq!(needed(50.0, Duration::ZERO, 4, 25), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn the_pool_follows_the_answer_time_of_each_span_unless_fixed() {
        let metrics = Metrics::new();
        let pool = Pool::new(4);
        let permits = pool.permits();
        let by_budget = Workers::ByBudget {
            qps: 50.0,
            floor: 4,
            ceiling: 25,
        };
        let task = tokio::spawn(follow(metrics.clone(), by_budget, pool));
        tokio::task::yield_now().await;
        let answered = |seconds: f64, n: usize| {
            for _ in 0..n {
                metrics
                    .rest_latency
                    .with_label_values(&["GET"])
                    .observe(seconds);
            }
        };
        answered(0.2, 10);
        tokio::time::sleep(SIZE_EVERY + Duration::from_millis(10)).await;
        assert_eq!(metrics.workers.get(), 20, "50 qps × 200 ms × 2");
        assert_eq!(permits.gate.available_permits(), 20);
        answered(0.01, 10);
        tokio::time::sleep(SIZE_EVERY).await;
        assert_eq!(metrics.workers.get(), 4, "fast answers: the floor");
        assert_eq!(permits.gate.available_permits(), 4);
        task.abort();

        let fixed = Pool::new(3);
        let permits = fixed.permits();
        tokio::spawn(follow(metrics.clone(), Workers::Fixed(3), fixed))
            .await
            .expect("--workers: returns at once");
        assert_eq!(permits.gate.available_permits(), 3, "--workers stays");
        assert_eq!(metrics.workers.get(), 3, "and is said");
    }

    #[tokio::test]
    async fn a_pool_grows_at_once_and_shrinks_as_permits_come_back() {
        let mut pool = Pool::new(4);
        let permits = pool.permits();
        let free = || permits.gate.available_permits();
        pool.resize(10);
        assert_eq!((pool.size(), free()), (10, 10));
        let mut held = Vec::new();
        for _ in 0..8 {
            held.push(permits.acquire().await.expect("open"));
        }
        // A worker waits for a permit meanwhile: it must not get one given back while
        // the pool is over its size.
        let waiting = {
            let permits = permits.clone();
            tokio::spawn(async move { permits.acquire().await.map(drop).is_some() })
        };
        pool.resize(4);
        assert_eq!(pool.size(), 4);
        assert_eq!(free(), 0, "the 2 free permits were taken back, 4 are owed");
        held.truncate(4);
        tokio::task::yield_now().await;
        assert!(
            !waiting.is_finished(),
            "4 given back, all paid against what was owed"
        );
        held.truncate(3);
        assert!(waiting.await.expect("joins"), "then one is free again");
        drop(held);
        assert_eq!(free(), 4);
        // Grown while some are owed: those are cancelled first.
        let held = permits.acquire().await.expect("open");
        pool.resize(0);
        assert_eq!(free(), 0, "3 taken back, 1 owed");
        pool.resize(5);
        assert_eq!(free(), 4, "the one owed cancelled, 4 added");
        drop(held);
        assert_eq!(free(), 5);
    }
}
