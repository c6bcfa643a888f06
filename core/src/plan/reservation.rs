//! The external GPU quota around a GpuJob's life, in an order that survives a crash
//! anywhere: spec validated → finalizer added → reservation made → its id and size
//! recorded in status → only then the first Job. When the GpuJob is finished or deleted,
//! or can no longer start an attempt (its spec became invalid, a foreign Job holds the
//! next attempt's name), or asks for another number of GPUs (`gpus` × `nodes` edited)
//! while none runs: release, once no pod of it may run (read from the API server) →
//! confirmed and recorded → finalizer removed (kept while the GpuJob lives on; a
//! resized spec reserves again before its next attempt). Every call is idempotent by
//! GpuJob UID, so a repeated step never doubles or leaks a reservation.
//!
//! Every call is recorded in `status.quotaCall` before it is sent, with a fencing
//! sequence that only grows: a repeat of a call whose answer is unknown reuses it, any
//! other call takes the next. So a call that lands late (a timed-out release after the
//! next reserve, a timed-out reserve after the release, a deposed replica's call) is
//! older than the last one and refused by the service; and a reserve whose answer was
//! lost is known to the plan, which releases it when the GpuJob stops needing quota. A
//! reservation is used only while no call is pending: after a release that did not
//! confirm, the next attempt reserves again first; when the release was of another size
//! than the spec asks now, only once it is confirmed (the service answers a reserve with
//! the reservation it holds, whatever size is asked).
//!
//! Decisions only: the executor makes the calls and feeds the answers back
//! ([`super::Observed::quota`]).

use jiff::SignedDuration;

use super::{
    Action, CLAIM_TEMPLATE_NAME_CONFLICT, FinalizerRemoval, INVALID_SPEC, JOB_NAME_CONFLICT,
    LOST_NODE_RECHECK, Next, Planner, PodsLeft, QuotaAnswer,
};
use crate::api::{
    ANNOTATION_SKIP_RELEASE, ConditionStatus, GpuJobStatus, Phase, QuotaCall, QuotaOp,
};
use crate::events::{Kind, Note};
use crate::quota::ReserveRequest;
use crate::status::{
    CLEANUP_STUCK, DELETING, QUOTA_PENDING, QUOTA_REFUSED, QUOTA_RESERVED, READY,
    WAITING_FOR_LOST_NODE, remove_condition, set_condition,
};

impl Planner<'_, '_> {
    /// Before the attempts of a GpuJob that is not final: make sure a reservation is
    /// recorded. Returns false when the plan ends here (the reserve is asked).
    pub(super) fn reserve_first(&mut self) -> bool {
        if usable(&self.current) || !self.may_start() {
            // Held already, or nothing could start: an invalid spec or a taken Job name
            // reserves nothing.
            return true;
        }
        if releasing_another_size(&self.current, self.gj.spec.total_gpus())
            && !matches!(self.obs.quota, Some(QuotaAnswer::Released))
        {
            // The release may not have landed, and the service would answer a reserve of
            // the new size with the reservation it holds, unchanged: the release is
            // confirmed first (asked again, or its failure recorded, with backoff).
            let asked = !matches!(self.obs.quota, Some(QuotaAnswer::ReleaseFailed { .. }));
            self.settle_release(false, "GPU quota released".to_owned());
            return !asked;
        }
        match self.obs.quota.clone() {
            Some(QuotaAnswer::Reserved { id, gpus }) => {
                let (generation, now) = (self.generation, self.now);
                // Recorded before any Job exists: the attempts below depend on it.
                self.checkpoint(|s| {
                    s.reservation_id = Some(id.clone());
                    s.reservation_gpus = Some(gpus);
                    if let Some(c) = s.quota_call.as_mut() {
                        c.pending = false;
                    }
                    // A release that kept failing is superseded by this grant.
                    s.release_failing_since = None;
                    remove_condition(&mut s.conditions, CLEANUP_STUCK);
                    s.observed_generation = generation;
                    set_condition(
                        &mut s.conditions,
                        QUOTA_RESERVED,
                        ConditionStatus::True,
                        "Reserved",
                        reserved_words(&id, Some(gpus)),
                        generation,
                        now,
                    );
                });
                true
            }
            Some(QuotaAnswer::Refused { reason, message }) => {
                // No new attempt starts (a running one goes on); the attempts below
                // say so in Ready and ask again with backoff. The call stays pending:
                // the next ask repeats it without another status write, and a GpuJob
                // that stops needing quota releases (a cheap 404) rather than guess.
                self.condition(QUOTA_RESERVED, ConditionStatus::False, &reason, message);
                true
            }
            _ => {
                if !self.gj.holds_quota_finalizer() {
                    // Before anything exists outside the cluster, so that deletion waits.
                    self.actions.push(Action::AddFinalizer);
                }
                let sequence = self.record_call(QuotaOp::Reserve);
                self.ask(Action::Reserve(
                    ReserveRequest {
                        uid: self.gj.metadata.uid.clone().unwrap_or_default(),
                        namespace: self.gj.metadata.namespace.clone().unwrap_or_default(),
                        name: self.name.clone(),
                        gpus: self.gj.spec.total_gpus(),
                    },
                    sequence,
                ));
                false
            }
        }
    }

    /// The fencing sequence of a call `op`: the recorded one when it repeats the recorded
    /// call whose answer is unknown, else the next, recorded (pending) before the call is
    /// sent so that no later call, on any replica, can carry a smaller one.
    fn record_call(&mut self, op: QuotaOp) -> i64 {
        let sequence = match &self.recorded.quota_call {
            Some(c) if c.op == op && c.pending => return c.sequence,
            Some(c) => c.sequence.saturating_add(1),
            None => 1,
        };
        let call = QuotaCall {
            op,
            sequence,
            pending: true,
        };
        match op {
            // Asked before the attempts are planned: the plan made again with the
            // answer decides them.
            QuotaOp::Reserve => self.checkpoint(|s| s.quota_call = Some(call.clone())),
            // Asked last, because of what this plan decided (a final phase, a suspend, a
            // spec that cannot run): recorded with it, so that the plan made again with
            // the answer starts from there, not from a GpuJob that still wants quota.
            QuotaOp::Release => {
                self.next.quota_call = Some(call);
                self.recorded = self.next.clone();
                self.actions
                    .push(Action::RecordStatus(Box::new(self.next.clone())));
            }
        }
        sequence
    }

    /// Whether a new attempt could start once quota is granted.
    fn may_start(&self) -> bool {
        self.invalid.is_none() && self.refused.is_none() && !self.gj.spec.suspend
    }

    /// Why a new attempt waits for quota, for Ready.
    pub(super) fn quota_blocker(&self) -> (&'static str, String) {
        let asks = self.gj.spec.total_gpus();
        match &self.obs.quota {
            Some(QuotaAnswer::Refused { reason, message }) => (
                QUOTA_REFUSED,
                format!("waiting for GPU quota: {reason}: {message}"),
            ),
            _ if usable(&self.next) && !sized(&self.next, asks, self.generation) => (
                QUOTA_PENDING,
                format!(
                    "{}; the spec asks for {asks}: it is released and made again once no pod of this GpuJob runs",
                    held_words(&self.next)
                ),
            ),
            _ => (
                QUOTA_PENDING,
                "waiting for a GPU quota reservation".to_owned(),
            ),
        }
    }

    /// After the attempts: a finished GpuJob releases its reservation and then drops the
    /// finalizer; one that cannot start an attempt and runs none releases it too (and
    /// keeps the finalizer: a fixed spec reserves again).
    pub(super) fn release_when_done_or_blocked(&mut self) {
        if self.next.phase.is_some_and(Phase::is_final) {
            // The reservation covers the pods: it goes only once none may run (a Job
            // deleted as a stray in this plan, its pods read from the API server).
            if !(may_hold(&self.next) || self.gj.holds_quota_finalizer()) {
                return;
            }
            if self.holds_gpus() {
                self.kept_for_lost_node();
                return;
            }
            match self.pods_left() {
                PodsLeft::None => self.settle_release(true, "GPU quota released".to_owned()),
                PodsLeft::Some(_) => self.kept_for_lost_node(),
                PodsLeft::Asked => {}
            }
            return;
        }
        // Backing off counts as not running: the spec may turn invalid meanwhile.
        let asks = self.gj.spec.total_gpus();
        let resized = usable(&self.next) && !sized(&self.next, asks, self.generation);
        let why = if self.gj.spec.suspend {
            "no attempt can start (Suspended)".to_owned()
        } else if self.invalid.is_some() {
            format!("no attempt can start ({INVALID_SPEC})")
        } else if let Some(reason) = [JOB_NAME_CONFLICT, CLAIM_TEMPLATE_NAME_CONFLICT]
            .into_iter()
            .find(|r| self.ready_reason_is(&[r]))
        {
            format!("no attempt can start ({reason})")
        } else if resized {
            format!(
                "{}; the spec asks for {asks}; the next attempt reserves again",
                held_words(&self.next)
            )
        } else {
            return;
        };
        let idle = matches!(self.next.phase, Some(Phase::Pending | Phase::Suspended))
            && !self.holds_gpus();
        // A reserve whose answer was lost may hold quota too: released all the same.
        if idle && may_hold(&self.next) && self.pods_left() == PodsLeft::None {
            self.settle_release(false, format!("GPU quota released: {why}"));
        }
    }

    /// A GpuJob being deleted: the finalizer goes once the release is confirmed (or an
    /// administrator waived it, or quota is switched off).
    pub(super) fn settle_deletion(&mut self) {
        if !self.release_waits_on_deletion() {
            self.settle_deletion_without_release();
            return;
        }
        // The reservation covers the attempt's pods: it goes only once they are gone
        // (their Jobs first, then the pods themselves, read).
        if self.stop_jobs_of_deleted() {
            self.deletion_waits_for_pods();
            return;
        }
        // A pod waiting at the gate that no Job of the GpuJob takes (ownerless, or of a
        // finished Job) is deleted here: the garbage collector takes it only once the
        // GpuJob is gone, which waits for this release.
        let planned = self.actions.len();
        self.stop_stray_pods(None);
        if self.actions.len() > planned {
            // Looked at again with backoff: an ownerless pod's end queues no GpuJob.
            self.requeue = Next::Backoff;
            return;
        }
        if self.pods_left() != PodsLeft::None {
            self.deletion_waits_for_pods();
            return;
        }
        self.settle_release(true, "GPU quota released".to_owned());
    }

    /// A GpuJob being deleted with nothing to release: its finalizer, if it holds it,
    /// goes (quota switched off, or an administrator waived the release).
    fn settle_deletion_without_release(&mut self) {
        if !self.gj.holds_quota_finalizer() {
            return;
        }
        if !self.obs.quota_required {
            self.actions
                .push(Action::RemoveFinalizer(FinalizerRemoval::QuotaDisabled));
            return;
        }
        if self.release_skip_asked() {
            let uid = self.gj.metadata.uid.as_deref().unwrap_or_default();
            let id = self
                .current
                .reservation_id
                .clone()
                .unwrap_or_else(|| format!("(unrecorded, key {uid})"));
            self.actions.push(Action::Publish(Note {
                kind: Kind::Warning,
                reason: "QuotaReleaseSkipped",
                note: format!(
                    "GPU quota reservation {id} was NOT released ({ANNOTATION_SKIP_RELEASE}=true); release it in the quota service by hand"
                ),
            }));
            self.actions
                .push(Action::RemoveFinalizer(FinalizerRemoval::ReleaseSkipped));
        }
    }

    /// Whether a finished GpuJob's reservation, once its pods are gone, is to be released:
    /// then what keeps it (a pod on a lost node) is said.
    pub(super) fn release_waits_when_done(&self) -> bool {
        self.obs.quota_required && may_hold(&self.current)
    }

    /// A finished GpuJob whose reservation waits for a pod being deleted on a node that
    /// cannot confirm its stop: `QuotaReserved` (still True: the reservation is held)
    /// says so ([`Planner::say_lost_node_wait`]), and `Reserved` again once the node came
    /// back. Its Ready stays the final one.
    fn kept_for_lost_node(&mut self) {
        let Some(id) = self.next.reservation_id.clone() else {
            return;
        };
        let gpus = self.next.reservation_gpus;
        self.say_lost_node_wait(
            QUOTA_RESERVED,
            ConditionStatus::True,
            &format!("GPU quota reservation {id} is released"),
            || ("Reserved", reserved_words(&id, gpus)),
        );
    }

    /// Says in condition `type_` (`status`) what waits (`waits`, e.g. "attempt 2 starts")
    /// for a pod being deleted on a node that cannot confirm its stop (not Ready, or
    /// gone), read in this reconcile; `gpujob_waiting{reason="WaitingForLostNode"}`
    /// counts it, and it is looked at again in a while, since nothing watches Nodes. None
    /// such where it said so (the node came back): it says `cleared` instead, so that
    /// neither the condition nor the alert sends a person to take a healthy node out of
    /// service.
    fn say_lost_node_wait(
        &mut self,
        type_: &str,
        status: ConditionStatus,
        waits: &str,
        cleared: impl FnOnce() -> (&'static str, String),
    ) {
        match self.lost_pod(|_| true) {
            Some((pod, node)) => {
                let message = node.stopping_message(waits, pod);
                self.condition(type_, status, WAITING_FOR_LOST_NODE, message);
                self.requeue = Next::After(LOST_NODE_RECHECK);
            }
            None if self
                .next
                .condition(type_)
                .is_some_and(|c| c.reason == WAITING_FOR_LOST_NODE) =>
            {
                let (reason, message) = cleared();
                self.condition(type_, status, reason, message);
            }
            None => {}
        }
    }

    /// Whether a deleted GpuJob's quota release (and so its finalizer) waits for its
    /// Jobs and pods to go.
    pub(super) fn release_waits_on_deletion(&self) -> bool {
        self.obs.quota_required && self.gj.holds_quota_finalizer() && !self.release_skip_asked()
    }

    /// An administrator asked for deletion without a release ([`ANNOTATION_SKIP_RELEASE`]).
    fn release_skip_asked(&self) -> bool {
        self.gj
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION_SKIP_RELEASE))
            .is_some_and(|v| v == "true")
    }

    /// A deleted GpuJob whose release waits for its pods: a pod on a lost node is said in
    /// Ready, as the gate does for the next attempt ([`Planner::say_lost_node_wait`]), and
    /// `Deleting` once the node came back.
    fn deletion_waits_for_pods(&mut self) {
        self.say_lost_node_wait(
            READY,
            ConditionStatus::False,
            "the GpuJob is deleted, and its GPU quota released, only",
            || {
                (
                    DELETING,
                    "the GpuJob is deleted, and its GPU quota released, once its pods are gone"
                        .to_owned(),
                )
            },
        );
    }

    /// Releases the reservation, or records what the release answered. A release that
    /// keeps failing is asked again with backoff; past the cleanup timeout the GpuJob
    /// says `CleanupStuck`.
    fn settle_release(&mut self, then_remove_finalizer: bool, message: String) {
        match self.obs.quota.clone() {
            Some(QuotaAnswer::Released) => {
                self.next.release_failing_since = None;
                remove_condition(&mut self.next.conditions, CLEANUP_STUCK);
                if let Some(c) = self.next.quota_call.as_mut() {
                    c.pending = false;
                }
                self.next.reservation_gpus = None;
                if self.next.reservation_id.take().is_some() {
                    self.condition(QUOTA_RESERVED, ConditionStatus::False, "Released", message);
                }
                if then_remove_finalizer && self.gj.holds_quota_finalizer() {
                    // The release is recorded before the finalizer goes.
                    self.recorded = self.next.clone();
                    self.actions
                        .push(Action::RecordStatus(Box::new(self.next.clone())));
                    self.actions
                        .push(Action::RemoveFinalizer(FinalizerRemoval::Released));
                }
            }
            Some(QuotaAnswer::ReleaseFailed { message }) => {
                let since = self.current.release_failing_since.unwrap_or(self.now);
                self.next.release_failing_since = Some(since);
                self.next.last_error = Some(format!("releasing GPU quota failed: {message}"));
                let timeout = SignedDuration::try_from(self.settings.cleanup_timeout)
                    .unwrap_or(SignedDuration::MAX);
                if self.now.duration_since(since) >= timeout {
                    self.condition(
                        CLEANUP_STUCK,
                        ConditionStatus::True,
                        "ReleaseFailing",
                        format!(
                            "releasing GPU quota has failed since {since}: {message}; the finalizer stays; once the GpuJob is deleted, {ANNOTATION_SKIP_RELEASE}=\"true\" lets deletion finish without it"
                        ),
                    );
                }
                self.requeue = Next::Backoff;
            }
            _ => {
                let sequence = self.record_call(QuotaOp::Release);
                self.ask(Action::Release(sequence));
            }
        }
    }
}

/// What a usable reservation holds, in words.
fn held_words(s: &GpuJobStatus) -> String {
    match s.reservation_gpus {
        Some(held) => format!("the GPU quota reservation holds {held} GPUs"),
        None => "the GPU quota reservation was made before the operator recorded its size, and the spec changed since".to_owned(),
    }
}

/// A release is asked and not confirmed, of a reservation made for another number of
/// GPUs than `gpus` (or of a size not recorded).
fn releasing_another_size(s: &GpuJobStatus, gpus: i32) -> bool {
    s.reservation_id.is_some()
        && s.reservation_gpus != Some(gpus)
        && s.quota_call
            .as_ref()
            .is_some_and(|c| c.op == QuotaOp::Release && c.pending)
}

/// A granted reservation no call since may have undone: attempts may run on it. After a
/// release that did not confirm, it may be gone (or go late): reserve again first.
pub(super) fn usable(s: &GpuJobStatus) -> bool {
    s.reservation_id.is_some() && !pending(s)
}

/// A usable reservation that holds at least `gpus`, for a Job built from generation
/// `built_from`: what runs must be covered. One recorded before the operator recorded
/// sizes holds what the spec asked when it was made: enough for a Job built from that
/// generation or an older one.
pub(super) fn covers(s: &GpuJobStatus, gpus: i32, built_from: Option<i64>) -> bool {
    usable(s)
        && match s.reservation_gpus {
            Some(held) => held >= gpus,
            None => built_from.is_some_and(|b| reserved_for(s).is_some_and(|r| b <= r)),
        }
}

/// A usable reservation of exactly `gpus`, what generation `generation` asks: a new
/// attempt starts only on one made for what the spec asks now (a reservation made for
/// more is released and made again first, so the difference goes back to the team's
/// quota). One recorded before the operator recorded sizes is taken as sized only while
/// the spec has not changed since it was made; otherwise it is made again, once.
pub(super) fn sized(s: &GpuJobStatus, gpus: i32, generation: Option<i64>) -> bool {
    usable(s)
        && match s.reservation_gpus {
            Some(held) => held == gpus,
            None => generation.is_some() && reserved_for(s) == generation,
        }
}

/// The generation a granted reservation was made for (its `QuotaReserved` condition).
fn reserved_for(s: &GpuJobStatus) -> Option<i64> {
    s.condition(QUOTA_RESERVED)
        .filter(|c| c.status == ConditionStatus::True)
        .and_then(|c| c.observed_generation)
}

/// What `QuotaReserved` says of reservation `id` of `gpus` GPUs.
fn reserved_words(id: &str, gpus: Option<i32>) -> String {
    match gpus {
        Some(gpus) => format!("GPU quota reservation {id} ({gpus} GPUs)"),
        None => format!("GPU quota reservation {id}"),
    }
}

/// Whether the service may hold quota for this GpuJob: a reservation recorded, or a call
/// whose outcome is unknown (a reserve may have landed, a release may not have).
fn may_hold(s: &GpuJobStatus) -> bool {
    s.reservation_id.is_some() || pending(s)
}

fn pending(s: &GpuJobStatus) -> bool {
    s.quota_call.as_ref().is_some_and(|c| c.pending)
}
