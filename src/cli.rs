//! Command line. Every flag can also be set from the environment (`GPUJOB_*`).

use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::controller::{PlanSettings, Settings};

#[derive(Debug, Parser)]
#[command(
    name = "gpujob-operator",
    version,
    about = "Runs GpuJob custom resources as batch/v1 Jobs"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the operator against the cluster of the current kubeconfig (or in-cluster).
    Run(RunArgs),
    /// Print the GpuJob CustomResourceDefinition (what deploy/crd.yaml holds).
    Crd,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Watch only this namespace (default: all namespaces).
    #[arg(long, env = "GPUJOB_NAMESPACE")]
    pub namespace: Option<String>,
    /// This replica's name, in logs and in every request's User-Agent
    /// (default: $POD_NAME, else $HOSTNAME, else "gpujob-operator").
    #[arg(long, env = "GPUJOB_IDENTITY")]
    pub identity: Option<String>,
    /// Concurrent reconciles.
    #[arg(long, env = "GPUJOB_WORKERS", default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub workers: u16,
    /// Wait before the attempt after the first failure; doubles per failure.
    #[arg(long, env = "GPUJOB_RETRY_BACKOFF_BASE", default_value = "10s", value_parser = parse_duration)]
    pub retry_backoff_base: Duration,
    /// Longest wait between attempts.
    #[arg(long, env = "GPUJOB_RETRY_BACKOFF_MAX", default_value = "6m", value_parser = parse_duration)]
    pub retry_backoff_max: Duration,
    /// Jobs of this many most recent attempts are kept for debugging; older ones are deleted.
    #[arg(long, env = "GPUJOB_KEEP_JOBS", default_value_t = 3, value_parser = clap::value_parser!(i32).range(1..=100))]
    pub keep_jobs: i32,
    /// Every GpuJob is reconciled at least this often, events or not.
    #[arg(long, env = "GPUJOB_RESYNC", default_value = "5m", value_parser = parse_duration)]
    pub resync: Duration,
    /// Log format.
    #[arg(long, env = "GPUJOB_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

impl RunArgs {
    pub fn identity(&self) -> String {
        self.identity
            .clone()
            .or_else(|| std::env::var("POD_NAME").ok())
            .or_else(|| std::env::var("HOSTNAME").ok())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "gpujob-operator".to_owned())
    }

    /// The controller settings, checked for consistency.
    pub fn settings(&self) -> Result<Settings, String> {
        if self.retry_backoff_base.is_zero() {
            return Err("--retry-backoff-base must be greater than zero".to_owned());
        }
        if self.retry_backoff_max < self.retry_backoff_base {
            return Err(format!(
                "--retry-backoff-max ({:?}) must not be less than --retry-backoff-base ({:?})",
                self.retry_backoff_max, self.retry_backoff_base
            ));
        }
        if self.resync.is_zero() {
            return Err("--resync must be greater than zero".to_owned());
        }
        Ok(Settings {
            namespace: self.namespace.clone(),
            workers: usize::from(self.workers),
            plan: PlanSettings {
                backoff_base: self.retry_backoff_base,
                backoff_max: self.retry_backoff_max,
                keep_jobs: self.keep_jobs,
            },
            resync: self.resync,
            ..Settings::default()
        })
    }
}

/// `10s`, `500ms`, `6m`, `1h 30m`, or a plain number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if let Ok(secs) = s.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    let d: jiff::SignedDuration = s
        .parse()
        .map_err(|e| format!("{s:?} is not a duration like 10s, 500ms or 6m: {e}"))?;
    Duration::try_from(d).map_err(|_| format!("{s:?} must not be negative"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_in_friendly_units() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("6m"), Ok(Duration::from_secs(360)));
        assert_eq!(parse_duration("1h 30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("42"), Ok(Duration::from_secs(42)));
        assert!(parse_duration("-5s").is_err());
        assert!(parse_duration("soon").unwrap_err().contains("soon"));
    }

    #[test]
    fn settings_are_checked() {
        let cli = Cli::try_parse_from([
            "gpujob-operator",
            "run",
            "--retry-backoff-base",
            "1m",
            "--retry-backoff-max",
            "10s",
        ])
        .unwrap();
        let Command::Run(args) = cli.command else {
            panic!("run")
        };
        assert!(args.settings().unwrap_err().contains("--retry-backoff-max"));

        let cli = Cli::try_parse_from([
            "gpujob-operator",
            "run",
            "--namespace",
            "team-a",
            "--keep-jobs",
            "5",
        ])
        .unwrap();
        let Command::Run(args) = cli.command else {
            panic!("run")
        };
        let s = args.settings().unwrap();
        assert_eq!(
            (s.namespace.as_deref(), s.plan.keep_jobs),
            (Some("team-a"), 5)
        );
        assert_eq!(s.plan.backoff_base, Duration::from_secs(10));
        assert!(Cli::try_parse_from(["gpujob-operator", "run", "--workers", "0"]).is_err());
    }
}
