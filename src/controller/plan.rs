//! Pure decisions: `(GpuJob, its Jobs, the failed pod, now) -> Plan`. No client here;
//! everything interesting (attempt numbering, retry timing, spec changes, phase and
//! conditions) is decided and unit-tested without a cluster.

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::batch::v1::Job;

use super::job::{attempt_of, desired_job, generation_of, job_name};
use super::status::{READY, remove_condition, seconds, set_condition};
use super::validate::validate;
use crate::api::{ConditionStatus, FailureRecord, GpuJob, GpuJobStatus, Phase, UpdatePolicy};

/// Condition: a spec change waits for the next attempt (OnNextAttempt), or could not be
/// applied (the new spec is invalid).
pub const SPEC_CHANGE_PENDING: &str = "SpecChangePending";

/// Operator settings the plan depends on.
#[derive(Debug, Clone)]
pub struct PlanSettings {
    /// Backoff after the first failure; doubles per failure.
    pub backoff_base: Duration,
    /// Longest backoff.
    pub backoff_max: Duration,
    /// Jobs of this many most recent attempts are kept for debugging; older ones deleted.
    pub keep_jobs: i32,
    /// Most GPUs one GpuJob may ask for (semantic validation).
    pub max_gpus: i32,
}

impl Default for PlanSettings {
    fn default() -> PlanSettings {
        // As the Job controller does for pod failures: 10 s doubling to 6 min.
        PlanSettings {
            backoff_base: Duration::from_secs(10),
            backoff_max: Duration::from_secs(360),
            keep_jobs: 3,
            max_gpus: 64,
        }
    }
}

/// How a failed attempt's container ended, read from its pod.
#[derive(Debug, Clone, PartialEq)]
pub struct Termination {
    pub attempt: i32,
    pub exit_code: Option<i32>,
    pub reason: String,
    pub message: String,
}

/// What the operator sees of one GpuJob.
#[derive(Debug)]
pub struct Observed<'a> {
    pub gpujob: &'a GpuJob,
    /// Jobs controlled by this GpuJob, authoritative: a Job missing here is gone.
    pub jobs: Vec<&'a Job>,
    /// The pod outcome of the newest failed Job, when its failure is not recorded yet.
    pub termination: Option<Termination>,
    /// The API server refused the Job of this attempt; plan as if it was not started.
    pub refused: Option<Refusal>,
    /// Attempts may start only once a quota reservation is recorded in status.
    pub quota_required: bool,
    pub now: Timestamp,
}

/// A Job create the API server refused for a reason that retrying cannot fix.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    pub attempt: i32,
    /// `InvalidSpec` (422: waits for a spec change) or `JobNameConflict`.
    pub reason: &'static str,
    pub message: String,
}

/// Condition reason for a spec the operator cannot run; it waits for a spec change.
pub const INVALID_SPEC: &str = "InvalidSpec";

#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Write this status before the actions that follow (they depend on it being
    /// recorded: a replaced attempt must never be taken for a failed one after a crash).
    RecordStatus(Box<GpuJobStatus>),
    /// Create the Job of `attempt` (stable name: a second create is refused).
    CreateJob { attempt: i32, job: Box<Job> },
    /// Delete a Job, with uid and resourceVersion preconditions. `foreground`: the Job
    /// stays (deleting) until its pods are gone, so a replacement never overlaps them.
    DeleteJob {
        name: String,
        uid: String,
        resource_version: String,
        foreground: bool,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// In order; the status below holds only once they all succeeded.
    pub actions: Vec<Action>,
    pub status: GpuJobStatus,
    /// Look again after this long even without an event (backoff ends).
    pub requeue_after: Option<Duration>,
}

/// What a Job's conditions say.
#[derive(Debug, Clone, PartialEq)]
pub enum JobState {
    Active,
    Complete {
        time: Option<Timestamp>,
    },
    Failed {
        time: Option<Timestamp>,
        reason: String,
        message: String,
    },
}

pub fn job_state(job: &Job) -> JobState {
    let status = job.status.as_ref();
    let conditions = status
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten();
    for c in conditions {
        if c.status != "True" {
            continue;
        }
        let time = c.last_transition_time.as_ref().map(|t| t.0);
        match c.type_.as_str() {
            "Complete" => {
                let time = status
                    .and_then(|s| s.completion_time.as_ref())
                    .map(|t| t.0)
                    .or(time);
                return JobState::Complete { time };
            }
            "Failed" => {
                return JobState::Failed {
                    time,
                    reason: c.reason.clone().unwrap_or_default(),
                    message: c.message.clone().unwrap_or_default(),
                };
            }
            _ => {}
        }
    }
    JobState::Active
}

/// Backoff before the attempt that follows failure number `failures` (from 1).
pub fn backoff(settings: &PlanSettings, failures: i32) -> Duration {
    let exp = u32::try_from(failures.saturating_sub(1))
        .unwrap_or(0)
        .min(32);
    settings
        .backoff_base
        .checked_mul(1u32 << exp.min(31))
        .unwrap_or(settings.backoff_max)
        .min(settings.backoff_max)
}

pub fn plan(obs: &Observed<'_>, settings: &PlanSettings) -> Plan {
    let gj = obs.gpujob;
    let now = seconds(obs.now);
    let generation = gj.metadata.generation;
    let current = gj.status.clone().unwrap_or_default();
    if gj.metadata.deletion_timestamp.is_some() {
        // Being deleted: the garbage collector takes the Jobs; start nothing.
        return Plan {
            actions: Vec::new(),
            status: current,
            requeue_after: None,
        };
    }
    let mut p = Planner {
        gj,
        obs,
        settings,
        now,
        generation,
        name: gj.metadata.name.clone().unwrap_or_default(),
        next: GpuJobStatus {
            observed_generation: generation,
            ..current.clone()
        },
        current,
        actions: Vec::new(),
        requeue_after: None,
        by_attempt: obs
            .jobs
            .iter()
            .filter_map(|j| attempt_of(j).map(|a| (a, *j)))
            .collect(),
        invalid: None,
    };
    p.run();
    Plan {
        actions: p.actions,
        status: p.next,
        requeue_after: p.requeue_after,
    }
}

/// One planning pass; its fields are what every step reads and writes.
struct Planner<'a, 'o> {
    gj: &'a GpuJob,
    obs: &'a Observed<'o>,
    settings: &'a PlanSettings,
    now: Timestamp,
    generation: Option<i64>,
    name: String,
    current: GpuJobStatus,
    next: GpuJobStatus,
    actions: Vec<Action>,
    requeue_after: Option<Duration>,
    by_attempt: BTreeMap<i32, &'a Job>,
    /// Why no attempt may start for this generation (`InvalidSpec` and the field), if so.
    invalid: Option<(&'static str, String)>,
}

impl Planner<'_, '_> {
    fn ready(&mut self, status: ConditionStatus, reason: &str, message: String) {
        set_condition(
            &mut self.next.conditions,
            READY,
            status,
            reason,
            message,
            self.generation,
            self.now,
        );
    }

    fn run(&mut self) {
        let final_ = self.current.phase.is_some_and(Phase::is_final);
        self.invalid = self.invalid_reason();
        let newest_job = self.by_attempt.keys().next_back().copied().unwrap_or(0);
        let mut attempt = self.current.attempts.max(newest_job);

        if final_ {
            // Final: record that this generation was seen (also a spec change), start
            // nothing, and let a pending spec change go: there is no next attempt.
            if let Some(c) = self.next.conditions.iter_mut().find(|c| c.type_ == READY) {
                c.observed_generation = self.generation;
            }
            remove_condition(&mut self.next.conditions, SPEC_CHANGE_PENDING);
        } else if attempt == 0 {
            self.try_start(1);
            attempt = self.next.attempts.max(attempt);
        } else {
            attempt = self.follow(attempt);
        }
        self.collect_old_jobs(attempt);
    }

    /// Why attempts cannot start: the spec fails validation, or the API server refused
    /// this generation's Job already (recorded in Ready), or just now.
    fn invalid_reason(&self) -> Option<(&'static str, String)> {
        if let Err(e) = validate(&self.gj.spec, self.settings.max_gpus) {
            return Some((INVALID_SPEC, format!("invalid spec: {e}")));
        }
        let refused_before = self.current.conditions.iter().find(|c| {
            c.type_ == READY && c.reason == INVALID_SPEC && c.observed_generation == self.generation
        });
        if let Some(c) = refused_before {
            return Some((INVALID_SPEC, c.message.clone()));
        }
        None
    }

    /// Starts `attempt` unless something forbids it now; then the GpuJob waits, Pending.
    fn try_start(&mut self, attempt: i32) -> bool {
        let blocker = if let Some(r) = self.obs.refused.as_ref().filter(|r| r.attempt == attempt) {
            Some((r.reason, r.message.clone()))
        } else if let Some(inv) = &self.invalid {
            Some(inv.clone())
        } else if self.obs.quota_required && self.current.reservation_id.is_none() {
            Some((
                "QuotaPending",
                "waiting for a GPU quota reservation".to_owned(),
            ))
        } else {
            None
        };
        if let Some((reason, message)) = blocker {
            self.next.phase = Some(Phase::Pending);
            self.next.active_job = None;
            self.next.next_attempt_time = None;
            if reason == INVALID_SPEC || reason == "JobNameConflict" {
                self.next.last_error = Some(message.clone());
            }
            let message = match &self.current.last_failure {
                Some(f) if f.attempt == attempt - 1 => format!("{}; {message}", f.message),
                _ => message,
            };
            self.ready(ConditionStatus::False, reason, message);
            return false;
        }
        let job = desired_job(self.gj, attempt);
        self.next.attempts = attempt;
        self.next.phase = Some(Phase::Running);
        self.next.active_job = job.metadata.name.clone();
        self.next.next_attempt_time = None;
        self.next.replacing_attempt = None;
        self.next.start_time = self.next.start_time.or(Some(self.now));
        remove_condition(&mut self.next.conditions, SPEC_CHANGE_PENDING);
        self.actions.push(Action::CreateJob {
            attempt,
            job: Box::new(job),
        });
        self.ready(
            ConditionStatus::False,
            "JobRunning",
            running_message(&self.name, attempt),
        );
        true
    }

    /// Follows attempt `k`, which has started; returns the newest attempt afterwards.
    fn follow(&mut self, k: i32) -> i32 {
        // A status that lags the Jobs (a restart between a create and the status
        // write) catches up: attempt k exists, so k - 1 ended, and if it failed its
        // failure is recorded now.
        self.next.attempts = k;
        self.next.start_time = self.next.start_time.or(Some(self.now));
        if let Some(prev) = self.by_attempt.get(&(k - 1))
            && let JobState::Failed {
                time,
                reason,
                message,
            } = job_state(prev)
            && self
                .current
                .last_failure
                .as_ref()
                .is_none_or(|f| f.attempt < k - 1)
            && self.current.replacing_attempt != Some(k - 1)
        {
            let time = seconds(time.unwrap_or(self.now));
            let record = failure_record(
                k - 1,
                time,
                &reason,
                &message,
                self.obs.termination.as_ref(),
            );
            self.record_failure(record);
        }

        let job = self.by_attempt.get(&k).copied();
        if self.current.replacing_attempt == Some(k) {
            return self.replace(k, job);
        }
        match job.map(job_state) {
            Some(JobState::Active) => {
                self.running(k, job);
                k
            }
            Some(JobState::Complete { time }) => {
                self.next.phase = Some(Phase::Succeeded);
                self.next.active_job = None;
                self.next.next_attempt_time = None;
                self.next.completion_time = Some(seconds(time.unwrap_or(self.now)));
                remove_condition(&mut self.next.conditions, SPEC_CHANGE_PENDING);
                self.ready(
                    ConditionStatus::True,
                    "Succeeded",
                    format!("attempt {k} succeeded"),
                );
                k
            }
            Some(JobState::Failed {
                time,
                reason,
                message,
            }) => {
                let time = seconds(time.unwrap_or(self.now));
                let record = self.recorded_or(k, || {
                    failure_record(k, time, &reason, &message, self.obs.termination.as_ref())
                });
                self.failed(k, record)
            }
            None => {
                let record = self.recorded_or(k, || FailureRecord {
                    attempt: k,
                    time: seconds(self.obs.now),
                    exit_code: None,
                    reason: "JobDeleted".to_owned(),
                    message: format!(
                        "attempt {k} failed: its Job {} was deleted before it finished",
                        job_name(&self.name, k)
                    ),
                });
                self.failed(k, record)
            }
        }
    }

    /// Attempt `k` runs. A spec change applies now (Recreate), or waits (OnNextAttempt,
    /// or an invalid new spec).
    fn running(&mut self, k: i32, job: Option<&Job>) {
        self.next.phase = Some(Phase::Running);
        self.next.active_job = Some(job_name(&self.name, k));
        self.next.next_attempt_time = None;
        self.ready(
            ConditionStatus::False,
            "JobRunning",
            running_message(&self.name, k),
        );
        let built_from = job.and_then(generation_of);
        let changed = matches!((built_from, self.generation), (Some(b), Some(g)) if b < g);
        if !changed {
            remove_condition(&mut self.next.conditions, SPEC_CHANGE_PENDING);
            return;
        }
        let (reason, message) = match (&self.invalid, self.gj.spec.update_policy) {
            (Some((_, why)), _) => (INVALID_SPEC, format!("the change cannot be applied: {why}")),
            (None, UpdatePolicy::OnNextAttempt) => (
                "OnNextAttempt",
                format!(
                    "attempt {k} keeps its spec; the change applies to the next attempt, if any"
                ),
            ),
            (None, UpdatePolicy::Recreate) => {
                // Record the replacement before deleting, so that a crash in between
                // never counts the deleted attempt as failed.
                let mut marked = self.current.clone();
                marked.replacing_attempt = Some(k);
                self.actions.push(Action::RecordStatus(Box::new(marked)));
                self.next.replacing_attempt = Some(k);
                self.delete_for_replacement(job);
                self.next.phase = Some(Phase::Pending);
                self.next.active_job = None;
                let message = format!("attempt {k} is being replaced: the spec changed");
                self.ready(ConditionStatus::False, "Replacing", message);
                remove_condition(&mut self.next.conditions, SPEC_CHANGE_PENDING);
                return;
            }
        };
        set_condition(
            &mut self.next.conditions,
            SPEC_CHANGE_PENDING,
            ConditionStatus::True,
            reason,
            message,
            self.generation,
            self.now,
        );
    }

    fn delete_for_replacement(&mut self, job: Option<&Job>) {
        let job = job.filter(|j| j.metadata.deletion_timestamp.is_none());
        self.actions
            .extend(job.and_then(|j| delete_action(j, true)));
    }

    /// Attempt `k` is being replaced after a spec change: once its Job (and pods) are
    /// gone, the next attempt starts on the new spec. Not a failure.
    fn replace(&mut self, k: i32, job: Option<&Job>) -> i32 {
        match job {
            Some(j) => {
                // Still there (deleting, or the delete did not happen yet).
                self.delete_for_replacement(Some(j));
                self.next.phase = Some(Phase::Pending);
                self.next.active_job = None;
                let message = format!("attempt {k} is being replaced: the spec changed");
                self.ready(ConditionStatus::False, "Replacing", message);
                k
            }
            None => {
                if self.try_start(k + 1) {
                    k + 1
                } else {
                    k
                }
            }
        }
    }

    fn record_failure(&mut self, record: FailureRecord) {
        let new = self
            .next
            .last_failure
            .as_ref()
            .is_none_or(|f| f.attempt < record.attempt);
        if new {
            self.next.failures += 1;
        }
        self.next.last_error = Some(record.message.clone());
        self.next.last_failure = Some(record);
    }

    /// The failure already recorded for `attempt`, or a new record.
    fn recorded_or(&self, attempt: i32, new: impl FnOnce() -> FailureRecord) -> FailureRecord {
        match &self.current.last_failure {
            Some(f) if f.attempt == attempt => f.clone(),
            _ => new(),
        }
    }

    /// Attempt `k` failed: retry after backoff, or fail for good.
    fn failed(&mut self, k: i32, failure: FailureRecord) -> i32 {
        self.record_failure(failure.clone());
        self.next.active_job = None;
        let failures = self.next.failures;
        if failures > self.gj.spec.max_retries {
            self.next.phase = Some(Phase::Failed);
            self.next.next_attempt_time = None;
            self.next.completion_time = Some(failure.time);
            remove_condition(&mut self.next.conditions, SPEC_CHANGE_PENDING);
            let message = format!(
                "{}; no retries left ({failures} attempts failed, maxRetries {})",
                failure.message, self.gj.spec.max_retries
            );
            self.ready(ConditionStatus::False, "RetriesExhausted", message);
            return k;
        }
        let wait = backoff(self.settings, failures);
        let at = failure
            .time
            .saturating_add(SignedDuration::try_from(wait).unwrap_or(SignedDuration::MAX))
            .unwrap_or(failure.time);
        if self.now >= at {
            return if self.try_start(k + 1) { k + 1 } else { k };
        }
        self.next.phase = Some(Phase::Pending);
        self.next.next_attempt_time = Some(at);
        let message = format!("{}; attempt {} starts at {at}", failure.message, k + 1);
        self.ready(ConditionStatus::False, "BackingOff", message);
        self.requeue_after = Duration::try_from(self.now.duration_until(at)).ok();
        k
    }

    /// Old attempts: keep the newest `keep_jobs` for debugging, delete the rest.
    fn collect_old_jobs(&mut self, attempt: i32) {
        let oldest_kept = attempt - self.settings.keep_jobs.max(1) + 1;
        for (a, job) in &self.by_attempt {
            if *a >= oldest_kept || job.metadata.deletion_timestamp.is_some() {
                continue;
            }
            self.actions.extend(delete_action(job, false));
        }
    }
}

/// Deleting `job` with uid and resourceVersion preconditions.
fn delete_action(job: &Job, foreground: bool) -> Option<Action> {
    let m = &job.metadata;
    Some(Action::DeleteJob {
        name: m.name.clone()?,
        uid: m.uid.clone()?,
        resource_version: m.resource_version.clone()?,
        foreground,
    })
}

/// The same words whether the attempt was just started or found running, so that
/// looking again changes nothing (and writes nothing).
fn running_message(name: &str, attempt: i32) -> String {
    format!(
        "attempt {attempt} is running (Job {})",
        job_name(name, attempt)
    )
}

fn failure_record(
    attempt: i32,
    time: Timestamp,
    job_reason: &str,
    job_message: &str,
    pod: Option<&Termination>,
) -> FailureRecord {
    let pod = pod.filter(|t| t.attempt == attempt);
    let (exit_code, reason) = match pod {
        Some(t) => (t.exit_code, t.reason.clone()),
        None => (
            None,
            if job_reason.is_empty() {
                "Failed".to_owned()
            } else {
                job_reason.to_owned()
            },
        ),
    };
    let detail = match (pod, job_reason) {
        (Some(t), _) if t.exit_code.is_some() => {
            let code = t.exit_code.unwrap_or_default();
            let extra = if t.message.is_empty() {
                String::new()
            } else {
                format!(": {}", t.message)
            };
            format!("exit code {code} ({}){extra}", t.reason)
        }
        (_, "DeadlineExceeded") => "it ran longer than activeDeadlineSeconds".to_owned(),
        _ if !job_message.is_empty() => format!("{job_reason}: {job_message}"),
        _ => reason.clone(),
    };
    FailureRecord {
        attempt,
        time,
        exit_code,
        reason,
        message: format!("attempt {attempt} failed: {detail}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{ConditionStatus, GpuJobSpec};
    use k8s_openapi::api::batch::v1::{JobCondition, JobStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    const T0: &str = "2026-11-30T06:00:00Z";

    fn gpujob(max_retries: i32) -> GpuJob {
        let mut g = GpuJob::new(
            "train",
            GpuJobSpec {
                image: "img".into(),
                command: vec![],
                args: vec![],
                env: vec![],
                gpus: 1,
                max_retries,
                active_deadline_seconds: None,
                node_selector: Default::default(),
                service_account_name: None,
                update_policy: Default::default(),
            },
        );
        g.metadata.namespace = Some("ns".into());
        g.metadata.uid = Some("uid-1".into());
        g.metadata.generation = Some(1);
        g
    }

    fn settings() -> PlanSettings {
        PlanSettings {
            backoff_base: Duration::from_secs(10),
            backoff_max: Duration::from_secs(60),
            keep_jobs: 2,
            max_gpus: 8,
        }
    }

    fn job(g: &GpuJob, attempt: i32, state: Option<(&str, &str, &str)>) -> Job {
        let mut j = desired_job(g, attempt);
        j.metadata.uid = Some(format!("job-uid-{attempt}"));
        j.metadata.resource_version = Some(format!("{attempt}00"));
        if let Some((type_, reason, time)) = state {
            j.status = Some(JobStatus {
                conditions: Some(vec![JobCondition {
                    type_: type_.into(),
                    status: "True".into(),
                    reason: Some(reason.into()),
                    message: Some("Job has reached the specified backoff limit".into()),
                    last_transition_time: Some(Time(t(time))),
                    ..Default::default()
                }]),
                ..Default::default()
            });
        }
        j
    }

    fn run(g: &GpuJob, jobs: &[Job], termination: Option<Termination>, now: &str) -> Plan {
        plan(
            &Observed {
                gpujob: g,
                jobs: jobs.iter().collect(),
                termination,
                refused: None,
                quota_required: false,
                now: t(now),
            },
            &settings(),
        )
    }

    fn ready(p: &Plan) -> (ConditionStatus, String) {
        let c = p.status.condition(READY).unwrap();
        (c.status, c.reason.clone())
    }

    fn creates(p: &Plan) -> Vec<i32> {
        p.actions
            .iter()
            .filter_map(|a| match a {
                Action::CreateJob { attempt, .. } => Some(*attempt),
                _ => None,
            })
            .collect()
    }

    /// `g` with a status saying `attempts` started, `failures` failed, one running.
    fn running(g: &GpuJob, attempts: i32, failures: i32) -> GpuJob {
        let mut g = g.clone();
        // A consistent status: the last of `failures` failed attempts is recorded.
        let last_failure = (failures > 0).then(|| FailureRecord {
            attempt: attempts - 1,
            time: t(T0),
            exit_code: Some(1),
            reason: "Error".into(),
            message: format!("attempt {} failed: exit code 1 (Error)", attempts - 1),
        });
        g.status = Some(GpuJobStatus {
            attempts,
            failures,
            last_failure,
            phase: Some(Phase::Running),
            ..Default::default()
        });
        g
    }

    fn with_status(mut g: GpuJob, p: &Plan) -> GpuJob {
        g.status = Some(p.status.clone());
        g
    }

    fn exit(attempt: i32, code: i32) -> Option<Termination> {
        Some(Termination {
            attempt,
            exit_code: Some(code),
            reason: "Error".into(),
            message: String::new(),
        })
    }

    #[test]
    fn a_new_gpujob_starts_attempt_one() {
        let g = gpujob(3);
        let p = run(&g, &[], None, T0);
        assert_eq!(creates(&p), vec![1]);
        assert_eq!(p.status.phase, Some(Phase::Running));
        assert_eq!((p.status.attempts, p.status.failures), (1, 0));
        assert_eq!(p.status.active_job.as_deref(), Some("train-1"));
        assert_eq!(p.status.observed_generation, Some(1));
        assert_eq!(p.status.start_time, Some(t(T0)));
        assert_eq!(ready(&p), (ConditionStatus::False, "JobRunning".into()));
    }

    #[test]
    fn a_converged_gpujob_plans_nothing_and_the_same_status() {
        let g = gpujob(3);
        let first = run(&g, &[], None, T0);
        let g = with_status(g, &first);
        let jobs = [job(&g, 1, None)];
        // Later, and again: nothing to do, byte-identical status (so zero writes).
        for now in ["2026-11-30T06:00:05Z", "2026-11-30T07:00:00Z"] {
            let p = run(&g, &jobs, None, now);
            assert!(p.actions.is_empty());
            assert_eq!(Some(&p.status), g.status.as_ref());
        }
    }

    #[test]
    fn the_cache_may_know_the_job_before_the_status() {
        // The operator's own Job event arrives before its status write is in the cache.
        let g = gpujob(3);
        let jobs = [job(&g, 1, None)];
        let p = run(&g, &jobs, None, T0);
        assert!(
            creates(&p).is_empty(),
            "attempt 1 exists; never a second create"
        );
        assert_eq!(p.status.attempts, 1);
        assert_eq!(p.status.phase, Some(Phase::Running));
    }

    #[test]
    fn success_is_final() {
        let g = gpujob(3);
        let g = with_status(g.clone(), &run(&g, &[], None, T0));
        let jobs = [job(&g, 1, Some(("Complete", "", "2026-11-30T06:01:00Z")))];
        let p = run(&g, &jobs, None, "2026-11-30T06:01:02Z");
        assert_eq!(p.status.phase, Some(Phase::Succeeded));
        assert_eq!(p.status.completion_time, Some(t("2026-11-30T06:01:00Z")));
        assert_eq!(p.status.active_job, None);
        assert_eq!(ready(&p), (ConditionStatus::True, "Succeeded".into()));
        // A spec change afterwards is recorded and starts nothing.
        let mut g = with_status(g, &p);
        g.metadata.generation = Some(2);
        let p2 = run(&g, &jobs, None, "2026-11-30T06:05:00Z");
        assert!(p2.actions.is_empty());
        assert_eq!(p2.status.observed_generation, Some(2));
        assert_eq!(p2.status.phase, Some(Phase::Succeeded));
    }

    #[test]
    fn a_failure_backs_off_then_starts_the_next_attempt() {
        let g = gpujob(3);
        let g = with_status(g.clone(), &run(&g, &[], None, T0));
        let failed_at = "2026-11-30T06:00:30Z";
        let jobs = [job(
            &g,
            1,
            Some(("Failed", "BackoffLimitExceeded", failed_at)),
        )];

        let p = run(&g, &jobs, exit(1, 3), "2026-11-30T06:00:31Z");
        assert!(creates(&p).is_empty());
        assert_eq!(p.status.phase, Some(Phase::Pending));
        assert_eq!(p.status.failures, 1);
        assert_eq!(
            p.status.next_attempt_time,
            Some(t("2026-11-30T06:00:40Z")),
            "10 s after the Job failed"
        );
        assert_eq!(p.requeue_after, Some(Duration::from_secs(9)));
        assert_eq!(ready(&p), (ConditionStatus::False, "BackingOff".into()));
        let f = p.status.last_failure.clone().unwrap();
        assert_eq!((f.attempt, f.exit_code), (1, Some(3)));
        assert_eq!(f.message, "attempt 1 failed: exit code 3 (Error)");
        assert_eq!(
            p.status.last_error.as_deref(),
            Some("attempt 1 failed: exit code 3 (Error)")
        );

        // The pod is gone by the time backoff ends: the recorded failure is kept.
        let g = with_status(g, &p);
        let p = run(&g, &jobs, None, "2026-11-30T06:00:40Z");
        assert_eq!(creates(&p), vec![2]);
        assert_eq!((p.status.attempts, p.status.failures), (2, 1));
        assert_eq!(p.status.phase, Some(Phase::Running));
        assert_eq!(p.status.next_attempt_time, None);
        assert_eq!(p.status.last_failure.unwrap().exit_code, Some(3));
    }

    #[test]
    fn backoff_doubles_from_the_base_up_to_the_cap() {
        let s = settings();
        let secs: Vec<u64> = (1..=6).map(|f| backoff(&s, f).as_secs()).collect();
        assert_eq!(secs, vec![10, 20, 40, 60, 60, 60]);
        assert_eq!(backoff(&s, 1000), Duration::from_secs(60));
        let d = PlanSettings::default();
        assert_eq!(
            (backoff(&d, 1).as_secs(), backoff(&d, 10).as_secs()),
            (10, 360)
        );
    }

    #[test]
    fn backoff_survives_a_restart_because_it_counts_from_the_job() {
        // No status at all (a fresh operator, status lost): the Job's Failed time decides.
        let g = gpujob(3);
        let jobs = [job(
            &g,
            1,
            Some(("Failed", "BackoffLimitExceeded", "2026-11-30T06:00:30Z")),
        )];
        let early = run(&g, &jobs, exit(1, 1), "2026-11-30T06:00:35Z");
        assert!(creates(&early).is_empty());
        assert_eq!(early.status.attempts, 1, "derived from the Job that exists");
        let late = run(&g, &jobs, exit(1, 1), "2026-11-30T06:00:41Z");
        assert_eq!(creates(&late), vec![2]);
    }

    #[test]
    fn retries_exhausted_is_final_with_the_last_message() {
        let g = gpujob(1);
        let g2 = running(&g, 2, 1);
        let jobs = [
            job(
                &g,
                1,
                Some(("Failed", "BackoffLimitExceeded", "2026-11-30T06:00:10Z")),
            ),
            job(
                &g,
                2,
                Some(("Failed", "BackoffLimitExceeded", "2026-11-30T06:01:00Z")),
            ),
        ];
        let p = run(&g2, &jobs, exit(2, 7), "2026-11-30T06:01:01Z");
        assert!(creates(&p).is_empty());
        assert_eq!(p.status.phase, Some(Phase::Failed));
        assert_eq!((p.status.attempts, p.status.failures), (2, 2));
        assert_eq!(p.status.completion_time, Some(t("2026-11-30T06:01:00Z")));
        let c = p.status.condition(READY).unwrap();
        assert_eq!(c.reason, "RetriesExhausted");
        assert!(c.message.contains("exit code 7"), "{}", c.message);
        // Final: later reconciles start nothing.
        let g3 = with_status(g2, &p);
        assert!(creates(&run(&g3, &jobs, None, "2026-11-30T09:00:00Z")).is_empty());
    }

    #[test]
    fn max_retries_zero_means_one_attempt() {
        let g = gpujob(0);
        let jobs = [job(&g, 1, Some(("Failed", "BackoffLimitExceeded", T0)))];
        let p = run(&g, &jobs, exit(1, 1), "2026-11-30T06:10:00Z");
        assert!(creates(&p).is_empty());
        assert_eq!(p.status.phase, Some(Phase::Failed));
    }

    #[test]
    fn a_deleted_running_job_counts_as_a_failed_attempt() {
        let g = gpujob(3);
        let g = with_status(g.clone(), &run(&g, &[], None, T0));
        let p = run(&g, &[], None, "2026-11-30T06:00:20Z");
        assert!(creates(&p).is_empty(), "never recreate an attempt number");
        let f = p.status.last_failure.clone().unwrap();
        assert_eq!((f.attempt, f.reason.as_str()), (1, "JobDeleted"));
        assert_eq!(p.status.phase, Some(Phase::Pending));
        // Recorded once: the next look keeps the same time, so the backoff does not slide.
        let g = with_status(g, &p);
        let p2 = run(&g, &[], None, "2026-11-30T06:00:25Z");
        assert_eq!(p2.status, p.status);
        let p3 = run(&g, &[], None, "2026-11-30T06:00:30Z");
        assert_eq!(creates(&p3), vec![2]);
    }

    #[test]
    fn deadline_exceeded_says_so() {
        let g = gpujob(3);
        let jobs = [job(&g, 1, Some(("Failed", "DeadlineExceeded", T0)))];
        let p = run(&g, &jobs, None, T0);
        assert!(
            p.status
                .last_error
                .unwrap()
                .contains("activeDeadlineSeconds")
        );
    }

    #[test]
    fn attempts_follow_the_newest_job_even_when_status_lags() {
        let g = gpujob(5);
        let g2 = running(&g, 1, 0);
        let jobs = [
            job(&g, 1, Some(("Failed", "BackoffLimitExceeded", T0))),
            job(&g, 2, None),
        ];
        let p = run(&g2, &jobs, None, "2026-11-30T06:10:00Z");
        assert!(
            creates(&p).is_empty(),
            "attempt 2 runs; no attempt 3 while it does"
        );
        assert_eq!((p.status.attempts, p.status.failures), (2, 1));
        assert_eq!(p.status.phase, Some(Phase::Running));
    }

    #[test]
    fn old_jobs_beyond_the_kept_few_are_deleted() {
        let g = gpujob(10);
        let g2 = running(&g, 4, 3);
        let failed = Some(("Failed", "BackoffLimitExceeded", T0));
        let jobs = [
            job(&g, 1, failed),
            job(&g, 2, failed),
            job(&g, 3, failed),
            job(&g, 4, None),
        ];
        let p = run(&g2, &jobs, None, T0);
        let deleted: Vec<_> = p
            .actions
            .iter()
            .filter_map(|a| match a {
                Action::DeleteJob {
                    name,
                    uid,
                    resource_version,
                    foreground: false,
                } => Some((name.clone(), uid.clone(), resource_version.clone())),
                _ => None,
            })
            .collect();
        assert_eq!(
            deleted,
            vec![
                (
                    "train-1".to_owned(),
                    "job-uid-1".to_owned(),
                    "100".to_owned()
                ),
                (
                    "train-2".to_owned(),
                    "job-uid-2".to_owned(),
                    "200".to_owned()
                ),
            ]
        );
    }

    #[test]
    fn a_gpujob_being_deleted_starts_nothing() {
        let mut g = gpujob(3);
        g.metadata.deletion_timestamp = Some(Time(t(T0)));
        let p = run(&g, &[], None, T0);
        assert!(p.actions.is_empty());
        assert_eq!(Some(p.status), g.status.or(Some(GpuJobStatus::default())));
    }

    #[test]
    fn an_invalid_job_waits_for_a_spec_change() {
        let g = gpujob(3);
        let refused = Refusal {
            attempt: 1,
            reason: INVALID_SPEC,
            message: "spec.nodeSelector: Invalid value".into(),
        };
        let obs = Observed {
            gpujob: &g,
            jobs: vec![],
            termination: None,
            refused: Some(refused),
            quota_required: false,
            now: t(T0),
        };
        let p = plan(&obs, &settings());
        assert!(p.actions.is_empty());
        assert_eq!(p.status.phase, Some(Phase::Pending));
        assert_eq!(p.status.attempts, 0, "the attempt did not start");
        assert_eq!(ready(&p), (ConditionStatus::False, INVALID_SPEC.into()));
        assert_eq!(
            p.status.last_error.as_deref(),
            Some("spec.nodeSelector: Invalid value")
        );

        // Same generation: nothing to do, nothing to write, however often it is looked at.
        let g = with_status(g, &p);
        let again = run(&g, &[], None, "2026-11-30T07:00:00Z");
        assert!(again.actions.is_empty());
        assert_eq!(Some(&again.status), g.status.as_ref());

        // A new generation tries again.
        let mut fixed = g.clone();
        fixed.metadata.generation = Some(2);
        assert_eq!(
            creates(&run(&fixed, &[], None, "2026-11-30T07:00:00Z")),
            vec![1]
        );
    }
}
