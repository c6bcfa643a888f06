//! Pure: conditions, and the status patch that turns the stored status into the computed
//! one.

use jiff::Timestamp;
use serde_json::{Map, Value};

use crate::api::{Condition, ConditionStatus};

/// Condition types of a GpuJob.
pub const READY: &str = "Ready";
/// A spec change waits for the next attempt (OnNextAttempt), or could not be applied
/// (the new spec is invalid).
pub const SPEC_CHANGE_PENDING: &str = "SpecChangePending";
pub const QUOTA_RESERVED: &str = "QuotaReserved";
pub const CLEANUP_STUCK: &str = "CleanupStuck";
/// Terminal conditions, as batch/v1 Jobs have them (`kubectl wait --for=condition=…`):
/// set once per run, never flipped back.
pub const COMPLETE: &str = "Complete";
pub const FAILED: &str = "Failed";
/// True while `spec.suspend` holds the GpuJob; False (reason Resumed) afterwards.
pub const SUSPENDED: &str = "Suspended";
/// Ready reason: kube-scheduler finds no node for the running attempt's pod (too few
/// free GPUs, a selector nothing matches); the GpuJob is Pending until one frees up.
pub const UNSCHEDULABLE: &str = "Unschedulable";
/// Ready reason (and, for a finished GpuJob, `QuotaReserved`'s): the next attempt (or a
/// finished or deleted GpuJob's quota release) waits for a pod being deleted on a node
/// that is not Ready (or gone), whose kubelet cannot confirm the stop; a person ends the
/// wait (docs/runbooks.md#gpujobwaitingforlostnode).
pub const WAITING_FOR_LOST_NODE: &str = "WaitingForLostNode";
/// Ready reason: a GpuJob being deleted whose quota release waits for its pods, which
/// their nodes are stopping; said only in place of a [`WAITING_FOR_LOST_NODE`] that no
/// longer holds (the node came back).
pub const DELETING: &str = "Deleting";
/// Ready reason: a Service the operator did not make holds the name of a multi-node
/// attempt's Service; its Job waits, not started, and the GpuJob looks again in a while.
pub const SERVICE_NAME_CONFLICT: &str = "ServiceNameConflict";
/// Ready reason: a ResourceClaimTemplate the operator did not make holds the name of an
/// attempt's template (`resources.devices`); its Job waits, not started, and the GpuJob
/// looks again in a while.
pub const CLAIM_TEMPLATE_NAME_CONFLICT: &str = "ResourceClaimTemplateNameConflict";
/// Ready reason: a PodGroup the operator did not make holds the name of a multi-node
/// attempt's gang; its pods wait at the gate, and the GpuJob looks again in a while.
pub const POD_GROUP_NAME_CONFLICT: &str = "PodGroupNameConflict";
/// Ready reason: the current attempt's Job is managed by another controller
/// (`spec.managedBy`, which Kueue sets for a queue that dispatches through MultiKueue),
/// so its pods run on another cluster, where this operator does not let them go.
pub const MANAGED_ELSEWHERE: &str = "ManagedElsewhere";
/// Ready reason: the current attempt's Job is admitted and Kueue's MultiKueue runs it on a
/// worker cluster, where nothing says its copy runs yet (no status came back, no pod of
/// it is placed there): the GpuJob is Pending until one does.
pub const DISPATCHING: &str = "Dispatching";
/// Condition type, on GpuJobs with `spec.queueName`: whether Kueue admitted the current
/// attempt (True, reason Admitted), or holds it (False, with Kueue's reason and words).
pub const ADMITTED: &str = "Admitted";
/// Ready reason: the current attempt's pods run (or may: let go at the gate).
pub const JOB_RUNNING: &str = "JobRunning";
/// Ready reason (and Event): an attempt failed and the next waits for its retry backoff.
pub const BACKING_OFF: &str = "BackingOff";
/// Ready reason: the next attempt waits for the quota service's reservation.
pub const QUOTA_PENDING: &str = "QuotaPending";
/// Ready reason (and Event): the quota service refused the reservation; asked again later.
pub const QUOTA_REFUSED: &str = "QuotaRefused";
/// Ready reason: a spec change stops the running attempt before the next starts.
pub const REPLACING: &str = "Replacing";
/// Ready reason (and Event): `kubectl gpujob rerun` (the rerun annotation) began a new run.
pub const RERUN: &str = "Rerun";
/// Ready reason: the current attempt's Job waits in its Kueue LocalQueue (not admitted
/// yet, or evicted by Kueue and queued again); the GpuJob is Pending.
pub const QUEUED: &str = "Queued";

/// Sets condition `type_`, keeping `lastTransitionTime` unless the status flips, so a
/// recomputation of an unchanged state produces an identical status (and no write).
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: ConditionStatus,
    reason: &str,
    message: String,
    generation: Option<i64>,
    now: Timestamp,
) {
    let last_transition_time = conditions
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map_or(now, |c| c.last_transition_time);
    let condition = Condition {
        type_: type_.to_owned(),
        status,
        observed_generation: generation,
        last_transition_time,
        reason: reason.to_owned(),
        message,
    };
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(existing) => *existing = condition,
        None => conditions.push(condition),
    }
}

pub fn remove_condition(conditions: &mut Vec<Condition>, type_: &str) {
    conditions.retain(|c| c.type_ != type_);
}

/// A JSON merge patch (RFC 7386) that turns `old` into `new`: changed fields, with
/// `null` for fields that disappear (a plain serialisation of `new` would leave them).
pub fn merge_patch(old: &Value, new: &Value) -> Value {
    match (old, new) {
        (Value::Object(o), Value::Object(n)) => {
            let mut patch = Map::new();
            for (k, nv) in n {
                match o.get(k) {
                    Some(ov) if ov == nv => {}
                    Some(ov) => {
                        patch.insert(k.clone(), merge_patch(ov, nv));
                    }
                    None => {
                        patch.insert(k.clone(), nv.clone());
                    }
                }
            }
            for k in o.keys() {
                if !n.contains_key(k) {
                    patch.insert(k.clone(), Value::Null);
                }
            }
            Value::Object(patch)
        }
        _ => new.clone(),
    }
}

/// Timestamps in status are kept to whole seconds, like every Kubernetes time.
pub fn seconds(t: Timestamp) -> Timestamp {
    Timestamp::from_second(t.as_second()).unwrap_or(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn transition_time_moves_only_when_the_status_flips() {
        let mut cs = Vec::new();
        set_condition(
            &mut cs,
            READY,
            ConditionStatus::False,
            "JobRunning",
            "a".into(),
            Some(1),
            t("2026-01-01T00:00:00Z"),
        );
        set_condition(
            &mut cs,
            READY,
            ConditionStatus::False,
            "BackingOff",
            "b".into(),
            Some(2),
            t("2026-01-01T00:01:00Z"),
        );
        assert_eq!(cs.len(), 1);
        assert_eq!(cs[0].last_transition_time, t("2026-01-01T00:00:00Z"));
        assert_eq!(
            (cs[0].reason.as_str(), cs[0].observed_generation),
            ("BackingOff", Some(2))
        );
        set_condition(
            &mut cs,
            READY,
            ConditionStatus::True,
            "Succeeded",
            "c".into(),
            Some(2),
            t("2026-01-01T00:02:00Z"),
        );
        assert_eq!(cs[0].last_transition_time, t("2026-01-01T00:02:00Z"));
    }

    #[test]
    fn merge_patch_nulls_removed_fields_and_keeps_unchanged_ones_out() {
        let old = json!({"phase": "Running", "activeJob": "a-1", "attempts": 1, "lastFailure": {"attempt": 1, "exitCode": 3}});
        let new = json!({"phase": "Pending", "attempts": 1, "lastFailure": {"attempt": 1}});
        assert_eq!(
            merge_patch(&old, &new),
            json!({"phase": "Pending", "activeJob": null, "lastFailure": {"exitCode": null}})
        );
        assert_eq!(merge_patch(&new, &new), json!({}));
    }

    #[test]
    fn seconds_drops_the_fraction() {
        assert_eq!(
            seconds(t("2026-01-01T00:00:01.999Z")),
            t("2026-01-01T00:00:01Z")
        );
    }
}
