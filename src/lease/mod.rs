//! Lease election with client-go semantics, and the ownership it publishes.
//!
//! The holder of a shard's Lease runs its work; everyone else campaigns (and, unless
//! the API server selects objects by shard, keeps its caches warm). Ownership is published as a watch channel of shards held, each with its
//! tenure: the local lease deadline (the monotonic time the last successful renewal was
//! sent, plus the renew deadline; no write starts after it), an epoch that changes on
//! every gain, and the term's name for logs (quota calls are fenced per GpuJob instead:
//! `quota::fencing_token`). One lease loop serves every `--shards` (`coordinator/`;
//! which shards to hold is `balance.rs`; each held shard is renewed by `renew.rs`): with
//! one shard it is plain leader election on the Lease `<lease-name>`. The Leases' names
//! and labels are `group.rs`; how replicas with different counts exclude each other
//! while a rolling update changes `--shards` is `modes.rs`.

mod coordinator;
mod elector;
mod group;
mod heartbeat;
mod kept;
mod load;
mod modes;
mod ownership;
mod renew;

pub use gpujob_core::balance;

use std::time::Duration;

use crate::metrics::{CONTROLLER, Metrics};
pub use coordinator::{Params, run};
pub use elector::{Attempt, Elector};
pub use gpujob_core::lease::{Observed, Timing};
pub use group::{
    KEPT_MAP, LABEL_GROUP, LABEL_ROLE, LABEL_SETTINGS, LABEL_SHARD_MAP, LABEL_SHARDS, ShardLeases,
    Split,
};
pub use load::Load;
pub use modes::ShardedPeer;
pub use ownership::{InFlight, InFlightGuard, Ownership, Tenure};

/// What a failed Lease call means, in one line, with the fix when it is a set-up problem
/// (no debug dump of the API's answer).
pub fn explain(e: &kube::Error, namespace: &str) -> String {
    if let kube::Error::Api(s) = e {
        if s.code == 404 && s.details.as_ref().is_some_and(|d| d.kind == "namespaces") {
            return format!(
                "namespace {namespace} not found: apply deploy/operator/namespace.yaml or pass --lease-namespace"
            );
        }
        if s.code == 403 {
            return format!(
                "{}: the operator may not use Leases in namespace {namespace}: apply deploy/operator/rbac.yaml (Role gpujob-operator-lease) there",
                crate::apierror::describe(e)
            );
        }
    }
    crate::apierror::describe(e)
}

/// Publishes what this replica holds to the leadership metrics.
fn report(metrics: &Metrics, own: &Ownership) {
    metrics
        .shards_held
        .set(i64::try_from(own.held.len()).unwrap_or(i64::MAX));
    metrics
        .leader
        .with_label_values(&[CONTROLLER])
        .set(i64::from(own.holds_any()));
    for s in 0..own.shards() {
        metrics
            .shard_owner
            .with_label_values(&[s.to_string().as_str()])
            .set(i64::from(own.held.contains_key(&s)));
    }
}

/// `shards` shards were gained or lost: each counted, and the gauges follow.
fn gained_or_lost(metrics: &Metrics, own: &Ownership, shards: usize) {
    let shards = u64::try_from(shards).unwrap_or(u64::MAX);
    metrics.lease_transitions.inc_by(shards);
    metrics.shard_transitions.inc_by(shards);
    report(metrics, own);
}

/// /healthz fails when a lease loop stops beating. A look makes at most eight calls one
/// after another, each bounded by the renew deadline: the list, the single Lease, the
/// takes (at once), the second list, the renewals of late terms (at once), the
/// hand-backs (at once), the member deletes, and a wait on an elector a release task
/// is using. Drains, releases and the heartbeat run beside it. So a healthy loop beats
/// at least every eight deadlines + a (jittered) retry period.
fn beat_limit(timing: &Timing) -> Duration {
    (timing.renew_deadline * 8 + timing.retry_period * 2).max(Duration::from_secs(30))
}

/// The retry period stretched by up to a fifth (period × [1, 1.2)), so replicas that
/// started together do not keep trying in the same instant.
fn jitter(period: Duration) -> Duration {
    let nanos = u64::from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0),
    );
    let frac = (nanos % 1000) as f64 / 1000.0 * 0.2;
    period.mul_f64(1.0 + frac)
}
