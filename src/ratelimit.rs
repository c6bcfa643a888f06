//! A token bucket: `qps` tokens a second, at most `burst` saved up. Shared by the work
//! queue (retries) and the API client (every request). Time is tokio's, so tests run on
//! a paused clock.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

#[derive(Debug)]
pub struct TokenBucket {
    qps: f64,
    burst: f64,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    tokens: f64,
    last: Instant,
    /// Turns taken, less those given back: the number of the latest turn.
    turns: u64,
}

impl TokenBucket {
    /// A bucket that starts full. `qps` must be positive; `burst` at least 1.
    pub fn new(qps: f64, burst: u32) -> TokenBucket {
        let burst = f64::from(burst.max(1));
        TokenBucket {
            qps: if qps > 0.0 { qps } else { f64::MIN_POSITIVE },
            burst,
            state: Mutex::new(State {
                tokens: burst,
                last: Instant::now(),
                turns: 0,
            }),
        }
    }

    /// Takes one token and returns how long the caller must wait before using it.
    /// Tokens may go negative: callers queue up in order, each waiting its turn.
    pub fn reserve(&self) -> Duration {
        self.take().0
    }

    /// Takes one token: how long to wait, and the number of the turn.
    fn take(&self) -> (Duration, u64) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let refill = now.saturating_duration_since(s.last).as_secs_f64() * self.qps;
        s.tokens = (s.tokens + refill).min(self.burst);
        s.last = now;
        s.tokens -= 1.0;
        s.turns += 1;
        let wait = if s.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-s.tokens / self.qps)
        };
        (wait, s.turns)
    }

    /// Waits for a token; returns the time waited. Dropped before its turn (a reconcile
    /// cancelled as its shard's term ended), it gives the token back when its turn is
    /// the latest taken: every later caller would otherwise wait behind a turn nobody
    /// takes. Behind a later turn it keeps it: given back, its token would go to a new
    /// caller at the same time as that later turn, above the rate.
    pub async fn acquire(&self) -> Duration {
        let (wait, turn) = self.take();
        if !wait.is_zero() {
            let mut unused = Unused(Some((self, turn)));
            tokio::time::sleep(wait).await;
            unused.0 = None;
        }
        wait
    }

    fn give_back(&self, turn: u64) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.turns == turn {
            s.turns -= 1;
            s.tokens = (s.tokens + 1.0).min(self.burst);
        }
    }
}

/// A turn taken and not used yet: given back if dropped so.
struct Unused<'a>(Option<(&'a TokenBucket, u64)>);

impl Drop for Unused<'_> {
    fn drop(&mut self) {
        if let Some((bucket, turn)) = self.0 {
            bucket.give_back(turn);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn burst_then_steady_rate() {
        let b = TokenBucket::new(10.0, 3);
        let waits: Vec<Duration> = (0..5).map(|_| b.reserve()).collect();
        assert_eq!(&waits[..3], &[Duration::ZERO; 3], "the burst is free");
        assert_eq!(waits[3], Duration::from_millis(100));
        assert_eq!(
            waits[4],
            Duration::from_millis(200),
            "callers queue up in order"
        );

        tokio::time::advance(Duration::from_secs(10)).await;
        // Refilled, but never beyond the burst.
        let waits: Vec<Duration> = (0..4).map(|_| b.reserve()).collect();
        assert_eq!(waits.iter().filter(|w| w.is_zero()).count(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_turn_given_up_before_it_comes_goes_to_the_next_caller() {
        let b = TokenBucket::new(1.0, 1);
        assert_eq!(b.acquire().await, Duration::ZERO);
        // Waits a second for its turn; given up after 100 ms.
        let gave_up = tokio::time::timeout(Duration::from_millis(100), b.acquire()).await;
        assert!(gave_up.is_err());
        // The next caller's turn is the one given up, not the one after it.
        assert_eq!(b.reserve(), Duration::from_millis(900));
    }

    /// A turn given up with a later one taken behind it is not given back: a new caller
    /// would get it at the time of that later turn, two at once above the rate. The
    /// latest turn given up is.
    #[tokio::test(start_paused = true)]
    async fn a_turn_given_up_ahead_of_a_later_one_is_kept() {
        use futures::FutureExt;
        let b = TokenBucket::new(1.0, 1);
        assert_eq!(b.acquire().await, Duration::ZERO);
        let mut first = Box::pin(b.acquire());
        let mut second = Box::pin(b.acquire());
        assert!((&mut first).now_or_never().is_none());
        assert!((&mut second).now_or_never().is_none());
        tokio::time::advance(Duration::from_millis(100)).await;
        drop(first);
        assert_eq!(
            b.reserve(),
            Duration::from_millis(2900),
            "after the second's turn"
        );
        // The latest turn given up comes back: the next caller has it.
        let mut third = Box::pin(b.acquire());
        assert!((&mut third).now_or_never().is_none());
        drop(third);
        assert_eq!(b.reserve(), Duration::from_millis(3900));
        drop(second);
    }

    #[tokio::test(start_paused = true)]
    async fn acquire_sleeps_for_its_turn() {
        let b = TokenBucket::new(2.0, 1);
        assert_eq!(b.acquire().await, Duration::ZERO);
        let start = Instant::now();
        assert_eq!(b.acquire().await, Duration::from_millis(500));
        assert_eq!(start.elapsed(), Duration::from_millis(500));
    }
}
