//! A snapshot: what the view knows of one GpuJob, from the caches and the write memory.
//! Nothing here reads the API server: what the caches cannot say (a Job they lag
//! behind, a failed attempt's exit code, why a pod is not placed, Kueue's Workload, the
//! GpuJob itself when its view is not known current), the plan asks the executor for.

use std::sync::Arc;
use std::time::Instant;

use super::View;
use super::term_start::{Covered, Offer};
use crate::api::GpuJob;
use crate::controller::seen_job::SeenJob;
use crate::controller::seen_pod::SeenPod;
use crate::controller::{Fence, Key};

#[derive(Debug)]
pub struct Snapshot {
    pub gpujob: Arc<GpuJob>,
    pub jobs: Vec<Arc<SeenJob>>,
    /// The GpuJob's pods as the pod cache has them (it may lag: they only tell the plan
    /// that a read is due).
    pub cached_pods: Vec<Arc<SeenPod>>,
    /// `gpujob` is known current in this term ([`currency`]). Otherwise the cache may
    /// lag behind the previous holder of the shard.
    pub confirmed: bool,
    /// Where the shard's term began is not known in the GpuJob's namespace, and this
    /// reconcile is the one to read it (`Action::ReadTermStart`).
    pub term_start_due: bool,
}

/// `None` when the GpuJob is gone. `fence`: the term of the GpuJob's shard.
pub(super) fn observe(view: &View, key: &Key, fence: &Fence, offer: Offer) -> Option<Snapshot> {
    let cached = || view.gpujobs.get(key);
    let Some(gpujob) = view.memory.gpujob(key, cached) else {
        view.memory.forget(key);
        return None;
    };
    let uid = gpujob.metadata.uid.clone().unwrap_or_default();
    let jobs = view.memory.jobs(key, &uid, || view.jobs.jobs_of(&uid));
    let cached_pods = view.pods_of(key, &uid);
    let rv = gpujob
        .metadata
        .resource_version
        .as_deref()
        .unwrap_or_default();
    let Covered { past, due } = currency(view, key, fence, rv, Instant::now(), offer);
    Some(Snapshot {
        gpujob,
        jobs,
        cached_pods,
        confirmed: past,
        term_start_due: due,
    })
}

/// Whether version `rv` of the GpuJob `key` is known current in the term `fence`, the one
/// place that says so: read from the API server or written by this replica at that
/// version in this term (every write carries a resourceVersion precondition), or changed
/// after the term began (`term_start.rs`). `due`: the term's start is not known, and the
/// caller is the one to read it (never with [`Offer::Never`]).
pub(super) fn currency(
    view: &View,
    key: &Key,
    fence: &Fence,
    rv: &str,
    now: Instant,
    offer: Offer,
) -> Covered {
    if view.memory.is_current(key, fence.epoch, rv) {
        return Covered {
            past: true,
            due: false,
        };
    }
    view.term_starts
        .covers(fence.shard, &key.namespace, fence.epoch, rv, now, offer)
}
