//! Watches → view → keys → work queue → reconcile. Reconcile is a snapshot from the
//! view (`view/`, the one place that knows what this replica has seen and written) →
//! plan (`gpujob_core::plan`, pure: every decision) → execute (`apply/`, the only
//! writer) → the view records what the writes did; it does not care how keys arrive.
//! `runner/` wires the watches, the view, the queue, the workers and ownership together.

pub mod apply;
pub mod error;
pub mod multikueue;
mod reconcile;
mod runner;
pub mod view;

// The pure parts of a reconcile live in the core crate; re-exported where the
// controller has always had them.
pub use gpujob_core::{
    claims, domain, events, gang, job, plan, rendezvous, seen_job, seen_pod, status, validate,
};

use std::fmt;
use std::time::Duration;

use kube::ResourceExt;

use crate::api::GpuJob;
use crate::lease::{InFlight, Load};
use crate::metrics::Metrics;
use crate::queue::Backoff;
use crate::quota::Provider;
pub use plan::{ApiVersions, Next, PlanSettings};
pub use reconcile::{Looked, Reach, reconcile};
pub use runner::{run, run_unfenced};

/// The term a reconcile runs in: its writes are valid only while `shard` is still held
/// with this `epoch`, before that tenure's deadline. What it reads counts as current
/// against the same term (`View::currency`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fence {
    pub shard: u32,
    pub epoch: u64,
}

/// A GpuJob's namespace and name: the unit of work.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    pub namespace: String,
    pub name: String,
}

impl Key {
    pub fn new(namespace: &str, name: &str) -> Key {
        Key {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        }
    }

    pub fn of(gj: &GpuJob) -> Key {
        Key::new(
            gj.namespace().as_deref().unwrap_or_default(),
            &gj.name_any(),
        )
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// How the controller runs.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Watch only this namespace; all namespaces when `None`.
    pub namespace: Option<String>,
    /// Concurrent reconciles (each key is reconciled by one worker at a time).
    pub workers: Workers,
    pub plan: PlanSettings,
    /// Every GpuJob is reconciled at least this often, events or not.
    pub resync: Duration,
    /// A GpuJob Pending this long without a running attempt or a deliberate reason
    /// counts as unconverged.
    pub unconverged_after: Duration,
    /// Per-key backoff after a failed reconcile.
    pub retry: Backoff,
    /// How long shutdown waits for in-flight reconciles.
    pub drain_timeout: Duration,
    /// This replica's name (Events name it as the reporting instance).
    pub identity: String,
    /// Where GPU quota is reserved and released.
    pub quota: Provider,
    /// Reconciles running per shard (a shard given up is released once none runs).
    pub in_flight: InFlight,
    /// GpuJobs per namespace held, counted for the kept shard map (`lease::Load`).
    pub load: Load,
    /// Server-side timeout of the watches: under the client's read timeout
    /// ([`crate::client::watch_timeout`]), so a quiet watch ends cleanly and is renewed.
    pub watch_timeout: Duration,
    /// With sharded watches, also watch the shards this replica would take if another
    /// replica went (`Ownership::warm`): a takeover without a relist, for more memory.
    pub warm_shards: bool,
    /// Whether multi-node attempts are gangs (`--gang-scheduling`): resolved at start
    /// into `plan.gang`.
    pub gang_scheduling: GangScheduling,
    /// MultiKueue's worker clusters (`--multikueue-worker`), where the pods of the
    /// attempts it dispatches wait at the gate: read, watched and let go there.
    pub multikueue: multikueue::WorkerClusters,
}

/// How many reconciles run at once (`runner/sizing.rs`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Workers {
    /// `--workers`.
    Fixed(usize),
    /// By the API budget `qps`: at least `floor`, more while the API server answers
    /// slowly, at most `ceiling`.
    ByBudget {
        qps: f64,
        floor: usize,
        ceiling: usize,
    },
}

impl std::fmt::Display for Workers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Workers::Fixed(n) => write!(f, "{n}"),
            Workers::ByBudget { floor, ceiling, .. } => {
                write!(f, "{floor} to {ceiling}, by the API server's answer time")
            }
        }
    }
}

impl Workers {
    /// Workers allowed at start.
    pub fn initial(&self) -> usize {
        match *self {
            Workers::Fixed(n) => n.max(1),
            Workers::ByBudget { floor, .. } => floor.max(1),
        }
    }

    /// Workers there can ever be.
    pub fn most(&self) -> usize {
        match *self {
            Workers::Fixed(n) => n.max(1),
            Workers::ByBudget { floor, ceiling, .. } => ceiling.max(floor).max(1),
        }
    }
}

/// Whether each multi-node attempt's pods form one gang (`crate::controller::gang`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum GangScheduling {
    /// Where kube-apiserver serves PodGroups (`scheduling.k8s.io/v1beta1`), asked once
    /// at start: turning the API on later takes a restart of the operator.
    #[default]
    Auto,
    /// No gangs: pods are placed one by one (as on clusters before 1.37).
    Off,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            namespace: None,
            workers: Workers::Fixed(4),
            plan: PlanSettings::default(),
            resync: Duration::from_secs(300),
            unconverged_after: Duration::from_secs(600),
            retry: Backoff::default(),
            drain_timeout: Duration::from_secs(20),
            identity: "gpujob-operator".to_owned(),
            quota: Provider::None,
            in_flight: InFlight::default(),
            load: Load::default(),
            watch_timeout: crate::client::watch_timeout(crate::client::Limits::default().timeout),
            warm_shards: true,
            gang_scheduling: GangScheduling::default(),
            multikueue: multikueue::WorkerClusters::default(),
        }
    }
}

/// What every reconcile shares.
pub struct Context {
    /// What this replica knows (caches and its own writes); no client.
    pub view: view::View,
    /// Every write (the executor's).
    pub writer: apply::Writer,
    /// Every read a plan asks for (the executor's).
    pub reader: apply::Reader,
    pub settings: Settings,
    pub metrics: Metrics,
}

/// Creates the series of the controller's labelled metrics at zero, so rates and sums
/// exist before the first event.
pub fn init_metrics(metrics: &Metrics) {
    for label in error::error_labels() {
        metrics.reconcile_errors_by_kind.with_label_values(&[label]);
    }
    metrics.publish_domain(None);
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}
