//! What a replica reports about itself: ready (caches synced), alive (the lease loop
//! beats), whether it serves conversions, and its metrics. The controller and the lease
//! loop write it; the HTTP server (`server/`) reads it for `/readyz`, `/healthz` and
//! `/metrics`, and writes one thing: that it serves conversions, once the webhook
//! listens.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::metrics::Metrics;

type Hook = Box<dyn Fn() + Send + Sync>;

/// A replica's health, shared by the controller, the lease loop and the server.
pub struct Status {
    pub metrics: Metrics,
    ready: AtomicBool,
    /// The conversion webhook of this replica answers.
    serves_conversions: AtomicBool,
    /// Listing GpuJobs has failed at least once before the caches synced.
    list_failed: AtomicBool,
    /// Last sign of life of the lease loop, and how old it may get (None: no election).
    heartbeat: Mutex<Option<(Instant, Duration)>>,
    before_scrape: Mutex<Vec<Hook>>,
}

impl std::fmt::Debug for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Status")
            .field("ready", &self.ready.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Status {
    pub fn new(metrics: Metrics) -> Arc<Status> {
        Arc::new(Status {
            metrics,
            ready: AtomicBool::new(false),
            serves_conversions: AtomicBool::new(false),
            list_failed: AtomicBool::new(false),
            heartbeat: Mutex::new(None),
            before_scrape: Mutex::new(Vec::new()),
        })
    }

    /// The caches hold a full list: the replica is ready (leading or not).
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    /// This replica's conversion webhook is bound and answers.
    pub fn set_serves_conversions(&self) {
        self.serves_conversions.store(true, Ordering::Relaxed);
    }

    /// A list of GpuJobs failed (the watch retries it with backoff). Counts only before
    /// the caches synced: only then does readiness depend on it.
    pub fn gpujob_list_failed(&self) {
        if !self.is_ready() {
            self.list_failed.store(true, Ordering::Relaxed);
        }
    }

    /// Why `/readyz` answers ok, or `Err` why not. Ready means the caches are synced,
    /// with one exception that breaks a cycle: a replica that serves the conversion
    /// webhook and cannot list GpuJobs is ready too. With v2 stored, listing GpuJobs
    /// as v1 needs the webhook, which the webhook Service routes only to ready pods; if
    /// every replica (re)starts at once, none could ever become ready otherwise.
    pub fn readiness(&self) -> Result<&'static str, &'static str> {
        if self.is_ready() {
            return Ok("caches synced");
        }
        if self.serves_conversions.load(Ordering::Relaxed)
            && self.list_failed.load(Ordering::Relaxed)
        {
            return Ok(
                "serving conversions; GpuJobs cannot be listed yet (the list may need this replica's conversion webhook)",
            );
        }
        Err("caches not synced yet")
    }

    /// The lease loop is alive; it must beat again within `limit`.
    pub fn beat(&self, limit: Duration) {
        if let Ok(mut h) = self.heartbeat.lock() {
            *h = Some((Instant::now(), limit));
        }
    }

    /// `Err` with the reason when the lease loop has not beaten in time.
    pub fn check_health(&self) -> Result<(), String> {
        let beat = self.heartbeat.lock().map(|h| *h).unwrap_or(None);
        match beat {
            Some((at, limit)) if at.elapsed() > limit => Err(format!(
                "lease loop silent for {:?} (limit {limit:?})",
                at.elapsed()
            )),
            _ => Ok(()),
        }
    }

    /// Runs before every scrape (gauges that depend on the time of asking).
    pub fn on_scrape(&self, hook: impl Fn() + Send + Sync + 'static) {
        if let Ok(mut hooks) = self.before_scrape.lock() {
            hooks.push(Box::new(hook));
        }
    }

    pub fn render_metrics(&self) -> String {
        if let Ok(hooks) = self.before_scrape.lock() {
            for hook in hooks.iter() {
                hook();
            }
        }
        self.metrics.encode()
    }
}
