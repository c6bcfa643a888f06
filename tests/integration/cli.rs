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

/// Runs `gpujob-operator run` with `args` and `env` where there is nothing to connect
/// to, so a refusal must come before any API call; asserts it was refused and returns
/// what it said.
fn refused_at_start(args: &[&std::ffi::OsStr], env: &[(&str, &str)]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_gpujob-operator"))
        .arg("run")
        .args(args)
        .envs(env.iter().copied())
        .env("KUBECONFIG", "/nonexistent")
        .output()
        .expect("run gpujob-operator");
    assert!(!out.status.success(), "refused, not started");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_quota_token_over_plain_http_is_refused_at_start() {
    let token = std::env::temp_dir().join(format!("gpujob-cli-token-{}", std::process::id()));
    std::fs::write(&token, "secret").expect("write token");
    let args = [
        "--quota-provider",
        "http",
        "--quota-url",
        "http://quota.example.com:8080",
        "--quota-token-file",
    ]
    .map(std::ffi::OsStr::new);
    let mut args = args.to_vec();
    args.push(token.as_os_str());
    let err = refused_at_start(&args, &[]);
    let _ = std::fs::remove_file(&token);
    assert!(
        err.contains("--quota-token-file") && err.contains("use an https:// URL"),
        "a clear error: {err}"
    );
}

#[test]
fn secure_metrics_without_a_probe_address_are_refused_at_start() {
    let err = refused_at_start(&[], &[("GPUJOB_METRICS_SECURE", "true")]);
    assert!(
        err.contains("--metrics-secure needs --probe-address"),
        "a clear error: {err}"
    );
}

#[test]
fn shard_cuts_that_do_not_fit_the_shard_count_are_refused_at_start() {
    let args = ["--shards", "3", "--shard-cuts", "0x8000000000000000"].map(std::ffi::OsStr::new);
    let err = refused_at_start(&args, &[]);
    assert!(
        err.contains("--shard-cuts") && err.contains("1 cuts make 2 shards, not 3"),
        "a clear error: {err}"
    );
}

/// A listen address another process holds stops the replica at start, naming it: a
/// replica without its metrics, probes or webhook must not go on working unseen (a
/// Service would send it conversions it cannot answer).
#[test]
fn an_address_in_use_stops_the_replica_at_start() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a port");
    let address = taken.local_addr().expect("its address").to_string();
    // A kubeconfig that loads; its server is never reached before the bind.
    let kubeconfig =
        std::env::temp_dir().join(format!("gpujob-cli-kubeconfig-{}", std::process::id()));
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:9'}}]\n\
         users: [{name: u, user: {token: t}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\n\
         current-context: x\n",
    )
    .expect("write kubeconfig");
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpujob-operator"))
        .args(["run", "--listen-address", &address])
        .env("KUBECONFIG", &kubeconfig)
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("run gpujob-operator");
    // Not a speed bound: a replica that ignores the failed bind runs until killed.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break Some(status);
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let _ = std::fs::remove_file(&kubeconfig);
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut err)
        .expect("read stderr");
    let status = status.unwrap_or_else(|| panic!("still running a minute later:\n{err}"));
    assert!(!status.success(), "refused, not started");
    assert!(
        err.contains(&format!("binding the server of /metrics to {address}")),
        "a clear error: {err}"
    );
    drop(taken);
}
