//! The one exponential backoff formula: the work queue's per-key retries and the plan's
//! wait between attempts both use it.

use std::time::Duration;

/// `base × 2^(n-1)` for the n-th failure (n = 0 counts as the first), never above `max`.
pub fn exponential(base: Duration, max: Duration, n: u32) -> Duration {
    let exp = n.saturating_sub(1).min(63);
    let factor = 1u128 << exp;
    let nanos = base.as_nanos().saturating_mul(factor);
    u64::try_from(nanos)
        .map(Duration::from_nanos)
        .unwrap_or(Duration::MAX)
        .min(max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_from_the_base_up_to_the_cap() {
        let s = |n| exponential(Duration::from_secs(10), Duration::from_secs(60), n).as_secs();
        assert_eq!(
            (0..=6).map(s).collect::<Vec<_>>(),
            vec![10, 10, 20, 40, 60, 60, 60]
        );
        assert_eq!(s(u32::MAX), 60, "no overflow however many failures");
        let ms = exponential(Duration::from_millis(5), Duration::from_secs(1000), 3);
        assert_eq!(ms, Duration::from_millis(20));
    }
}
