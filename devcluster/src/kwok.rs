//! kwok (`sigs.k8s.io/kwok`) plays the kubelet of the fake GPU nodes: a child process
//! like the control plane's, driven by the Stages in `devcluster/kwok/pod-stages.yaml`.
//! Once kube-scheduler has bound a pod to one of those nodes, kwok moves it to Running,
//! then to Succeeded or Failed with the exit code and reason its `SIM_*` env asks for,
//! and ends a deleted pod as a kubelet does (exit code 143, then a zero-grace delete,
//! keeping the `DisruptionTarget` condition of an eviction or a preemption).
//! The Stage file says how each `SIM_*` variable is read.
//!
//! The binary comes from `scripts/kwok-binary.sh` (compiled into this crate):
//! `DEVCLUSTER_KWOK` first, else a cached build of the module through
//! `devcluster/kube/kwok`, else a build with Go from the module proxy.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::Error;

const SCRIPT: &str = include_str!("../scripts/kwok-binary.sh");
/// The Go modules the script builds from; it is run from this crate's text, not its file.
const MODULES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/kube");
/// What kwok does with the pods on its nodes.
pub const POD_STAGES: &str = include_str!("../kwok/pod-stages.yaml");
/// What kwok does with its nodes (little: without a node Stage it manages no node, and
/// so no pod).
pub const NODE_STAGES: &str = include_str!("../kwok/node-stages.yaml");
/// The annotation (kwok's own convention) that hands a node to kwok.
pub const NODE_ANNOTATION: &str = "kwok.x-k8s.io/node";
pub const NODE_ANNOTATION_VALUE: &str = "fake";

/// kwok's settings, ahead of the Stages in one config file. No node lease and no
/// heartbeat: no node-lifecycle controller runs here, so they would only be writes
/// (devcluster sets each node's status once, Ready). No server: nothing asks a fake node
/// for logs or exec. More workers than the default 4: each pod transition is one
/// request, and a test or the load test may start a few hundred pods at once.
const KWOK_CONFIGURATION: &str = "apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokConfiguration
options:
  manageNodesWithAnnotationSelector: kwok.x-k8s.io/node=fake
  cidr: 10.0.0.0/24
  nodeLeaseDurationSeconds: 0
  podPlayStageParallelism: 16
  nodePlayStageParallelism: 1
---
";

/// The config file kwok is started with: its settings, then the node and pod Stages.
pub fn config_yaml() -> String {
    format!("{KWOK_CONFIGURATION}{NODE_STAGES}---\n{POD_STAGES}")
}

/// The kwok binary, found without building anything.
pub fn locate() -> Result<PathBuf, Error> {
    run_script(&["--locate"], false)
}

/// The kwok binary, built with Go from the module proxy when missing (once; the README
/// says how long that takes).
pub fn prepare() -> Result<PathBuf, Error> {
    run_script(&[], true)
}

/// The command that runs kwok against the API server `kubeconfig` points at, with
/// `config` as its only configuration.
pub(crate) fn command(binary: &Path, kubeconfig: &Path, config: &Path, work_dir: &Path) -> Command {
    let mut cmd = Command::new(binary);
    cmd.args([
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--config={}", config.display()),
    ]);
    // kwok also loads `$KWOK_WORKDIR/kwok.yaml` (default ~/.kwok) ahead of `--config`, and
    // the first KwokConfiguration wins: a developer's own kwok set-up would otherwise
    // change devcluster's nodes and pods.
    cmd.env("KWOK_WORKDIR", work_dir);
    cmd
}

fn run_script(args: &[&str], show_progress: bool) -> Result<PathBuf, Error> {
    let stderr = if show_progress {
        Stdio::inherit()
    } else {
        Stdio::piped()
    };
    let output = Command::new("bash")
        .arg("-c")
        .arg(SCRIPT)
        .arg("kwok-binary.sh")
        .args(args)
        .env("DEVCLUSTER_KUBE_MODULES", MODULES)
        .stdin(Stdio::null())
        .stderr(stderr)
        .output()
        .map_err(Error::io(
            "running bash for devcluster/scripts/kwok-binary.sh",
        ))?;
    if !output.status.success() {
        let detail = String::from_utf8_lossy(&output.stderr).trim().to_owned();
        return Err(Error::Assets(format!(
            "kwok unavailable ({}){}{}; `cargo run -p devcluster -- assets` builds it, or \
             point DEVCLUSTER_KWOK at a kwok binary",
            output.status,
            if detail.is_empty() { "" } else { ": " },
            detail
        )));
    }
    let dir = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    if dir.is_empty() {
        return Err(Error::Assets(
            "kwok-binary.sh succeeded but printed no folder".to_owned(),
        ));
    }
    Ok(PathBuf::from(dir).join("kwok"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_node_is_not_made_ready_again() {
        let key = format!(
            r#"'.metadata.annotations["{}"]'"#,
            crate::nodes::LOST_ANNOTATION
        );
        let at = NODE_STAGES
            .find(&key)
            .expect("the node Stage skips lost nodes");
        assert!(
            NODE_STAGES[at..]
                .trim_start_matches(&key)
                .trim_start()
                .starts_with("operator: 'DoesNotExist'"),
            "{}",
            &NODE_STAGES[at..]
        );
    }

    #[test]
    fn the_config_hands_kwok_the_nodes_devcluster_annotates() {
        let config = config_yaml();
        assert!(config.contains(&format!(
            "manageNodesWithAnnotationSelector: {NODE_ANNOTATION}={NODE_ANNOTATION_VALUE}"
        )));
        // Settings first, then one document per Stage.
        assert!(config.starts_with("apiVersion: config.kwok.x-k8s.io/v1alpha1"));
        assert_eq!(config.matches("kind: Stage").count(), 5, "{config}");
        assert_eq!(config.matches("kind: Node").count(), 1, "{config}");
    }
}
