//! Shared set-up for the operator's integration tests: a namespace on the devcluster
//! control plane, the operator's RBAC granted to the replica users, and the operator
//! running in-process, scoped to that namespace.

#![allow(dead_code, clippy::unwrap_used)] // test support: not every test uses every helper

pub mod attempts;
pub mod harness;
pub mod kueue;
pub mod multikueue;
pub mod nodes;
pub mod prometheus;
pub mod quota;
pub mod replicas;
pub mod shards;
pub mod signals;
pub mod webhook;

use std::time::Duration;

use devcluster::identity::REPLICA_GROUP;
use devcluster::{ControlPlane, Identity, wait};
use gpujob_operator::api::{GpuJob, LABEL_UID};
use gpujob_operator::controller::validate::SpecLimits;
use gpujob_operator::controller::{self, PlanSettings, Settings};
use gpujob_operator::health::Status;
use gpujob_operator::metrics::Metrics;
use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use std::sync::Arc;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub const CRD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/crd/crd.yaml");

/// The CRD most tests run on: gpujob.dev/v1 alone (`gpujob-operator crd --v1-only`), as
/// scripts/test.sh installs it on the shared control plane. deploy/crd/crd.yaml serves
/// v2 too, converted by the operator's webhook, which the in-process operators of these
/// tests do not run: kubectl and kube-controller-manager's garbage collector and
/// namespace controller read the preferred version (v2) and would fail without it.
/// tests/integration/conversion.rs installs the webhook CRD on a control plane of its own.
pub fn test_crd() -> std::path::PathBuf {
    use std::hash::{Hash, Hasher};
    let yaml = gpujob_operator::api::crd_yaml_with(&gpujob_operator::api::CrdOptions {
        conversion: gpujob_operator::api::Conversion::V1Only,
        ca_bundle: None,
        ..Default::default()
    })
    .unwrap();
    // Named by its content: every test process of a run shares one file, and a changed
    // CRD gets a new one.
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    yaml.hash(&mut hasher);
    let path =
        std::env::temp_dir().join(format!("gpujob-crd-v1-only-{:016x}.yaml", hasher.finish()));
    if !path.exists() {
        let tmp = path.with_extension(format!("{}.tmp", std::process::id()));
        std::fs::write(&tmp, yaml).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
    }
    path
}
pub const RBAC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/operator/rbac.yaml");
pub const WAIT: Duration = Duration::from_secs(90);
pub const POLL: Duration = Duration::from_millis(200);

/// Waits until the clock is past `t` (a backoff's end, say), for at most a minute.
pub async fn until_past(t: jiff::Timestamp) {
    wait::until(
        &format!("the clock to pass {t}"),
        Duration::from_secs(60),
        Duration::from_millis(50),
        || std::future::ready((jiff::Timestamp::now() > t).then_some(())),
    )
    .await
    .unwrap();
}

/// An Event as `kubectl describe` shows it: (type, reason, note, count).
pub type EventSeen = (String, String, String, i32);

/// A predicate for [`TestEnv::events_of`]: every one of `reasons` is there.
pub fn with_reasons(reasons: &[&str]) -> impl Fn(&[EventSeen]) -> bool {
    let reasons: Vec<String> = reasons.iter().map(|r| (*r).to_owned()).collect();
    move |events| reasons.iter().all(|r| events.iter().any(|e| &e.1 == r))
}

pub struct TestEnv {
    pub cluster: ControlPlane,
    pub ns: String,
    pub admin: Client,
}

/// Replica logs ([`namespace_temp`]).
pub const REPLICA_LOGS: &str = "gpujob-replicas";
/// The fake quota service's token file.
pub const QUOTA_TOKEN: &str = "gpujob-quota-token";
/// The day-2 tests' error files.
pub const DAY2_ERRORS: &str = "gpujob-day2-errors";
/// The secure-metrics tests' certificates.
pub const METRICS_CERTS: &str = "gpujob-metrics-certs";

/// What tests leave in the temporary folder under a namespace's name.
const NAMESPACE_FILES: [&str; 4] = [REPLICA_LOGS, QUOTA_TOKEN, DAY2_ERRORS, METRICS_CERTS];

/// File or folder `kind` (one of [`NAMESPACE_FILES`]) of the test in namespace `ns`, in
/// the temporary folder; [`TestEnv`] removes it when the test passes.
pub fn namespace_temp(kind: &str, ns: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("{kind}-{ns}"))
}

/// Like the control plane's own folder: kept when the test failed (its logs are the
/// evidence), removed when it passed, so that repeated runs do not fill the disk.
impl Drop for TestEnv {
    fn drop(&mut self) {
        for kind in NAMESPACE_FILES {
            let path = namespace_temp(kind, &self.ns);
            if !path.exists() {
                continue;
            }
            if std::thread::panicking() {
                eprintln!("keeping {} for the failed test", path.display());
            } else if path.is_dir() {
                let _ = std::fs::remove_dir_all(&path);
            } else {
                let _ = std::fs::remove_file(&path);
            }
        }
    }
}

impl TestEnv {
    /// A namespace on the shared control plane of the test run.
    pub async fn new(prefix: &str) -> TestEnv {
        gpujob_operator::client::install_crypto_provider();
        let cluster = ControlPlane::for_tests(&[&test_crd()])
            .await
            .expect("control plane");
        Self::on(cluster, prefix).await
    }

    /// A namespace on a control plane of this test's own (for fault tests that stop
    /// kube-apiserver).
    pub async fn private(prefix: &str) -> TestEnv {
        Self::private_with_crd(prefix, test_crd()).await
    }

    /// [`TestEnv::private`] with the CRD in file `crd`.
    pub async fn private_with_crd(prefix: &str, crd: std::path::PathBuf) -> TestEnv {
        Self::private_with_crds(prefix, vec![crd]).await
    }

    /// [`TestEnv::private`] with the CRDs in files `crds` (the GpuJob CRD among them).
    pub async fn private_with_crds(prefix: &str, crds: Vec<std::path::PathBuf>) -> TestEnv {
        Self::private_with_options(prefix, crds, true).await
    }

    /// [`TestEnv::private`] whose kube-apiserver does not select objects by shard (the
    /// feature gate `ShardedListAndWatch` off, as by default): what replicas meet on
    /// Kubernetes before 1.36 or without the gate.
    pub async fn private_without_sharded_watch(prefix: &str) -> TestEnv {
        Self::private_with_options(prefix, vec![test_crd()], false).await
    }

    async fn private_with_options(
        prefix: &str,
        crds: Vec<std::path::PathBuf>,
        sharded_watch: bool,
    ) -> TestEnv {
        gpujob_operator::client::install_crypto_provider();
        let cluster = ControlPlane::start(devcluster::Options {
            crds,
            // Rollout tests run three old replicas and three new ones.
            replicas: 6,
            gpu_nodes: devcluster::nodes::GpuNodes::for_tests(),
            sharded_watch,
            ..devcluster::Options::default()
        })
        .await
        .expect("private control plane");
        Self::on(cluster, prefix).await
    }

    /// [`TestEnv::private`] on a control plane started with `options` (its fake nodes,
    /// DRA devices, gang scheduling), the GpuJob CRD installed and one replica user.
    pub async fn private_with_cluster(prefix: &str, options: devcluster::Options) -> TestEnv {
        gpujob_operator::client::install_crypto_provider();
        let cluster = ControlPlane::start(devcluster::Options {
            crds: vec![test_crd()],
            replicas: 1,
            ..options
        })
        .await
        .expect("private control plane");
        Self::on(cluster, prefix).await
    }

    async fn on(cluster: ControlPlane, prefix: &str) -> TestEnv {
        let ns = cluster.create_namespace(prefix).await.unwrap();
        Self::in_namespace(cluster, ns).await
    }

    /// A TestEnv on `cluster` in namespace `ns`, made here: another cluster's
    /// namespace of the same name (MultiKueue dispatches a Job to the namespace of its
    /// name on the worker).
    async fn on_named(cluster: ControlPlane, ns: &str) -> TestEnv {
        let admin = cluster.client(Identity::Admin).await.unwrap();
        let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(admin);
        let namespace = serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
        namespaces
            .create(&PostParams::default(), &namespace)
            .await
            .unwrap();
        Self::in_namespace(cluster, ns.to_owned()).await
    }

    async fn in_namespace(cluster: ControlPlane, ns: String) -> TestEnv {
        let admin = cluster.client(Identity::Admin).await.unwrap();
        grant_operator_role_to_replicas(&admin).await;
        grant_lease_role_to_replicas(&admin, &ns).await;
        TestEnv { cluster, ns, admin }
    }

    pub fn gpujobs(&self) -> Api<GpuJob> {
        Api::namespaced(self.admin.clone(), &self.ns)
    }

    /// Creates Job `name` that no GpuJob controls (a name conflict for the GpuJob whose
    /// attempt would be called so); its pod would run for five minutes.
    pub async fn create_foreign_job(&self, name: &str) -> Job {
        let job: Job = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "spec": {"template": {"spec": {"restartPolicy": "Never",
                "containers": [{"name": "c", "image": "i", "env": sim_env(&[("SIM_DURATION_SECONDS", "300")])}]}}},
        }))
        .unwrap();
        self.jobs().create(&Default::default(), &job).await.unwrap()
    }

    pub fn jobs(&self) -> Api<Job> {
        Api::namespaced(self.admin.clone(), &self.ns)
    }

    /// Test settings: this namespace only, 1 s backoff base.
    pub fn settings(&self) -> Settings {
        Settings {
            namespace: Some(self.ns.clone()),
            plan: PlanSettings {
                backoff_base: Duration::from_secs(1),
                backoff_max: Duration::from_secs(4),
                keep_jobs: 3,
                limits: SpecLimits {
                    max_gpus: 8,
                    ..SpecLimits::default()
                },
                name_conflict_retry: Duration::from_secs(2),
                ..PlanSettings::default()
            },
            drain_timeout: Duration::from_secs(5),
            ..Settings::default()
        }
    }

    /// The user agent of an operator started with `identity`.
    pub fn agent(identity: &str) -> String {
        gpujob_operator::client::user_agent(identity)
    }

    /// Starts the operator in this process, as user `replica-1` (the operator's RBAC
    /// role, nothing more) with a User-Agent naming `identity`.
    pub async fn operator(&self, identity: &str, settings: Settings) -> Operator {
        let config = self.cluster.config(Identity::Replica(1)).await.unwrap();
        self.operator_with(config, identity, settings).await
    }

    /// [`TestEnv::operator`] with a client config of the test's choosing (a fault
    /// proxy's, say).
    pub async fn operator_with(
        &self,
        config: kube::Config,
        identity: &str,
        settings: Settings,
    ) -> Operator {
        self.operator_with_limits(config, identity, settings, Default::default())
            .await
    }

    /// [`TestEnv::operator_with`] with client limits of the test's choosing (its
    /// `--api-timeout`, say).
    pub async fn operator_with_limits(
        &self,
        config: kube::Config,
        identity: &str,
        settings: Settings,
        limits: gpujob_operator::client::Limits,
    ) -> Operator {
        let status = Status::new(Metrics::new());
        // The operator's own client stack (identity, rate limit, request metrics).
        let client = gpujob_operator::client::build(
            config,
            identity,
            limits,
            Some(status.metrics.clone()),
            None,
        )
        .unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let run_status = status.clone();
        let handle = tokio::spawn(async move {
            controller::run_unfenced(client.clone(), client, settings, run_status, async {
                let _ = stopped.await;
            })
            .await
            .expect("operator run");
        });
        Operator {
            handle: Some(handle),
            stop: Some(stop),
            status,
        }
    }

    pub async fn create(&self, name: &str, spec: serde_json::Value) -> GpuJob {
        let gj: GpuJob = serde_json::from_value(json!({
            "apiVersion": "gpujob.dev/v1", "kind": "GpuJob",
            "metadata": {"name": name}, "spec": spec,
        }))
        .unwrap();
        self.gpujobs()
            .create(&PostParams::default(), &gj)
            .await
            .unwrap()
    }

    /// The pods matching label `selector` in this namespace that kwok runs (phase
    /// Running).
    pub async fn running_pods(&self, selector: &str) -> Vec<k8s_openapi::api::core::v1::Pod> {
        let pods: Api<k8s_openapi::api::core::v1::Pod> =
            Api::namespaced(self.admin.clone(), &self.ns);
        pods.list(&ListParams::default().labels(selector))
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .collect()
    }

    /// Waits until Job `name` of this namespace is gone.
    pub async fn wait_job_gone(&self, name: &str, what: &str) {
        wait::until(what, WAIT, POLL, || async {
            self.jobs()
                .get_opt(name)
                .await
                .ok()?
                .is_none()
                .then_some(())
        })
        .await
        .unwrap();
    }

    /// Waits until GpuJob `name` satisfies `pred`.
    pub async fn wait_gpujob(
        &self,
        name: &str,
        what: &str,
        pred: impl Fn(&GpuJob) -> bool,
    ) -> GpuJob {
        let api = self.gpujobs();
        let pred = &pred;
        wait::until(
            &format!("GpuJob {}/{name}: {what}", self.ns),
            WAIT,
            POLL,
            || {
                let api = api.clone();
                async move { api.get(name).await.ok().filter(|g| pred(g)) }
            },
        )
        .await
        .unwrap()
    }

    /// Waits until the namespace's GpuJobs (all of them, listed) satisfy `pred`.
    pub async fn wait_gpujobs(
        &self,
        what: &str,
        within: Duration,
        pred: impl Fn(&[GpuJob]) -> bool,
    ) -> Result<Vec<GpuJob>, devcluster::Error> {
        let api = self.gpujobs();
        let pred = &pred;
        wait::until(what, within, Duration::from_millis(250), || {
            let api = api.clone();
            async move {
                let list = api.list(&ListParams::default()).await.ok()?;
                pred(&list.items).then_some(list.items)
            }
        })
        .await
    }

    /// Events on GpuJob `name` (type, reason, note, count), oldest first.
    /// The Events on GpuJob `name` as (type, reason, note, count), oldest first, once
    /// `until` holds of them (Events are written in the background, after the status
    /// they describe), or as they are after 30 s.
    pub async fn events_of(
        &self,
        name: &str,
        until: impl Fn(&[EventSeen]) -> bool,
    ) -> Vec<EventSeen> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let events = self.events_now(name).await;
            if until(&events) || tokio::time::Instant::now() > deadline {
                return events;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn events_now(&self, name: &str) -> Vec<EventSeen> {
        use k8s_openapi::api::events::v1::Event;
        let api: Api<Event> = Api::namespaced(self.admin.clone(), &self.ns);
        let mut list: Vec<Event> = api
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| {
                e.regarding.as_ref().is_some_and(|r| {
                    r.kind.as_deref() == Some("GpuJob") && r.name.as_deref() == Some(name)
                })
            })
            .collect();
        list.sort_by_key(|e| e.metadata.creation_timestamp.clone());
        list.into_iter()
            .map(|e| {
                let count = e.series.as_ref().map_or(1, |s| s.count);
                (
                    e.type_.unwrap_or_default(),
                    e.reason.unwrap_or_default(),
                    e.note.unwrap_or_default(),
                    count,
                )
            })
            .collect()
    }

    /// What the namespace holds, for failure messages: GpuJob phases, Job conditions,
    /// pod phases.
    pub async fn dump(&self) -> String {
        let out = self
            .cluster
            .command("kubectl", Identity::Admin)
            .args(["-n", &self.ns, "get", "gpujobs,jobs,pods", "-o", "wide"])
            .output();
        match out {
            Ok(o) => format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(e) => format!("(kubectl failed: {e})"),
        }
    }

    /// When an attempt's container ended, from its pod. (Kubernetes 1.20's Job
    /// controller can stamp a Job's Failed condition a second time, later, when two of
    /// its syncs race; the operator keeps the first it saw. The pod's end is the fact.)
    pub async fn ended_at(&self, job: &Job) -> jiff::Timestamp {
        use k8s_openapi::api::core::v1::Pod;
        let uid = job.metadata.uid.clone().unwrap();
        let ns = job.metadata.namespace.as_deref().unwrap_or(&self.ns);
        let pods: Api<Pod> = Api::namespaced(self.admin.clone(), ns);
        let list = pods
            .list(&ListParams::default().labels(&format!("controller-uid={uid}")))
            .await
            .unwrap();
        let ended = list
            .items
            .iter()
            .flat_map(|p| {
                p.status
                    .iter()
                    .flat_map(|s| s.container_statuses.iter().flatten())
            })
            .filter_map(|c| {
                c.state
                    .as_ref()?
                    .terminated
                    .as_ref()?
                    .finished_at
                    .as_ref()
                    .map(|t| t.0)
            })
            .max();
        ended.unwrap_or_else(|| panic!("{:?}: no terminated pod", job.metadata.name))
    }

    /// The Jobs `jobs` of GpuJob `gj` (sorted by attempt) run attempts 1..=n without
    /// gaps or repeats, and each started only after the one before it failed and its pod
    /// ended: never two attempts at once.
    pub async fn assert_attempts_sequential(&self, gj: &str, jobs: &[Job], n: i32) {
        let attempts: Vec<i32> = jobs
            .iter()
            .map(|j| controller::job::attempt_of(j).unwrap())
            .collect();
        assert_eq!(attempts, (1..=n).collect::<Vec<_>>(), "attempts of {gj}");
        for pair in jobs.windows(2) {
            assert!(
                matches!(
                    controller::plan::job_state(&pair[0]),
                    controller::plan::JobState::Failed { .. }
                ),
                "{gj}: the attempt before {:?} did not fail",
                pair[1].metadata.name
            );
            assert!(
                pair[1].metadata.creation_timestamp.as_ref().unwrap().0
                    >= self.ended_at(&pair[0]).await,
                "{gj}: {:?} started before {:?} ended",
                pair[1].metadata.name,
                pair[0].metadata.name
            );
        }
    }

    /// Jobs of a GpuJob, by attempt.
    pub async fn jobs_of(&self, gj: &GpuJob) -> Vec<Job> {
        let uid = gj.metadata.uid.clone().unwrap();
        let mut jobs = self
            .jobs()
            .list(&ListParams::default().labels(&format!("{LABEL_UID}={uid}")))
            .await
            .unwrap()
            .items;
        jobs.sort_by_key(|j| controller::job::attempt_of(j).unwrap_or(0));
        jobs
    }
}

fn rbac_docs() -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(RBAC).unwrap();
    serde_saphyr::from_multiple(&text).unwrap()
}

/// The shipped Lease Role (deploy/operator/rbac.yaml), in the test's namespace, bound to the
/// replica users' group: tests put each operator's Lease in their own namespace.
async fn grant_lease_role_to_replicas(admin: &Client, ns: &str) {
    let mut role = rbac_docs()
        .into_iter()
        .find(|d| d["kind"] == "Role")
        .expect("deploy/operator/rbac.yaml has the lease Role");
    role["metadata"]["namespace"] = json!(ns);
    let role: Role = serde_json::from_value(role).unwrap();
    let pp = PatchParams::apply("gpujob-tests").force();
    Api::<Role>::namespaced(admin.clone(), ns)
        .patch("gpujob-operator-lease", &pp, &Patch::Apply(&role))
        .await
        .unwrap();
    let binding: RoleBinding = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "gpujob-operator-lease", "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "gpujob-operator-lease"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": REPLICA_GROUP}],
    }))
    .unwrap();
    Api::<RoleBinding>::namespaced(admin.clone(), ns)
        .patch("gpujob-operator-lease", &pp, &Patch::Apply(&binding))
        .await
        .unwrap();
    wait_replicas_may(admin, Some(ns), "create", "coordination.k8s.io", "leases").await;
}

/// Waits until the API server's authorizer lets the replica users `verb` `resource`: its
/// RBAC cache sees a binding just written a moment later (longer on a loaded machine),
/// and a test's first request must not race it.
async fn wait_replicas_may(
    admin: &Client,
    ns: Option<&str>,
    verb: &str,
    group: &str,
    resource: &str,
) {
    let reviews: Api<SubjectAccessReview> = Api::all(admin.clone());
    let review: SubjectAccessReview = serde_json::from_value(json!({
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {
            "user": "replica-rbac-check",
            "groups": [REPLICA_GROUP],
            "resourceAttributes": {"namespace": ns, "verb": verb, "group": group, "resource": resource},
        },
    }))
    .unwrap();
    wait::until(
        &format!("the replicas' RBAC to allow {verb} {resource}"),
        Duration::from_secs(30),
        Duration::from_millis(50),
        || async {
            let answer = reviews.create(&PostParams::default(), &review).await.ok()?;
            answer.status.is_some_and(|s| s.allowed).then_some(())
        },
    )
    .await
    .unwrap();
}

/// Binds the shipped ClusterRole (deploy/operator/rbac.yaml) to the replica users' group.
async fn grant_operator_role_to_replicas(admin: &Client) {
    let role: ClusterRole = rbac_docs()
        .into_iter()
        .find(|d| d["kind"] == "ClusterRole" && d["metadata"]["name"] == "gpujob-operator")
        .map(|d| serde_json::from_value(d).unwrap())
        .expect("deploy/operator/rbac.yaml has the ClusterRole gpujob-operator");
    let pp = PatchParams::apply("gpujob-tests").force();
    let roles: Api<ClusterRole> = Api::all(admin.clone());
    roles
        .patch("gpujob-operator", &pp, &Patch::Apply(&role))
        .await
        .unwrap();
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "gpujob-operator-test-replicas"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "gpujob-operator"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": REPLICA_GROUP}],
    }))
    .unwrap();
    let bindings: Api<ClusterRoleBinding> = Api::all(admin.clone());
    bindings
        .patch(
            "gpujob-operator-test-replicas",
            &pp,
            &Patch::Apply(&binding),
        )
        .await
        .unwrap();
    wait_replicas_may(admin, None, "patch", "gpujob.dev", "gpujobs").await;
}

/// An operator running in this process; aborted when dropped.
pub struct Operator {
    handle: Option<JoinHandle<()>>,
    stop: Option<oneshot::Sender<()>>,
    /// What its /metrics would serve.
    pub status: Arc<Status>,
}

impl Operator {
    /// Graceful stop: no new work, in-flight reconciles drain.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(h) = self.handle.take() {
            h.await.unwrap();
        }
    }

    /// As abrupt as a kill: the task is dropped wherever it is.
    pub async fn kill(mut self) {
        if let Some(h) = self.handle.take() {
            h.abort();
            let _ = h.await;
        }
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        if let Some(h) = self.handle.take() {
            h.abort();
        }
    }
}

pub fn phase(gj: &GpuJob) -> Option<gpujob_operator::api::Phase> {
    gj.status.as_ref().and_then(|s| s.phase)
}

/// Condition `type_` as (status, reason, message).
pub fn condition(gj: &GpuJob, type_: &str) -> Option<(String, String, String)> {
    let c = gj.condition(type_)?;
    Some((
        format!("{:?}", c.status),
        c.reason.clone(),
        c.message.clone(),
    ))
}

pub fn ready(gj: &GpuJob) -> Option<(String, String, String)> {
    condition(gj, "Ready")
}

pub fn sim_env(pairs: &[(&str, &str)]) -> serde_json::Value {
    pairs
        .iter()
        .map(|(k, v)| json!({"name": k, "value": v}))
        .collect()
}
