//! `kubectl gpujob` (plugin/, crate kubectl-gpujob) against the real control plane, as a
//! user runs it: the built binary, the admin's kubeconfig, `-n` the test's namespace,
//! and an operator replica running the GpuJobs. Asserts on what it prints and on the
//! API objects its actions change.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use crate::support;

use std::path::{Path, PathBuf};

use devcluster::{Identity, wait};
use gpujob_operator::api::{ANNOTATION_RERUN, LABEL_ATTEMPT, LABEL_UID, Phase};
use gpujob_operator::controller::job::COMPLETION_INDEX;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use serde_json::json;
use support::{POLL, TestEnv, WAIT, phase, ready, sim_env};

/// The plugin binary cargo built beside this test binary (`<target>/debug/deps/…` →
/// `<target>/debug/kubectl-gpujob`): scripts/test.sh builds the whole workspace, and the
/// plugin's own tests make cargo build it.
fn plugin_bin() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .unwrap()
        .join("kubectl-gpujob");
    assert!(
        bin.exists(),
        "{} is missing: build it with `cargo build -p kubectl-gpujob` (scripts/test.sh builds the workspace)",
        bin.display()
    );
    bin
}

#[derive(Debug)]
struct Ran {
    ok: bool,
    stdout: String,
    stderr: String,
}

/// Runs `kubectl-gpujob -n <ns> args…` as the admin (off the runtime's threads).
async fn plugin(env: &TestEnv, args: &[&str]) -> Ran {
    let mut cmd = env.cluster.command(plugin_bin(), Identity::Admin);
    cmd.args(["-n", &env.ns]).args(args);
    let out = tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap();
    Ran {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Runs the plugin until what it prints satisfies `pred` (the operator and its Events
/// catch up in the background).
async fn plugin_until(
    env: &TestEnv,
    args: &[&str],
    what: &str,
    pred: impl Fn(&Ran) -> bool,
) -> Ran {
    let pred = &pred;
    let last = std::sync::Mutex::new(None);
    let got = wait::until(
        &format!("kubectl gpujob {}: {what}", args.join(" ")),
        WAIT,
        POLL,
        || async {
            let ran = plugin(env, args).await;
            let ok = pred(&ran);
            *last.lock().unwrap() = Some(format!("{ran:?}"));
            ok.then_some(ran)
        },
    )
    .await;
    got.unwrap_or_else(|e| panic!("{e}; last run: {:?}", last.lock().unwrap()))
}

/// The `attempts` table's data rows, as cells.
fn rows(table: &str) -> Vec<Vec<String>> {
    table
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().map(str::to_owned).collect())
        .collect()
}

/// One line, for `contains` checks of the wrapped `why` paragraph.
fn flat(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

async fn pods_of(env: &TestEnv, uid: &str, attempt: i32) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(env.admin.clone(), &env.ns);
    let mut pods = pods
        .list(
            &ListParams::default().labels(&format!("{LABEL_UID}={uid},{LABEL_ATTEMPT}={attempt}")),
        )
        .await
        .unwrap()
        .items;
    pods.sort_by_key(|p| {
        p.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(COMPLETION_INDEX))
            .and_then(|i| i.parse::<i32>().ok())
            .unwrap_or(0)
    });
    pods
}

fn node_of(pod: &Pod) -> String {
    pod.spec.as_ref().unwrap().node_name.clone().unwrap()
}

#[tokio::test]
async fn attempts_why_and_logs_of_a_multi_node_gpujob_that_failed_once() {
    let env = TestEnv::new("plugin-attempts").await;
    let op = env.operator("plugin-attempts", env.settings()).await;
    let gj = env
        .create(
            "train",
            json!({"image": "i", "gpus": 1, "maxRetries": 2, "v2": {"nodes": 2},
                   "env": sim_env(&[("SIM_FAIL_ATTEMPTS", "1"), ("SIM_EXIT_CODE", "3"),
                                    ("SIM_DURATION_SECONDS", "0.5")])}),
        )
        .await;
    let uid = gj.metadata.uid.clone().unwrap();
    env.wait_gpujob("train", "Succeeded at attempt 2", |g| {
        phase(g) == Some(Phase::Succeeded) && g.status.as_ref().unwrap().attempts == 2
    })
    .await;

    // attempts: one row per attempt, nodes as the pods say, the failure counted.
    let ran = plugin(&env, &["attempts", "train"]).await;
    assert!(ran.ok, "{ran:?}");
    let header = ran.stdout.lines().next().unwrap_or_default();
    assert_eq!(
        header.split_whitespace().collect::<Vec<_>>(),
        [
            "ATTEMPT",
            "JOB",
            "PHASE",
            "EXIT/REASON",
            "NODES",
            "STARTED",
            "ENDED",
            "COUNTED"
        ],
        "{}",
        ran.stdout
    );
    let rows = rows(&ran.stdout);
    assert_eq!(rows.len(), 2, "{}", ran.stdout);
    // Each node once, in name order (two pods of a failed attempt may share one).
    let nodes = |pods: &[Pod]| {
        let mut nodes = pods.iter().map(node_of).collect::<Vec<_>>();
        nodes.sort();
        nodes.dedup();
        nodes.join(",")
    };
    let first = pods_of(&env, &uid, 1).await;
    let second = pods_of(&env, &uid, 2).await;
    assert_eq!(second.len(), 2, "two pods, one per node");
    // ATTEMPT JOB PHASE exit N (Reason) NODES STARTED ENDED COUNTED
    assert_eq!(
        rows[0][..6],
        ["1", "train-1", "Failed", "exit", "3", "(Error)"],
        "{}",
        ran.stdout
    );
    assert_eq!(rows[0][6], nodes(&first), "{}", ran.stdout);
    assert_eq!(rows[0][9], "yes", "{}", ran.stdout);
    assert_eq!(
        rows[1][..6],
        ["2", "train-2", "Succeeded", "exit", "0", "(Completed)"],
        "{}",
        ran.stdout
    );
    assert_eq!(rows[1][6], nodes(&second), "{}", ran.stdout);
    assert_eq!(rows[1][9], "-", "{}", ran.stdout);
    assert!(
        rows.iter().all(|r| r[7] != "-" && r[8] != "-"),
        "started and ended: {}",
        ran.stdout
    );

    // why: finished, waits for nothing.
    let ran = plugin(&env, &["why", "train"]).await;
    assert!(ran.ok, "{ran:?}");
    let why = flat(&ran.stdout);
    assert!(
        why.starts_with(&format!(
            "GpuJob {}/train is Succeeded, attempt 2. It succeeded at",
            env.ns
        )) && why.contains("it waits for nothing"),
        "{why}"
    );

    // logs: the pod of the attempt and rank asked for. devcluster's kwok nodes serve no
    // logs (no kubelet behind them), so the read fails, naming that pod.
    let ran = plugin(&env, &["logs", "train", "--attempt", "2", "--rank", "1"]).await;
    let pod = second[1].metadata.name.clone().unwrap();
    assert!(
        ran.stderr.contains(&format!(
            "==> pod {}/{pod}: attempt 2, rank 1 of 2, node {}",
            env.ns,
            node_of(&second[1])
        )),
        "{ran:?}"
    );
    assert!(!ran.ok, "kwok serves no logs: {ran:?}");
    assert!(
        ran.stderr.contains(&format!(
            "error: reading the log of container main of pod {}/{pod}:",
            env.ns
        )),
        "{ran:?}"
    );
    let ran = plugin(&env, &["logs", "train"]).await;
    let pod = second[0].metadata.name.clone().unwrap();
    assert!(
        ran.stderr
            .contains(&format!("==> pod {}/{pod}: attempt 2, rank 0 of 2", env.ns)),
        "the newest attempt, rank 0 by default: {ran:?}"
    );
    let ran = plugin(&env, &["logs", "train", "--rank", "5"]).await;
    assert!(!ran.ok);
    assert_eq!(
        ran.stderr.trim(),
        format!(
            "error: attempt 2 of GpuJob {}/train has no pod of rank 5 (ranks: 0, 1)",
            env.ns
        )
    );
    let ran = plugin(&env, &["why", "missing"]).await;
    assert!(!ran.ok);
    assert_eq!(
        ran.stderr.trim(),
        format!("error: GpuJob {}/missing not found", env.ns)
    );
    op.stop().await;
}

#[tokio::test]
async fn suspend_resume_and_rerun_change_what_the_api_documents() {
    let env = TestEnv::new("plugin-day2").await;
    let op = env.operator("plugin-day2", env.settings()).await;
    env.create(
        "long",
        json!({"image": "i", "gpus": 1, "env": sim_env(&[("SIM_DURATION_SECONDS", "600")])}),
    )
    .await;
    let running = env
        .wait_gpujob("long", "attempt 1 runs", |g| {
            phase(g) == Some(Phase::Running) && ready(g).is_some_and(|(_, r, _)| r == "JobRunning")
        })
        .await;
    let uid = running.metadata.uid.clone().unwrap();
    let pod = wait::until("attempt 1's pod runs", WAIT, POLL, || async {
        env.running_pods(&format!("{LABEL_UID}={uid}"))
            .await
            .into_iter()
            .next()
    })
    .await
    .unwrap();
    let ran = plugin_until(&env, &["why", "long"], "runs", |r| {
        flat(&r.stdout).contains("It waits for nothing: attempt 1 runs")
    })
    .await;
    assert!(
        flat(&ran.stdout).contains(&format!(
            "attempt 1 runs (Job long-1) on {}.",
            node_of(&pod)
        )),
        "{ran:?}"
    );

    // suspend: spec.suspend, said; the running attempt stops, not counted.
    let ran = plugin(&env, &["suspend", "long"]).await;
    assert!(ran.ok, "{ran:?}");
    assert!(
        ran.stdout.starts_with(&format!(
            "GpuJob {}/long suspended (spec.suspend: true): no new attempt starts",
            env.ns
        )),
        "{ran:?}"
    );
    assert!(env.gpujobs().get("long").await.unwrap().spec.suspend);
    env.wait_gpujob("long", "Suspended", |g| phase(g) == Some(Phase::Suspended))
        .await;
    let ran = plugin(&env, &["suspend", "long"]).await;
    assert!(ran.ok);
    assert_eq!(
        ran.stdout.trim(),
        format!(
            "GpuJob {}/long is already suspended (spec.suspend: true); nothing changed",
            env.ns
        )
    );
    let ran = plugin(&env, &["why", "long"]).await;
    assert!(
        flat(&ran.stdout).contains("It waits to be resumed: spec.suspend is true since"),
        "{ran:?}"
    );
    plugin_until(
        &env,
        &["attempts", "long"],
        "attempt 1 stopped, not counted",
        |r| {
            rows(&r.stdout)
                .first()
                .is_some_and(|row| row[2] == "Stopped" && row.last().is_some_and(|c| c == "no"))
        },
    )
    .await;

    // resume: spec.suspend false; the next attempt runs.
    let ran = plugin(&env, &["resume", "long"]).await;
    assert!(ran.ok, "{ran:?}");
    assert!(
        ran.stdout.starts_with(&format!(
            "GpuJob {}/long resumed (spec.suspend: false)",
            env.ns
        )),
        "{ran:?}"
    );
    assert!(!env.gpujobs().get("long").await.unwrap().spec.suspend);
    env.wait_gpujob("long", "attempt 2 runs", |g| {
        phase(g) == Some(Phase::Running) && g.status.as_ref().unwrap().attempts == 2
    })
    .await;
    plugin_until(&env, &["attempts", "long"], "attempt 2 runs", |r| {
        rows(&r.stdout)
            .get(1)
            .is_some_and(|row| row[..3] == ["2", "long-2", "Running"])
    })
    .await;

    // rerun: annotation gpujob.dev/rerun; a finished GpuJob starts run 2.
    env.create(
        "short",
        json!({"image": "i", "gpus": 1, "env": sim_env(&[("SIM_DURATION_SECONDS", "0.5")])}),
    )
    .await;
    env.wait_gpujob("short", "Succeeded", |g| phase(g) == Some(Phase::Succeeded))
        .await;
    let ran = plugin(&env, &["rerun", "short", "--token", "t1"]).await;
    assert!(ran.ok, "{ran:?}");
    assert_eq!(
        ran.stdout.trim(),
        format!(
            "GpuJob {}/short: rerun requested ({ANNOTATION_RERUN}=t1); run 2 starts with attempt 2 (retries counted from 0 again)",
            env.ns
        )
    );
    let short = env.gpujobs().get("short").await.unwrap();
    assert_eq!(
        short
            .metadata
            .annotations
            .as_ref()
            .unwrap()
            .get(ANNOTATION_RERUN)
            .map(String::as_str),
        Some("t1")
    );
    env.wait_gpujob("short", "run 2 succeeded", |g| {
        let s = g.status.as_ref().unwrap();
        phase(g) == Some(Phase::Succeeded)
            && s.run == Some(2)
            && s.rerun_token.as_deref() == Some("t1")
            && s.attempts == 2
    })
    .await;
    let ran = plugin(&env, &["rerun", "short", "--token", "t1"]).await;
    assert!(!ran.ok, "the same request again is refused: {ran:?}");
    assert!(
        ran.stderr.contains("already answered rerun request t1"),
        "{ran:?}"
    );
    let ran = plugin(&env, &["why", "short"]).await;
    assert!(
        flat(&ran.stdout).contains("is Succeeded, attempt 2 (run 2)."),
        "{ran:?}"
    );
    op.stop().await;
}

#[tokio::test]
async fn why_says_a_gpujob_waits_for_nodes_or_a_name_conflict() {
    let env = TestEnv::new("plugin-why").await;
    let op = env.operator("plugin-why", env.settings()).await;
    // No node matches: kube-scheduler's reason, through the status.
    env.create(
        "nowhere",
        json!({"image": "i", "gpus": 1, "nodeSelector": {"gpujob.test/nowhere": "true"}}),
    )
    .await;
    // A Job the GpuJob does not own holds its first attempt's name.
    env.create_foreign_job("taken-1").await;
    env.create("taken", json!({"image": "i", "gpus": 1})).await;

    let ran = plugin_until(&env, &["why", "nowhere"], "waits for nodes", |r| {
        flat(&r.stdout).contains("It waits for nodes: kube-scheduler finds no node for its pods")
    })
    .await;
    assert!(
        flat(&ran.stdout).contains("didn't match Pod's node affinity/selector"),
        "{ran:?}"
    );
    let ran = plugin_until(&env, &["why", "taken"], "waits for a name conflict", |r| {
        flat(&r.stdout).contains("It waits for a name conflict to end")
    })
    .await;
    assert!(
        flat(&ran.stdout).contains(&format!(
            "Job {}/taken-1 exists and is not controlled by this GpuJob",
            env.ns
        )),
        "{ran:?}"
    );
    let ran = plugin(&env, &["attempts", "taken"]).await;
    assert!(ran.ok, "{ran:?}");
    assert!(ran.stdout.contains("has started no attempt yet"), "{ran:?}");
    op.stop().await;
}
