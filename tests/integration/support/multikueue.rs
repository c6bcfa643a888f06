//! Two control planes on one machine, as Kueue's MultiKueue runs: a management cluster
//! where Jobs are created and queued, and a worker cluster whose (fake GPU) nodes run
//! their pods. Each is a devcluster control plane of its own (its own etcd,
//! kube-apiserver, controllers, scheduler and kwok, on 127.0.0.1), each with Kueue
//! v0.17.0 (`support::kueue`), and the test's namespace exists on both under one name.
//!
//! The management cluster is configured as Kueue's MultiKueue set-up asks
//! (Kueue's "Setup a MultiKueue environment"): a Secret `worker-kubeconfig` in Kueue's
//! namespace holding a kubeconfig for the worker (its 127.0.0.1 API server, its CA
//! inline, and a token minted for the service account `multikueue-sa`, which the
//! worker grants the role Kueue's `create-multikueue-kubeconfig.sh` grants), the
//! MultiKueueCluster `worker` naming that Secret, the MultiKueueConfig `workers`
//! listing it, the AdmissionCheck `multikueue` (controller
//! `kueue.x-k8s.io/multikueue`, parameters that config), and the ClusterQueue `gpus`
//! requiring that check, with the LocalQueue `team`. The worker has a ClusterQueue and
//! LocalQueue of the same names with the GPUs, and no MultiKueue objects.
//!
//! No feature gate is set beyond the one every Kueue here has off
//! (`VisibilityOnDemand`): on v0.17.0 `MultiKueue` is beta and on by default, and
//! `MultiKueueBatchJobWithManagedBy` is GA and locked on. The management Kueue's Job
//! defaulting webhook is registered: it sets `spec.managedBy:
//! kueue.x-k8s.io/multikueue` on a new Job whose LocalQueue's ClusterQueue has a
//! MultiKueue check, without which MultiKueue rejects the Job's Workload.

use std::time::Duration;

use devcluster::{ControlPlane, Identity};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;

use super::TestEnv;
use super::kueue::{Kueue, gpu_queue, kueue_crds, kueue_kind};
use super::test_crd;

/// Kueue's namespace (its kubeconfig Secrets live there).
const KUEUE_NAMESPACE: &str = "kueue-system";
/// The MultiKueueCluster naming the worker.
pub const WORKER: &str = "worker";
/// The Secret holding the worker's kubeconfig, and the service account it is for.
const KUBECONFIG_SECRET: &str = "worker-kubeconfig";
const SERVICE_ACCOUNT: &str = "multikueue-sa";
/// The AdmissionCheck (and the MultiKueueConfig it names).
pub const CHECK: &str = "multikueue";
const CONFIG: &str = "workers";
/// The ClusterQueue and LocalQueue, the same names on both clusters.
pub const CLUSTER_QUEUE: &str = "gpus";
pub const QUEUE: &str = "team";
/// What MultiKueue puts in `spec.managedBy` of a Job it dispatches.
pub const MANAGED_BY: &str = "kueue.x-k8s.io/multikueue";

/// The two clusters and their Kueues; everything stops on drop.
pub struct TwoClusters {
    // First, so dropped first (field order): no Kueue outlives its API server.
    _kueues: [Kueue; 2],
    pub manager: TestEnv,
    pub worker: TestEnv,
}

impl TwoClusters {
    /// Starts both clusters (the worker's ClusterQueue with `gpus` GPUs, the manager's
    /// with as many), both Kueues, and the MultiKueue set-up; returns once the worker is
    /// connected, the check and the manager's ClusterQueue are active, and Kueue's
    /// webhook defaults `managedBy` for the LocalQueue. `kueue_config` is merged into
    /// both Kueues' configuration (e.g. `clientConnection`).
    pub async fn start(prefix: &str, gpus: u32, kueue_config: serde_json::Value) -> TwoClusters {
        gpujob_operator::client::install_crypto_provider();
        let options = devcluster::Options {
            crds: vec![test_crd(), kueue_crds()],
            ..devcluster::Options::default()
        };
        // The worker's nodes hold every GPU of its ClusterQueue (8 a node, 4 nodes at
        // least); the manager's default nodes stay empty.
        let nodes = u16::try_from(gpus.div_ceil(8)).unwrap().max(4);
        let worker_options = devcluster::Options {
            gpu_nodes: devcluster::nodes::GpuNodes {
                count: nodes,
                ..devcluster::nodes::GpuNodes::default()
            },
            ..options.clone()
        };
        // The two start at once: most of a start is waiting on the processes.
        let (manager, worker) = tokio::join!(
            ControlPlane::start(options),
            ControlPlane::start(worker_options)
        );
        let manager = TestEnv::on(manager.expect("management control plane"), prefix).await;
        let worker = TestEnv::on_named(worker.expect("worker control plane"), &manager.ns).await;

        let worker_kueue = Kueue::start_as(&worker, "-worker", kueue_config.clone()).await;
        gpu_queue(&worker, gpus).await;
        let kubeconfig = multikueue_account(&worker).await;

        let mut config = json!({"multiKueue": {
            // Remote objects whose management Workload is gone are looked for this
            // often (default 1 minute); deletes are not waiting on it, see the tests.
            "gcInterval": "1m",
        }});
        if let (Some(c), serde_json::Value::Object(extra)) = (config.as_object_mut(), kueue_config)
        {
            c.extend(extra);
        }
        let manager_kueue = Kueue::start_with_job_webhook_as(&manager, "-manager", config).await;
        manager_setup(&manager, &kubeconfig, gpus).await;
        wait_connected(&manager).await;
        wait_managed_by(&manager).await;
        TwoClusters {
            manager,
            worker,
            _kueues: [manager_kueue, worker_kueue],
        }
    }
}

/// What the operator is given on each worker (`kubectl apply -k` of it).
const WORKER_RBAC: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/deploy/multikueue-worker/rbac.yaml"
);

impl TwoClusters {
    /// The manager's settings for an operator given the worker as
    /// `--multikueue-worker worker=KUBECONFIG` is: deploy/multikueue-worker/ applied on
    /// the worker, and a kubeconfig file with a token of its service account, so the
    /// operator has there what that manifest grants and nothing more.
    pub async fn operator_settings(&self) -> gpujob_operator::controller::Settings {
        use gpujob_operator::controller::multikueue::WorkerClusters;
        let text = std::fs::read_to_string(WORKER_RBAC).unwrap();
        let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&text).unwrap();
        let pp = PatchParams::apply("gpujob-tests").force();
        let admin = &self.worker.admin;
        let mut account = None;
        for doc in docs {
            let name = doc["metadata"]["name"].as_str().unwrap().to_owned();
            match doc["kind"].as_str().unwrap() {
                "Namespace" => {
                    let ns: Namespace = serde_json::from_value(doc).unwrap();
                    Api::<Namespace>::all(admin.clone())
                        .patch(&name, &pp, &Patch::Apply(&ns))
                        .await
                        .unwrap();
                }
                "ServiceAccount" => {
                    let ns = doc["metadata"]["namespace"].as_str().unwrap().to_owned();
                    let sa: ServiceAccount = serde_json::from_value(doc).unwrap();
                    Api::<ServiceAccount>::namespaced(admin.clone(), &ns)
                        .patch(&name, &pp, &Patch::Apply(&sa))
                        .await
                        .unwrap();
                    account = Some((ns, name));
                }
                "ClusterRole" => {
                    let role: ClusterRole = serde_json::from_value(doc).unwrap();
                    Api::<ClusterRole>::all(admin.clone())
                        .patch(&name, &pp, &Patch::Apply(&role))
                        .await
                        .unwrap();
                }
                "ClusterRoleBinding" => {
                    let binding: ClusterRoleBinding = serde_json::from_value(doc).unwrap();
                    Api::<ClusterRoleBinding>::all(admin.clone())
                        .patch(&name, &pp, &Patch::Apply(&binding))
                        .await
                        .unwrap();
                }
                kind => panic!("{WORKER_RBAC}: unexpected {kind}"),
            }
        }
        let (ns, sa) = account.expect("a ServiceAccount");
        let kubeconfig = self
            .worker
            .cluster
            .service_account_kubeconfig(&ns, &sa, Duration::from_secs(24 * 3600))
            .await
            .unwrap();
        let path = std::env::temp_dir().join(format!("{}-worker.kubeconfig", self.manager.ns));
        std::fs::write(&path, kubeconfig).unwrap();
        let workers = [(WORKER.to_owned(), path)];
        let limits = gpujob_operator::client::Limits::default();
        gpujob_operator::controller::Settings {
            multikueue: WorkerClusters::connect(&workers, "mk-worker", limits, None, None)
                .await
                .unwrap(),
            ..self.manager.settings()
        }
    }
}

/// On the worker: the service account MultiKueue acts as, the role Kueue's set-up
/// script grants it, and a kubeconfig with a token minted for it.
async fn multikueue_account(worker: &TestEnv) -> String {
    let pp = PatchParams::apply("gpujob-tests").force();
    let accounts: Api<ServiceAccount> = Api::namespaced(worker.admin.clone(), KUEUE_NAMESPACE);
    let account: ServiceAccount = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": SERVICE_ACCOUNT, "namespace": KUEUE_NAMESPACE},
    }))
    .unwrap();
    accounts
        .patch(SERVICE_ACCOUNT, &pp, &Patch::Apply(&account))
        .await
        .unwrap();
    // Kueue's create-multikueue-kubeconfig.sh, without its JobSet rules (no JobSet here).
    let role: ClusterRole = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "multikueue-sa-role"},
        "rules": [
            {"apiGroups": ["batch"], "resources": ["jobs"],
             "verbs": ["create", "delete", "get", "list", "watch"]},
            {"apiGroups": ["batch"], "resources": ["jobs/status"], "verbs": ["get"]},
            {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"],
             "verbs": ["create", "delete", "get", "list", "watch"]},
            {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads/status"],
             "verbs": ["get", "patch", "update"]},
        ],
    }))
    .unwrap();
    Api::<ClusterRole>::all(worker.admin.clone())
        .patch("multikueue-sa-role", &pp, &Patch::Apply(&role))
        .await
        .unwrap();
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "multikueue-sa-crb"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "multikueue-sa-role"},
        "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT,
                      "namespace": KUEUE_NAMESPACE}],
    }))
    .unwrap();
    Api::<ClusterRoleBinding>::all(worker.admin.clone())
        .patch("multikueue-sa-crb", &pp, &Patch::Apply(&binding))
        .await
        .unwrap();
    worker
        .cluster
        .service_account_kubeconfig(
            KUEUE_NAMESPACE,
            SERVICE_ACCOUNT,
            Duration::from_secs(24 * 3600),
        )
        .await
        .unwrap()
}

/// Applies `body` (a Kueue object) as `name`, in `ns` when given.
async fn apply(env: &TestEnv, ns: Option<&str>, kind: &str, plural: &str, body: serde_json::Value) {
    let resource = kueue_kind(kind, plural);
    let api: Api<DynamicObject> = match ns {
        Some(ns) => Api::namespaced_with(env.admin.clone(), ns, &resource),
        None => Api::all_with(env.admin.clone(), &resource),
    };
    let obj: DynamicObject = serde_json::from_value(body).unwrap();
    let name = obj.metadata.name.clone().unwrap();
    api.patch(
        &name,
        &PatchParams::apply("gpujob-tests").force(),
        &Patch::Apply(&obj),
    )
    .await
    .unwrap();
}

/// On the manager: the kubeconfig Secret, MultiKueueCluster, MultiKueueConfig,
/// AdmissionCheck, ResourceFlavor, the ClusterQueue requiring the check and the
/// LocalQueue in the test's namespace.
async fn manager_setup(manager: &TestEnv, kubeconfig: &str, gpus: u32) {
    let secrets: Api<Secret> = Api::namespaced(manager.admin.clone(), KUEUE_NAMESPACE);
    let secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": KUBECONFIG_SECRET, "namespace": KUEUE_NAMESPACE},
        "stringData": {"kubeconfig": kubeconfig},
    }))
    .unwrap();
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let v = "kueue.x-k8s.io/v1beta2";
    apply(
        manager,
        None,
        "MultiKueueCluster",
        "multikueueclusters",
        json!({
            "apiVersion": v, "kind": "MultiKueueCluster", "metadata": {"name": WORKER},
            "spec": {"clusterSource": {"kubeConfig": {
                "locationType": "Secret", "location": KUBECONFIG_SECRET}}},
        }),
    )
    .await;
    apply(
        manager,
        None,
        "MultiKueueConfig",
        "multikueueconfigs",
        json!({
            "apiVersion": v, "kind": "MultiKueueConfig", "metadata": {"name": CONFIG},
            "spec": {"clusters": [WORKER]},
        }),
    )
    .await;
    apply(
        manager,
        None,
        "AdmissionCheck",
        "admissionchecks",
        json!({
            "apiVersion": v, "kind": "AdmissionCheck", "metadata": {"name": CHECK},
            "spec": {"controllerName": MANAGED_BY, "parameters": {
                "apiGroup": "kueue.x-k8s.io", "kind": "MultiKueueConfig", "name": CONFIG}},
        }),
    )
    .await;
    apply(
        manager,
        None,
        "ResourceFlavor",
        "resourceflavors",
        json!({
            "apiVersion": v, "kind": "ResourceFlavor", "metadata": {"name": "gpu"},
        }),
    )
    .await;
    apply(
        manager,
        None,
        "ClusterQueue",
        "clusterqueues",
        json!({
            "apiVersion": v, "kind": "ClusterQueue", "metadata": {"name": CLUSTER_QUEUE},
            "spec": {
                "namespaceSelector": {},
                "resourceGroups": [{
                    "coveredResources": ["nvidia.com/gpu"],
                    "flavors": [{"name": "gpu", "resources": [
                        {"name": "nvidia.com/gpu", "nominalQuota": gpus}]}],
                }],
                "admissionChecksStrategy": {"admissionChecks": [{"name": CHECK}]},
            },
        }),
    )
    .await;
    apply(
        manager,
        Some(&manager.ns),
        "LocalQueue",
        "localqueues",
        json!({
            "apiVersion": v, "kind": "LocalQueue", "metadata": {"name": QUEUE},
            "spec": {"clusterQueue": CLUSTER_QUEUE},
        }),
    )
    .await;
}

/// Whether Kueue object `name` has condition `Active` True.
async fn active(env: &TestEnv, kind: &str, plural: &str, name: &str) -> Option<()> {
    let api: Api<DynamicObject> = Api::all_with(env.admin.clone(), &kueue_kind(kind, plural));
    let obj = serde_json::to_value(api.get(name).await.ok()?).ok()?;
    obj["status"]["conditions"]
        .as_array()?
        .iter()
        .any(|c| c["type"] == "Active" && c["status"] == "True")
        .then_some(())
}

/// Waits until the manager's Kueue has connected to the worker and its check and
/// ClusterQueue are active (its log and the objects on failure).
async fn wait_connected(manager: &TestEnv) {
    for (kind, plural, name) in [
        ("MultiKueueCluster", "multikueueclusters", WORKER),
        ("AdmissionCheck", "admissionchecks", CHECK),
        ("ClusterQueue", "clusterqueues", CLUSTER_QUEUE),
    ] {
        let ok = devcluster::wait::until(
            &format!("{kind} {name} active on the management cluster"),
            Duration::from_secs(60),
            Duration::from_millis(200),
            || active(manager, kind, plural, name),
        )
        .await;
        if ok.is_err() {
            let out = manager
                .cluster
                .command("kubectl", Identity::Admin)
                .args(["get", plural, name, "-o", "yaml"])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            panic!("{kind} {name} never became active:\n{out}");
        }
    }
}

/// Waits until Kueue's webhook on the manager sets `managedBy` on a new Job of the
/// LocalQueue (its caches know the ClusterQueue's MultiKueue check): a dry-run create
/// of a probe Job, which the webhook mutates and nothing stores.
async fn wait_managed_by(manager: &TestEnv) {
    let probe = batch_job("kueue-managed-by-probe", &[], json!({}));
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let jobs = manager.jobs();
    let defaulted = devcluster::wait::until(
        "Kueue's webhook to set managedBy on a Job of the MultiKueue LocalQueue",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async {
            let made = jobs.create(&dry, &probe).await.ok()?;
            (made.spec?.managed_by.as_deref() == Some(MANAGED_BY)).then_some(())
        },
    )
    .await;
    assert!(defaulted.is_ok(), "{defaulted:?}");
}

/// A plain batch/v1 Job `name` for the LocalQueue [`QUEUE`]: one pod of one GPU
/// with the simulator's `env`, no retries; `template` is merged into its pod template
/// (labels, annotations, scheduling gates).
pub fn batch_job(name: &str, env: &[(&str, &str)], template: serde_json::Value) -> Job {
    let mut job = json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "labels": {"kueue.x-k8s.io/queue-name": QUEUE}},
        "spec": {
            "backoffLimit": 0,
            "template": {"spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "main", "image": "i", "env": super::sim_env(env),
                                "resources": {"limits": {"nvidia.com/gpu": 1}}}],
            }},
        },
    });
    merge(&mut job["spec"]["template"], template);
    serde_json::from_value(job).unwrap()
}

/// Merges object `patch` into `base` (objects key by key, anything else replaced).
fn merge(base: &mut serde_json::Value, patch: serde_json::Value) {
    match (base, patch) {
        (serde_json::Value::Object(base), serde_json::Value::Object(patch)) => {
            for (k, v) in patch {
                merge(base.entry(k).or_insert(serde_json::Value::Null), v);
            }
        }
        (base, patch) => *base = patch,
    }
}
