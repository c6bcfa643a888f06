//! Attempts: numbering, retry timing, spec changes, old Jobs, phase and Ready.

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::batch::v1::{Job, JobCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::{
    ADMITTED, Action, CLAIM_TEMPLATE_NAME_CONFLICT, FAILURE_RULE, INVALID_SPEC, JOB_NAME_CONFLICT,
    JobDeletion, LOST_NODE_RECHECK, Next, OLD_ATTEMPT_STOPPING, PlanSettings, Planner, QUEUED,
    SCHEDULING_GRACE, SPEC_CHANGE_PENDING, Termination, UNSCHEDULABLE, WAITING_FOR_LOST_NODE,
};
use crate::api::{ConditionStatus, FailureAction, FailureRecord, GpuJobSpec, Phase, UpdatePolicy};
use crate::claims;
use crate::events::{stray_job_deleted, unrecognized_job_deleted};
use crate::failure_policy::{MatchedRule, action_name, matched_rule};
use crate::job::{desired_job, job_name, join_gang};
use crate::seen_job::SeenJob;
use crate::status::{
    BACKING_OFF, DISPATCHING, JOB_RUNNING, MANAGED_ELSEWHERE, READY, REPLACING, SUSPENDED,
    remove_condition, seconds,
};

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

/// What a full Job's conditions say (a Job from a watch or a GET; the plan reads
/// [`seen_state`]).
pub fn job_state(job: &Job) -> JobState {
    let status = job.status.as_ref();
    state_of(
        status
            .and_then(|s| s.conditions.as_ref())
            .into_iter()
            .flatten(),
        status.and_then(|s| s.completion_time.as_ref()),
    )
}

/// What a seen Job's conditions say.
pub fn seen_state(job: &SeenJob) -> JobState {
    state_of(&job.status.conditions, job.status.completion_time.as_ref())
}

fn state_of<'a>(
    conditions: impl IntoIterator<Item = &'a JobCondition>,
    completion_time: Option<&Time>,
) -> JobState {
    for c in conditions {
        if c.status != "True" {
            continue;
        }
        let time = c.last_transition_time.as_ref().map(|t| t.0);
        match c.type_.as_str() {
            "Complete" => {
                let time = completion_time.map(|t| t.0).or(time);
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

/// Whether an active Job's pods wait to run, and when to ask why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodsWaiting {
    /// A pod runs, the Job is not active, or the API server does not count ready pods.
    No,
    /// No pod is ready yet; the scheduler gets this much longer before the pod is read.
    Grace(Duration),
    /// No pod is ready, past the grace: read the pod for the scheduler's reason.
    ReadPod,
}

/// Whether `job`'s pods wait for a node (or anything else before running) at `now`,
/// judged from the Job alone: `active` pods with none `ready` (a count the API server
/// gives from Kubernetes 1.24), since `startTime`.
pub fn pods_waiting(job: &SeenJob, now: Timestamp) -> PodsWaiting {
    if job.deleting() || seen_state(job) != JobState::Active {
        return PodsWaiting::No;
    }
    let status = &job.status;
    // A multi-node attempt runs once all its pods do: one left unplaced holds the rest.
    let pods = job.nodes.unwrap_or(1);
    let waiting = status.active.unwrap_or(0) > 0 && status.ready.is_some_and(|r| r < pods);
    if !waiting {
        return PodsWaiting::No;
    }
    let since = status.start_time.as_ref().map_or(now, |t| t.0);
    let waited = Duration::try_from(now.duration_since(since)).unwrap_or(Duration::ZERO);
    match SCHEDULING_GRACE.checked_sub(waited) {
        Some(left) if !left.is_zero() => PodsWaiting::Grace(left),
        _ => PodsWaiting::ReadPod,
    }
}

impl Planner<'_, '_> {
    /// Whether a pod of `job`'s live copy on a MultiKueue worker is placed on a node
    /// there, in the pods seen (read, or cached).
    fn placed_on_worker(&self, job: &SeenJob) -> bool {
        let Some(uid) = job.uid.as_deref() else {
            return false;
        };
        self.seen_pods(|p| p.cluster.is_some() && p.of_job(uid) && p.bound)
    }
}

/// Whether `job` is one MultiKueue dispatched whose copy on the worker has not started
/// yet, as far as the status it copies back says (no start, no pod).
fn not_started_on_worker(job: &SeenJob) -> bool {
    job.dispatched()
        && job.status.start_time.is_none()
        && job.status.active.unwrap_or(0) == 0
        && seen_state(job) == JobState::Active
}

/// Whether `job` may still have pods that run or are stopping: it has not finished, or
/// it is being deleted (deleted in the foreground, a Job goes only once its pods are
/// gone, terminating ones included; a Job MultiKueue dispatched has its pods on a
/// worker, where its copy goes on its own: there the gate's read holds the next
/// attempt), or it counts terminating pods (Kubernetes before
/// the terminal condition waited for them could mark a Job finished while its pods
/// still stopped).
pub(in crate::plan) fn live(job: &SeenJob) -> bool {
    seen_state(job) == JobState::Active
        || job.deleting()
        || job.status.terminating.is_some_and(|n| n > 0)
}

/// Backoff before the attempt that follows failure number `failures` (from 1), at the
/// operator's base.
pub fn backoff(settings: &PlanSettings, failures: i32) -> Duration {
    exponential_from(settings.backoff_base, settings, failures)
}

/// Backoff of this GpuJob: from its own base (v2 `retryPolicy.backoffSeconds`, kept in
/// v1 as `spec.v2.backoffSeconds`) when it sets one, else the operator's; doubling per
/// failure and capped by the operator's longest backoff either way.
pub fn backoff_for(settings: &PlanSettings, spec: &GpuJobSpec, failures: i32) -> Duration {
    let own = spec
        .v2
        .as_ref()
        .and_then(|v2| v2.backoff_seconds)
        .and_then(|s| u64::try_from(s).ok())
        .filter(|s| *s >= 1)
        .map(Duration::from_secs);
    exponential_from(own.unwrap_or(settings.backoff_base), settings, failures)
}

fn exponential_from(base: Duration, settings: &PlanSettings, failures: i32) -> Duration {
    crate::backoff::exponential(
        base,
        settings.backoff_max,
        u32::try_from(failures).unwrap_or(0),
    )
}

impl Planner<'_, '_> {
    /// A final GpuJob: record that this generation was seen (also a spec change), start
    /// nothing, and let a pending spec change go: there is no next attempt.
    pub(super) fn finished(&mut self) {
        if let Some(c) = self.next.conditions.iter_mut().find(|c| c.type_ == READY) {
            c.observed_generation = self.generation;
        }
        remove_condition(&mut self.next.conditions, SPEC_CHANGE_PENDING);
    }

    /// A GpuJob that is not final: follows the attempt its status records (a Job of the
    /// next one is that attempt's only once [`Planner::try_start`] starts it).
    /// Returns the newest attempt afterwards.
    pub(super) fn attempts(&mut self) -> i32 {
        let attempt = self.current.attempts.max(0);
        let first = self.run_first_attempt();
        if attempt < first {
            // Nothing started in this run yet.
            self.try_start(first).unwrap_or(attempt)
        } else {
            self.follow(attempt)
        }
    }

    /// The first attempt of the current run (attempt numbers continue across runs).
    pub(super) fn run_first_attempt(&self) -> i32 {
        self.current.run_first_attempt.unwrap_or(1).max(1)
    }

    /// Starts the attempt after `k` unless something forbids it now; returns the newest
    /// attempt afterwards. Attempt numbers are `i32`, as Kubernetes integers are: past the
    /// last one nothing starts (only a status written by hand gets there).
    fn start_next(&mut self, k: i32) -> i32 {
        match k.checked_add(1) {
            Some(next) => self.try_start(next).unwrap_or(k),
            None => {
                self.next.phase = Some(Phase::Pending);
                self.next.active_job = None;
                self.requeue = Next::Done;
                self.ready(
                    ConditionStatus::False,
                    "AttemptsExhausted",
                    format!("attempt {k} was the last attempt number there is: no attempt starts"),
                );
                k
            }
        }
    }

    /// Whether a Job of this GpuJob still runs (its pods may hold GPUs), including one
    /// being deleted.
    pub(super) fn holds_gpus(&self) -> bool {
        self.obs.jobs.iter().any(|j| live(j))
    }

    /// The Job, other than `attempt`'s own, whose pods may still run or be stopping: the
    /// oldest, so that the words in Ready stay the same from one look to the next. A Job
    /// of `attempt`'s number being deleted (a stray made from another spec) counts: its
    /// name must be free before the attempt's own Job can be made.
    fn live_job(&self, attempt: i32) -> Option<&SeenJob> {
        self.obs
            .jobs
            .iter()
            .copied()
            .filter(|j| (j.attempt != Some(attempt) || j.deleting()) && live(j))
            .min_by_key(|j| (j.attempt, j.name.clone()))
    }

    /// Why `attempt` cannot start while another attempt's Job may still have pods: one
    /// of them being deleted on a lost node (a read found it not Ready, or gone) says
    /// so, with the node ([`WAITING_FOR_LOST_NODE`]).
    fn old_attempt_stopping(&self, attempt: i32) -> Option<(&'static str, String)> {
        // Two attempts' pods at once would break a distributed run (duplicate ranks).
        // The Job's deletion or end is an event: no timer is needed.
        let job = self.live_job(attempt)?;
        let live_uids: Vec<&str> = self
            .obs
            .jobs
            .iter()
            .filter(|j| (j.attempt != Some(attempt) || j.deleting()) && live(j))
            .filter_map(|j| j.uid.as_deref())
            .collect();
        let on_lost_node = self.lost_pod(|p| {
            p.job_uid
                .as_deref()
                .is_some_and(|uid| live_uids.contains(&uid))
        });
        if let Some((pod, node)) = on_lost_node {
            return Some((WAITING_FOR_LOST_NODE, node.waiting_message(attempt, pod)));
        }
        let name = job.name.as_str();
        let how = if job.deleting() {
            "is being deleted"
        } else if seen_state(job) == JobState::Active {
            "has not finished"
        } else {
            "has pods still terminating"
        };
        let of = job
            .attempt
            .map_or_else(String::new, |a| format!(" (attempt {a})"));
        Some((
            OLD_ATTEMPT_STOPPING,
            format!("attempt {attempt} starts once the pods of Job {name}{of} are gone: it {how}"),
        ))
    }

    /// Why a new attempt cannot start now, if something forbids it.
    fn blocker(&self, attempt: i32) -> Option<(&'static str, String)> {
        if self.gj.spec.suspend {
            return Some((SUSPENDED, suspended_message()));
        }
        if let Some(r) = self.refused.as_ref().filter(|r| r.attempt == attempt) {
            return Some((r.reason, r.message.clone()));
        }
        if let Some(inv) = &self.invalid {
            return Some(inv.clone());
        }
        if let Some(why) = self.old_attempt_stopping(attempt) {
            return Some(why);
        }
        if let Some(why) = self.host_names_too_long(attempt) {
            return Some(why);
        }
        if self.obs.quota_required
            && !super::reservation::sized(&self.next, self.gj.spec.total_gpus(), self.generation)
        {
            return Some(self.quota_blocker());
        }
        None
    }

    /// A multi-node attempt's pods are named `<job>-<index>` as hosts, a DNS label of at
    /// most 63 characters: with a long GpuJob name, a high attempt number no longer fits
    /// (validation checks the name against the attempts `maxRetries` allows; disruptions
    /// and reruns go further). Then nothing starts: every pod create would be refused.
    fn host_names_too_long(&self, attempt: i32) -> Option<(&'static str, String)> {
        let nodes = self.gj.spec.nodes();
        let longest = crate::validate::host_name_len(&self.name, attempt, nodes)?;
        (longest > crate::validate::MAX_HOST_NAME).then(|| {
            (
                INVALID_SPEC,
                format!(
                    "attempt {attempt} cannot start: its pods' host names ({}-<index>) would have {longest} characters, more than {}; a GpuJob with spec.nodes {nodes} and this many attempts needs a shorter name",
                    job_name(&self.name, attempt),
                    crate::validate::MAX_HOST_NAME
                ),
            )
        })
    }

    /// Starts `attempt` unless something forbids it now (then the GpuJob waits, Pending,
    /// and `None`); returns the newest attempt afterwards.
    fn try_start(&mut self, attempt: i32) -> Option<i32> {
        if let Some((reason, message)) = self.blocker(attempt) {
            self.next.phase = Some(if reason == SUSPENDED {
                Phase::Suspended
            } else {
                Phase::Pending
            });
            self.next.active_job = None;
            self.next.next_attempt_time = None;
            if [
                INVALID_SPEC,
                JOB_NAME_CONFLICT,
                CLAIM_TEMPLATE_NAME_CONFLICT,
            ]
            .contains(&reason)
            {
                self.next.last_error = Some(message.clone());
            }
            self.requeue = match reason {
                // Nothing watches the names taken: look again in a while.
                JOB_NAME_CONFLICT | CLAIM_TEMPLATE_NAME_CONFLICT => {
                    Next::After(self.settings.name_conflict_retry)
                }
                INVALID_SPEC => Next::Done,
                SUSPENDED => Next::Done,
                // The Job watch says when it is gone.
                OLD_ATTEMPT_STOPPING => Next::Done,
                // Nothing watches Nodes: read it again in a while.
                WAITING_FOR_LOST_NODE => Next::After(LOST_NODE_RECHECK),
                // Waiting for quota: ask again with backoff.
                _ => Next::Backoff,
            };
            let message = match &self.current.last_failure {
                Some(f) if Some(f.attempt) == attempt.checked_sub(1) => {
                    after_failure(&f.message, &message)
                }
                _ => message,
            };
            self.ready(ConditionStatus::False, reason, message);
            return None;
        }
        let mut job = desired_job(self.gj, attempt);
        if self.settings.gang {
            join_gang(&mut job);
        }
        // The attempt's Job may exist already: created by this operator just before a
        // crash kept its status from being written, or by a replica that lost the shard
        // while its create was in flight. It is this attempt's only when it is what would
        // be created now (this generation; a Job of another spec is a stray, deleted, and
        // its name waits: `live_job`).
        let made = self.by_attempt.get(&attempt).copied();
        if let Some(stale) = made.filter(|j| j.generation != self.generation) {
            // A running one goes as a stray (`stop_strays`); a finished one here, as an
            // old Job: nothing else would delete it, and its name must be free.
            if !stale.deleting() && seen_state(stale) != JobState::Active {
                self.actions.extend(delete_action(stale, JobDeletion::Old));
            }
            self.next.phase = Some(Phase::Pending);
            self.ready(
                ConditionStatus::False,
                OLD_ATTEMPT_STOPPING,
                format!(
                    "attempt {attempt} starts once the Job of that name built from another spec is gone"
                ),
            );
            return None;
        }
        self.next.attempts = attempt;
        self.next.phase = Some(Phase::Running);
        self.next.active_job = job.metadata.name.clone();
        self.next.next_attempt_time = None;
        self.next.replacing_attempt = None;
        self.next.start_time = self.next.start_time.or(Some(self.now));
        remove_condition(&mut self.next.conditions, SPEC_CHANGE_PENDING);
        if let Some(made) = made {
            // Taken as it is, and followed from here (it may have run its course: a
            // status lost with the Jobs kept).
            debug_assert!(!made.deleting());
            return Some(self.follow(attempt));
        }
        // Before the Job: its pods' claims are made from it (`crate::claims`).
        if let Some(template) = claims::template(self.gj, attempt) {
            self.actions.push(Action::CreateClaimTemplate {
                attempt,
                template: Box::new(template),
            });
        }
        let queue = self.gj.spec.queue_name().map(str::to_owned);
        self.actions.push(Action::CreateJob {
            attempt,
            job: Box::new(job),
        });
        match queue {
            // Made suspended, for Kueue: it runs once Kueue admits it, and says so then
            // (not Running in between, which a backlog could stretch).
            Some(queue) => {
                self.next.phase = Some(Phase::Pending);
                let message = format!(
                    "attempt {attempt} waits in Kueue LocalQueue {queue}: its Job is made, and Kueue has not decided on it yet"
                );
                self.ready(ConditionStatus::False, QUEUED, message);
            }
            None => self.ready(
                ConditionStatus::False,
                JOB_RUNNING,
                running_message(&self.name, attempt),
            ),
        }
        Some(attempt)
    }

    /// Follows attempt `k`, which has started; returns the newest attempt afterwards.
    fn follow(&mut self, k: i32) -> i32 {
        // A status that lags the Jobs (a restart between a create and the status
        // write) catches up: attempt k exists, so k - 1 ended, and if it failed its
        // failure is recorded now.
        self.next.attempts = k;
        self.next.start_time = self.next.start_time.or(Some(self.now));
        if k > self.run_first_attempt()
            && let Some(prev) = self.by_attempt.get(&(k - 1))
            && let JobState::Failed {
                time,
                reason,
                message,
            } = seen_state(prev)
            && self
                .current
                .last_failure
                .as_ref()
                .is_none_or(|f| f.attempt < k - 1)
            && self.current.replacing_attempt != Some(k - 1)
        {
            let time = seconds(time.unwrap_or(self.now));
            let matched = matched_rule(&reason, &message, prev.failure_rules.as_deref());
            let record = failure_record(
                k - 1,
                time,
                &reason,
                &message,
                self.obs.termination.as_ref(),
                matched,
            );
            self.record_failure(record);
        }

        let job = self.by_attempt.get(&k).copied();
        if self.current.replacing_attempt == Some(k) {
            return self.replace(k, job);
        }
        match job.map(seen_state) {
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
                let rules = job.and_then(|j| j.failure_rules.as_deref());
                let matched = matched_rule(&reason, &message, rules);
                let record = self.recorded_or(k, || {
                    let pod = self.obs.termination.as_ref();
                    failure_record(k, time, &reason, &message, pod, matched)
                });
                self.failed(k, record, matched)
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
                    counted: true,
                    rule: None,
                });
                self.failed(k, record, None)
            }
        }
    }

    /// Attempt `k` runs. A spec change applies now (Recreate), or waits (OnNextAttempt,
    /// or an invalid new spec).
    fn running(&mut self, k: i32, job: Option<&SeenJob>) {
        if self.gj.spec.suspend {
            // Stopped, not failed: recorded (with why) before the delete, as for a
            // replacement.
            let suspended = self.next.condition(SUSPENDED).cloned();
            self.checkpoint(|s| {
                s.replacing_attempt = Some(k);
                if let Some(c) = &suspended {
                    s.conditions.retain(|x| x.type_ != c.type_);
                    s.conditions.push(c.clone());
                }
            });
            self.delete_for_replacement(job, JobDeletion::Suspended);
            self.stopped(k);
            return;
        }
        self.next.active_job = Some(job_name(&self.name, k));
        self.next.next_attempt_time = None;
        let waiting = job.map_or(PodsWaiting::No, |j| pods_waiting(j, self.obs.now));
        let unschedulable = self
            .obs
            .unschedulable
            .as_ref()
            .filter(|u| u.attempt == k && waiting == PodsWaiting::ReadPod);
        self.admission(k, job);
        if let Some(job) = job.filter(|j| j.queued()) {
            self.queued(k, job);
        } else if let Some(why) = job.and_then(|j| self.managed_elsewhere(j)) {
            // Another controller makes its pods, where this operator does not let them
            // go (the gate holds them: `gate.rs`).
            self.next.phase = Some(Phase::Pending);
            self.ready(
                ConditionStatus::False,
                MANAGED_ELSEWHERE,
                format!("attempt {k}'s Job {why}"),
            );
        } else if job.is_some_and(|j| not_started_on_worker(j) && !self.placed_on_worker(j)) {
            // Admitted here, and nothing says its copy runs there yet: no status came
            // back (MultiKueue copies it only once the copy changes after this Job
            // started), and no pod of it is placed there as far as the pods seen say.
            self.next.phase = Some(Phase::Pending);
            let message = format!(
                "attempt {k}'s Job is admitted, and Kueue's MultiKueue runs it on a worker cluster; no pod of it is placed there yet, and no status has come back from there"
            );
            self.ready(ConditionStatus::False, DISPATCHING, message);
        } else if let Some(u) = unschedulable {
            // Its Job runs, but nothing of it does: Pending, as its pod is. When a pod
            // is placed and runs, the Job's ready count changes and says so.
            self.next.phase = Some(Phase::Pending);
            let message = format!("attempt {k} waits for a node: {}", u.message);
            self.ready(ConditionStatus::False, UNSCHEDULABLE, message);
            // The reason may change without the Job changing (another pod placed
            // first); look again, less often the longer it waits.
            self.requeue = Next::Backoff;
        } else {
            self.next.phase = Some(Phase::Running);
            self.ready(
                ConditionStatus::False,
                JOB_RUNNING,
                running_message(&self.name, k),
            );
            if let Some(allocation) = job.and_then(|j| self.allocation(k, j)) {
                self.next.devices = Some(allocation);
            }
            if let PodsWaiting::Grace(left) = waiting {
                // The pod watch queues the GpuJob when the scheduler gives up on a pod;
                // news that came within the grace is acted on when the grace ends.
                self.requeue_within(left);
            }
        }
        let built_from = job.and_then(|j| j.generation);
        let changed = matches!((built_from, self.generation), (Some(b), Some(g)) if b < g);
        if !changed {
            remove_condition(&mut self.next.conditions, SPEC_CHANGE_PENDING);
            self.release_pods(k, job);
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
                self.checkpoint(|s| s.replacing_attempt = Some(k));
                self.delete_for_replacement(job, JobDeletion::Replaced);
                self.next.phase = Some(Phase::Pending);
                self.next.active_job = None;
                let message = format!("attempt {k} is being replaced: the spec changed");
                self.ready(ConditionStatus::False, REPLACING, message);
                remove_condition(&mut self.next.conditions, SPEC_CHANGE_PENDING);
                return;
            }
        };
        self.condition(SPEC_CHANGE_PENDING, ConditionStatus::True, reason, message);
        self.release_pods(k, job);
    }

    /// The `Admitted` condition of a GpuJob queued through Kueue: what Kueue did with
    /// attempt `k`'s Job. Gone when the attempt runs without Kueue.
    fn admission(&mut self, k: i32, job: Option<&SeenJob>) {
        let queue = job.and_then(|j| j.queue.as_deref());
        let (status, reason, message) = match (queue, self.gj.spec.queue_name()) {
            (Some(q), _) if !job.is_some_and(SeenJob::queued) => (
                ConditionStatus::True,
                "Admitted",
                format!("Kueue admitted attempt {k} from LocalQueue {q}"),
            ),
            (Some(_), _) => {
                let (reason, why) = self.queue_wait(k);
                (
                    ConditionStatus::False,
                    reason,
                    format!("attempt {k}: {why}"),
                )
            }
            (None, Some(q)) => (
                ConditionStatus::False,
                "Queuing",
                format!("attempt {k} is handed to Kueue LocalQueue {q} once it may start"),
            ),
            (None, None) => {
                remove_condition(&mut self.next.conditions, ADMITTED);
                return;
            }
        };
        let reason = reason.to_owned();
        self.condition(ADMITTED, status, &reason, message);
    }

    /// Kueue's reason and words for holding attempt `k`, from its Workload.
    fn queue_wait(&self, k: i32) -> (&str, String) {
        match self.obs.queue_wait.as_ref().filter(|w| w.attempt == k) {
            Some(w) => (w.reason.as_str(), w.message.clone()),
            None => ("Pending", "Kueue has not said why yet".to_owned()),
        }
    }

    /// Attempt `k`'s Job waits in its Kueue LocalQueue: Pending until Kueue admits it
    /// (unsuspends the Job). The Job's start is an event; Kueue's reason may change
    /// without the Job changing, so the GpuJob looks again, less often the longer it
    /// waits.
    fn queued(&mut self, k: i32, job: &SeenJob) {
        let queue = job.queue.as_deref().unwrap_or_default();
        let (_, why) = self.queue_wait(k);
        self.next.phase = Some(Phase::Pending);
        let message = format!("attempt {k} waits in Kueue LocalQueue {queue}: {why}");
        self.ready(ConditionStatus::False, QUEUED, message);
        self.requeue = Next::Backoff;
    }

    fn delete_for_replacement(&mut self, job: Option<&SeenJob>, why: JobDeletion) {
        let job = job.filter(|j| !j.deleting());
        self.actions.extend(job.and_then(|j| delete_action(j, why)));
    }

    /// Attempt `k` is being replaced after a spec change: once its Job (and pods) are
    /// gone, the next attempt starts on the new spec. Not a failure.
    fn replace(&mut self, k: i32, job: Option<&SeenJob>) -> i32 {
        match job {
            Some(j) => {
                // Still there (deleting, or the delete did not happen yet).
                let why = if self.gj.spec.suspend {
                    JobDeletion::Suspended
                } else {
                    JobDeletion::Replaced
                };
                self.delete_for_replacement(Some(j), why);
                if self.gj.spec.suspend {
                    self.stopped(k);
                    return k;
                }
                self.next.phase = Some(Phase::Pending);
                self.next.active_job = None;
                let message = format!("attempt {k} is being replaced: the spec changed");
                self.ready(ConditionStatus::False, REPLACING, message);
                k
            }
            None => self.start_next(k),
        }
    }

    fn record_failure(&mut self, record: FailureRecord) {
        let new = self
            .next
            .last_failure
            .as_ref()
            .is_none_or(|f| f.attempt < record.attempt);
        if new && record.counted {
            self.next.failures = self.next.failures.saturating_add(1);
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

    /// Attempt `k` failed: retry after backoff, or fail for good (no retries left, or a
    /// failure rule says so). A disruption is retried at once; a failure a rule does not
    /// count, after the first backoff.
    fn failed(&mut self, k: i32, failure: FailureRecord, matched: Option<MatchedRule>) -> i32 {
        self.record_failure(failure.clone());
        self.next.active_job = None;
        let failures = self.next.failures;
        let by_rule = matches!(
            matched,
            Some(MatchedRule::Rule {
                action: FailureAction::FailGpuJob,
                ..
            })
        );
        if by_rule || failures > self.gj.spec.max_retries {
            self.next.phase = Some(Phase::Failed);
            self.next.next_attempt_time = None;
            self.next.completion_time = Some(failure.time);
            remove_condition(&mut self.next.conditions, SPEC_CHANGE_PENDING);
            if by_rule {
                self.ready(ConditionStatus::False, FAILURE_RULE, failure.message);
                return k;
            }
            let message = format!(
                "{}; no retries left ({failures} attempts failed, maxRetries {})",
                failure.message, self.gj.spec.max_retries
            );
            self.ready(ConditionStatus::False, "RetriesExhausted", message);
            return k;
        }
        let wait = match matched {
            _ if failure.counted => backoff_for(self.settings, &self.gj.spec, failures),
            Some(MatchedRule::Rule { .. }) => backoff_for(self.settings, &self.gj.spec, 1),
            Some(MatchedRule::Disruption) | None => Duration::ZERO,
        };
        let at = failure
            .time
            .saturating_add(SignedDuration::try_from(wait).unwrap_or(SignedDuration::MAX))
            .unwrap_or(failure.time);
        if self.now >= at || self.gj.spec.suspend {
            // Suspended: the backoff is counted again (from the failure) on resume.
            return self.start_next(k);
        }
        self.next.phase = Some(Phase::Pending);
        self.next.next_attempt_time = Some(at);
        let message = format!(
            "{}; attempt {} starts at {at}",
            failure.message,
            k.saturating_add(1)
        );
        self.ready(ConditionStatus::False, BACKING_OFF, message);
        if let Ok(d) = Duration::try_from(self.now.duration_until(at)) {
            self.requeue = Next::After(d);
        }
        k
    }

    /// Attempt `k` is being stopped because the GpuJob is suspended.
    fn stopped(&mut self, k: i32) {
        self.next.replacing_attempt = Some(k);
        self.next.phase = Some(Phase::Suspended);
        self.next.active_job = None;
        self.next.next_attempt_time = None;
        let message = format!("attempt {k} is being stopped: {}", suspended_message());
        self.ready(ConditionStatus::False, SUSPENDED, message);
    }

    /// A GpuJob being deleted whose Jobs may still have pods: each running one is
    /// deleted in the foreground (it goes once its pods are gone), and true until none
    /// is left that may still run. The garbage collector takes Jobs only once the
    /// GpuJob is gone, which the quota finalizer holds until after the release.
    pub(super) fn stop_jobs_of_deleted(&mut self) -> bool {
        let live: Vec<&SeenJob> = self.obs.jobs.iter().copied().filter(|j| live(j)).collect();
        for job in &live {
            if !job.deleting() && seen_state(job) == JobState::Active {
                self.actions
                    .extend(delete_action(job, JobDeletion::GpuJobDeleted));
            }
        }
        // The Job watch says when they are gone.
        !live.is_empty()
    }

    /// Old attempts: keep the newest `keep_jobs` for debugging, delete the rest once
    /// their pods have ended (a Job that may still have live pods is a stray's case, or
    /// is going already).
    pub(super) fn collect_old_jobs(&mut self, attempt: i32) {
        let oldest_kept = attempt
            .saturating_sub(self.settings.keep_jobs.max(1))
            .saturating_add(1);
        for (a, job) in &self.by_attempt {
            if *a >= oldest_kept || live(job) {
                continue;
            }
            self.actions.extend(delete_action(job, JobDeletion::Old));
        }
    }

    /// Deletes every Job that is not `current`'s (`None`: the GpuJob has finished, so
    /// none is) and has not finished: attempts run one at a time. A Job that is no
    /// attempt this operator could have made ([`Planner::recognized`]) is one of them,
    /// whatever its label says. A stable name refuses
    /// a second create only while the first Job exists, so a create sent by a replica
    /// that then lost the shard can land after its successor ended that attempt (after
    /// a replacement or a suspend) and run it again, beside the next one. Deleted in the
    /// foreground: no further attempt starts until its pods are gone (for a Job
    /// MultiKueue dispatched, the gate's read of the workers waits for them).
    pub(super) fn stop_strays(&mut self, current: Option<i32>) {
        let current_job = current.and_then(|k| self.by_attempt.get(&k).copied());
        let mut strays: Vec<&SeenJob> = self
            .obs
            .jobs
            .iter()
            .copied()
            .filter(|j| {
                current_job.is_none_or(|c| c.name != j.name)
                    && !j.deleting()
                    // An attempt's finished Job is kept (`keep_jobs`); one that is no
                    // attempt goes whatever its state.
                    && (seen_state(j) == JobState::Active || self.recognized(j).is_none())
            })
            .collect();
        strays.sort_by_key(|j| (j.attempt, j.name.clone()));
        for job in strays {
            let Some(delete) = delete_action(job, JobDeletion::Stray) else {
                continue;
            };
            self.actions.push(delete);
            let note = if self.recognized(job).is_some() {
                stray_job_deleted(&job.name, job.attempt, current)
            } else {
                unrecognized_job_deleted(&job.name, job.attempt, self.current.attempts)
            };
            self.actions.push(Action::Publish(note));
        }
    }
}

fn suspended_message() -> String {
    "suspended (spec.suspend): no attempt starts until it is false".to_owned()
}

/// Deleting `job` with uid and resourceVersion preconditions.
fn delete_action(job: &SeenJob, why: JobDeletion) -> Option<Action> {
    Some(Action::DeleteJob {
        name: job.name.clone(),
        uid: job.uid.clone()?,
        resource_version: job.resource_version.clone()?,
        why,
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
    matched: Option<MatchedRule>,
) -> FailureRecord {
    let pod = pod.filter(|t| t.attempt == attempt);
    if matched == Some(MatchedRule::Disruption) {
        return FailureRecord {
            attempt,
            time,
            exit_code: pod.and_then(|t| t.exit_code),
            reason: "Disrupted".to_owned(),
            message: format!(
                "attempt {attempt} was disrupted ({job_message}); retried without counting against maxRetries"
            ),
            counted: false,
            rule: None,
        };
    }
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
    let mut record = FailureRecord {
        attempt,
        time,
        exit_code,
        reason,
        message: format!("attempt {attempt} failed: {detail}"),
        counted: true,
        rule: None,
    };
    if let Some(MatchedRule::Rule { index, action }) = matched {
        let what = match action {
            FailureAction::FailGpuJob => ": the GpuJob fails without retrying",
            FailureAction::Retry => "",
            FailureAction::RetryWithoutCounting => ": retried without counting against maxRetries",
        };
        record.message = format!(
            "{}; failure rule {index} ({}) matched{what}",
            record.message,
            action_name(action)
        );
        record.counted = action != FailureAction::RetryWithoutCounting;
        record.rule = i32::try_from(index).ok();
    }
    record
}

/// Ready's message when an attempt cannot start right after the one before it failed:
/// that failure first, then why (`Planner::refused_before` takes the failure off again).
pub(super) fn after_failure(failure: &str, why: &str) -> String {
    format!("{failure}; {why}")
}
