//! Every metric, defined in one place and registered in one registry per operator.
//!
//! Names follow client-go and controller-runtime (`workqueue_*`, `rest_client_*`,
//! `controller_runtime_reconcile_*`, `leader_election_master_status`) so existing
//! dashboards work; domain metrics start with `gpujob_`. No label carries a per-object
//! value; labelled counters are created at zero so rates exist before the first event
//! (the label values of the controller's own vectors are created by the controller,
//! which knows them: this module imports nothing of it).

use gpujob_core::domain::{PHASES, Snapshot, WAITING_REASONS};
use prometheus::core::Collector;
use prometheus::{
    Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

/// The controller name in `controller`/`name` labels.
pub const CONTROLLER: &str = "gpujob";
/// The reconcile results of `controller_runtime_reconcile_total`.
pub const RESULTS: [&str; 4] = ["success", "error", "requeue", "requeue_after"];
/// `gpujob_events_total` results.
pub const EVENT_RESULTS: [&str; 5] = ["created", "series", "aggregated", "failed", "dropped"];
/// `gpujob_events_queued` lanes.
pub const EVENT_LANES: [&str; 2] = ["state_change", "other"];
/// `gpujob_watch_objects_total` resources.
pub const WATCHED: [&str; 3] = ["gpujobs", "jobs", "pods"];
/// `gpujob_conversion_requests_total` results: a ConversionReview answered with every
/// object converted, or answered with a Failed result.
pub const CONVERSION_RESULTS: [&str; 2] = ["success", "failed"];
const METHODS: [&str; 5] = ["GET", "POST", "PUT", "PATCH", "DELETE"];
const CODES: [&str; 9] = [
    "200", "201", "404", "409", "422", "429", "500", "503", "<error>",
];

/// The work queue's metrics (client-go `workqueue_*`, label `name`).
#[derive(Debug, Clone)]
pub struct QueueMetrics {
    pub depth: IntGauge,
    pub adds: IntCounter,
    pub retries: IntCounter,
    pub queue_duration: Histogram,
    pub work_duration: Histogram,
    pub unfinished_work: Gauge,
    pub longest_running: Gauge,
}

#[derive(Debug, Clone)]
pub struct Metrics {
    pub registry: Registry,
    pub queue: QueueMetrics,
    pub reconcile_total: IntCounterVec,
    pub reconcile_errors: IntCounter,
    pub reconcile_time: Histogram,
    pub reconcile_errors_by_kind: IntCounterVec,
    /// Workers allowed to reconcile at once (`runner/sizing.rs`).
    pub workers: IntGauge,
    pub rest_requests: IntCounterVec,
    pub rest_latency: HistogramVec,
    pub rate_limiter_wait: Histogram,
    pub rest_retries: IntCounterVec,
    pub leader: IntGaugeVec,
    pub lease_transitions: IntCounter,
    pub shards_held: IntGauge,
    pub shards: IntGauge,
    pub shard_count_conflict: IntGauge,
    pub shard_owner: IntGaugeVec,
    pub shard_transitions: IntCounter,
    /// By shard: how long this replica has seen it free while it could have taken it.
    pub shard_unheld: GaugeVec,
    /// How long this replica has held no shard while a shard was free.
    pub replica_idle: Gauge,
    pub lease_duration: Gauge,
    pub gpujobs_per_shard: IntGaugeVec,
    /// Namespaces with GpuJobs in each shard held.
    pub namespaces_per_shard: IntGaugeVec,
    /// The kept shard map's version this replica acts under (0: equal ranges).
    pub shard_map_version: IntGauge,
    /// Re-cuts this replica wrote as the map's keeper.
    pub shard_recuts: IntCounter,
    /// From a re-cut's write to every shard held under it, seen by its keeper.
    pub shard_recut: Histogram,
    pub gpujobs: IntGaugeVec,
    pub waiting: IntGaugeVec,
    pub unconverged: IntGauge,
    pub unconverged_oldest: Gauge,
    pub attempts_started: IntCounter,
    /// Pods the gate let go (their scheduling gate removed).
    pub pods_ungated: IntCounter,
    pub attempts_failed: IntCounter,
    pub attempts_uncounted: IntCounter,
    pub quota_refusals: IntCounter,
    pub cleanup_stuck: IntGauge,
    pub events: IntCounterVec,
    /// Events waiting to be written, by lane (`state_change`, `other`), set at scrape.
    pub events_queued: IntGaugeVec,
    /// Objects the watches delivered (list pages and watch events), by resource.
    pub watch_objects: IntCounterVec,
    pub watch_foreign: IntCounterVec,
    pub sharded_watch: IntGauge,
    pub cached_objects: IntGaugeVec,
    pub shard_first_look: HistogramVec,
    pub shard_first_look_observed: HistogramVec,
    pub shard_first_plan: HistogramVec,
    pub first_looks_from_caches: IntCounter,
    pub shard_cached: IntGaugeVec,
    pub conversion_requests: IntCounterVec,
    pub conversion_duration: Histogram,
    pub conversion_certificate_expiry: IntGauge,
    pub build_info: IntGaugeVec,
}

fn exp_buckets(start: f64, factor: f64, count: usize) -> Vec<f64> {
    prometheus::exponential_buckets(start, factor, count).unwrap_or_default()
}

fn counter(name: &str, help: &str) -> prometheus::Result<IntCounter> {
    IntCounter::with_opts(Opts::new(name, help))
}

fn gauge(name: &str, help: &str) -> prometheus::Result<IntGauge> {
    IntGauge::with_opts(Opts::new(name, help))
}

fn counters(name: &str, help: &str, labels: &[&str]) -> prometheus::Result<IntCounterVec> {
    IntCounterVec::new(Opts::new(name, help), labels)
}

fn histogram(name: &str, help: &str, buckets: Vec<f64>) -> HistogramOpts {
    HistogramOpts::new(name, help).buckets(buckets)
}

impl QueueMetrics {
    fn new() -> prometheus::Result<QueueMetrics> {
        let name = |n: &str, help: &str| Opts::new(n, help).const_label("name", CONTROLLER);
        // client-go's workqueue buckets: 10 ns .. 10 s, factor 10.
        let wq = |n: &str, help: &str| {
            histogram(n, help, exp_buckets(1e-8, 10.0, 10)).const_label("name", CONTROLLER)
        };
        Ok(QueueMetrics {
            depth: IntGauge::with_opts(name("workqueue_depth", "Current depth of the work queue"))?,
            adds: IntCounter::with_opts(name(
                "workqueue_adds_total",
                "Total number of adds handled by the work queue",
            ))?,
            retries: IntCounter::with_opts(name(
                "workqueue_retries_total",
                "Total number of retries handled by the work queue",
            ))?,
            queue_duration: Histogram::with_opts(wq(
                "workqueue_queue_duration_seconds",
                "How long in seconds an item stays in the work queue before being requested",
            ))?,
            work_duration: Histogram::with_opts(wq(
                "workqueue_work_duration_seconds",
                "How long in seconds processing an item from the work queue takes",
            ))?,
            unfinished_work: Gauge::with_opts(name(
                "workqueue_unfinished_work_seconds",
                "How many seconds of work has been done that is in progress and hasn't been observed by work_duration",
            ))?,
            longest_running: Gauge::with_opts(name(
                "workqueue_longest_running_processor_seconds",
                "How many seconds has the longest running processor for the work queue been running",
            ))?,
        })
    }

    fn collectors(&self) -> Vec<Box<dyn Collector>> {
        vec![
            Box::new(self.depth.clone()),
            Box::new(self.adds.clone()),
            Box::new(self.retries.clone()),
            Box::new(self.queue_duration.clone()),
            Box::new(self.work_duration.clone()),
            Box::new(self.unfinished_work.clone()),
            Box::new(self.longest_running.clone()),
        ]
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        Self::try_new().unwrap_or_else(|e| {
            // Only reachable through a programming error (a duplicate or invalid name),
            // which the unit test below catches.
            panic!("metric definitions are invalid: {e}")
        })
    }

    fn try_new() -> prometheus::Result<Metrics> {
        let m = Self::define()?;
        for c in m.collectors() {
            m.registry.register(c)?;
        }
        // process_cpu_seconds_total, process_resident_memory_bytes, process_open_fds, ...
        // of this process (read from /proc at each scrape), named as every Prometheus
        // client names them, so the dashboards' CPU and memory panels need no adapter.
        #[cfg(target_os = "linux")]
        m.registry.register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ))?;
        m.zero_labels();
        Ok(m)
    }

    /// Every metric, unregistered.
    fn define() -> prometheus::Result<Metrics> {
        let ctrl = |n: &str, help: &str| Opts::new(n, help).const_label("controller", CONTROLLER);
        let reconcile_buckets = vec![
            0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
        ];
        let request_buckets = vec![
            0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0,
        ];
        let wait_buckets = vec![
            0.0, 0.001, 0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0,
        ];
        Ok(Metrics {
            registry: Registry::new(),
            queue: QueueMetrics::new()?,
            reconcile_total: IntCounterVec::new(
                ctrl(
                    "controller_runtime_reconcile_total",
                    "Total number of reconciliations per controller",
                ),
                &["result"],
            )?,
            reconcile_errors: IntCounter::with_opts(ctrl(
                "controller_runtime_reconcile_errors_total",
                "Total number of reconciliation errors per controller",
            ))?,
            reconcile_time: Histogram::with_opts(
                histogram(
                    "controller_runtime_reconcile_time_seconds",
                    "Length of time per reconciliation per controller",
                    reconcile_buckets,
                )
                .const_label("controller", CONTROLLER),
            )?,
            reconcile_errors_by_kind: counters(
                "gpujob_reconcile_errors_total",
                "Reconcile errors by stable error label",
                &["error"],
            )?,
            workers: gauge(
                "gpujob_workers",
                "Workers allowed to reconcile at once: --workers, else by the API budget and the API server's answer time",
            )?,
            rest_requests: counters(
                "rest_client_requests_total",
                "Number of HTTP requests, partitioned by status code and method",
                &["code", "method"],
            )?,
            rest_latency: HistogramVec::new(
                histogram(
                    "rest_client_request_duration_seconds",
                    "Request latency in seconds, by verb",
                    request_buckets,
                ),
                &["verb"],
            )?,
            rate_limiter_wait: Histogram::with_opts(histogram(
                "rest_client_rate_limiter_duration_seconds",
                "Client-side rate limiter latency in seconds",
                wait_buckets,
            ))?,
            rest_retries: counters(
                "rest_client_request_retries_total",
                "Number of request retries (429/500/502/503/504), partitioned by status code and method",
                &["code", "method"],
            )?,
            leader: IntGaugeVec::new(
                Opts::new(
                    "leader_election_master_status",
                    "1 while this replica holds a Lease (with sharding, any shard's), else 0",
                ),
                &["name"],
            )?,
            lease_transitions: counter(
                "gpujob_lease_transitions_total",
                "Times this replica gained or lost a lease",
            )?,
            shards_held: gauge(
                "gpujob_shards_held",
                "Shards whose lease this replica holds",
            )?,
            shards: gauge("gpujob_shards", "Shards GpuJobs are split into (--shards)")?,
            shard_count_conflict: gauge(
                "gpujob_shard_count_conflict",
                "1 while this replica holds no shard because replicas of its lease group split namespaces differently (another --shards, --shard-cuts, shard map or quota provider) and hold shards or come first, else 0",
            )?,
            shard_owner: IntGaugeVec::new(
                Opts::new(
                    "gpujob_shard_owner",
                    "1 for each shard whose lease this replica holds, else 0 (one series per shard)",
                ),
                &["shard"],
            )?,
            shard_transitions: counter(
                "gpujob_shard_transitions_total",
                "Times this replica gained or lost a shard",
            )?,
            shard_unheld: GaugeVec::new(
                Opts::new(
                    "gpujob_shard_unheld_seconds",
                    "By shard: seconds this replica has seen the shard with no live holder while it could have taken it itself (its heartbeat went through and no replica splitting namespaces differently was live); 0 while any replica holds it, and on a replica that cannot judge (it holds the one shard of --shards 1, its list failed, or it may take no shard)",
                ),
                &["shard"],
            )?,
            replica_idle: Gauge::with_opts(Opts::new(
                "gpujob_replica_idle_seconds",
                "Seconds this replica has held no shard while it saw a shard free and could have taken it; 0 while it holds one or none is free",
            ))?,
            lease_duration: Gauge::with_opts(Opts::new(
                "gpujob_lease_duration_seconds",
                "The lease duration this replica runs with (--lease-duration): a Lease not renewed for this long expires; the unheld and idle alerts compare with it",
            ))?,
            gpujobs_per_shard: IntGaugeVec::new(
                Opts::new(
                    "gpujob_gpujobs_per_shard",
                    "GpuJobs in each shard this replica holds (0 for shards it does not hold)",
                ),
                &["shard"],
            )?,
            namespaces_per_shard: IntGaugeVec::new(
                Opts::new(
                    "gpujob_namespaces_per_shard",
                    "Namespaces with GpuJobs in each shard this replica holds (0 for shards it does not hold)",
                ),
                &["shard"],
            )?,
            shard_map_version: gauge(
                "gpujob_shard_map_version",
                "Version of the shard map this replica acts under (0: equal ranges, before any re-cut; always 0 with --shard-cuts)",
            )?,
            shard_recuts: counter(
                "gpujob_shard_recuts_total",
                "Re-cuts of the shard map this replica wrote as its keeper (the holder of shard 0)",
            )?,
            shard_recut: Histogram::with_opts(histogram(
                "gpujob_shard_recut_seconds",
                "Seconds from a re-cut's write to the first look of its keeper that saw every shard held under the new map",
                exp_buckets(0.5, 2.0, 12),
            ))?,
            gpujobs: IntGaugeVec::new(
                Opts::new(
                    "gpujob_gpujobs",
                    "GpuJobs by phase, of the shards this replica holds (0 on a replica that holds none)",
                ),
                &["phase"],
            )?,
            waiting: IntGaugeVec::new(
                Opts::new(
                    "gpujob_waiting",
                    "GpuJobs waiting on purpose: backing off, quota refused, invalid spec, suspended, queued by Kueue, waiting for a lost node",
                ),
                &["reason"],
            )?,
            unconverged: gauge(
                "gpujob_unconverged",
                "GpuJobs not converging: spec change unprocessed, or Pending without a running attempt past the threshold",
            )?,
            unconverged_oldest: Gauge::with_opts(Opts::new(
                "gpujob_unconverged_oldest_seconds",
                "Age of the oldest unconverged GpuJob",
            ))?,
            attempts_started: counter(
                "gpujob_attempts_started_total",
                "Attempts started (Jobs created)",
            )?,
            pods_ungated: counter(
                "gpujob_pods_ungated_total",
                "Pods of current attempts let go by the operator (scheduling gate removed)",
            )?,
            attempts_failed: counter(
                "gpujob_attempts_failed_total",
                "Attempts observed failed, counted against maxRetries",
            )?,
            attempts_uncounted: counter(
                "gpujob_attempts_uncounted_total",
                "Attempts that ended without counting against maxRetries: disrupted (preempted, evicted, drained), or a failure rule said so",
            )?,
            quota_refusals: counter(
                "gpujob_quota_refusals_total",
                "Reservations the external GPU quota service refused",
            )?,
            cleanup_stuck: gauge(
                "gpujob_cleanup_stuck",
                "GpuJobs whose quota release keeps failing past its timeout (finalizer held)",
            )?,
            events: counters(
                "gpujob_events_total",
                "Events on GpuJobs: created, counted into a recent identical one (series), counted into an identical one still queued (aggregated), failed, or dropped (the queue for Events other than state changes was full, or the writer had stopped at shutdown)",
                &["result"],
            )?,
            events_queued: IntGaugeVec::new(
                Opts::new(
                    "gpujob_events_queued",
                    "Events waiting to be written, by lane: state_change (never dropped to make room, no fixed limit) and other (at most 1000)",
                ),
                &["lane"],
            )?,
            watch_objects: counters(
                "gpujob_watch_objects_total",
                "Objects this replica's watches received, listed or changed or deleted, by resource (gpujobs, jobs, pods): what the API server sent it, owned shard or not",
                &["resource"],
            )?,
            watch_foreign: counters(
                "gpujob_watch_foreign_objects_total",
                "Objects a sharded watch received from outside the shards it asked for, by resource (dropped here): the API server did not apply the shard selector",
                &["resource"],
            )?,
            sharded_watch: gauge(
                "gpujob_sharded_watch",
                "1 when this replica's watches ask the API server for its shards' objects only (the server echoed the shard selector), 0 when they receive every object",
            )?,
            shard_first_look: HistogramVec::new(
                histogram(
                    "gpujob_shard_first_look_seconds",
                    "By shard: seconds from this replica gaining the shard to every GpuJob the shard had then looked at once (a hand-over's length; with sharded watches, a cold shard's list included)",
                    vec![
                        0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
                    ],
                ),
                &["shard"],
            )?,
            shard_first_look_observed: HistogramVec::new(
                histogram(
                    "gpujob_shard_first_look_observed_seconds",
                    "By shard: seconds from this replica gaining the shard to every GpuJob the shard had then that was observed before (work under way, not new work) looked at once",
                    vec![
                        0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
                    ],
                ),
                &["shard"],
            )?,
            shard_first_plan: HistogramVec::new(
                histogram(
                    "gpujob_shard_first_plan_seconds",
                    "By shard: seconds from this replica gaining the shard to every GpuJob the shard had then planned once from the caches (ended there, or queued with what it asks of the API server)",
                    vec![
                        0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
                    ],
                ),
                &["shard"],
            )?,
            first_looks_from_caches: counter(
                "gpujob_first_looks_from_caches_total",
                "First looks at the GpuJobs of gained shards that ended from the caches alone, with no worker and no request (the others were queued for a worker); counted in controller_runtime_reconcile_total too",
            )?,
            shard_cached: IntGaugeVec::new(
                Opts::new(
                    "gpujob_shard_cached",
                    "By shard: 1 when both of this replica's caches hold the shard's GpuJobs and Jobs (every shard without sharded watches; with them, the shards held and kept warm)",
                ),
                &["shard"],
            )?,
            cached_objects: IntGaugeVec::new(
                Opts::new(
                    "gpujob_cached_objects",
                    "Objects in this replica's caches, by resource (gpujobs, jobs, pods): with sharded watches, only its shards'",
                ),
                &["resource"],
            )?,
            conversion_requests: counters(
                "gpujob_conversion_requests_total",
                "ConversionReviews the conversion webhook answered, by result (success, failed)",
                &["result"],
            )?,
            // A review holds up to a list page of objects: milliseconds normally, and the
            // API server gives up after 30 s.
            conversion_duration: Histogram::with_opts(histogram(
                "gpujob_conversion_duration_seconds",
                "Time to answer one ConversionReview, from its body read to its answer encoded",
                vec![
                    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
                ],
            ))?,
            conversion_certificate_expiry: IntGauge::with_opts(Opts::new(
                "gpujob_conversion_certificate_expiration_timestamp_seconds",
                "When the conversion webhook's serving certificate expires (its notAfter, Unix seconds); 0 without the webhook or when unreadable",
            ))?,
            build_info: IntGaugeVec::new(
                Opts::new(
                    "gpujob_build_info",
                    "Always 1: the running operator's version (Cargo.toml), to tell replicas of a rolling update apart",
                ),
                &["version"],
            )?,
        })
    }

    fn collectors(&self) -> Vec<Box<dyn Collector>> {
        let mut all = self.queue.collectors();
        let rest: Vec<Box<dyn Collector>> = vec![
            Box::new(self.reconcile_total.clone()),
            Box::new(self.reconcile_errors.clone()),
            Box::new(self.reconcile_time.clone()),
            Box::new(self.reconcile_errors_by_kind.clone()),
            Box::new(self.workers.clone()),
            Box::new(self.rest_requests.clone()),
            Box::new(self.rest_latency.clone()),
            Box::new(self.rate_limiter_wait.clone()),
            Box::new(self.rest_retries.clone()),
            Box::new(self.leader.clone()),
            Box::new(self.lease_transitions.clone()),
            Box::new(self.shards_held.clone()),
            Box::new(self.shards.clone()),
            Box::new(self.shard_count_conflict.clone()),
            Box::new(self.shard_owner.clone()),
            Box::new(self.shard_transitions.clone()),
            Box::new(self.shard_unheld.clone()),
            Box::new(self.replica_idle.clone()),
            Box::new(self.lease_duration.clone()),
            Box::new(self.gpujobs_per_shard.clone()),
            Box::new(self.namespaces_per_shard.clone()),
            Box::new(self.shard_map_version.clone()),
            Box::new(self.shard_recuts.clone()),
            Box::new(self.shard_recut.clone()),
            Box::new(self.gpujobs.clone()),
            Box::new(self.waiting.clone()),
            Box::new(self.unconverged.clone()),
            Box::new(self.unconverged_oldest.clone()),
            Box::new(self.attempts_started.clone()),
            Box::new(self.pods_ungated.clone()),
            Box::new(self.attempts_failed.clone()),
            Box::new(self.attempts_uncounted.clone()),
            Box::new(self.quota_refusals.clone()),
            Box::new(self.cleanup_stuck.clone()),
            Box::new(self.events.clone()),
            Box::new(self.events_queued.clone()),
            Box::new(self.watch_objects.clone()),
            Box::new(self.watch_foreign.clone()),
            Box::new(self.sharded_watch.clone()),
            Box::new(self.cached_objects.clone()),
            Box::new(self.shard_first_look.clone()),
            Box::new(self.shard_first_look_observed.clone()),
            Box::new(self.shard_first_plan.clone()),
            Box::new(self.first_looks_from_caches.clone()),
            Box::new(self.shard_cached.clone()),
            Box::new(self.conversion_requests.clone()),
            Box::new(self.conversion_duration.clone()),
            Box::new(self.conversion_certificate_expiry.clone()),
            Box::new(self.build_info.clone()),
        ];
        all.extend(rest);
        all
    }

    /// Creates the per-shard series (`shards` of them) at zero.
    pub fn init_shards(&self, shards: u32) {
        self.shards.set(i64::from(shards));
        for s in 0..shards {
            let s = s.to_string();
            self.shard_owner.with_label_values(&[s.as_str()]);
            self.shard_unheld.with_label_values(&[s.as_str()]);
            self.gpujobs_per_shard.with_label_values(&[s.as_str()]);
            self.namespaces_per_shard.with_label_values(&[s.as_str()]);
            self.shard_first_look.with_label_values(&[s.as_str()]);
            self.shard_first_look_observed
                .with_label_values(&[s.as_str()]);
            self.shard_first_plan.with_label_values(&[s.as_str()]);
            self.shard_cached.with_label_values(&[s.as_str()]);
        }
    }

    /// Publishes the domain gauges ([`gpujob_core::domain::snapshot`]; `None`: this
    /// replica holds no shard, and reports zero so that sums across replicas count each
    /// GpuJob once).
    pub fn publish_domain(&self, snap: Option<&Snapshot>) {
        let empty = Snapshot::default();
        let snap = snap.unwrap_or(&empty);
        for phase in PHASES {
            let n = snap.by_phase.get(phase).copied().unwrap_or(0);
            self.gpujobs.with_label_values(&[phase]).set(n);
        }
        for reason in WAITING_REASONS {
            let n = snap.waiting.get(reason).copied().unwrap_or(0);
            self.waiting.with_label_values(&[reason]).set(n);
        }
        self.unconverged.set(snap.unconverged);
        self.cleanup_stuck.set(snap.cleanup_stuck);
        self.unconverged_oldest
            .set(snap.oldest_unconverged.as_secs_f64());
    }

    /// The label values this module knows, at zero.
    fn zero_labels(&self) {
        for result in RESULTS {
            self.reconcile_total.with_label_values(&[result]);
        }
        for method in METHODS {
            for code in CODES {
                self.rest_requests.with_label_values(&[code, method]);
            }
            for code in ["429", "500", "502", "503", "504"] {
                self.rest_retries.with_label_values(&[code, method]);
            }
        }
        self.leader.with_label_values(&[CONTROLLER]);
        for result in EVENT_RESULTS {
            self.events.with_label_values(&[result]);
        }
        for lane in EVENT_LANES {
            self.events_queued.with_label_values(&[lane]);
        }
        for resource in WATCHED {
            self.watch_objects.with_label_values(&[resource]);
            self.watch_foreign.with_label_values(&[resource]);
            self.cached_objects.with_label_values(&[resource]);
        }
        for result in CONVERSION_RESULTS {
            self.conversion_requests.with_label_values(&[result]);
        }
        self.build_info
            .with_label_values(&[env!("CARGO_PKG_VERSION")])
            .set(1);
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut buf = Vec::new();
        // Encoding into a Vec fails only on invalid metric families, which cannot be
        // registered in the first place.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        String::from_utf8(buf).unwrap_or_default()
    }
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_metric_registers_and_labelled_counters_start_at_zero() {
        let m = Metrics::try_new().expect("valid definitions");
        let text = m.encode();
        for name in [
            "workqueue_depth{name=\"gpujob\"} 0",
            "controller_runtime_reconcile_total{controller=\"gpujob\",result=\"error\"} 0",
            "rest_client_requests_total{code=\"409\",method=\"PATCH\"} 0",
            "leader_election_master_status{name=\"gpujob\"} 0",
            "gpujob_events_total{result=\"dropped\"} 0",
            "gpujob_events_total{result=\"aggregated\"} 0",
            "gpujob_events_queued{lane=\"state_change\"} 0",
            "gpujob_watch_objects_total{resource=\"pods\"} 0",
            "gpujob_watch_foreign_objects_total{resource=\"pods\"} 0",
            "gpujob_cached_objects{resource=\"pods\"} 0",
            "gpujob_conversion_requests_total{result=\"failed\"} 0",
            "gpujob_conversion_duration_seconds_count 0",
            "gpujob_conversion_certificate_expiration_timestamp_seconds 0",
            concat!(
                "gpujob_build_info{version=\"",
                env!("CARGO_PKG_VERSION"),
                "\"} 1"
            ),
            "process_resident_memory_bytes ",
            "process_cpu_seconds_total ",
            "process_start_time_seconds ",
        ] {
            assert!(text.contains(name), "missing {name}");
        }
    }
}
