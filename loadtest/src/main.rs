//! The load test: a private devcluster, the CRD and RBAC of `deploy/`, replicas of the
//! real operator binary (all as the operator's service account, told apart by their
//! User-Agent; `--shards N` splits the GpuJobs among them) and thousands of GpuJobs
//! created at once, spread over `--namespaces K` namespaces `load-0..load-<K-1>`. It measures what happened
//! from the outside (the API server's audit log, the replicas' `/metrics`, `/proc`) and
//! prints a Markdown report.
//!
//! It stops by itself: every wait has a deadline, and the control plane and the
//! replicas end with it, also on error.

mod cluster;
mod compare;
mod measure;
mod plots;
mod replicas;
mod running;
mod takeover;
mod trickle;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use futures::StreamExt;
use gpujob_operator::api::{GpuJob, Phase};
use kube::api::{Api, PostParams};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use serde_json::json;

use crate::measure::{Outcome, Timeline};
use crate::replicas::{Replicas, Takeover};

/// Prefix of the load namespaces: `load-0`, `load-1`, ...
const NAMESPACE_PREFIX: &str = "load";
/// Sharded start-up: how long to wait, once every shard has a holder, for the shards to
/// be shared out evenly before creating GpuJobs anyway.
const SETTLE: Duration = Duration::from_secs(60);
/// `--until running`: the load has settled once its GpuJobs, Jobs and pods have not
/// changed for this long (waited for until `--timeout-seconds` at most).
const QUIET: Duration = Duration::from_secs(10);

#[derive(Debug, Parser)]
#[command(
    about = "Creates GpuJobs in bulk against replicas of the real operator and reports what it cost"
)]
struct Args {
    /// GpuJobs to create.
    #[arg(long, default_value_t = 2000)]
    gpujobs: usize,
    /// Operator replicas (with --shards 1 one leads, the others stand by).
    #[arg(long, default_value_t = 3)]
    replicas: u8,
    /// Shards the operator splits GpuJobs into (`gpujob-operator run --shards N`, passed
    /// to every replica). 1: plain leader election on one Lease.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    shards: u32,
    /// Namespaces `load-0..load-<K-1>` the GpuJobs are spread over, round-robin (shards
    /// are by namespace, so this is what there is to split).
    #[arg(long, default_value_t = 50)]
    namespaces: usize,
    /// How the namespaces are named: `load` (`load-0` …), `team` (`team-0` …: named
    /// alike, as teams name them) or `random` (`ns-` and 8 hex digits of a hash of the
    /// index: the same names every run). Shards are ranges of a hash of the name, and
    /// names that differ only at the end hash close together.
    #[arg(long, default_value = "load", value_parser = ["load", "team", "random"])]
    namespace_names: String,
    /// Sharded: `hand`, the replicas run with `--shard-cuts` balanced over the
    /// namespaces by the load test; `kept`, no `--shard-cuts` (the replicas keep the
    /// map balanced by load themselves, as an install does by default).
    #[arg(long, default_value = "hand", value_parser = ["hand", "kept"])]
    shard_cuts: String,
    /// GpuJob creates in flight at once.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// How long each simulated pod runs, in seconds.
    #[arg(long, default_value = "1")]
    sim_duration_seconds: String,
    /// `kill -9` the leader once this many GpuJobs exist (a failover under load). Sharded:
    /// the replica holding the most shards (ties: the lowest identity).
    #[arg(long)]
    kill_leader_after: Option<usize>,
    /// Also create this many GpuJobs one by one, in namespace `trickle`, while the
    /// burst is waiting, and report how long each waited for its first Job.
    #[arg(long, default_value_t = 0)]
    trickle: usize,
    /// Seconds between two trickle GpuJobs.
    #[arg(long, default_value_t = 1.0)]
    trickle_every: f64,
    /// Run the same GpuJobs three times, each alone: a bare client doing the operator's
    /// minimal writes (the floor), a kube-runtime reference controller, and the operator;
    /// report them side by side (converged: observedGeneration current and the first
    /// attempt's Job created; pods run for an hour, so each GpuJob's writes are those to
    /// Running; --sim-duration-seconds and --kill-leader-after do not apply).
    #[arg(long)]
    compare: bool,
    /// With --compare: once the operator has converged every GpuJob, `kill -9` its
    /// working replica and report the takeover (time until a survivor has looked at every
    /// GpuJob, its writes, its memory).
    #[arg(long, requires = "compare")]
    takeover: bool,
    /// With --takeover: kill once this many GpuJobs have converged, while the rest still
    /// converge (a takeover under load; looked for during the creates too), instead of
    /// after all of them with the queues empty.
    #[arg(long, requires = "takeover")]
    takeover_at: Option<usize>,
    /// With --compare: run every phase on one control plane, cleaning up in between,
    /// instead of each on a fresh one (the phases after the first then run on a control
    /// plane that has just deleted N GpuJobs, Jobs and pods, and are slower for it).
    #[arg(long, requires = "compare")]
    same_control_plane: bool,
    /// With --compare: which of floor, reference, operator to run (comma-separated).
    #[arg(long, value_delimiter = ',', default_values = ["floor", "reference", "operator"])]
    phases: Vec<String>,
    /// Whether kube-apiserver selects objects by shard (feature gate
    /// `ShardedListAndWatch`): with it, sharded replicas list and watch only their
    /// shards; `off`, every replica receives and caches everything.
    #[arg(long, default_value = "on", value_parser = ["on", "off"])]
    sharded_watch: String,
    /// The operator binary to run.
    #[arg(long)]
    operator_bin: PathBuf,
    /// The kube-runtime reference controller `--compare` runs (built like the operator);
    /// default: `gpujob-reference-controller` beside this binary.
    #[arg(long)]
    reference_bin: Option<PathBuf>,
    /// How the operator binary was built, for the report (e.g. `dev`, `release`).
    #[arg(long, default_value = "dev")]
    profile: String,
    /// The repository's `deploy/` folder (CRD, namespace, RBAC).
    #[arg(long, default_value = "deploy")]
    deploy: PathBuf,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 1800)]
    timeout_seconds: u64,
    /// When the load is done: `finished`, every GpuJob ended; `running`, every GpuJob's
    /// attempt runs (its pod Running, its status phase Running), then the load settles
    /// (no change to its GpuJobs, Jobs and pods for 10 s, or the deadline), and the report
    /// counts the operator's and kube-controller-manager's writes from creation to
    /// running. `running` needs pods that outlive the run: --sim-duration-seconds at
    /// least --timeout-seconds.
    #[arg(long, default_value = "finished", value_parser = ["finished", "running"], conflicts_with = "compare")]
    until: String,
    /// Restart the control plane's kube-controller-manager with this client budget,
    /// `QPS/BURST` (its default is 20/30; devcluster starts it with 300/600), before
    /// the first GpuJob is created (with --compare, on each phase's control plane). The
    /// report states the budget either way.
    #[arg(long, conflicts_with = "same_control_plane", value_parser = running::Budget::parse)]
    kcm_api_budget: Option<running::Budget>,
    /// Also write the report to this file (with --compare, its PNG plots go beside it:
    /// `<stem>-converged.png`, `<stem>-operator.png`; without --report, into the replicas'
    /// log folder).
    #[arg(long)]
    report: Option<PathBuf>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.gpujobs == 0 || args.replicas == 0 || args.concurrency == 0 || args.namespaces == 0 {
        bail!("--gpujobs, --replicas, --concurrency and --namespaces must be at least 1");
    }
    if args.until == "running"
        && args
            .sim_duration_seconds
            .parse::<f64>()
            .is_ok_and(|s| s < args.timeout_seconds as f64)
    {
        bail!(
            "--until running needs pods that outlive the run: --sim-duration-seconds ({}) at least --timeout-seconds ({})",
            args.sim_duration_seconds,
            args.timeout_seconds
        );
    }
    if (args.kill_leader_after.is_some() || args.takeover) && args.replicas < 2 {
        bail!(
            "--kill-leader-after and --takeover need at least 2 replicas (someone has to take over)"
        );
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the runtime")?
        .block_on(run(args))
}

async fn run(args: Args) -> anyhow::Result<()> {
    gpujob_operator::client::install_crypto_provider();
    let deadline = Instant::now() + Duration::from_secs(args.timeout_seconds);
    let namespaces: Vec<String> = (0..args.namespaces)
        .map(|i| match args.namespace_names.as_str() {
            "team" => format!("team-{i}"),
            "random" => format!(
                "ns-{:08x}",
                gpujob_operator::hash::fnv1a64(&i.to_le_bytes()) >> 32
            ),
            _ => format!("{NAMESPACE_PREFIX}-{i}"),
        })
        .collect();
    let kept = args.shard_cuts == "kept";
    let trickle_ns = (args.trickle > 0).then(|| trickle::NAMESPACE.to_owned());
    let all_namespaces: Vec<String> = namespaces.iter().chain(&trickle_ns).cloned().collect();
    let (cluster, admin) = cluster::start(
        &args.deploy,
        &all_namespaces,
        args.gpujobs + args.trickle,
        args.sharded_watch == "on",
    )
    .await?;

    let spec = json!({
        "image": "registry.example/train:1",
        "gpus": 1,
        "env": [{"name": "SIM_DURATION_SECONDS", "value": args.sim_duration_seconds}],
    });
    if args.compare {
        // Attempts run for the whole phase (their pods go with their GpuJobs): each
        // GpuJob's writes are those that bring it to Running, in all three.
        let spec = json!({
            "image": "registry.example/train:1",
            "gpus": 1,
            "env": [{"name": "SIM_DURATION_SECONDS", "value": "3600"}],
        });
        let reference_bin = match &args.reference_bin {
            Some(path) => path.clone(),
            None => std::env::current_exe()?
                .parent()
                .context("the load test binary's folder")?
                .join("gpujob-reference-controller"),
        };
        let plan = compare::Plan {
            gpujobs: args.gpujobs,
            concurrency: args.concurrency,
            namespaces: &namespaces,
            spec,
            operator_bin: &args.operator_bin,
            reference_bin,
            replicas: args.replicas,
            shards: args.shards,
            kept,
            namespace_names: &args.namespace_names,
            sharded_watch: args.sharded_watch == "on",
            deadline,
            phases: compare::contenders(&args.phases)?,
            takeover: args.takeover,
            takeover_at: args.takeover_at,
            same_control_plane: args.same_control_plane,
            deploy: &args.deploy,
            kcm_budget: args.kcm_api_budget.clone(),
        };
        let kcm = match &plan.kcm_budget {
            Some(budget) => budget.clone(),
            None => cluster::kcm_budget(&cluster)?,
        };
        let figures = compare::run((cluster, admin), &plan).await?;
        let flags = format!(
            "{} build, {}; kube-controller-manager's client budget {} qps / {} burst ({})",
            args.profile,
            measure::flags(&operator_env()),
            kcm.qps,
            kcm.burst,
            kcm.source
        );
        // Without a place for them, the report still goes out.
        let plots = match plot_place(args.report.as_deref()) {
            Ok((dir, stem, relative)) => compare::plots(&plan, &figures, &dir, &stem, relative),
            Err(e) => {
                eprintln!("no plots: {e:#}");
                Vec::new()
            }
        };
        let report = compare::report(&plan, &figures, &flags, &plots);
        println!("{report}");
        if let Some(path) = &args.report {
            std::fs::write(path, &report).with_context(|| format!("writing {}", path.display()))?;
            eprintln!("report written to {}", path.display());
        }
        return Ok(());
    }

    let mut timeline = Timeline::default();
    let until_running = args.until == "running";
    // Before the replicas and the first GpuJob: the Job controller starts with nothing to do.
    let kcm = match args.kcm_api_budget.clone() {
        Some(budget) => Some(cluster::restart_kcm(&cluster, budget)?),
        None => None,
    };
    let kcm_budget = match &kcm {
        Some(k) => k.budget.clone(),
        None => cluster::kcm_budget(&cluster)?,
    };
    eprintln!(
        "kube-controller-manager's client budget: {} qps / {} burst ({})",
        kcm_budget.qps, kcm_budget.burst, kcm_budget.source
    );
    let mut replicas = Replicas::start(
        &cluster,
        &args.operator_bin,
        args.replicas,
        args.shards,
        (!kept).then_some(&namespaces[..]),
    )?;
    if args.shards == 1 {
        let first_leader = replicas.wait_leader(&admin, None, deadline).await?;
        eprintln!("{} replicas up, {first_leader} leads", args.replicas);
    } else {
        let holders = replicas
            .wait_shards(&admin, args.shards, SETTLE, deadline)
            .await?;
        eprintln!(
            "{} replicas up, every one of {} shards held:",
            args.replicas, args.shards
        );
        for (who, shards) in replicas::held_by(&holders) {
            eprintln!("  {who} holds shards {shards:?}");
        }
        timeline.holders_at_start = Some(holders);
    }
    eprintln!(
        "creating {} GpuJobs in {} namespaces",
        args.gpujobs, args.namespaces
    );

    // One watch of our own (over every namespace: nothing else on this private control
    // plane has GpuJobs) instead of polling lists, so the observer costs the API server
    // next to nothing.
    let (store, writer) = reflector::store::<GpuJob>();
    let progress = Arc::new(running::Progress::default());
    let seen = progress.clone();
    let watch = reflector::reflector(
        writer,
        watcher(
            Api::<GpuJob>::all(admin.clone()),
            watcher::Config::default(),
        )
        .default_backoff(),
    )
    .applied_objects()
    .for_each(move |_| {
        seen.touch();
        async {}
    });
    let watch = tokio::spawn(watch);
    let progress_watches =
        until_running.then(|| (progress.watch_pods(&admin), progress.watch_jobs(&admin)));

    let audit = cluster.audit();
    let cursor = audit.cursor()?;
    let start = Instant::now();
    let mut takeover: Option<tokio::task::JoinHandle<anyhow::Result<Takeover>>> = None;
    let trickle = Arc::new(trickle::Trickle::default());
    let trickle_tasks = (args.trickle > 0).then(|| {
        let every = Duration::from_secs_f64(args.trickle_every.max(0.0));
        (
            trickle.watch_jobs(&admin),
            tokio::spawn(
                trickle
                    .clone()
                    .create(admin.clone(), args.trickle, every, spec.clone()),
            ),
        )
    });
    let total = args.gpujobs + args.trickle;
    let mut created = 0usize;
    let mut creates = futures::stream::iter(0..args.gpujobs)
        .map(|i| {
            let ns = &namespaces[i % namespaces.len()];
            let gpujobs: Api<GpuJob> = Api::namespaced(admin.clone(), ns);
            let spec = spec.clone();
            async move {
                let gj: GpuJob = serde_json::from_value(json!({
                    "apiVersion": "gpujob.dev/v1", "kind": "GpuJob",
                    "metadata": {"name": format!("load-{i}")}, "spec": spec,
                }))?;
                gpujobs
                    .create(&PostParams::default(), &gj)
                    .await
                    .with_context(|| format!("creating GpuJob {ns}/load-{i}"))?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(args.concurrency);
    while let Some(r) = creates.next().await {
        r?;
        created += 1;
        if Some(created) == args.kill_leader_after {
            if args.shards == 1 {
                let killed = replicas.kill_leader(&admin).await?;
                timeline.leader_killed = Some((start.elapsed(), killed));
            } else {
                let (killed, held) = replicas.kill_busiest(&admin, args.shards).await?;
                let killed_at = Instant::now();
                timeline.leader_killed = Some((start.elapsed(), killed));
                // Polled on the side while the creates go on.
                takeover = Some(tokio::spawn(replicas::watch_takeover(
                    replicas::lease_api(&admin),
                    args.shards,
                    replicas.live(),
                    held.clone(),
                    killed_at,
                    deadline,
                )));
                timeline.killed_shards = held;
            }
        }
    }
    timeline.created = start.elapsed();
    eprintln!(
        "created {created} GpuJobs in {:.1}s",
        timeline.created.as_secs_f64()
    );

    loop {
        let state = store.state();
        let started = state
            .iter()
            .filter(|g| g.status.as_ref().is_some_and(|s| s.attempts >= 1))
            .count();
        let done = if until_running {
            state.iter().filter(|g| progress.is_running(g)).count()
        } else {
            state
                .iter()
                .filter(|g| {
                    g.status
                        .as_ref()
                        .and_then(|s| s.phase)
                        .is_some_and(Phase::is_final)
                })
                .count()
        };
        if started == total && timeline.all_started.is_none() {
            timeline.all_started = Some(start.elapsed());
        }
        if done == total {
            if until_running {
                timeline.all_running = Some(start.elapsed());
            } else {
                timeline.all_finished = Some(start.elapsed());
            }
            break;
        }
        if Instant::now() >= deadline {
            bail!(
                "gave up after {}s: {started} of {total} GpuJobs started, {done} {}",
                args.timeout_seconds,
                if until_running { "running" } else { "finished" },
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    if let Some(at) = timeline.all_running {
        eprintln!(
            "every GpuJob's attempt running {:.1}s after the first create; waiting for the load to settle",
            at.as_secs_f64()
        );
        let since = Instant::now();
        loop {
            if progress.quiet_for() >= QUIET {
                timeline.quiet = Some(since.elapsed().saturating_sub(progress.quiet_for()));
                break;
            }
            if Instant::now() >= deadline {
                eprintln!("the load had not settled by the deadline; reporting what there is");
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        timeline.settle_waited = since.elapsed();
    }
    if let Some((pods, jobs)) = progress_watches {
        pods.abort();
        jobs.abort();
    }
    watch.abort();
    if let Some((watch_jobs, create)) = trickle_tasks {
        create.await.context("the trickle")??;
        watch_jobs.abort();
        let (latencies, created) = trickle.latencies();
        timeline.trickle = Some(measure::TrickleFigures {
            created,
            every: args.trickle_every,
            latencies,
        });
    }
    if let Some(at) = timeline.all_finished {
        eprintln!(
            "every GpuJob finished {:.1}s after the first create",
            at.as_secs_f64()
        );
    }
    if let Some((_, killed)) = &timeline.leader_killed
        && args.shards == 1
    {
        timeline.new_leader = Some(
            replicas
                .wait_leader(&admin, Some(killed.as_str()), deadline)
                .await?,
        );
    }
    if let Some(task) = takeover {
        let tk = task.await.context("the takeover watch")??;
        eprintln!(
            "the killed replica's shards were unowned for {:.1}s; taken: {:?}",
            tk.unowned.as_secs_f64(),
            tk.taken
        );
        timeline.takeover = Some(tk);
    }
    let phases = measure::phases(&store.state());
    // Let the last writes reach the audit log.
    tokio::time::sleep(Duration::from_secs(2)).await;
    if args.shards > 1 {
        let holders = replicas::shard_holders(&replicas::lease_api(&admin), args.shards)
            .await
            .context("listing the shard Leases at the end")?;
        timeline.holders_at_end = Some(holders);
    }
    let outcome = Outcome {
        gpujobs: args.gpujobs,
        phases,
        audit: audit.since(cursor)?,
        metrics: replicas.scrape().await,
        memory: replicas.memory(),
    };
    let mut report = measure::report(
        &measure::Setup {
            gpujobs: args.gpujobs,
            replicas: args.replicas,
            shards: args.shards,
            sharded_watch: args.sharded_watch == "on",
            concurrency: args.concurrency,
            sim_duration_seconds: &args.sim_duration_seconds,
            profile: &args.profile,
            namespaces: &namespaces,
            cores: std::thread::available_parallelism().map_or(1, usize::from),
            operator_env: operator_env(),
        },
        &timeline,
        &outcome,
    );
    if until_running {
        let owners = running::load_owners(&namespaces, args.gpujobs);
        let writes = running::count(&outcome.audit, &owners);
        report.push_str(&running::report(
            &writes,
            &kcm_budget,
            timeline.quiet.map(|q| q.as_secs_f64()),
            timeline.settle_waited.as_secs_f64(),
        ));
    }
    println!("{report}");
    if let Some(path) = &args.report {
        std::fs::write(path, &report).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("report written to {}", path.display());
    }
    drop(replicas);
    drop(kcm);
    cluster.shutdown();
    Ok(())
}

/// Where `--compare` puts its plots: next to the report (`<report stem>-*.png`, linked by
/// file name), or without `--report` in the replicas' log folder (`compare-*.png`, linked
/// by full path).
fn plot_place(report: Option<&Path>) -> anyhow::Result<(PathBuf, String, bool)> {
    match report {
        Some(path) => {
            let dir = path
                .parent()
                .filter(|d| !d.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            let stem = path
                .file_stem()
                .with_context(|| format!("--report {}: no file name", path.display()))?;
            Ok((dir.to_owned(), stem.to_string_lossy().into_owned(), true))
        }
        None => {
            let dir = replicas::log_dir();
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            eprintln!("no --report: the plots go into {}", dir.display());
            Ok((dir, "compare".to_owned(), false))
        }
    }
}

/// The operator's settings from this process's environment, which the replicas
/// inherit: the report says which flags differed from the defaults. Only the variables
/// `gpujob-operator run` reads (its flags' `env`); the test harness's own `GPUJOB_*`
/// paths are not the operator's settings.
fn operator_env() -> Vec<(String, String)> {
    let read = run_flag_env();
    let mut env: Vec<(String, String)> = std::env::vars()
        .filter(|(k, _)| read.contains(k.as_str()))
        .collect();
    env.sort();
    env
}

/// The environment variables `gpujob-operator run` reads, from its flag definitions.
fn run_flag_env() -> std::collections::BTreeSet<String> {
    use clap::CommandFactory;
    gpujob_operator::cli::Cli::command()
        .find_subcommand("run")
        .map(|run| {
            run.get_arguments()
                .filter_map(|a| a.get_env())
                .map(|e| e.to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod env_tests {
    #[test]
    fn the_run_flags_environment_holds_the_operators_settings_and_not_the_harness_paths() {
        let read = super::run_flag_env();
        assert!(read.contains("GPUJOB_API_QPS"), "{read:?}");
        assert!(read.contains("GPUJOB_RECUT_INTERVAL"), "{read:?}");
        assert!(!read.contains("GPUJOB_KUEUE_DIR"), "{read:?}");
        assert!(!read.contains("GPUJOB_THIRD_PARTY_CRDS"), "{read:?}");
    }
}
