//! Day-2 operations as a GpuJob user does them with kubectl, on the real control plane:
//! waiting for the end either way, suspend and resume (also during a backoff, also with
//! GPU quota), a rerun of a finished GpuJob, deletion after a time to live, columns and
//! errors a person can act on.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use crate::support;

use std::time::Duration;

use devcluster::{Identity, wait};
use gpujob_operator::api::{GpuJob, Phase};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;
use support::quota::FakeQuota;
use support::{TestEnv, condition, phase, ready, sim_env};

/// Runs kubectl as the admin in the test's namespace (off the runtime's threads).
async fn kubectl(env: &TestEnv, args: &[&str]) -> std::process::Output {
    let mut cmd = env.cluster.command("kubectl", Identity::Admin);
    cmd.args(["-n", &env.ns]).args(args);
    tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap()
}

async fn patch_spec(env: &TestEnv, name: &str, spec: serde_json::Value) {
    env.gpujobs()
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": spec})),
        )
        .await
        .unwrap();
}

async fn wait_gone(api: &Api<GpuJob>, name: &str, within: Duration) {
    let api = api.clone();
    wait::until(
        &format!("GpuJob {name} to be deleted"),
        within,
        Duration::from_millis(200),
        || {
            let api = api.clone();
            async move { api.get_opt(name).await.ok()?.is_none().then_some(()) }
        },
    )
    .await
    .unwrap();
}

fn events(all: &[(String, String, String, i32)]) -> Vec<&str> {
    all.iter().map(|e| e.1.as_str()).collect()
}

#[tokio::test]
async fn scripts_can_wait_for_the_end_either_way_and_kubectl_shows_why() {
    let env = TestEnv::new("day2-wait").await;
    let op = env.operator("day2-wait", env.settings()).await;
    env.create(
        "ok",
        json!({"image": "i", "gpus": 1, "env": sim_env(&[("SIM_DURATION_SECONDS", "0.5")])}),
    )
    .await;
    env.create(
        "bad",
        json!({"image": "i", "gpus": 1, "maxRetries": 0, "env": sim_env(&[("SIM_EXIT_CODE", "3"), ("SIM_DURATION_SECONDS", "0.5")])}),
    )
    .await;
    for (name, condition) in [("ok", "Complete"), ("bad", "Failed")] {
        let out = kubectl(
            &env,
            &[
                "wait",
                &format!("--for=condition={condition}"),
                &format!("gj/{name}"),
                "--timeout=90s",
            ],
        )
        .await;
        assert!(
            out.status.success(),
            "kubectl wait {condition} gj/{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let bad = env.gpujobs().get("bad").await.unwrap();
    assert!(
        condition(&bad, "Complete").is_none(),
        "the end is one or the other"
    );
    assert!(condition(&bad, "Failed").unwrap().2.contains("exit code 3"));

    // `-o wide` says why a GpuJob is (not) running, and when it tries next.
    let out = kubectl(&env, &["get", "gj", "-o", "wide"]).await;
    let table = String::from_utf8_lossy(&out.stdout);
    let header = table.lines().next().unwrap_or_default();
    assert!(
        header.contains("REASON") && header.contains("NEXT ATTEMPT"),
        "{table}"
    );
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("bad") && l.contains("RetriesExhausted")),
        "{table}"
    );
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("ok") && l.contains("Succeeded")),
        "{table}"
    );
    op.stop().await;
}

#[tokio::test]
async fn suspend_stops_the_running_attempt_without_a_failure_and_resume_runs_the_next() {
    let env = TestEnv::new("day2-suspend").await;
    let op = env.operator("day2-suspend", env.settings()).await;
    let gj = env
        .create(
            "train",
            // Suspending stops the running attempt whatever the update policy (with
            // Recreate a spec change would replace it anyway).
            json!({"image": "i", "gpus": 1, "updatePolicy": "OnNextAttempt",
                "env": sim_env(&[("SIM_DURATION_SECONDS", "300")])}),
        )
        .await;
    env.wait_gpujob("train", "Running", |g| phase(g) == Some(Phase::Running))
        .await;

    patch_spec(&env, "train", json!({"suspend": true})).await;
    let suspended = env
        .wait_gpujob("train", "Suspended with its Job gone", |g| {
            phase(g) == Some(Phase::Suspended)
                && g.status.as_ref().is_some_and(|s| s.active_job.is_none())
        })
        .await;
    wait::until(
        "attempt 1's Job to go",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async {
            env.jobs()
                .get_opt("train-1")
                .await
                .ok()?
                .is_none()
                .then_some(())
        },
    )
    .await
    .unwrap();
    let status = suspended.status.clone().unwrap();
    assert_eq!(
        (status.attempts, status.failures),
        (1, 0),
        "stopped, not failed"
    );
    assert_eq!(condition(&suspended, "Suspended").unwrap().0, "True");

    patch_spec(
        &env,
        "train",
        json!({"suspend": false, "env": sim_env(&[("SIM_DURATION_SECONDS", "0.5")])}),
    )
    .await;
    let done = env
        .wait_gpujob("train", "Succeeded", |g| phase(g) == Some(Phase::Succeeded))
        .await;
    let status = done.status.clone().unwrap();
    assert_eq!((status.attempts, status.failures), (2, 0));
    assert_eq!(condition(&done, "Complete").unwrap().0, "True");
    let jobs = env.jobs_of(&gj).await;
    assert_eq!(jobs.len(), 1, "only attempt 2's Job");
    let seen = env
        .events_of(
            "train",
            support::with_reasons(&["Suspended", "Resumed", "AttemptStarted", "Succeeded"]),
        )
        .await;
    for reason in ["Suspended", "Resumed", "AttemptStarted", "Succeeded"] {
        assert!(events(&seen).contains(&reason), "{reason}: {seen:?}");
    }
    assert!(!events(&seen).contains(&"AttemptFailed"), "{seen:?}");
    op.stop().await;
}

#[tokio::test]
async fn a_suspend_during_backoff_holds_the_next_attempt_until_resumed() {
    let env = TestEnv::new("day2-backoff").await;
    // Long enough that a loaded machine sees the failure, and the suspend lands, while
    // the backoff still runs (it counts from the Job's Failed time).
    let mut settings = env.settings();
    settings.plan.backoff_base = Duration::from_secs(20);
    settings.plan.backoff_max = Duration::from_secs(20);
    let op = env.operator("day2-backoff", settings).await;
    env.create(
        "flaky",
        json!({"image": "i", "gpus": 1, "env": sim_env(&[("SIM_FAIL_ATTEMPTS", "1"), ("SIM_DURATION_SECONDS", "0.5")])}),
    )
    .await;
    let backing_off = env
        .wait_gpujob("flaky", "backing off", |g| {
            ready(g).is_some_and(|(_, r, _)| r == "BackingOff")
        })
        .await;
    let next = backing_off
        .status
        .and_then(|s| s.next_attempt_time)
        .expect("a backoff has its end");
    patch_spec(&env, "flaky", json!({"suspend": true})).await;
    let held = env
        .wait_gpujob("flaky", "Suspended", |g| phase(g) == Some(Phase::Suspended))
        .await;
    assert_eq!(held.status.clone().unwrap().next_attempt_time, None);
    // Past the backoff's end (and a look after it: a resync, were it not suspended):
    // still no attempt 2.
    support::until_past(next).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let still = env.gpujobs().get("flaky").await.unwrap();
    assert_eq!(
        still.status.clone().unwrap().attempts,
        1,
        "nothing starts while suspended"
    );
    assert!(env.jobs().get_opt("flaky-2").await.unwrap().is_none());

    patch_spec(&env, "flaky", json!({"suspend": false})).await;
    let done = env
        .wait_gpujob("flaky", "Succeeded", |g| phase(g) == Some(Phase::Succeeded))
        .await;
    let status = done.status.clone().unwrap();
    assert_eq!((status.attempts, status.failures), (2, 1));
    op.stop().await;
}

#[tokio::test]
async fn a_suspended_gpujob_holds_no_quota_and_can_be_deleted() {
    let env = TestEnv::new("day2-quota").await;
    let fake = FakeQuota::start().await;
    let token = support::namespace_temp(support::QUOTA_TOKEN, &env.ns);
    let mut settings = env.settings();
    settings.quota = fake.provider(&token);
    let op = env.operator("day2-quota", settings).await;
    let gj = env
        .create(
            "train",
            json!({"image": "i", "gpus": 2, "env": sim_env(&[("SIM_DURATION_SECONDS", "300")])}),
        )
        .await;
    let uid = gj.metadata.uid.clone().unwrap();
    env.wait_gpujob("train", "Running", |g| phase(g) == Some(Phase::Running))
        .await;
    assert!(fake.live().contains_key(&uid));

    patch_spec(&env, "train", json!({"suspend": true})).await;
    env.wait_gpujob("train", "Suspended, quota released", |g| {
        phase(g) == Some(Phase::Suspended)
            && g.status
                .as_ref()
                .is_some_and(|s| s.reservation_id.is_none())
    })
    .await;
    assert!(!fake.live().contains_key(&uid), "released while suspended");

    patch_spec(&env, "train", json!({"suspend": false})).await;
    env.wait_gpujob("train", "Running again with quota", |g| {
        phase(g) == Some(Phase::Running)
            && g.status
                .as_ref()
                .is_some_and(|s| s.reservation_id.is_some())
    })
    .await;
    assert!(fake.live().contains_key(&uid), "reserved again on resume");

    // Suspended again, then deleted: the finalizer lets go once the release is done.
    patch_spec(&env, "train", json!({"suspend": true})).await;
    env.wait_gpujob("train", "Suspended", |g| phase(g) == Some(Phase::Suspended))
        .await;
    env.gpujobs()
        .delete("train", &DeleteParams::default())
        .await
        .unwrap();
    wait_gone(&env.gpujobs(), "train", Duration::from_secs(60)).await;
    assert!(fake.live().is_empty(), "{:?}", fake.live());
    op.stop().await;
}

#[tokio::test]
async fn a_rerun_starts_a_new_run_with_the_next_attempt_number() {
    let env = TestEnv::new("day2-rerun").await;
    let op = env.operator("day2-rerun", env.settings()).await;
    let gj = env
        .create(
            "nightly",
            json!({"image": "i", "gpus": 1, "maxRetries": 0, "env": sim_env(&[("SIM_FAIL_ATTEMPTS", "1"), ("SIM_DURATION_SECONDS", "0.5")])}),
        )
        .await;
    env.wait_gpujob("nightly", "Failed", |g| phase(g) == Some(Phase::Failed))
        .await;

    // docs/day-2.md's one-liner.
    let out = kubectl(
        &env,
        &[
            "annotate",
            "gj",
            "nightly",
            "gpujob.dev/rerun=first-rerun",
            "--overwrite",
        ],
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let done = env
        .wait_gpujob("nightly", "run 2 Succeeded", |g| {
            phase(g) == Some(Phase::Succeeded)
                && g.status.as_ref().is_some_and(|s| s.run == Some(2))
        })
        .await;
    let status = done.status.clone().unwrap();
    assert_eq!((status.attempts, status.failures), (2, 0), "{status:?}");
    assert_eq!(status.run_first_attempt, Some(2));
    assert_eq!(status.rerun_token.as_deref(), Some("first-rerun"));
    assert!(condition(&done, "Failed").is_none(), "run 1's end is gone");
    assert_eq!(condition(&done, "Complete").unwrap().0, "True");
    let names: Vec<String> = env
        .jobs_of(&gj)
        .await
        .iter()
        .map(|j| j.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(names, vec!["nightly-1", "nightly-2"], "names stay unique");
    let seen = env
        .events_of("nightly", support::with_reasons(&["Rerun"]))
        .await;
    assert!(events(&seen).contains(&"Rerun"));

    // The same request again starts nothing, once looked at (another annotation changes
    // with it, or the unchanged object would bring no watch event and no look).
    let seen = support::signals::watched(&op, "gpujobs");
    let out = kubectl(
        &env,
        &[
            "annotate",
            "gj",
            "nightly",
            "gpujob.dev/rerun=first-rerun",
            "test/poke=1",
            "--overwrite",
        ],
    )
    .await;
    assert!(out.status.success());
    support::signals::quiet_after(&op, "gpujobs", seen + 1).await;
    let after = env.gpujobs().get("nightly").await.unwrap();
    assert_eq!(after.status.unwrap().attempts, 2);
    op.stop().await;
}

#[tokio::test]
async fn finished_gpujobs_go_after_their_time_to_live_and_running_ones_stay() {
    let env = TestEnv::new("day2-ttl").await;
    let mut settings = env.settings();
    settings.plan.default_ttl = Some(Duration::from_secs(3));
    let op = env.operator("day2-ttl", settings).await;
    let own = env
        .create(
            "own-ttl",
            json!({"image": "i", "gpus": 1, "ttlSecondsAfterFinished": 1, "env": sim_env(&[("SIM_DURATION_SECONDS", "0.5")])}),
        )
        .await;
    env.create(
        "default-ttl",
        json!({"image": "i", "gpus": 1, "env": sim_env(&[("SIM_DURATION_SECONDS", "0.5")])}),
    )
    .await;
    env.create(
        "long",
        json!({"image": "i", "gpus": 1, "env": sim_env(&[("SIM_DURATION_SECONDS", "300")])}),
    )
    .await;
    let api = env.gpujobs();
    wait_gone(&api, "own-ttl", Duration::from_secs(60)).await;
    wait_gone(&api, "default-ttl", Duration::from_secs(60)).await;
    let uid = own.metadata.uid.clone().unwrap();
    let jobs = env.jobs();
    wait::until(
        "its Jobs to be collected",
        Duration::from_secs(60),
        Duration::from_millis(250),
        || {
            let jobs = jobs.clone();
            let uid = uid.clone();
            async move {
                let list = jobs
                    .list(
                        &kube::api::ListParams::default().labels(&format!("gpujob.dev/uid={uid}")),
                    )
                    .await
                    .ok()?;
                list.items.is_empty().then_some(())
            }
        },
    )
    .await
    .unwrap();
    let long = api.get("long").await.unwrap();
    assert_eq!(phase(&long), Some(Phase::Running), "not finished: kept");
    op.stop().await;
}

#[tokio::test]
async fn a_missing_lease_namespace_is_said_in_one_line_with_the_fix() {
    let env = TestEnv::new("day2-errors").await;
    let dir = support::namespace_temp(support::DAY2_ERRORS, &env.ns);
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("operator.log");
    let out = std::fs::File::create(&log).unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_gpujob-operator"))
        .args([
            "run",
            "--namespace",
            &env.ns,
            "--lease-namespace",
            "no-such-namespace",
        ])
        .args(["--listen-address", "127.0.0.1:0", "--retry-period", "500ms"])
        .args(["--renew-deadline", "2s", "--lease-duration", "3s"])
        .env("KUBECONFIG", env.cluster.kubeconfig(Identity::Admin))
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap();
    let log_ref = &log;
    let line = wait::until(
        "the lease error in the log",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || async move {
            let text = std::fs::read_to_string(log_ref).ok()?;
            text.lines()
                .find(|l| l.contains("lease: acquiring failed"))
                .map(str::to_owned)
        },
    )
    .await;
    let _ = child.kill();
    let _ = child.wait();
    let line = line.unwrap();
    assert!(
        line.contains("namespace no-such-namespace not found: apply deploy/operator/namespace.yaml or pass --lease-namespace"),
        "{line}"
    );
    assert!(
        !line.contains("ErrorResponse") && !line.contains("Status {"),
        "no debug dump: {line}"
    );
}
