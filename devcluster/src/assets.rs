//! Where the control-plane binaries come from.
//!
//! The recipe lives in one place, `scripts/kube-binaries.sh` (compiled into this crate):
//! `KUBEBUILDER_ASSETS` first, as envtest users expect; else a cached build of
//! kube-apiserver, kube-controller-manager and kube-scheduler from the Go module
//! `k8s.io/kubernetes`, and of etcd from `go.etcd.io/etcd/server/v3`, through the two
//! small modules under `devcluster/kube/`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::Error;

const SCRIPT: &str = include_str!("../scripts/kube-binaries.sh");
/// The Go modules the script builds from; it is run from this crate's text, not its file.
const MODULES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/kube");

/// A folder holding `etcd`, `kube-apiserver`, `kube-controller-manager` and
/// `kube-scheduler`.
#[derive(Debug, Clone)]
pub struct Assets {
    dir: PathBuf,
}

impl Assets {
    /// Finds usable binaries without installing or building anything.
    pub fn locate() -> Result<Assets, Error> {
        run_script(&["--locate"], false)
    }

    /// Finds the binaries, building them with Go from the module proxy when missing
    /// (once; docs/test-command-timings.md says how long that takes).
    pub fn prepare() -> Result<Assets, Error> {
        run_script(&[], true)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn etcd(&self) -> PathBuf {
        self.dir.join("etcd")
    }

    pub fn kube_apiserver(&self) -> PathBuf {
        self.dir.join("kube-apiserver")
    }

    /// The minor version of these binaries (`kube-apiserver --version`: `Kubernetes
    /// v1.37.2` is 37); `None` when it does not say.
    pub fn minor_version(&self) -> Option<u32> {
        let out = std::process::Command::new(self.kube_apiserver())
            .arg("--version")
            .output()
            .ok()?;
        minor_of(&String::from_utf8_lossy(&out.stdout))
    }

    pub fn kube_controller_manager(&self) -> PathBuf {
        self.dir.join("kube-controller-manager")
    }

    pub fn kube_scheduler(&self) -> PathBuf {
        self.dir.join("kube-scheduler")
    }
}

/// `Kubernetes v1.37.2` → 37.
fn minor_of(version: &str) -> Option<u32> {
    let v = version.trim().strip_prefix("Kubernetes v")?;
    v.split('.').nth(1)?.parse().ok()
}

fn run_script(args: &[&str], show_progress: bool) -> Result<Assets, Error> {
    let stderr = if show_progress {
        Stdio::inherit()
    } else {
        Stdio::piped()
    };
    let output = Command::new("bash")
        .arg("-c")
        .arg(SCRIPT)
        .arg("kube-binaries.sh")
        .args(args)
        .env("DEVCLUSTER_KUBE_MODULES", MODULES)
        .stdin(Stdio::null())
        .stderr(stderr)
        .output()
        .map_err(Error::io(
            "running bash for devcluster/scripts/kube-binaries.sh",
        ))?;
    if !output.status.success() {
        let detail = String::from_utf8_lossy(&output.stderr).trim().to_owned();
        return Err(Error::Assets(format!(
            "control-plane binaries unavailable ({}){}{}; `cargo run -p devcluster -- assets` \
             builds them, or point KUBEBUILDER_ASSETS at a folder holding etcd, \
             kube-apiserver, kube-controller-manager and kube-scheduler",
            output.status,
            if detail.is_empty() { "" } else { ": " },
            detail
        )));
    }
    let dir = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    if dir.is_empty() {
        return Err(Error::Assets(
            "kube-binaries.sh succeeded but printed no folder".to_owned(),
        ));
    }
    Ok(Assets {
        dir: PathBuf::from(dir),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_minor_version_is_read_from_kube_apiserver_version() {
        assert_eq!(minor_of("Kubernetes v1.37.2\n"), Some(37));
        assert_eq!(minor_of("Kubernetes v1.33.13"), Some(33));
        assert_eq!(minor_of("v1.33.13"), None);
    }
}
