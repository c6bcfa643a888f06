//! gpujob-operator: thin entry point; see the library for everything else.

use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use gpujob_operator::cli::{Cli, Command, LogFormat, RunArgs};
use gpujob_operator::{api, client, controller};
use tracing::info;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Crd => api::crd_yaml()
            .map(|yaml| print!("{yaml}"))
            .context("generating the CRD"),
        Command::Run(args) => run(args),
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
    let settings = args.settings().map_err(anyhow::Error::msg)?;
    let identity = args.identity();
    client::install_crypto_provider();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        let config = kube::Config::infer()
            .await
            .context("loading the kubeconfig (KUBECONFIG, ~/.kube/config or in-cluster)")?;
        let config = client::identify(config, &identity).context("building the User-Agent")?;
        let kube_client = kube::Client::try_from(config).context("building the API client")?;
        info!(identity = %identity, version = env!("CARGO_PKG_VERSION"), "gpujob-operator starting");
        controller::run(kube_client, settings, shutdown_signal()).await
    })
}

async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
    info!("shutdown signal received");
}

fn init_logging(format: LogFormat) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
