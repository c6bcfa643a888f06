//! Where the control-plane binaries come from.
//!
//! The recipe lives in one place, `scripts/kube-binaries.sh` (compiled into this crate):
//! `KUBEBUILDER_ASSETS` first, as envtest users expect; else a cached build of
//! kube-apiserver and kube-controller-manager v1.20.2 from Debian's source package, with
//! etcd from Debian's `etcd-server`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::Error;

const SCRIPT: &str = include_str!("../scripts/kube-binaries.sh");

/// A folder holding `etcd`, `kube-apiserver` and `kube-controller-manager`.
#[derive(Debug, Clone)]
pub struct Assets {
    dir: PathBuf,
}

impl Assets {
    /// Finds usable binaries without installing or building anything.
    pub fn locate() -> Result<Assets, Error> {
        run_script(&["--locate"], false)
    }

    /// Finds the binaries, installing Debian packages (as root) and building
    /// kube-apiserver and kube-controller-manager (6–8 minutes, once) when missing.
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

    pub fn kube_controller_manager(&self) -> PathBuf {
        self.dir.join("kube-controller-manager")
    }
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
             installs and builds them, or point KUBEBUILDER_ASSETS at a folder holding etcd, \
             kube-apiserver and kube-controller-manager",
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
