//! The gate at the pods: the one place that lets an attempt run.
//!
//! Every attempt's pod is created with the operator's scheduling gate
//! ([`crate::api::SCHEDULING_GATE`]), so whatever brings a pod into being (this replica's
//! create, a create or a removal of a gate that lands late from a replica that lost the
//! shard, Kueue admitting a Job it labelled itself, the Job controller making a pod for a
//! Job whose deletion it has not seen yet), that pod is not placed on a node until the
//! plan lets it go here. It does so pod by pod ([`Action::UngatePod`], which carries the
//! pod's resourceVersion), and only when all of this holds at once:
//!
//! - the view of the GpuJob is known current in this term (the executor confirms it
//!   first: [`Action::Confirm`]), and its recorded status says the pod's attempt is the
//!   current one, not replaced, not suspended, not finished;
//! - the pod's Job is that attempt's Job, not being deleted, built from a generation the
//!   update policy lets run (`Recreate` replaces an attempt of an older spec instead);
//!   dispatched by MultiKueue, only once the status records that an attempt was
//!   (`multiKueueDispatched`);
//! - with external quota, a reservation is usable and covers the GPUs the Job asks for;
//! - a read of the API server in this reconcile ([`Action::ReadPods`], a quorum list; on
//!   the MultiKueue workers too once an attempt was dispatched there) shows the pod
//!   waiting at the gate, and no pod of any other Job of the GpuJob that may
//!   still run ([`SeenPod::may_run`]; one still gated counts, since a removal sent by a
//!   deposed replica may still land on it).
//!
//! A pod of any other attempt is never let go: it stays unschedulable until its Job's
//! deletion takes it (the plan deletes every Job that is not the current attempt's and
//! has not finished; the garbage collector, the pods of a Job that is gone), or the plan
//! deletes the pod itself ([`Action::DeletePod`]: one whose Job has finished and is
//! kept, or one no Job owns).

use super::{
    Action, INVALID_SPEC, LOST_NODE_RECHECK, Next, NodeHealth, OLD_ATTEMPT_STOPPING,
    POD_GROUP_NAME_CONFLICT, Planner, SERVICE_NAME_CONFLICT, WAITING_FOR_LOST_NODE,
};
use crate::api::{ConditionStatus, Phase, UpdatePolicy};
use crate::events::{Note, stray_pod_deleted};
use crate::seen_job::SeenJob;
use crate::seen_pod::SeenPod;
use crate::{gang, rendezvous};

impl Planner<'_, '_> {
    /// Attempt `k` runs (its Job is `job`): lets its pods that wait at the gate go, when
    /// the gate's conditions hold (module docs); a Job an earlier version created
    /// suspended and ungated gets the gate first.
    pub(super) fn release_pods(&mut self, k: i32, job: Option<&SeenJob>) {
        let Some(job) = job.filter(|j| !j.deleting()) else {
            return;
        };
        if !job.gated {
            if job.suspended
                && let Some(rv) = &job.resource_version
            {
                let queue = job
                    .queue
                    .clone()
                    .or_else(|| self.gj.spec.queue_name().map(str::to_owned));
                self.actions.push(Action::GateJob {
                    name: job.name.clone(),
                    resource_version: rv.clone(),
                    queue,
                });
            }
            // Started by an earlier version: its pods were let go then.
            return;
        }
        let Some(job_uid) = job.uid.as_deref() else {
            return;
        };
        if job.queued() || !self.pods_wait_at_gate(k, job_uid) || !self.may_let_go(k, job) {
            return;
        }
        let Some(pods) = self.obs.pods.as_ref() else {
            self.ask_pods();
            return;
        };
        if let Some(other) = pods.iter().find(|p| !p.of_job(job_uid) && p.may_run()) {
            self.next.phase = Some(Phase::Pending);
            if let Some((pod, node)) = self.lost_pod(|p| !p.of_job(job_uid)) {
                let message = node.waiting_message(k, pod);
                self.ready(ConditionStatus::False, WAITING_FOR_LOST_NODE, message);
                // Nothing watches Nodes: look again in a while.
                self.requeue = Next::After(LOST_NODE_RECHECK);
                return;
            }
            let message = format!(
                "attempt {k} starts once the other attempts' pods are gone: {}",
                not_stopped(other)
            );
            self.ready(ConditionStatus::False, OLD_ATTEMPT_STOPPING, message);
            // Their end is an event; the backoff bounds a missed one.
            self.requeue = Next::Backoff;
            return;
        }
        // Pods of the attempt's Job on two clusters: MultiKueue dispatched it again to
        // another worker while the first copy may still run there (a worker it took for
        // lost, still reachable here). Both count as the Job's; letting either go could
        // run the attempt twice. None goes until one copy is gone.
        let mut clusters: Vec<&str> = pods
            .iter()
            .filter(|p| p.of_job(job_uid) && p.may_run())
            .map(|p| p.cluster.as_deref().unwrap_or("this cluster"))
            .collect();
        clusters.sort_unstable();
        clusters.dedup();
        if clusters.len() > 1 {
            self.next.phase = Some(Phase::Pending);
            let message = format!(
                "attempt {k}'s Job has pods on more than one cluster ({}): MultiKueue dispatched it again; its pods wait at the gate until one copy is gone",
                clusters.join(", ")
            );
            self.ready(ConditionStatus::False, OLD_ATTEMPT_STOPPING, message);
            // Their end is an event; the backoff bounds a missed one.
            self.requeue = Next::Backoff;
            return;
        }
        let go: Vec<&SeenPod> = pods
            .iter()
            .filter(|p| p.of_job(job_uid) && p.attempt == Some(k) && p.waits_at_gate())
            .collect();
        if go.is_empty() {
            return;
        }
        // The attempt's Service or PodGroup could not be made: its name is taken, or the
        // API server refused it as invalid (an admission policy, a field it does not
        // take). No pod goes without it.
        let refused = self.obs.refused.as_ref().filter(|r| {
            r.attempt == k
                && [SERVICE_NAME_CONFLICT, POD_GROUP_NAME_CONFLICT, INVALID_SPEC]
                    .contains(&r.reason)
        });
        if let Some(r) = refused {
            self.next.phase = Some(Phase::Pending);
            self.next.last_error = Some(r.message.clone());
            self.ready(ConditionStatus::False, r.reason, r.message.clone());
            self.requeue = if r.reason == INVALID_SPEC {
                // As for a refused Job: a spec change, or the next resync, asks again.
                Next::Done
            } else {
                // Nothing tells the operator when that object goes: look again in a while.
                Next::After(self.settings.name_conflict_retry)
            };
            return;
        }
        // A multi-node attempt's pods find each other through its Service from their
        // first moment: it exists before any of them runs.
        if let Some(service) = rendezvous::service(job) {
            self.actions.push(Action::CreateService {
                attempt: k,
                service: Box::new(service),
            });
        }
        // A gang's pods are placed as their PodGroup says: it exists before any of them
        // may be placed.
        if let Some(group) = gang::pod_group(job) {
            self.actions.push(Action::CreatePodGroup {
                attempt: k,
                group: Box::new(group),
            });
        }
        for p in go {
            if let (Some(uid), Some(rv)) = (&p.uid, &p.resource_version) {
                self.actions.push(Action::UngatePod {
                    name: p.name.clone(),
                    uid: uid.clone(),
                    resource_version: rv.clone(),
                    cluster: p.cluster.clone(),
                });
            }
        }
    }

    /// Whether a pod of attempt `k`'s Job (uid `job_uid`) waits at the gate: only then is
    /// a read due.
    fn pods_wait_at_gate(&self, k: i32, job_uid: &str) -> bool {
        self.seen_pods(|p| p.of_job(job_uid) && p.attempt == Some(k) && p.waits_at_gate())
    }

    /// Whether a pod for which `pred` holds is seen: in the read of this reconcile, or,
    /// without one, in the pod cache.
    pub(super) fn seen_pods(&self, pred: impl Fn(&SeenPod) -> bool) -> bool {
        match &self.obs.pods {
            Some(read) => read.iter().any(pred),
            None => self.obs.cached_pods.iter().any(|p| pred(p)),
        }
    }

    /// A pod for which `pred` holds that is being deleted on a node a read of this
    /// reconcile found lost ([`super::NodeState::lost`]): not Ready, or gone. From the pod read
    /// of this reconcile, or, without one, from the pod cache.
    pub(super) fn lost_pod(
        &self,
        pred: impl Fn(&SeenPod) -> bool,
    ) -> Option<(&SeenPod, &NodeHealth)> {
        let lost = |p: &SeenPod| {
            let node = p.stopping_on()?;
            self.obs
                .nodes
                .iter()
                .find(|n| n.name == node && n.state.lost())
        };
        match &self.obs.pods {
            Some(read) => read
                .iter()
                .filter(|p| pred(p))
                .find_map(|p| lost(p).map(|n| (p, n))),
            None => self
                .obs
                .cached_pods
                .iter()
                .copied()
                .filter(|p| pred(p))
                .find_map(|p| lost(p).map(|n| (p, n))),
        }
    }

    /// The gate's conditions on the GpuJob and the Job (module docs); the pods are read
    /// only once these hold.
    fn may_let_go(&self, k: i32, job: &SeenJob) -> bool {
        let recorded = &self.current;
        // The attempt must be recorded before any of its pods runs: a crash after the
        // gate went must never find a running attempt the status does not name. The
        // status this plan writes records it; the next look lets the gate go.
        // Nor may a pod on a MultiKueue worker run before the status says the workers are
        // read: later reads (the next attempt's gate, a release) must see it there.
        if recorded.attempts != k
            || (job.dispatched() && !recorded.multi_kueue_dispatched)
            || recorded.phase.is_some_and(Phase::is_final)
            || recorded.replacing_attempt == Some(k)
            || self.gj.spec.suspend
            || self.managed_elsewhere(job).is_some()
        {
            return false;
        }
        let older_spec = job.generation != self.generation;
        if older_spec
            && self.gj.spec.update_policy == UpdatePolicy::Recreate
            && self.invalid.is_none()
        {
            // Replaced, not run (`running`).
            return false;
        }
        if self.obs.quota_required {
            let asks = job.gpus.unwrap_or_else(|| self.gj.spec.total_gpus());
            if !super::reservation::covers(recorded, asks, job.generation) {
                return false;
            }
        }
        true
    }
}

impl Planner<'_, '_> {
    /// Deletes the pods that wait at the gate but are not attempt `current`'s (`None`: the
    /// GpuJob has finished) and that nothing else deletes: made from a Job that has
    /// finished and is kept (the Job controller racing its end), or owned by no Job. A
    /// stray Job's pods go with it; a pod whose Job the view does not have is left to the
    /// garbage collector (the Job cache may only lag: a Job the holder made just before a
    /// takeover, say, whose pod deleted here would fail it). They never ran; until they are
    /// gone, they hold the current attempt's gate.
    pub(super) fn stop_stray_pods(&mut self, current: Option<i32>) {
        let current_job = current
            .and_then(|k| self.by_attempt.get(&k))
            .and_then(|j| j.uid.clone());
        let jobs = &self.obs.jobs;
        let stray = |p: &SeenPod| {
            p.waits_at_gate()
                && current_job.as_deref().is_none_or(|uid| !p.of_job(uid))
                && match p.job_uid.as_deref() {
                    None => true,
                    Some(uid) => jobs.iter().any(|j| {
                        j.uid.as_deref() == Some(uid) && !j.deleting() && !super::attempts::live(j)
                    }),
                }
        };
        if !self.seen_pods(stray) {
            return;
        }
        let Some(pods) = self.obs.pods.as_ref() else {
            self.ask_pods();
            return;
        };
        let deletes: Vec<(Action, Note)> = pods
            .iter()
            .filter(|p| stray(p))
            .filter_map(|p| {
                let delete = Action::DeletePod {
                    name: p.name.clone(),
                    uid: p.uid.clone()?,
                    resource_version: p.resource_version.clone()?,
                    cluster: p.cluster.clone(),
                };
                Some((delete, stray_pod_deleted(&p.name, p.attempt, current)))
            })
            .collect();
        for (delete, note) in deletes {
            self.actions.push(delete);
            self.actions.push(Action::Publish(note));
        }
    }
}

impl Planner<'_, '_> {
    /// Why the pods of `job` are made where this operator does not let them go, if they
    /// are: by a controller other than the Job controller, unless it is Kueue's
    /// MultiKueue with its worker clusters given to the operator and an attempt whose
    /// pods need nothing but themselves there. A multi-node attempt's Service and
    /// PodGroup, and the ResourceClaimTemplate of one with DRA devices, are made on this
    /// cluster beside the Job; MultiKueue copies only the Job, so its pods on a worker
    /// would find none of them.
    pub(super) fn managed_elsewhere(&self, job: &SeenJob) -> Option<String> {
        let manager = job.managed_by.as_deref()?;
        if !job.dispatched() {
            return Some(format!(
                "is managed by {manager}, which makes its pods where this operator does not let them go: they wait at its scheduling gate"
            ));
        }
        if !self.settings.multikueue {
            return Some(format!(
                "is managed by {manager} (Kueue's MultiKueue runs it on a worker cluster), where this operator does not let its pods go: they wait there at its scheduling gate; start the operator with --multikueue-worker for each worker cluster, or use a LocalQueue whose ClusterQueue has no MultiKueue admission check"
            ));
        }
        let needs = if job.nodes.is_some_and(|n| n > 1) {
            "a Service (and a PodGroup) of its attempt"
        } else if job.devices.is_some() {
            "its ResourceClaimTemplate"
        } else if job.pod_group.is_some() {
            "its PodGroup"
        } else {
            return None;
        };
        Some(format!(
            "is managed by {manager} (Kueue's MultiKueue runs it on a worker cluster), and its pods there would need {needs}, which is made on this cluster only: multi-node attempts and DRA devices do not run through MultiKueue; its pods wait there at the operator's scheduling gate; use a LocalQueue whose ClusterQueue has no MultiKueue admission check"
        ))
    }
}

/// What Ready says of a pod that may still run.
pub(super) fn not_stopped(p: &SeenPod) -> String {
    let of = p
        .attempt
        .map_or_else(String::new, |a| format!(" (attempt {a})"));
    let how = if p.gated {
        "waits at the gate until it is deleted"
    } else if p.deleting {
        "is stopping"
    } else {
        "has not stopped"
    };
    format!("pod {}{of} {how}", p.name)
}
