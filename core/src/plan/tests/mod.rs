use super::*;
use crate::api::{ConditionStatus, FailureRecord, GpuJobSpec, Phase, V2Only};
use crate::job::desired_job;
use crate::seen_pod::SeenPod;
use k8s_openapi::api::batch::v1::{JobCondition, JobStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::json;

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
            suspend: false,
            ttl_seconds_after_finished: None,
            v2: None,
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
        limits: SpecLimits {
            max_gpus: 8,
            ..Default::default()
        },
        cleanup_timeout: Duration::from_secs(60),
        name_conflict_retry: Duration::from_secs(30),
        default_ttl: None,
        api_versions: ApiVersions::V1AndV2,
        gang: false,
        multikueue: false,
    }
}

/// Attempt `attempt`'s Job as the API server has it once the holder started it.
fn job(g: &GpuJob, attempt: i32, state: Option<(&str, &str, &str)>) -> Job {
    let mut j = desired_job(g, attempt);
    if let Some(spec) = j.spec.as_mut() {
        spec.suspend = Some(false);
    }
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

/// `jobs` as the plan sees them.
fn seen(jobs: &[Job]) -> Vec<SeenJob> {
    jobs.iter()
        .map(|j| SeenJob::of(j).expect("a Job controlled by its GpuJob"))
        .collect()
}

/// [`pods_waiting`] of a full Job.
fn waiting(job: &Job, now: Timestamp) -> PodsWaiting {
    pods_waiting(&seen(std::slice::from_ref(job))[0], now)
}

/// What a plan sees of `g` and its Jobs `jobs` at `now` with nothing heard: a confirmed
/// view, every read made, no pods; tests set the rest with struct update syntax.
fn observed<'a>(g: &'a GpuJob, jobs: &'a [SeenJob], now: &str) -> Observed<'a> {
    Observed {
        gpujob: g,
        jobs: jobs.iter().collect(),
        termination: None,
        unschedulable: None,
        queue_wait: None,
        refused: None,
        quota_required: false,
        quota: None,
        pods: None,
        cached_pods: Vec::new(),
        confirmed: true,
        term_start_due: false,
        reads: Reads::every(),
        nodes: Vec::new(),
        now: t(now),
    }
}

fn run(g: &GpuJob, jobs: &[Job], termination: Option<Termination>, now: &str) -> Plan {
    run_with(g, jobs, termination, None, now)
}

/// [`run`] with what the attempt's pod said of its scheduling.
fn run_with(
    g: &GpuJob,
    jobs: &[Job],
    termination: Option<Termination>,
    unschedulable: Option<Unschedulable>,
    now: &str,
) -> Plan {
    plan(
        &Observed {
            gpujob: g,
            jobs: seen(jobs).iter().collect(),
            termination,
            unschedulable,
            queue_wait: None,
            refused: None,
            quota_required: false,
            quota: None,
            pods: Some(Vec::new()),
            confirmed: true,
            term_start_due: false,
            reads: Reads::every(),
            nodes: Vec::new(),
            cached_pods: Vec::new(),
            now: t(now),
        },
        &settings(),
    )
}

/// `confirmed`: whether the view of `g` is known current in the term (else the previous
/// holder of its shard may have moved past it).
fn plan_from(
    g: &GpuJob,
    jobs: &[Job],
    answer: Option<QuotaAnswer>,
    quota_required: bool,
    confirmed: bool,
    now: &str,
) -> Plan {
    let no_pods = Some(Vec::new());
    plan_seeing_pods(g, jobs, answer, quota_required, confirmed, no_pods, now)
}

/// [`plan_from`] with what a pod read found (`None`: not read).
fn plan_seeing_pods(
    g: &GpuJob,
    jobs: &[Job],
    answer: Option<QuotaAnswer>,
    quota_required: bool,
    confirmed: bool,
    pods: Option<Vec<SeenPod>>,
    now: &str,
) -> Plan {
    plan(
        &Observed {
            gpujob: g,
            jobs: seen(jobs).iter().collect(),
            termination: None,
            unschedulable: None,
            queue_wait: None,
            refused: None,
            quota_required,
            quota: answer,
            pods,
            confirmed,
            term_start_due: false,
            reads: Reads::every(),
            nodes: Vec::new(),
            cached_pods: Vec::new(),
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
        counted: true,
        rule: None,
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

/// `g` with `spec.queueName` `queue` (its other v2 fields unset).
fn in_queue(mut g: GpuJob, queue: &str) -> GpuJob {
    g.spec.v2 = Some(V2Only {
        queue_name: Some(queue.into()),
        ..V2Only::default()
    });
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
fn a_new_gpujob_in_a_kueue_queue_is_queued_from_its_jobs_create_not_running() {
    // The Job is made suspended, for Kueue; it runs once admitted.
    let g = in_queue(gpujob(3), "team");
    let p = run(&g, &[], None, T0);
    assert_eq!(creates(&p), vec![1]);
    assert_eq!(p.status.phase, Some(Phase::Pending));
    assert_eq!((p.status.attempts, p.status.failures), (1, 0));
    assert_eq!(ready(&p), (ConditionStatus::False, "Queued".into()));
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

/// Found by the protocol model (core/tests/protocol): a Job whose create landed and
/// whose status write never did (the replica stopped between them) fails before any
/// status names it. The next look adopts it as attempt 1, records its failure and, the
/// backoff over, starts attempt 2 in one status write: `status.attempts` goes from 0 to
/// 2 with no gap in the Jobs' numbers. The model's property is about Jobs, not status
/// steps.
#[test]
fn an_unrecorded_attempt_that_failed_is_recorded_and_the_next_follows_it() {
    let g = gpujob(3);
    let jobs = [job(
        &g,
        1,
        Some(("Failed", "BackoffLimitExceeded", "2026-11-30T06:00:30Z")),
    )];
    let p = run(&g, &jobs, exit(1, 1), "2026-11-30T07:00:00Z");
    assert_eq!(creates(&p), vec![2], "the next attempt, never 1 again");
    assert_eq!((p.status.attempts, p.status.failures), (2, 1));
    assert_eq!(p.status.last_failure.map(|f| f.attempt), Some(1));
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
    assert_eq!(p.next, Next::After(Duration::from_secs(9)));
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
fn a_disrupted_attempt_is_retried_at_once_without_counting() {
    // No retries at all: a counted failure would end the GpuJob.
    let g = gpujob(0);
    let g = with_status(g.clone(), &run(&g, &[], None, T0));
    let mut disrupted = job(
        &g,
        1,
        Some(("Failed", "PodFailurePolicy", "2026-11-30T06:00:30Z")),
    );
    let message =
        "Pod ns/train-1-x has condition DisruptionTarget matching FailJob rule at index 0";
    if let Some(c) = disrupted
        .status
        .as_mut()
        .and_then(|s| s.conditions.as_mut())
    {
        c[0].message = Some(message.into());
    }
    let jobs = [disrupted];
    let p = run(&g, &jobs, exit(1, 143), "2026-11-30T06:00:31Z");
    assert_eq!(creates(&p), vec![2], "the next attempt, at once");
    assert_eq!((p.status.attempts, p.status.failures), (2, 0));
    assert_eq!(p.status.phase, Some(Phase::Running));
    assert_eq!(p.status.next_attempt_time, None);
    let f = p.status.last_failure.clone().unwrap();
    assert_eq!(
        (f.attempt, f.reason.as_str(), f.counted),
        (1, "Disrupted", false)
    );
    assert!(f.message.contains(message), "{}", f.message);
    assert!(f.message.contains("without counting"), "{}", f.message);
    let before = g.status.clone().unwrap_or_default();
    let notes = crate::events::transitions(&before, &p.status);
    let said: Vec<&str> = notes.iter().map(|n| n.reason).collect();
    assert!(said.contains(&"AttemptDisrupted"), "{said:?}");
    assert!(!said.contains(&"AttemptFailed"), "{said:?}");

    // Looked at again, the disruption is not counted twice, nor at all.
    let g = with_status(g, &p);
    let both = [jobs[0].clone(), job(&g, 2, None)];
    let again = run(&g, &both, None, "2026-11-30T06:00:32Z");
    assert_eq!((again.status.attempts, again.status.failures), (2, 0));

    // The same Job failing any other way counts, and ends a GpuJob without retries.
    let g = gpujob(0);
    let g = with_status(g.clone(), &run(&g, &[], None, T0));
    let jobs = [job(
        &g,
        1,
        Some(("Failed", "BackoffLimitExceeded", "2026-11-30T06:00:30Z")),
    )];
    let p = run(&g, &jobs, exit(1, 143), "2026-11-30T06:00:31Z");
    assert_eq!(p.status.phase, Some(Phase::Failed));
    assert_eq!(p.status.failures, 1);
}

/// `g` with `rules` as its failure rules (v2 `retryPolicy.failureRules`).
fn with_rules(mut g: GpuJob, rules: serde_json::Value) -> GpuJob {
    g.spec.v2 = Some(V2Only {
        failure_rules: serde_json::from_value(rules).unwrap(),
        ..V2Only::default()
    });
    g
}

/// Attempt `attempt`'s Job, failed by the Job controller on rule `index` of its pod
/// failure policy.
fn failed_on_rule(g: &GpuJob, attempt: i32, index: usize, at: &str) -> Job {
    let mut j = job(g, attempt, Some(("Failed", "PodFailurePolicy", at)));
    if let Some(c) = j.status.as_mut().and_then(|s| s.conditions.as_mut()) {
        c[0].message = Some(format!(
            "Container main for pod ns/p failed with exit code 42 matching FailJob rule at index {index}"
        ));
    }
    j
}

#[test]
fn a_failure_rule_decides_what_a_failed_attempt_does() {
    let rules = json!([
        {"action": "FailGpuJob", "onExitCodes": {"operator": "In", "values": [42]}},
        {"action": "RetryWithoutCounting", "onExitCodes": {"operator": "In", "values": [7]}},
        {"action": "Retry", "onPodConditions": [{"type": "DisruptionTarget"}]},
    ]);
    let g = with_rules(gpujob(3), rules);
    let g = with_status(g.clone(), &run(&g, &[], None, T0));
    let at = "2026-11-30T06:00:30Z";

    // FailGpuJob: Failed at once, with retries left.
    let p = run(
        &g,
        &[failed_on_rule(&g, 1, 0, at)],
        exit(1, 42),
        "2026-11-30T06:00:31Z",
    );
    assert_eq!(p.status.phase, Some(Phase::Failed));
    assert!(creates(&p).is_empty());
    assert_eq!(
        ready(&p),
        (ConditionStatus::False, "FailureRuleMatched".into())
    );
    let f = p.status.last_failure.clone().unwrap();
    assert_eq!((f.rule, f.counted), (Some(0), true));
    assert!(
        f.message.contains("failure rule 0 (FailGpuJob) matched"),
        "{}",
        f.message
    );
    assert_eq!(p.status.completion_time, Some(t(at)));

    // RetryWithoutCounting: the first backoff (10 s), not counted.
    let p = run(
        &g,
        &[failed_on_rule(&g, 1, 1, at)],
        exit(1, 7),
        "2026-11-30T06:00:31Z",
    );
    assert_eq!(
        (p.status.phase, p.status.failures),
        (Some(Phase::Pending), 0)
    );
    assert_eq!(p.status.next_attempt_time, Some(t("2026-11-30T06:00:40Z")));
    let f = p.status.last_failure.clone().unwrap();
    assert_eq!((f.rule, f.counted), (Some(1), false));
    let later = with_status(g.clone(), &p);
    let p = run(
        &later,
        &[failed_on_rule(&g, 1, 1, at)],
        None,
        "2026-11-30T06:00:40Z",
    );
    assert_eq!(creates(&p), vec![2]);
    assert_eq!((p.status.attempts, p.status.failures), (2, 0));

    // Retry, on a DisruptionTarget: the user's rule comes first, and counts.
    let p = run(
        &g,
        &[failed_on_rule(&g, 1, 2, at)],
        exit(1, 143),
        "2026-11-30T06:00:31Z",
    );
    assert_eq!(p.status.failures, 1);
    let f = p.status.last_failure.clone().unwrap();
    assert_eq!((f.rule, f.counted), (Some(2), true));
    assert_eq!(ready(&p), (ConditionStatus::False, "BackingOff".into()));

    // The operator's own rule comes last: a disruption no user rule matched.
    let g = with_rules(
        gpujob(3),
        json!([
            {"action": "FailGpuJob", "onExitCodes": {"operator": "In", "values": [42]}},
        ]),
    );
    let g = with_status(g.clone(), &run(&g, &[], None, T0));
    let p = run(
        &g,
        &[failed_on_rule(&g, 1, 1, at)],
        exit(1, 143),
        "2026-11-30T06:00:31Z",
    );
    assert_eq!(creates(&p), vec![2]);
    let f = p.status.last_failure.clone().unwrap();
    assert_eq!(
        (f.reason.as_str(), f.rule, f.counted),
        ("Disrupted", None, false)
    );
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
                why: JobDeletion::Old,
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
fn a_job_is_created_only_from_a_view_known_current_in_the_term() {
    // A cached view the previous holder of the shard may have moved past: it deleted
    // attempt 1's Job to replace it, and a create from this view would bring it back.
    let g = gpujob(3);
    let unconfirmed = |g: &GpuJob, jobs: &[Job]| plan_from(g, jobs, None, false, false, T0);
    let p = unconfirmed(&g, &[]);
    assert!(matches!(p.actions[0], Action::Confirm), "{:?}", p.actions);
    assert_eq!(creates(&p), vec![1]);
    // Known current: no read.
    assert!(!run(&g, &[], None, T0).actions.contains(&Action::Confirm));
    // Nothing to create: nothing to confirm (a converged GpuJob costs no read).
    let running = with_status(g.clone(), &run(&g, &[], None, T0));
    let jobs = [job(&running, 1, None)];
    assert!(unconfirmed(&running, &jobs).actions.is_empty());
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
        unschedulable: None,
        queue_wait: None,
        refused: Some(refused),
        quota_required: false,
        quota: None,
        pods: Some(Vec::new()),
        confirmed: true,
        term_start_due: false,
        reads: Reads::every(),
        nodes: Vec::new(),
        cached_pods: Vec::new(),
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

/// A Job refused for the attempt after a failed one: Ready says both, once, and looked at
/// again it stays as it is (the refusal recorded in Ready is not prefixed again).
#[test]
fn a_refused_attempt_after_a_failure_says_both_once_however_often_it_is_looked_at() {
    let g = gpujob(3);
    let g = with_status(g.clone(), &run(&g, &[], None, T0));
    let jobs = [job(
        &g,
        1,
        Some(("Failed", "BackoffLimitExceeded", "2026-11-30T06:00:30Z")),
    )];
    let g = with_status(
        g.clone(),
        &run(&g, &jobs, exit(1, 3), "2026-11-30T06:00:31Z"),
    );
    let mut obs = observed(&g, &[], "2026-11-30T06:00:40Z");
    let seen = seen(&jobs);
    obs.jobs = seen.iter().collect();
    obs.pods = Some(Vec::new());
    obs.refused = Some(Refusal {
        attempt: 2,
        reason: INVALID_SPEC,
        message: "spec.nodeSelector: Invalid value".into(),
    });
    let p = plan(&obs, &settings());
    assert!(creates(&p).is_empty());
    let said = "attempt 1 failed: exit code 3 (Error); spec.nodeSelector: Invalid value";
    assert_eq!(p.status.condition(READY).unwrap().message, said);
    assert_eq!(
        p.status.last_error.as_deref(),
        Some("spec.nodeSelector: Invalid value")
    );

    let mut g = with_status(g, &p);
    for _ in 0..3 {
        let again = run(&g, &jobs, None, "2026-11-30T06:01:00Z");
        assert!(again.actions.is_empty(), "{:?}", again.actions);
        assert_eq!(again.next, Next::Done);
        assert_eq!(Some(&again.status), g.status.as_ref(), "nothing to write");
        g = with_status(g, &again);
    }
}

/// A spec beyond the operator's limits waits; once the operator allows it (its limits
/// raised, the same generation), the attempt starts: Ready's record of a reason found by
/// checking the spec is checked afresh, not kept as a refusal would be.
#[test]
fn a_spec_over_the_limits_starts_once_the_limits_allow_it() {
    let mut g = gpujob(3);
    g.spec.gpus = 16;
    let p = run(&g, &[], None, T0);
    assert_eq!(ready(&p), (ConditionStatus::False, INVALID_SPEC.into()));
    assert!(creates(&p).is_empty());
    let g = with_status(g, &p);
    let mut raised = settings();
    raised.limits.max_gpus = 16;
    let p = plan(&observed_with_pods(&g, T0), &raised);
    assert_eq!(creates(&p), vec![1]);
}

fn observed_with_pods<'a>(g: &'a GpuJob, now: &str) -> Observed<'a> {
    Observed {
        pods: Some(Vec::new()),
        ..observed(g, &[], now)
    }
}

mod quota {
    //! The quota protocol, step by step, with the answers fed back as the executor does.

    use super::gate::kinds;
    use super::*;
    use crate::api::{ANNOTATION_SKIP_RELEASE, FINALIZER_QUOTA, QuotaCall, QuotaOp};
    use crate::status::{CLEANUP_STUCK, QUOTA_RESERVED};

    fn with_finalizer(mut g: GpuJob) -> GpuJob {
        g.metadata.finalizers = Some(vec![FINALIZER_QUOTA.to_owned()]);
        g
    }

    fn quota_plan(g: &GpuJob, jobs: &[Job], answer: Option<QuotaAnswer>, now: &str) -> Plan {
        plan_from(g, jobs, answer, true, true, now)
    }

    fn granted() -> Option<QuotaAnswer> {
        Some(QuotaAnswer::Reserved {
            id: "r-1".into(),
            gpus: 1,
        })
    }

    /// A running GpuJob holding reservation r-1, as the protocol leaves it.
    fn reserved_and_running(g: &GpuJob) -> GpuJob {
        let g = with_finalizer(g.clone());
        let p = quota_plan(&g, &[], granted(), T0);
        with_status(g, &p)
    }

    #[test]
    fn finalizer_then_reserve_then_record_then_the_job() {
        let g = gpujob(3);
        let p = quota_plan(&g, &[], None, T0);
        assert_eq!(kinds(&p), vec!["AddFinalizer", "RecordStatus", "Reserve"]);
        assert!(p.asks(), "the reserve's answer decides what follows");
        let Some(Action::Reserve(req, sequence)) = p.actions.last() else {
            panic!("reserve")
        };
        assert_eq!((req.uid.as_str(), req.gpus, *sequence), ("uid-1", 1, 1));
        // The call is recorded before it is sent: a lost answer is still known.
        let Action::RecordStatus(recorded) = &p.actions[1] else {
            panic!("record")
        };
        assert_eq!(
            recorded.quota_call,
            Some(QuotaCall {
                op: QuotaOp::Reserve,
                sequence: 1,
                pending: true
            })
        );

        // Granted: the id is recorded before the Job is created.
        let g = with_finalizer(g);
        let p = quota_plan(&g, &[], granted(), T0);
        assert_eq!(kinds(&p), vec!["RecordStatus", "CreateJob"]);
        let Action::RecordStatus(recorded) = &p.actions[0] else {
            panic!("record")
        };
        assert_eq!(recorded.reservation_id.as_deref(), Some("r-1"));
        assert_eq!(recorded.attempts, 0, "recorded before the attempt starts");
        assert_eq!(p.status.reservation_id.as_deref(), Some("r-1"));
        assert_eq!(p.status.phase, Some(Phase::Running));
        assert_eq!(
            p.status.condition(QUOTA_RESERVED).unwrap().status,
            ConditionStatus::True
        );

        // Converged: nothing to do, nothing to write, nothing to ask.
        let g = with_status(g, &p);
        let jobs = [job(&g, 1, None)];
        let again = quota_plan(&g, &jobs, None, "2026-11-30T07:00:00Z");
        assert!(again.actions.is_empty(), "{:?}", kinds(&again));
        assert_eq!(Some(&again.status), g.status.as_ref());
    }

    #[test]
    fn a_multi_node_gpujob_reserves_the_gpus_of_all_its_nodes() {
        let mut g = gpujob(3);
        g.spec.gpus = 2;
        g.spec.v2 = Some(V2Only {
            nodes: Some(3),
            ..V2Only::default()
        });
        let p = quota_plan(&g, &[], None, T0);
        let Some(Action::Reserve(req, _)) = p.actions.last() else {
            panic!("reserve: {:?}", kinds(&p))
        };
        assert_eq!(req.gpus, 6);
        // More than --max-gpus (8 here) in all: an invalid spec, nothing reserved.
        g.spec.v2.as_mut().unwrap().nodes = Some(5);
        let p = quota_plan(&g, &[], None, T0);
        assert!(!kinds(&p).contains(&"Reserve"), "{:?}", kinds(&p));
        let message = p.status.condition(READY).unwrap().message.clone();
        assert!(
            message.contains("10 GPUs requested (2 on each of 5 nodes)"),
            "{message}"
        );
    }

    /// The plan as made from a cached view another replica may have moved past.
    fn cached_plan(g: &GpuJob, jobs: &[Job], now: &str) -> Plan {
        plan_from(g, jobs, None, true, false, now)
    }

    #[test]
    fn a_quota_call_is_made_only_from_a_confirmed_view() {
        // The finalizer is there already: nothing in the plan writes the GpuJob before
        // the reserve, so it is read first (the quota service cannot refuse a reserve
        // for a GpuJob that finished or went away meanwhile; it would leak).
        // (Recording the call is such a write too; the executor skips the Confirm once
        // a write has confirmed the view.)
        let g = with_finalizer(gpujob(3));
        assert_eq!(
            kinds(&cached_plan(&g, &[], T0)),
            vec!["RecordStatus", "Confirm", "Reserve"]
        );
        // Adding the finalizer is a write with a resourceVersion precondition: it
        // confirms the view by itself.
        let fresh = gpujob(3);
        assert_eq!(
            kinds(&cached_plan(&fresh, &[], T0)),
            vec!["AddFinalizer", "RecordStatus", "Reserve"]
        );
        // The release when the attempt succeeded (a stale view could release the
        // reservation of a rerun).
        let g = reserved_and_running(&gpujob(3));
        let done = [job(&g, 1, Some(("Complete", "", "2026-11-30T06:05:00Z")))];
        assert_eq!(
            kinds(&cached_plan(&g, &done, "2026-11-30T06:05:01Z")),
            vec!["RecordStatus", "Confirm", "Release"]
        );
        // Nothing asked, nothing confirmed: a converged GpuJob costs no read.
        let jobs = [job(&g, 1, None)];
        assert!(
            cached_plan(&g, &jobs, "2026-11-30T06:01:00Z")
                .actions
                .is_empty()
        );
    }

    #[test]
    fn an_invalid_spec_reserves_nothing() {
        let mut g = gpujob(3);
        g.spec.image = "Not A Valid Image".into();
        let p = quota_plan(&g, &[], None, T0);
        assert!(p.actions.is_empty(), "{:?}", kinds(&p));
        assert_eq!(ready(&p), (ConditionStatus::False, INVALID_SPEC.into()));
        assert_eq!(p.next, Next::Done, "waits for a spec change");
    }

    #[test]
    fn a_taken_job_name_reserves_nothing_and_looks_again_later() {
        let g = gpujob(3);
        let obs = Observed {
            gpujob: &g,
            jobs: vec![],
            termination: None,
            unschedulable: None,
            queue_wait: None,
            refused: Some(Refusal {
                attempt: 1,
                reason: JOB_NAME_CONFLICT,
                message: "Job ns/train-1 exists".into(),
            }),
            quota_required: true,
            quota: None,
            pods: Some(Vec::new()),
            confirmed: true,
            term_start_due: false,
            reads: Reads::every(),
            nodes: Vec::new(),
            cached_pods: Vec::new(),
            now: t(T0),
        };
        let p = plan(&obs, &settings());
        assert!(p.actions.is_empty(), "{:?}", kinds(&p));
        assert_eq!(ready(&p).1, JOB_NAME_CONFLICT);
        assert_eq!(p.next, Next::After(Duration::from_secs(30)));
    }

    #[test]
    fn a_spec_made_invalid_while_no_attempt_runs_releases_the_reservation() {
        // Attempt 1 failed; during the backoff the spec becomes invalid.
        let g = reserved_and_running(&gpujob(3));
        let failed = [job(
            &g,
            1,
            Some(("Failed", "BackoffLimitExceeded", "2026-11-30T06:00:30Z")),
        )];
        let mut g = with_status(
            g.clone(),
            &quota_plan(&g, &failed, None, "2026-11-30T06:00:31Z"),
        );
        assert_eq!(g.status.as_ref().unwrap().phase, Some(Phase::Pending));
        g.metadata.generation = Some(2);
        g.spec.image = "Not A Valid Image".into();
        let p = quota_plan(&g, &failed, None, "2026-11-30T06:00:32Z");
        assert_eq!(kinds(&p), vec!["RecordStatus", "Release"]);
        let p = quota_plan(
            &g,
            &failed,
            Some(QuotaAnswer::Released),
            "2026-11-30T06:00:32Z",
        );
        assert!(p.actions.is_empty(), "the finalizer stays: {:?}", kinds(&p));
        assert_eq!(p.status.reservation_id, None);
        assert_eq!(
            ready(&p).1,
            "BackingOff",
            "InvalidSpec once the backoff ends"
        );
        assert_eq!(
            p.status.condition(QUOTA_RESERVED).unwrap().reason,
            "Released"
        );

        // Fixed: reserved again, then the next attempt starts on the new spec.
        let mut g = with_status(g, &p);
        g.metadata.generation = Some(3);
        g.spec.image = "img".into();
        let p = quota_plan(&g, &failed, None, "2026-11-30T06:01:00Z");
        assert_eq!(
            kinds(&p),
            vec!["RecordStatus", "Reserve"],
            "the finalizer is still there"
        );
        let p = quota_plan(&g, &failed, granted(), "2026-11-30T06:01:00Z");
        assert_eq!(kinds(&p), vec!["RecordStatus", "CreateJob"]);
    }

    #[test]
    fn an_invalid_change_to_a_running_attempt_keeps_its_reservation() {
        let g = reserved_and_running(&gpujob(3));
        let jobs = [job(&g, 1, None)];
        let mut g = g;
        g.metadata.generation = Some(2);
        g.spec.image = "Not A Valid Image".into();
        let p = quota_plan(&g, &jobs, None, T0);
        assert!(p.actions.is_empty(), "{:?}", kinds(&p));
        assert_eq!(p.status.reservation_id.as_deref(), Some("r-1"));
        assert_eq!(
            p.status.condition(SPEC_CHANGE_PENDING).unwrap().reason,
            INVALID_SPEC
        );
    }

    #[test]
    fn refused_quota_starts_nothing_and_asks_again_with_backoff() {
        let g = with_finalizer(gpujob(3));
        let refused = Some(QuotaAnswer::Refused {
            reason: "InsufficientQuota".into(),
            message: "8 GPUs requested, 2 free".into(),
        });
        let p = quota_plan(&g, &[], refused.clone(), T0);
        assert!(creates(&p).is_empty());
        assert_eq!(p.status.phase, Some(Phase::Pending));
        assert_eq!(ready(&p).1, "QuotaRefused");
        let c = p.status.condition(QUOTA_RESERVED).unwrap();
        assert_eq!(
            (c.status, c.reason.as_str()),
            (ConditionStatus::False, "InsufficientQuota")
        );
        assert_eq!(p.next, Next::Backoff);
        // The same refusal again writes the same status.
        let g = with_status(g, &p);
        let again = quota_plan(&g, &[], refused, "2026-11-30T06:00:05Z");
        assert_eq!(Some(&again.status), g.status.as_ref());
    }

    #[test]
    fn a_finished_gpujob_releases_records_then_drops_the_finalizer() {
        let g = reserved_and_running(&gpujob(3));
        let done = [job(&g, 1, Some(("Complete", "", "2026-11-30T06:01:00Z")))];
        let p = quota_plan(&g, &done, None, "2026-11-30T06:01:01Z");
        assert_eq!(kinds(&p), vec!["RecordStatus", "Release"]);
        // The release is recorded with the phase that asks for it: the plan made again
        // with the answer starts from a finished GpuJob, not one that wants quota.
        let g = with_recorded(g, &p);
        assert_eq!(g.status.as_ref().unwrap().phase, Some(Phase::Succeeded));
        let p = quota_plan(
            &g,
            &done,
            Some(QuotaAnswer::Released),
            "2026-11-30T06:01:01Z",
        );
        assert_eq!(kinds(&p), vec!["RecordStatus", "RemoveFinalizer"]);
        let Action::RecordStatus(recorded) = &p.actions[0] else {
            panic!("record")
        };
        assert_eq!(recorded.phase, Some(Phase::Succeeded));
        assert_eq!(
            recorded.reservation_id, None,
            "released before the finalizer goes"
        );
        assert_eq!(**recorded, p.status, "nothing left to write afterwards");
    }

    #[test]
    fn a_failing_release_is_retried_and_becomes_cleanup_stuck_after_the_timeout() {
        let mut g = reserved_and_running(&gpujob(3));
        g.metadata.deletion_timestamp = Some(Time(t(T0)));
        let failed = || {
            Some(QuotaAnswer::ReleaseFailed {
                message: "503".into(),
            })
        };
        let p = quota_plan(&g, &[], None, T0);
        assert_eq!(kinds(&p), vec!["RecordStatus", "Release"]);
        let p = quota_plan(&g, &[], failed(), T0);
        assert!(p.actions.is_empty());
        assert_eq!(p.status.release_failing_since, Some(t(T0)));
        assert!(p.status.condition(CLEANUP_STUCK).is_none());
        assert_eq!(p.next, Next::Backoff);
        let g = with_status(g, &p);
        let p = quota_plan(&g, &[], failed(), "2026-11-30T06:01:00Z");
        assert_eq!(
            p.status.condition(CLEANUP_STUCK).unwrap().status,
            ConditionStatus::True,
            "60 s cleanup timeout"
        );
        assert_eq!(
            p.status.release_failing_since,
            Some(t(T0)),
            "since the first failure"
        );
        // Released at last: recorded, the stuck condition goes, then the finalizer.
        let g = with_status(g, &p);
        let p = quota_plan(&g, &[], Some(QuotaAnswer::Released), "2026-11-30T06:02:00Z");
        assert_eq!(kinds(&p), vec!["RecordStatus", "RemoveFinalizer"]);
        assert!(p.status.condition(CLEANUP_STUCK).is_none());
        assert_eq!(p.status.release_failing_since, None);
    }

    #[test]
    fn deletion_can_be_unlocked_without_a_release() {
        let mut g = reserved_and_running(&gpujob(3));
        g.metadata.deletion_timestamp = Some(Time(t(T0)));
        g.metadata.annotations =
            Some([(ANNOTATION_SKIP_RELEASE.to_owned(), "true".to_owned())].into());
        let p = quota_plan(&g, &[], None, T0);
        assert_eq!(kinds(&p), vec!["Publish", "RemoveFinalizer"]);
        let Action::Publish(note) = &p.actions[0] else {
            panic!("publish")
        };
        assert!(note.note.contains("r-1"), "{}", note.note);
        assert!(
            note.records_state_change(),
            "the only record of the abandoned reservation: never dropped"
        );
        assert_eq!(
            p.actions[1],
            Action::RemoveFinalizer(FinalizerRemoval::ReleaseSkipped)
        );
    }

    #[test]
    fn quota_switched_off_drops_the_finalizer() {
        let g = reserved_and_running(&gpujob(3));
        let jobs = [job(&g, 1, None)];
        let p = run(&g, &jobs, None, T0);
        assert_eq!(
            p.actions,
            vec![Action::RemoveFinalizer(FinalizerRemoval::QuotaDisabled)]
        );
    }

    /// The status as the plan's last `RecordStatus` left it (what the API server has
    /// when the call that follows is sent).
    fn with_recorded(mut g: GpuJob, p: &Plan) -> GpuJob {
        let last = p.actions.iter().rev().find_map(|a| match a {
            Action::RecordStatus(s) => Some((**s).clone()),
            _ => None,
        });
        g.status = Some(last.expect("a recorded status"));
        g
    }

    fn call(p: &Plan) -> Option<(QuotaOp, i64)> {
        match p.actions.last() {
            Some(Action::Reserve(_, n)) => Some((QuotaOp::Reserve, *n)),
            Some(Action::Release(n)) => Some((QuotaOp::Release, *n)),
            _ => None,
        }
    }

    fn suspended(mut g: GpuJob, on: bool) -> GpuJob {
        g.spec.suspend = on;
        g.metadata.generation = Some(g.metadata.generation.unwrap_or(1) + 1);
        g
    }

    #[test]
    fn a_release_that_did_not_confirm_is_never_built_on_the_next_attempt_reserves_again() {
        // Running on r-1 (reserved with call 1); suspended; the Job is gone: release.
        let g = with_finalizer(gpujob(3));
        let p = quota_plan(&g, &[], None, T0);
        let g = with_recorded(g, &p);
        let g = with_status(g.clone(), &quota_plan(&g, &[], granted(), T0));
        let g = suspended(g, true);
        let p = quota_plan(&g, &[], None, "2026-11-30T06:01:00Z");
        assert_eq!(call(&p), Some((QuotaOp::Release, 2)));
        // It timed out: it may land at any time later.
        let g = with_recorded(g, &p);
        let failed = Some(QuotaAnswer::ReleaseFailed {
            message: "timed out".into(),
        });
        let g = with_status(
            g.clone(),
            &quota_plan(&g, &[], failed, "2026-11-30T06:01:00Z"),
        );
        assert_eq!(
            g.status.as_ref().unwrap().reservation_id.as_deref(),
            Some("r-1"),
            "kept: it may still be held"
        );
        // Resumed: no attempt on r-1; a new reserve, with a number the late release
        // cannot beat, comes first.
        let g = suspended(g, false);
        let p = quota_plan(&g, &[], None, "2026-11-30T06:02:00Z");
        assert!(creates(&p).is_empty(), "{:?}", kinds(&p));
        assert_eq!(kinds(&p), vec!["RecordStatus", "Reserve"]);
        assert_eq!(call(&p), Some((QuotaOp::Reserve, 3)));
        let g = with_recorded(g, &p);
        let p = quota_plan(&g, &[], granted(), "2026-11-30T06:02:00Z");
        assert_eq!(creates(&p), vec![2]);
        let c = p.status.quota_call.clone().unwrap();
        assert_eq!((c.op, c.sequence, c.pending), (QuotaOp::Reserve, 3, false));
    }

    #[test]
    fn a_call_repeats_with_its_number_and_any_other_call_takes_a_larger_one() {
        let g = with_finalizer(gpujob(3));
        let p = quota_plan(&g, &[], None, T0);
        assert_eq!(call(&p), Some((QuotaOp::Reserve, 1)));
        // No answer (timed out): the reconcile fails, the status keeps the call pending.
        let g = with_recorded(g, &p);
        let again = quota_plan(&g, &[], None, "2026-11-30T06:00:01Z");
        assert_eq!(kinds(&again), vec!["Reserve"], "a repeat: no new record");
        assert_eq!(call(&again), Some((QuotaOp::Reserve, 1)));
        // Deleted now: the release outnumbers the reserve, so the reserve, should it
        // land late, is refused by the service instead of leaking.
        let mut g = g;
        g.metadata.deletion_timestamp = Some(Time(t("2026-11-30T06:00:02Z")));
        let p = quota_plan(&g, &[], None, "2026-11-30T06:00:02Z");
        assert_eq!(kinds(&p), vec!["RecordStatus", "Release"]);
        assert_eq!(call(&p), Some((QuotaOp::Release, 2)));
        // Confirmed: recorded (no longer pending) before the finalizer goes.
        let g = with_recorded(g, &p);
        let p = quota_plan(&g, &[], Some(QuotaAnswer::Released), "2026-11-30T06:00:02Z");
        assert_eq!(kinds(&p), vec!["RecordStatus", "RemoveFinalizer"]);
        let c = with_recorded(g, &p).status.unwrap().quota_call.unwrap();
        assert_eq!((c.op, c.sequence, c.pending), (QuotaOp::Release, 2, false));
    }

    #[test]
    fn a_gpujob_deleted_while_running_stops_its_job_before_it_releases() {
        let g = reserved_and_running(&gpujob(3));
        let done = job(&g, 1, Some(("Failed", "BackoffLimitExceeded", T0)));
        let running = job(&g, 2, None);
        let mut g = g;
        g.metadata.deletion_timestamp = Some(Time(t("2026-11-30T06:05:00Z")));
        let now = "2026-11-30T06:05:00Z";
        // The running attempt's Job goes first, in the foreground (once its pods have
        // stopped); the finished one holds nothing. No release yet.
        let p = quota_plan(&g, &[done.clone(), running.clone()], None, now);
        let deleted: Vec<_> = p
            .actions
            .iter()
            .map(|a| match a {
                Action::DeleteJob { name, why, .. } => Some((name.as_str(), *why)),
                _ => None,
            })
            .collect();
        assert_eq!(deleted, vec![Some(("train-2", JobDeletion::GpuJobDeleted))]);
        assert!(JobDeletion::GpuJobDeleted.foreground());
        // Being deleted (its pods stopping): wait, ask nothing.
        let mut stopping = running.clone();
        stopping.metadata.deletion_timestamp = Some(Time(t(now)));
        let p = quota_plan(&g, &[done.clone(), stopping], None, now);
        assert!(p.actions.is_empty(), "{:?}", kinds(&p));
        // Gone: now the release.
        let p = quota_plan(&g, &[done], None, now);
        assert_eq!(kinds(&p), vec!["RecordStatus", "Release"]);
    }

    #[test]
    fn a_deleted_gpujobs_quota_is_released_only_once_a_pod_read_finds_none() {
        // Its Jobs are gone, but a pod created as the delete began can outlive its Job.
        let mut g = reserved_and_running(&gpujob(3));
        g.metadata.deletion_timestamp = Some(Time(t("2026-11-30T06:05:00Z")));
        let now = "2026-11-30T06:05:01Z";
        let with =
            |pods: Option<Vec<SeenPod>>| plan_seeing_pods(&g, &[], None, true, true, pods, now);
        assert_eq!(kinds(&with(None)), vec!["ReadPods"]);
        let orphan = SeenPod {
            name: "train-1-abcde".into(),
            attempt: Some(1),
            bound: true,
            ..SeenPod::default()
        };
        let p = with(Some(vec![orphan]));
        assert!(p.actions.is_empty(), "{:?}", kinds(&p));
        assert_eq!(p.next, Next::Backoff, "only a read is sure");
        assert_eq!(
            kinds(&with(Some(Vec::new()))),
            vec!["RecordStatus", "Release"]
        );
    }

    #[test]
    fn a_reserve_whose_answer_was_lost_is_released_once_the_gpujob_cannot_run() {
        for stop in ["suspend", "invalid"] {
            let g = with_finalizer(gpujob(3));
            let p = quota_plan(&g, &[], None, T0);
            // Sent; the answer never came. No reservation id, but quota may be held.
            let mut g = with_recorded(g, &p);
            assert_eq!(g.status.as_ref().unwrap().reservation_id, None);
            g.metadata.generation = Some(2);
            match stop {
                "suspend" => g.spec.suspend = true,
                _ => g.spec.image = "Not A Valid Image".into(),
            }
            let p = quota_plan(&g, &[], None, "2026-11-30T06:00:10Z");
            assert_eq!(kinds(&p), vec!["RecordStatus", "Release"], "{stop}");
            assert_eq!(call(&p), Some((QuotaOp::Release, 2)), "{stop}");
            let g = with_recorded(g, &p);
            let p = quota_plan(&g, &[], Some(QuotaAnswer::Released), "2026-11-30T06:00:10Z");
            assert!(p.actions.is_empty(), "the finalizer stays: {:?}", kinds(&p));
            // Settled: looking again asks nothing.
            let g = with_status(g, &p);
            let again = quota_plan(&g, &[], None, "2026-11-30T06:00:20Z");
            assert!(again.actions.is_empty(), "{stop}: {:?}", kinds(&again));
            assert_eq!(Some(&again.status), g.status.as_ref());
        }
    }

    #[test]
    fn a_reservation_recorded_before_calls_were_numbered_is_used_and_released() {
        // Recorded by an operator that did not record its calls.
        let g = reserved_and_running(&gpujob(3));
        assert_eq!(g.status.as_ref().unwrap().quota_call, None);
        let running = [job(&g, 1, None)];
        assert!(quota_plan(&g, &running, None, T0).actions.is_empty());
        let done = [job(&g, 1, Some(("Complete", "", "2026-11-30T06:01:00Z")))];
        let p = quota_plan(&g, &done, None, "2026-11-30T06:01:01Z");
        assert_eq!(call(&p), Some((QuotaOp::Release, 1)));
    }
}

mod lifecycle {
    //! Suspend and resume, rerun, terminal conditions, time to live.

    use super::*;
    use crate::api::ANNOTATION_RERUN;
    use crate::status::{COMPLETE, FAILED, SUSPENDED};

    fn suspend(mut g: GpuJob, on: bool) -> GpuJob {
        g.spec.suspend = on;
        g.metadata.generation = Some(g.metadata.generation.unwrap_or(1) + 1);
        g
    }

    fn cond(p: &Plan, t: &str) -> Option<(ConditionStatus, String)> {
        p.status.condition(t).map(|c| (c.status, c.reason.clone()))
    }

    fn deletes(p: &Plan) -> Vec<(String, bool)> {
        p.actions
            .iter()
            .filter_map(|a| match a {
                Action::DeleteJob { name, why, .. } => Some((name.clone(), why.foreground())),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn suspending_stops_the_running_attempt_without_a_failure_and_resuming_starts_the_next() {
        let g = gpujob(3);
        let g = with_status(g.clone(), &run(&g, &[], None, T0));
        let running = [job(&g, 1, None)];
        let g = suspend(g, true);
        let p = run(&g, &running, None, "2026-11-30T06:00:10Z");
        assert_eq!(deletes(&p), vec![("train-1".to_owned(), true)]);
        let Action::RecordStatus(recorded) = &p.actions[0] else {
            panic!("recorded before the delete: {:?}", p.actions)
        };
        assert_eq!(recorded.replacing_attempt, Some(1));
        assert!(recorded.condition(SUSPENDED).is_some(), "with why");
        assert_eq!(p.status.phase, Some(Phase::Suspended));
        assert_eq!(ready(&p).1, SUSPENDED);
        assert_eq!(
            cond(&p, SUSPENDED),
            Some((ConditionStatus::True, "Suspended".into()))
        );

        // Its Job is gone: nothing starts while suspended, nothing failed.
        let g = with_status(g, &p);
        let p = run(&g, &[], None, "2026-11-30T06:00:20Z");
        assert!(p.actions.is_empty(), "{:?}", p.actions);
        assert_eq!(p.status.phase, Some(Phase::Suspended));
        assert_eq!(p.status.failures, 0);
        let g = with_status(g, &p);
        let again = run(&g, &[], None, "2026-11-30T06:00:30Z");
        assert_eq!(
            Some(&again.status),
            g.status.as_ref(),
            "then nothing to write"
        );

        // Resumed: the next attempt, attempt 2.
        let g = suspend(g, false);
        let p = run(&g, &[], None, "2026-11-30T06:01:00Z");
        assert_eq!(creates(&p), vec![2]);
        assert_eq!((p.status.attempts, p.status.failures), (2, 0));
        assert_eq!(
            cond(&p, SUSPENDED),
            Some((ConditionStatus::False, "Resumed".into()))
        );
    }

    #[test]
    fn a_suspend_during_backoff_waits_and_the_backoff_still_counts_from_the_failure() {
        let g = gpujob(3);
        let g = with_status(g.clone(), &run(&g, &[], None, T0));
        let failed = [job(
            &g,
            1,
            Some(("Failed", "BackoffLimitExceeded", "2026-11-30T06:00:30Z")),
        )];
        let g = suspend(
            with_status(g.clone(), &run(&g, &failed, None, "2026-11-30T06:00:31Z")),
            true,
        );
        let p = run(&g, &failed, None, "2026-11-30T06:00:32Z");
        assert!(creates(&p).is_empty());
        assert_eq!(p.status.phase, Some(Phase::Suspended));
        assert_eq!(p.status.next_attempt_time, None);
        assert_eq!(p.status.failures, 1, "the failure stays counted");
        // Resumed before the backoff ended: it waits for the rest of it.
        let g = suspend(with_status(g, &p), false);
        let early = run(&g, &failed, None, "2026-11-30T06:00:35Z");
        assert!(creates(&early).is_empty());
        assert_eq!(ready(&early).1, "BackingOff");
        assert_eq!(
            early.status.next_attempt_time,
            Some(t("2026-11-30T06:00:40Z"))
        );
        let late = run(&g, &failed, None, "2026-11-30T06:00:40Z");
        assert_eq!(creates(&late), vec![2]);
    }

    #[test]
    fn a_suspended_gpujob_releases_its_quota_and_reserves_again_on_resume() {
        let mut g = gpujob(3);
        g.metadata.finalizers = Some(vec![crate::api::FINALIZER_QUOTA.to_owned()]);
        let obs = |g: &GpuJob, answer: Option<QuotaAnswer>, jobs: &[Job]| {
            plan_from(g, jobs, answer, true, true, T0)
        };
        let g = with_status(
            g.clone(),
            &obs(
                &g,
                Some(QuotaAnswer::Reserved {
                    id: "r-1".into(),
                    gpus: 1,
                }),
                &[],
            ),
        );
        let g = suspend(g, true);
        // The attempt's Job is gone; nothing runs: release.
        let p = obs(&g, None, &[]);
        let [Action::RecordStatus(recorded), Action::Release(1)] = p.actions.as_slice() else {
            panic!("{:?}", p.actions)
        };
        let mut g = g;
        g.status = Some((**recorded).clone());
        let p = obs(&g, Some(QuotaAnswer::Released), &[]);
        assert_eq!(p.status.reservation_id, None);
        assert_eq!(p.status.phase, Some(Phase::Suspended));
        let g = suspend(with_status(g, &p), false);
        let p = obs(&g, None, &[]);
        assert!(
            matches!(p.actions.last(), Some(Action::Reserve(_, 2))),
            "{:?}",
            p.actions
        );
    }

    fn finished(g: &GpuJob, jobs: &[Job]) -> GpuJob {
        with_status(g.clone(), &run(g, jobs, None, "2026-11-30T06:02:00Z"))
    }

    #[test]
    fn terminal_conditions_are_set_once() {
        let g = gpujob(0);
        let g = with_status(g.clone(), &run(&g, &[], None, T0));
        let ok = [job(&g, 1, Some(("Complete", "", "2026-11-30T06:01:00Z")))];
        let done = finished(&g, &ok);
        let c = done.condition(COMPLETE).unwrap();
        assert_eq!(
            (c.status, c.reason.as_str()),
            (ConditionStatus::True, "Succeeded")
        );
        assert!(done.condition(FAILED).is_none());
        let again = run(&done, &ok, None, "2026-11-30T09:00:00Z");
        assert_eq!(
            Some(&again.status),
            done.status.as_ref(),
            "never changed after"
        );

        let bad = [job(
            &g,
            1,
            Some(("Failed", "BackoffLimitExceeded", "2026-11-30T06:01:00Z")),
        )];
        let failed = finished(&g, &bad);
        let c = failed.condition(FAILED).unwrap();
        assert_eq!(
            (c.status, c.reason.as_str()),
            (ConditionStatus::True, "RetriesExhausted")
        );
        assert!(failed.condition(COMPLETE).is_none());

        // Finished before these conditions existed: they are added.
        let mut old = done.clone();
        if let Some(s) = old.status.as_mut() {
            s.conditions.retain(|c| c.type_ != COMPLETE);
        }
        let p = run(&old, &ok, None, "2026-11-30T09:00:00Z");
        assert!(p.status.condition(COMPLETE).is_some());
    }

    fn with_rerun(mut g: GpuJob, token: &str) -> GpuJob {
        g.metadata.annotations = Some([(ANNOTATION_RERUN.to_owned(), token.to_owned())].into());
        g
    }

    #[test]
    fn a_rerun_starts_a_new_run_whose_attempts_continue_the_numbering() {
        let g = gpujob(0);
        let g = with_status(g.clone(), &run(&g, &[], None, T0));
        let bad = [job(
            &g,
            1,
            Some(("Failed", "BackoffLimitExceeded", "2026-11-30T06:01:00Z")),
        )];
        let failed = finished(&g, &bad);
        assert_eq!(failed.status.as_ref().unwrap().phase, Some(Phase::Failed));

        let asked = with_rerun(failed, "2026-11-30a");
        let p = run(&asked, &bad, None, "2026-11-30T07:00:00Z");
        let Action::RecordStatus(recorded) = &p.actions[0] else {
            panic!("the new run is recorded first: {:?}", p.actions)
        };
        assert_eq!(
            (recorded.run, recorded.run_first_attempt, recorded.failures),
            (Some(2), Some(2), 0)
        );
        assert_eq!(recorded.phase, Some(Phase::Pending));
        assert!(recorded.condition(FAILED).is_none());
        assert_eq!(creates(&p), vec![2], "attempt numbers continue");
        assert_eq!(p.status.phase, Some(Phase::Running));
        assert_eq!(p.status.rerun_token.as_deref(), Some("2026-11-30a"));

        // Attempt 1's failure belongs to run 1: attempt 2's success ends run 2.
        let g = with_status(asked, &p);
        let jobs = [
            bad[0].clone(),
            job(&g, 2, Some(("Complete", "", "2026-11-30T07:01:00Z"))),
        ];
        let p = run(&g, &jobs, None, "2026-11-30T07:01:01Z");
        assert_eq!(p.status.phase, Some(Phase::Succeeded));
        assert_eq!(p.status.failures, 0);
        assert!(p.status.condition(COMPLETE).is_some());
        // The same request again does nothing.
        let g = with_status(g, &p);
        let again = run(&g, &jobs, None, "2026-11-30T08:00:00Z");
        assert!(creates(&again).is_empty());
    }

    #[test]
    fn a_rerun_request_waits_until_the_gpujob_has_finished() {
        let g = gpujob(3);
        let g = with_status(g.clone(), &run(&g, &[], None, T0));
        let running = [job(&g, 1, None)];
        let p = run(
            &with_rerun(g.clone(), "x"),
            &running,
            None,
            "2026-11-30T06:00:10Z",
        );
        assert!(p.actions.is_empty(), "{:?}", p.actions);
        assert_eq!(p.status.run, None);
    }

    #[test]
    fn a_finished_gpujob_is_deleted_once_its_time_to_live_is_over() {
        let mut g = gpujob(0);
        g.spec.ttl_seconds_after_finished = Some(10);
        g.metadata.resource_version = Some("7".into());
        let g = with_status(g.clone(), &run(&g, &[], None, T0));
        let ok = [job(&g, 1, Some(("Complete", "", "2026-11-30T06:01:00Z")))];
        let done = finished(&g, &ok);
        let soon = run(&done, &ok, None, "2026-11-30T06:01:04Z");
        assert!(soon.actions.is_empty());
        assert_eq!(soon.next, Next::After(Duration::from_secs(6)));
        let due = run(&done, &ok, None, "2026-11-30T06:01:10Z");
        assert!(
            matches!(due.actions.as_slice(), [Action::DeleteGpuJob { .. }]),
            "{:?}",
            due.actions
        );
        // The operator's default applies when the spec says nothing.
        let mut plain = done.clone();
        plain.spec.ttl_seconds_after_finished = None;
        let mut s = settings();
        let keep = plan(
            &Observed {
                gpujob: &plain,
                jobs: seen(&ok).iter().collect(),
                termination: None,
                unschedulable: None,
                queue_wait: None,
                refused: None,
                quota_required: false,
                quota: None,
                pods: Some(Vec::new()),
                confirmed: true,
                term_start_due: false,
                reads: Reads::every(),
                nodes: Vec::new(),
                cached_pods: Vec::new(),
                now: t("2026-11-30T08:00:00Z"),
            },
            &s,
        );
        assert!(keep.actions.is_empty(), "no default: kept");
        s.default_ttl = Some(Duration::from_secs(3600));
        let gone = plan(
            &Observed {
                gpujob: &plain,
                jobs: seen(&ok).iter().collect(),
                termination: None,
                unschedulable: None,
                queue_wait: None,
                refused: None,
                quota_required: false,
                quota: None,
                pods: Some(Vec::new()),
                confirmed: true,
                term_start_due: false,
                reads: Reads::every(),
                nodes: Vec::new(),
                cached_pods: Vec::new(),
                now: t("2026-11-30T08:00:00Z"),
            },
            &s,
        );
        assert!(matches!(
            gone.actions.as_slice(),
            [Action::DeleteGpuJob { .. }]
        ));
    }

    #[test]
    fn the_time_to_live_waits_for_the_quota_release() {
        let mut g = gpujob(0);
        g.spec.ttl_seconds_after_finished = Some(0);
        g.metadata.resource_version = Some("7".into());
        g.metadata.finalizers = Some(vec![crate::api::FINALIZER_QUOTA.to_owned()]);
        let mut done = g.clone();
        done.status = Some(GpuJobStatus {
            phase: Some(Phase::Succeeded),
            attempts: 1,
            reservation_id: Some("r-1".into()),
            completion_time: Some(t(T0)),
            ..Default::default()
        });
        let look = |done: &GpuJob, answer| {
            plan(
                &Observed {
                    gpujob: done,
                    jobs: vec![],
                    termination: None,
                    unschedulable: None,
                    queue_wait: None,
                    refused: None,
                    quota_required: true,
                    quota: answer,
                    pods: Some(Vec::new()),
                    confirmed: true,
                    term_start_due: false,
                    reads: Reads::every(),
                    nodes: Vec::new(),
                    cached_pods: Vec::new(),
                    now: t("2026-11-30T07:00:00Z"),
                },
                &settings(),
            )
        };
        assert!(
            matches!(
                look(&done, None).actions.as_slice(),
                [Action::RecordStatus(_), Action::Release(_)]
            ),
            "release first"
        );
        let released = look(&done, Some(QuotaAnswer::Released));
        assert!(
            !released
                .actions
                .iter()
                .any(|a| matches!(a, Action::DeleteGpuJob { .. })),
            "the finalizer goes first: {:?}",
            released.actions
        );
        // Released, recorded, finalizer gone: now it goes.
        done.status = Some(released.status.clone());
        done.metadata.finalizers = None;
        assert!(matches!(
            look(&done, None).actions.as_slice(),
            [Action::DeleteGpuJob { .. }]
        ));
    }
}

mod v2_values {
    //! What only v2 says (v1 `spec.v2`) reaches the plan: its own backoff, a template
    //! that is refused or applied, and a template edit as a spec change.

    use super::*;
    use crate::api::{UpdatePolicy, V2Only};
    use serde_json::json;

    fn with_v2(mut g: GpuJob, v2: V2Only) -> GpuJob {
        g.spec.v2 = Some(v2);
        g
    }

    fn template(volume: &str) -> V2Only {
        V2Only {
            template: Some(json!({"spec": {"volumes": [{"name": volume, "emptyDir": {}}]}})),
            ..V2Only::default()
        }
    }

    fn created(p: &Plan) -> &Job {
        p.actions
            .iter()
            .find_map(|a| match a {
                Action::CreateJob { job, .. } => Some(job.as_ref()),
                _ => None,
            })
            .unwrap()
    }

    #[test]
    fn a_gpujob_backs_off_from_its_own_base_capped_by_the_operator() {
        let own = |secs| {
            with_v2(
                gpujob(3),
                V2Only {
                    backoff_seconds: Some(secs),
                    ..V2Only::default()
                },
            )
        };
        let s = settings();
        let steps: Vec<u64> = (1..=4)
            .map(|f| backoff_for(&s, &own(25).spec, f).as_secs())
            .collect();
        assert_eq!(
            steps,
            vec![25, 50, 60, 60],
            "doubling, capped at the operator's 60 s"
        );
        assert_eq!(backoff_for(&s, &own(600).spec, 1), Duration::from_secs(60));
        assert_eq!(
            backoff_for(&s, &gpujob(3).spec, 2),
            backoff(&s, 2),
            "without its own base: the operator's"
        );

        let g = own(25);
        let g = with_status(g.clone(), &run(&g, &[], None, T0));
        let jobs = [job(
            &g,
            1,
            Some(("Failed", "BackoffLimitExceeded", "2026-11-30T06:00:30Z")),
        )];
        let p = run(&g, &jobs, exit(1, 1), "2026-11-30T06:00:31Z");
        assert_eq!(
            p.status.next_attempt_time,
            Some(t("2026-11-30T06:00:55Z")),
            "25 s after the Job failed"
        );
        let g = with_status(g, &p);
        assert!(creates(&run(&g, &jobs, None, "2026-11-30T06:00:54Z")).is_empty());
        assert_eq!(
            creates(&run(&g, &jobs, None, "2026-11-30T06:00:55Z")),
            vec![2]
        );
    }

    #[test]
    fn the_v1_rollback_mode_runs_the_job_as_v1_says_and_ignores_spec_v2() {
        let g = with_v2(
            gpujob(3),
            V2Only {
                template: Some(json!({"spec": {"volumes": [{"name": "data", "emptyDir": {}}]}})),
                gpu_product: Some("NVIDIA-H100".into()),
                backoff_seconds: Some(25),
                attempt_deadline: Some("90m".into()),
                failure_rules: Vec::new(),
                nodes: Some(2),
                queue_name: Some("team-a".into()),
                devices: None,
                topology: None,
            },
        );
        let v1 = PlanSettings {
            api_versions: ApiVersions::V1,
            ..settings()
        };
        let plan_v1 = |g: &GpuJob, jobs: &[Job], termination, now| {
            plan(
                &Observed {
                    gpujob: g,
                    jobs: seen(jobs).iter().collect(),
                    termination,
                    unschedulable: None,
                    queue_wait: None,
                    refused: None,
                    quota_required: false,
                    quota: None,
                    pods: Some(Vec::new()),
                    confirmed: true,
                    term_start_due: false,
                    reads: Reads::every(),
                    nodes: Vec::new(),
                    cached_pods: Vec::new(),
                    now: t(now),
                },
                &v1,
            )
        };
        let p = plan_v1(&g, &[], None, T0);
        let mut without = g.clone();
        without.spec.v2 = None;
        assert_eq!(
            created(&p),
            created(&run(&without, &[], None, T0)),
            "the Job of the same GpuJob before v2 existed"
        );
        let pod = created(&p)
            .spec
            .as_ref()
            .unwrap()
            .template
            .spec
            .as_ref()
            .unwrap();
        assert!(pod.volumes.is_none(), "no template");
        assert!(
            !pod.node_selector
                .iter()
                .flatten()
                .any(|(k, _)| k == crate::api::LABEL_GPU_PRODUCT),
            "no product"
        );
        assert_ne!(
            created(&p),
            created(&run(&g, &[], None, T0)),
            "v1 and v2 mode differ"
        );

        // The backoff is the operator's (10 s), not the GpuJob's 25 s.
        let g = with_status(g.clone(), &p);
        let jobs = [job(
            &g,
            1,
            Some(("Failed", "BackoffLimitExceeded", "2026-11-30T06:00:30Z")),
        )];
        let p = plan_v1(&g, &jobs, exit(1, 1), "2026-11-30T06:00:31Z");
        assert_eq!(p.status.next_attempt_time, Some(t("2026-11-30T06:00:40Z")));

        // A v2-only value the operator would refuse does not stop a v1 run either.
        let bad = with_v2(
            gpujob(3),
            V2Only {
                template: Some(json!({"spec": {"restartPolicy": "OnFailure"}})),
                ..V2Only::default()
            },
        );
        assert_eq!(creates(&plan_v1(&bad, &[], None, T0)), vec![1]);
        assert!(creates(&run(&bad, &[], None, T0)).is_empty());
    }

    #[test]
    fn a_template_the_operator_refuses_starts_nothing_and_says_why() {
        let g = with_v2(
            gpujob(3),
            V2Only {
                template: Some(json!({"spec": {"restartPolicy": "OnFailure"}})),
                ..V2Only::default()
            },
        );
        let p = run(&g, &[], None, T0);
        assert!(creates(&p).is_empty());
        assert_eq!(ready(&p), (ConditionStatus::False, INVALID_SPEC.into()));
        assert_eq!(p.next, Next::Done, "waits for a spec change");
        assert_eq!(
            p.status.last_error.as_deref(),
            Some(
                "invalid spec: spec.template.spec.restartPolicy: \"OnFailure\": the operator sets Never (retries are attempts)"
            )
        );

        let mut fixed = with_v2(with_status(g, &p), template("data"));
        fixed.metadata.generation = Some(2);
        let p = run(&fixed, &[], None, T0);
        assert_eq!(creates(&p), vec![1]);
        let pod = created(&p)
            .spec
            .as_ref()
            .unwrap()
            .template
            .spec
            .as_ref()
            .unwrap();
        assert_eq!(pod.volumes.as_ref().unwrap()[0].name, "data");
    }

    #[test]
    fn a_template_edit_is_a_spec_change_under_the_update_policy() {
        let g = with_v2(gpujob(3), template("data"));
        let first = run(&g, &[], None, T0);
        let jobs = [job(&g, 1, None)];
        let g = with_status(g, &first);

        // The API server bumps the generation for the edit: it is in spec.
        let mut edited = with_v2(g.clone(), template("scratch"));
        edited.metadata.generation = Some(2);
        let p = run(&edited, &jobs, None, "2026-11-30T06:01:00Z");
        assert!(
            p.actions.iter().any(|a| matches!(
                a,
                Action::DeleteJob {
                    why: JobDeletion::Replaced,
                    ..
                }
            )),
            "Recreate replaces the running attempt: {:?}",
            p.actions
        );
        assert_eq!(p.status.replacing_attempt, Some(1));
        // Its replacement runs on the new template.
        let g2 = with_status(edited.clone(), &p);
        let p = run(&g2, &[], None, "2026-11-30T06:01:10Z");
        assert_eq!(creates(&p), vec![2]);
        let pod = created(&p)
            .spec
            .as_ref()
            .unwrap()
            .template
            .spec
            .as_ref()
            .unwrap();
        assert_eq!(pod.volumes.as_ref().unwrap()[0].name, "scratch");

        let mut later = edited;
        later.spec.update_policy = UpdatePolicy::OnNextAttempt;
        let p = run(&later, &jobs, None, "2026-11-30T06:01:00Z");
        assert!(
            p.actions
                .iter()
                .all(|a| !matches!(a, Action::DeleteJob { .. }))
        );
        assert_eq!(
            p.status.condition(SPEC_CHANGE_PENDING).unwrap().reason,
            "OnNextAttempt"
        );
    }
}

/// Attempt 1's Job, active since `started`, with `ready` of its one pod ready.
fn waiting_job(g: &GpuJob, started: &str, ready: i32) -> Job {
    let mut j = job(g, 1, None);
    j.status = Some(JobStatus {
        active: Some(1),
        ready: Some(ready),
        start_time: Some(Time(t(started))),
        ..Default::default()
    });
    j
}

#[test]
fn a_pod_not_ready_is_read_only_after_the_schedulers_grace() {
    let g = gpujob(0);
    let now = t("2026-11-30T06:00:10Z");
    // Started 2 s ago: 3 s of grace left.
    let young = waiting_job(&g, "2026-11-30T06:00:08Z", 0);
    assert_eq!(
        waiting(&young, now),
        PodsWaiting::Grace(Duration::from_secs(3))
    );
    let old = waiting_job(&g, "2026-11-30T06:00:05Z", 0);
    assert_eq!(waiting(&old, now), PodsWaiting::ReadPod);
    // A pod runs: nothing to ask.
    assert_eq!(
        waiting(&waiting_job(&g, "2026-11-30T06:00:00Z", 1), now),
        PodsWaiting::No
    );
    // No ready count (an API server before 1.24): nothing is guessed.
    let mut unknown = old.clone();
    unknown.status.as_mut().unwrap().ready = None;
    assert_eq!(waiting(&unknown, now), PodsWaiting::No);
    // Finished or being deleted: not waiting to run.
    let done = job(&g, 1, Some(("Complete", "", T0)));
    assert_eq!(waiting(&done, now), PodsWaiting::No);
    let mut deleting = old;
    deleting.metadata.deletion_timestamp = Some(Time(now));
    assert_eq!(waiting(&deleting, now), PodsWaiting::No);
}

#[test]
fn a_multi_node_attempt_waits_while_any_of_its_pods_is_not_ready() {
    let mut g = gpujob(0);
    g.spec.v2 = Some(V2Only {
        nodes: Some(3),
        ..V2Only::default()
    });
    let now = t("2026-11-30T06:00:10Z");
    let mut two_of_three = waiting_job(&g, "2026-11-30T06:00:00Z", 2);
    two_of_three.status.as_mut().unwrap().active = Some(3);
    assert_eq!(waiting(&two_of_three, now), PodsWaiting::ReadPod);
    two_of_three.status.as_mut().unwrap().ready = Some(3);
    assert_eq!(waiting(&two_of_three, now), PodsWaiting::No);
}

#[test]
fn a_running_attempt_whose_pod_fits_no_node_is_pending_with_the_schedulers_reason() {
    let g = running(&gpujob(0), 1, 0);
    let jobs = [waiting_job(&g, T0, 0)];
    let message = "0/4 nodes are available: 4 Insufficient nvidia.com/gpu.";
    let u = Unschedulable {
        attempt: 1,
        message: message.into(),
    };
    let p = run_with(&g, &jobs, None, Some(u.clone()), "2026-11-30T06:01:00Z");
    assert_eq!(p.status.phase, Some(Phase::Pending));
    assert_eq!(
        ready(&p),
        (ConditionStatus::False, UNSCHEDULABLE.to_owned())
    );
    let c = p.status.condition(READY).unwrap();
    assert!(c.message.contains(message), "{}", c.message);
    // The attempt keeps its Job: nothing is created or deleted, no failure counted.
    assert!(p.actions.is_empty(), "{:?}", p.actions);
    assert_eq!(p.status.attempts, 1);
    assert_eq!(p.status.active_job.as_deref(), Some("train-1"));
    assert_eq!(p.next, Next::Backoff);

    // Placed and running: Running again, whatever an older read said.
    let placed = [waiting_job(&g, T0, 1)];
    let p = run_with(&g, &placed, None, Some(u.clone()), "2026-11-30T06:01:00Z");
    assert_eq!(p.status.phase, Some(Phase::Running));
    assert_eq!(ready(&p).1, "JobRunning");
    assert_eq!(p.next, Next::Done);

    // Within the grace the pod is not judged: Running, and a look when the grace ends.
    let p = run_with(&g, &jobs, None, None, "2026-11-30T06:00:02Z");
    assert_eq!(p.status.phase, Some(Phase::Running));
    assert_eq!(p.next, Next::After(Duration::from_secs(3)));

    // Another attempt's reading does not apply.
    let other = Unschedulable { attempt: 2, ..u };
    let p = run_with(&g, &jobs, None, Some(other), "2026-11-30T06:01:00Z");
    assert_eq!(p.status.phase, Some(Phase::Running));
}

mod strays {
    //! A Job create carries no precondition: one sent by a replica that then lost the
    //! shard can land after its successor ended that attempt, and bring it back.

    use super::*;
    use crate::events::Kind;

    const LATE: &str = "late-uid";

    /// Attempt 1 ran on generation 1 and was replaced (Recreate) by attempt 2, which
    /// runs on generation 2; returns the GpuJob and attempt 2's Job.
    fn replaced_once() -> (GpuJob, Job) {
        let g = gpujob(3);
        let g1 = with_status(g.clone(), &run(&g, &[], None, T0));
        let mut g2 = g1.clone();
        g2.metadata.generation = Some(2);
        let p = run(&g2, &[job(&g1, 1, None)], None, "2026-11-30T06:00:10Z");
        assert_eq!(p.status.replacing_attempt, Some(1));
        let g2 = with_status(g2, &p);
        let p = run(&g2, &[], None, "2026-11-30T06:00:20Z");
        assert_eq!(creates(&p), vec![2]);
        let g2 = with_status(g2, &p);
        let two = job(&g2, 2, None);
        (g2, two)
    }

    /// Attempt `attempt`'s Job as the late create brings it back: a new object, built
    /// from generation 1.
    fn late(attempt: i32) -> Job {
        let mut j = job(&gpujob(3), attempt, None);
        j.metadata.uid = Some(LATE.into());
        j.metadata.resource_version = Some("900".into());
        j
    }

    fn deleting(mut j: Job) -> Job {
        j.metadata.deletion_timestamp = Some(Time(t("2026-11-30T06:00:31Z")));
        j
    }

    fn failed(mut j: Job, at: &str) -> Job {
        j.status = job(&gpujob(3), 1, Some(("Failed", "BackoffLimitExceeded", at))).status;
        j
    }

    fn stray_delete(name: &str) -> Action {
        Action::DeleteJob {
            name: name.into(),
            uid: LATE.into(),
            resource_version: "900".into(),
            why: JobDeletion::Stray,
        }
    }

    fn announced(p: &Plan) -> Vec<&crate::events::Note> {
        p.actions
            .iter()
            .filter_map(|a| match a {
                Action::Publish(n) => Some(n),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_late_job_of_an_ended_attempt_is_deleted_in_the_foreground_and_announced() {
        let (g, two) = replaced_once();
        let p = run(&g, &[late(1), two.clone()], None, "2026-11-30T06:00:30Z");
        assert_eq!(p.actions.len(), 2, "{:?}", p.actions);
        assert_eq!(p.actions[0], stray_delete("train-1"));
        assert!(
            JobDeletion::Stray.foreground(),
            "its pods go before it does"
        );
        let notes = announced(&p);
        assert_eq!(
            (notes[0].kind, notes[0].reason),
            (Kind::Warning, "StrayJobDeleted")
        );
        assert!(
            !notes[0].records_state_change(),
            "the GpuJob did not change"
        );
        assert!(
            notes[0].note.contains("Job train-1 (attempt 1)")
                && notes[0].note.contains("attempt 2 is the current one"),
            "{}",
            notes[0].note
        );
        // Attempt 2 runs on, untouched.
        assert_eq!(Some(&p.status), g.status.as_ref());

        // Being deleted: no second delete, no second Event, nothing to write.
        let p = run(&g, &[deleting(late(1)), two], None, "2026-11-30T06:00:31Z");
        assert!(p.actions.is_empty(), "{:?}", p.actions);
        assert_eq!(Some(&p.status), g.status.as_ref());
    }

    #[test]
    fn nothing_a_late_create_brings_back_runs_after_the_gpujob_finished() {
        let (g, _) = replaced_once();
        let done = job(&g, 2, Some(("Complete", "", "2026-11-30T06:01:00Z")));
        let g = with_status(
            g.clone(),
            &run(
                &g,
                std::slice::from_ref(&done),
                None,
                "2026-11-30T06:01:01Z",
            ),
        );
        assert_eq!(g.status.as_ref().unwrap().phase, Some(Phase::Succeeded));
        let p = run(&g, &[late(1), done], None, "2026-11-30T06:01:10Z");
        assert_eq!(p.actions[0], stray_delete("train-1"));
        assert!(
            announced(&p)[0].note.contains("the GpuJob has finished"),
            "{:?}",
            p.actions
        );
    }

    #[test]
    fn a_stray_beyond_the_kept_few_is_deleted_once_in_the_foreground() {
        // Attempts 2 and 3 failed, 4 runs; attempt 1 came back late. Keep 2: attempt 2
        // (finished) goes in the background, attempt 1 as a stray, and only so.
        let g = gpujob(10);
        let g4 = running(&g, 4, 3);
        let f = Some(("Failed", "BackoffLimitExceeded", T0));
        let jobs = [late(1), job(&g, 2, f), job(&g, 3, f), job(&g, 4, None)];
        let p = run(&g4, &jobs, None, "2026-11-30T06:10:00Z");
        let deletes: Vec<_> = p
            .actions
            .iter()
            .filter_map(|a| match a {
                Action::DeleteJob { name, why, .. } => Some((name.as_str(), *why)),
                _ => None,
            })
            .collect();
        assert_eq!(
            deletes,
            vec![
                ("train-1", JobDeletion::Stray),
                ("train-2", JobDeletion::Old)
            ]
        );
    }

    #[test]
    fn no_attempt_starts_while_an_older_attempts_job_may_still_have_pods() {
        // Attempt 2 failed and its backoff is over, but attempt 1 came back late.
        let (g, two) = replaced_once();
        let two = failed(two, "2026-11-30T06:01:00Z");
        let g = with_status(
            g.clone(),
            &run(
                &g,
                std::slice::from_ref(&two),
                exit(2, 1),
                "2026-11-30T06:01:01Z",
            ),
        );
        let due = "2026-11-30T06:01:20Z";
        assert_eq!(
            creates(&run(&g, std::slice::from_ref(&two), None, due)),
            vec![3],
            "without it"
        );

        let waits = |jobs: &[Job]| {
            let p = run(&g, jobs, None, due);
            assert!(creates(&p).is_empty(), "{:?}", p.actions);
            assert_eq!(p.status.phase, Some(Phase::Pending));
            assert_eq!(p.status.active_job, None);
            assert_eq!(p.next, Next::Done, "the Job watch says when it is gone");
            let c = p.status.condition(READY).unwrap();
            assert_eq!(c.reason, OLD_ATTEMPT_STOPPING);
            assert!(c.message.contains("attempt 3 starts once"), "{}", c.message);
            assert!(
                c.message.contains("Job train-1 (attempt 1)"),
                "{}",
                c.message
            );
            p
        };
        // Still running: deleted now, and attempt 3 waits.
        let p = waits(&[late(1), two.clone()]);
        assert_eq!(p.actions.first(), Some(&stray_delete("train-1")));
        // Being deleted, its pods stopping (with the foreground delete, the Job goes
        // only once they are gone): attempt 3 still waits.
        let p = waits(&[deleting(late(1)), two.clone()]);
        assert!(p.actions.is_empty(), "{:?}", p.actions);
        // Its pods killed, the Job failed, but it is still there.
        waits(&[
            deleting(failed(late(1), "2026-11-30T06:01:15Z")),
            two.clone(),
        ]);
        // Finished, but counting pods still terminating (older Kubernetes set the
        // terminal condition before they had stopped).
        let mut terminating = failed(late(1), "2026-11-30T06:01:15Z");
        if let Some(s) = terminating.status.as_mut() {
            s.terminating = Some(1);
        }
        waits(&[terminating, two.clone()]);
        // Gone: attempt 3 starts.
        let p = run(&g, &[two], None, due);
        assert_eq!(creates(&p), vec![3]);
        assert_eq!(ready(&p).1, "JobRunning");
    }

    #[test]
    fn a_replacement_waits_for_an_older_attempts_pods_too() {
        // Attempt 2 is being replaced (its Job is gone), but attempt 1's late Job is
        // still being deleted.
        let (g, two) = replaced_once();
        let mut g3 = g.clone();
        g3.metadata.generation = Some(3);
        let g3 = with_status(g3.clone(), &run(&g3, &[two], None, "2026-11-30T06:00:40Z"));
        assert_eq!(g3.status.as_ref().unwrap().replacing_attempt, Some(2));
        let p = run(&g3, &[deleting(late(1))], None, "2026-11-30T06:00:41Z");
        assert!(creates(&p).is_empty(), "{:?}", p.actions);
        assert_eq!(ready(&p).1, OLD_ATTEMPT_STOPPING);
        assert_eq!(p.status.replacing_attempt, Some(2), "still replacing");
        let p = run(&g3, &[], None, "2026-11-30T06:00:42Z");
        assert_eq!(creates(&p), vec![3]);
    }

    #[test]
    fn finished_jobs_kept_for_debugging_do_not_hold_the_next_attempt() {
        // Attempts 1 and 2 failed; their Jobs are kept (keep_jobs 2) and hold nothing.
        let g = gpujob(5);
        let g2 = running(&g, 2, 2);
        let jobs = [
            job(&g, 1, Some(("Failed", "BackoffLimitExceeded", T0))),
            job(&g, 2, Some(("Failed", "BackoffLimitExceeded", T0))),
        ];
        let p = run(&g2, &jobs, None, "2026-11-30T06:10:00Z");
        assert_eq!(creates(&p), vec![3]);
        assert_eq!(ready(&p).1, "JobRunning");
    }
}

mod devices;
mod gang;
mod gate;
mod lost_node;
mod multikueue;
mod reads;

#[test]
fn an_attempt_whose_job_another_controller_runs_says_so_not_running() {
    let g = in_queue(gpujob(3), "team");
    let g = with_status(g.clone(), &run(&g, &[], None, T0));
    // Kueue's webhook made it a MultiKueue Job, and MultiKueue admitted it: unsuspended.
    let mut j = job(&g, 1, None);
    let spec = j.spec.as_mut().unwrap();
    spec.managed_by = Some("kueue.x-k8s.io/multikueue".into());
    spec.suspend = Some(false);
    let p = run(&g, &[j.clone()], None, "2026-11-30T06:00:02Z");
    assert_eq!(p.status.phase, Some(Phase::Pending));
    let c = p.status.condition(READY).unwrap();
    assert_eq!(c.reason, crate::status::MANAGED_ELSEWHERE);
    assert!(
        c.message.contains("kueue.x-k8s.io/multikueue"),
        "{}",
        c.message
    );
    // The Job controller's own name is not another controller.
    j.spec.as_mut().unwrap().managed_by = Some("kubernetes.io/job-controller".into());
    let p = run(&g, &[j], None, "2026-11-30T06:00:02Z");
    assert_eq!(ready(&p).1, crate::status::JOB_RUNNING);
}
