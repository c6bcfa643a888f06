//! External GPU quota behind a finalizer, against a fake quota service that can refuse,
//! fail and record calls: tests count effects (live reservations, Jobs), not calls.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use crate::support;

use std::time::Duration;

use devcluster::wait;
use gpujob_operator::api::Phase;
use gpujob_operator::controller::Settings;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::json;
use support::quota::{FakeQuota, Mode};
use support::{TestEnv, condition, phase, ready, sim_env};

async fn setup(prefix: &str) -> (TestEnv, FakeQuota, Settings) {
    let env = TestEnv::new(prefix).await;
    let fake = FakeQuota::start().await;
    let token = support::namespace_temp(support::QUOTA_TOKEN, &env.ns);
    let mut settings = env.settings();
    settings.quota = fake.provider(&token);
    settings.plan.cleanup_timeout = Duration::from_secs(2);
    (env, fake, settings)
}

#[tokio::test]
async fn reservation_is_recorded_before_the_job_and_released_when_done_or_deleted() {
    let (env, fake, settings) = setup("quota-seed").await;
    let audit = env.cluster.audit();
    let start = audit.cursor().unwrap();
    let op = env.operator("quota-seed", settings).await;
    let done = env
        .create(
            "done",
            json!({"image": "i", "gpus": 2, "env": sim_env(&[("SIM_DURATION_SECONDS", "2")])}),
        )
        .await;
    let running = env
        .wait_gpujob("done", "Running", |g| phase(g) == Some(Phase::Running))
        .await;
    let uid = done.metadata.uid.clone().unwrap();
    let id = running
        .status
        .clone()
        .unwrap()
        .reservation_id
        .expect("reservation id in status");
    assert_eq!(
        fake.live().get(&uid),
        Some(&id),
        "exactly this reservation is live"
    );
    assert!(
        running.holds_quota_finalizer(),
        "the finalizer guards the reservation"
    );
    assert_eq!(condition(&running, "QuotaReserved").unwrap().0, "True");

    // The reservation id reached status before the Job existed: the operator's first
    // status patch precedes its Job create.
    let agent = TestEnv::agent("quota-seed");
    let writes: Vec<_> = audit
        .since(start)
        .unwrap()
        .into_iter()
        .filter(|e| {
            e.user_agent == agent
                && e.namespace == env.ns
                && e.name.starts_with("done")
                && e.succeeded()
        })
        .collect();
    let first_status = writes
        .iter()
        .position(|e| e.subresource == "status")
        .unwrap();
    let first_create = writes
        .iter()
        .position(|e| e.resource == "jobs" && e.verb == "create")
        .unwrap();
    assert!(first_status < first_create, "{writes:#?}");
    let finalizer_patch = writes
        .iter()
        .position(|e| e.resource == "gpujobs" && e.subresource.is_empty())
        .unwrap();
    assert!(
        finalizer_patch < first_status,
        "finalizer first, then the reservation: {writes:#?}"
    );

    // Finished: released, then the finalizer goes.
    let finished = env
        .wait_gpujob("done", "Succeeded and released", |g| {
            phase(g) == Some(Phase::Succeeded)
                && !g.holds_quota_finalizer()
                && g.status
                    .as_ref()
                    .is_some_and(|s| s.reservation_id.is_none())
        })
        .await;
    assert!(!fake.live().contains_key(&uid));
    assert_eq!(condition(&finished, "QuotaReserved").unwrap().1, "Released");

    // Deleted while running: released, then the finalizer goes, then the Job is collected.
    let doomed = env
        .create(
            "doomed",
            json!({"image": "i", "gpus": 1, "env": sim_env(&[("SIM_DURATION_SECONDS", "60")])}),
        )
        .await;
    env.wait_gpujob("doomed", "Running", |g| phase(g) == Some(Phase::Running))
        .await;
    let doomed_uid = doomed.metadata.uid.clone().unwrap();
    assert!(fake.live().contains_key(&doomed_uid));
    env.gpujobs()
        .delete("doomed", &DeleteParams::default())
        .await
        .unwrap();
    let api = env.gpujobs();
    wait::until(
        "the deleted GpuJob to go",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || {
            let api = api.clone();
            async move { api.get_opt("doomed").await.ok()?.is_none().then_some(()) }
        },
    )
    .await
    .unwrap();
    assert!(
        !fake.live().contains_key(&doomed_uid),
        "released before the finalizer went"
    );
    let jobs = env.jobs();
    wait::until(
        "its Job to be collected",
        Duration::from_secs(60),
        Duration::from_millis(250),
        || {
            let jobs = jobs.clone();
            async move { jobs.get_opt("doomed-1").await.ok()?.is_none().then_some(()) }
        },
    )
    .await
    .unwrap();
    let events = env
        .events_of(
            "done",
            support::with_reasons(&[
                "QuotaReserved",
                "AttemptStarted",
                "Succeeded",
                "QuotaReleased",
            ]),
        )
        .await;
    let reasons: Vec<&str> = events.iter().map(|e| e.1.as_str()).collect();
    for r in [
        "QuotaReserved",
        "AttemptStarted",
        "Succeeded",
        "QuotaReleased",
    ] {
        assert!(reasons.contains(&r), "missing Event {r}: {events:?}");
    }
    op.stop().await;
}

#[tokio::test]
async fn refused_quota_backs_off_and_the_gpujob_starts_once_granted() {
    let (env, fake, settings) = setup("quota-refused").await;
    fake.set_reserve(Mode::Refuse);
    let op = env.operator("quota-refused", settings).await;
    let gj = env
        .create(
            "wait",
            json!({"image": "i", "gpus": 8, "env": sim_env(&[("SIM_DURATION_SECONDS", "1")])}),
        )
        .await;
    let uid = gj.metadata.uid.clone().unwrap();
    let refused = env
        .wait_gpujob("wait", "QuotaRefused", |g| {
            ready(g).is_some_and(|(_, r, _)| r == "QuotaRefused")
        })
        .await;
    assert_eq!(phase(&refused), Some(Phase::Pending));
    let (status, reason, message) = condition(&refused, "QuotaReserved").unwrap();
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "InsufficientQuota")
    );
    assert!(message.contains("8 GPUs"), "{message}");
    assert_eq!(env.jobs_of(&refused).await.len(), 0, "no Job without quota");

    // A shortage of a few seconds: the backoff grows, so the calls stay few. Counted by
    // the fake's own clock from the first call, so a slow machine changes nothing: from
    // 5 ms doubling, about eleven calls fall within 6 s of the first.
    wait::until(
        "three refused reserve calls",
        support::WAIT,
        Duration::from_millis(100),
        || {
            let n = fake.calls("reserve", &uid).len();
            std::future::ready((n >= 3).then_some(()))
        },
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(6)).await;
    let calls = fake.calls("reserve", &uid);
    let first = calls[0].at;
    let within = calls
        .iter()
        .filter(|c| c.at.duration_since(first).as_secs_f64() <= 6.0)
        .count();
    assert!(
        within <= 14,
        "{within} reserve calls within 6 s of the first"
    );
    let warnings: Vec<_> = env
        .events_of("wait", support::with_reasons(&["QuotaRefused"]))
        .await
        .into_iter()
        .filter(|e| e.1 == "QuotaRefused")
        .collect();
    assert_eq!(
        warnings.len(),
        1,
        "one Warning Event per transition: {warnings:?}"
    );

    fake.set_reserve(Mode::Ok);
    let done = env
        .wait_gpujob("wait", "Succeeded", |g| phase(g) == Some(Phase::Succeeded))
        .await;
    assert_eq!(done.status.unwrap().attempts, 1);
    assert_eq!(fake.granted(&uid).len(), 1);
    // Every refusal answered is counted once; none can come after the grant (counted
    // only now: the metric moves once an answer is in, the fake's list on arrival).
    let refused = fake
        .calls("reserve", &uid)
        .iter()
        .filter(|c| c.code == 409)
        .count();
    assert!(refused >= 3, "{refused} refusals");
    assert_eq!(op.status.metrics.quota_refusals.get(), refused as u64);
    op.stop().await;
}

#[tokio::test]
async fn a_release_that_keeps_failing_is_reported_and_can_be_unlocked() {
    let (env, fake, settings) = setup("quota-stuck").await;
    let op = env.operator("quota-stuck", settings).await;
    let gj = env
        .create(
            "stuck",
            json!({"image": "i", "gpus": 1, "env": sim_env(&[("SIM_DURATION_SECONDS", "60")])}),
        )
        .await;
    let uid = gj.metadata.uid.clone().unwrap();
    let running = env
        .wait_gpujob("stuck", "Running", |g| phase(g) == Some(Phase::Running))
        .await;
    let id = running.status.unwrap().reservation_id.unwrap();

    fake.set_release(Mode::Fail);
    env.gpujobs()
        .delete("stuck", &DeleteParams::default())
        .await
        .unwrap();
    // The finalizer holds; past the (2 s) cleanup timeout the GpuJob says so.
    let stuck = env
        .wait_gpujob("stuck", "CleanupStuck", |g| {
            condition(g, "CleanupStuck").is_some_and(|c| c.0 == "True")
        })
        .await;
    assert!(stuck.metadata.deletion_timestamp.is_some());
    assert!(stuck.holds_quota_finalizer());
    // The metric an alert uses, once the replica's cache has the condition too.
    let waited = tokio::time::Instant::now() + support::WAIT;
    while !op
        .status
        .render_metrics()
        .contains("gpujob_cleanup_stuck 1")
    {
        assert!(
            tokio::time::Instant::now() < waited,
            "gpujob_cleanup_stuck never became 1"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }

    // The manual unlock: deletion finishes without a release, and says what was abandoned.
    let unlock = json!({"metadata": {"annotations": {"gpujob.dev/skip-quota-release": "true"}}});
    env.gpujobs()
        .patch("stuck", &PatchParams::default(), &Patch::Merge(unlock))
        .await
        .unwrap();
    let api = env.gpujobs();
    wait::until(
        "the unlocked GpuJob to go",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || {
            let api = api.clone();
            async move { api.get_opt("stuck").await.ok()?.is_none().then_some(()) }
        },
    )
    .await
    .unwrap();
    assert_eq!(fake.live().get(&uid), Some(&id), "abandoned, not released");
    let events = env
        .events_of(
            "stuck",
            support::with_reasons(&["QuotaReleaseSkipped", "CleanupStuck"]),
        )
        .await;
    let skipped = events
        .iter()
        .find(|e| e.1 == "QuotaReleaseSkipped")
        .expect("a Warning Event records it");
    assert_eq!(skipped.0, "Warning");
    assert!(skipped.2.contains(&id), "{skipped:?}");
    assert!(events.iter().any(|e| e.1 == "CleanupStuck"), "{events:?}");
    op.stop().await;
}

#[tokio::test]
async fn gpujobs_that_cannot_run_hold_no_quota() {
    let (env, fake, mut settings) = setup("quota-cannot-run").await;
    // Long enough a backoff to change the spec in the middle of it.
    settings.plan.backoff_base = Duration::from_secs(20);
    settings.plan.backoff_max = Duration::from_secs(20);
    let op = env.operator("quota-cannot-run", settings).await;

    // An invalid spec reserves nothing (and takes no finalizer).
    let bad = env
        .create("bad", json!({"image": "Not A Valid Image", "gpus": 1}))
        .await;
    let waiting = env
        .wait_gpujob("bad", "InvalidSpec", |g| {
            ready(g).is_some_and(|(_, r, _)| r == "InvalidSpec")
        })
        .await;
    let bad_uid = bad.metadata.uid.clone().unwrap();
    assert!(
        fake.calls("reserve", &bad_uid).is_empty(),
        "reserved for an invalid spec"
    );
    assert!(!waiting.holds_quota_finalizer());

    // A Job this GpuJob does not own holds its first attempt's name: whatever was
    // reserved before that was found is released, and nothing is reserved while it lasts.
    env.create_foreign_job("taken-1").await;
    let taken = env
        .create(
            "taken",
            json!({"image": "i", "gpus": 1, "env": sim_env(&[("SIM_DURATION_SECONDS", "1")])}),
        )
        .await;
    let taken_uid = taken.metadata.uid.clone().unwrap();
    env.wait_gpujob("taken", "JobNameConflict and nothing held", |g| {
        ready(g).is_some_and(|(_, r, _)| r == "JobNameConflict")
            && g.status
                .as_ref()
                .is_some_and(|s| s.reservation_id.is_none())
    })
    .await;
    assert!(!fake.live().contains_key(&taken_uid), "{:?}", fake.live());
    let reserves = fake.calls("reserve", &taken_uid).len();
    // It looks again every 2 s (test settings; the other GpuJob here, its spec invalid,
    // is not looked at again) and still reserves nothing.
    support::signals::looked(&op, support::signals::looks(&op), 2).await;
    assert_eq!(fake.calls("reserve", &taken_uid).len(), reserves);
    // The name is freed: the GpuJob reserves and runs.
    env.jobs()
        .delete("taken-1", &kube::api::DeleteParams::background())
        .await
        .unwrap();
    env.wait_gpujob("taken", "Succeeded", |g| phase(g) == Some(Phase::Succeeded))
        .await;

    // Valid and reserved; attempt 1 fails; during the backoff the spec turns invalid:
    // no attempt runs, so the reservation goes; fixed, it is reserved again and runs.
    let flaky = env
        .create(
            "flaky",
            json!({"image": "i", "gpus": 1, "env": sim_env(&[("SIM_FAIL_ATTEMPTS", "1"), ("SIM_DURATION_SECONDS", "0.5")])}),
        )
        .await;
    let flaky_uid = flaky.metadata.uid.clone().unwrap();
    env.wait_gpujob("flaky", "backing off", |g| {
        ready(g).is_some_and(|(_, r, _)| r == "BackingOff")
    })
    .await;
    assert!(
        fake.live().contains_key(&flaky_uid),
        "held while backing off"
    );
    let patch = json!({"spec": {"image": "Not A Valid Image"}});
    env.gpujobs()
        .patch("flaky", &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap();
    let released = env
        .wait_gpujob("flaky", "released", |g| {
            g.status
                .as_ref()
                .is_some_and(|s| s.reservation_id.is_none())
        })
        .await;
    assert!(!fake.live().contains_key(&flaky_uid));
    assert_eq!(condition(&released, "QuotaReserved").unwrap().1, "Released");
    let patch = json!({"spec": {"image": "i"}});
    env.gpujobs()
        .patch("flaky", &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap();
    // Succeeded can be written before the release: that waits for a read showing no
    // pod of it may run. The release is recorded once the service confirmed it.
    let done = env
        .wait_gpujob("flaky", "Succeeded and its quota released", |g| {
            phase(g) == Some(Phase::Succeeded)
                && condition(g, "QuotaReserved").is_some_and(|c| c.1 == "Released")
                && g.status
                    .as_ref()
                    .is_some_and(|s| s.reservation_id.is_none())
        })
        .await;
    let status = done.status.unwrap();
    assert_eq!((status.attempts, status.failures), (2, 1));
    assert!(fake.live().is_empty(), "{:?}", fake.live());
    op.stop().await;
}

/// Waits until the fake service holds `n` calls answered with a timeout and not applied.
async fn wait_late(fake: &FakeQuota, n: usize, what: &str) {
    let quota = fake.clone();
    wait::until(what, support::WAIT, Duration::from_millis(20), || {
        let quota = quota.clone();
        async move { (quota.late() >= n).then_some(()) }
    })
    .await
    .unwrap();
}

async fn wait_gone(env: &TestEnv, name: &str) {
    let api = env.gpujobs();
    wait::until(
        &format!("GpuJob {name} to go"),
        support::WAIT,
        Duration::from_millis(100),
        || {
            let api = api.clone();
            async move { api.get_opt(name).await.ok()?.is_none().then_some(()) }
        },
    )
    .await
    .unwrap();
}

async fn set_suspend(env: &TestEnv, name: &str, on: bool) {
    let patch = json!({"spec": {"suspend": on}});
    env.gpujobs()
        .patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap();
}

/// Issue 25 (4a): a release that timed out may still land; the next attempt must not
/// run on the reservation it may free.
#[tokio::test]
async fn a_release_that_timed_out_cannot_free_the_reservation_of_the_next_attempt() {
    let (env, fake, settings) = setup("quota-late-release").await;
    let op = env.operator("quota-late-release", settings).await;
    let gj = env
        .create(
            "gj",
            json!({"image": "i", "gpus": 1, "env": sim_env(&[("SIM_DURATION_SECONDS", "3600")])}),
        )
        .await;
    let uid = gj.metadata.uid.clone().unwrap();
    env.wait_gpujob("gj", "Running", |g| phase(g) == Some(Phase::Running))
        .await;

    // Suspended: its Job stops, then the release times out; the service applies it
    // later.
    fake.set_release(Mode::ApplyLate);
    set_suspend(&env, "gj", true).await;
    wait_late(&fake, 1, "the release to time out").await;
    env.wait_gpujob("gj", "the failing release recorded", |g| {
        g.status
            .as_ref()
            .is_some_and(|s| s.release_failing_since.is_some())
    })
    .await;
    let reserves = fake.calls("reserve", &uid).len();

    // Resumed: the next attempt runs; then the late release lands.
    set_suspend(&env, "gj", false).await;
    env.wait_gpujob("gj", "attempt 2 running", |g| {
        phase(g) == Some(Phase::Running) && g.status.as_ref().is_some_and(|s| s.attempts == 2)
    })
    .await;
    assert!(
        fake.calls("reserve", &uid).len() > reserves,
        "attempt 2 started on a reservation whose release had not confirmed"
    );
    fake.apply_late();
    assert!(
        fake.live().contains_key(&uid),
        "the late release freed the reservation of the running attempt: {:#?}",
        fake.calls("release", &uid)
    );
    assert!(
        fake.calls("release", &uid).iter().all(|c| c.code == 412),
        "{:#?}",
        fake.calls("release", &uid)
    );
    let running = env.gpujobs().get("gj").await.unwrap();
    assert_eq!(phase(&running), Some(Phase::Running));
    op.stop().await;
}

/// Issue 25 (4b): a reserve that timed out, applied by the service after the release of
/// a deleted GpuJob, must not leak (within one term: same lease, same holder).
#[tokio::test]
async fn a_reserve_that_timed_out_cannot_leak_after_the_release_of_a_deleted_gpujob() {
    let (env, fake, settings) = setup("quota-late-reserve").await;
    let op = env.operator("quota-late-reserve", settings).await;
    fake.set_reserve(Mode::ApplyLate);
    let gj = env.create("gj", json!({"image": "i", "gpus": 1})).await;
    let uid = gj.metadata.uid.clone().unwrap();
    wait_late(&fake, 1, "a reserve to time out").await;

    env.gpujobs()
        .delete("gj", &DeleteParams::default())
        .await
        .unwrap();
    wait_gone(&env, "gj").await;
    assert!(!fake.calls("release", &uid).is_empty(), "released first");

    // Now the service gets to the reserves its caller gave up on.
    fake.apply_late();
    assert!(
        !fake.live().contains_key(&uid),
        "a late reserve brought back a reservation for a deleted GpuJob: {:#?}",
        fake.calls("reserve", &uid)
    );
    op.stop().await;
}

/// Issue 25 (4c): quota is released only once the deleted GpuJob's pods have stopped.
#[tokio::test]
async fn deleting_a_running_gpujob_releases_its_quota_only_after_its_pods_stopped() {
    let (env, fake, settings) = setup("quota-delete-running").await;
    let op = env.operator("quota-delete-running", settings).await;
    let gj = env
        .create(
            "doomed",
            json!({"image": "i", "gpus": 1, "env": sim_env(&[
                ("SIM_DURATION_SECONDS", "3600"),
                ("SIM_TERMINATION_SECONDS", "2"),
            ])}),
        )
        .await;
    let uid = gj.metadata.uid.clone().unwrap();
    env.wait_gpujob("doomed", "Running", |g| phase(g) == Some(Phase::Running))
        .await;
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::namespaced(env.admin.clone(), &env.ns);
    let of_the_job =
        kube::api::ListParams::default().labels("batch.kubernetes.io/job-name=doomed-1");
    // Running is recorded when the Job is created (suspended); its pod comes once the
    // operator has started it.
    wait::until(
        "the attempt's pod to exist",
        Duration::from_secs(30),
        Duration::from_millis(50),
        || async { (!pods.list(&of_the_job).await.ok()?.items.is_empty()).then_some(()) },
    )
    .await
    .unwrap();

    // The release is answered with a timeout (and kept), so the GpuJob and everything
    // it owns stay where they were when the release was sent.
    fake.set_release(Mode::ApplyLate);
    env.gpujobs()
        .delete("doomed", &DeleteParams::default())
        .await
        .unwrap();
    wait_late(&fake, 1, "the release to be sent").await;
    let left: Vec<String> = pods
        .list(&of_the_job)
        .await
        .unwrap()
        .items
        .iter()
        .map(|p| {
            format!(
                "{} {:?}",
                p.metadata.name.as_deref().unwrap_or("-"),
                p.status.as_ref().and_then(|s| s.phase.clone())
            )
        })
        .collect();
    assert!(
        left.is_empty(),
        "quota released while the attempt's pods still exist: {left:?}"
    );
    assert!(fake.live().contains_key(&uid), "not applied yet");

    fake.set_release(Mode::Ok);
    fake.apply_late();
    wait_gone(&env, "doomed").await;
    assert!(!fake.live().contains_key(&uid));
    op.stop().await;
}

/// Issue 25 (4e): a grant whose answer was lost holds quota; a GpuJob that then cannot
/// run (suspended, or its spec made invalid) releases it all the same.
#[tokio::test]
async fn a_grant_whose_answer_was_lost_is_released_when_the_gpujob_cannot_run() {
    let (env, fake, settings) = setup("quota-answer-lost").await;
    let op = env.operator("quota-answer-lost", settings).await;
    fake.set_reserve(Mode::AnswerLost);
    let mut uids = Vec::new();
    for name in ["suspended", "invalid"] {
        let gj = env
            .create(
                name,
                json!({"image": "i", "gpus": 1, "env": sim_env(&[("SIM_DURATION_SECONDS", "3600")])}),
            )
            .await;
        uids.push(gj.metadata.uid.clone().unwrap());
    }
    let quota = fake.clone();
    let held = uids.clone();
    wait::until(
        "both grants to be applied",
        support::WAIT,
        Duration::from_millis(20),
        || {
            let (quota, held) = (quota.clone(), held.clone());
            async move {
                held.iter()
                    .all(|u| quota.live().contains_key(u))
                    .then_some(())
            }
        },
    )
    .await
    .unwrap();

    set_suspend(&env, "suspended", true).await;
    let invalid = json!({"spec": {"image": "Not A Valid Image"}});
    env.gpujobs()
        .patch("invalid", &PatchParams::default(), &Patch::Merge(invalid))
        .await
        .unwrap();
    let quota = fake.clone();
    let held = uids.clone();
    let released = wait::until(
        "the lost grants to be released",
        Duration::from_secs(30),
        Duration::from_millis(50),
        || {
            let (quota, held) = (quota.clone(), held.clone());
            async move {
                held.iter()
                    .all(|u| !quota.live().contains_key(u))
                    .then_some(())
            }
        },
    )
    .await;
    assert!(
        released.is_ok(),
        "quota nobody sees is held: {:?}",
        fake.live()
    );
    for name in ["suspended", "invalid"] {
        let g = env.gpujobs().get(name).await.unwrap();
        assert!(g.holds_quota_finalizer(), "{name}: the finalizer stays");
        assert!(env.jobs_of(&g).await.is_empty(), "{name}: no Job ran");
    }
    op.stop().await;
}

/// A Job of this GpuJob that is not the current attempt's and runs, with a pod that takes
/// time to stop: made here as an earlier version made Jobs (started, its pods without
/// the operator's gate), numbered as the next attempt.
fn stray_job(
    gj: &gpujob_operator::api::GpuJob,
    stop_seconds: &str,
) -> k8s_openapi::api::batch::v1::Job {
    let mut job = gpujob_operator::controller::job::desired_job(gj, 2);
    let spec = job.spec.as_mut().unwrap();
    spec.suspend = Some(false);
    let pod = spec.template.spec.as_mut().unwrap();
    pod.scheduling_gates = None;
    pod.termination_grace_period_seconds = Some(120);
    let main = pod.containers.first_mut().unwrap();
    main.env.get_or_insert_with(Vec::new).extend([
        k8s_openapi::api::core::v1::EnvVar {
            name: "SIM_DURATION_SECONDS".into(),
            value: Some("3600".into()),
            value_from: None,
        },
        k8s_openapi::api::core::v1::EnvVar {
            name: "SIM_TERMINATION_SECONDS".into(),
            value: Some(stop_seconds.into()),
            value_from: None,
        },
    ]);
    job
}

/// The reservation covers every pod of the GpuJob: once the GpuJob has finished, it is
/// released only when no pod of it can run. Here a stray Job (not the current attempt's)
/// runs while attempt 1 succeeds; deleted, its pod takes a while to stop. Before, the
/// GpuJob released its reservation in the same plan that deleted the stray, with that
/// pod still running; now the release waits for it (its Job gone, then a read of the
/// GpuJob's pods finding none that can run).
#[tokio::test]
async fn a_finished_gpujob_releases_its_reservation_only_once_no_pod_of_it_can_run() {
    let (env, fake, settings) = setup("quota-final-pods").await;
    let op = env.operator("quota-final-pods", settings).await;
    let gj = env
        .create(
            "train",
            json!({"image": "i", "gpus": 1, "env": sim_env(&[("SIM_DURATION_SECONDS", "4")])}),
        )
        .await;
    let uid = gj.metadata.uid.clone().unwrap();
    let running = env
        .wait_gpujob("train", "Running", |g| phase(g) == Some(Phase::Running))
        .await;
    env.jobs()
        .create(&Default::default(), &stray_job(&running, "15"))
        .await
        .unwrap();
    // The release, whenever it comes: at that moment no pod of the GpuJob may run.
    wait::until(
        "the reservation released",
        Duration::from_secs(90),
        Duration::from_millis(50),
        || async {
            let released = fake.calls("release", &uid).iter().any(|c| c.code < 300);
            released.then_some(())
        },
    )
    .await
    .unwrap();
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::namespaced(env.admin.clone(), &env.ns);
    let left: Vec<String> = pods
        .list(&kube::api::ListParams::default().labels(&format!("gpujob.dev/uid={uid}")))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| {
            !matches!(
                p.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Succeeded" | "Failed")
            )
        })
        .filter_map(|p| p.metadata.name)
        .collect();
    assert!(
        left.is_empty(),
        "released while pods of the GpuJob could still run: {left:?}"
    );
    let done = env
        .wait_gpujob("train", "Succeeded, released", |g| {
            phase(g) == Some(Phase::Succeeded) && !g.holds_quota_finalizer()
        })
        .await;
    assert_eq!(done.status.unwrap().attempts, 1);
    op.stop().await;
}

/// GpuJob "train" (1 GPU, running an hour), once Running: its uid, and it.
async fn train_running(env: &TestEnv) -> (String, gpujob_operator::api::GpuJob) {
    let gj = env
        .create(
            "train",
            json!({"image": "i", "gpus": 1, "env": sim_env(&[("SIM_DURATION_SECONDS", "3600")])}),
        )
        .await;
    let uid = gj.metadata.uid.clone().unwrap();
    let running = env
        .wait_gpujob("train", "Running", |g| phase(g) == Some(Phase::Running))
        .await;
    (uid, running)
}

/// GpuJob "train" edited to ask for 2 GPUs.
async fn resize_train(env: &TestEnv) {
    env.gpujobs()
        .patch(
            "train",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"gpus": 2}})),
        )
        .await
        .unwrap();
}

/// GpuJob "train" once its attempt 2 runs.
async fn train_attempt_two_running(env: &TestEnv) -> gpujob_operator::api::GpuJob {
    env.wait_gpujob("train", "attempt 2 running", |g| {
        phase(g) == Some(Phase::Running) && g.status.as_ref().is_some_and(|s| s.attempts == 2)
    })
    .await
}

/// A change of `gpus` (× `nodes`) reserves again before the next attempt: the
/// reservation is released once the replaced attempt's pods are gone, and made anew for
/// what the spec asks. Before, the next attempt ran on the old reservation (here 2 GPUs
/// on a reservation of 1).
#[tokio::test]
async fn a_gpus_edit_reserves_again_before_the_next_attempt_runs() {
    let (env, fake, settings) = setup("quota-resize").await;
    let op = env.operator("quota-resize", settings).await;
    let (uid, running) = train_running(&env).await;
    assert_eq!(fake.live_gpus(&uid), Some(1));
    assert_eq!(running.status.unwrap().reservation_gpus, Some(1));
    resize_train(&env).await;
    let two = train_attempt_two_running(&env).await;
    let pods = devcluster::wait::until(
        "attempt 2's pod running",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async {
            let pods = env
                .running_pods(&format!("gpujob.dev/uid={uid},gpujob.dev/attempt=2"))
                .await;
            (!pods.is_empty()).then_some(pods)
        },
    )
    .await
    .unwrap();
    let asks = pods[0].spec.as_ref().unwrap().containers[0]
        .resources
        .as_ref()
        .unwrap()
        .limits
        .as_ref()
        .unwrap()["nvidia.com/gpu"]
        .0
        .clone();
    assert_eq!(asks, "2");
    assert_eq!(
        fake.live_gpus(&uid),
        Some(2),
        "attempt 2 runs on a reservation of what it asks"
    );
    let status = two.status.unwrap();
    assert_eq!(status.reservation_gpus, Some(2), "{status:?}");
    let calls: Vec<&str> = fake
        .calls("reserve", &uid)
        .iter()
        .chain(fake.calls("release", &uid).iter())
        .map(|c| c.op)
        .collect();
    assert!(calls.contains(&"release"), "{calls:?}");
    op.stop().await;
}

/// A change of `gpus` whose release fails: the service still holds the old size, and
/// would answer a reserve of the new size with it, as it is. So nothing is reserved, and
/// no attempt of the new size starts, until the release is confirmed; then the next
/// attempt runs on a reservation of what it asks. Before, the reserve followed the failed
/// release at once and attempt 2 (2 GPUs) ran on the reservation of 1.
#[tokio::test]
async fn a_gpus_edit_whose_release_fails_reserves_again_only_once_it_is_released() {
    let (env, fake, settings) = setup("quota-resize-fail").await;
    let op = env.operator("quota-resize-fail", settings).await;
    let (uid, _) = train_running(&env).await;
    assert_eq!(fake.calls("reserve", &uid).len(), 1);
    fake.set_release(Mode::Fail);
    resize_train(&env).await;
    // The release failed, and was asked again (after the backoff): no reserve between.
    wait::until(
        "the release asked twice",
        support::WAIT,
        Duration::from_millis(50),
        || async { (fake.calls("release", &uid).len() >= 2).then_some(()) },
    )
    .await
    .unwrap();
    assert_eq!(
        fake.calls("reserve", &uid).len(),
        1,
        "no reserve while the release is not confirmed"
    );
    assert_eq!(fake.live_gpus(&uid), Some(1));
    let waiting = env.gpujobs().get("train").await.unwrap();
    let status = waiting.status.unwrap();
    assert_eq!(status.attempts, 1, "{status:?}");
    assert!(status.release_failing_since.is_some(), "{status:?}");

    fake.set_release(Mode::Ok);
    let two = train_attempt_two_running(&env).await;
    assert_eq!(two.status.unwrap().reservation_gpus, Some(2));
    assert_eq!(
        fake.live_gpus(&uid),
        Some(2),
        "attempt 2 runs on a reservation of what it asks"
    );
    op.stop().await;
}
