//! gpujob-operator: thin entry point; see the library for everything else.

use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use gpujob_operator::cli::{Cli, Command, LogFormat, MigrateArgs, RunArgs, ShardCutsArgs};
use gpujob_operator::client::Limits;
use gpujob_operator::controller::multikueue::WorkerClusters;
use gpujob_operator::health::Status;
use gpujob_operator::lease::{self, Ownership, ShardLeases};
use gpujob_operator::metrics::Metrics;
use gpujob_operator::server;
use gpujob_operator::{api, client, controller};
use tokio::sync::{oneshot, watch};
use tracing::info;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Crd(args) => args
            .options()
            .map_err(anyhow::Error::msg)
            .and_then(|options| api::crd_yaml_with(&options).context("generating the CRD"))
            .map(|yaml| print!("{yaml}")),
        Command::Run(args) => run(*args),
        Command::MigrateStorage(args) => migrate_storage(&args),
        Command::ShardCuts(args) => shard_cuts(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpujob-operator: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: RunArgs) -> anyhow::Result<()> {
    init_logging(args.log_format);
    let mut settings = args.settings().map_err(anyhow::Error::msg)?;
    let timing = args.timing().map_err(anyhow::Error::msg)?;
    let limits = args.limits().map_err(anyhow::Error::msg)?;
    let event_limits = args.event_limits().map_err(anyhow::Error::msg)?;
    let mut listen = args.listen().map_err(anyhow::Error::msg)?;
    listen.conversion = args.conversion().map_err(anyhow::Error::msg)?;
    let identity = args.identity();
    let map = std::sync::Arc::new(args.shard_map().map_err(anyhow::Error::msg)?);
    client::install_crypto_provider();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        let config = kube::Config::infer()
            .await
            .context("loading the kubeconfig (KUBECONFIG, ~/.kube/config or in-cluster)")?;
        let status = Status::new(Metrics::new());
        let metrics = status.metrics.clone();
        info!(identity = %identity, version = env!("CARGO_PKG_VERSION"), leader_elect = args.leader_elect,
            shards = args.shards, shard_map = %map.name(), workers = %args.workers(),
            multikueue_workers = ?args.multikueue_workers.iter().map(|(name, _)| name).collect::<Vec<_>>(),
            "gpujob-operator starting");
        if settings.plan.api_versions == controller::ApiVersions::V1 {
            tracing::warn!(
                "--api-versions=v1 (rollback mode): spec.v2 of every GpuJob is ignored (no pod template, GPU product or per-GpuJob backoff; Jobs are built as before v2 existed) and left as it is; the conversion webhook runs if --conversion-cert-dir is given"
            );
        }
        // Secure metrics review each scraper's token: unfenced (standbys serve metrics too),
        // on a small budget of their own (each token is reviewed once a minute at most),
        // and given up after 10 s, when a scrape would have timed out anyway.
        let reviews = match listen.tls {
            Some(_) => {
                let review_limits = Limits { qps: 5.0, burst: 10, timeout: std::time::Duration::from_secs(10) };
                let client = client::build(config.clone(), &identity, review_limits, Some(metrics.clone()), None)
                    .context("building the client for metrics token reviews")?;
                Some(client)
            }
            None => None,
        };
        // The servers are up before leadership is won, on standbys too, and until the very end.
        let bound = server::bind(listen).await?;
        let (server_stop, server_stopped) = oneshot::channel::<()>();
        let server = tokio::spawn(bound.run(status.clone(), reviews, async move {
            let _ = server_stopped.await;
        }));
        // Before any Lease can be held: see shutdown_signal.
        let shutdown = shutdown_signal()?;
        let result = if !args.leader_elect {
            let kube_client = client::build(config.clone(), &identity, limits, Some(metrics.clone()), None)
                .context("building the API client")?;
            let events_client = client::build(config, &identity, event_limits, Some(metrics.clone()), None)
                .context("building the Events client")?;
            let workers = &args.multikueue_workers;
            settings.multikueue = WorkerClusters::connect(workers, &identity, limits, Some(metrics), None).await?;
            controller::run_unfenced(kube_client, events_client, settings, status, shutdown).await
        } else {
            let (tx, rx) = watch::channel(Ownership::nothing_in(map.clone()));
            // Reconcile writes are fenced by the Lease of their shard, right before they are sent.
            let kube_client =
                client::build(config.clone(), &identity, limits, Some(metrics.clone()), Some(rx.clone()))
                    .context("building the API client")?;
            // Events have a budget of their own (they never take requests from reconciles).
            // They are queued only in the term that recorded what they report, and written
            // even once the shard has moved: a new Event is safe when late, and the new
            // holder sends none for a change already recorded.
            let events_client = client::build(config.clone(), &identity, event_limits, Some(metrics.clone()), None)
                .context("building the Events client")?;
            // The pods of dispatched attempts are written on the workers under the same Leases.
            let workers = &args.multikueue_workers;
            settings.multikueue =
                WorkerClusters::connect(workers, &identity, limits, Some(metrics.clone()), Some(rx.clone())).await?;
            // The Leases have their own client and budget: reconcile traffic never starves
            // renewals. Sharded, each replica renews its share plus a heartbeat.
            let lease_limits = Limits { qps: 5.0 + f64::from(args.shards), burst: 10 + args.shards, ..limits };
            let lease_client = client::build(config, &identity, lease_limits, Some(metrics), None)
                .context("building the lease client")?;
            let (drained, drained_rx) = oneshot::channel::<()>();
            let drained_rx = async move {
                let _ = drained_rx.await;
            };
            let in_flight = settings.in_flight.clone();
            let leases = ShardLeases {
                lease_name: args.lease_name.clone(),
                namespace: args.lease_namespace(),
                kept: args.kept_map(),
                map,
                settings: args.split_settings(),
            };
            let lease_loop = lease::Params {
                client: lease_client,
                leases,
                identity: identity.clone(),
                timing,
                tx,
                in_flight,
                load: settings.load.clone(),
                recut_interval: args.recut_interval,
                watch_timeout: client::watch_timeout(limits.timeout),
                status: status.clone(),
            };
            let lease_task = tokio::spawn(lease::run(lease_loop, drained_rx));
            let result = controller::run(kube_client, events_client, settings, rx, status, shutdown).await;
            // Drained: now the Leases can be released.
            let _ = drained.send(());
            lease_task.await.context("lease task")?;
            result
        };
        let _ = server_stop.send(());
        match server.await {
            Ok(Ok(())) => result,
            Ok(Err(e)) => result.and(Err(e)),
            Err(e) => result.and(Err(e.into())),
        }
    })
}

fn shard_cuts(args: &ShardCutsArgs) -> anyhow::Result<()> {
    with_client("shard-cuts", Limits::default(), |client| async move {
        let counts = gpujob_operator::shard_cuts::count(client)
            .await
            .context("listing GpuJobs")?;
        let (map, table) = gpujob_operator::shard_cuts::plan(&counts, args.shards, args.by);
        eprint!("{table}");
        println!("--shard-cuts={}", map.cuts_text());
        Ok(())
    })
}

fn migrate_storage(args: &MigrateArgs) -> anyhow::Result<()> {
    init_logging(args.log_format);
    let (options, limits) = args.options().map_err(anyhow::Error::msg)?;
    with_client("migrate-storage", limits, |client| async move {
        gpujob_operator::migrate::run(client, &options)
            .await
            .context("migrate-storage")?;
        Ok(())
    })
}

/// Runs `work` with a client of the current kubeconfig (or in-cluster) identified as
/// `identity`, on a runtime of one thread: the one-shot commands.
fn with_client<F, Fut>(identity: &str, limits: Limits, work: F) -> anyhow::Result<()>
where
    F: FnOnce(kube::Client) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    client::install_crypto_provider();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        let config = kube::Config::infer()
            .await
            .context("loading the kubeconfig (KUBECONFIG, ~/.kube/config or in-cluster)")?;
        let client = client::build(config, identity, limits, None, None)
            .context("building the API client")?;
        work(client).await
    })
}

/// Registers the SIGTERM and SIGINT handlers now and returns the future that resolves
/// on either. Registering at once matters: the lease task is spawned before the runner
/// first polls this future, and a signal before registration would take its default
/// action (exit) with Leases held and not released. A replica that cannot register them
/// does not start: it could neither drain nor release its Leases.
fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("registering the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("registering the SIGINT handler")?;
    Ok(async move {
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
        info!("shutdown signal received");
    })
}

fn init_logging(format: LogFormat) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        // kube's client logs every failed request as an error without saying what
        // happens next; the operator logs each failure itself, with the object and the
        // retry, so those lines would only double (and mislead) the on-call reader.
        .unwrap_or_else(|_| {
            tracing_subscriber::EnvFilter::new("info,kube_client::client::builder=off")
        });
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
