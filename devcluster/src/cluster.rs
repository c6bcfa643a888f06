//! The control plane: etcd, kube-apiserver, kube-controller-manager and kube-scheduler
//! as child processes on free loopback ports, fake GPU nodes for the scheduler to place
//! pods on (and, when asked, fake DRA devices on them), and kwok, which plays their
//! kubelet.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde::{Deserialize, Serialize};

use crate::assets::Assets;
use crate::audit::{AuditLog, POLICY};
use crate::dra::{self, DraDevices};
use crate::gang::{self, GangScheduling};
use crate::identity::Identity;
use crate::metrics::Metrics;
use crate::nodes::GpuNodes;
use crate::pki::Pki;
use crate::process::{self, GRACE, Guard, Supervised};
use crate::{Error, kwok, wait};

/// Names the state folder of a running control plane to attach to (see
/// [`ControlPlane::for_tests`]).
pub const STATE_DIR_ENV: &str = "DEVCLUSTER_DIR";
const INFO_FILE: &str = "cluster.json";
const FIELD_MANAGER: &str = "devcluster";
/// Users that are not [`Identity`]s but get their own token, so the audit log tells
/// their writes apart from everyone else's.
const KCM_USER: &str = "system:kube-controller-manager";
const SCHEDULER_USER: &str = "system:kube-scheduler";
const KWOK_USER: &str = "devcluster:kwok";

/// The Kubernetes minor version with the `ShardedListAndWatch` feature gate.
const SHARDED_WATCH_SINCE: u32 = 36;

/// How to start a control plane.
#[derive(Debug, Clone)]
pub struct Options {
    /// Where keys, kubeconfigs, logs, etcd data and the audit log go. `None`: a fresh
    /// temporary folder, removed on drop (kept when a panic is unwinding, for its logs).
    /// A given folder is emptied at start, after stale processes recorded there are ended.
    pub state_dir: Option<PathBuf>,
    /// CRD manifests (YAML, one or more documents each), installed and Established
    /// before kube-controller-manager starts, so its garbage collector knows them.
    pub crds: Vec<PathBuf>,
    /// How many `replica-N` users to create.
    pub replicas: u8,
    /// Run kwok as the kubelet of the fake nodes (a child process), so bound pods
    /// run and end; without it they stay Pending once scheduled.
    pub pod_simulator: bool,
    /// The fake GPU nodes kube-scheduler places pods on.
    pub gpu_nodes: GpuNodes,
    /// Upper bound for the whole start-up.
    pub startup_timeout: Duration,
    /// Turn on kube-apiserver's sharded list and watch (feature gate
    /// `ShardedListAndWatch`, alpha since 1.36, off by default there) where the binaries
    /// have it: lists and watches may then select objects by a hash range of their
    /// namespace or uid. Before 1.36 the gate does not exist (and naming it is an error).
    pub sharded_watch: bool,
    /// Publish fake DRA devices for the fake GPU nodes ([`crate::dra`]): a DeviceClass
    /// and one ResourceSlice per node, and run kube-controller-manager's ResourceClaim
    /// controller, so pods that claim devices are allocated them by kube-scheduler.
    /// Needs `resource.k8s.io/v1` (Kubernetes 1.34 or later). `None`: none of it.
    pub dra: Option<DraDevices>,
    /// Turn on workload-aware (gang) scheduling ([`crate::gang`]): its feature gates on
    /// kube-apiserver, kube-controller-manager and kube-scheduler, the API
    /// `scheduling.k8s.io/v1beta1` (Workload, PodGroup) and the PodGroup protection
    /// controller. Needs Kubernetes 1.37 or later. `None`: none of it.
    pub gang: Option<GangScheduling>,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            state_dir: None,
            crds: Vec::new(),
            replicas: 3,
            pod_simulator: true,
            gpu_nodes: GpuNodes::default(),
            startup_timeout: Duration::from_secs(120),
            sharded_watch: true,
            dra: None,
            gang: None,
        }
    }
}

/// What another process needs to use a running control plane; written to
/// `<state>/cluster.json` once it is ready.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClusterInfo {
    pub state_dir: PathBuf,
    /// `https://127.0.0.1:<port>`
    pub server: String,
    pub ca_file: PathBuf,
    pub audit_log: PathBuf,
    pub replicas: u8,
    /// Process ids of etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
    /// kwok (when it runs) and the guard.
    pub pids: BTreeMap<String, u32>,
    /// Seconds from start to ready.
    pub startup_seconds: f64,
}

impl ClusterInfo {
    pub fn kubeconfig(&self, who: Identity) -> PathBuf {
        kubeconfig_path(&self.state_dir, &who.file_stem())
    }
}

fn kubeconfig_path(state_dir: &Path, stem: &str) -> PathBuf {
    state_dir
        .join("kubeconfig")
        .join(format!("{stem}.kubeconfig"))
}

/// A running control plane, owned (started by this process, stopped on drop) or
/// attached (started by another process; dropping it changes nothing).
#[derive(Debug)]
pub struct ControlPlane {
    info: ClusterInfo,
    owned: Option<Owned>,
}

#[derive(Debug)]
struct Owned {
    // Field order is drop order: kwok first, guard last.
    kwok: Option<Supervised>,
    scheduler: Option<Supervised>,
    kcm: Option<Supervised>,
    apiserver: Supervised,
    apiserver_args: Vec<OsString>,
    assets: Assets,
    etcd: Supervised,
    guard: Guard,
    remove_state_dir: bool,
}

impl ControlPlane {
    /// The control plane for a test: the one named by `DEVCLUSTER_DIR` when set (one per
    /// test run, see `scripts/test.sh`), which must already have `crds` installed;
    /// otherwise a private one for this process with `crds` installed.
    pub async fn for_tests(crds: &[&Path]) -> Result<ControlPlane, Error> {
        crate::install_crypto_provider();
        match std::env::var_os(STATE_DIR_ENV) {
            Some(dir) => {
                let mut cluster = ControlPlane::attach(Path::new(&dir))?;
                cluster.wait_ready(Duration::from_secs(10)).await?;
                let api: Api<CustomResourceDefinition> =
                    Api::all(cluster.client(Identity::Admin).await?);
                for path in crds {
                    for crd in load_crds(path)? {
                        let name = crd.metadata.name.unwrap_or_default();
                        if api
                            .get_opt(&name)
                            .await
                            .map_err(Error::kube(format!("reading CRD {name}")))?
                            .is_none()
                        {
                            return Err(Error::invalid(
                                format!("control plane {}", dir.to_string_lossy()),
                                format!(
                                    "CRD {name} from {} is not installed; start it with --crd {}",
                                    path.display(),
                                    path.display()
                                ),
                            ));
                        }
                    }
                }
                Ok(cluster)
            }
            None => {
                ControlPlane::start(Options {
                    crds: crds.iter().map(|p| p.to_path_buf()).collect(),
                    gpu_nodes: GpuNodes::for_tests(),
                    ..Options::default()
                })
                .await
            }
        }
    }

    /// Attaches to a control plane started by another process from its state folder.
    pub fn attach(state_dir: &Path) -> Result<ControlPlane, Error> {
        let path = state_dir.join(INFO_FILE);
        let text = std::fs::read_to_string(&path).map_err(Error::io(format!(
            "reading {} (is a control plane running there? start one with `devcluster up --state-dir {}`)",
            path.display(),
            state_dir.display()
        )))?;
        let info: ClusterInfo = serde_json::from_str(&text)
            .map_err(|e| Error::invalid(format!("parsing {}", path.display()), e))?;
        Ok(ControlPlane { info, owned: None })
    }

    /// Starts a control plane and returns once it is ready: `/readyz` answers, the CRDs
    /// are Established, and the `default` service account has its token.
    pub async fn start(opts: Options) -> Result<ControlPlane, Error> {
        crate::install_crypto_provider();
        let started = Instant::now();
        let (state_dir, remove_state_dir) = match &opts.state_dir {
            Some(d) => (absolute(d)?, false),
            None => (temp_state_dir()?, true),
        };
        if state_dir.to_str().is_none() {
            return Err(Error::invalid(
                "state folder",
                format!("{} is not UTF-8", state_dir.display()),
            ));
        }
        for ended in process::end_stale(&state_dir) {
            tracing::warn!(
                "ended stale process {ended} left by an earlier run in {}",
                state_dir.display()
            );
        }
        if state_dir.exists() {
            std::fs::remove_dir_all(&state_dir)
                .map_err(Error::io(format!("emptying {}", state_dir.display())))?;
        }
        for sub in ["", "kubeconfig", "logs", "etcd"] {
            let d = state_dir.join(sub);
            std::fs::create_dir_all(&d).map_err(Error::io(format!("creating {}", d.display())))?;
        }

        let assets = Assets::locate()?;
        let minor = assets.minor_version();
        if let Some(devices) = &opts.dra {
            // Refused before anything starts, with the reason, rather than as a 404 on
            // the first ResourceSlice once the control plane is up.
            if let Some(minor) = minor.filter(|m| *m < dra::SERVED_SINCE) {
                return Err(Error::invalid(
                    "fake DRA devices",
                    format!(
                        "Kubernetes 1.{minor} does not serve resource.k8s.io/v1 (1.{} and later do)",
                        dra::SERVED_SINCE
                    ),
                ));
            }
            // Built once here only to fail now on a product without memory (or too
            // many GPUs for a slice), not after the control plane has started.
            devices.slices(&opts.gpu_nodes)?;
        }
        if opts.gang.is_some() {
            // Refused before anything starts: on an older release the flags would name
            // gates and an API version its components do not know.
            GangScheduling::check(minor)?;
        }
        let gates = |with: Vec<String>| -> Option<String> {
            let mut all = with;
            if let Some(g) = &opts.gang {
                all.extend(g.feature_gates().iter().map(|g| format!("{g}=true")));
            }
            (!all.is_empty()).then(|| format!("--feature-gates={}", all.join(",")))
        };
        // Found before anything starts, so a missing binary fails fast with the fix.
        let kwok_binary = if opts.pod_simulator {
            Some(kwok::locate()?)
        } else {
            None
        };
        let pki = Pki::ensure(&state_dir.join("pki"))?;
        let ports =
            crate::ports::free_distinct(3).map_err(Error::io("finding a free loopback port"))?;
        let [etcd_port, etcd_peer_port, apiserver_port] = [ports[0], ports[1], ports[2]];
        let server = format!("https://127.0.0.1:{apiserver_port}");

        // Tokens, one per identity plus the controller manager, the scheduler and kwok.
        let mut users: Vec<(String, String, Vec<&str>)> = Identity::all(opts.replicas)
            .into_iter()
            .map(|id| (id.file_stem(), id.username(), id.groups()))
            .collect();
        users.push((
            "kube-controller-manager".into(),
            KCM_USER.into(),
            vec!["system:masters"],
        ));
        users.push((
            "kube-scheduler".into(),
            SCHEDULER_USER.into(),
            vec!["system:masters"],
        ));
        users.push(("kwok".into(), KWOK_USER.into(), vec!["system:masters"]));
        let mut token_csv = String::new();
        for (i, (stem, user, groups)) in users.iter().enumerate() {
            let token = random_hex(16)?;
            token_csv.push_str(&format!(
                "{token},{user},uid-{i},\"{}\"\n",
                groups.join(",")
            ));
            write(
                &kubeconfig_path(&state_dir, stem),
                &kubeconfig_yaml(&server, &pki.ca_cert, stem, &token),
            )?;
        }
        let token_file = state_dir.join("tokens.csv");
        write(&token_file, &token_csv)?;
        let audit_policy = state_dir.join("audit-policy.yaml");
        write(&audit_policy, POLICY)?;
        let audit_log = state_dir.join("audit.log");

        let guard = Guard::spawn()?;
        let mut etcd_cmd = Command::new(assets.etcd());
        etcd_cmd.args([
            "--name=devcluster".to_owned(),
            format!("--data-dir={}", state_dir.join("etcd").display()),
            format!("--listen-client-urls=http://127.0.0.1:{etcd_port}"),
            format!("--advertise-client-urls=http://127.0.0.1:{etcd_port}"),
            format!("--listen-peer-urls=http://127.0.0.1:{etcd_peer_port}"),
            format!("--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer_port}"),
            format!("--initial-cluster=devcluster=http://127.0.0.1:{etcd_peer_port}"),
            // Tests never need durability across a power cut; fsync dominates write
            // latency on shared disks.
            "--unsafe-no-fsync".to_owned(),
            "--log-level=warn".to_owned(),
        ]);
        let mut etcd = Supervised::spawn("etcd", etcd_cmd, &state_dir, &guard)?;
        let deadline = started + opts.startup_timeout;
        wait_tcp(&mut etcd, etcd_port, deadline)?;

        let apiserver_args: Vec<OsString> = [
            format!("--etcd-servers=http://127.0.0.1:{etcd_port}"),
            "--bind-address=127.0.0.1".to_owned(),
            format!("--secure-port={apiserver_port}"),
            format!("--cert-dir={}", state_dir.join("pki").display()),
            format!("--tls-cert-file={}", pki.serving_cert.display()),
            format!("--tls-private-key-file={}", pki.serving_key.display()),
            "--service-account-issuer=https://kubernetes.default.svc".to_owned(),
            format!("--service-account-key-file={}", pki.sa_pub.display()),
            format!(
                "--service-account-signing-key-file={}",
                pki.sa_key.display()
            ),
            format!("--token-auth-file={}", token_file.display()),
            "--authorization-mode=RBAC".to_owned(),
            "--service-cluster-ip-range=10.0.0.0/24".to_owned(),
            // No kube-proxy routes a ClusterIP here: a webhook or APIService named by its
            // Service is called at an address of its EndpointSlices instead, so a test can
            // point a Service at a process on this machine (tests/integration/install.rs).
            "--enable-aggregator-routing=true".to_owned(),
            // No kubernetes Service endpoints to keep: nothing here routes to them, and
            // their periodic writes would be noise in the audit log.
            "--endpoint-reconciler-type=none".to_owned(),
            format!("--audit-policy-file={}", audit_policy.display()),
            format!("--audit-log-path={}", audit_log.display()),
            "--audit-log-mode=blocking".to_owned(),
            "--audit-log-format=json".to_owned(),
            // Never rotate (0 would mean lumberjack's 100 MB): audit cursors are byte
            // offsets into this one file, and a load test writes far more than 100 MB.
            "--audit-log-maxsize=1048576".to_owned(),
            "--profiling=false".to_owned(),
        ]
        .into_iter()
        .chain(gates(
            minor
                .is_some_and(|minor| minor >= SHARDED_WATCH_SINCE)
                .then(|| format!("ShardedListAndWatch={}", opts.sharded_watch))
                .into_iter()
                .collect(),
        ))
        .chain(
            opts.gang
                .is_some()
                .then(|| format!("--runtime-config={}", GangScheduling::runtime_config())),
        )
        .map(OsString::from)
        .collect();
        let apiserver = spawn_apiserver(&assets, &apiserver_args, &state_dir, &guard)?;

        let owned = Owned {
            kwok: None,
            scheduler: None,
            kcm: None,
            apiserver,
            apiserver_args,
            assets,
            etcd,
            guard,
            remove_state_dir,
        };
        let info = ClusterInfo {
            state_dir: state_dir.clone(),
            server,
            ca_file: pki.ca_cert.clone(),
            audit_log,
            replicas: opts.replicas,
            pids: BTreeMap::new(),
            startup_seconds: 0.0,
        };
        // From here on a failure drops `cluster`, which stops what has started.
        let mut cluster = ControlPlane {
            info,
            owned: Some(owned),
        };
        cluster.wait_ready(remaining(deadline)).await?;
        cluster
            .install_crds(&opts.crds, remaining(deadline))
            .await?;

        let kcm_cmd = {
            let mut c = Command::new(cluster.owned()?.assets.kube_controller_manager());
            c.args([
                format!(
                    "--kubeconfig={}",
                    kubeconfig_path(&state_dir, "kube-controller-manager").display()
                ),
                // endpointslice: a multi-node attempt's headless Service lists its pods
                // under their host names, as the cluster DNS would serve them. podgc:
                // a node marked out of service (node.kubernetes.io/out-of-service) that
                // is not Ready has its terminating pods deleted, as on a real cluster
                // (`nodes::lose` makes a node so). resourceclaim-controller, with the fake
                // DRA devices only: it makes a pod's claims from its templates and frees
                // them once the pod is done. podgroup-protection-controller, with gang
                // scheduling only: kube-apiserver puts a finalizer on every PodGroup,
                // which it alone removes (without it no PodGroup, nor its namespace,
                // would ever go).
                format!(
                    "--controllers=job,garbagecollector,namespace,serviceaccount,serviceaccount-token,clusterrole-aggregation,endpointslice,podgc{}{}",
                    if opts.dra.is_some() {
                        ",resourceclaim-controller"
                    } else {
                        ""
                    },
                    if opts.gang.is_some() {
                        format!(",{}", gang::PROTECTION_CONTROLLER)
                    } else {
                        String::new()
                    }
                ),
                "--leader-elect=false".to_owned(),
                "--secure-port=0".to_owned(),
                format!(
                    "--service-account-private-key-file={}",
                    pki.sa_key.display()
                ),
                format!("--root-ca-file={}", pki.ca_cert.display()),
                "--use-service-account-credentials=false".to_owned(),
                // Its default client budget (20 qps) makes the Job controller the
                // bottleneck of every test that runs a few hundred Jobs at once.
                "--kube-api-qps=300".to_owned(),
                "--kube-api-burst=600".to_owned(),
            ]);
            c.args(gates(Vec::new()));
            c
        };
        {
            let owned = cluster.owned_mut()?;
            owned.kcm = Some(Supervised::spawn(
                "kube-controller-manager",
                kcm_cmd,
                &state_dir,
                &owned.guard,
            )?);
        }
        cluster
            .wait_default_service_account(remaining(deadline))
            .await?;

        // The nodes (and their devices) exist before the scheduler starts, so its first
        // pass sees them.
        opts.gpu_nodes
            .apply(cluster.client(Identity::Admin).await?)
            .await?;
        if let Some(devices) = &opts.dra {
            devices
                .apply(cluster.client(Identity::Admin).await?, &opts.gpu_nodes)
                .await?;
        }
        let scheduler_config = state_dir.join("kube-scheduler.yaml");
        write(
            &scheduler_config,
            &scheduler_config_yaml(&kubeconfig_path(&state_dir, "kube-scheduler")),
        )?;
        let scheduler_cmd = {
            let mut c = Command::new(cluster.owned()?.assets.kube_scheduler());
            c.args([
                format!("--config={}", scheduler_config.display()),
                // No serving port: nothing scrapes it, and a fixed default port would
                // collide with a second control plane on the machine.
                "--secure-port=0".to_owned(),
            ]);
            c.args(gates(Vec::new()));
            c
        };
        {
            let owned = cluster.owned_mut()?;
            owned.scheduler = Some(Supervised::spawn(
                "kube-scheduler",
                scheduler_cmd,
                &state_dir,
                &owned.guard,
            )?);
        }

        if let Some(binary) = kwok_binary {
            let config = state_dir.join("kwok.yaml");
            write(&config, &kwok::config_yaml())?;
            let cmd = kwok::command(
                &binary,
                &kubeconfig_path(&state_dir, "kwok"),
                &config,
                &state_dir.join("kwok"),
            );
            let owned = cluster.owned_mut()?;
            let mut kwok = Supervised::spawn("kwok", cmd, &state_dir, &owned.guard)?;
            // Logged once kwok has read its Stages and reached the API server: a bad
            // Stage file fails the start here, not as pods that never move.
            let started = wait_log(&mut kwok, "Watch nodes", deadline);
            owned.kwok = Some(kwok);
            started?;
        }
        let pids = {
            let o = cluster.owned()?;
            let mut pids = BTreeMap::new();
            for s in [
                Some(&o.etcd),
                Some(&o.apiserver),
                o.kcm.as_ref(),
                o.scheduler.as_ref(),
                o.kwok.as_ref(),
            ]
            .into_iter()
            .flatten()
            {
                pids.insert(s.name().to_owned(), s.pid());
            }
            if let Some(pid) = o.guard.pid() {
                pids.insert("guard".to_owned(), pid);
            }
            pids
        };
        cluster.info.pids = pids;
        cluster.info.startup_seconds = started.elapsed().as_secs_f64();
        let json = serde_json::to_string_pretty(&cluster.info)
            .map_err(|e| Error::invalid("writing cluster.json", e))?;
        write_atomic(&state_dir.join(INFO_FILE), &json)?;
        tracing::info!(
            "control plane ready at {} in {:.1}s (state in {})",
            cluster.info.server,
            cluster.info.startup_seconds,
            state_dir.display()
        );
        Ok(cluster)
    }

    pub fn info(&self) -> &ClusterInfo {
        &self.info
    }

    pub fn kubeconfig(&self, who: Identity) -> PathBuf {
        self.info.kubeconfig(who)
    }

    /// A client config for `who`, with a User-Agent naming devcluster and the identity.
    pub async fn config(&self, who: Identity) -> Result<kube::Config, Error> {
        self.config_for(
            &self.kubeconfig(who),
            &format!("devcluster-test/{}", who.file_stem()),
        )
        .await
    }

    pub(crate) async fn config_for(
        &self,
        kubeconfig: &Path,
        user_agent: &str,
    ) -> Result<kube::Config, Error> {
        let kc = Kubeconfig::read_from(kubeconfig)
            .map_err(|e| Error::invalid(format!("reading {}", kubeconfig.display()), e))?;
        let mut config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .map_err(|e| Error::invalid(format!("loading {}", kubeconfig.display()), e))?;
        let value =
            http::HeaderValue::from_str(user_agent).map_err(|e| Error::invalid("user agent", e))?;
        config.headers.push((http::header::USER_AGENT, value));
        Ok(config)
    }

    /// A kubeconfig (as text) for service account `name` in `namespace`, which must
    /// exist: a token minted for it by the TokenRequest API, valid for `valid_for`, and
    /// the CA inline (`certificate-authority-data`), no file paths. What a client that
    /// runs elsewhere is handed, e.g. Kueue's MultiKueue on another cluster, which
    /// refuses a kubeconfig naming files.
    pub async fn service_account_kubeconfig(
        &self,
        namespace: &str,
        name: &str,
        valid_for: Duration,
    ) -> Result<String, Error> {
        use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
        let accounts: Api<ServiceAccount> =
            Api::namespaced(self.client(Identity::Admin).await?, namespace);
        let request = TokenRequest {
            spec: Some(TokenRequestSpec {
                expiration_seconds: i64::try_from(valid_for.as_secs()).ok(),
                ..TokenRequestSpec::default()
            }),
            ..TokenRequest::default()
        };
        let minted = accounts
            .create_token_request(name, &PostParams::default(), &request)
            .await
            .map_err(Error::kube(format!(
                "minting a token for service account {namespace}/{name}"
            )))?;
        let token = minted
            .status
            .and_then(|s| s.token)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| {
                Error::invalid(
                    format!("the token of service account {namespace}/{name}"),
                    "the TokenRequest came back without a token",
                )
            })?;
        let ca = std::fs::read(&self.info.ca_file).map_err(Error::io(format!(
            "reading {}",
            self.info.ca_file.display()
        )))?;
        // ByteString serializes as base64, the encoding kubeconfig's *-data fields take.
        let ca_data = serde_json::to_value(k8s_openapi::ByteString(ca))
            .map_err(|e| Error::invalid("encoding the CA", e))?;
        let user = format!("system:serviceaccount:{namespace}:{name}");
        // JSON is YAML: every kubeconfig reader takes it.
        let kubeconfig = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "devcluster", "cluster": {
                "server": self.info.server,
                "certificate-authority-data": ca_data,
            }}],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": "devcluster", "context": {"cluster": "devcluster", "user": user}}],
            "current-context": "devcluster",
        });
        serde_json::to_string_pretty(&kubeconfig).map_err(|e| Error::invalid("a kubeconfig", e))
    }

    /// A client acting as `who`.
    pub async fn client(&self, who: Identity) -> Result<kube::Client, Error> {
        kube::Client::try_from(self.config(who).await?)
            .map_err(Error::kube(format!("client for {who}")))
    }

    /// Creates a namespace `<prefix>-<random>` for one test and returns its name.
    pub async fn create_namespace(&self, prefix: &str) -> Result<String, Error> {
        let name = format!("{prefix}-{}", random_hex(3)?);
        let api: Api<Namespace> = Api::all(self.client(Identity::Admin).await?);
        let mut ns = Namespace::default();
        ns.metadata.name = Some(name.clone());
        ns.metadata.labels = Some([("devcluster.dev/test".to_owned(), prefix.to_owned())].into());
        api.create(&PostParams::default(), &ns)
            .await
            .map_err(Error::kube(format!("creating namespace {name}")))?;
        Ok(name)
    }

    /// The API server's audit log (writes only).
    pub fn audit(&self) -> AuditLog {
        AuditLog::new(&self.info.audit_log)
    }

    /// A scrape of kube-apiserver's own `/metrics`.
    pub async fn apiserver_metrics(&self) -> Result<Metrics, Error> {
        let client = self.client(Identity::Admin).await?;
        let req = http::Request::get("/metrics")
            .body(Vec::new())
            .map_err(|e| Error::invalid("building /metrics request", e))?;
        let text = client
            .request_text(req)
            .await
            .map_err(Error::kube("GET /metrics"))?;
        Metrics::parse(&text)
    }

    /// A command with `KUBECONFIG` set to `who`'s kubeconfig, and kubectl's cache in the
    /// cluster's state folder.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>, who: Identity) -> Command {
        let mut cmd = Command::new(program);
        cmd.env("KUBECONFIG", self.kubeconfig(who));
        // kubectl's discovery cache is kept by server address: another control plane
        // that once listened on this port (with other CRD versions) would answer for
        // this one. Each cluster keeps its own.
        cmd.env("KUBECACHEDIR", self.info.state_dir.join("kubectl-cache"));
        cmd
    }

    /// Process ids of the components and the guard (empty when attached).
    pub fn pids(&self) -> Vec<u32> {
        self.info.pids.values().copied().collect()
    }

    /// Stops kube-apiserver (for fault tests); etcd and the controller manager keep running.
    pub fn stop_apiserver(&mut self) -> Result<(), Error> {
        let owned = self.owned_mut()?;
        owned.apiserver.stop(&owned.guard, GRACE);
        Ok(())
    }

    /// Starts kube-apiserver again on the same port with the same flags and waits for it.
    pub async fn start_apiserver(&mut self) -> Result<(), Error> {
        let state_dir = self.info.state_dir.clone();
        {
            let owned = self.owned_mut()?;
            owned.apiserver.stop(&owned.guard, GRACE);
            owned.apiserver = spawn_apiserver(
                &owned.assets,
                &owned.apiserver_args,
                &state_dir,
                &owned.guard,
            )?;
            let pid = owned.apiserver.pid();
            self.info.pids.insert("kube-apiserver".to_owned(), pid);
        }
        self.wait_ready(Duration::from_secs(60)).await
    }

    /// Stops everything now (also done on drop).
    pub fn shutdown(mut self) {
        self.stop_all();
    }

    fn stop_all(&mut self) {
        let Some(mut owned) = self.owned.take() else {
            return;
        };
        if let Some(kwok) = owned.kwok.as_mut() {
            kwok.stop(&owned.guard, GRACE);
        }
        if let Some(scheduler) = owned.scheduler.as_mut() {
            scheduler.stop(&owned.guard, GRACE);
        }
        if let Some(kcm) = owned.kcm.as_mut() {
            kcm.stop(&owned.guard, GRACE);
        }
        owned.apiserver.stop(&owned.guard, GRACE);
        owned.etcd.stop(&owned.guard, GRACE);
        let remove = owned.remove_state_dir;
        drop(owned);
        if remove {
            if std::thread::panicking() {
                eprintln!(
                    "devcluster: keeping {} for its logs",
                    self.info.state_dir.display()
                );
            } else {
                let _ = std::fs::remove_dir_all(&self.info.state_dir);
            }
        }
    }

    fn owned(&self) -> Result<&Owned, Error> {
        self.owned
            .as_ref()
            .ok_or(Error::NotOwned("controlling processes"))
    }

    fn owned_mut(&mut self) -> Result<&mut Owned, Error> {
        self.owned
            .as_mut()
            .ok_or(Error::NotOwned("controlling processes"))
    }

    /// Fails early, with the component's log, when an owned component has exited.
    fn check_alive(&mut self) -> Result<(), Error> {
        if let Some(owned) = self.owned.as_mut() {
            let all = [
                Some(&mut owned.etcd),
                Some(&mut owned.apiserver),
                owned.kcm.as_mut(),
                owned.scheduler.as_mut(),
                owned.kwok.as_mut(),
            ];
            for s in all.into_iter().flatten() {
                if let Some(status) = s.exited() {
                    return Err(s.exited_error(status));
                }
            }
        }
        Ok(())
    }

    async fn wait_ready(&mut self, timeout: Duration) -> Result<(), Error> {
        let client = self.client(Identity::Admin).await?;
        let deadline = Instant::now() + timeout;
        loop {
            self.check_alive()?;
            let req = http::Request::get("/readyz")
                .body(Vec::new())
                .map_err(|e| Error::invalid("readyz", e))?;
            if let Ok(text) = client.request_text(req).await
                && text.trim() == "ok"
            {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(Error::Timeout {
                    what: format!("kube-apiserver at {} to answer /readyz", self.info.server),
                    seconds: timeout.as_secs(),
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn install_crds(&mut self, paths: &[PathBuf], timeout: Duration) -> Result<(), Error> {
        let api: Api<CustomResourceDefinition> = Api::all(self.client(Identity::Admin).await?);
        let mut names = Vec::new();
        for path in paths {
            for crd in load_crds(path)? {
                let name = crd.metadata.name.clone().unwrap_or_default();
                api.patch(
                    &name,
                    &PatchParams::apply(FIELD_MANAGER).force(),
                    &Patch::Apply(&crd),
                )
                .await
                .map_err(Error::kube(format!(
                    "installing CRD {name} from {}",
                    path.display()
                )))?;
                names.push(name);
            }
        }
        for name in names {
            let api = api.clone();
            wait::until(
                &format!("CRD {name} to be Established"),
                timeout,
                Duration::from_millis(100),
                || {
                    let api = api.clone();
                    let name = name.clone();
                    async move {
                        let crd = api.get(&name).await.ok()?;
                        let established = crd
                            .status?
                            .conditions?
                            .iter()
                            .any(|c| c.type_ == "Established" && c.status == "True");
                        established.then_some(())
                    }
                },
            )
            .await?;
        }
        Ok(())
    }

    async fn wait_default_service_account(&mut self, timeout: Duration) -> Result<(), Error> {
        let api: Api<ServiceAccount> =
            Api::namespaced(self.client(Identity::Admin).await?, "default");
        let deadline = Instant::now() + timeout;
        loop {
            self.check_alive()?;
            // Pods are refused until their service account exists; their token is
            // projected (TokenRequest), so no token Secret is waited for.
            if let Ok(Some(_)) = api.get_opt("default").await {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(Error::Timeout {
                    what: "kube-controller-manager to create the default service account"
                        .to_owned(),
                    seconds: timeout.as_secs(),
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.stop_all();
    }
}

/// Reads the CustomResourceDefinitions in a YAML file (one or more documents).
pub fn load_crds(path: &Path) -> Result<Vec<CustomResourceDefinition>, Error> {
    let text =
        std::fs::read_to_string(path).map_err(Error::io(format!("reading {}", path.display())))?;
    let crds: Vec<CustomResourceDefinition> = serde_saphyr::from_multiple(&text)
        .map_err(|e| Error::invalid(format!("parsing {}", path.display()), e))?;
    if crds.is_empty() {
        return Err(Error::invalid(
            format!("parsing {}", path.display()),
            "no CustomResourceDefinition in it",
        ));
    }
    Ok(crds)
}

fn spawn_apiserver(
    assets: &Assets,
    args: &[OsString],
    state_dir: &Path,
    guard: &Guard,
) -> Result<Supervised, Error> {
    let mut cmd = Command::new(assets.kube_apiserver());
    cmd.args(args);
    Supervised::spawn("kube-apiserver", cmd, state_dir, guard)
}

fn wait_tcp(etcd: &mut Supervised, port: u16, deadline: Instant) -> Result<(), Error> {
    loop {
        if let Some(status) = etcd.exited() {
            return Err(etcd.exited_error(status));
        }
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(Error::Timeout {
                what: format!("etcd to listen on 127.0.0.1:{port}"),
                seconds: 0,
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until `needle` appears in the component's log; fails with its log when it exits
/// first.
fn wait_log(component: &mut Supervised, needle: &str, deadline: Instant) -> Result<(), Error> {
    loop {
        if let Some(status) = component.exited() {
            return Err(component.exited_error(status));
        }
        if std::fs::read_to_string(component.log()).is_ok_and(|log| log.contains(needle)) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(Error::Timeout {
                what: format!("{} to log {needle:?}", component.name()),
                seconds: 0,
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn remaining(deadline: Instant) -> Duration {
    deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_secs(1))
}

fn random_hex(bytes: usize) -> Result<String, Error> {
    use std::io::Read;
    let mut buf = vec![0u8; bytes];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .map_err(Error::io("reading /dev/urandom"))?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

fn temp_state_dir() -> Result<PathBuf, Error> {
    let dir = std::env::temp_dir().join(format!(
        "devcluster-{}-{}",
        std::process::id(),
        random_hex(4)?
    ));
    Ok(dir)
}

fn absolute(p: &Path) -> Result<PathBuf, Error> {
    std::path::absolute(p).map_err(Error::io(format!("resolving {}", p.display())))
}

fn write(path: &Path, text: &str) -> Result<(), Error> {
    std::fs::write(path, text).map_err(Error::io(format!("writing {}", path.display())))
}

/// Written under another name and renamed, so a reader never sees half a file.
fn write_atomic(path: &Path, text: &str) -> Result<(), Error> {
    let tmp = path.with_extension("tmp");
    write(&tmp, text)?;
    std::fs::rename(&tmp, path).map_err(Error::io(format!("renaming {} into place", tmp.display())))
}

/// kube-scheduler's configuration: its client budget raised like the controller
/// manager's (the default 50 qps binds a few hundred pods a second at best), no leader
/// election.
fn scheduler_config_yaml(kubeconfig: &Path) -> String {
    format!(
        "apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: {kubeconfig}
  qps: 300
  burst: 600
leaderElection:
  leaderElect: false
",
        kubeconfig = kubeconfig.display()
    )
}

fn kubeconfig_yaml(server: &str, ca: &Path, user: &str, token: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
  - name: devcluster
    cluster:
      server: {server}
      certificate-authority: {ca}
users:
  - name: {user}
    user:
      token: {token}
contexts:
  - name: {user}@devcluster
    context:
      cluster: devcluster
      user: {user}
      namespace: default
current-context: {user}@devcluster
",
        ca = ca.display()
    )
}
