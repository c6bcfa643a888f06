//! The operator's API clients: identified in every request (the API server's audit log
//! and metrics tell replicas apart), rate-limited by a token bucket, counted, and
//! retried on 429/500/502/503/504 a bounded number of times, honouring Retry-After
//! (counted too). Errors are put in one line by `crate::apierror`.

mod layers;
mod selector;

use std::sync::Arc;
use std::time::Duration;

use http::HeaderValue;
use kube::Client;
use kube::client::ClientBuilder;
use tower::buffer::BufferLayer;
use tower::retry::RetryLayer;

use tokio::sync::watch;

use crate::lease::Ownership;
use crate::metrics::Metrics;
use crate::ratelimit::TokenBucket;
use layers::{BoundedRetry, FenceLayer, RateLimitLayer};
pub use layers::{LeaseLapsed, fenced};
pub use layers::{MAX_RETRIES, MAX_RETRY_AFTER};
pub use selector::selecting;

/// Client-side limits: the API server's priority and fairness is the last line of
/// defence, not the first.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub qps: f64,
    pub burst: u32,
    /// A request that goes this long without a byte from the API server is abandoned
    /// with an error (a write's outcome is then re-read, never assumed). Without it a
    /// request that is never answered holds its caller forever: a worker, or a watch's
    /// relist, which leaves a replica holding its shards while it sees nothing.
    pub timeout: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            qps: 50.0,
            burst: 100,
            timeout: Duration::from_secs(60),
        }
    }
}

/// The server-side timeout of watches made through a client with read timeout
/// `timeout`: the API server ends a quiet watch (and it is renewed) before the client
/// could take its silence for a dead connection.
pub fn watch_timeout(timeout: Duration) -> Duration {
    Duration::from_secs((timeout.as_secs() * 3 / 4).max(1))
}

/// Field manager recorded on every write (managedFields, and Events' reporting controller).
pub const FIELD_MANAGER: &str = "gpujob-operator";

/// `gpujob-operator/<version> (<identity>)`
pub fn user_agent(identity: &str) -> String {
    format!("gpujob-operator/{} ({identity})", env!("CARGO_PKG_VERSION"))
}

/// Adds the User-Agent to a client config (kube's client sends none of its own).
pub fn identify(
    mut config: kube::Config,
    identity: &str,
) -> Result<kube::Config, http::header::InvalidHeaderValue> {
    let value = HeaderValue::from_str(&user_agent(identity))?;
    config
        .headers
        .retain(|(name, _)| name != http::header::USER_AGENT);
    config.headers.push((http::header::USER_AGENT, value));
    Ok(config)
}

/// A client with its own token bucket (so the Lease's client and the reconcile client
/// never compete for one budget). `metrics`: where requests, waits and retries are
/// counted. `fence`: when given, writes are refused once that ownership has lapsed.
pub fn build(
    config: kube::Config,
    identity: &str,
    limits: Limits,
    metrics: Option<Metrics>,
    fence: Option<watch::Receiver<Ownership>>,
) -> anyhow::Result<Client> {
    let mut config = identify(config, identity)?;
    config.read_timeout = Some(limits.timeout);
    // Count from when a request is sent, not from when its pooled connection went idle.
    config.reset_reader_on_write = true;
    // kube's own retry sits where it cannot be counted, and waits up to 1000 s; ours, below.
    config.default_retry = false;
    let bucket = Arc::new(TokenBucket::new(limits.qps, limits.burst));
    let fence = fence.unwrap_or_else(|| watch::channel(Ownership::unfenced()).1);
    // Innermost first: fence, buffer, rate limit, retry.
    let client = ClientBuilder::try_from(config)?
        .with_layer(&FenceLayer::new(fence))
        .with_layer(&BufferLayer::new(1024))
        .with_layer(&RateLimitLayer::new(bucket, metrics.clone()))
        .with_layer(&RetryLayer::new(BoundedRetry::new(metrics)))
        .build();
    Ok(client)
}

/// rustls needs exactly one process-wide crypto provider; install ring's once.
pub fn install_crypto_provider() {
    // Err means one is installed already, which is all we need.
    let _ = rustls::crypto::ring::default_provider().install_default();
}
