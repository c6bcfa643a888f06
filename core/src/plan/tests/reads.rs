//! The reads a plan asks for before it decides (`reads.rs`).

use super::*;

/// A plan of `g` with `jobs`, with the reads `reads` made so far and what they found.
fn plan_after(
    g: &GpuJob,
    jobs: &[Job],
    reads: Reads,
    termination: Option<Termination>,
    queue_wait: Option<QueueWait>,
    now: &str,
) -> Plan {
    plan_seeing(g, jobs, &[], reads, termination, queue_wait, now)
}

/// [`plan_after`], with `cached` in the pod cache.
fn plan_seeing(
    g: &GpuJob,
    jobs: &[Job],
    cached: &[SeenPod],
    reads: Reads,
    termination: Option<Termination>,
    queue_wait: Option<QueueWait>,
    now: &str,
) -> Plan {
    let seen = seen(jobs);
    plan(
        &Observed {
            gpujob: g,
            jobs: seen.iter().collect(),
            termination,
            unschedulable: None,
            queue_wait,
            refused: None,
            quota_required: false,
            quota: None,
            pods: Some(Vec::new()),
            cached_pods: cached.iter().collect(),
            confirmed: true,
            term_start_due: false,
            reads,
            nodes: Vec::new(),
            now: t(now),
        },
        &settings(),
    )
}

fn asked(p: &Plan) -> Vec<Read> {
    p.actions
        .iter()
        .filter_map(|a| match a {
            Action::Read(r) => Some(r.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn a_recorded_attempt_the_cache_lacks_is_read_before_anything_is_decided() {
    let g = running(&gpujob(3), 2, 1);
    let p = plan_after(&g, &[], Reads::default(), None, None, T0);
    assert_eq!(asked(&p), vec![Read::Job { attempt: 2 }]);
    assert_eq!(p.actions.len(), 1, "nothing but the read: {:?}", p.actions);
    assert_eq!(p.status, g.status.clone().unwrap(), "nothing decided");
    // Read and not found: gone, a failed attempt (no second read).
    let mut reads = Reads::default();
    reads.record(
        Read::Job { attempt: 2 },
        &Found::Job {
            attempt: 2,
            job: FoundJob::Absent,
        },
    );
    let p = plan_after(&g, &[], reads, None, None, T0);
    assert!(asked(&p).is_empty(), "{:?}", p.actions);
    let failure = p.status.last_failure.unwrap();
    assert_eq!(
        (failure.attempt, failure.reason.as_str()),
        (2, "JobDeleted")
    );
}

#[test]
fn a_failed_attempt_not_recorded_reads_its_pods_for_the_exit_code_once() {
    let g = running(&gpujob(3), 1, 0);
    let failed = job(&g, 1, Some(("Failed", "BackoffLimitExceeded", T0)));
    let p = plan_after(
        &g,
        std::slice::from_ref(&failed),
        Reads::default(),
        None,
        None,
        T0,
    );
    let read = Read::Termination {
        attempt: 1,
        job_uid: "job-uid-1".into(),
        dispatched: false,
    };
    assert_eq!(asked(&p), vec![read.clone()]);
    // Read: the exit code is recorded. Read and nothing found: recorded without it, and
    // not asked again.
    let p = plan_after(
        &g,
        std::slice::from_ref(&failed),
        Reads::every(),
        exit(1, 7),
        None,
        T0,
    );
    assert!(asked(&p).is_empty());
    assert_eq!(p.status.last_failure.unwrap().exit_code, Some(7));
    let mut reads = Reads::default();
    reads.record(
        read,
        &Found::Termination {
            attempt: 1,
            termination: None,
        },
    );
    let p = plan_after(&g, std::slice::from_ref(&failed), reads, None, None, T0);
    assert!(asked(&p).is_empty(), "{:?}", p.actions);
    assert_eq!(p.status.failures, 1);
}

#[test]
fn the_failure_to_read_is_the_newest_not_yet_recorded() {
    let g = gpujob(3);
    let failed = |a| job(&g, a, Some(("Failed", "BackoffLimitExceeded", T0)));
    let termination_of = |g: &GpuJob, jobs: &[Job]| {
        asked(&plan_after(g, jobs, Reads::default(), None, None, T0))
            .into_iter()
            .find_map(|r| match r {
                Read::Termination { attempt, .. } => Some(attempt),
                _ => None,
            })
    };
    // The newest attempt failed, not recorded: its pods.
    let g2 = running(&g, 2, 1);
    assert_eq!(termination_of(&g2, &[failed(1), failed(2)]), Some(2));
    // Recorded already: no read.
    let mut g2_recorded = g2.clone();
    if let Some(s) = g2_recorded.status.as_mut() {
        s.last_failure.as_mut().unwrap().attempt = 2;
    }
    assert_eq!(termination_of(&g2_recorded, &[failed(1), failed(2)]), None);
    // Attempt 2 runs, attempt 1's failure is not recorded yet: attempt 1's pods (the
    // newest Job alone would lose its exit code).
    let mut g1 = running(&g, 2, 0);
    g1.status.as_mut().unwrap().last_failure = None;
    assert_eq!(termination_of(&g1, &[failed(1), job(&g, 2, None)]), Some(1));
}

#[test]
fn a_foreign_job_on_the_next_name_is_read_again_and_refuses_the_attempt() {
    let mut g = running(&gpujob(3), 1, 1);
    let status = g.status.as_mut().unwrap();
    status.phase = Some(Phase::Pending);
    status.conditions.push(crate::api::Condition {
        type_: READY.into(),
        status: ConditionStatus::False,
        reason: JOB_NAME_CONFLICT.into(),
        message: "taken".into(),
        last_transition_time: t(T0),
        observed_generation: Some(1),
    });
    let failed = job(&g, 1, Some(("Failed", "BackoffLimitExceeded", T0)));
    let jobs = std::slice::from_ref(&failed);
    let p = plan_after(&g, jobs, Reads::default(), None, None, T0);
    assert_eq!(asked(&p), vec![Read::Job { attempt: 2 }]);
    let found = |job| {
        let mut reads = Reads::default();
        reads.record(Read::Job { attempt: 2 }, &Found::Job { attempt: 2, job });
        let termination = Read::Termination {
            attempt: 1,
            job_uid: "job-uid-1".into(),
            dispatched: false,
        };
        reads.record(
            termination,
            &Found::Termination {
                attempt: 1,
                termination: None,
            },
        );
        plan_after(&g, jobs, reads, None, None, "2026-11-30T07:00:00Z")
    };
    let held = found(FoundJob::Foreign);
    assert!(creates(&held).is_empty(), "{:?}", held.actions);
    assert_eq!(ready(&held).1, JOB_NAME_CONFLICT);
    let free = found(FoundJob::Absent);
    assert_eq!(creates(&free), vec![2], "{:?}", free.actions);
}

#[test]
fn a_queued_attempt_reads_its_workload_and_says_why_kueue_holds_it() {
    let g = in_queue(running(&gpujob(3), 1, 0), "team");
    let mut queued = job(&g, 1, None);
    queued.spec.as_mut().unwrap().suspend = Some(true);
    let jobs = std::slice::from_ref(&queued);
    let p = plan_after(&g, jobs, Reads::default(), None, None, T0);
    assert_eq!(
        asked(&p),
        vec![Read::Workload {
            attempt: 1,
            job_uid: "job-uid-1".into(),
        }]
    );
    let wait = workload_wait(
        &json!({"status": {"conditions": [{"type": "QuotaReserved", "status": "False",
            "reason": "Pending", "message": "insufficient quota"}]}}),
        1,
    );
    let p = plan_after(&g, jobs, Reads::every(), None, Some(wait), T0);
    assert!(asked(&p).is_empty());
    let ready = p.status.condition(READY).unwrap();
    assert_eq!(ready.reason, "Queued");
    assert!(ready.message.contains("insufficient quota"), "{ready:?}");
}

#[test]
fn a_workload_says_why_kueue_holds_the_attempt() {
    let workload = |conditions: serde_json::Value| json!({"status": {"conditions": conditions}});
    let pending = workload(json!([{
        "type": "QuotaReserved", "status": "False", "reason": "Pending",
        "message": "couldn't assign flavors to pod set main: insufficient quota",
    }]));
    let w = workload_wait(&pending, 2);
    assert_eq!((w.attempt, w.reason.as_str()), (2, "Pending"));
    assert!(w.message.contains("insufficient quota"), "{w:?}");
    // Evicted and waiting for quota again: the eviction is the news.
    let evicted = workload(json!([
        {"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": "x"},
        {"type": "Evicted", "status": "True", "reason": "Preempted",
         "message": "Preempted to accommodate a higher priority Workload"},
    ]));
    assert_eq!(workload_wait(&evicted, 1).reason, "Preempted");
    // Nothing decided yet; a reason the API server would refuse is not copied.
    assert_eq!(workload_wait(&json!({}), 1).reason, "Pending");
    let odd = workload(json!([
        {"type": "QuotaReserved", "status": "False", "reason": "not a reason!"},
    ]));
    assert_eq!(workload_wait(&odd, 1).reason, "Pending");
}

#[test]
fn a_pod_the_scheduler_cannot_place_says_why_and_its_exit_code_is_read_from_its_status() {
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "metadata": {"name": "p"},
        "status": {
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "message": "0/4 nodes are available"}],
            "containerStatuses": [{"name": "main", "image": "i", "imageID": "", "ready": false,
                "restartCount": 0, "state": {"terminated": {"exitCode": 3, "reason": "Error"}}}],
        },
    }))
    .unwrap();
    let pods = [pod];
    let u = unschedulable_of(1, &pods).unwrap();
    assert_eq!(u.message, "0/4 nodes are available");
    let term = termination_of(1, &pods).unwrap();
    assert_eq!((term.exit_code, term.reason.as_str()), (Some(3), "Error"));
    assert!(unschedulable_of(1, &[]).is_none());
    assert!(termination_of(1, &[]).is_none());
}

#[test]
fn the_scheduler_is_asked_why_only_once_the_pod_cache_shows_it_could_not_place_a_pod() {
    use super::gate::{Seen, pod, ungated};
    let now = "2026-11-30T06:01:00Z";
    let asks_placement = |p: &Plan| {
        asked(p)
            .iter()
            .any(|r| matches!(r, Read::Placement { attempt: 1, .. }))
    };
    let g = running(&gpujob(0), 1, 0);
    let jobs = [waiting_job(&g, T0, 0)];
    let sees = |cached: &[SeenPod]| {
        Seen::new(&g, &jobs)
            .cached(cached)
            .reads(Reads::default())
            .plan(now)
    };
    let mut let_go = pod(1, 0);
    let_go.gated = false;
    let mut unplaceable = let_go.clone();
    unplaceable.unschedulable = true;
    // Past the grace, with no pod of it ready: read once the scheduler has said why.
    let p = sees(&[unplaceable.clone()]);
    assert!(asks_placement(&p), "{:?}", p.actions);
    // Until then nothing to ask: nothing of it cached, a pod just let go, or one placed
    // while the Job's ready count lags.
    assert!(!asks_placement(&sees(&[])), "nothing of it cached");
    assert!(!asks_placement(&sees(&[let_go])), "let go, not tried yet");
    assert!(!asks_placement(&sees(&[ungated(pod(1, 0))])), "placed");
    // Another attempt's pod says nothing of this one's; nor does one ended or going.
    let mut other = pod(2, 0);
    other.gated = false;
    other.unschedulable = true;
    assert!(!asks_placement(&sees(&[other])));
    let mut ended = unplaceable.clone();
    ended.terminal = true;
    assert!(!asks_placement(&sees(&[ended])));
    let mut going = unplaceable.clone();
    going.deleting = true;
    assert!(!asks_placement(&sees(&[going])));
    // Within the grace the scheduler is not asked, whatever the cache says.
    let p = sees(&[unplaceable]);
    let young = [waiting_job(&g, "2026-11-30T06:00:58Z", 0)];
    let q = Seen::new(&g, &young)
        .cached(&[{
            let mut u = pod(1, 0);
            u.gated = false;
            u.unschedulable = true;
            u
        }])
        .reads(Reads::default())
        .plan(now);
    assert!(asks_placement(&p) && !asks_placement(&q), "{:?}", q.actions);
}

#[test]
fn an_unknown_term_start_is_read_in_place_of_a_confirming_read() {
    let g = gpujob(0);
    let obs = |due| Observed {
        gpujob: &g,
        jobs: Vec::new(),
        termination: None,
        unschedulable: None,
        queue_wait: None,
        refused: None,
        quota_required: false,
        quota: None,
        pods: None,
        cached_pods: Vec::new(),
        confirmed: false,
        term_start_due: due,
        reads: Reads::every(),
        nodes: Vec::new(),
        now: t(T0),
    };
    let kinds = |p: Plan| p.actions.iter().map(Action::name).collect::<Vec<_>>();
    let p = plan(&obs(true), &settings());
    assert_eq!(kinds(p.clone()).last(), Some(&"ReadTermStart"));
    assert!(p.asks(), "nothing after the read: {:?}", kinds(p));
    let p = plan(&obs(false), &settings());
    assert!(kinds(p).contains(&"Confirm"));
}

#[test]
fn reads_are_asked_in_at_most_two_rounds_and_never_again_once_answered() {
    // Every shape a snapshot may have that asks for reads: a recorded attempt whose Job
    // the cache lacks, the Job of the one before failed and not recorded, a queued Job,
    // pods waiting past the scheduler's grace, a foreign Job on the next name.
    let base = gpujob(3);
    let failed = |g: &GpuJob, a| job(g, a, Some(("Failed", "BackoffLimitExceeded", T0)));
    let queued_g = in_queue(running(&base, 1, 0), "team");
    let mut queued = job(&queued_g, 1, None);
    queued.spec.as_mut().unwrap().suspend = Some(true);
    let mut conflict = running(&base, 1, 1);
    conflict
        .status
        .as_mut()
        .unwrap()
        .conditions
        .push(crate::api::Condition {
            type_: READY.into(),
            status: ConditionStatus::False,
            reason: JOB_NAME_CONFLICT.into(),
            message: "taken".into(),
            last_transition_time: t(T0),
            observed_generation: Some(1),
        });
    let g2 = running(&base, 2, 1);
    let mut unplaceable = super::gate::pod(1, 0);
    unplaceable.gated = false;
    unplaceable.unschedulable = true;
    let cases: Vec<(GpuJob, Vec<Job>, Vec<SeenPod>)> = vec![
        (g2.clone(), vec![], vec![]),
        (g2.clone(), vec![failed(&g2, 1)], vec![]),
        (
            running(&base, 2, 0),
            vec![failed(&base, 1), failed(&base, 2)],
            vec![],
        ),
        (queued_g.clone(), vec![queued], vec![]),
        (
            running(&base, 1, 0),
            vec![waiting_job(&base, T0, 0)],
            vec![unplaceable],
        ),
        (conflict.clone(), vec![failed(&conflict, 1)], vec![]),
    ];
    for (g, jobs, cached) in cases {
        let mut reads = Reads::default();
        let mut rounds = 0;
        loop {
            let now = "2026-11-30T06:01:00Z";
            let p = plan_seeing(&g, &jobs, &cached, reads.clone(), None, None, now);
            let asked = asked(&p);
            if asked.is_empty() {
                break;
            }
            rounds += 1;
            assert!(rounds <= 2, "a third round of reads: {asked:?}");
            for read in asked {
                assert!(!reads.made(&read), "asked again once answered: {read:?}");
                // Nothing found: the most rounds, as nothing settles a question early.
                let found = read.found_nothing();
                reads.record(read, &found);
            }
        }
        assert!(
            reads.count() > 0,
            "each case asks for a read: {:?}",
            g.status
        );
    }
}

#[test]
fn a_gpujob_being_deleted_reads_the_recorded_attempts_job_before_it_releases_anything() {
    let mut g = running(&gpujob(3), 2, 1);
    g.metadata.deletion_timestamp = Some(Time(t(T0)));
    g.metadata.finalizers = Some(vec![crate::api::FINALIZER_QUOTA.into()]);
    let status = g.status.as_mut().unwrap();
    status.reservation_id = Some("r-1".into());
    status.reservation_gpus = Some(1);
    let seen = |reads: Reads| {
        plan(
            &Observed {
                gpujob: &g,
                jobs: Vec::new(),
                termination: None,
                unschedulable: None,
                queue_wait: None,
                refused: None,
                quota_required: true,
                quota: None,
                pods: Some(Vec::new()),
                cached_pods: Vec::new(),
                confirmed: true,
                term_start_due: false,
                reads,
                nodes: Vec::new(),
                now: t(T0),
            },
            &settings(),
        )
    };
    let p = seen(Reads::default());
    assert_eq!(asked(&p), vec![Read::Job { attempt: 2 }], "{:?}", p.actions);
    // Read and not found: the release may go on.
    let mut reads = Reads::default();
    reads.record(
        Read::Job { attempt: 2 },
        &Read::Job { attempt: 2 }.found_nothing(),
    );
    let kinds: Vec<_> = seen(reads).actions.iter().map(Action::name).collect();
    assert!(kinds.contains(&"Release"), "{kinds:?}");
}

#[test]
fn what_was_heard_of_another_attempt_does_not_answer_for_this_one() {
    let g = running(&gpujob(3), 1, 0);
    let failed = job(&g, 1, Some(("Failed", "BackoffLimitExceeded", T0)));
    // An exit code heard of attempt 3 (the GpuJob was there, then moved on).
    let p = plan_after(
        &g,
        std::slice::from_ref(&failed),
        Reads::default(),
        exit(3, 1),
        None,
        T0,
    );
    assert_eq!(
        asked(&p),
        vec![Read::Termination {
            attempt: 1,
            job_uid: "job-uid-1".into(),
            dispatched: false,
        }]
    );
}

#[test]
fn a_failed_attempt_multikueue_ran_on_a_worker_reads_its_exit_code_there() {
    let g = running(&gpujob(3), 1, 0);
    let mut failed = job(&g, 1, Some(("Failed", "BackoffLimitExceeded", T0)));
    failed.spec.as_mut().unwrap().managed_by = Some(crate::seen_job::MULTIKUEUE.into());
    let p = plan_after(&g, &[failed], Reads::default(), None, None, T0);
    assert_eq!(
        asked(&p),
        vec![Read::Termination {
            attempt: 1,
            job_uid: "job-uid-1".into(),
            dispatched: true,
        }]
    );
}

#[test]
fn the_exit_code_is_of_the_pod_that_ended_last() {
    // An earlier copy's pod (MultiKueue dispatched the Job again) was killed first.
    let pod = |code: i32, finished: &str| -> k8s_openapi::api::core::v1::Pod {
        serde_json::from_value(json!({"status": {"containerStatuses": [{
            "name": "main", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": code, "reason": "Error",
                                     "finishedAt": finished}}}]}}))
        .unwrap()
    };
    let pods = [
        pod(137, "2026-11-30T06:00:01Z"),
        pod(42, "2026-11-30T06:05:00Z"),
        pod(143, "2026-11-30T06:00:02Z"),
    ];
    let t = termination_of(1, &pods).unwrap();
    assert_eq!(t.exit_code, Some(42));
}
