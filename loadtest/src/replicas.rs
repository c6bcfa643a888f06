//! Operator replicas as processes of the real binary, as the operator's service account
//! (deploy/operator/rbac.yaml, least privilege), each with its own metrics port and log file.
//! With `--shards 1` they contend for one Lease; with more, each shard has a Lease of
//! its own (`gpujob-operator-shard-<i>`) and the replicas share them out.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use devcluster::metrics::Metrics;
use devcluster::{ControlPlane, Identity};
use gpujob_operator::hash::fnv1a64;
use gpujob_operator::lease::ShardLeases;
use gpujob_operator::shard::ShardMap;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Client;
use kube::api::{Api, ListParams};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const LEASE_NAMESPACE: &str = "gpujob-system";
const LEASE: &str = "gpujob-operator";
/// The operator's work-queue depth gauge (src/metrics.rs).
const QUEUE_DEPTH: &str = "workqueue_depth";

#[derive(Debug)]
pub struct Replica {
    pub identity: String,
    pub addr: std::net::SocketAddr,
    child: Option<Child>,
    /// Peak and current RSS (KiB) read right before a `kill -9`.
    at_kill: Option<(u64, u64)>,
}

/// Resident memory of one replica, from /proc.
#[derive(Debug, Clone)]
pub struct Memory {
    pub identity: String,
    pub peak_kib: u64,
    pub now_kib: u64,
    /// Read right before the replica was killed (not at the end of the run).
    pub killed: bool,
}

/// The holder of each shard Lease (index = shard; `None`: no Lease yet, or no holder).
pub type Holders = Vec<Option<String>>;

/// What happened to the shards after a `kill -9`, polled from the shard Leases.
#[derive(Debug, Clone)]
pub struct Takeover {
    /// From the kill until every shard was held by a live replica.
    pub unowned: Duration,
    /// For each shard the killed replica held: the first live replica seen holding it,
    /// and when (since the kill).
    pub taken: BTreeMap<u32, (String, Duration)>,
    /// The holders once every shard was owned again.
    pub holders: Holders,
}

/// Ended (SIGKILL) when dropped.
#[derive(Debug)]
pub struct Replicas {
    all: Vec<Replica>,
    /// How they were started, to start one again ([`Replicas::restart`]).
    bin: PathBuf,
    kubeconfig: PathBuf,
    shards: u32,
    /// The map given as `--shard-cuts` ([`shard_map`]'s); `None`: the replicas keep the
    /// map (and may re-cut it).
    map: Option<ShardMap>,
    /// CPU seconds of the replicas killed so far, read right before each kill.
    killed_cpu: f64,
}

/// The shard map the replicas run with: `shards` ranges cut so each holds about as many
/// of `namespaces` (the load's GpuJobs are spread evenly over them). Equal ranges would
/// put `load-0` … `load-9` all in shard 0: names that differ only at the end hash close
/// together (docs/ha-and-sharding.md, "Balancing namespaces").
pub fn shard_map(namespaces: &[String], shards: u32) -> ShardMap {
    ShardMap::balanced(
        namespaces.iter().map(|ns| (fnv1a64(ns.as_bytes()), 1)),
        shards,
    )
}

/// The name of the Lease of `shard` of `shards` (with one shard, the Lease itself).
pub fn shard_lease(shard: u32, shards: u32) -> String {
    shard_names(shards).shard(shard)
}

impl Replicas {
    /// The shard map they were given; `None` when they keep their own.
    pub fn shard_map(&self) -> Option<&ShardMap> {
        self.map.as_ref()
    }

    /// `n` replicas splitting `namespaces` into `shards` ([`shard_map`]; `None`: no
    /// `--shard-cuts`, the replicas keep the map).
    pub fn start(
        cluster: &ControlPlane,
        bin: &Path,
        n: u8,
        shards: u32,
        namespaces: Option<&[String]>,
    ) -> anyhow::Result<Replicas> {
        let logs = log_dir();
        std::fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
        let mut replicas = Replicas {
            all: Vec::new(),
            bin: bin.to_owned(),
            kubeconfig: cluster.kubeconfig(Identity::Operator),
            shards,
            map: namespaces.map(|ns| shard_map(ns, shards)),
            killed_cpu: 0.0,
        };
        for i in 1..=n {
            let replica = replicas.spawn(&format!("load-{i}"))?;
            replicas.all.push(replica);
        }
        eprintln!("replica logs in {}", logs.display());
        Ok(replicas)
    }

    /// Replica `identity`, a new process; its log is appended to.
    fn spawn(&self, identity: &str) -> anyhow::Result<Replica> {
        // A free port now; the replica binds it a moment later.
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], devcluster::ports::free()?));
        let log = log_dir().join(format!("{identity}.log"));
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)?;
        let child = Command::new(&self.bin)
            .args(["run", "--identity", identity])
            .args(["--lease-namespace", LEASE_NAMESPACE])
            .args(["--listen-address", &addr.to_string()])
            .args(["--shards", &self.shards.to_string()])
            .args(match &self.map {
                Some(map) => vec!["--shard-cuts".to_owned(), map.cuts_text()],
                None => vec![],
            })
            .env("KUBECONFIG", &self.kubeconfig)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("starting {}", self.bin.display()))?;
        Ok(Replica {
            identity: identity.to_owned(),
            addr,
            child: Some(child),
            at_kill: None,
        })
    }

    /// Starts the killed replica `identity` again, and waits until it is ready (its
    /// caches loaded). Returns how long that took.
    pub async fn restart(&mut self, identity: &str, deadline: Instant) -> anyhow::Result<Duration> {
        let started = Instant::now();
        let fresh = self.spawn(identity)?;
        let addr = fresh.addr;
        let slot = self
            .all
            .iter_mut()
            .find(|r| r.identity == identity && r.child.is_none())
            .with_context(|| format!("no killed replica {identity} to start again"))?;
        *slot = fresh;
        loop {
            if get(addr, "/readyz").await.is_ok() {
                return Ok(started.elapsed());
            }
            if Instant::now() >= deadline {
                bail!("{identity}, started again, was not ready before the deadline");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The Lease holder once there is one (other than `not`).
    pub async fn wait_leader(
        &self,
        admin: &Client,
        not: Option<&str>,
        deadline: Instant,
    ) -> anyhow::Result<String> {
        let leases: Api<Lease> = Api::namespaced(admin.clone(), LEASE_NAMESPACE);
        loop {
            if let Some(holder) = holder(&leases).await
                && Some(holder.as_str()) != not
            {
                return Ok(holder);
            }
            if Instant::now() >= deadline {
                bail!("no replica took the Lease {LEASE_NAMESPACE}/{LEASE} in time");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `kill -9` of the current leader; returns its identity.
    pub async fn kill_leader(&mut self, admin: &Client) -> anyhow::Result<String> {
        let leases: Api<Lease> = Api::namespaced(admin.clone(), LEASE_NAMESPACE);
        let holder = holder(&leases).await.context("no leader to kill")?;
        let replica = self
            .all
            .iter_mut()
            .find(|r| r.identity == holder)
            .with_context(|| format!("the Lease names {holder}, not one of ours"))?;
        self.killed_cpu += replica.kill()?;
        eprintln!("killed the leader {holder}");
        Ok(holder)
    }

    /// Sharded: waits until every shard Lease names one of our replicas, then (for at
    /// most `settle`) until they are shared out evenly: every replica holds at most
    /// ceil(shards / replicas). Returns the holders.
    pub async fn wait_shards(
        &self,
        admin: &Client,
        shards: u32,
        settle: Duration,
        deadline: Instant,
    ) -> anyhow::Result<Vec<String>> {
        let leases: Api<Lease> = Api::namespaced(admin.clone(), LEASE_NAMESPACE);
        let live = self.live();
        let cap = usize::try_from(shards)?.div_ceil(live.len().max(1));
        let mut all_held_at: Option<Instant> = None;
        loop {
            let holders = shard_holders(&leases, shards).await.unwrap_or_default();
            let held: Option<Vec<String>> = holders
                .iter()
                .map(|h| h.clone().filter(|h| live.contains(h)))
                .collect();
            if let Some(held) = held
                && held.len() == usize::try_from(shards)?
            {
                let first = *all_held_at.get_or_insert_with(Instant::now);
                let balanced = held_by(&held).values().all(|n| n.len() <= cap);
                if balanced || first.elapsed() >= settle || Instant::now() >= deadline {
                    if !balanced {
                        eprintln!(
                            "every shard has a holder, but not evenly (at most {cap} each) after {}s; going on",
                            settle.as_secs()
                        );
                    }
                    return Ok(held);
                }
            }
            if Instant::now() >= deadline {
                bail!(
                    "not every shard Lease {LEASE_NAMESPACE}/{}-shard-<0..{shards}> was taken in time: {holders:?}",
                    LEASE
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Sharded: `kill -9` of the replica holding the most shards (ties: the lowest
    /// identity); returns its identity and the shards it held.
    pub async fn kill_busiest(
        &mut self,
        admin: &Client,
        shards: u32,
    ) -> anyhow::Result<(String, Vec<u32>)> {
        let leases: Api<Lease> = Api::namespaced(admin.clone(), LEASE_NAMESPACE);
        let holders = shard_holders(&leases, shards)
            .await
            .context("listing the shard Leases")?;
        let live = self.live();
        let mut by: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
        for (shard, h) in (0u32..).zip(&holders) {
            if let Some(h) = h.as_deref().filter(|h| live.contains(*h)) {
                by.entry(h).or_default().push(shard);
            }
        }
        // Replicas are numbered load-1, load-2, ... in start order: on equal counts the
        // earlier one (the lowest identity) wins.
        let (_, replica) = self
            .all
            .iter_mut()
            .enumerate()
            .filter(|(_, r)| r.child.is_some())
            .max_by_key(|(i, r)| {
                let held = by.get(r.identity.as_str()).map_or(0, Vec::len);
                (held, std::cmp::Reverse(*i))
            })
            .context("no live replica to kill")?;
        let held = by.remove(replica.identity.as_str()).unwrap_or_default();
        self.killed_cpu += replica.kill()?;
        eprintln!(
            "killed {} (held shards {held:?} of {shards})",
            replica.identity
        );
        Ok((replica.identity.clone(), held))
    }

    /// Identities of the replicas not killed.
    pub fn live(&self) -> BTreeSet<String> {
        self.all
            .iter()
            .filter(|r| r.child.is_some())
            .map(|r| r.identity.clone())
            .collect()
    }

    /// Each live replica's peak resident memory (VmHWM), KiB.
    pub fn peaks(&self) -> BTreeMap<String, u64> {
        self.all
            .iter()
            .filter_map(|r| Some((r.identity.clone(), rss(r.child.as_ref()?.id())?.0)))
            .collect()
    }

    /// Each live replica's `/metrics` text.
    pub async fn scrape(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for r in self.all.iter().filter(|r| r.child.is_some()) {
            match get(r.addr, "/metrics").await {
                Ok(text) => out.push((r.identity.clone(), text)),
                Err(e) => eprintln!("scraping {} at {}: {e:#}", r.identity, r.addr),
            }
        }
        out
    }

    /// Samples every live replica every `every` until [`Sampler::stop`]: its resident
    /// memory (/proc) and its work-queue depth (`/metrics`), timed from `start`.
    pub fn sample(&self, start: Instant, every: Duration) -> Sampler {
        let probes: Vec<(String, u32, std::net::SocketAddr)> = self
            .all
            .iter()
            .filter_map(|r| Some((r.identity.clone(), r.child.as_ref()?.id(), r.addr)))
            .collect();
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let mut traces: Vec<Trace> = probes
                .iter()
                .map(|(identity, pid, _)| Trace {
                    identity: identity.clone(),
                    pid: *pid,
                    rss_kib: Vec::new(),
                    depth: Vec::new(),
                    failed_scrapes: 0,
                    last_error: None,
                })
                .collect();
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let round = async {
                loop {
                    tick.tick().await;
                    for (trace, (_, pid, addr)) in traces.iter_mut().zip(&probes) {
                        let at = start.elapsed().as_secs_f64();
                        if let Some((_, now)) = rss(*pid) {
                            trace.rss_kib.push((at, now));
                        }
                        match get(*addr, "/metrics").await.and_then(|t| queue_depth(&t)) {
                            Ok(depth) => trace.depth.push((at, depth)),
                            Err(e) => {
                                trace.failed_scrapes += 1;
                                trace.last_error = Some(format!("{e:#}"));
                            }
                        }
                    }
                }
            };
            tokio::select! {
                () = round => {}
                _ = &mut stopped => {}
            }
            traces
        });
        Sampler { stop, task }
    }

    /// CPU seconds of every replica process this run started: the running ones so far,
    /// the killed ones up to their kill.
    pub fn cpu_seconds(&self) -> f64 {
        let running: f64 = self.pids().into_iter().filter_map(cpu_seconds).sum();
        running + self.killed_cpu
    }

    /// Process ids of the live replicas.
    pub fn pids(&self) -> Vec<u32> {
        self.all
            .iter()
            .filter_map(|r| r.child.as_ref().map(Child::id))
            .collect()
    }

    /// Peak and current resident memory (KiB) of each replica, from /proc; for a killed
    /// one, as read right before the kill.
    pub fn memory(&self) -> Vec<Memory> {
        self.all
            .iter()
            .filter_map(|r| {
                let (peak_kib, now_kib) = match &r.child {
                    Some(child) => rss(child.id())?,
                    None => r.at_kill?,
                };
                Some(Memory {
                    identity: r.identity.clone(),
                    peak_kib,
                    now_kib,
                    killed: r.child.is_none(),
                })
            })
            .collect()
    }
}

impl Replica {
    /// `kill -9`, keeping its memory figures; returns its CPU seconds, read right before.
    fn kill(&mut self) -> anyhow::Result<f64> {
        let mut cpu = 0.0;
        if let Some(child) = self.child.as_mut() {
            self.at_kill = rss(child.id());
            cpu = cpu_seconds(child.id()).unwrap_or(0.0);
            child.kill()?;
            child.wait()?;
        }
        self.child = None;
        Ok(cpu)
    }
}

/// What the replicas' logs say of the kept map's re-cuts.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Recuts {
    /// Re-cuts written (by any keeper).
    pub written: usize,
    /// Each finished re-cut: seconds from its write to every shard held under it.
    pub done: Vec<f64>,
}

/// Reads [`Recuts`] from every replica log of this run.
pub fn recuts() -> anyhow::Result<Recuts> {
    let mut r = Recuts::default();
    for entry in std::fs::read_dir(log_dir())? {
        let path = entry?.path();
        if path.extension().and_then(|e| e.to_str()) != Some("log") {
            continue;
        }
        let text = std::fs::read_to_string(&path)?;
        let (written, done) = recuts_in(&text);
        r.written += written;
        r.done.extend(done);
    }
    Ok(r)
}

/// Re-cuts written and finished (their seconds) in one replica's log.
fn recuts_in(log: &str) -> (usize, Vec<f64>) {
    let written = log
        .lines()
        .filter(|l| l.contains("shard map re-cut:"))
        .count();
    let done = log
        .lines()
        .filter(|l| l.contains("re-cut done"))
        .filter_map(|l| {
            let at = l.find("seconds=")? + "seconds=".len();
            l[at..].split_whitespace().next()?.parse().ok()
        })
        .collect();
    (written, done)
}

/// Where the replicas' logs go (and, without `--report`, the `--compare` plots).
pub fn log_dir() -> std::path::PathBuf {
    std::env::temp_dir().join(format!("gpujob-loadtest-{}", std::process::id()))
}

/// One replica's samples, seconds since the start given to [`Replicas::sample`].
#[derive(Debug, Clone)]
pub struct Trace {
    pub identity: String,
    pub pid: u32,
    /// Resident memory (VmRSS), KiB.
    pub rss_kib: Vec<(f64, u64)>,
    /// `workqueue_depth`, summed over the replica's queues.
    pub depth: Vec<(f64, f64)>,
    /// Scrapes of `/metrics` that failed, and the last error.
    pub failed_scrapes: usize,
    pub last_error: Option<String>,
}

/// The sampling started by [`Replicas::sample`].
#[derive(Debug)]
pub struct Sampler {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Vec<Trace>>,
}

impl Sampler {
    /// Stops sampling (a round under way is cut short) and returns what was sampled.
    pub async fn stop(self) -> anyhow::Result<Vec<Trace>> {
        // Err: the task is over already (it only ends when told to); its result says why.
        let _ = self.stop.send(());
        self.task.await.context("the replica sampler")
    }
}

/// The work-queue depth (`workqueue_depth`, summed over its `name`s) in a `/metrics` text;
/// an error if there is no such metric, rather than a silent 0.
pub fn queue_depth(text: &str) -> anyhow::Result<f64> {
    let metrics = Metrics::parse(text).context("parsing /metrics")?;
    if !metrics.samples.iter().any(|s| s.name == QUEUE_DEPTH) {
        bail!("no {QUEUE_DEPTH} in /metrics");
    }
    Ok(metrics.sum(QUEUE_DEPTH, &[]))
}

/// CPU seconds (user and system) of process `pid` so far, from /proc.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces): utime and stime are the
    // 14th and 15th of the whole line, in clock ticks (100 per second on Linux).
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / 100.0)
}

/// Peak (VmHWM) and current (VmRSS) resident memory of a process, KiB.
fn rss(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
    };
    Some((kib("VmHWM:")?, kib("VmRSS:")?))
}

fn shard_names(shards: u32) -> ShardLeases {
    ShardLeases {
        lease_name: LEASE.to_owned(),
        namespace: LEASE_NAMESPACE.to_owned(),
        map: std::sync::Arc::new(gpujob_operator::shard::ShardMap::even(shards)),
        settings: Vec::new(),
        kept: false,
    }
}

/// The holder named by each shard Lease (one list call).
pub async fn shard_holders(leases: &Api<Lease>, shards: u32) -> kube::Result<Holders> {
    let names = shard_names(shards);
    let mut by_name: BTreeMap<String, Option<String>> = leases
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|l| {
            let holder = l
                .spec
                .and_then(|s| s.holder_identity)
                .filter(|h| !h.is_empty());
            Some((l.metadata.name?, holder))
        })
        .collect();
    Ok((0..shards)
        .map(|i| by_name.remove(&names.shard(i)).flatten())
        .collect())
}

/// The shard Leases, for callers that poll them.
pub fn lease_api(admin: &Client) -> Api<Lease> {
    Api::namespaced(admin.clone(), LEASE_NAMESPACE)
}

/// Shards by holder.
pub fn held_by<S: AsRef<str>>(holders: &[S]) -> BTreeMap<String, Vec<u32>> {
    let mut out: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for (shard, h) in (0u32..).zip(holders) {
        out.entry(h.as_ref().to_owned()).or_default().push(shard);
    }
    out
}

/// Polls the shard Leases every ~100 ms from `killed_at` until every shard is held by
/// one of `live` (a Lease of a dead holder still names it until it expires and another
/// replica takes it). `lost`: the shards the killed replica held.
pub async fn watch_takeover(
    leases: Api<Lease>,
    shards: u32,
    live: BTreeSet<String>,
    lost: Vec<u32>,
    killed_at: Instant,
    deadline: Instant,
) -> anyhow::Result<Takeover> {
    let mut taken: BTreeMap<u32, (String, Duration)> = BTreeMap::new();
    loop {
        match shard_holders(&leases, shards).await {
            Ok(holders) => {
                let at = killed_at.elapsed();
                for (shard, h) in (0u32..).zip(&holders) {
                    if let Some(h) = h.as_ref().filter(|h| live.contains(*h))
                        && lost.contains(&shard)
                        && !taken.contains_key(&shard)
                    {
                        taken.insert(shard, (h.clone(), at));
                    }
                }
                if holders
                    .iter()
                    .all(|h| h.as_ref().is_some_and(|h| live.contains(h)))
                {
                    return Ok(Takeover {
                        unowned: at,
                        taken,
                        holders,
                    });
                }
            }
            Err(e) => eprintln!("listing the shard Leases: {e}"),
        }
        if Instant::now() >= deadline {
            bail!("the shards of the killed replica were not all taken over in time");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

impl Drop for Replicas {
    fn drop(&mut self) {
        for r in &mut self.all {
            if let Some(mut child) = r.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

async fn holder(leases: &Api<Lease>) -> Option<String> {
    leases
        .get_opt(LEASE)
        .await
        .ok()
        .flatten()?
        .spec?
        .holder_identity
        .filter(|h| !h.is_empty())
}

/// The body of `GET path` from a replica's HTTP server (plain HTTP/1.0); an error
/// unless 200.
async fn get(addr: std::net::SocketAddr, path: &str) -> anyhow::Result<String> {
    let exchange = async {
        let mut tcp = tokio::net::TcpStream::connect(addr).await?;
        tcp.write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes())
            .await?;
        let mut text = String::new();
        tcp.read_to_string(&mut text).await?;
        anyhow::Ok(text)
    };
    let text = tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .context("timed out")??;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .context("no end of the response head")?;
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        bail!("answered {}", head.lines().next().unwrap_or_default());
    }
    Ok(body.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn re_cuts_are_read_from_the_keepers_log_lines() {
        let log = "2026 INFO shard map re-cut: the busiest shard held too many GpuJobs version=1\n\
                   2026 INFO re-cut done: every shard held under the new map version=1 seconds=3.25\n\
                   2026 INFO shard gained\n";
        assert_eq!(recuts_in(log), (1, vec![3.25]));
        assert_eq!(recuts_in(""), (0, vec![]));
    }

    #[test]
    fn queue_depth_sums_the_gauge_and_refuses_a_missing_one() {
        let text = "# TYPE workqueue_depth gauge\n\
                    workqueue_depth{name=\"gpujob\"} 7\n\
                    workqueue_depth{name=\"other\"} 2\n\
                    workqueue_adds_total{name=\"gpujob\"} 40\n";
        assert_eq!(queue_depth(text).unwrap(), 9.0);
        let err = queue_depth("workqueue_adds_total{name=\"gpujob\"} 40\n").unwrap_err();
        assert!(err.to_string().contains("no workqueue_depth"), "{err:#}");
    }
}
