//! Start, restart and teardown of control planes this binary owns. Each test starts its
//! own, so nextest runs this binary's tests one at a time (see .config/nextest.toml).

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use devcluster::{ControlPlane, Identity, Options, is_alive};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use serde_json::json;

const WIDGET_CRD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/widget-crd.yaml");

fn options(state_dir: Option<PathBuf>) -> Options {
    Options {
        state_dir,
        crds: vec![PathBuf::from(WIDGET_CRD)],
        pod_simulator: false,
        ..Options::default()
    }
}

fn wait_gone(pids: &[u32], within: Duration) -> Vec<u32> {
    let deadline = Instant::now() + within;
    loop {
        let alive: Vec<u32> = pids.iter().copied().filter(|p| is_alive(*p)).collect();
        if alive.is_empty() || Instant::now() >= deadline {
            return alive;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn scratch_dir(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("devcluster-{name}-{}", std::process::id()))
}

#[tokio::test]
async fn drop_ends_every_process_and_removes_the_state_folder() {
    // With kwok, the one child that is not part of the control plane proper.
    let cluster = ControlPlane::start(Options {
        pod_simulator: true,
        ..options(None)
    })
    .await
    .unwrap();
    let pids = cluster.pids();
    assert_eq!(
        pids.len(),
        6,
        "etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok, guard: {:?}",
        cluster.info().pids
    );
    assert!(cluster.info().pids.contains_key("kwok"));
    assert!(pids.iter().all(|p| is_alive(*p)));
    let state = cluster.info().state_dir.clone();
    assert!(state.join("cluster.json").exists());
    // The readiness contract: the default service account exists.
    println!("start-up took {:.1}s", cluster.info().startup_seconds);
    drop(cluster);
    assert_eq!(
        wait_gone(&pids, Duration::from_secs(1)),
        Vec::<u32>::new(),
        "left behind"
    );
    assert!(!state.exists(), "temporary state folder removed");
}

#[tokio::test]
async fn kube_apiserver_restarts_with_its_data() {
    let mut cluster = ControlPlane::start(options(None)).await.unwrap();
    let ns = cluster.create_namespace("restart").await.unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(cluster.client(Identity::Admin).await.unwrap(), &ns);
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "kept"}})).unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();
    let old_pid = cluster.info().pids["kube-apiserver"];

    cluster.stop_apiserver().unwrap();
    assert!(!is_alive(old_pid));
    assert!(cms.get("kept").await.is_err(), "the API server is down");

    cluster.start_apiserver().await.unwrap();
    assert_ne!(cluster.info().pids["kube-apiserver"], old_pid);
    assert!(
        cms.get("kept").await.is_ok(),
        "etcd kept the object across the restart"
    );
    let pids = cluster.pids();
    drop(cluster);
    assert!(wait_gone(&pids, Duration::from_secs(1)).is_empty());
}

#[tokio::test]
async fn a_start_ends_processes_left_by_an_earlier_run_in_its_folder() {
    let dir = scratch_dir("stale");
    let leaked = ControlPlane::start(options(Some(dir.clone())))
        .await
        .unwrap();
    let old: Vec<u32> = leaked
        .info()
        .pids
        .iter()
        .filter(|(k, _)| *k != "guard")
        .map(|(_, v)| *v)
        .collect();
    // As if the process had died without unwinding: nothing of `leaked` is stopped.
    std::mem::forget(leaked);
    assert!(old.iter().all(|p| is_alive(*p)));

    let cluster = ControlPlane::start(options(Some(dir.clone())))
        .await
        .unwrap();
    assert_eq!(
        wait_gone(&old, Duration::from_secs(1)),
        Vec::<u32>::new(),
        "stale processes still running"
    );
    let pids = cluster.pids();
    drop(cluster);
    assert!(wait_gone(&pids, Duration::from_secs(1)).is_empty());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Starts `devcluster up` as a child process and returns it with the pids it reports.
fn spawn_up(dir: &Path) -> (std::process::Child, Vec<u32>) {
    let child = Command::new(env!("CARGO_BIN_EXE_devcluster"))
        .args(["up", "--no-pod-simulator", "--state-dir"])
        .arg(dir)
        .env_remove("DEVCLUSTER_DIR")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let info = dir.join("cluster.json");
    let deadline = Instant::now() + Duration::from_secs(120);
    while !info.exists() {
        assert!(Instant::now() < deadline, "devcluster up did not get ready");
        std::thread::sleep(Duration::from_millis(200));
    }
    let attached = ControlPlane::attach(dir).unwrap();
    let pids = attached.pids();
    assert!(pids.iter().all(|p| is_alive(*p)));
    (child, pids)
}

#[test]
fn devcluster_up_stops_everything_on_sigterm_and_when_killed() {
    let dir = scratch_dir("up");

    // SIGTERM: an orderly stop, exit code 0.
    let (mut up, pids) = spawn_up(&dir);
    let pid = nix::unistd::Pid::from_raw(i32::try_from(up.id()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = up.wait().unwrap();
    assert!(status.success(), "{status}");
    assert_eq!(wait_gone(&pids, Duration::from_secs(1)), Vec::<u32>::new());

    // SIGKILL: no unwinding, no handler; the guard process ends the components.
    let (mut up, pids) = spawn_up(&dir);
    up.kill().unwrap();
    up.wait().unwrap();
    assert_eq!(wait_gone(&pids, Duration::from_secs(15)), Vec::<u32>::new());
    std::fs::remove_dir_all(&dir).unwrap();
}
