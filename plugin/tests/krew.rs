//! The krew manifest is well-formed (plugin/krew/gpujob.yaml), and the binary answers as
//! kubectl runs it. (Also makes cargo build the binary for the devcluster tests in
//! tests/integration/plugin.rs, which run it.)

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use std::collections::BTreeSet;
use std::process::Command;

use serde_json::Value;

const MANIFEST: &str = include_str!("../krew/gpujob.yaml");
const BIN: &str = env!("CARGO_BIN_EXE_kubectl-gpujob");

/// The release archive's name for `version` and a Rust target triple.
fn archive(version: &str, triple: &str) -> String {
    format!(
        "https://github.com/gpujob-dev/gpujob-operator/releases/download/{version}/kubectl-gpujob-{version}-{triple}.tar.gz"
    )
}

#[test]
fn the_krew_manifest_is_well_formed() {
    let m: Value = serde_saphyr::from_str(MANIFEST).unwrap();
    assert_eq!(
        m["apiVersion"],
        "krew.googlecontainertools.github.com/v1alpha2"
    );
    assert_eq!(m["kind"], "Plugin");
    // krew installs `kubectl-<name>`: kubectl runs it as `kubectl <name>`.
    assert_eq!(m["metadata"]["name"], "gpujob");
    let spec = &m["spec"];
    let version = format!("v{}", env!("CARGO_PKG_VERSION"));
    assert_eq!(
        spec["version"],
        version.as_str(),
        "spec.version follows the crate"
    );
    assert_eq!(spec["homepage"], env!("CARGO_PKG_REPOSITORY"));
    let short = spec["shortDescription"].as_str().unwrap();
    assert!(!short.is_empty() && short.len() <= 50, "{short}");
    assert!(
        spec["description"]
            .as_str()
            .unwrap()
            .contains("kubectl gpujob attempts")
    );

    let want: BTreeSet<(&str, &str, &str)> = [
        ("linux", "amd64", "x86_64-unknown-linux-musl"),
        ("linux", "arm64", "aarch64-unknown-linux-musl"),
        ("darwin", "amd64", "x86_64-apple-darwin"),
        ("darwin", "arm64", "aarch64-apple-darwin"),
    ]
    .into();
    let mut seen = BTreeSet::new();
    let mut placeholders = 0;
    for p in spec["platforms"].as_array().unwrap() {
        let labels = &p["selector"]["matchLabels"];
        let (os, arch) = (
            labels["os"].as_str().unwrap(),
            labels["arch"].as_str().unwrap(),
        );
        let (_, _, triple) = want
            .iter()
            .find(|(o, a, _)| *o == os && *a == arch)
            .unwrap_or_else(|| panic!("platform {os}/{arch} is not one the release builds"));
        assert_eq!(p["uri"], archive(&version, triple).as_str(), "{os}/{arch}");
        let sha = p["sha256"].as_str().unwrap();
        assert!(
            sha.len() == 64
                && sha
                    .bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()),
            "{os}/{arch}: sha256 {sha:?} is not 64 lowercase hex digits"
        );
        if sha.bytes().all(|b| b == b'0') {
            placeholders += 1;
        }
        assert_eq!(p["bin"], "kubectl-gpujob", "{os}/{arch}");
        let files: Vec<&str> = p["files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["from"].as_str().unwrap())
            .collect();
        assert_eq!(files, ["kubectl-gpujob", "LICENSE"], "{os}/{arch}");
        assert!(seen.insert((os, arch)), "{os}/{arch} twice");
    }
    let all: BTreeSet<(&str, &str)> = want.iter().map(|(o, a, _)| (*o, *a)).collect();
    assert_eq!(seen, all, "linux and darwin, amd64 and arm64");
    // The committed file is a template: every checksum a placeholder, and it says so. A
    // release's manifest has none: one left behind installs nothing on its platform.
    let template = MANIFEST.contains("uri and sha256 are placeholders here");
    assert!(
        placeholders == 0 || (template && placeholders == all.len()),
        "{placeholders} of {} checksums are placeholders (all zeros) in a manifest that {}",
        all.len(),
        if template {
            "is the template: all or none"
        } else {
            "is no template: a release fills every one"
        }
    );
}

#[test]
fn the_binary_answers_help_and_refuses_bad_input() {
    let out = Command::new(BIN).arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("Usage: kubectl gpujob"), "{help}");
    for sub in ["attempts", "logs", "why", "rerun", "suspend", "resume"] {
        assert!(help.contains(sub), "{sub} missing from {help}");
    }
    // No kubeconfig: an error naming it, not a panic.
    let out = Command::new(BIN)
        .args(["why", "x", "--kubeconfig", "/nonexistent/kubeconfig"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with("error: reading the kubeconfig /nonexistent/kubeconfig"),
        "{err}"
    );
}
