//! Spec changes during a GpuJob's life: Recreate replaces the running attempt (not a
//! failure), OnNextAttempt waits for the next one, a change during backoff applies to
//! the next attempt, a change to a finished GpuJob is recorded and starts nothing.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use crate::support;

use std::time::Duration;

use gpujob_operator::api::Phase;
use gpujob_operator::controller::job::attempt_of;
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use support::{TestEnv, condition, phase, ready, sim_env};

fn env_of(job: &Job) -> Vec<(String, String)> {
    let c = &job
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
        .containers[0];
    c.env
        .iter()
        .flatten()
        .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
        .collect()
}

fn has_env(job: &Job, name: &str, value: &str) -> bool {
    env_of(job).iter().any(|(n, v)| n == name && v == value)
}

async fn change_env(env: &TestEnv, name: &str, vars: serde_json::Value) {
    let patch = json!({"spec": {"env": vars}});
    env.gpujobs()
        .patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap();
}

#[tokio::test]
async fn recreate_replaces_the_running_attempt_without_counting_a_failure() {
    let env = TestEnv::new("recreate").await;
    let op = env.operator("recreate", env.settings()).await;
    let gj = env
        .create(
            "train",
            json!({"image": "i", "gpus": 1, "env": sim_env(&[("SIM_DURATION_SECONDS", "60")])}),
        )
        .await;
    env.wait_gpujob("train", "Running", |g| phase(g) == Some(Phase::Running))
        .await;

    change_env(
        &env,
        "train",
        sim_env(&[("SIM_DURATION_SECONDS", "1"), ("LR", "0.01")]),
    )
    .await;
    let done = env
        .wait_gpujob("train", "Succeeded", |g| phase(g) == Some(Phase::Succeeded))
        .await;
    let status = done.status.clone().unwrap();
    assert_eq!(
        (status.attempts, status.failures),
        (2, 0),
        "a replacement is not a failure"
    );
    assert_eq!(status.observed_generation, Some(2));
    let jobs = env.jobs_of(&gj).await;
    let attempts: Vec<_> = jobs.iter().map(|j| attempt_of(j).unwrap()).collect();
    assert_eq!(attempts, vec![2], "attempt 1's Job was deleted");
    assert!(
        has_env(&jobs[0], "LR", "0.01"),
        "attempt 2 runs the new spec"
    );
    let events = env
        .events_of("train", support::with_reasons(&["SpecChangeApplied"]))
        .await;
    assert!(
        events.iter().any(|e| e.1 == "SpecChangeApplied"),
        "{events:?}"
    );
    op.stop().await;
}

#[tokio::test]
async fn on_next_attempt_lets_the_running_attempt_finish_and_applies_the_change_after() {
    let env = TestEnv::new("next-attempt").await;
    let op = env.operator("next-attempt", env.settings()).await;
    let gj = env
        .create(
            "train",
            json!({"image": "i", "gpus": 1, "updatePolicy": "OnNextAttempt",
                   "env": sim_env(&[("SIM_FAIL_ATTEMPTS", "1"), ("SIM_DURATION_SECONDS", "4")])}),
        )
        .await;
    env.wait_gpujob("train", "Running", |g| phase(g) == Some(Phase::Running))
        .await;
    change_env(
        &env,
        "train",
        sim_env(&[
            ("SIM_FAIL_ATTEMPTS", "1"),
            ("SIM_DURATION_SECONDS", "1"),
            ("LR", "0.01"),
        ]),
    )
    .await;

    let waiting = env
        .wait_gpujob("train", "SpecChangePending", |g| {
            condition(g, "SpecChangePending").is_some_and(|c| c.0 == "True")
        })
        .await;
    assert_eq!(
        waiting.status.clone().unwrap().observed_generation,
        Some(2),
        "the decision to wait is recorded"
    );
    assert_eq!(phase(&waiting), Some(Phase::Running));
    let first = env.jobs_of(&gj).await;
    assert_eq!(first.len(), 1);
    assert!(
        !has_env(&first[0], "LR", "0.01"),
        "attempt 1 keeps its spec"
    );
    assert!(first[0].metadata.deletion_timestamp.is_none());

    let done = env
        .wait_gpujob("train", "Succeeded", |g| phase(g) == Some(Phase::Succeeded))
        .await;
    let status = done.status.clone().unwrap();
    assert_eq!((status.attempts, status.failures), (2, 1));
    assert!(
        condition(&done, "SpecChangePending").is_none(),
        "applied, so no longer pending"
    );
    let jobs = env.jobs_of(&gj).await;
    assert!(
        has_env(&jobs[1], "LR", "0.01"),
        "attempt 2 runs the new spec"
    );
    op.stop().await;
}

#[tokio::test]
async fn a_change_during_backoff_applies_to_the_next_attempt_after_the_backoff() {
    let env = TestEnv::new("backoff-change").await;
    // Long enough that a loaded machine sees the failure, and the change lands, while
    // the backoff still runs (it counts from the Job's Failed time).
    let mut settings = env.settings();
    settings.plan.backoff_base = Duration::from_secs(20);
    settings.plan.backoff_max = Duration::from_secs(20);
    let op = env.operator("backoff-change", settings).await;
    let gj = env
        .create("train", json!({"image": "i", "gpus": 1, "env": sim_env(&[("SIM_FAIL_ATTEMPTS", "1"), ("SIM_DURATION_SECONDS", "0.5")])}))
        .await;
    env.wait_gpujob("train", "BackingOff", |g| {
        ready(g).is_some_and(|(_, r, _)| r == "BackingOff")
    })
    .await;
    change_env(
        &env,
        "train",
        sim_env(&[
            ("SIM_FAIL_ATTEMPTS", "1"),
            ("SIM_DURATION_SECONDS", "0.5"),
            ("LR", "0.01"),
        ]),
    )
    .await;
    let done = env
        .wait_gpujob("train", "Succeeded", |g| phase(g) == Some(Phase::Succeeded))
        .await;
    assert_eq!(done.status.unwrap().attempts, 2);
    let jobs = env.jobs_of(&gj).await;
    assert!(
        has_env(&jobs[1], "LR", "0.01"),
        "the next attempt runs the new spec"
    );
    let failed_at = env.ended_at(&jobs[0]).await;
    let started = jobs[1].metadata.creation_timestamp.clone().unwrap().0;
    assert!(
        started.duration_since(failed_at).as_secs() >= 20,
        "the change did not cut the backoff short"
    );
    op.stop().await;
}

#[tokio::test]
async fn a_change_to_a_finished_gpujob_is_recorded_and_starts_nothing() {
    let env = TestEnv::new("finished-change").await;
    let op = env.operator("finished-change", env.settings()).await;
    let gj = env
        .create(
            "train",
            json!({"image": "i", "gpus": 1, "env": sim_env(&[("SIM_DURATION_SECONDS", "0.5")])}),
        )
        .await;
    env.wait_gpujob("train", "Succeeded", |g| phase(g) == Some(Phase::Succeeded))
        .await;
    change_env(&env, "train", sim_env(&[("LR", "0.01")])).await;
    let seen = env
        .wait_gpujob("train", "generation 2 observed", |g| {
            g.status
                .as_ref()
                .is_some_and(|s| s.observed_generation == Some(2))
        })
        .await;
    assert_eq!(phase(&seen), Some(Phase::Succeeded));
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(env.jobs_of(&gj).await.len(), 1, "no new attempt");
    op.stop().await;
}
