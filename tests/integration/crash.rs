//! Crash points around the external quota, with the real binary built with the
//! `failpoints` feature: the process aborts right after a reservation, right after a Job
//! create, right after a release (and right before a reserve); a restarted operator must neither double nor leak a
//! reservation, nor run an attempt twice. Effects are counted, not calls.

#![cfg(feature = "failpoints")]
#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use crate::support;

use std::time::Duration;

use gpujob_operator::api::{FINALIZER_QUOTA, Phase};
use serde_json::json;
use support::quota::FakeQuota;
use support::replicas::{self, SHORT};
use support::{TestEnv, phase, sim_env};

#[tokio::test]
async fn a_crash_at_any_quota_step_neither_doubles_nor_leaks_anything() {
    let env = TestEnv::new("crash").await;
    let fake = FakeQuota::start().await;
    let mut flags = vec!["--leader-elect=false".to_owned()];
    flags.extend(fake.flags(&env.ns));
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    for (i, point) in [
        "before-reserve",
        "after-reserve",
        "after-job-create",
        "after-release",
    ]
    .into_iter()
    .enumerate()
    {
        let name = format!("gj-{i}");
        let gj = env
            .create(
                &name,
                json!({"image": "i", "gpus": 2, "env": sim_env(&[("SIM_DURATION_SECONDS", "2")])}),
            )
            .await;
        let uid = gj.metadata.uid.clone().unwrap();

        // Armed: the process aborts at the failpoint.
        let mut armed = replicas::start_full(
            &env.cluster,
            &env.ns,
            1,
            SHORT,
            &flags,
            &[("GPUJOB_FAILPOINT", point)],
        );
        let status = armed.wait_exit(Duration::from_secs(60)).await;
        assert!(
            !status.success(),
            "{point}: the failpoint aborts ({status})"
        );
        assert!(
            armed.log_text().contains(&format!("failpoint {point}")),
            "{point}: {}",
            armed.log_text()
        );

        // Restarted without it: everything converges.
        let healthy = replicas::start_full(&env.cluster, &env.ns, 1, SHORT, &flags, &[]);
        if point != "after-release" {
            let running = env
                .wait_gpujob(&name, "Running or done", |g| {
                    matches!(phase(g), Some(Phase::Running) | Some(Phase::Succeeded))
                })
                .await;
            if phase(&running) == Some(Phase::Running) {
                assert_eq!(
                    fake.live().len(),
                    1,
                    "{point}: exactly one live reservation while running"
                );
            }
        }
        let done = env
            .wait_gpujob(&name, "Succeeded, released, unfinalized", |g| {
                phase(g) == Some(Phase::Succeeded)
                    && !g
                        .metadata
                        .finalizers
                        .iter()
                        .flatten()
                        .any(|f| f == FINALIZER_QUOTA)
            })
            .await;
        assert!(
            fake.live().is_empty(),
            "{point}: a reservation leaked: {:?}",
            fake.live()
        );
        assert_eq!(
            fake.granted(&uid).len(),
            1,
            "{point}: one reservation, however often reserved"
        );
        let status = done.status.clone().unwrap();
        assert_eq!((status.attempts, status.failures), (1, 0), "{point}");
        assert_eq!(
            env.jobs_of(&done).await.len(),
            1,
            "{point}: one Job for the one attempt"
        );
        drop(healthy);
    }
}
