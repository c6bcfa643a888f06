//! Operator replicas as separate processes of the real binary, each under its own API
//! user (`replica-N`), so the audit log attributes every write.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use devcluster::audit::{AuditEvent, AuditLog, Cursor};
use devcluster::{ControlPlane, Identity, wait};
use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Client;
use kube::api::Api;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

pub const LEASE: &str = "gpujob-operator";

/// The replicas' `--workers` (fixed: by default the number follows the API server's
/// answer time): at most this many requests in flight at once, per replica.
pub const WORKERS: usize = 4;

/// Short timings for tests: lease 3 s, renew deadline 2 s, retry period 0.5 s.
pub const LEASE_DURATION: Duration = Duration::from_secs(3);

pub struct Replica {
    pub n: u8,
    child: Option<Child>,
    pub log: PathBuf,
}

impl Replica {
    pub fn identity(&self) -> String {
        format!("replica-{}", self.n)
    }

    pub fn pid(&self) -> Pid {
        Pid::from_raw(i32::try_from(self.child.as_ref().unwrap().id()).unwrap())
    }

    pub fn signal(&self, signal: Signal) {
        kill(self.pid(), signal).unwrap();
    }

    /// Waits for the process to exit; returns its exit status.
    pub async fn wait_exit(&mut self, within: Duration) -> std::process::ExitStatus {
        let child = self.child.as_mut().unwrap();
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "replica-{} did not exit",
                self.n
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGCONT);
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            eprintln!(
                "--- replica-{} log ({}) ---\n{}",
                self.n,
                self.log.display(),
                self.log_text()
            );
        }
    }
}

/// Short lease timings for tests.
pub const SHORT: [&str; 3] = ["3s", "2s", "500ms"];
/// client-go's (and the operator's) defaults.
pub const DEFAULT: [&str; 3] = ["15s", "10s", "2s"];

/// Starts replica `n` of the operator for namespace `ns` (its Lease lives there too),
/// with short lease timings.
pub fn start(cluster: &ControlPlane, ns: &str, n: u8, extra: &[&str]) -> Replica {
    start_with(cluster, ns, n, SHORT, extra)
}

/// Starts replica `n` with lease duration, renew deadline and retry period `timing`.
pub fn start_with(
    cluster: &ControlPlane,
    ns: &str,
    n: u8,
    timing: [&str; 3],
    extra: &[&str],
) -> Replica {
    start_full(cluster, ns, n, timing, extra, &[])
}

/// Like [`start_with`], with extra environment variables (e.g. `GPUJOB_FAILPOINT`).
pub fn start_full(
    cluster: &ControlPlane,
    ns: &str,
    n: u8,
    timing: [&str; 3],
    extra: &[&str],
    envs: &[(&str, &str)],
) -> Replica {
    spawn(cluster, ns, Some(ns), n, timing, extra, envs, None, false)
}

/// Replica `n` for namespace `ns` (its Lease there too), short timings, with `extra`
/// flags, talking to the API server through `kubeconfig` (a fault proxy's).
pub fn start_in_with_kubeconfig(
    cluster: &ControlPlane,
    ns: &str,
    n: u8,
    extra: &[&str],
    kubeconfig: PathBuf,
) -> Replica {
    spawn(
        cluster,
        ns,
        Some(ns),
        n,
        SHORT,
        extra,
        &[],
        Some(kubeconfig),
        false,
    )
}

/// Replica `n` with the flags `args` after `run` (a rendered Deployment's: they say
/// which namespace it watches, if any), its Lease in `lease_ns`, short timings, as the
/// user of `kubeconfig`.
pub fn start_as(
    cluster: &ControlPlane,
    lease_ns: &str,
    n: u8,
    args: &[&str],
    kubeconfig: PathBuf,
) -> Replica {
    spawn(
        cluster,
        lease_ns,
        None,
        n,
        SHORT,
        args,
        &[],
        Some(kubeconfig),
        false,
    )
}

/// Replica `n` working on every namespace (a private control plane), its Leases in
/// `lease_ns`, short timings, talking to the API server through `kubeconfig` (a fault
/// proxy's) when given.
pub fn start_everywhere(
    cluster: &ControlPlane,
    lease_ns: &str,
    n: u8,
    extra: &[&str],
    kubeconfig: Option<PathBuf>,
) -> Replica {
    start_everywhere_timed(cluster, lease_ns, n, SHORT, extra, kubeconfig)
}

/// As [`start_everywhere`], with `timing` (lease duration, renew deadline, retry period)
/// in place of the short timings.
pub fn start_everywhere_timed(
    cluster: &ControlPlane,
    lease_ns: &str,
    n: u8,
    timing: [&str; 3],
    extra: &[&str],
    kubeconfig: Option<PathBuf>,
) -> Replica {
    spawn(
        cluster,
        lease_ns,
        None,
        n,
        timing,
        extra,
        &[],
        kubeconfig,
        false,
    )
}

/// Replica `n` working on every namespace (a private control plane), its Leases in
/// `lease_ns`, short timings, with `extra` flags and the operator's own default for
/// re-cutting the kept shard map (every other start here stops it: `spawn`).
pub fn start_everywhere_recutting(
    cluster: &ControlPlane,
    lease_ns: &str,
    n: u8,
    extra: &[&str],
) -> Replica {
    spawn(cluster, lease_ns, None, n, SHORT, extra, &[], None, true)
}

/// Replica `n` with `--shards shards`, working on every namespace (a private control
/// plane), its Leases in `lease_ns`; short timings.
pub fn start_sharded(cluster: &ControlPlane, lease_ns: &str, n: u8, shards: u32) -> Replica {
    let shards = shards.to_string();
    spawn(
        cluster,
        lease_ns,
        None,
        n,
        SHORT,
        &["--shards", &shards],
        &[],
        None,
        false,
    )
}

/// The one place that knows every flag a test replica gets; `recut`: leave re-cutting
/// of the kept map at the operator's default (every other start stops it).
#[allow(clippy::too_many_arguments)]
fn spawn(
    cluster: &ControlPlane,
    lease_ns: &str,
    watch_ns: Option<&str>,
    n: u8,
    timing: [&str; 3],
    extra: &[&str],
    envs: &[(&str, &str)],
    kubeconfig: Option<PathBuf>,
    recut: bool,
) -> Replica {
    let ns = lease_ns;
    let dir = super::namespace_temp(super::REPLICA_LOGS, ns);
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join(format!("replica-{n}.log"));
    // A restarted replica appends: its earlier life's log stays readable.
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .unwrap();
    let err = out.try_clone().unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_gpujob-operator"))
        .args(match watch_ns {
            Some(watch) => vec!["run", "--namespace", watch],
            None => vec!["run"],
        })
        .args([
            "--lease-namespace",
            ns,
            "--identity",
            &format!("replica-{n}"),
            "--lease-duration",
            timing[0],
            "--renew-deadline",
            timing[1],
            "--retry-period",
            timing[2],
            "--retry-backoff-base",
            "1s",
            "--retry-backoff-max",
            "4s",
        ])
        .args(extra)
        .args(if extra.contains(&"--workers") {
            Vec::new()
        } else {
            vec!["--workers".to_owned(), WORKERS.to_string()]
        })
        // Tests that find a namespace's shard by equal ranges must not see the kept map
        // re-cut under them: only `recut.rs` runs the default.
        .args(if recut {
            &[][..]
        } else {
            &["--recut-interval", "0"][..]
        })
        // Three replicas on one machine: each its own port (unless the test chose one).
        .args(if extra.contains(&"--listen-address") {
            &[][..]
        } else {
            &["--listen-address", "127.0.0.1:0"][..]
        })
        .env(
            "KUBECONFIG",
            kubeconfig.unwrap_or_else(|| cluster.kubeconfig(Identity::Replica(n))),
        )
        // GPUJOB_REPLICA_LOG: the replicas' RUST_LOG, to debug a test (default info).
        .env(
            "RUST_LOG",
            std::env::var("GPUJOB_REPLICA_LOG").unwrap_or_else(|_| "info".to_owned()),
        )
        .envs(envs.iter().copied())
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .unwrap();
    Replica {
        n,
        child: Some(child),
        log,
    }
}

pub async fn lease(admin: &Client, ns: &str) -> Option<Lease> {
    Api::<Lease>::namespaced(admin.clone(), ns)
        .get_opt(LEASE)
        .await
        .ok()
        .flatten()
}

pub fn holder(lease: &Lease) -> Option<String> {
    lease
        .spec
        .as_ref()?
        .holder_identity
        .clone()
        .filter(|h| !h.is_empty())
}

pub fn times(lease: &Lease) -> (Timestamp, Timestamp) {
    let spec = lease.spec.as_ref().unwrap();
    (
        spec.acquire_time.as_ref().unwrap().0,
        spec.renew_time.as_ref().unwrap().0,
    )
}

/// Waits until the replica serving `/metrics` at `address` has counted at least `n`
/// reconciles whose labels include `labels` (`what` names the wait in a failure).
pub async fn wait_reconciles(what: &str, address: &str, labels: &[(&str, &str)], n: f64) {
    let url = format!("http://{address}/metrics");
    wait::until(
        what,
        Duration::from_secs(30),
        Duration::from_millis(50),
        || {
            let url = url.clone();
            async move {
                let text = super::prometheus::get_text(&url).await.ok()?;
                let m = devcluster::metrics::Metrics::parse(&text).ok()?;
                (m.sum("controller_runtime_reconcile_total", labels) >= n).then_some(())
            }
        },
    )
    .await
    .unwrap();
}

/// Waits until the Lease is held by someone for whom `pred` holds; returns the holder.
pub async fn wait_holder(
    admin: &Client,
    ns: &str,
    within: Duration,
    pred: impl Fn(&str) -> bool,
) -> (String, Lease) {
    let pred = &pred;
    wait::until(
        "a Lease holder",
        within,
        Duration::from_millis(50),
        || async move {
            let l = lease(admin, ns).await?;
            let h = holder(&l)?;
            pred(&h).then_some((h, l))
        },
    )
    .await
    .unwrap()
}

/// The successful writes to namespace `ns` since `start` (other tests' replicas use the
/// same user names: this namespace only).
pub fn writes_in(audit: &AuditLog, start: Cursor, ns: &str) -> Vec<AuditEvent> {
    audit
        .since(start)
        .unwrap()
        .into_iter()
        .filter(|e| e.namespace == ns && e.succeeded() && e.is_write())
        .collect()
}

/// What is guaranteed of a leader cut off past its lease (frozen, partitioned) and back
/// (docs/ha-and-sharding.md, "What is guaranteed"): a write that passed its fence just
/// before may still arrive after its successor's first write, at most one per worker
/// (each worker has one request in flight; every later write is fenced); and none of
/// those lands on an object its successor had written, because each carries the
/// resourceVersion or uid it was computed from, or a stable name. Of two successful
/// writes to one object, the one received first committed first. Events are not
/// fenced (a replica writes those of the changes it recorded also after its term ended:
/// new objects, or series of its own) and are left out. `events`: the successful writes
/// to look at. Returns how many of the leader's writes came late.
pub fn assert_late_writes_are_safe(
    events: &[AuditEvent],
    leader: &str,
    successor: &str,
    workers: usize,
) -> usize {
    let at = |e: &AuditEvent| e.received.parse::<Timestamp>().unwrap();
    let first_by_successor = events
        .iter()
        .filter(|e| e.user == successor)
        .map(at)
        .min()
        .expect("the successor wrote");
    let late: Vec<&AuditEvent> = events
        .iter()
        .filter(|e| {
            e.user == leader
                && !matches!(e.resource.as_str(), "leases" | "events")
                && at(e) > first_by_successor
        })
        .collect();
    assert!(
        late.len() <= workers,
        "the deposed leader kept writing after it came back: {late:#?}"
    );
    for w in &late {
        let overwritten = events.iter().find(|s| {
            s.user == successor && s.resource == w.resource && s.name == w.name && at(s) < at(w)
        });
        assert!(
            overwritten.is_none(),
            "a late write landed on an object its successor had written: {w:#?} after {overwritten:#?}"
        );
    }
    late.len()
}
