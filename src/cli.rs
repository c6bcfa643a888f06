//! Command line. Every flag can also be set from the environment (`GPUJOB_*`).

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::client::Limits;
use crate::controller::validate::{ServiceAccounts, SpecLimits};
use crate::controller::{ApiVersions, GangScheduling, PlanSettings, Settings, Workers};
use crate::lease::{Load, Timing};
use crate::queue::Backoff;
use crate::quota::{HttpProvider, HttpSettings, Provider};
use crate::server::{Listen, Webhook};

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
    Run(Box<RunArgs>),
    /// Print the GpuJob CustomResourceDefinition (without options: what
    /// deploy/crd/crd.yaml holds).
    Crd(CrdArgs),
    /// Rewrite every stored GpuJob in the CRD's storage version, then set the CRD's
    /// status.storedVersions to just that version (docs/install.md, "Upgrading the API",
    /// step 2).
    /// Safe to interrupt and to run again.
    MigrateStorage(MigrateArgs),
    /// Print `--shard-cuts` for N shards that balance the GpuJobs there are (by
    /// namespace; a namespace is never split), with what each shard would hold under
    /// them and under N equal ranges. Reads only.
    ShardCuts(ShardCutsArgs),
}

/// `gpujob-operator shard-cuts`.
#[derive(Debug, Args)]
pub struct ShardCutsArgs {
    /// How many shards (the replicas' --shards).
    #[arg(long, env = "GPUJOB_SHARDS", value_parser = clap::value_parser!(u32).range(2..=1024))]
    pub shards: u32,
    /// What to balance: GpuJobs per shard, or namespaces per shard.
    #[arg(long, value_enum, default_value_t = crate::shard_cuts::Weight::Gpujobs)]
    pub by: crate::shard_cuts::Weight,
}

/// `gpujob-operator migrate-storage`.
#[derive(Debug, Args)]
pub struct MigrateArgs {
    /// API requests per second (list pages and rewrites), so the API server and etcd
    /// keep serving everyone else.
    #[arg(long, env = "GPUJOB_MIGRATE_QPS", default_value_t = 10.0)]
    pub qps: f64,
    /// GpuJobs per list page.
    #[arg(long, env = "GPUJOB_MIGRATE_PAGE_SIZE", default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub page_size: u32,
    /// Stop after this many GpuJobs, leaving status.storedVersions as it is (a careful
    /// first run; running again without it finishes).
    #[arg(long, env = "GPUJOB_MIGRATE_LIMIT")]
    pub limit: Option<u64>,
    /// A progress line every this many GpuJobs...
    #[arg(long, env = "GPUJOB_MIGRATE_PROGRESS_EVERY", default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    pub progress_every: u64,
    /// ...or after this long, whichever comes first.
    #[arg(long, env = "GPUJOB_MIGRATE_PROGRESS_INTERVAL", default_value = "10s", value_parser = parse_duration)]
    pub progress_interval: Duration,
    /// An API request that goes this long without a byte is abandoned (the run fails
    /// and can be run again).
    #[arg(long, env = "GPUJOB_API_TIMEOUT", default_value = "60s", value_parser = parse_duration)]
    pub api_timeout: Duration,
    /// Log format.
    #[arg(long, env = "GPUJOB_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

impl MigrateArgs {
    /// The run's options and its client limits, checked.
    pub fn options(&self) -> Result<(crate::migrate::Options, Limits), String> {
        if self.qps.is_nan() || self.qps <= 0.0 {
            return Err(format!("--qps {} must be greater than zero", self.qps));
        }
        if self.api_timeout < Duration::from_secs(1) {
            return Err(format!(
                "--api-timeout ({:?}) must be at least 1s",
                self.api_timeout
            ));
        }
        let options = crate::migrate::Options {
            page_size: self.page_size,
            limit: self.limit,
            progress_every: self.progress_every,
            progress_interval: self.progress_interval,
        };
        // No bursts: the pace is the rate asked for, from the first request.
        let limits = Limits {
            qps: self.qps,
            burst: 1,
            timeout: self.api_timeout,
        };
        Ok((options, limits))
    }
}

/// `gpujob-operator crd --storage-version`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StorageArg {
    V1,
    V2,
}

/// `gpujob-operator crd`: which CRD to print.
#[derive(Debug, Args)]
pub struct CrdArgs {
    /// Send conversions to this URL (https://host:port/convert) instead of the Service
    /// gpujob-system/gpujob-operator-webhook: an operator running outside the cluster,
    /// or a test.
    #[arg(long)]
    pub webhook_url: Option<String>,
    /// PEM file of the CA that signed the webhook's serving certificate, written into
    /// the CRD's caBundle (default: none; cert-manager or scripts/webhook-cert.sh
    /// injects it).
    #[arg(long)]
    pub ca_bundle_file: Option<std::path::PathBuf>,
    /// gpujob.dev/v1 alone, without conversion: the CRD as it was before v2 was served,
    /// for an API server no operator webhook answers (the shared test control plane,
    /// the demo).
    #[arg(long, conflicts_with_all = ["webhook_url", "ca_bundle_file", "storage_version"])]
    pub v1_only: bool,
    /// The version GpuJobs are stored in: v1 (step 1 of the upgrade) or v2 (step 2:
    /// then run `gpujob-operator migrate-storage`). v1 stays served, deprecated.
    #[arg(long, value_enum, default_value_t = StorageArg::V1)]
    pub storage_version: StorageArg,
}

impl CrdArgs {
    /// The CRD these arguments ask for (reads --ca-bundle-file).
    pub fn options(&self) -> Result<crate::api::CrdOptions, String> {
        use crate::api::Conversion;
        let conversion = match (&self.webhook_url, self.v1_only) {
            (_, true) => Conversion::V1Only,
            (Some(url), false) => {
                if !url.starts_with("https://") {
                    return Err(format!(
                        "--webhook-url {url}: the API server calls conversion webhooks over HTTPS only"
                    ));
                }
                Conversion::Url(url.clone())
            }
            (None, false) => Conversion::Service,
        };
        let ca_bundle = match &self.ca_bundle_file {
            Some(path) => {
                let pem = std::fs::read(path)
                    .map_err(|e| format!("reading --ca-bundle-file {}: {e}", path.display()))?;
                if !String::from_utf8_lossy(&pem).contains("-----BEGIN CERTIFICATE-----") {
                    return Err(format!(
                        "--ca-bundle-file {}: no PEM certificate in it",
                        path.display()
                    ));
                }
                Some(pem)
            }
            None => None,
        };
        Ok(crate::api::CrdOptions {
            conversion,
            ca_bundle,
            storage: match self.storage_version {
                StorageArg::V1 => crate::api::StorageVersion::V1,
                StorageArg::V2 => crate::api::StorageVersion::V2,
            },
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum QuotaKind {
    None,
    Http,
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
    /// Concurrent reconciles, fixed (default: by the API budget and the API server's
    /// answer time, every 2 s: from --api-qps / 16, at least 4, to --api-qps / 2, at most
    /// 256). Each waits for the API server's answers, so the workers a budget needs grow
    /// with it and with the answer time.
    #[arg(long, env = "GPUJOB_WORKERS", value_parser = clap::value_parser!(u16).range(1..=256))]
    pub workers: Option<u16>,
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
    /// Address of the /metrics, /healthz and /readyz server (with --probe-address:
    /// of /metrics only).
    #[arg(long, env = "GPUJOB_LISTEN_ADDRESS", default_value = "0.0.0.0:8080")]
    pub listen_address: std::net::SocketAddr,
    /// Serve /healthz and /readyz on a plain HTTP server of their own at this address
    /// (default: beside /metrics on --listen-address). Needed with --metrics-secure.
    #[arg(long, env = "GPUJOB_PROBE_ADDRESS")]
    pub probe_address: Option<std::net::SocketAddr>,
    /// Serve /metrics over HTTPS, only to bearer tokens whose user may `get` the
    /// non-resource URL /metrics (checked with a TokenReview and a SubjectAccessReview;
    /// bind the ClusterRole gpujob-metrics-reader). Needs --probe-address.
    #[arg(
        long,
        env = "GPUJOB_METRICS_SECURE",
        default_value_t = false,
        num_args = 0..=1,
        default_missing_value = "true",
        action = clap::ArgAction::Set
    )]
    pub metrics_secure: bool,
    /// Folder holding tls.crt and tls.key for --metrics-secure (a mounted
    /// kubernetes.io/tls Secret; re-read when they change). Default: a self-signed
    /// certificate made at start.
    #[arg(long, env = "GPUJOB_METRICS_CERT_DIR")]
    pub metrics_cert_dir: Option<std::path::PathBuf>,
    /// Folder holding tls.crt and tls.key of the CRD conversion webhook (a mounted
    /// kubernetes.io/tls Secret, e.g. from cert-manager; re-read when they change). The
    /// webhook (POST /convert on --conversion-address) runs only with it.
    #[arg(long, env = "GPUJOB_CONVERSION_CERT_DIR")]
    pub conversion_cert_dir: Option<std::path::PathBuf>,
    /// Address of the conversion webhook's HTTPS server (with --conversion-cert-dir).
    #[arg(
        long,
        env = "GPUJOB_CONVERSION_ADDRESS",
        default_value = "0.0.0.0:9443"
    )]
    pub conversion_address: std::net::SocketAddr,
    /// A GpuJob Pending this long without a running attempt (and not backing off,
    /// refused quota or invalid) counts as unconverged in the metrics.
    #[arg(long, env = "GPUJOB_UNCONVERGED_AFTER", default_value = "10m", value_parser = parse_duration)]
    pub unconverged_after: Duration,
    /// Most GPUs one GpuJob may request; a larger request is an invalid spec.
    #[arg(long, env = "GPUJOB_MAX_GPUS_PER_JOB", default_value_t = 64, value_parser = clap::value_parser!(i32).range(1..=64))]
    pub max_gpus_per_job: i32,
    /// Service accounts a GpuJob's Jobs may run as (comma-separated; `*`: any). A
    /// GpuJob naming another (or, without `default` here, naming none) is an invalid
    /// spec. The operator creates the Jobs with its own rights: this list, not the
    /// user's, decides which service accounts of a namespace GpuJobs can use.
    #[arg(
        long,
        env = "GPUJOB_ALLOWED_SERVICE_ACCOUNTS",
        value_delimiter = ',',
        default_value = "default"
    )]
    pub allowed_service_accounts: Vec<String>,
    /// Where GPU quota is reserved before a GpuJob runs: `none`, or `http` (the REST
    /// contract of docs/quota-api.md at --quota-url).
    #[arg(long, env = "GPUJOB_QUOTA_PROVIDER", value_enum, default_value_t = QuotaKind::None)]
    pub quota_provider: QuotaKind,
    /// Base URL of the quota service (`http(s)://host[:port][/prefix]`).
    #[arg(long, env = "GPUJOB_QUOTA_URL")]
    pub quota_url: Option<String>,
    /// File holding the bearer token sent to the quota service (re-read on every call).
    #[arg(long, env = "GPUJOB_QUOTA_TOKEN_FILE")]
    pub quota_token_file: Option<std::path::PathBuf>,
    /// PEM bundle of CAs to trust for an https quota service (default: system roots).
    #[arg(long, env = "GPUJOB_QUOTA_CA_FILE")]
    pub quota_ca_file: Option<std::path::PathBuf>,
    /// Timeout of each call to the quota service.
    #[arg(long, env = "GPUJOB_QUOTA_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub quota_timeout: Duration,
    /// How long releasing quota may keep failing before the GpuJob says CleanupStuck.
    #[arg(long, env = "GPUJOB_CLEANUP_TIMEOUT", default_value = "15m", value_parser = parse_duration)]
    pub cleanup_timeout: Duration,
    /// Delete finished GpuJobs (and their Jobs) this long after they finished, unless
    /// their spec says otherwise (`ttlSecondsAfterFinished`). Off by default.
    #[arg(long, env = "GPUJOB_DEFAULT_TTL_AFTER_FINISHED", value_parser = parse_duration)]
    pub default_ttl_after_finished: Option<Duration>,
    /// Log format.
    #[arg(long, env = "GPUJOB_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Contend for a Lease and act only while holding it (run several replicas).
    /// `--leader-elect=false` runs a single replica that acts at once.
    #[arg(long, env = "GPUJOB_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_elect: bool,
    /// Name of the Lease (with --shards N > 1: the prefix of `<name>-shard-<i>` and of
    /// the replicas' `<name>-member-<identity>` heartbeats).
    #[arg(long, env = "GPUJOB_LEASE_NAME", default_value = "gpujob-operator")]
    pub lease_name: String,
    /// Split GpuJobs into this many shards by ranges of `fnv1a64(namespace)`, one Lease
    /// each, balanced across the live replicas. 1: plain leader election.
    #[arg(long, env = "GPUJOB_SHARDS", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub shards: u32,
    /// Fixed cuts: where shards 1..N-1 start in the hash space, `0x…,0x…` (N-1 values,
    /// increasing). Empty: the replicas keep the cuts themselves, balanced by the
    /// GpuJobs per namespace (namespaces named alike hash close together, so equal
    /// ranges can put most of them in one shard). `gpujob-operator shard-cuts` prints
    /// cuts that balance the GpuJobs there are. Every replica must run with the same
    /// cuts (docs/ha-and-sharding.md, "The kept map").
    #[arg(long, env = "GPUJOB_SHARD_CUTS", default_value = "")]
    pub shard_cuts: String,
    /// Without --shard-cuts, the replicas keep the cuts balanced by the GpuJobs per
    /// namespace (docs/ha-and-sharding.md, "The kept map"): the least time between two
    /// re-cuts, so the map does not follow every burst. 0: this replica never re-cuts
    /// (the cuts stay where the map Lease has them; it still follows that Lease).
    #[arg(long, env = "GPUJOB_RECUT_INTERVAL", default_value = "1m", value_parser = parse_duration)]
    pub recut_interval: Duration,
    /// Where the API server selects objects by shard (docs/ha-and-sharding.md, "Sharded
    /// watches"): also list and watch the shards this replica would take if another
    /// replica went, so a takeover finds them cached. `false`: cache only the shards
    /// held (less memory; a takeover first lists the shards it takes).
    #[arg(long, env = "GPUJOB_WARM_SHARDS", default_value_t = true, action = clap::ArgAction::Set)]
    pub warm_shards: bool,
    /// Namespace of the Lease (default: $POD_NAMESPACE, else gpujob-system).
    #[arg(long, env = "GPUJOB_LEASE_NAMESPACE")]
    pub lease_namespace: Option<String>,
    /// How long a Lease nobody renews stays valid for the other replicas (whole seconds).
    #[arg(long, env = "GPUJOB_LEASE_DURATION", default_value = "15s", value_parser = parse_duration)]
    pub lease_duration: Duration,
    /// The leader steps down when no renewal succeeded for this long.
    #[arg(long, env = "GPUJOB_RENEW_DEADLINE", default_value = "10s", value_parser = parse_duration)]
    pub renew_deadline: Duration,
    /// Pause between attempts to acquire or renew the Lease.
    #[arg(long, env = "GPUJOB_RETRY_PERIOD", default_value = "2s", value_parser = parse_duration)]
    pub retry_period: Duration,
    /// Client-side limit on API requests per second (reconcile traffic; the Lease has its own).
    #[arg(long, env = "GPUJOB_API_QPS", default_value_t = 50.0)]
    pub api_qps: f64,
    /// Requests allowed in a burst above --api-qps.
    #[arg(long, env = "GPUJOB_API_BURST", default_value_t = 100)]
    pub api_burst: u32,
    /// Events written per second, on a budget of their own: Events never take requests
    /// from reconciles. When Events come faster, state changes (an attempt started or
    /// ended, the GpuJob finished, ...) queue without a limit and are written first;
    /// others queue up to 1000, identical ones counted into one, and then new ones are
    /// dropped (gpujob_events_total{result="dropped"}).
    #[arg(long, env = "GPUJOB_EVENT_QPS", default_value_t = 10.0)]
    pub event_qps: f64,
    /// Events allowed in a burst above --event-qps.
    #[arg(long, env = "GPUJOB_EVENT_BURST", default_value_t = 50)]
    pub event_burst: u32,
    /// An API request that goes this long without a byte from the API server is
    /// abandoned and its outcome re-read; watches are renewed by the server at 3/4 of it.
    #[arg(long, env = "GPUJOB_API_TIMEOUT", default_value = "60s", value_parser = parse_duration)]
    pub api_timeout: Duration,
    /// Overall limit on reconcile retries per second (on top of per-GpuJob backoff).
    #[arg(long, env = "GPUJOB_RETRY_QPS", default_value_t = 10.0)]
    pub retry_qps: f64,
    /// Retries allowed in a burst above --retry-qps.
    #[arg(long, env = "GPUJOB_RETRY_BURST", default_value_t = 100)]
    pub retry_burst: u32,
    /// The GpuJob API versions whose meaning the operator applies: `v1,v2`, or `v1` (the
    /// rollback mode: spec.v2, where a v1 object keeps what was written through v2, is
    /// ignored: no template, no GPU product, no per-GpuJob backoff; each Job is built as
    /// before v2 existed). The conversion webhook runs with --conversion-cert-dir either
    /// way.
    #[arg(long, env = "GPUJOB_API_VERSIONS", default_value = "v1,v2", value_parser = parse_api_versions)]
    pub api_versions: ApiVersions,
    /// Whether each multi-node attempt's pods are one gang, placed whole or not at all:
    /// `auto` where kube-apiserver serves PodGroups (scheduling.k8s.io/v1beta1,
    /// Kubernetes 1.37 with the feature gate GenericWorkload), asked once at start; `off`:
    /// no gangs (pods placed one by one).
    #[arg(long, env = "GPUJOB_GANG_SCHEDULING", default_value = "auto", value_parser = parse_gang_scheduling)]
    pub gang_scheduling: GangScheduling,
    /// A worker cluster of Kueue's MultiKueue, as NAME=KUBECONFIG (repeat the flag, or
    /// separate with commas in the variable, for each worker). The pods of the attempts
    /// MultiKueue dispatches there wait at the operator's gate; the operator watches,
    /// reads and lets them go with that kubeconfig's credentials (its current context),
    /// which need list, watch, patch and delete on pods and list on Jobs there,
    /// cluster-wide unless --namespace is set (deploy/multikueue-worker/). NAME names the
    /// worker in logs and errors. Give every worker of the MultiKueueConfig: the pods of
    /// an attempt dispatched to one not given are not let go. Without any, a
    /// dispatched attempt waits and says so.
    #[arg(long = "multikueue-worker", env = "GPUJOB_MULTIKUEUE_WORKERS", value_delimiter = ',', value_parser = parse_worker)]
    pub multikueue_workers: Vec<(String, PathBuf)>,
}

/// `NAME=KUBECONFIG`: a worker cluster's name and its kubeconfig file.
pub fn parse_worker(s: &str) -> Result<(String, PathBuf), String> {
    match s.split_once('=') {
        Some((name, path)) if !name.trim().is_empty() && !path.trim().is_empty() => {
            Ok((name.trim().to_owned(), PathBuf::from(path.trim())))
        }
        _ => Err(format!(
            "{s:?}: NAME=KUBECONFIG, a worker cluster's name and the path of its kubeconfig"
        )),
    }
}

/// `auto` or `off`.
pub fn parse_gang_scheduling(s: &str) -> Result<GangScheduling, String> {
    match s {
        "auto" => Ok(GangScheduling::Auto),
        "off" => Ok(GangScheduling::Off),
        _ => Err(format!("{s:?}: `auto` or `off`")),
    }
}

/// `v1,v2` (any order) or `v1`.
pub fn parse_api_versions(s: &str) -> Result<ApiVersions, String> {
    let mut versions: Vec<&str> = s.split(',').map(str::trim).collect();
    versions.sort_unstable();
    versions.dedup();
    match versions[..] {
        ["v1"] => Ok(ApiVersions::V1),
        ["v1", "v2"] => Ok(ApiVersions::V1AndV2),
        _ => Err(format!(
            "{s:?}: the operator knows `v1,v2` or, rolled back, `v1` (it works on v1 objects, so v1 is always in)"
        )),
    }
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

    /// The settings that change what a replica does to a GpuJob, as its shard Leases
    /// name them (`lease::Split`): replicas with other settings hold no shard beside it.
    pub fn split_settings(&self) -> Vec<String> {
        match self.quota_provider {
            QuotaKind::None => Vec::new(),
            QuotaKind::Http => vec!["quota-http".to_owned()],
        }
    }

    /// Whether the replicas keep the shard map (several shards, no `--shard-cuts`).
    pub fn kept_map(&self) -> bool {
        self.shards > 1 && self.shard_cuts.trim().is_empty()
    }

    /// The workers: `--workers`, else by the budget (docs/api.md): at least enough to
    /// spend `--api-qps` at 16 requests a second each (4 at the default 50), more while
    /// the API server answers slowly, up to `--api-qps` ÷ 2 (at most 256).
    pub fn workers(&self) -> Workers {
        match self.workers {
            Some(n) => Workers::Fixed(usize::from(n)),
            // 1..=256 for any finite qps above 0 (validated before use).
            None => {
                let floor = (self.api_qps / 16.0).ceil().clamp(4.0, 256.0) as usize;
                let ceiling = (self.api_qps / 2.0).ceil().clamp(floor as f64, 256.0) as usize;
                Workers::ByBudget {
                    qps: self.api_qps,
                    floor,
                    ceiling,
                }
            }
        }
    }

    /// The quota provider, checked (an `http` provider needs a URL). Needs the rustls
    /// crypto provider installed.
    pub fn quota(&self) -> Result<Provider, String> {
        match self.quota_provider {
            QuotaKind::None => Ok(Provider::None),
            QuotaKind::Http => {
                let url = self
                    .quota_url
                    .clone()
                    .ok_or("--quota-provider=http needs --quota-url (GPUJOB_QUOTA_URL)")?;
                let settings = HttpSettings {
                    base_url: url,
                    token_file: self.quota_token_file.clone(),
                    ca_file: self.quota_ca_file.clone(),
                    timeout: self.quota_timeout,
                    user_agent: crate::client::user_agent(&self.identity()),
                };
                HttpProvider::new(settings)
                    .map(Provider::Http)
                    .map_err(|e| e.to_string())
            }
        }
    }

    /// Where the HTTP servers listen and how, checked; with --metrics-secure this makes
    /// or reads the certificate. The conversion webhook is [`RunArgs::conversion`].
    pub fn listen(&self) -> Result<Listen, String> {
        if self.metrics_cert_dir.is_some() && !self.metrics_secure {
            return Err(
                "--metrics-cert-dir is used only with --metrics-secure: add it, or drop the folder"
                    .to_owned(),
            );
        }
        if self.metrics_secure && self.probe_address.is_none() {
            return Err("--metrics-secure needs --probe-address (GPUJOB_PROBE_ADDRESS), e.g. 0.0.0.0:8081: the kubelet's probes carry no token, so /healthz and /readyz are served over plain HTTP on a port of their own".to_owned());
        }
        if self.probe_address == Some(self.listen_address) && self.listen_address.port() != 0 {
            return Err(format!(
                "--probe-address and --listen-address are both {}: give the probes another port",
                self.listen_address
            ));
        }
        let ports = [
            ("--listen-address", Some(self.listen_address)),
            ("--probe-address", self.probe_address),
        ];
        if self.conversion_cert_dir.is_some() && self.conversion_address.port() != 0 {
            for (flag, addr) in ports {
                if addr.map(|a| a.port()) == Some(self.conversion_address.port()) {
                    return Err(format!(
                        "--conversion-address and {flag} both use port {}: give the webhook another port",
                        self.conversion_address.port()
                    ));
                }
            }
        }
        let tls = if self.metrics_secure {
            Some(crate::server::tls::server_config(
                self.metrics_cert_dir.as_deref(),
            )?)
        } else {
            None
        };
        Ok(Listen {
            metrics: self.listen_address,
            probes: self.probe_address,
            tls,
            conversion: None,
        })
    }

    /// The conversion webhook, when --conversion-cert-dir is given: reads the
    /// certificate now, so a missing or broken one stops the start with the reason.
    pub fn conversion(&self) -> Result<Option<Webhook>, String> {
        match &self.conversion_cert_dir {
            Some(dir) => {
                let (tls, certificates) = crate::server::tls::webhook_tls(dir)?;
                Ok(Some(Webhook {
                    address: self.conversion_address,
                    tls,
                    certificates,
                }))
            }
            None => Ok(None),
        }
    }

    /// How namespaces map to shards: `--shards` ranges, cut at `--shard-cuts`.
    pub fn shard_map(&self) -> Result<crate::shard::ShardMap, String> {
        crate::shard::ShardMap::parse(&self.shard_cuts, self.shards)
            .map_err(|e| format!("--shard-cuts: {e}"))
    }

    pub fn lease_namespace(&self) -> String {
        self.lease_namespace
            .clone()
            .or_else(|| std::env::var("POD_NAMESPACE").ok())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "gpujob-system".to_owned())
    }

    /// Lease timing, checked (duration > renew deadline > 1.2 × retry period).
    pub fn timing(&self) -> Result<Timing, String> {
        let t = Timing {
            lease_duration: self.lease_duration,
            renew_deadline: self.renew_deadline,
            retry_period: self.retry_period,
        };
        t.validate()?;
        Ok(t)
    }

    pub fn limits(&self) -> Result<Limits, String> {
        if self.api_qps.is_nan() || self.api_qps <= 0.0 || self.api_burst == 0 {
            return Err("--api-qps and --api-burst must be greater than zero".to_owned());
        }
        if self.api_timeout < Duration::from_secs(2) {
            return Err(format!(
                "--api-timeout ({:?}) must be at least 2s: watches are renewed at 3/4 of it",
                self.api_timeout
            ));
        }
        Ok(Limits {
            qps: self.api_qps,
            burst: self.api_burst,
            timeout: self.api_timeout,
        })
    }

    /// The Events client's limits: its own budget, the API client's timeout.
    pub fn event_limits(&self) -> Result<Limits, String> {
        if self.event_qps.is_nan() || self.event_qps <= 0.0 || self.event_burst == 0 {
            return Err("--event-qps and --event-burst must be greater than zero".to_owned());
        }
        Ok(Limits {
            qps: self.event_qps,
            burst: self.event_burst,
            ..self.limits()?
        })
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
        if self.retry_qps.is_nan() || self.retry_qps <= 0.0 || self.retry_burst == 0 {
            return Err("--retry-qps and --retry-burst must be greater than zero".to_owned());
        }
        if self.resync.is_zero() {
            return Err("--resync must be greater than zero".to_owned());
        }
        let mut names: Vec<&str> = self
            .multikueue_workers
            .iter()
            .map(|(n, _)| n.as_str())
            .collect();
        names.sort_unstable();
        if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
            return Err(format!(
                "--multikueue-worker names {} twice: each worker cluster needs a name of its own",
                w[0]
            ));
        }
        if self.shards > 1 && !self.leader_elect {
            return Err(format!(
                "--shards {} needs leader election: without it one replica works on every GpuJob",
                self.shards
            ));
        }
        Ok(Settings {
            namespace: self.namespace.clone(),
            workers: self.workers(),
            plan: PlanSettings {
                backoff_base: self.retry_backoff_base,
                backoff_max: self.retry_backoff_max,
                keep_jobs: self.keep_jobs,
                limits: SpecLimits {
                    max_gpus: self.max_gpus_per_job,
                    service_accounts: ServiceAccounts::parse(&self.allowed_service_accounts)?,
                },
                cleanup_timeout: self.cleanup_timeout,
                default_ttl: self.default_ttl_after_finished,
                api_versions: self.api_versions,
                ..PlanSettings::default()
            },
            identity: self.identity(),
            quota: self.quota()?,
            watch_timeout: crate::client::watch_timeout(self.api_timeout),
            warm_shards: self.warm_shards,
            gang_scheduling: self.gang_scheduling,
            load: if self.kept_map() {
                Load::counted()
            } else {
                Load::default()
            },
            resync: self.resync,
            unconverged_after: self.unconverged_after,
            retry: Backoff {
                qps: self.retry_qps,
                burst: self.retry_burst,
                ..Backoff::default()
            },
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
        assert!(s.retry.qps > 0.0);
    }

    #[test]
    fn workers_follow_the_api_budget_unless_given() {
        let workers = |args: &[&str]| {
            let mut all = vec!["gpujob-operator", "run"];
            all.extend_from_slice(args);
            let Command::Run(run) = Cli::try_parse_from(all).unwrap().command else {
                panic!("run")
            };
            match run.settings().unwrap().workers {
                Workers::ByBudget { floor, ceiling, .. } => (floor, ceiling),
                Workers::Fixed(n) => (n, 0),
            }
        };
        assert_eq!(workers(&[]), (4, 25), "the default 50 qps");
        assert_eq!(workers(&["--api-qps", "2000"]), (125, 256));
        assert_eq!(workers(&["--api-qps", "100"]), (7, 50));
        assert_eq!(workers(&["--api-qps", "5"]), (4, 4), "never below 4");
        assert_eq!(
            workers(&["--api-qps", "100000"]),
            (256, 256),
            "never above 256"
        );
        assert_eq!(workers(&["--api-qps", "2000", "--workers", "8"]), (8, 0));
    }

    #[test]
    fn lease_flags_are_checked() {
        let parse = |args: &[&str]| {
            let mut all = vec!["gpujob-operator", "run"];
            all.extend_from_slice(args);
            match Cli::try_parse_from(all).unwrap().command {
                Command::Run(a) => *a,
                _ => panic!("run"),
            }
        };
        let a = parse(&[]);
        assert!(a.leader_elect);
        assert_eq!(a.timing().unwrap(), Timing::default());
        assert!(!parse(&["--leader-elect=false"]).leader_elect);
        let bad = parse(&["--lease-duration", "5s", "--renew-deadline", "5s"]);
        assert!(bad.timing().unwrap_err().contains("renew deadline"));
        assert!(parse(&["--api-qps", "0"]).limits().is_err());
        assert!(parse(&["--event-qps", "0"]).event_limits().is_err());
        let events = parse(&["--event-qps", "3", "--event-burst", "7"]).event_limits();
        assert_eq!(events.map(|l| (l.qps, l.burst)), Ok((3.0, 7)));
        assert!(parse(&["--api-timeout", "1s"]).limits().is_err());
        let a = parse(&["--api-timeout", "20s"]);
        assert_eq!(a.limits().unwrap().timeout, Duration::from_secs(20));
        assert_eq!(a.settings().unwrap().watch_timeout, Duration::from_secs(15));
    }

    fn run_args(args: &[&str]) -> RunArgs {
        let mut all = vec!["gpujob-operator", "run"];
        all.extend_from_slice(args);
        match Cli::try_parse_from(all).unwrap().command {
            Command::Run(a) => *a,
            _ => panic!("run"),
        }
    }

    #[test]
    fn one_plain_server_unless_asked_otherwise() {
        let l = run_args(&[]).listen().unwrap();
        assert_eq!(l.metrics, "0.0.0.0:8080".parse().unwrap());
        assert!(l.probes.is_none() && l.tls.is_none());
        let l = run_args(&["--probe-address", "0.0.0.0:8081"])
            .listen()
            .unwrap();
        assert_eq!(l.probes, Some("0.0.0.0:8081".parse().unwrap()));
        assert!(l.tls.is_none());
    }

    #[test]
    fn secure_metrics_need_their_probes_elsewhere() {
        let err = run_args(&["--metrics-secure"]).listen().unwrap_err();
        assert!(err.contains("--probe-address"), "{err}");
        let l = run_args(&["--metrics-secure", "--probe-address", "0.0.0.0:8081"])
            .listen()
            .unwrap();
        assert!(l.tls.is_some(), "self-signed");
        let l = run_args(&["--metrics-secure=false"]).listen().unwrap();
        assert!(l.tls.is_none());
        let err = run_args(&["--metrics-cert-dir", "/certs"])
            .listen()
            .unwrap_err();
        assert!(err.contains("only with --metrics-secure"), "{err}");
        let err = run_args(&["--probe-address", "0.0.0.0:8080"])
            .listen()
            .unwrap_err();
        assert!(err.contains("another port"), "{err}");
    }

    #[test]
    fn the_conversion_webhook_runs_only_with_its_certificate() {
        assert!(
            run_args(&[]).conversion().unwrap().is_none(),
            "off without --conversion-cert-dir"
        );
        let err = run_args(&["--conversion-cert-dir", "/nonexistent/certs"])
            .conversion()
            .unwrap_err();
        assert!(
            err.contains("--conversion-cert-dir /nonexistent/certs"),
            "{err}"
        );
        let err = run_args(&[
            "--conversion-cert-dir",
            "/nonexistent/certs",
            "--conversion-address",
            "0.0.0.0:8080",
        ])
        .listen()
        .unwrap_err();
        assert!(err.contains("--listen-address both use port 8080"), "{err}");
    }

    #[test]
    fn api_versions_are_v1_and_v2_unless_rolled_back() {
        let s = |args: &[&str]| run_args(args).settings().unwrap().plan.api_versions;
        assert_eq!(s(&[]), ApiVersions::V1AndV2);
        assert_eq!(s(&["--api-versions=v1"]), ApiVersions::V1);
        assert_eq!(s(&["--api-versions", "v2,v1"]), ApiVersions::V1AndV2);
        for bad in ["v2", "v3", "", "v1,v3"] {
            let err = Cli::try_parse_from(["gpujob-operator", "run", "--api-versions", bad])
                .unwrap_err()
                .to_string();
            assert!(err.contains("v1"), "{bad}: {err}");
        }
    }

    #[test]
    fn the_crd_of_step_two_stores_v2() {
        let crd = |args: &[&str]| {
            let mut all = vec!["gpujob-operator", "crd"];
            all.extend_from_slice(args);
            match Cli::try_parse_from(all).map(|c| c.command) {
                Ok(Command::Crd(a)) => a.options(),
                Ok(_) => panic!("crd"),
                Err(e) => Err(e.to_string()),
            }
        };
        use crate::api::StorageVersion;
        assert_eq!(crd(&[]).unwrap().storage, StorageVersion::V1);
        assert_eq!(
            crd(&["--storage-version", "v2"]).unwrap().storage,
            StorageVersion::V2
        );
        assert!(crd(&["--storage-version", "v2", "--v1-only"]).is_err());
    }

    #[test]
    fn migrate_storage_is_paced_and_checked() {
        let parse = |args: &[&str]| {
            let mut all = vec!["gpujob-operator", "migrate-storage"];
            all.extend_from_slice(args);
            match Cli::try_parse_from(all).unwrap().command {
                Command::MigrateStorage(a) => a,
                _ => panic!("migrate-storage"),
            }
        };
        let (options, limits) = parse(&[]).options().unwrap();
        assert_eq!((limits.qps, limits.burst), (10.0, 1));
        assert_eq!((options.page_size, options.limit), (100, None));
        let (options, _) = parse(&["--limit", "3", "--page-size", "2"])
            .options()
            .unwrap();
        assert_eq!((options.page_size, options.limit), (2, Some(3)));
        assert!(
            parse(&["--qps", "0"])
                .options()
                .unwrap_err()
                .contains("--qps")
        );
    }
}
