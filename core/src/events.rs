//! Pure: the Kubernetes Events a status change deserves, for what a user looks for in
//! `kubectl describe`. Derived from recorded transitions, so a repeated reconcile of an
//! unchanged GpuJob emits nothing (and identical repeats aggregate in the recorder).

use crate::api::{ConditionStatus, GpuJobStatus, Phase};

use crate::status::{
    ADMITTED, BACKING_OFF, CLAIM_TEMPLATE_NAME_CONFLICT, CLEANUP_STUCK, MANAGED_ELSEWHERE,
    POD_GROUP_NAME_CONFLICT, QUEUED, QUOTA_REFUSED, QUOTA_RESERVED, READY, RERUN,
    SERVICE_NAME_CONFLICT, SPEC_CHANGE_PENDING, SUSPENDED, UNSCHEDULABLE, WAITING_FOR_LOST_NODE,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Normal,
    Warning,
}

/// Event reason: which `firstAvailable` alternative an attempt's pods got.
pub const DEVICES_ALLOCATED: &str = "DevicesAllocated";

/// One Event: `reason` is CamelCase and stable; `note` is for people.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    pub kind: Kind,
    pub reason: &'static str,
    pub note: String,
}

/// The reasons of Events that record a state change of a GpuJob: a run or an attempt
/// begins or ends (started, failed, disrupted, replaced by a spec change, taken back by
/// Kueue), the GpuJob is suspended or resumed, or it finishes. One each per transition
/// recorded in status, so a handful per attempt. Also `QuotaReleaseSkipped`: the last
/// change of a deleted GpuJob (its finalizer goes without a release), whose Event is the
/// only record of the abandoned reservation's id.
///
/// Left out: waits and their reasons (Queued, Admitted, Unschedulable, BackingOff,
/// WaitingForLostNode, ServiceNameConflict, SpecChangePending, InvalidSpec, CleanupStuck),
/// quota steps and the operator's clean-up of strays; the status and conditions say the
/// same, and `InvalidSpec` also names a spec change that waits while the attempt runs on.
pub const STATE_CHANGES: [&str; 11] = [
    RERUN,
    "Suspended",
    "Resumed",
    "AttemptStarted",
    "AttemptFailed",
    "AttemptDisrupted",
    "SpecChangeApplied",
    "Evicted",
    "Succeeded",
    "Failed",
    "QuotaReleaseSkipped",
];

impl Note {
    /// Whether this Event records a state change of its GpuJob ([`STATE_CHANGES`]): the
    /// recorder never drops those to make room for others.
    pub fn records_state_change(&self) -> bool {
        STATE_CHANGES.contains(&self.reason)
    }
}

fn note(kind: Kind, reason: &'static str, note: impl Into<String>) -> Note {
    Note {
        kind,
        reason,
        note: note.into(),
    }
}

fn cond<'a>(s: &'a GpuJobStatus, t: &str) -> Option<(&'a ConditionStatus, &'a str, &'a str)> {
    s.condition(t)
        .map(|c| (&c.status, c.reason.as_str(), c.message.as_str()))
}

/// A Job deleted because it is not the current attempt's (`current`; `None`: the
/// GpuJob has finished) and had not finished: it would run beside another attempt, or
/// after the end. Not a status transition: published by the plan with the delete.
pub fn stray_job_deleted(job: &str, attempt: Option<i32>, current: Option<i32>) -> Note {
    let (of, instead) = (of_attempt(attempt), instead_of(current));
    note(
        Kind::Warning,
        "StrayJobDeleted",
        format!(
            "deleting Job {job}{of}: it has not finished, but {instead}, and attempts run one at a time (a Job create delivered late, after another operator replica took over, can bring back an attempt that had ended)"
        ),
    )
}

/// A Job deleted because it claims to be an attempt of the GpuJob (its controller owner
/// reference) that this operator never made: its attempt label is past the next attempt
/// the status allows (`recorded` + 1), missing, or on a Job not named as that attempt's.
pub fn unrecognized_job_deleted(job: &str, attempt: Option<i32>, recorded: i32) -> Note {
    let label = attempt.map_or_else(
        || "no attempt number".to_owned(),
        |a| format!("attempt label {a}"),
    );
    note(
        Kind::Warning,
        "UnrecognizedJobDeleted",
        format!(
            "deleting Job {job}: it is controlled by this GpuJob with {label}, but the operator never created it (attempts recorded: {recorded}; attempt k's Job is named <gpujob>-<k>); its pods never leave the operator's scheduling gate"
        ),
    )
}

/// A pod deleted because it waits at the operator's gate and is not the current
/// attempt's (`current`; `None`: the GpuJob has finished): it never ran.
pub fn stray_pod_deleted(pod: &str, attempt: Option<i32>, current: Option<i32>) -> Note {
    let (of, instead) = (of_attempt(attempt), instead_of(current));
    note(
        Kind::Warning,
        "StrayPodDeleted",
        format!(
            "deleting pod {pod}{of}: it waits at the operator's scheduling gate, but {instead}; it never ran"
        ),
    )
}

/// ` (attempt k)`, or nothing without a number.
fn of_attempt(attempt: Option<i32>) -> String {
    attempt.map_or_else(String::new, |a| format!(" (attempt {a})"))
}

/// Why nothing but attempt `current` may run (`None`: the GpuJob has finished).
fn instead_of(current: Option<i32>) -> String {
    match current {
        Some(c) => format!("attempt {c} is the current one"),
        None => "the GpuJob has finished".to_owned(),
    }
}

/// The Events for the change from `before` to `after`.
pub fn transitions(before: &GpuJobStatus, after: &GpuJobStatus) -> Vec<Note> {
    let mut out = lifecycle(before, after);
    out.extend(attempts(before, after));
    out.extend(outcome(before, after));
    out.extend(spec(before, after));
    out.extend(quota(before, after));
    out.extend(kueue(before, after));
    out.extend(devices(before, after));
    out
}

/// The alternative of `resources.devices` an attempt's pods got, once per attempt: the
/// Events keep what each attempt got, where status says only the latest.
fn devices(before: &GpuJobStatus, after: &GpuJobStatus) -> Option<Note> {
    if after.devices == before.devices {
        return None;
    }
    let got = after.devices.as_ref()?;
    Some(note(
        Kind::Normal,
        DEVICES_ALLOCATED,
        format!(
            "attempt {} got devices {}",
            got.attempt,
            got.alternatives.join(", ")
        ),
    ))
}

/// Kueue: an attempt queued (once per wait), admitted, or evicted by Kueue.
fn kueue(before: &GpuJobStatus, after: &GpuJobStatus) -> Vec<Note> {
    let mut out = Vec::new();
    let was_admitted = matches!(cond(before, ADMITTED), Some((ConditionStatus::True, _, _)));
    match cond(after, ADMITTED) {
        Some((ConditionStatus::True, _, message)) if !was_admitted => {
            out.push(note(Kind::Normal, "Admitted", message.to_owned()));
        }
        // Not a new attempt waiting to be handed over: the admitted one taken back.
        Some((ConditionStatus::False, reason, message)) if was_admitted && reason != "Queuing" => {
            out.push(note(
                Kind::Warning,
                "Evicted",
                format!(
                    "Kueue evicted the attempt ({reason}): {message}; it waits to be admitted again"
                ),
            ));
            return out;
        }
        _ => {}
    }
    let queued = |s: &GpuJobStatus| matches!(cond(s, READY), Some((_, r, _)) if r == QUEUED);
    if queued(after) && !queued(before) {
        let message = cond(after, READY).map(|(_, _, m)| m.to_owned());
        out.push(note(Kind::Normal, QUEUED, message.unwrap_or_default()));
    }
    out
}

/// A new run, a suspend, a resume.
fn lifecycle(before: &GpuJobStatus, after: &GpuJobStatus) -> Vec<Note> {
    let mut out = Vec::new();
    if after.run.unwrap_or(1) > before.run.unwrap_or(1) {
        out.push(note(
            Kind::Normal,
            RERUN,
            format!(
                "run {} started (request {}); its first attempt is {}",
                after.run.unwrap_or(1),
                after.rerun_token.as_deref().unwrap_or("-"),
                after.run_first_attempt.unwrap_or(1)
            ),
        ));
    }
    let was = cond(before, SUSPENDED).map(|(s, _, _)| *s);
    match (cond(after, SUSPENDED), was) {
        (Some((ConditionStatus::True, _, _)), w) if w != Some(ConditionStatus::True) => {
            let stopping = after
                .replacing_attempt
                .map(|k| format!("; attempt {k} is stopped (not counted as a failure)"))
                .unwrap_or_default();
            out.push(note(
                Kind::Normal,
                "Suspended",
                format!("suspended: no attempt starts until spec.suspend is false{stopping}"),
            ));
        }
        (Some((ConditionStatus::False, _, _)), Some(ConditionStatus::True)) => {
            out.push(note(
                Kind::Normal,
                "Resumed",
                "resumed: the next attempt starts",
            ));
        }
        _ => {}
    }
    out
}

/// Attempts: one failed, one started, one replaced, a wait before the next.
fn attempts(before: &GpuJobStatus, after: &GpuJobStatus) -> Vec<Note> {
    let mut out = Vec::new();
    if let Some(f) = &after.last_failure
        && before
            .last_failure
            .as_ref()
            .is_none_or(|b| b.attempt < f.attempt)
    {
        // A disruption is not the run's failure: said apart, so alerts on failed
        // attempts do not count preemptions.
        let reason = if f.counted {
            "AttemptFailed"
        } else {
            "AttemptDisrupted"
        };
        out.push(note(Kind::Warning, reason, f.message.clone()));
    }
    if after.attempts > before.attempts {
        let job = after.active_job.clone().unwrap_or_default();
        out.push(note(
            Kind::Normal,
            "AttemptStarted",
            format!("attempt {} started (Job {job})", after.attempts),
        ));
    }
    let suspended = matches!(cond(after, SUSPENDED), Some((ConditionStatus::True, _, _)));
    if let (Some(k), None, false) = (after.replacing_attempt, before.replacing_attempt, suspended) {
        out.push(note(
            Kind::Normal,
            "SpecChangeApplied",
            format!(
                "the spec changed (generation {}): attempt {k} is replaced by a new attempt",
                after.observed_generation.unwrap_or(0)
            ),
        ));
    }
    // Once per wait (not again when the wording changes): no node for the pods, a
    // multi-node attempt's Service or an attempt's ResourceClaimTemplate name taken, or an
    // old pod on a lost node.
    for reason in [
        UNSCHEDULABLE,
        SERVICE_NAME_CONFLICT,
        CLAIM_TEMPLATE_NAME_CONFLICT,
        POD_GROUP_NAME_CONFLICT,
        MANAGED_ELSEWHERE,
        WAITING_FOR_LOST_NODE,
    ] {
        let waiting = |s: &GpuJobStatus| matches!(cond(s, READY), Some((_, r, _)) if r == reason);
        if waiting(after) && !waiting(before) {
            let message = cond(after, READY).map(|(_, _, m)| m.to_owned());
            out.push(note(Kind::Warning, reason, message.unwrap_or_default()));
        }
    }
    if let Some((_, BACKING_OFF, message)) = cond(after, READY)
        && after.next_attempt_time != before.next_attempt_time
    {
        out.push(note(
            Kind::Normal,
            BACKING_OFF,
            format!("retrying: {message}"),
        ));
    }
    out
}

/// The final outcome.
fn outcome(before: &GpuJobStatus, after: &GpuJobStatus) -> Option<Note> {
    if after.phase == before.phase {
        return None;
    }
    match (after.phase, cond(after, READY)) {
        (Some(Phase::Succeeded), _) => {
            Some(note(Kind::Normal, "Succeeded", "the GpuJob succeeded"))
        }
        (Some(Phase::Failed), Some((_, _, message))) => {
            Some(note(Kind::Warning, "Failed", message.to_owned()))
        }
        _ => None,
    }
}

/// An invalid spec, and spec changes that wait.
fn spec(before: &GpuJobStatus, after: &GpuJobStatus) -> Vec<Note> {
    let mut out = Vec::new();
    let invalid = |r: Option<(&ConditionStatus, &str, &str)>| {
        r.filter(|(_, reason, _)| *reason == "InvalidSpec")
            .map(|(_, _, m)| m.to_owned())
    };
    if let Some(message) = invalid(cond(after, READY))
        && invalid(cond(before, READY)).as_deref() != Some(message.as_str())
    {
        out.push(note(Kind::Warning, "InvalidSpec", message));
    }
    if let Some((_, reason, message)) = cond(after, SPEC_CHANGE_PENDING)
        && cond(before, SPEC_CHANGE_PENDING).map(|(_, r, m)| (r, m)) != Some((reason, message))
    {
        let (kind, reason) = if reason == "InvalidSpec" {
            (Kind::Warning, "InvalidSpec")
        } else {
            (Kind::Normal, "SpecChangePending")
        };
        out.push(note(kind, reason, message.to_owned()));
    }
    out
}

/// The quota reservation: reserved, refused, released, and a release that is stuck.
fn quota(before: &GpuJobStatus, after: &GpuJobStatus) -> Vec<Note> {
    let mut out = Vec::new();
    match (cond(after, QUOTA_RESERVED), cond(before, QUOTA_RESERVED)) {
        (Some((ConditionStatus::True, _, message)), b)
            if !matches!(b, Some((ConditionStatus::True, _, _))) =>
        {
            out.push(note(Kind::Normal, "QuotaReserved", message.to_owned()));
        }
        (Some((ConditionStatus::False, reason, message)), b)
            if reason != "Released"
                && b.map(|(s, r, _)| (*s, r)) != Some((ConditionStatus::False, reason)) =>
        {
            out.push(note(
                Kind::Warning,
                QUOTA_REFUSED,
                format!("{reason}: {message}"),
            ));
        }
        _ => {}
    }
    if let (None, Some(id)) = (&after.reservation_id, &before.reservation_id) {
        out.push(note(
            Kind::Normal,
            "QuotaReleased",
            format!("GPU quota reservation {id} released"),
        ));
    }
    if let Some((ConditionStatus::True, _, message)) = cond(after, CLEANUP_STUCK)
        && !matches!(
            cond(before, CLEANUP_STUCK),
            Some((ConditionStatus::True, _, _))
        )
    {
        out.push(note(Kind::Warning, "CleanupStuck", message.to_owned()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{Condition, FailureRecord};

    fn with_cond(
        mut s: GpuJobStatus,
        t: &str,
        status: ConditionStatus,
        reason: &str,
        message: &str,
    ) -> GpuJobStatus {
        s.conditions.retain(|c| c.type_ != t);
        s.conditions.push(Condition {
            type_: t.into(),
            status,
            observed_generation: Some(1),
            last_transition_time: "2026-11-30T06:00:00Z".parse().unwrap(),
            reason: reason.into(),
            message: message.into(),
        });
        s
    }

    fn reasons(n: &[Note]) -> Vec<&'static str> {
        n.iter().map(|n| n.reason).collect()
    }

    /// Each Event of the change, with whether it records a state change.
    fn split(before: &GpuJobStatus, after: &GpuJobStatus) -> Vec<(&'static str, bool)> {
        transitions(before, after)
            .iter()
            .map(|n| (n.reason, n.records_state_change()))
            .collect()
    }

    #[test]
    fn state_changes_are_runs_attempts_suspensions_and_outcomes_not_waits() {
        let running = first_attempt_running();
        let mut failed = with_cond(
            running.clone(),
            READY,
            ConditionStatus::False,
            "BackingOff",
            "attempt 2 starts at T",
        );
        failed.next_attempt_time = Some("2026-11-30T06:00:10Z".parse().unwrap());
        failed.last_failure = Some(FailureRecord {
            attempt: 1,
            time: "2026-11-30T06:00:00Z".parse().unwrap(),
            exit_code: Some(3),
            reason: "Error".into(),
            message: "attempt 1 failed".into(),
            counted: true,
            rule: None,
        });
        assert_eq!(
            split(&running, &failed),
            vec![("AttemptFailed", true), ("BackingOff", false)]
        );
        let mut disrupted = failed.clone();
        if let Some(f) = disrupted.last_failure.as_mut() {
            f.counted = false;
        }
        assert_eq!(split(&running, &disrupted)[0], ("AttemptDisrupted", true));
        let mut second = running.clone();
        second.attempts = 2;
        assert_eq!(split(&failed, &second), vec![("AttemptStarted", true)]);

        let mut done = with_cond(running.clone(), READY, ConditionStatus::True, "Done", "");
        done.phase = Some(Phase::Succeeded);
        assert_eq!(split(&running, &done), vec![("Succeeded", true)]);
        let mut gave_up = with_cond(
            running.clone(),
            READY,
            ConditionStatus::False,
            "RetriesExhausted",
            "3 attempts failed",
        );
        gave_up.phase = Some(Phase::Failed);
        assert_eq!(split(&running, &gave_up), vec![("Failed", true)]);

        let suspended = with_cond(running.clone(), SUSPENDED, ConditionStatus::True, "", "");
        let resumed = with_cond(running.clone(), SUSPENDED, ConditionStatus::False, "", "");
        assert_eq!(split(&running, &suspended), vec![("Suspended", true)]);
        assert_eq!(split(&suspended, &resumed), vec![("Resumed", true)]);
        let mut rerun = running.clone();
        rerun.run = Some(2);
        assert_eq!(split(&running, &rerun), vec![("Rerun", true)]);
        let mut replacing = running.clone();
        replacing.replacing_attempt = Some(1);
        assert_eq!(
            split(&running, &replacing),
            vec![("SpecChangeApplied", true)]
        );

        let admitted = with_cond(running.clone(), ADMITTED, ConditionStatus::True, "", "in");
        let evicted = with_cond(
            admitted.clone(),
            ADMITTED,
            ConditionStatus::False,
            "Preempted",
            "by x",
        );
        assert_eq!(split(&running, &admitted), vec![("Admitted", false)]);
        assert_eq!(split(&admitted, &evicted), vec![("Evicted", true)]);

        // Waits and quota steps: the conditions say the same.
        for (reason, status) in [
            (QUEUED, READY),
            (UNSCHEDULABLE, READY),
            ("InvalidSpec", READY),
            ("InsufficientQuota", QUOTA_RESERVED),
        ] {
            let waiting = with_cond(running.clone(), status, ConditionStatus::False, reason, "m");
            let said = split(&running, &waiting);
            assert_eq!(said.len(), 1, "{said:?}");
            assert!(!said[0].1, "{said:?}");
        }
        assert!(!stray_pod_deleted("p", Some(1), Some(2)).records_state_change());
    }

    #[test]
    fn a_wait_for_a_lost_node_is_a_warning_once() {
        let pending = GpuJobStatus {
            attempts: 1,
            phase: Some(Phase::Pending),
            ..Default::default()
        };
        let stopping = with_cond(
            pending.clone(),
            READY,
            ConditionStatus::False,
            "OldAttemptStopping",
            "attempt 2 starts once ...",
        );
        let lost = |m: &str| {
            with_cond(
                pending.clone(),
                READY,
                ConditionStatus::False,
                WAITING_FOR_LOST_NODE,
                m,
            )
        };
        let n = transitions(&stopping, &lost("node gpu-7 is not Ready"));
        assert_eq!(reasons(&n), vec![WAITING_FOR_LOST_NODE]);
        assert_eq!(n[0].kind, Kind::Warning);
        assert!(n[0].note.contains("gpu-7"), "{}", n[0].note);
        // Not again while it waits, though the words change.
        let n = transitions(
            &lost("node gpu-7 is not Ready"),
            &lost("node gpu-7 is gone"),
        );
        assert!(n.is_empty(), "{n:?}");
    }

    #[test]
    fn nothing_changed_nothing_said() {
        let s = with_cond(
            GpuJobStatus {
                attempts: 1,
                phase: Some(Phase::Running),
                ..Default::default()
            },
            READY,
            ConditionStatus::False,
            "JobRunning",
            "x",
        );
        assert!(transitions(&s, &s).is_empty());
    }

    /// Attempt 1 (Job t-1) runs.
    fn first_attempt_running() -> GpuJobStatus {
        with_cond(
            GpuJobStatus {
                attempts: 1,
                phase: Some(Phase::Running),
                active_job: Some("t-1".into()),
                ..Default::default()
            },
            READY,
            ConditionStatus::False,
            "JobRunning",
            "",
        )
    }

    #[test]
    fn a_failed_attempt_then_backoff_then_the_next_attempt() {
        let running = first_attempt_running();
        let mut backing = with_cond(
            running.clone(),
            READY,
            ConditionStatus::False,
            "BackingOff",
            "attempt 2 starts at T",
        );
        backing.phase = Some(Phase::Pending);
        backing.next_attempt_time = Some("2026-11-30T06:00:10Z".parse().unwrap());
        backing.last_failure = Some(FailureRecord {
            attempt: 1,
            time: "2026-11-30T06:00:00Z".parse().unwrap(),
            exit_code: Some(3),
            reason: "Error".into(),
            message: "attempt 1 failed: exit code 3 (Error)".into(),
            counted: true,
            rule: None,
        });
        let n = transitions(&running, &backing);
        assert_eq!(reasons(&n), vec!["AttemptFailed", "BackingOff"]);
        let mut disrupted = backing.clone();
        if let Some(f) = disrupted.last_failure.as_mut() {
            f.counted = false;
        }
        let n = transitions(&running, &disrupted);
        assert_eq!(reasons(&n), vec!["AttemptDisrupted", "BackingOff"]);
        assert_eq!(n[0].kind, Kind::Warning);
        assert!(n[0].note.contains("exit code 3"));
        let mut second = with_cond(
            backing.clone(),
            READY,
            ConditionStatus::False,
            "JobRunning",
            "",
        );
        second.attempts = 2;
        second.active_job = Some("t-2".into());
        second.next_attempt_time = None;
        second.phase = Some(Phase::Running);
        assert_eq!(
            reasons(&transitions(&backing, &second)),
            vec!["AttemptStarted"]
        );
    }

    #[test]
    fn final_phases_quota_and_cleanup() {
        let base = GpuJobStatus {
            phase: Some(Phase::Running),
            ..Default::default()
        };
        let mut done = with_cond(base.clone(), READY, ConditionStatus::True, "Succeeded", "");
        done.phase = Some(Phase::Succeeded);
        assert_eq!(reasons(&transitions(&base, &done)), vec!["Succeeded"]);

        let refused = with_cond(
            base.clone(),
            QUOTA_RESERVED,
            ConditionStatus::False,
            "InsufficientQuota",
            "8 GPUs requested, 2 free",
        );
        let n = transitions(&base, &refused);
        assert_eq!(reasons(&n), vec!["QuotaRefused"]);
        assert_eq!(n[0].kind, Kind::Warning);
        assert!(
            transitions(&refused, &refused).is_empty(),
            "one Event per transition, not per retry"
        );

        let mut granted = with_cond(
            refused.clone(),
            QUOTA_RESERVED,
            ConditionStatus::True,
            "Reserved",
            "reservation r-1",
        );
        granted.reservation_id = Some("r-1".into());
        assert_eq!(
            reasons(&transitions(&refused, &granted)),
            vec!["QuotaReserved"]
        );
        let mut released = with_cond(
            granted.clone(),
            QUOTA_RESERVED,
            ConditionStatus::False,
            "Released",
            "",
        );
        released.reservation_id = None;
        assert_eq!(
            reasons(&transitions(&granted, &released)),
            vec!["QuotaReleased"]
        );

        let stuck = with_cond(
            granted.clone(),
            CLEANUP_STUCK,
            ConditionStatus::True,
            "ReleaseFailing",
            "503",
        );
        assert_eq!(
            reasons(&transitions(&granted, &stuck)),
            vec!["CleanupStuck"]
        );
    }

    #[test]
    fn spec_changes_and_invalid_specs() {
        let base = GpuJobStatus {
            attempts: 1,
            phase: Some(Phase::Running),
            ..Default::default()
        };
        let mut replacing = base.clone();
        replacing.replacing_attempt = Some(1);
        assert_eq!(
            reasons(&transitions(&base, &replacing)),
            vec!["SpecChangeApplied"]
        );
        let waiting = with_cond(
            base.clone(),
            SPEC_CHANGE_PENDING,
            ConditionStatus::True,
            "OnNextAttempt",
            "m",
        );
        assert_eq!(
            reasons(&transitions(&base, &waiting)),
            vec!["SpecChangePending"]
        );
        let invalid = with_cond(
            base.clone(),
            READY,
            ConditionStatus::False,
            "InvalidSpec",
            "spec.image: bad",
        );
        let n = transitions(&base, &invalid);
        assert_eq!((n[0].reason, n[0].kind), ("InvalidSpec", Kind::Warning));
        assert!(transitions(&invalid, &invalid).is_empty());
    }

    #[test]
    fn kueue_queues_admits_and_evicts_an_attempt_once_each() {
        let base = GpuJobStatus {
            attempts: 1,
            phase: Some(Phase::Pending),
            ..Default::default()
        };
        let handed = with_cond(
            base.clone(),
            ADMITTED,
            ConditionStatus::False,
            "Queuing",
            "attempt 1 is handed to Kueue LocalQueue team once it may start",
        );
        let queued = with_cond(
            with_cond(
                handed.clone(),
                ADMITTED,
                ConditionStatus::False,
                "Pending",
                "full",
            ),
            READY,
            ConditionStatus::False,
            QUEUED,
            "attempt 1 waits in Kueue LocalQueue team: full",
        );
        assert!(transitions(&base, &handed).is_empty());
        assert_eq!(reasons(&transitions(&handed, &queued)), vec![QUEUED]);
        assert!(transitions(&queued, &queued).is_empty(), "once per wait");
        let mut admitted = with_cond(
            with_cond(
                queued.clone(),
                ADMITTED,
                ConditionStatus::True,
                "Admitted",
                "in",
            ),
            READY,
            ConditionStatus::False,
            "JobRunning",
            "attempt 1 runs",
        );
        admitted.phase = Some(Phase::Running);
        let n = transitions(&queued, &admitted);
        assert_eq!((n[0].reason, n[0].kind), ("Admitted", Kind::Normal));
        assert_eq!(n.len(), 1, "{n:?}");
        let evicted = with_cond(
            with_cond(
                base.clone(),
                ADMITTED,
                ConditionStatus::False,
                "Preempted",
                "by x",
            ),
            READY,
            ConditionStatus::False,
            QUEUED,
            "attempt 1 waits in Kueue LocalQueue team: by x",
        );
        let n = transitions(&admitted, &evicted);
        assert_eq!(reasons(&n), vec!["Evicted"], "not Queued as well");
        assert_eq!(n[0].kind, Kind::Warning);
        assert!(
            n[0].note.contains("Preempted") && n[0].note.contains("by x"),
            "{n:?}"
        );
        // The next attempt handed over after an admitted one ended: no eviction.
        let next = with_cond(
            admitted.clone(),
            ADMITTED,
            ConditionStatus::False,
            "Queuing",
            "attempt 2 is handed to Kueue LocalQueue team once it may start",
        );
        assert!(!reasons(&transitions(&admitted, &next)).contains(&"Evicted"));
    }
}
