//! The trickle: a few GpuJobs created one by one, in a namespace of their own, while the
//! burst waits in the queue. What is measured is how long each waits for its first Job
//! (the operator's fairness: new work must not queue behind thousands of others).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use gpujob_operator::api::{GpuJob, LABEL_NAME};
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;

/// The trickle's namespace.
pub const NAMESPACE: &str = "trickle";

/// When each trickle GpuJob was created, and when its first Job was seen.
#[derive(Debug, Default)]
pub struct Trickle {
    created: Mutex<HashMap<String, Instant>>,
    first_job: Mutex<HashMap<String, Instant>>,
}

impl Trickle {
    /// Watches the trickle's Jobs (until the task is aborted).
    pub fn watch_jobs(self: &Arc<Self>, admin: &Client) -> tokio::task::JoinHandle<()> {
        let api: Api<Job> = Api::namespaced(admin.clone(), NAMESPACE);
        let me = self.clone();
        tokio::spawn(async move {
            let mut events = watcher(api, watcher::Config::default())
                .default_backoff()
                .boxed();
            while let Some(event) = events.next().await {
                let Ok(watcher::Event::Apply(job) | watcher::Event::InitApply(job)) = event else {
                    continue;
                };
                if let Some(owner) = job.labels().get(LABEL_NAME) {
                    let mut seen = me.first_job.lock().unwrap_or_else(|p| p.into_inner());
                    seen.entry(owner.clone()).or_insert_with(Instant::now);
                }
            }
        })
    }

    /// Creates `n` GpuJobs, one every `every`.
    pub async fn create(
        self: Arc<Self>,
        admin: Client,
        n: usize,
        every: Duration,
        spec: serde_json::Value,
    ) -> anyhow::Result<()> {
        let api: Api<GpuJob> = Api::namespaced(admin, NAMESPACE);
        for i in 0..n {
            let name = format!("trickle-{i}");
            let gj: GpuJob = serde_json::from_value(json!({
                "apiVersion": "gpujob.dev/v1", "kind": "GpuJob",
                "metadata": {"name": name}, "spec": spec,
            }))?;
            let at = Instant::now();
            api.create(&PostParams::default(), &gj)
                .await
                .with_context(|| format!("creating GpuJob {NAMESPACE}/{name}"))?;
            self.created
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(name, at);
            tokio::time::sleep(every).await;
        }
        Ok(())
    }

    /// Create → first Job, for each trickle GpuJob whose Job was seen, sorted; and how
    /// many were created.
    pub fn latencies(&self) -> (Vec<Duration>, usize) {
        let created = self.created.lock().unwrap_or_else(|p| p.into_inner());
        let seen = self.first_job.lock().unwrap_or_else(|p| p.into_inner());
        let mut out: Vec<Duration> = created
            .iter()
            .filter_map(|(name, at)| seen.get(name).map(|s| s.saturating_duration_since(*at)))
            .collect();
        out.sort();
        (out, created.len())
    }
}

/// The `q`-quantile (0..=1) of sorted `values`, nearest rank.
pub fn quantile(values: &[Duration], q: f64) -> Option<Duration> {
    if values.is_empty() {
        return None;
    }
    let rank = (q * values.len() as f64).ceil() as usize;
    values.get(rank.clamp(1, values.len()) - 1).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_nearest_rank() {
        let v: Vec<Duration> = (1..=100).map(Duration::from_secs).collect();
        assert_eq!(quantile(&v, 0.5), Some(Duration::from_secs(50)));
        assert_eq!(quantile(&v, 0.99), Some(Duration::from_secs(99)));
        assert_eq!(quantile(&v, 1.0), Some(Duration::from_secs(100)));
        assert_eq!(quantile(&v[..1], 0.99), Some(Duration::from_secs(1)));
        assert_eq!(quantile(&[], 0.5), None);
    }
}
