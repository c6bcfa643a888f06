//! `kubectl gpujob`: a kubectl plugin for GpuJobs (gpujob.dev). Installed on PATH as
//! `kubectl-gpujob`, kubectl runs it as `kubectl gpujob …` (docs/install.md, "kubectl
//! plugin").

mod actions;
mod attempts;
mod cluster;
mod error;
mod logs;
mod snapshot;
mod table;
mod why;

#[cfg(test)]
mod tests;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use crate::cluster::Cluster;
use crate::error::Error;

#[derive(Debug, Parser)]
#[command(
    name = "kubectl-gpujob",
    bin_name = "kubectl gpujob",
    version,
    about = "Look at GpuJobs (gpujob.dev) and act on them: attempts, logs, why, rerun, suspend, resume"
)]
struct Cli {
    #[command(flatten)]
    connection: Connection,
    #[command(subcommand)]
    command: Command,
}

/// Where to connect, as kubectl takes it.
#[derive(Debug, Args)]
struct Connection {
    /// The kubeconfig file (default: $KUBECONFIG, then ~/.kube/config).
    #[arg(long, global = true, value_name = "PATH")]
    kubeconfig: Option<PathBuf>,
    /// The kubeconfig context (default: its current context).
    #[arg(long, global = true)]
    context: Option<String>,
    /// The namespace (default: the context's namespace, else `default`).
    #[arg(short = 'n', long, global = true)]
    namespace: Option<String>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Every attempt: number, Job, phase, exit code or reason, nodes, started, ended,
    /// whether its failure counts against retryPolicy.maxRetries.
    Attempts { name: String },
    /// The log of an attempt's pod (container `main`).
    Logs {
        name: String,
        /// The attempt (default: the newest that still has pods).
        #[arg(long)]
        attempt: Option<i32>,
        /// The pod of this rank (completion index) of a multi-node attempt (default 0).
        #[arg(long)]
        rank: Option<i32>,
        /// Stream the log until the pod ends.
        #[arg(short = 'f', long)]
        follow: bool,
        /// Only the last N lines.
        #[arg(long, value_name = "N")]
        tail: Option<i64>,
    },
    /// One paragraph: what the GpuJob waits for now (quota, Kueue admission, nodes, a lost
    /// node, an old attempt's pods, a name conflict, a backoff, a resume, nothing).
    Why { name: String },
    /// Start a new run of a finished GpuJob (annotation gpujob.dev/rerun; a GpuJob that
    /// has not finished reruns once it has).
    Rerun {
        name: String,
        /// The request's value (default: the current time); each new value starts one run.
        #[arg(long)]
        token: Option<String>,
    },
    /// Set spec.suspend: no new attempt starts, a running one is stopped (not counted).
    Suspend { name: String },
    /// Clear spec.suspend: the next attempt starts.
    Resume { name: String },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<(), Error> {
    let c = &cli.connection;
    let cluster = Cluster::connect(
        c.kubeconfig.as_deref(),
        c.context.as_deref(),
        c.namespace.as_deref(),
    )
    .await?;
    match cli.command {
        Command::Attempts { name } => {
            let s = cluster.snapshot(&name).await?;
            let rows = attempts::rows(&s);
            if rows.is_empty() {
                say(&format!(
                    "GpuJob {}/{name} has started no attempt yet ({}).",
                    cluster.namespace,
                    why::sentences(&s, jiff::Timestamp::now())
                        .get(1)
                        .map_or("no status yet", |w| w.trim_end_matches('.'))
                ))
            } else {
                print(&attempts::render(&rows))
            }
        }
        Command::Why { name } => {
            let s = cluster.snapshot(&name).await?;
            print(&why::paragraph(&s, jiff::Timestamp::now(), 100))
        }
        Command::Logs {
            name,
            attempt,
            rank,
            follow,
            tail,
        } => {
            let s = cluster.snapshot(&name).await?;
            let choice = logs::choose(&s, attempt, rank)?;
            let pod = snapshot::pod_name(choice.pod).to_owned();
            // On stderr, so that stdout is the log alone.
            eprintln!(
                "==> pod {}/{pod}: attempt {}, rank {} of {}, node {}, {} <==",
                cluster.namespace,
                choice.attempt,
                choice.rank,
                choice.ranks,
                snapshot::pod_node(choice.pod).unwrap_or("none"),
                snapshot::pod_phase(choice.pod)
            );
            cluster.logs(&pod, follow, tail).await
        }
        Command::Suspend { name } => set_suspend(&cluster, &name, true).await,
        Command::Resume { name } => set_suspend(&cluster, &name, false).await,
        Command::Rerun { name, token } => {
            let found = cluster.gpujob(&name).await?;
            let token = token.unwrap_or_else(|| jiff::Timestamp::now().to_string());
            actions::rerun_needed(&found.gpujob, &token).map_err(Error::Input)?;
            let gj = cluster
                .patch(
                    &found.resource,
                    &name,
                    &actions::rerun_patch(&token),
                    "requesting a rerun of",
                )
                .await?;
            say(&actions::rerun_done(&gj, &token))
        }
    }
}

async fn set_suspend(cluster: &Cluster, name: &str, suspend: bool) -> Result<(), Error> {
    let found = cluster.gpujob(name).await?;
    if let Err(nothing) = actions::suspend_needed(&found.gpujob, suspend) {
        return say(&nothing);
    }
    let what = if suspend { "suspending" } else { "resuming" };
    let gj = cluster
        .patch(
            &found.resource,
            name,
            &actions::suspend_patch(suspend),
            what,
        )
        .await?;
    say(&actions::suspend_done(&gj, suspend))
}

fn say(line: &str) -> Result<(), Error> {
    print(&format!("{line}\n"))
}

fn print(text: &str) -> Result<(), Error> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(Error::Output)
}
