//! `--compare`: the same N GpuJobs, one phase after the other, each controller alone on a
//! fresh control plane of its own (or, `--same-control-plane`, all on one):
//!   (a) the floor: no controller; this process does the minimal writes (the first
//!       attempt's Job, created running, and one status patch per GpuJob) at the same
//!       concurrency, once every GpuJob is created. The operator does one more: it
//!       creates the Job suspended and starts it (docs/ha-and-sharding.md, High availability);
//!   (b) the reference controller: a careful kube-runtime controller that reads its
//!       caches before it writes (`gpujob-reference-controller`);
//!   (c) the operator, `--replicas` of it.
//! Converged: `status.observedGeneration` is the GpuJob's generation and an attempt has
//! started (all three create the Job before they write that status). On one control
//! plane, everything is deleted between phases and the API server is let go quiet. During the operator's phase its
//! replicas are sampled every second (RSS, work-queue depth) for the plots (`plots.rs`).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use devcluster::identity::OPERATOR_USER;
use devcluster::metrics::Metrics;
use devcluster::{ControlPlane, Identity};
use futures::StreamExt;
use gpujob_operator::api::GpuJob;
use gpujob_operator::controller::job::{desired_job, job_name};
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::cluster::{self, Kcm};
use crate::plots::{self, Line};
use crate::replicas::{Replicas, Trace};
use crate::running::Budget;
use crate::takeover::{self, Takeover};
use crate::trickle::quantile;

/// How often the operator's replicas are sampled (RSS, work-queue depth) for the plot.
const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// What to run.
#[derive(Debug)]
pub struct Plan<'a> {
    pub gpujobs: usize,
    pub concurrency: usize,
    pub namespaces: &'a [String],
    pub spec: serde_json::Value,
    pub operator_bin: &'a Path,
    pub reference_bin: PathBuf,
    pub replicas: u8,
    pub shards: u32,
    /// The replicas keep the shard map (no `--shard-cuts`).
    pub kept: bool,
    /// How the namespaces are named (`--namespace-names`), for the report.
    pub namespace_names: &'a str,
    /// Does kube-apiserver select objects by shard (`--sharded-watch`)?
    pub sharded_watch: bool,
    pub deadline: Instant,
    /// The phases to run, in this order.
    pub phases: Vec<Contender>,
    /// After the operator's phase: kill its working replica and measure the takeover.
    pub takeover: bool,
    /// With `takeover`: kill once this many GpuJobs have converged (under load), not
    /// after all of them.
    pub takeover_at: Option<usize>,
    /// Run every phase on the first control plane (cleaning up and letting it go quiet
    /// in between) rather than each on a fresh one. A control plane that has just
    /// deleted N GpuJobs, Jobs and pods is slower for whoever comes next (the stock
    /// controller took twice as long run second as run first: loadtest/REPORT.md).
    pub same_control_plane: bool,
    /// The repository's `deploy/` folder, to set up fresh control planes.
    pub deploy: &'a Path,
    /// kube-controller-manager's client budget for every phase (`--kcm-api-budget`;
    /// `None`: devcluster's).
    pub kcm_budget: Option<Budget>,
}

/// `floor`, `reference`, `operator` as phases.
pub fn contenders(names: &[String]) -> anyhow::Result<Vec<Contender>> {
    names
        .iter()
        .map(|n| match n.as_str() {
            "floor" => Ok(Contender::Floor),
            "reference" => Ok(Contender::Reference),
            "operator" => Ok(Contender::Operator),
            other => bail!("--phases: unknown phase {other:?} (floor, reference, operator)"),
        })
        .collect()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Contender {
    Floor,
    Reference,
    Operator,
}

impl Contender {
    fn name(self) -> &'static str {
        match self {
            Contender::Floor => {
                "floor: a bare client doing the minimal two writes (a running Job, a status patch), no controller"
            }
            Contender::Reference => {
                "a kube-runtime `Controller` written with care (`Controller::new(..).owns_stream(..)` of a Job reflector, default config; creates a Job only when its cache and the status do not show it, patches the status only when it differs)"
            }
            Contender::Operator => "gpujob-operator",
        }
    }

    /// For a legend.
    fn short(self) -> &'static str {
        match self {
            Contender::Floor => "floor (bare client)",
            Contender::Reference => "kube-runtime reference controller",
            Contender::Operator => "gpujob-operator",
        }
    }
}

/// One phase's figures.
#[derive(Debug)]
pub struct Figures {
    pub who: Contender,
    /// First create → every GpuJob created.
    pub created: Duration,
    /// First create → every GpuJob converged.
    pub converged: Duration,
    /// Create answered → converged, sorted.
    pub latencies: Vec<Duration>,
    /// The operator: first create → every GpuJob's first pod let go at its gate, and
    /// create answered → that, sorted ([`started`]).
    pub started: Option<(Duration, Vec<Duration>)>,
    /// Writes to GpuJobs and Jobs by the operator's service account (all three use it).
    pub writes: usize,
    pub conflicts: usize,
    pub events: usize,
    /// How often the load generator's own watch of GpuJobs failed before every one was
    /// seen converged: each failure is retried after kube's backoff (up to 30 s), and
    /// the GpuJobs that converged meanwhile are seen, and counted converged, late.
    pub watch_failures: usize,
    /// The process doing the work (none for the floor): peak RSS (KiB), CPU seconds.
    pub worker: Option<(u64, f64)>,
    /// Standby replicas' peak RSS (KiB).
    pub standbys: Vec<u64>,
    /// GpuJobs converged against seconds since the first create (a step line).
    pub converged_over_time: Vec<(f64, f64)>,
    /// The operator: each replica's samples, with its CPU seconds at the end.
    pub traces: Vec<(Trace, Option<f64>)>,
    /// The operator with `--takeover`.
    pub takeover: Option<Takeover>,
    /// Where the machine's CPU went from the first create over `cpu_span`: seconds per
    /// process (the control plane's components, this load generator, the contender's).
    pub machine_cpu: Vec<(&'static str, f64)>,
    /// First create → the CPU read: all converged, or with a takeover measured past
    /// that, its end.
    pub cpu_span: Duration,
    /// The API server's requests over the same span (`apiserver_request_total`), by verb.
    pub requests: BTreeMap<String, f64>,
    /// The operator: its replicas' requests from the first create to all started.
    pub to_started: Option<OperatorRequests>,
    /// One replica holding every GpuJob: its RSS against the GpuJobs created so far.
    pub memory: Option<Slope>,
    /// The operator with a kept shard map: what its replicas' logs say of re-cuts.
    pub recuts: Option<crate::replicas::Recuts>,
}

/// Resident memory against GpuJobs held, by least squares over the samples.
#[derive(Debug, Clone, PartialEq)]
pub struct Slope {
    pub bytes_per_gpujob: f64,
    pub samples: usize,
    /// RSS (KiB) at the first and the last sample.
    pub first_kib: u64,
    pub last_kib: u64,
}

/// The least-squares slope of `rss` (seconds since the start, KiB) against the GpuJobs
/// created by each sample's time (`created`: seconds since the start, in any order).
/// `None` with fewer than two samples or no spread in the count.
pub fn memory_slope(rss: &[(f64, u64)], created: &[f64]) -> Option<Slope> {
    let mut created = created.to_vec();
    created.sort_by(f64::total_cmp);
    let points: Vec<(f64, f64)> = rss
        .iter()
        .map(|(t, kib)| {
            let held = created.partition_point(|c| c <= t) as f64;
            (held, *kib as f64 * 1024.0)
        })
        .collect();
    let n = points.len() as f64;
    let mean_x = points.iter().map(|p| p.0).sum::<f64>() / n;
    let mean_y = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mean_x).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mean_x) * (p.1 - mean_y)).sum();
    if points.len() < 2 || sxx <= 0.0 {
        return None;
    }
    Some(Slope {
        bytes_per_gpujob: sxy / sxx,
        samples: points.len(),
        first_kib: rss.first()?.1,
        last_kib: rss.last()?.1,
    })
}

/// A plot written for the report: what it shows, the link to it, and how to read it.
#[derive(Debug)]
pub struct Plot {
    pub alt: String,
    pub link: String,
    pub note: String,
}

/// Runs the phases and returns their figures; `first` is the control plane the first
/// phase runs on, set up by [`cluster::start`] (as are the fresh ones), and shut down here.
pub async fn run(first: (ControlPlane, Client), plan: &Plan<'_>) -> anyhow::Result<Vec<Figures>> {
    let (mut cluster, mut admin) = first;
    let mut out = Vec::new();
    for &who in &plan.phases {
        if !out.is_empty() {
            if plan.same_control_plane {
                clean_up(&admin, plan).await?;
                quiesce(&admin, plan.deadline).await?;
            } else {
                cluster.shutdown();
                (cluster, admin) = cluster::start(
                    plan.deploy,
                    plan.namespaces,
                    plan.gpujobs,
                    plan.sharded_watch,
                )
                .await?;
            }
        }
        eprintln!("phase: {}", who.name());
        // Before the contender and the first GpuJob, on every control plane; ended
        // with the phase.
        let kcm = match &plan.kcm_budget {
            Some(budget) => Some(cluster::restart_kcm(&cluster, budget.clone())?),
            None => None,
        };
        let figures = phase(&cluster, &admin, plan, who, kcm.as_ref().map(Kcm::pid)).await?;
        drop(kcm);
        eprintln!(
            "  converged {} GpuJobs in {:.1}s; {:.2} writes per GpuJob",
            plan.gpujobs,
            figures.converged.as_secs_f64(),
            figures.writes as f64 / plan.gpujobs as f64
        );
        out.push(figures);
    }
    cluster.shutdown();
    Ok(out)
}

enum Running {
    None,
    Reference(Child),
    Operator(Replicas),
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Running::Reference(child) = self {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The reference controller's stderr: `reference.stderr` in the replicas' log folder
/// (not `.log`: the replicas' logs are read for re-cuts), appended to. It holds what the
/// reference logs at warn and above (failed reconciles, broken watches) and any panic.
fn reference_log() -> anyhow::Result<std::fs::File> {
    let dir = crate::replicas::log_dir();
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join("reference.stderr");
    eprintln!("reference controller's log: {}", path.display());
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))
}

/// `kcm`: the kube-controller-manager the load test started in place of devcluster's.
async fn phase(
    cluster: &ControlPlane,
    admin: &Client,
    plan: &Plan<'_>,
    who: Contender,
    kcm: Option<u32>,
) -> anyhow::Result<Figures> {
    let mut running = match who {
        Contender::Floor => Running::None,
        Contender::Reference => {
            let child = Command::new(&plan.reference_bin)
                .env("KUBECONFIG", cluster.kubeconfig(Identity::Operator))
                .env("RUST_LOG", "warn")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(reference_log()?)
                .spawn()
                .with_context(|| format!("starting {}", plan.reference_bin.display()))?;
            Running::Reference(child)
        }
        Contender::Operator => {
            let replicas = Replicas::start(
                cluster,
                plan.operator_bin,
                plan.replicas,
                plan.shards,
                (!plan.kept).then_some(plan.namespaces),
            )?;
            if plan.shards == 1 {
                replicas.wait_leader(admin, None, plan.deadline).await?;
            } else {
                replicas
                    .wait_shards(admin, plan.shards, Duration::from_secs(60), plan.deadline)
                    .await?;
            }
            Running::Operator(replicas)
        }
    };
    let converged_at: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let watch_failures = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let observer = tokio::spawn(observe(
        admin.clone(),
        converged_at.clone(),
        watch_failures.clone(),
    ));
    let audit = cluster.audit();
    let cursor = audit.cursor()?;
    let cpu_before = machine_cpu(cluster, &running, kcm);
    let requests_before = requests_by_verb(admin).await?;
    let operator_before = match &running {
        Running::Operator(replicas) => Some(OperatorRequests::scrape(replicas).await),
        _ => None,
    };
    let start = Instant::now();
    let start_wall = jiff::Timestamp::now();
    let sampler = match &running {
        Running::Operator(replicas) => Some(replicas.sample(start, SAMPLE_EVERY)),
        _ => None,
    };
    // A takeover under load is looked for while the GpuJobs are still being created
    // too: an operator that keeps up with the creates has converged most of them by the
    // last create, and a kill then finds settled work. The creates run on a task of
    // their own, so the takeover's own work (reading the audit log) does not hold them.
    let creates = tokio::spawn(create_all(
        admin.clone(),
        plan.namespaces.to_vec(),
        plan.spec.clone(),
        plan.gpujobs,
        plan.concurrency,
    ));
    let mut takeover = None;
    if let (Running::Operator(replicas), Some(at), true) =
        (&mut running, plan.takeover_at, plan.takeover)
    {
        while !creates.is_finished() {
            let n = converged_at.lock().unwrap_or_else(|p| p.into_inner()).len();
            if n >= at {
                eprintln!(
                    "  takeover: {n} converged, still creating; killing the busiest replica under load"
                );
                match take_over(cluster, admin, replicas, plan, Some(n)).await {
                    Ok(t) => takeover = Some(t),
                    Err(e) => {
                        // The phase fails: its creates stop with it.
                        creates.abort();
                        return Err(e);
                    }
                }
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let created_at = creates.await.context("the creates' task")??;
    let created = created_at
        .values()
        .max()
        .map_or(Duration::ZERO, |t| t.saturating_duration_since(start));
    if let Some(t) = &mut takeover {
        let made = created_at.values().filter(|c| **c <= t.killed_at).count();
        t.created_at_kill = (made < plan.gpujobs).then_some(made);
    }
    if who == Contender::Floor {
        floor_writes(cluster, plan).await?;
    }
    loop {
        let n = converged_at.lock().unwrap_or_else(|p| p.into_inner()).len();
        if n >= plan.gpujobs {
            break;
        }
        if let (Running::Operator(replicas), Some(at), None) =
            (&mut running, plan.takeover_at, &takeover)
            && plan.takeover
            && n >= at
        {
            // The observer keeps recording convergence while the takeover is measured.
            eprintln!("  takeover: {n} converged, killing the busiest replica under load");
            takeover = Some(take_over(cluster, admin, replicas, plan, Some(n)).await?);
        }
        if Instant::now() >= plan.deadline {
            bail!(
                "{}: gave up with {n} of {} GpuJobs converged",
                who.name(),
                plan.gpujobs
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let converged_map = converged_at
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    observer.abort();
    let watch_failures = watch_failures.load(std::sync::atomic::Ordering::Relaxed);
    let traces = match sampler {
        Some(sampler) => sampler.stop().await?,
        None => Vec::new(),
    };
    for t in traces.iter().filter(|t| t.failed_scrapes > 0) {
        eprintln!(
            "  sampling {}: {} scrapes of /metrics failed, the last: {}",
            t.identity,
            t.failed_scrapes,
            t.last_error.as_deref().unwrap_or_default()
        );
    }
    // CPU seconds now, before the replicas end with `running`.
    let traces: Vec<(Trace, Option<f64>)> = traces
        .into_iter()
        .map(|t| {
            let cpu = usage(t.pid).map(|u| u.1);
            (t, cpu)
        })
        .collect();
    let cpu_span = start.elapsed();
    let machine_cpu = machine_cpu(cluster, &running, kcm)
        .into_iter()
        .zip(&cpu_before)
        .map(|((who, after), (_, before))| (who, after - before))
        .collect();
    let mut requests = requests_by_verb(admin).await?;
    less(&mut requests, &requests_before);
    let converged_over_time = plots::cumulative(start, converged_map.values().copied());
    let converged = converged_map
        .values()
        .max()
        .map_or(Duration::ZERO, |t| t.saturating_duration_since(start));
    let mut latencies: Vec<Duration> = created_at
        .iter()
        .filter_map(|(k, c)| {
            converged_map
                .get(k)
                .map(|v| v.saturating_duration_since(*c))
        })
        .collect();
    latencies.sort();
    let (worker, standbys) = match &running {
        Running::None => (None, Vec::new()),
        Running::Reference(child) => (usage(child.id()), Vec::new()),
        Running::Operator(replicas) => {
            let mut all: Vec<(u64, f64)> = replicas.pids().into_iter().filter_map(usage).collect();
            // The one that did the work used the most CPU.
            all.sort_by(|a, b| b.1.total_cmp(&a.1));
            let worker = all.first().copied();
            (worker, all.iter().skip(1).map(|u| u.0).collect())
        }
    };
    // Let the last writes reach the audit log.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let load: std::collections::BTreeSet<&str> =
        plan.namespaces.iter().map(String::as_str).collect();
    let ours: Vec<_> = audit
        .since(cursor)?
        .into_iter()
        .filter(|e| e.user == OPERATOR_USER && e.is_write() && load.contains(e.namespace.as_str()))
        .collect();
    let control: Vec<_> = ours
        .iter()
        .filter(|e| e.resource == "gpujobs" || e.resource == "jobs")
        .collect();
    let started = match &running {
        Running::Operator(_) => {
            started(&audit, cursor, plan, (start, start_wall), &created_at).await?
        }
        _ => None,
    };
    // What the replicas sent, and how long they waited on their budget, from the first
    // create to the poll of the audit log that found every GpuJob started (a second or
    // two after it). Not with a takeover: the killed replica's counts are gone.
    let to_started = match (&running, &operator_before, &started) {
        (Running::Operator(replicas), Some(before), Some(_)) if takeover.is_none() => {
            Some(OperatorRequests::scrape(replicas).await.since(before))
        }
        _ => None,
    };
    if let (Running::Operator(replicas), None) = (&mut running, &takeover)
        && plan.takeover
    {
        eprintln!("  takeover: killing the working replica");
        takeover = Some(take_over(cluster, admin, replicas, plan, None).await?);
    }
    let recuts = match (&running, plan.kept && plan.shards > 1) {
        (Running::Operator(_), true) => Some(crate::replicas::recuts()?),
        _ => None,
    };
    drop(running);
    let memory = match (plan.replicas, traces.as_slice()) {
        (1, [(trace, _)]) => {
            let created: Vec<f64> = created_at
                .values()
                .map(|c| c.saturating_duration_since(start).as_secs_f64())
                .collect();
            memory_slope(&trace.rss_kib, &created)
        }
        _ => None,
    };
    Ok(Figures {
        who,
        created,
        converged,
        latencies,
        started,
        to_started,
        writes: control.len(),
        conflicts: control.iter().filter(|e| e.code == 409).count(),
        events: ours.iter().filter(|e| e.resource == "events").count(),
        watch_failures,
        worker,
        standbys,
        converged_over_time,
        traces,
        takeover,
        machine_cpu,
        cpu_span,
        requests,
        memory,
        recuts,
    })
}

/// When each GpuJob's first pod was let go at the operator's gate ([`let_go_at`]),
/// waited for until every GpuJob has one. Converged counts a Job created; its pods wait
/// at the gate until this. Returns first create → the last of them, and create answered
/// → each, sorted; `None` (said) when the deadline comes first, so the phase's other
/// figures are still reported.
async fn started(
    audit: &devcluster::audit::AuditLog,
    cursor: devcluster::audit::Cursor,
    plan: &Plan<'_>,
    (start, start_wall): (Instant, jiff::Timestamp),
    created_at: &HashMap<String, Instant>,
) -> anyhow::Result<Option<(Duration, Vec<Duration>)>> {
    let load: std::collections::BTreeSet<&str> =
        plan.namespaces.iter().map(String::as_str).collect();
    loop {
        let first = let_go_at(&audit.since(cursor)?, &load)?;
        if first.len() >= plan.gpujobs {
            let since = |at: &jiff::Timestamp| {
                Duration::try_from(at.duration_since(start_wall)).unwrap_or(Duration::ZERO)
            };
            let all = first.values().map(since).max().unwrap_or_default();
            let mut each: Vec<Duration> = created_at
                .iter()
                .filter_map(|(k, c)| {
                    let created = c.saturating_duration_since(start);
                    first.get(k).map(|at| since(at).saturating_sub(created))
                })
                .collect();
            each.sort();
            return Ok(Some((all, each)));
        }
        if Instant::now() >= plan.deadline {
            eprintln!(
                "  started: the deadline came with {} of {} GpuJobs' first pod let go at the gate; not reported",
                first.len(),
                plan.gpujobs
            );
            return Ok(None);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// `namespace/gpujob` → when its first pod was let go at the gate: the operator's first
/// accepted patch of the pod (the gate's only pod patch); for a pod with none, the last
/// of its patches answered 5xx (a timeout whose write may have landed) before the
/// scheduler bound it, which it does only to a pod with no gate (times as
/// `running::when` reads them). Pods in namespaces outside `load` are not counted.
fn let_go_at(
    events: &[devcluster::audit::AuditEvent],
    load: &std::collections::BTreeSet<&str>,
) -> anyhow::Result<HashMap<String, jiff::Timestamp>> {
    let at = |e: &devcluster::audit::AuditEvent| -> anyhow::Result<jiff::Timestamp> {
        crate::running::when(e)
            .with_context(|| format!("audit timestamps {} / {}", e.received, e.timestamp))
    };
    let mut bound: HashMap<(&str, &str), jiff::Timestamp> = HashMap::new();
    for e in events.iter().filter(|e| {
        e.resource == "pods" && e.subresource == "binding" && e.verb == "create" && e.succeeded()
    }) {
        bound.insert((&e.namespace, &e.name), at(e)?);
    }
    // Per pod: its first accepted patch, and the last 5xx before its binding.
    let mut accepted: HashMap<(&str, &str), jiff::Timestamp> = HashMap::new();
    let mut unanswered: HashMap<(&str, &str), jiff::Timestamp> = HashMap::new();
    for e in events.iter().filter(|e| {
        e.user == OPERATOR_USER
            && e.resource == "pods"
            && e.subresource.is_empty()
            && e.verb == "patch"
            && load.contains(e.namespace.as_str())
    }) {
        let pod = (e.namespace.as_str(), e.name.as_str());
        let t = at(e)?;
        if e.succeeded() {
            let first = accepted.entry(pod).or_insert(t);
            *first = (*first).min(t);
        } else if e.code >= 500 && bound.get(&pod).is_some_and(|b| t < *b) {
            let last = unanswered.entry(pod).or_insert(t);
            *last = (*last).max(t);
        }
    }
    unanswered.retain(|pod, _| !accepted.contains_key(pod));
    let mut first: HashMap<String, jiff::Timestamp> = HashMap::new();
    for ((ns, pod), t) in accepted.into_iter().chain(unanswered) {
        // Pod `<gpujob>-<attempt>-<suffix>` of the GpuJob `<gpujob>`.
        let Some(gpujob) = pod.rsplitn(3, '-').nth(2) else {
            continue;
        };
        let entry = first.entry(format!("{ns}/{gpujob}")).or_insert(t);
        *entry = (*entry).min(t);
    }
    Ok(first)
}

/// `kill -9` of the working replica and its takeover; `under_load`: how many GpuJobs had
/// converged when it began, the rest still converging (else all had, queues empty).
async fn take_over(
    cluster: &ControlPlane,
    admin: &Client,
    replicas: &mut Replicas,
    plan: &Plan<'_>,
    under_load: Option<usize>,
) -> anyhow::Result<Takeover> {
    let t = takeover::run(
        cluster,
        admin,
        replicas,
        plan.gpujobs,
        plan.shards,
        plan.namespaces,
        under_load,
        plan.deadline,
    )
    .await?;
    eprintln!(
        "  takeover: its shards looked at whole {:.1}s after the kill; {} writes by the survivors",
        t.looked_after.as_secs_f64(),
        t.writes
    );
    Ok(t)
}

/// CPU seconds so far of each process sharing the machine during a phase, in a fixed
/// order (0 for one that is not there). `kcm`: a kube-controller-manager started in
/// place of devcluster's.
fn machine_cpu(
    cluster: &ControlPlane,
    running: &Running,
    kcm: Option<u32>,
) -> Vec<(&'static str, f64)> {
    let pids = &cluster.info().pids;
    let cpu = |pid: Option<u32>| pid.and_then(usage).map_or(0.0, |u| u.1);
    let contender = match running {
        Running::None => 0.0,
        Running::Reference(child) => cpu(Some(child.id())),
        Running::Operator(replicas) => replicas.cpu_seconds(),
    };
    vec![
        ("kube-apiserver", cpu(pids.get("kube-apiserver").copied())),
        ("etcd", cpu(pids.get("etcd").copied())),
        (
            "kube-controller-manager",
            cpu(kcm.or_else(|| pids.get("kube-controller-manager").copied())),
        ),
        ("kwok", cpu(pids.get("kwok").copied())),
        ("load generator", cpu(Some(std::process::id()))),
        ("controller (all replicas)", contender),
    ]
}

/// What all replicas sent (`rest_client_requests_total`, by HTTP method: a list or a
/// watch is a GET) and how long their requests waited on the client's budget
/// (`rest_client_rate_limiter_duration_seconds`), summed over the replicas.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OperatorRequests {
    pub by_method: BTreeMap<String, f64>,
    pub limiter_wait_seconds: f64,
}

impl OperatorRequests {
    async fn scrape(replicas: &Replicas) -> OperatorRequests {
        let mut sum = OperatorRequests::default();
        for (who, text) in replicas.scrape().await {
            match Metrics::parse(&text) {
                Ok(m) => sum.add(&m),
                Err(e) => eprintln!("the /metrics of {who} do not parse: {e}"),
            }
        }
        sum
    }

    fn add(&mut self, m: &Metrics) {
        for s in &m.samples {
            match s.name.as_str() {
                "rest_client_requests_total" => {
                    let method = s.labels.get("method").cloned().unwrap_or_default();
                    *self.by_method.entry(method).or_insert(0.0) += s.value;
                }
                "rest_client_rate_limiter_duration_seconds_sum" => {
                    self.limiter_wait_seconds += s.value;
                }
                _ => {}
            }
        }
    }

    /// These counts less `before`'s (a replica that restarted meanwhile counts from 0).
    fn since(mut self, before: &OperatorRequests) -> OperatorRequests {
        less(&mut self.by_method, &before.by_method);
        self.limiter_wait_seconds =
            (self.limiter_wait_seconds - before.limiter_wait_seconds).max(0.0);
        self
    }
}

/// Counters `now` less what they were `before`, keeping those that grew.
fn less(now: &mut BTreeMap<String, f64>, before: &BTreeMap<String, f64>) {
    for (key, n) in now.iter_mut() {
        *n -= before.get(key).copied().unwrap_or(0.0);
    }
    now.retain(|_, n| *n > 0.0);
}

/// The API server's `apiserver_request_total` so far, by verb; reads (GET and LIST) by
/// verb and resource, so a report says what was read.
async fn requests_by_verb(admin: &Client) -> anyhow::Result<BTreeMap<String, f64>> {
    let req = http::Request::get("/metrics").body(Vec::new())?;
    let text = admin.request_text(req).await?;
    Ok(by_verb(&Metrics::parse(&text)?))
}

fn by_verb(m: &Metrics) -> BTreeMap<String, f64> {
    let mut by_verb = BTreeMap::new();
    for s in &m.samples {
        if s.name == "apiserver_request_total" {
            let verb = s.labels.get("verb").cloned().unwrap_or_default();
            // A GET of no resource is of a path such as /metrics or /healthz.
            let key = match (verb.as_str(), s.labels.get("resource")) {
                ("GET" | "LIST", Some(resource)) if !resource.is_empty() => {
                    format!("{verb} {resource}")
                }
                _ => verb,
            };
            *by_verb.entry(key).or_insert(0.0) += s.value;
        }
    }
    by_verb
}

fn is_converged(gj: &GpuJob) -> bool {
    gj.status.as_ref().is_some_and(|s| {
        s.attempts >= 1
            && s.observed_generation.is_some()
            && s.observed_generation == gj.metadata.generation
    })
}

/// Records when each GpuJob is first seen converged, and counts (and says) each failure
/// of the watch that sees them.
async fn observe(
    admin: Client,
    converged_at: Arc<Mutex<HashMap<String, Instant>>>,
    failures: Arc<std::sync::atomic::AtomicUsize>,
) {
    let api: Api<GpuJob> = Api::all(admin);
    let mut events = watcher(api, watcher::Config::default())
        .default_backoff()
        .applied_objects()
        .boxed();
    let began = Instant::now();
    while let Some(gj) = events.next().await {
        let gj = match gj {
            Ok(gj) => gj,
            Err(e) => {
                failures.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                eprintln!(
                    "  the load generator's watch of GpuJobs failed {:.1}s after it began: {e}; retrying",
                    began.elapsed().as_secs_f64()
                );
                continue;
            }
        };
        if is_converged(&gj) {
            let key = format!("{}/{}", gj.namespace().unwrap_or_default(), gj.name_any());
            converged_at
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .entry(key)
                .or_insert_with(Instant::now);
        }
    }
}

/// Creates `gpujobs` GpuJobs of `spec` over `namespaces`, `concurrency` at a time;
/// returns when each create was answered.
async fn create_all(
    admin: Client,
    namespaces: Vec<String>,
    spec: serde_json::Value,
    gpujobs: usize,
    concurrency: usize,
) -> anyhow::Result<HashMap<String, Instant>> {
    let mut creates = futures::stream::iter(0..gpujobs)
        .map(|i| {
            let ns = namespaces[i % namespaces.len()].clone();
            let api: Api<GpuJob> = Api::namespaced(admin.clone(), &ns);
            let spec = spec.clone();
            async move {
                let name = format!("load-{i}");
                let gj: GpuJob = serde_json::from_value(json!({
                    "apiVersion": "gpujob.dev/v1", "kind": "GpuJob",
                    "metadata": {"name": name}, "spec": spec,
                }))?;
                api.create(&PostParams::default(), &gj)
                    .await
                    .with_context(|| format!("creating GpuJob {ns}/{name}"))?;
                anyhow::Ok((format!("{ns}/{name}"), Instant::now()))
            }
        })
        .buffer_unordered(concurrency);
    let mut at = HashMap::new();
    while let Some(r) = creates.next().await {
        let (k, t) = r?;
        at.insert(k, t);
    }
    Ok(at)
}

/// The floor: for every GpuJob, the first attempt's Job (created running, not suspended)
/// and one status patch, as the operator's service account, with kube's default client
/// (no rate limit).
async fn floor_writes(cluster: &ControlPlane, plan: &Plan<'_>) -> anyhow::Result<()> {
    let client = cluster.client(Identity::Operator).await?;
    let mut writes = futures::stream::iter(0..plan.gpujobs)
        .map(|i| {
            let ns = plan.namespaces[i % plan.namespaces.len()].clone();
            let client = client.clone();
            async move {
                let name = format!("load-{i}");
                let gpujobs: Api<GpuJob> = Api::namespaced(client.clone(), &ns);
                // Its uid and generation, as a controller's cache would hold them.
                let gj = gpujobs.get(&name).await?;
                let jobs: Api<Job> = Api::namespaced(client, &ns);
                jobs.create(&PostParams::default(), &running_job(&gj, 1))
                    .await?;
                let patch = json!({"status": {
                    "observedGeneration": gj.metadata.generation, "attempts": 1,
                    "phase": "Running", "activeJob": job_name(&name, 1),
                }});
                gpujobs
                    .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(plan.concurrency);
    while let Some(r) = writes.next().await {
        r?;
    }
    Ok(())
}

/// The operator's Job for `attempt`, but created running (not suspended), as a
/// controller without the operator's late-create protection would create it.
fn running_job(gj: &GpuJob, attempt: i32) -> Job {
    let mut job = desired_job(gj, attempt);
    if let Some(spec) = job.spec.as_mut() {
        spec.suspend = None;
    }
    job
}

/// Deletes every GpuJob (their Jobs go by garbage collection) and waits until the load
/// namespaces hold neither.
async fn clean_up(admin: &Client, plan: &Plan<'_>) -> anyhow::Result<()> {
    for ns in plan.namespaces {
        let api: Api<GpuJob> = Api::namespaced(admin.clone(), ns);
        api.delete_collection(&DeleteParams::background(), &ListParams::default())
            .await
            .with_context(|| format!("deleting the GpuJobs of {ns}"))?;
    }
    loop {
        let gpujobs = Api::<GpuJob>::all(admin.clone())
            .list_metadata(&ListParams::default().limit(1))
            .await?;
        let jobs = Api::<Job>::all(admin.clone())
            .list_metadata(&ListParams::default().limit(1))
            .await?;
        if gpujobs.items.is_empty() && jobs.items.is_empty() {
            return Ok(());
        }
        if Instant::now() >= plan.deadline {
            bail!("clean-up: GpuJobs or Jobs still there at the deadline");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Waits until the API server is quiet: fewer than 5 requests per second over 5 s (or
/// at most 2 minutes).
async fn quiesce(admin: &Client, deadline: Instant) -> anyhow::Result<()> {
    let until = (Instant::now() + Duration::from_secs(120)).min(deadline);
    let mut last = requests(admin).await?;
    loop {
        tokio::time::sleep(Duration::from_secs(5)).await;
        let now = requests(admin).await?;
        // Our own two scrapes count too.
        if now - last < 25.0 || Instant::now() >= until {
            return Ok(());
        }
        last = now;
    }
}

async fn requests(admin: &Client) -> anyhow::Result<f64> {
    Ok(requests_by_verb(admin).await?.values().sum())
}

/// Peak RSS (KiB) and CPU seconds of a process, from /proc.
fn usage(pid: u32) -> Option<(u64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let peak = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<u64>().ok())?;
    Some((peak, crate::replicas::cpu_seconds(pid)?))
}

/// Draws the plots into `dir` as `<stem>-converged.png` and (if the operator ran)
/// `<stem>-operator.png`; links them by file name (`relative`: the report goes into `dir`)
/// or by full path. A plot that cannot be drawn is said on stderr and left out.
pub fn plots(
    plan: &Plan<'_>,
    all: &[Figures],
    dir: &Path,
    stem: &str,
    relative: bool,
) -> Vec<Plot> {
    let mut out = Vec::new();
    let mut write =
        |alt: &str, note: String, name: String, draw: &dyn Fn(&Path) -> anyhow::Result<()>| {
            let path = dir.join(&name);
            match draw(&path) {
                Ok(()) => {
                    eprintln!("plot written to {}", path.display());
                    let link = if relative {
                        name
                    } else {
                        path.display().to_string()
                    };
                    out.push(Plot {
                        alt: alt.to_owned(),
                        link,
                        note,
                    });
                }
                Err(e) => eprintln!("no plot {}: {e:#}", path.display()),
            }
        };
    let lines: Vec<Line> = all
        .iter()
        .map(|f| Line {
            label: match f.who {
                Contender::Operator => format!("{} ({} replicas)", f.who.short(), plan.replicas),
                _ => f.who.short().to_owned(),
            },
            points: f.converged_over_time.clone(),
        })
        .collect();
    write(
        "converged GpuJobs over time",
        "Each contender's GpuJobs converged against seconds since its phase's first create."
            .to_owned(),
        format!("{stem}-converged.png"),
        &|path| plots::converged(path, &lines),
    );
    if let Some(op) = all
        .iter()
        .find(|f| f.who == Contender::Operator && !f.traces.is_empty())
    {
        let label = |t: &Trace, cpu: Option<f64>| match cpu {
            Some(cpu) => format!("{}, {cpu:.1} s CPU", t.identity),
            None => t.identity.clone(),
        };
        let rss: Vec<Line> = op
            .traces
            .iter()
            .map(|(t, cpu)| Line {
                label: label(t, *cpu),
                points: t
                    .rss_kib
                    .iter()
                    .map(|&(x, kib)| (x, kib as f64 / 1024.0))
                    .collect(),
            })
            .collect();
        let depth: Vec<Line> = op
            .traces
            .iter()
            .map(|(t, cpu)| Line {
                label: label(t, *cpu),
                points: t.depth.clone(),
            })
            .collect();
        let title = format!(
            "gpujob-operator, {} GpuJobs: each replica, sampled every {} s",
            plan.gpujobs,
            SAMPLE_EVERY.as_secs()
        );
        let note = format!(
            "The operator's phase: every {} s, each replica's resident memory (VmRSS, /proc) \
             and `workqueue_depth` (its `/metrics`); the legend gives each replica's CPU \
             seconds over the phase (the one with the most did the work).",
            SAMPLE_EVERY.as_secs()
        );
        write(
            "gpujob-operator: each replica's resident memory and work-queue depth over time",
            note,
            format!("{stem}-operator.png"),
            &|path| plots::operator(path, &title, &rss, &depth),
        );
    }
    out
}

fn mib(kib: u64) -> String {
    format!("{} MiB", kib / 1024)
}

fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

/// The comparison as a Markdown section.
pub fn report(plan: &Plan<'_>, all: &[Figures], flags: &str, plots: &[Plot]) -> String {
    let n = plan.gpujobs as f64;
    let mut r = String::new();
    let _ = writeln!(
        r,
        "# Load test: the operator against a reference controller and the floor\n\n\
         {} GpuJobs over {} namespaces, created {} at a time; each controller alone, one \
         after the other, {} (Kubernetes v1.37, this machine's {} \
         cores shared by everything). Converged: `observedGeneration` current and the first \
         attempt's Job created. The operator: {} replica(s), `--shards {}`{}, {flags}; the \
         reference controller is built the same way.\n",
        plan.gpujobs,
        plan.namespaces.len(),
        plan.concurrency,
        if plan.same_control_plane {
            "on one private control plane, cleaned up in between"
        } else {
            "each on a fresh private control plane"
        },
        std::thread::available_parallelism().map_or(1, usize::from),
        plan.replicas,
        plan.shards,
        match (plan.shards, plan.sharded_watch) {
            (1, _) => "",
            (_, true) =>
                " (kube-apiserver selects objects by shard: each replica watches its shards)",
            (_, false) =>
                " (kube-apiserver without ShardedListAndWatch: every replica watches everything)",
        },
    );
    let _ = writeln!(
        r,
        "| | all created | all converged | create → converged p50 / p99 | control writes per GpuJob (409s) | Events per GpuJob | peak RSS (worker; standbys) | CPU |\n|---|---|---|---|---|---|---|---|"
    );
    for f in all {
        let q = |x: f64| quantile(&f.latencies, x).map_or("–".to_owned(), secs);
        let rss = match &f.worker {
            Some((kib, _)) if f.standbys.is_empty() => mib(*kib),
            Some((kib, _)) => format!(
                "{}; {}",
                mib(*kib),
                f.standbys
                    .iter()
                    .map(|k| mib(*k))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            None => "–".to_owned(),
        };
        let cpu = f
            .worker
            .map_or("–".to_owned(), |(_, s)| format!("{s:.1} s"));
        let _ = writeln!(
            r,
            "| {} | {} | {} | {} / {} | {:.2} ({}) | {:.2} | {rss} | {cpu} |",
            f.who.name(),
            secs(f.created),
            secs(f.converged),
            q(0.5),
            q(0.99),
            f.writes as f64 / n,
            f.conflicts,
            f.events as f64 / n,
        );
    }
    for f in all.iter().filter(|f| f.watch_failures > 0) {
        let _ = writeln!(
            r,
            "\n{}: the load generator's own watch of GpuJobs failed {} time(s) during this phase \
             and was retried after kube's backoff (up to 30 s): GpuJobs that converged \
             meanwhile were seen late, so its converged figures may be late too.",
            f.who.name(),
            f.watch_failures,
        );
    }
    for f in all {
        if let Some((all_started, each)) = &f.started {
            let q = |x: f64| quantile(each, x).map_or("–".to_owned(), secs);
            let _ = writeln!(
                r,
                "\n{}: every GpuJob started (its first pod let go at the operator's gate: the pod's \
                 PATCH in the audit log) {} after the first create; create → started p50 / p99 {} / {}.",
                f.who.name(),
                secs(*all_started),
                q(0.5),
                q(0.99),
            );
            if let Some(o) = &f.to_started {
                let n = plan.gpujobs.max(1) as f64;
                let methods: Vec<String> = o
                    .by_method
                    .iter()
                    .map(|(m, c)| format!("{m} {:.2}", c / n))
                    .collect();
                let _ = writeln!(
                    r,
                    "Up to then its replicas sent, per GpuJob, {} (a list or a watch is a GET), and \
                     their requests waited {:.1} s in all on their client budgets.",
                    methods.join(", "),
                    o.limiter_wait_seconds,
                );
            }
        }
    }
    let find = |w: Contender| all.iter().find(|f| f.who == w);
    if let (Some(op), Some(floor), Some(reference)) = (
        find(Contender::Operator),
        find(Contender::Floor),
        find(Contender::Reference),
    ) {
        let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64().max(0.001);
        let _ = writeln!(
            r,
            "\nTime to all converged: operator / floor {:.2}×, operator / reference {:.2}×.",
            ratio(op.converged, floor.converged),
            ratio(op.converged, reference.converged)
        );
        if let (Some((o, _)), Some((s, _))) = (op.worker, reference.worker) {
            let standby = op
                .standbys
                .iter()
                .max()
                .map(|k| format!(", a standby {:.2}×", *k as f64 / s as f64))
                .unwrap_or_default();
            let _ = writeln!(
                r,
                "Peak RSS: the operator's working replica / reference {:.2}×{standby}.",
                o as f64 / s as f64
            );
        }
    }
    if let Some(m) = all.iter().find_map(|f| f.memory.as_ref()) {
        let _ = writeln!(
            r,
            "\nMemory per GpuJob held (one replica holds them all, with their Jobs, the pods made so far and the Events not yet written): \
             {:.0} bytes, the least-squares slope of its RSS against the GpuJobs created by each \
             of {} samples (RSS {:.0} MiB at the first, {:.0} MiB at the last).",
            m.bytes_per_gpujob,
            m.samples,
            m.first_kib as f64 / 1024.0,
            m.last_kib as f64 / 1024.0
        );
    }
    for f in all {
        if let Some(c) = &f.recuts {
            let longest = f.latencies.last().copied().map_or("–".to_owned(), secs);
            let _ = writeln!(
                r,
                "\nShard map kept by the replicas (no `--shard-cuts`, the namespaces named {}): {} re-cut(s) written; \
                 from a re-cut's write to every shard held under it: {}. The longest create → converged of any GpuJob: {longest}.",
                plan.namespace_names,
                c.written,
                if c.done.is_empty() {
                    "none finished".to_owned()
                } else {
                    c.done
                        .iter()
                        .map(|s| format!("{s:.1} s"))
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            );
        }
    }
    r.push_str(&machine_report(all, n));
    if let Some(t) = all.iter().find_map(|f| f.takeover.as_ref()) {
        r.push_str(&takeover::report(t));
    }
    if !plots.is_empty() {
        let _ = writeln!(r, "\n## Plots");
        for p in plots {
            let _ = writeln!(r, "\n{}\n\n![{}]({})", p.note, p.alt, p.link);
        }
    }
    r
}

/// Where each phase's CPU went, and the API server's requests by verb: on a machine the
/// phases saturate, time to converged follows the CPU all processes spend per GpuJob.
fn machine_report(all: &[Figures], n: f64) -> String {
    let Some(first) = all.first() else {
        return String::new();
    };
    let mut r = String::from(
        "\n## Where the machine's CPU went\n\nCPU seconds of each process from the first \
         create to all converged, or, with a takeover measured past that, to its end (the \
         span; a replica killed counts up to its kill); API server requests per GpuJob by \
         verb (reads also by resource) over the same span (`apiserver_request_total`; a \
         watch counts once, not per event).\n\n|",
    );
    for (who, _) in &first.machine_cpu {
        let _ = write!(r, " | {who}");
    }
    r.push_str(" | all | span | cores busy | requests per GpuJob |\n|---|");
    r.push_str(&"---|".repeat(first.machine_cpu.len() + 4));
    r.push('\n');
    for f in all {
        let _ = write!(r, "| {}", f.who.short());
        for (_, s) in &f.machine_cpu {
            let _ = write!(r, " | {s:.1} s");
        }
        let total: f64 = f.machine_cpu.iter().map(|(_, s)| s).sum();
        let requests = f
            .requests
            .iter()
            .map(|(verb, k)| format!("{verb} {:.2}", k / n))
            .collect::<Vec<_>>()
            .join(", ");
        let span = f.cpu_span.as_secs_f64();
        let _ = writeln!(
            r,
            " | {total:.1} s | {span:.1} s | {:.2} | {requests} |",
            total / span.max(0.001)
        );
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gpujob_starts_at_its_first_pod_patch_that_landed() {
        let op = OPERATOR_USER;
        let sched = "system:kube-scheduler";
        // (who, verb, subresource, namespace, pod, code, second)
        let rows = [
            // a: refused, then accepted: the accepted one counts.
            (op, "patch", "", "ns-1", "a-1-x", 409, 1),
            (op, "patch", "", "ns-1", "a-1-x", 200, 2),
            // b: answered 504 twice, though the gate went (the scheduler bound the pod):
            // the last before the binding.
            (op, "patch", "", "ns-1", "b-1-x", 504, 2),
            (op, "patch", "", "ns-1", "b-1-x", 504, 3),
            (sched, "create", "binding", "ns-1", "b-1-x", 201, 4),
            // c: answered 504 and never bound: not started.
            (op, "patch", "", "ns-1", "c-1-x", 504, 3),
            // d: another's patch, a status patch, and a namespace not under load.
            ("someone", "patch", "", "ns-1", "d-1-x", 200, 5),
            (op, "patch", "status", "ns-1", "d-1-x", 200, 5),
            (op, "patch", "", "other", "d-1-x", 200, 5),
            // e: the second attempt's pod let go too: the first time counts.
            (op, "patch", "", "ns-1", "e-2-y", 200, 9),
            (op, "patch", "", "ns-1", "e-1-x", 200, 6),
            // f: answered 504, then accepted, then bound: the accepted one.
            (op, "patch", "", "ns-1", "f-1-x", 504, 1),
            (op, "patch", "", "ns-1", "f-1-x", 200, 7),
            (sched, "create", "binding", "ns-1", "f-1-x", 201, 8),
            // g: answered 504 after its pod was bound: not what let it go.
            (sched, "create", "binding", "ns-1", "g-1-x", 201, 1),
            (op, "patch", "", "ns-1", "g-1-x", 504, 2),
        ];
        let at = |second: u32| format!("2026-01-01T00:00:{second:02}Z");
        let events: Vec<devcluster::audit::AuditEvent> = rows
            .iter()
            .map(
                |&(user, verb, sub, ns, name, code, second)| devcluster::audit::AuditEvent {
                    user: user.to_owned(),
                    user_agent: String::new(),
                    verb: verb.to_owned(),
                    api_group: String::new(),
                    resource: "pods".to_owned(),
                    subresource: sub.to_owned(),
                    namespace: ns.to_owned(),
                    name: name.to_owned(),
                    code,
                    timestamp: at(second),
                    received: at(second),
                    lease_holder: None,
                },
            )
            .collect();
        let load = std::collections::BTreeSet::from(["ns-1"]);
        let first = let_go_at(&events, &load).unwrap();
        let expected = |s: u32| at(s).parse::<jiff::Timestamp>().unwrap();
        assert_eq!(
            first,
            HashMap::from([
                ("ns-1/a".to_owned(), expected(2)),
                ("ns-1/b".to_owned(), expected(3)),
                ("ns-1/e".to_owned(), expected(6)),
                ("ns-1/f".to_owned(), expected(7)),
            ])
        );
    }

    #[test]
    fn the_replicas_requests_are_summed_by_method_and_counted_from_before() {
        let scrape = |text: &str| {
            let mut sum = OperatorRequests::default();
            sum.add(&Metrics::parse(text).unwrap());
            sum
        };
        let before = scrape(
            "rest_client_requests_total{code=\"200\",method=\"GET\"} 10\n\
             rest_client_requests_total{code=\"200\",method=\"PATCH\"} 4\n\
             rest_client_rate_limiter_duration_seconds_sum 1.5\n",
        );
        let after = scrape(
            "rest_client_requests_total{code=\"200\",method=\"GET\"} 25\n\
             rest_client_requests_total{code=\"404\",method=\"GET\"} 5\n\
             rest_client_requests_total{code=\"200\",method=\"PATCH\"} 4\n\
             rest_client_requests_total{code=\"201\",method=\"POST\"} 7\n\
             rest_client_rate_limiter_duration_seconds_sum 4\n\
             rest_client_rate_limiter_duration_seconds_count 9\n",
        );
        let d = after.since(&before);
        assert_eq!(
            d.by_method,
            BTreeMap::from([("GET".to_owned(), 20.0), ("POST".to_owned(), 7.0)]),
            "every code summed; a method that did not grow left out"
        );
        assert!((d.limiter_wait_seconds - 2.5).abs() < 1e-9, "{d:?}");
    }

    #[test]
    fn the_api_servers_requests_are_by_verb_and_reads_by_resource_too() {
        let m = Metrics::parse(
            "apiserver_request_total{code=\"200\",resource=\"pods\",verb=\"LIST\"} 3\n\
             apiserver_request_total{code=\"200\",resource=\"pods\",verb=\"PATCH\"} 4\n\
             apiserver_request_total{code=\"201\",resource=\"jobs\",verb=\"POST\"} 5\n\
             apiserver_request_total{code=\"404\",resource=\"jobs\",verb=\"GET\"} 1\n\
             apiserver_request_total{code=\"200\",resource=\"jobs\",verb=\"GET\"} 2\n\
             apiserver_request_total{code=\"200\",resource=\"gpujobs\",verb=\"LIST\"} 6\n\
             apiserver_request_total{code=\"200\",resource=\"\",verb=\"GET\"} 7\n",
        )
        .unwrap();
        assert_eq!(
            by_verb(&m),
            BTreeMap::from([
                ("GET".to_owned(), 7.0),
                ("GET jobs".to_owned(), 3.0),
                ("LIST gpujobs".to_owned(), 6.0),
                ("LIST pods".to_owned(), 3.0),
                ("PATCH".to_owned(), 4.0),
                ("POST".to_owned(), 5.0),
            ])
        );
    }

    #[test]
    fn the_memory_slope_is_bytes_per_gpujob_held_at_each_sample() {
        // 10 MiB, then 2 KiB more per GpuJob; one GpuJob created every second.
        let created: Vec<f64> = (0..100).rev().map(|i| f64::from(i) + 0.5).collect();
        let rss: Vec<(f64, u64)> = (0..=100u32)
            .map(|t| (f64::from(t), 10 * 1024 + 2 * u64::from(t)))
            .collect();
        let slope = memory_slope(&rss, &created).unwrap();
        assert!((slope.bytes_per_gpujob - 2048.0).abs() < 1e-6, "{slope:?}");
        assert_eq!(
            (slope.samples, slope.first_kib, slope.last_kib),
            (101, 10240, 10440)
        );
        assert_eq!(memory_slope(&rss[..1], &created), None, "one sample");
        assert_eq!(memory_slope(&rss, &[]), None, "nothing held");
    }
}
