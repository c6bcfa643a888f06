//! The binary's command line, as a user meets it.

use std::process::Command;

#[test]
fn version_and_help_answer() {
    let bin = env!("CARGO_BIN_EXE_gpujob-operator");
    let out = Command::new(bin)
        .arg("--version")
        .output()
        .expect("run --version");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        text.trim(),
        format!("gpujob-operator {}", env!("CARGO_PKG_VERSION"))
    );

    let out = Command::new(bin)
        .arg("--help")
        .output()
        .expect("run --help");
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("Usage: gpujob-operator"));

    let out = Command::new(bin).output().expect("run without arguments");
    assert!(
        !out.status.success(),
        "no command is an error, not a silent success"
    );
}

#[test]
fn a_quota_token_over_plain_http_is_refused_at_start() {
    let token = std::env::temp_dir().join(format!("gpujob-cli-token-{}", std::process::id()));
    std::fs::write(&token, "secret").expect("write token");
    let out = Command::new(env!("CARGO_BIN_EXE_gpujob-operator"))
        .args(["run", "--quota-provider", "http", "--quota-url"])
        .arg("http://quota.example.com:8080")
        .arg("--quota-token-file")
        .arg(&token)
        // Nothing to connect to: the refusal must come before any API call.
        .env("KUBECONFIG", "/nonexistent")
        .output()
        .expect("run gpujob-operator");
    let _ = std::fs::remove_file(&token);
    assert!(!out.status.success(), "refused, not started");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--quota-token-file") && err.contains("use an https:// URL"),
        "a clear error: {err}"
    );
}

#[test]
fn secure_metrics_without_a_probe_address_are_refused_at_start() {
    let out = Command::new(env!("CARGO_BIN_EXE_gpujob-operator"))
        .arg("run")
        .env("GPUJOB_METRICS_SECURE", "true")
        // Nothing to connect to: the refusal must come before any API call.
        .env("KUBECONFIG", "/nonexistent")
        .output()
        .expect("run gpujob-operator");
    assert!(!out.status.success(), "refused, not started");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--metrics-secure needs --probe-address"),
        "a clear error: {err}"
    );
}

#[test]
fn shard_cuts_that_do_not_fit_the_shard_count_are_refused_at_start() {
    let out = Command::new(env!("CARGO_BIN_EXE_gpujob-operator"))
        .args(["run", "--shards", "3", "--shard-cuts", "0x8000000000000000"])
        // Nothing to connect to: the refusal must come before any API call.
        .env("KUBECONFIG", "/nonexistent")
        .output()
        .expect("run gpujob-operator");
    assert!(!out.status.success(), "refused, not started");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--shard-cuts") && err.contains("1 cuts make 2 shards, not 3"),
        "a clear error: {err}"
    );
}
