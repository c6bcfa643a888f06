//! A write refused by its precondition means "read again and decide again", never
//! "done". Here a Job's resourceVersion moves after the operator read it (as it does
//! whenever its pods change), with caches the test controls, against the real API
//! server: the refused delete must neither be remembered as done (hiding a Job that
//! stays forever) nor let a replacement attempt start beside the old one.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use crate::support;

use std::time::Duration;

use devcluster::wait;
use gpujob_operator::api::{GpuJob, LABEL_UID, Phase};
use gpujob_operator::controller::error::Error;
use gpujob_operator::controller::plan::{JobState, job_state};
use k8s_openapi::api::batch::v1::Job;
use kube::api::{ListParams, Patch, PatchParams};
use serde_json::json;
use support::harness::Harness;
use support::{TestEnv, phase, sim_env};

/// Moves Job `name`'s resourceVersion (as a pod status change would).
async fn touch_job(env: &TestEnv, name: &str, n: u32) {
    let patch = json!({"metadata": {"annotations": {"test.gpujob.dev/touched": n.to_string()}}});
    env.jobs()
        .patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap();
}

async fn job_opt(env: &TestEnv, name: &str) -> Option<Job> {
    env.jobs().get_opt(name).await.unwrap()
}

async fn wait_job(env: &TestEnv, name: &str, what: &str, pred: impl Fn(Option<&Job>) -> bool) {
    let pred = &pred;
    wait::until(
        &format!("Job {name}: {what}"),
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async move { pred(job_opt(env, name).await.as_ref()).then_some(()) },
    )
    .await
    .unwrap();
}

async fn fresh(env: &TestEnv, name: &str) -> GpuJob {
    env.gpujobs().get(name).await.unwrap()
}

async fn jobs_of(env: &TestEnv, gj: &GpuJob) -> Vec<Job> {
    let uid = gj.metadata.uid.clone().unwrap();
    env.jobs()
        .list(&ListParams::default().labels(&format!("{LABEL_UID}={uid}")))
        .await
        .unwrap()
        .items
}

#[tokio::test]
async fn an_old_attempts_job_whose_delete_was_refused_is_deleted_on_a_later_look() {
    let env = TestEnv::new("precond-old").await;
    let mut settings = env.settings();
    settings.plan.keep_jobs = 1;
    // Long enough that the backoff is still running at the next look, on a loaded
    // machine too: it counts from the Job's Failed time, which has whole seconds.
    settings.plan.backoff_base = Duration::from_secs(20);
    settings.plan.backoff_max = Duration::from_secs(20);
    let mut h = Harness::new(&env, "precond-old", settings).await;
    let vars = sim_env(&[("SIM_FAIL_ATTEMPTS", "1"), ("SIM_DURATION_SECONDS", "0.5")]);
    env.create("old", json!({"image": "i", "gpus": 1, "env": vars}))
        .await;
    h.refresh(&env).await;
    h.reconcile("old").await.unwrap();
    h.release(&env, "old", "old-1").await;
    wait_job(&env, "old-1", "Failed", |j| {
        j.is_some_and(|j| matches!(job_state(j), JobState::Failed { .. }))
    })
    .await;
    h.refresh(&env).await;
    h.reconcile("old").await.unwrap();
    let next = fresh(&env, "old")
        .await
        .status
        .unwrap()
        .next_attempt_time
        .expect("backing off");
    support::until_past(next).await;

    // Attempt 2 starts and attempt 1's Job (beyond keep-jobs 1) is deleted, from a Job
    // cache that has not seen its latest change: the precondition fails.
    touch_job(&env, "old-1", 1).await;
    let gj = fresh(&env, "old").await;
    h.load_gpujobs(std::slice::from_ref(&gj));
    let refused = h.reconcile("old").await;
    assert!(
        matches!(refused, Err(Error::Conflict { .. })),
        "a refused delete is a conflict to decide again, got {refused:?}"
    );
    assert!(job_opt(&env, "old-2").await.is_some(), "attempt 2 started");

    // Looking again with caches that caught up deletes it.
    h.refresh(&env).await;
    h.reconcile("old").await.unwrap();
    let old = job_opt(&env, "old-1").await;
    assert!(
        old.as_ref()
            .is_none_or(|j| j.metadata.deletion_timestamp.is_some()),
        "attempt 1's Job stays, hidden as if deleted (resourceVersion {:?})",
        old.and_then(|j| j.metadata.resource_version)
    );
}

#[tokio::test]
async fn a_replacement_never_starts_while_the_replaced_attempts_job_remains() {
    let env = TestEnv::new("precond-recreate").await;
    let mut h = Harness::new(&env, "precond-recreate", env.settings()).await;
    let long = |lr: &str| json!({"image": "i", "gpus": 1, "env": sim_env(&[("SIM_DURATION_SECONDS", "300"), ("LR", lr)])});
    env.create("train", long("0.1")).await;
    h.refresh(&env).await;
    h.reconcile("train").await.unwrap();
    wait_job(&env, "train-1", "exists", |j| j.is_some()).await;
    h.release(&env, "train", "train-1").await;
    h.refresh(&env).await;

    // The spec changes (Recreate) while the running Job's resourceVersion moves on: the
    // foreground delete computed from the cache fails its precondition.
    env.gpujobs()
        .patch(
            "train",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": long("0.01")})),
        )
        .await
        .unwrap();
    touch_job(&env, "train-1", 1).await;
    let gj = fresh(&env, "train").await;
    h.load_gpujobs(std::slice::from_ref(&gj));
    let refused = h.reconcile("train").await;
    assert!(
        matches!(refused, Err(Error::Conflict { .. })),
        "a refused delete is a conflict to decide again, got {refused:?}"
    );

    // However often it is looked at, attempt 2 waits until attempt 1's Job is gone.
    let mut deleted = false;
    for round in 0..200 {
        h.refresh(&env).await;
        let result = h.reconcile("train").await;
        let old = job_opt(&env, "train-1").await;
        let new = job_opt(&env, "train-2").await;
        if let Some(new) = &new {
            assert!(
                old.is_none(),
                "round {round}: attempt 2 ({new:?}) started beside attempt 1 ({old:?})"
            );
            break;
        }
        deleted |= old.is_some_and(|j| j.metadata.deletion_timestamp.is_some());
        assert!(
            result.is_ok() || matches!(result, Err(Error::Conflict { .. })),
            "{result:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(deleted, "attempt 1's Job was deleted in the foreground");
    let gj = fresh(&env, "train").await;
    let status = gj.status.clone().unwrap();
    assert_eq!(
        (status.attempts, status.failures, status.phase),
        (2, 0, Some(Phase::Running)),
        "replaced, not failed: {status:?}"
    );
    assert_eq!(jobs_of(&env, &gj).await.len(), 1);
}

/// A status write refused because the GpuJob changed behind the cache (409) ends with a
/// read of the GpuJob: the next look plans from the version read and writes, although
/// the cache still lags (it used to conflict again until the cache caught up).
#[tokio::test]
async fn a_status_write_refused_as_changed_reads_the_gpujob_and_the_next_look_writes() {
    let env = TestEnv::new("precond-gj").await;
    let mut h = Harness::new(&env, "precond-gj", env.settings()).await;
    let vars = sim_env(&[("SIM_DURATION_SECONDS", "0.5")]);
    env.create("gj", json!({"image": "i", "gpus": 1, "env": vars}))
        .await;
    h.refresh(&env).await;
    h.reconcile("gj").await.unwrap();
    h.release(&env, "gj", "gj-1").await;
    wait_job(&env, "gj-1", "Complete", |j| {
        j.is_some_and(|j| matches!(job_state(j), JobState::Complete { .. }))
    })
    .await;
    h.refresh(&env).await;
    assert_ne!(
        phase(&fresh(&env, "gj").await),
        Some(Phase::Succeeded),
        "not recorded yet"
    );
    // Someone else changes the GpuJob; this replica's cache does not see it.
    env.gpujobs()
        .patch(
            "gj",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"team": "a"}}})),
        )
        .await
        .unwrap();
    let refused = h.reconcile("gj").await;
    assert!(
        matches!(refused, Err(Error::Conflict { .. })),
        "the status write from the cached version is refused, got {refused:?}"
    );
    // The cache still lags: the next look writes from the version the refusal read.
    h.reconcile("gj").await.unwrap();
    let gj = fresh(&env, "gj").await;
    assert_eq!(phase(&gj), Some(Phase::Succeeded), "{:?}", gj.status);
    assert_eq!(
        gj.metadata
            .labels
            .unwrap_or_default()
            .get("team")
            .map(String::as_str),
        Some("a"),
        "the other writer's change is kept"
    );
}
