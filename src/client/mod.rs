//! The operator's API clients: identified in every request (the API server's audit log
//! and metrics tell replicas apart), rate-limited by a token bucket, counted, and
//! retried on 429/503/504 with kube's policy (counted too).

mod layers;

use std::sync::Arc;

use http::HeaderValue;
use kube::Client;
use kube::client::ClientBuilder;
use kube::client::retry::RetryPolicy;
use tower::buffer::BufferLayer;
use tower::retry::RetryLayer;

use tokio::sync::watch;

use crate::lease::Ownership;
use crate::metrics::Metrics;
use crate::ratelimit::TokenBucket;
pub use layers::LeaseLapsed;
use layers::{CountingRetry, FenceLayer, RateLimitLayer};

/// Client-side limits: the API server's priority and fairness is the last line of
/// defence, not the first.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub qps: f64,
    pub burst: u32,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            qps: 50.0,
            burst: 100,
        }
    }
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
    // kube's own retry sits where it cannot be counted; the same policy is added below.
    config.default_retry = false;
    let bucket = Arc::new(TokenBucket::new(limits.qps, limits.burst));
    let fence = fence.unwrap_or_else(|| watch::channel(Ownership::unfenced()).1);
    // Innermost first: fence, buffer, rate limit, retry.
    let client = ClientBuilder::try_from(config)?
        .with_layer(&FenceLayer::new(fence))
        .with_layer(&BufferLayer::new(1024))
        .with_layer(&RateLimitLayer::new(bucket, metrics.clone()))
        .with_layer(&RetryLayer::new(CountingRetry::new(
            RetryPolicy::server_retry(),
            metrics,
        )))
        .build();
    Ok(client)
}

/// rustls needs exactly one process-wide crypto provider; install ring's once.
pub fn install_crypto_provider() {
    // Err means one is installed already, which is all we need.
    let _ = rustls::crypto::ring::default_provider().install_default();
}
