//! Bounded polling: tests wait for the cluster to reach a state, never sleep blindly.

use std::future::Future;
use std::time::Duration;

use crate::Error;

/// Calls `check` every `interval` until it returns `Some`, or fails after `timeout`
/// with an error naming `what`.
pub async fn until<T, F, Fut>(
    what: &str,
    timeout: Duration,
    interval: Duration,
    mut check: F,
) -> Result<T, Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return Ok(v);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(Error::Timeout {
                what: what.to_owned(),
                seconds: timeout.as_secs(),
            });
        }
        tokio::time::sleep(interval).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn returns_the_value_or_times_out() {
        let mut n = 0;
        let v = until(
            "n reaches 3",
            Duration::from_secs(10),
            Duration::from_secs(1),
            || {
                n += 1;
                let v = (n >= 3).then_some(n);
                async move { v }
            },
        )
        .await
        .unwrap();
        assert_eq!(v, 3);

        let err = until(
            "never",
            Duration::from_secs(5),
            Duration::from_secs(1),
            || async { None::<()> },
        )
        .await
        .unwrap_err();
        assert!(err.to_string().contains("never"), "{err}");
    }
}
