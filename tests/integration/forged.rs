//! Jobs and attempt numbers the operator did not make. Anyone who may create Jobs in a
//! namespace can give one a controller reference to a GpuJob and any attempt label; a
//! status can be written by hand. Such a Job is never taken for an attempt: only a Job
//! named as attempt k's and numbered at most one past what the status records can be
//! one. Attempt numbers are Kubernetes integers (32 bits), and a multi-node attempt's
//! pod host names (`<name>-<attempt>-<index>`) must fit in 63 characters whatever the
//! number has grown to.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use crate::support;

use gpujob_operator::api::{LABEL_ATTEMPT, Phase};
use gpujob_operator::controller::job::desired_job;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;
use support::{TestEnv, phase, ready, sim_env, with_reasons};

/// A Job labelled attempt 2147483647, made by hand with a controller reference to a
/// running GpuJob. Before, it became the current attempt: the running attempt 1 was
/// deleted as a stray, and the next number overflowed. Now it is the stray, deleted with
/// a Warning naming it; attempt 1 runs on and the status never moves past it.
#[tokio::test]
async fn a_job_claiming_an_attempt_number_the_operator_never_made_is_a_stray() {
    let env = TestEnv::new("forged").await;
    let op = env.operator("forged", env.settings()).await;
    env.create(
        "train",
        json!({"image": "i", "gpus": 1, "env": sim_env(&[("SIM_DURATION_SECONDS", "3600")])}),
    )
    .await;
    let running = env
        .wait_gpujob("train", "Running", |g| phase(g) == Some(Phase::Running))
        .await;
    // Named as attempt 2147483647's Job would be: only its number, past the attempts
    // the status records plus one, says the operator never made it.
    let mut forged = desired_job(&running, 1);
    forged.metadata.name = Some(format!("train-{}", i32::MAX));
    forged
        .metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert(LABEL_ATTEMPT.into(), i32::MAX.to_string());
    env.jobs()
        .create(&PostParams::default(), &forged)
        .await
        .unwrap();
    let events = env
        .events_of("train", with_reasons(&["UnrecognizedJobDeleted"]))
        .await;
    let warning = events
        .iter()
        .find(|e| e.1 == "UnrecognizedJobDeleted")
        .unwrap();
    assert!(
        warning.0 == "Warning" && warning.2.contains("train-2147483647"),
        "{warning:?}"
    );
    env.wait_job_gone(&format!("train-{}", i32::MAX), "the forged Job gone")
        .await;
    let one = env.jobs().get("train-1").await.unwrap();
    assert!(
        one.metadata.deletion_timestamp.is_none(),
        "the running attempt was taken for a stray"
    );
    let g = env.gpujobs().get("train").await.unwrap();
    let status = g.status.unwrap();
    assert_eq!(
        (status.phase, status.attempts, status.failures),
        (Some(Phase::Running), 1, 0),
        "{status:?}"
    );
    op.stop().await;
}

/// A multi-node GpuJob whose attempt numbers grew until its pods' host names no longer
/// fit (here a status written by hand says 99,999,999 attempts with a 52-character name,
/// the longest the operator took before: `<name>-100000000-<index>` has 64 characters).
/// Before, the attempt's Job was made and every pod create refused, silently; now
/// nothing is made and the GpuJob says why.
#[tokio::test]
async fn a_multi_node_attempt_whose_host_names_no_longer_fit_is_not_made_and_says_why() {
    let env = TestEnv::new("hostnames").await;
    let name = format!("h{}", "x".repeat(51));
    assert_eq!(name.len(), 52);
    // Created before the operator runs, with a long history, as if written by the
    // operator: 99,999,999 attempts, the last one's Job gone.
    env.create(
        &name,
        json!({"image": "i", "gpus": 1, "maxRetries": 3,
               "v2": {"nodes": 2}, "env": sim_env(&[("SIM_DURATION_SECONDS", "3600")])}),
    )
    .await;
    let status = json!({"status": {
        "attempts": 99_999_999, "failures": 0, "phase": "Running",
        "runFirstAttempt": 99_999_999,
    }});
    env.gpujobs()
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    let op = env.operator("hostnames", env.settings()).await;
    let g = env
        .wait_gpujob(&name, "waiting, saying the host names do not fit", |g| {
            ready(g).is_some_and(|(_, reason, message)| {
                reason == "InvalidSpec" && message.contains("host names")
            })
        })
        .await;
    let (_, _, message) = ready(&g).unwrap();
    assert!(message.contains("64 characters"), "{message}");
    assert_eq!(phase(&g), Some(Phase::Pending));
    assert!(
        env.jobs_of(&g).await.is_empty(),
        "no Job made whose pods cannot be created"
    );
    op.stop().await;
}
