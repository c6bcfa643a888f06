//! A GpuJob's life around its attempts, for the people who run it: terminal conditions
//! to wait on, suspend and resume, a rerun of a finished GpuJob, and deletion once its
//! time to live after finishing is over.

use std::time::Duration;

use jiff::SignedDuration;

use super::{Action, Planner};
use crate::api::{ANNOTATION_RERUN, ConditionStatus, Phase};
use crate::status::{COMPLETE, FAILED, READY, RERUN, SUSPENDED, remove_condition, set_condition};

impl Planner<'_, '_> {
    /// A new value of the rerun annotation, not yet answered by a run.
    pub(super) fn rerun_requested(&self) -> Option<String> {
        let token = self
            .gj
            .metadata
            .annotations
            .as_ref()?
            .get(ANNOTATION_RERUN)?
            .trim();
        (!token.is_empty() && Some(token) != self.current.rerun_token.as_deref())
            .then(|| token.to_owned())
    }

    /// A finished GpuJob starts run n + 1: a fresh series of attempts whose numbers
    /// continue (Job names stay unique), with no failures counted yet. Recorded before
    /// anything of the new run exists, so a crash in between cannot mistake the last
    /// run's Jobs for the new run's.
    pub(super) fn start_new_run(&mut self, token: String) {
        // At the end of the numbers (only a status written by hand gets there), the
        // run starts nothing: its first attempt stays past the last.
        let first = self.current.attempts.max(0).saturating_add(1);
        let run = self.current.run.unwrap_or(1).saturating_add(1);
        let (generation, now) = (self.generation, self.now);
        self.checkpoint(|s| {
            s.run = Some(run);
            s.run_first_attempt = Some(first);
            s.rerun_token = Some(token.clone());
            s.failures = 0;
            s.phase = Some(Phase::Pending);
            s.active_job = None;
            s.next_attempt_time = None;
            s.completion_time = None;
            s.observed_generation = generation;
            remove_condition(&mut s.conditions, COMPLETE);
            remove_condition(&mut s.conditions, FAILED);
            set_condition(
                &mut s.conditions,
                READY,
                ConditionStatus::False,
                RERUN,
                format!(
                    "run {run} requested ({ANNOTATION_RERUN}: {token}); attempt {first} starts"
                ),
                generation,
                now,
            );
        });
        // What follows is planned from the status just recorded.
        self.current = self.recorded.clone();
    }

    /// `Suspended` says whether `spec.suspend` holds the GpuJob (True), or held it and
    /// let go (False, Resumed); its transition time is when.
    pub(super) fn suspension(&mut self) {
        let was = self
            .current
            .condition(SUSPENDED)
            .is_some_and(|c| c.status == ConditionStatus::True);
        if self.gj.spec.suspend {
            self.condition(
                SUSPENDED,
                ConditionStatus::True,
                "Suspended",
                "spec.suspend is true: no attempt runs".to_owned(),
            );
        } else if was {
            self.condition(
                SUSPENDED,
                ConditionStatus::False,
                "Resumed",
                "spec.suspend is false: attempts run again".to_owned(),
            );
        }
    }

    /// `Complete` or `Failed`, set once the GpuJob reaches that phase (also for
    /// GpuJobs that finished before these conditions existed), and never changed after.
    pub(super) fn terminal_conditions(&mut self) {
        let (type_, reason) = match self.next.phase {
            Some(Phase::Succeeded) => (COMPLETE, "Succeeded"),
            Some(Phase::Failed) => (FAILED, "RetriesExhausted"),
            _ => return,
        };
        if self.next.condition(type_).is_some() {
            return;
        }
        let message = self
            .next
            .condition(READY)
            .map(|c| c.message.clone())
            .unwrap_or_default();
        self.condition(type_, ConditionStatus::True, reason, message);
        remove_condition(&mut self.next.conditions, SUSPENDED);
    }

    /// A finished GpuJob is deleted once its time to live after finishing is over
    /// (`ttlSecondsAfterFinished`, else the operator's default); until then, looked at
    /// again when it is. Only once everything else is done and recorded (a quota
    /// release, the finalizer's removal, the final status with `Complete`/`Failed`), so
    /// a client waiting for the end sees it, and the delete's resourceVersion holds.
    pub(super) fn expire_after_ttl(&mut self) {
        if !self.next.phase.is_some_and(Phase::is_final) {
            return;
        }
        let settled = self.actions.is_empty() && self.next == self.current;
        let ttl = self
            .gj
            .spec
            .ttl_seconds_after_finished
            .map(|s| Duration::from_secs(u64::try_from(s).unwrap_or(0)))
            .or(self.settings.default_ttl);
        let (Some(ttl), Some(done)) = (ttl, self.next.completion_time) else {
            return;
        };
        let expires = done
            .saturating_add(SignedDuration::try_from(ttl).unwrap_or(SignedDuration::MAX))
            .unwrap_or(done);
        if self.now < expires {
            if let Ok(left) = Duration::try_from(self.now.duration_until(expires)) {
                self.requeue_within(left);
            }
            return;
        }
        if !settled {
            // What this plan writes comes back as an event; delete then.
            return;
        }
        let m = &self.gj.metadata;
        if let (Some(uid), Some(rv)) = (&m.uid, &m.resource_version) {
            self.actions.push(Action::DeleteGpuJob {
                uid: uid.clone(),
                resource_version: rv.clone(),
            });
        }
    }
}
