//! Kueue (sigs.k8s.io/kueue, built by `scripts/kueue.sh`) running against a private
//! control plane, as a cluster's Kueue would: its CRDs installed, its manager started
//! with its own certificate management, only batch/v1 Jobs integrated, and one
//! ResourceFlavor and ClusterQueue of GPUs with a LocalQueue in the test's namespace.
//!
//! [`Kueue::start`] does not register Kueue's own Job webhooks with the API server (its
//! manager serves them, nothing calls them): the operator creates a queued GpuJob's
//! Job suspended and labelled for its queue, which is what those webhooks would let
//! through. [`Kueue::start_with_job_webhook`] registers its Job defaulting webhook, as a
//! cluster's Kueue has it: a Job created without a queue in a namespace with a LocalQueue
//! named `default` is labelled for it and suspended (LocalQueueDefaulting). Kueue's
//! conversion webhooks are declared on its CRDs, as its install does, so that its
//! certificate management has somewhere to put the CA; every object here is written and
//! read at the storage version, so no conversion is ever asked for.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Duration;

use devcluster::{ControlPlane, Identity, load_crds};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use serde_json::json;

use super::TestEnv;

/// The folder holding `kueue` and `crds/` (scripts/test.sh exports it).
pub fn kueue_dir() -> PathBuf {
    std::env::var_os("GPUJOB_KUEUE_DIR")
        .map(PathBuf::from)
        .expect(
            "GPUJOB_KUEUE_DIR: scripts/test.sh builds Kueue with scripts/kueue.sh and exports it",
        )
}

/// Kueue's namespace and the Secret its certificate management fills.
const NAMESPACE: &str = "kueue-system";
const CERT_SECRET: &str = "kueue-webhook-server-cert";
/// Kueue's CRDs with a conversion webhook in its install.
const CONVERTED: [&str; 5] = [
    "localqueues",
    "clusterqueues",
    "workloads",
    "cohorts",
    "multikueueclusters",
];

/// One file holding Kueue's CRDs as its install has them (with the conversion webhook
/// declared), for [`TestEnv::private_with_crds`].
pub fn kueue_crds() -> PathBuf {
    let mut docs = Vec::new();
    let mut paths: Vec<PathBuf> = std::fs::read_dir(kueue_dir().join("crds"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    paths.sort();
    for path in paths {
        for crd in load_crds(&path).unwrap() {
            let mut crd = serde_json::to_value(&crd).unwrap();
            let plural = crd["spec"]["names"]["plural"].as_str().unwrap().to_owned();
            if CONVERTED.contains(&plural.as_str()) {
                crd["spec"]["conversion"] = json!({
                    "strategy": "Webhook",
                    "webhook": {
                        "conversionReviewVersions": ["v1"],
                        "clientConfig": {"service": {
                            "name": "kueue-webhook-service", "namespace": NAMESPACE,
                            "path": "/convert",
                        }},
                    },
                });
            }
            docs.push(serde_json::to_string(&crd).unwrap());
        }
    }
    let file = std::env::temp_dir().join(format!("gpujob-kueue-crds-{}.yaml", std::process::id()));
    std::fs::write(&file, docs.join("\n---\n")).unwrap();
    file
}

/// A running Kueue manager; stopped on drop.
pub struct Kueue {
    child: Child,
    dir: PathBuf,
}

impl Drop for Kueue {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("keeping Kueue's log in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

fn free_port() -> u16 {
    devcluster::ports::free().unwrap()
}

fn spawn(cluster: &ControlPlane, dir: &Path, config: &Path, run: u32) -> Child {
    let log = std::fs::File::create(dir.join(format!("kueue-{run}.log"))).unwrap();
    cluster
        .command(kueue_dir().join("kueue"), Identity::Admin)
        .arg("--config")
        .arg(config)
        // Kueue's visibility API is an aggregated API server of its own, which needs
        // in-cluster delegated authentication and exits Kueue without it; the tests do
        // not ask it anything.
        .arg("--feature-gates=VisibilityOnDemand=false")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap()
}

impl Kueue {
    /// Starts Kueue on `env`'s control plane (which must have [`kueue_crds`]) with its
    /// Job defaulting webhook registered for the namespaces labelled
    /// [`DEFAULTING_LABEL`] (`env`'s namespace is labelled here), and waits until it is
    /// ready. Kueue's webhook server serves a certificate for 127.0.0.1 made here, put
    /// where its certificate management looks for the mounted one (that management
    /// names Kueue's Service, which the API server here cannot reach; it still fills its
    /// Secret, which nothing here mounts).
    pub async fn start_with_job_webhook(env: &TestEnv) -> Kueue {
        Self::start_with_job_webhook_as(env, "", json!({})).await
    }

    /// [`Kueue::start_with_job_webhook`] with `config` merged into the top level of
    /// its configuration (a `multiKueue` section, `clientConnection`), its files in a
    /// folder named with `role` too (two clusters' Kueues for one namespace name keep
    /// their own).
    pub async fn start_with_job_webhook_as(
        env: &TestEnv,
        role: &str,
        config: serde_json::Value,
    ) -> Kueue {
        let dir = std::env::temp_dir().join(format!("gpujob-kueue-{}{role}", env.ns));
        let certs = dir.join("certs");
        let ca = super::webhook::webhook_certs(&certs);
        let (health, port) = (free_port(), free_port());
        let config = write_config(&dir, health, port, &certs, config);
        cert_secret(env).await;
        let kueue = Kueue {
            child: spawn(&env.cluster, &dir, &config, 1),
            dir,
        };
        kueue.wait_ready(health, 1).await;
        let hooks: Api<MutatingWebhookConfiguration> = Api::all(env.admin.clone());
        let name = format!("kueue-job-defaulting-{}", env.ns);
        let hook: MutatingWebhookConfiguration = serde_json::from_value(json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": name},
            "webhooks": [{
                "name": "mjob.kb.io",
                "clientConfig": {
                    "url": format!("https://127.0.0.1:{port}/mutate-batch-v1-job"),
                },
                "rules": [{"apiGroups": ["batch"], "apiVersions": ["v1"],
                           "operations": ["CREATE"], "resources": ["jobs"]}],
                "namespaceSelector": {"matchLabels": {DEFAULTING_LABEL: "true"}},
                "failurePolicy": "Fail",
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
            }],
        }))
        .unwrap();
        let mut hook = hook;
        for h in hook.webhooks.iter_mut().flatten() {
            h.client_config.ca_bundle = Some(k8s_openapi::ByteString(ca.clone().into_bytes()));
        }
        let pp = PatchParams::apply("gpujob-tests").force();
        hooks.patch(&name, &pp, &Patch::Apply(&hook)).await.unwrap();
        defaulting_in(env, &env.ns).await;
        kueue
    }

    /// Waits until Kueue's health server says ready (`run`: which of its logs to show
    /// if it never does).
    async fn wait_ready(&self, health: u16, run: u32) {
        let ready = devcluster::wait::until(
            "Kueue ready",
            Duration::from_secs(60),
            Duration::from_millis(200),
            || async { ready_on(health).then_some(()) },
        )
        .await;
        if ready.is_err() {
            let log = std::fs::read_to_string(self.dir.join(format!("kueue-{run}.log")))
                .unwrap_or_default();
            panic!("Kueue did not get ready; its log:\n{log}");
        }
    }

    /// Starts Kueue on `env`'s control plane (which must have [`kueue_crds`]) and waits
    /// until it is ready.
    pub async fn start(env: &TestEnv) -> Kueue {
        Self::start_as(env, "", json!({})).await
    }

    /// [`Kueue::start`] with `config` merged into the top level of its configuration,
    /// its files in a folder named with `role` too (see
    /// [`Kueue::start_with_job_webhook_as`]).
    pub async fn start_as(env: &TestEnv, role: &str, config: serde_json::Value) -> Kueue {
        let dir = std::env::temp_dir().join(format!("gpujob-kueue-{}{role}", env.ns));
        let certs = dir.join("certs");
        std::fs::create_dir_all(&certs).unwrap();
        let health = free_port();
        let config = write_config(&dir, health, free_port(), &certs, config);

        // Kueue's certificate management fills a Secret that must exist, and waits for
        // the kubelet to mount it; here the test copies it into the folder.
        let secrets = cert_secret(env).await;

        let mut first = spawn(&env.cluster, &dir, &config, 1);
        let filled = devcluster::wait::until(
            "Kueue's certificates in its Secret",
            Duration::from_secs(60),
            Duration::from_millis(200),
            || async {
                let s = secrets.get(CERT_SECRET).await.ok()?;
                let data = s.data?;
                data.contains_key("tls.crt").then_some(data)
            },
        )
        .await;
        let _ = first.kill();
        let _ = first.wait();
        for (key, value) in filled.unwrap() {
            std::fs::write(certs.join(key), value.0).unwrap();
        }
        // Started again, it finds its certificates in place and is ready at once.
        let child = spawn(&env.cluster, &dir, &config, 2);
        let kueue = Kueue { child, dir };
        kueue.wait_ready(health, 2).await;
        kueue
    }
}

/// Kueue's configuration in `dir`: its health probe on `health`, its webhook server on
/// `port` with the certificates in `certs`, only batch/v1 Jobs integrated; the keys of
/// `extra` (an object) added at the top level.
fn write_config(
    dir: &Path,
    health: u16,
    port: u16,
    certs: &Path,
    extra: serde_json::Value,
) -> PathBuf {
    let config = dir.join("config.yaml");
    let mut text = json!({
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": format!("127.0.0.1:{health}")},
        "metrics": {"bindAddress": "0"},
        "webhook": {"host": "127.0.0.1", "port": port, "certDir": certs},
        "leaderElection": {"leaderElect": false},
        "integrations": {"frameworks": ["batch/job"]},
    });
    if let (Some(text), serde_json::Value::Object(extra)) = (text.as_object_mut(), extra) {
        text.extend(extra);
    }
    std::fs::write(&config, serde_json::to_string(&text).unwrap()).unwrap();
    config
}

/// Kueue's namespace and the Secret its certificate management fills (it must exist).
async fn cert_secret(env: &TestEnv) -> Api<Secret> {
    let pp = PatchParams::apply("gpujob-tests").force();
    let namespaces: Api<Namespace> = Api::all(env.admin.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": NAMESPACE}})).unwrap();
    namespaces
        .patch(NAMESPACE, &pp, &Patch::Apply(&ns))
        .await
        .unwrap();
    let secrets: Api<Secret> = Api::namespaced(env.admin.clone(), NAMESPACE);
    let secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": CERT_SECRET},
    }))
    .unwrap();
    secrets
        .patch(CERT_SECRET, &pp, &Patch::Apply(&secret))
        .await
        .unwrap();
    secrets
}

/// Whether Kueue's health server answers 200 to /readyz.
fn ready_on(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let request = "GET /readyz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    let mut answer = String::new();
    s.write_all(request.as_bytes()).is_ok()
        && s.read_to_string(&mut answer).is_ok()
        && answer.lines().next().is_some_and(|l| l.contains(" 200 "))
}

/// Kueue's kinds, at the version the tests write.
pub fn kueue_kind(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kueue.x-k8s.io", "v1beta2", kind),
        plural,
    )
}

/// The namespace label that has Kueue's Job defaulting webhook called
/// ([`Kueue::start_with_job_webhook`]).
pub const DEFAULTING_LABEL: &str = "gpujob.test/kueue-defaulting";

/// Has Kueue's Job defaulting webhook called for namespace `ns` too.
pub async fn defaulting_in(env: &TestEnv, ns: &str) {
    let namespaces: Api<Namespace> = Api::all(env.admin.clone());
    let patch = json!({"metadata": {"labels": {DEFAULTING_LABEL: "true"}}});
    namespaces
        .patch(ns, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

/// A ResourceFlavor `gpu`, a ClusterQueue `gpus` of `gpus` nvidia.com/gpu (in which a
/// Workload of higher priority preempts lower ones), and the LocalQueue `team` in
/// `env`'s namespace pointing at it.
pub async fn gpu_queue(env: &TestEnv, gpus: u32) {
    gpu_queue_named(env, gpus, &env.ns, "team").await;
}

/// [`gpu_queue`] with the LocalQueue named `local` in namespace `ns` (`default`: the
/// queue Kueue's LocalQueue defaulting labels every new Job of the namespace with).
pub async fn gpu_queue_named(env: &TestEnv, gpus: u32, ns: &str, local: &'static str) {
    let pp = PatchParams::apply("gpujob-tests").force();
    let apply = |api: Api<DynamicObject>, name: &'static str, body: serde_json::Value| {
        let pp = pp.clone();
        async move {
            let obj: DynamicObject = serde_json::from_value(body).unwrap();
            api.patch(name, &pp, &Patch::Apply(&obj)).await.unwrap();
        }
    };
    let flavor = kueue_kind("ResourceFlavor", "resourceflavors");
    apply(
        Api::all_with(env.admin.clone(), &flavor),
        "gpu",
        json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
               "metadata": {"name": "gpu"}}),
    )
    .await;
    let cq = kueue_kind("ClusterQueue", "clusterqueues");
    apply(
        Api::all_with(env.admin.clone(), &cq),
        "gpus",
        json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
        "metadata": {"name": "gpus"},
        "spec": {"namespaceSelector": {},
                 "preemption": {"withinClusterQueue": "LowerPriority"},
                 "resourceGroups": [{
            "coveredResources": ["nvidia.com/gpu"],
            "flavors": [{"name": "gpu", "resources": [
                {"name": "nvidia.com/gpu", "nominalQuota": gpus}]}],
        }]}}),
    )
    .await;
    let lq = kueue_kind("LocalQueue", "localqueues");
    apply(
        Api::namespaced_with(env.admin.clone(), ns, &lq),
        local,
        json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
               "metadata": {"name": local}, "spec": {"clusterQueue": "gpus"}}),
    )
    .await;
}

/// The Workload Kueue made for the Job with uid `job_uid`, if any.
pub async fn workload_of(env: &TestEnv, job_uid: &str) -> Option<serde_json::Value> {
    let api: Api<DynamicObject> = Api::namespaced_with(
        env.admin.clone(),
        &env.ns,
        &kueue_kind("Workload", "workloads"),
    );
    let list = api
        .list(
            &kube::api::ListParams::default().labels(&format!("kueue.x-k8s.io/job-uid={job_uid}")),
        )
        .await
        .unwrap();
    list.items
        .into_iter()
        .next()
        .map(|w| serde_json::to_value(w).unwrap())
}

/// Waits until Kueue's LocalQueue defaulting labels a new Job of namespace `ns` (its
/// webhook is called and knows the LocalQueue `default`): a dry-run create of a probe
/// Job, which the webhook mutates and nothing stores.
pub async fn wait_defaulting(env: &TestEnv, ns: &str) {
    let jobs: Api<k8s_openapi::api::batch::v1::Job> = Api::namespaced(env.admin.clone(), ns);
    let probe: k8s_openapi::api::batch::v1::Job = serde_json::from_value(json!({
        "metadata": {"name": "kueue-defaulting-probe"},
        "spec": {"template": {"spec": {"restartPolicy": "Never",
            "containers": [{"name": "main", "image": "i"}]}}},
    }))
    .unwrap();
    let dry = kube::api::PostParams {
        dry_run: true,
        ..Default::default()
    };
    let labelled = devcluster::wait::until(
        "Kueue to label a new Job for its LocalQueue default",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async {
            let made = jobs.create(&dry, &probe).await.ok()?;
            let queue = made
                .metadata
                .labels?
                .get("kueue.x-k8s.io/queue-name")?
                .clone();
            (queue == "default").then_some(())
        },
    )
    .await;
    assert!(labelled.is_ok(), "{labelled:?}");
}

/// The Topology [`TAS_TOPOLOGY`]: devcluster's fake nodes' block, rack and host labels,
/// topmost first, as Kueue's TopologyAwareScheduling wants its levels.
pub const TAS_TOPOLOGY: &str = "devcluster";
/// The ResourceFlavor, ClusterQueue and LocalQueue of [`tas_queue`].
pub const TAS_QUEUE: &str = "tas";

/// What Kueue's TopologyAwareScheduling (beta, on by default in v0.17) needs to place a
/// Workload's pods by topology: the Topology [`TAS_TOPOLOGY`] of the fake nodes' levels
/// (block, rack, host); a ResourceFlavor `tas` with `topologyName` that and the node
/// label `node_label` (key, value) as its `nodeLabels` (Kueue reads the topology of the
/// nodes that have it, and puts it in the pods' nodeSelector); a ClusterQueue `tas` of
/// `gpus` nvidia.com/gpu of it and the LocalQueue `tas` in `env`'s namespace.
pub async fn tas_queue(env: &TestEnv, gpus: u32, node_label: (&str, &str)) {
    use devcluster::nodes::{BLOCK_LABEL, HOST_LABEL, RACK_LABEL};
    let pp = PatchParams::apply("gpujob-tests").force();
    let apply = |api: Api<DynamicObject>, name: &'static str, body: serde_json::Value| {
        let pp = pp.clone();
        async move {
            let obj: DynamicObject = serde_json::from_value(body).unwrap();
            api.patch(name, &pp, &Patch::Apply(&obj)).await.unwrap();
        }
    };
    apply(
        Api::all_with(env.admin.clone(), &kueue_kind("Topology", "topologies")),
        TAS_TOPOLOGY,
        json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Topology",
        "metadata": {"name": TAS_TOPOLOGY},
        "spec": {"levels": [
            {"nodeLabel": BLOCK_LABEL},
            {"nodeLabel": RACK_LABEL},
            {"nodeLabel": HOST_LABEL},
        ]}}),
    )
    .await;
    apply(
        Api::all_with(
            env.admin.clone(),
            &kueue_kind("ResourceFlavor", "resourceflavors"),
        ),
        TAS_QUEUE,
        json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
               "metadata": {"name": TAS_QUEUE},
               "spec": {"nodeLabels": {node_label.0: node_label.1},
                        "topologyName": TAS_TOPOLOGY}}),
    )
    .await;
    apply(
        Api::all_with(
            env.admin.clone(),
            &kueue_kind("ClusterQueue", "clusterqueues"),
        ),
        TAS_QUEUE,
        json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
        "metadata": {"name": TAS_QUEUE},
        "spec": {"namespaceSelector": {}, "resourceGroups": [{
            "coveredResources": ["nvidia.com/gpu"],
            "flavors": [{"name": TAS_QUEUE, "resources": [
                {"name": "nvidia.com/gpu", "nominalQuota": gpus}]}],
        }]}}),
    )
    .await;
    apply(
        Api::namespaced_with(
            env.admin.clone(),
            &env.ns,
            &kueue_kind("LocalQueue", "localqueues"),
        ),
        TAS_QUEUE,
        json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
               "metadata": {"name": TAS_QUEUE}, "spec": {"clusterQueue": TAS_QUEUE}}),
    )
    .await;
}
