//! kube-apiserver down for longer than the renew deadline: the leader steps down, a
//! leader is elected once it is back, and everything converges with nothing repeated.
//! Runs on a control plane of its own (it stops kube-apiserver), one test at a time.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use crate::support;

use std::time::Duration;

use gpujob_operator::api::Phase;
use kube::api::ListParams;
use serde_json::json;
use support::replicas::{self, wait_holder};
use support::{TestEnv, phase, sim_env};

#[tokio::test]
async fn the_leader_steps_down_while_the_api_server_is_gone_and_work_resumes_after() {
    let mut env = TestEnv::private("ha-apiserver").await;
    let replicas: Vec<_> = (1..=3)
        .map(|n| replicas::start(&env.cluster, &env.ns, n, &[]))
        .collect();
    let (leader, _) = wait_holder(&env.admin, &env.ns, Duration::from_secs(30), |_| true).await;
    let spec = json!({"image": "i", "gpus": 1, "env": sim_env(&[("SIM_DURATION_SECONDS", "6")])});
    for i in 0..5 {
        env.create(&format!("early-{i}"), spec.clone()).await;
    }
    for i in 0..5 {
        env.wait_gpujob(&format!("early-{i}"), "Running", |g| {
            phase(g) == Some(Phase::Running)
        })
        .await;
    }

    // Down for at least twice the renew deadline (2 s) and more than the lease duration
    // (3 s), and until the leader says it stepped down: what is checked is that it steps
    // down while the API server is gone, not how soon (a loaded machine may take longer
    // to notice; that no write starts past the deadline has tests of its own, on a
    // paused clock, in src/lease/ownership.rs).
    env.cluster.stop_apiserver().unwrap();
    let stopped = tokio::time::Instant::now();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let leader_replica = replicas.iter().find(|r| r.identity() == leader).unwrap();
    let stepped_down = devcluster::wait::until(
        "the leader to step down",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || {
            std::future::ready(
                leader_replica
                    .log_text()
                    .contains("stepping down")
                    .then_some(()),
            )
        },
    )
    .await;
    println!(
        "the leader said it stepped down within {:?} of the API server's stop",
        stopped.elapsed()
    );
    env.cluster.start_apiserver().await.unwrap();
    assert!(
        stepped_down.is_ok(),
        "the leader kept leading without the API server:\n{}",
        leader_replica.log_text()
    );
    let (new_leader, _) = wait_holder(&env.admin, &env.ns, Duration::from_secs(30), |_| true).await;
    println!("leader before: {leader}, after: {new_leader}");

    for i in 0..5 {
        env.create(&format!("late-{i}"), spec.clone()).await;
    }
    let converged = env
        .wait_gpujobs("every GpuJob to succeed", Duration::from_secs(120), |all| {
            all.iter()
                .filter(|g| phase(g) == Some(Phase::Succeeded))
                .count()
                == 10
        })
        .await;
    if let Err(e) = converged {
        panic!("{e}\n{}", env.dump().await);
    }
    // Nothing repeated: every GpuJob ran exactly one attempt, as exactly one Job.
    for gj in env
        .gpujobs()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
    {
        let status = gj.status.clone().unwrap();
        assert_eq!(
            (status.attempts, status.failures),
            (1, 0),
            "{:?}",
            gj.metadata.name
        );
        assert_eq!(env.jobs_of(&gj).await.len(), 1, "{:?}", gj.metadata.name);
    }
    drop(replicas);
    // `env` owns its control plane: dropping it stops every process.
    let _ = &mut env;
}
