//! Step 2 of the API upgrade and its rollback, on a real control plane of this test's own
//! (tests/integration/support/webhook.rs's `WebhookCluster`: the webhook CRD points at a forwarder on this
//! machine in front of the replicas' webhooks):
//! - `gpujob-operator migrate-storage` (the real binary, as a user holding only the
//!   shipped role deploy/crd/migrate-role.yaml) after the CRD switched to storing v2:
//!   every GpuJob ends up stored as v2 (read from etcd itself), reads the same in v1 and
//!   v2 as before, `status.storedVersions` becomes `["v2"]`; a run stopped early changes
//!   only what it rewrote, a second run nothing; back to storing v1 the same way; it
//!   refuses without its role and without the CRD;
//! - `run --api-versions=v1`: a GpuJob written through v2 with a template runs as its v1
//!   fields say;
//! - with v2 stored and conversions routed only to ready replicas (as the webhook
//!   Service does), replicas all killed and started together still become ready.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use crate::support;

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use devcluster::identity::OPERATOR_USER;
use devcluster::{Identity, wait};
use futures::{StreamExt, TryStreamExt};
use gpujob_operator::api::{Conversion, CrdOptions, GpuJob, Phase, StorageVersion};
use k8s_openapi::ByteString;
use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams, WatchEvent,
    WatchParams,
};
use serde_json::{Value, json};
use support::webhook::WebhookCluster;
use support::{WAIT, sim_env};

const CRD_NAME: &str = "gpujobs.gpujob.dev";
const MIGRATE_ROLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/crd/migrate-role.yaml");

/// The control plane of tests/integration/support/webhook.rs, with this file's reads.
struct Setup(WebhookCluster);

impl std::ops::Deref for Setup {
    type Target = WebhookCluster;
    fn deref(&self) -> &WebhookCluster {
        &self.0
    }
}

impl Setup {
    async fn new(prefix: &str, replicas: usize) -> Setup {
        Setup(WebhookCluster::new(prefix, replicas, StorageVersion::V1).await)
    }

    fn crds(&self) -> Api<CustomResourceDefinition> {
        Api::all(self.env.admin.clone())
    }

    async fn create_v2(&self, name: &str, spec: Value) -> DynamicObject {
        let sent = json!({
            "apiVersion": "gpujob.dev/v2", "kind": "GpuJob",
            "metadata": {"name": name}, "spec": spec,
        });
        self.raw("v2")
            .create(
                &PostParams::default(),
                &serde_json::from_value(sent).unwrap(),
            )
            .await
            .unwrap()
    }

    /// Every GpuJob read as v1 and as v2 at one resourceVersion, without what a write
    /// changes by itself (resourceVersion, managedFields).
    async fn snapshot(&self) -> BTreeMap<String, (Value, Value)> {
        let (v1, v2) = (self.raw("v1"), self.raw("v2"));
        wait::until(
            "every GpuJob read as v1 and v2 at one resourceVersion",
            WAIT,
            Duration::from_millis(200),
            || {
                let (v1, v2) = (v1.clone(), v2.clone());
                async move {
                    let a = v1.list(&ListParams::default()).await.ok()?.items;
                    let b = v2.list(&ListParams::default()).await.ok()?.items;
                    let rv = |o: &DynamicObject| {
                        (o.metadata.name.clone(), o.metadata.resource_version.clone())
                    };
                    if a.iter().map(rv).collect::<Vec<_>>() != b.iter().map(rv).collect::<Vec<_>>()
                    {
                        return None;
                    }
                    Some(
                        a.into_iter()
                            .zip(b)
                            .map(|(a, b)| {
                                (
                                    a.metadata.name.clone().unwrap(),
                                    (comparable(a), comparable(b)),
                                )
                            })
                            .collect(),
                    )
                }
            },
        )
        .await
        .unwrap()
    }

    /// apiVersion of each GpuJob of the namespace as stored in etcd, by name.
    async fn stored(&self) -> BTreeMap<String, String> {
        let pid = self.env.cluster.info().pids["etcd"];
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
        let url = cmdline
            .split(|b| *b == 0)
            .filter_map(|a| std::str::from_utf8(a).ok())
            .find_map(|a| a.strip_prefix("--listen-client-urls="))
            .expect("etcd's client URL")
            .to_owned();
        let prefix = format!("/registry/gpujob.dev/gpujobs/{}/", self.env.ns);
        // Every key under the prefix: up to (not including) the prefix with its last
        // byte ('/') raised by one.
        let mut end = prefix.clone().into_bytes();
        *end.last_mut().unwrap() += 1;
        let body =
            json!({"key": BASE64.encode(prefix.as_bytes()), "range_end": BASE64.encode(&end)})
                .to_string();
        // etcd's JSON gateway, over plain HTTP on 127.0.0.1 (no curl on a fresh machine).
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build_http::<http_body_util::Full<bytes::Bytes>>();
        let request = http::Request::post(format!("{url}/v3/kv/range"))
            .body(http_body_util::Full::new(bytes::Bytes::from(body)))
            .unwrap();
        let response = client.request(request).await.unwrap();
        let status = response.status();
        let out = http_body_util::BodyExt::collect(response.into_body())
            .await
            .unwrap()
            .to_bytes();
        assert!(
            status.is_success(),
            "etcd: {status} {}",
            String::from_utf8_lossy(&out)
        );
        #[derive(serde::Deserialize)]
        struct Range {
            #[serde(default)]
            kvs: Vec<Kv>,
        }
        #[derive(serde::Deserialize)]
        struct Kv {
            key: ByteString,
            value: ByteString,
        }
        let range: Range = serde_json::from_slice(&out).unwrap();
        range
            .kvs
            .into_iter()
            .map(|kv| {
                let key = String::from_utf8(kv.key.0).unwrap();
                let object: Value = serde_json::from_slice(&kv.value.0).unwrap();
                (
                    key.strip_prefix(&prefix).unwrap().to_owned(),
                    object["apiVersion"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    }

    async fn stored_versions(&self) -> Vec<String> {
        let crd = self.crds().get(CRD_NAME).await.unwrap();
        crd.status.unwrap().stored_versions.unwrap_or_default()
    }

    /// Replaces the CRD by the one storing `storage` (step 2: `crd --storage-version v2`).
    async fn store(&self, storage: StorageVersion) {
        let mut crd = gpujob_operator::api::crd::crd(&CrdOptions {
            conversion: Conversion::Url(self.url.clone()),
            ca_bundle: Some(self.ca.clone().into_bytes()),
            storage,
        })
        .unwrap();
        let current = self.crds().get(CRD_NAME).await.unwrap();
        crd.metadata.resource_version = current.metadata.resource_version;
        self.crds()
            .replace(CRD_NAME, &PostParams::default(), &crd)
            .await
            .unwrap();
    }

    /// `gpujob-operator migrate-storage <args>` as the operator's service-account user
    /// (bound to the migration's role only): exit status and log.
    async fn migrate(&self, args: &[&str]) -> (bool, String) {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_gpujob-operator"));
        cmd.arg("migrate-storage")
            .args(["--qps", "50"])
            .args(args)
            .env(
                "KUBECONFIG",
                self.env.cluster.kubeconfig(Identity::Operator),
            )
            .env("RUST_LOG", "info");
        let out = tokio::task::spawn_blocking(move || cmd.output().unwrap())
            .await
            .unwrap();
        let log = String::from_utf8_lossy(&out.stderr).into_owned();
        eprintln!("--- migrate-storage {args:?} ---\n{log}");
        (out.status.success(), log)
    }

    /// The shipped role of the migration, bound to the operator's service-account user
    /// (granted nothing else on this control plane).
    async fn grant_migrate_role(&self) {
        let admin = &self.env.admin;
        let text = std::fs::read_to_string(MIGRATE_ROLE).unwrap();
        let role: ClusterRole = serde_saphyr::from_str(&text).unwrap();
        let pp = PatchParams::apply("gpujob-tests").force();
        Api::<ClusterRole>::all(admin.clone())
            .patch("gpujob-migrate-storage", &pp, &Patch::Apply(&role))
            .await
            .unwrap();
        let binding: ClusterRoleBinding = serde_json::from_value(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "gpujob-migrate-storage-test"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "gpujob-migrate-storage"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": OPERATOR_USER}],
        }))
        .unwrap();
        Api::<ClusterRoleBinding>::all(admin.clone())
            .patch("gpujob-migrate-storage-test", &pp, &Patch::Apply(&binding))
            .await
            .unwrap();
        // The authorizer's cache sees the binding a moment later.
        let review: SubjectAccessReview = serde_json::from_value(json!({
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": OPERATOR_USER, "resourceAttributes": {
                "verb": "update", "group": "apiextensions.k8s.io",
                "resource": "customresourcedefinitions", "subresource": "status", "name": CRD_NAME}},
        }))
        .unwrap();
        let reviews: Api<SubjectAccessReview> = Api::all(admin.clone());
        wait::until(
            "the migration role to be in force",
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
}

/// An object without what every write changes by itself.
fn comparable(o: DynamicObject) -> Value {
    let mut v = serde_json::to_value(o).unwrap();
    let meta = v["metadata"].as_object_mut().unwrap();
    meta.remove("resourceVersion");
    meta.remove("managedFields");
    v
}

fn count(stored: &BTreeMap<String, String>, api_version: &str) -> usize {
    stored.values().filter(|v| *v == api_version).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_storage_moves_every_gpujob_to_v2_losing_nothing_and_resumes() {
    let s = Setup::new("migr", 1).await;
    let env = &s.env;
    let mut replica = Some(s.replica(1, &[]));
    s.wait_webhook("the webhook of replica-1 to answer").await;

    // Without its role the tool may not even read the CRD, and says so.
    let (ok, log) = s.migrate(&[]).await;
    assert!(!ok);
    assert!(
        log.contains("reading the CRD gpujobs.gpujob.dev") && log.contains("forbidden"),
        "{log}"
    );
    s.grant_migrate_role().await;

    // Six GpuJobs written as v1, six as v2 with what only v2 can say. Suspended: the
    // operator records a status once and then leaves them alone.
    for i in 0..6 {
        env.create(
            &format!("a-v1-{i}"),
            json!({"image": "busybox", "gpus": 1 + i % 2, "maxRetries": i,
                   "activeDeadlineSeconds": 60 * (i + 1), "nodeSelector": {"zone": "a"},
                   "env": sim_env(&[("EPOCHS", "3")]), "suspend": true}),
        )
        .await;
    }
    for i in 0..6 {
        s.create_v2(
            &format!("b-v2-{i}"),
            json!({
                "image": "busybox",
                "resources": {"gpus": 1, "product": "NVIDIA-A100-SXM4-80GB"},
                "retryPolicy": {"maxRetries": 2, "backoffSeconds": 5 + i},
                "attemptDeadline": if i % 2 == 0 { "90m" } else { "2.5s" },
                "template": {
                    "metadata": {"labels": {"team": "vision"}},
                    "spec": {
                        "volumes": [{"name": "data", "emptyDir": {}}],
                        "containers": [{"name": "main", "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
                        "someFutureField": {"kept": i},
                    },
                },
                "suspend": true,
            }),
        )
        .await;
    }
    env.wait_gpujobs("every GpuJob's status recorded", WAIT, |all| {
        all.len() == 12
            && all.iter().all(|g: &GpuJob| {
                g.status.as_ref().and_then(|s| s.observed_generation) == g.metadata.generation
            })
    })
    .await
    .unwrap();
    let before = s.snapshot().await;
    assert_eq!(before.len(), 12);
    let stored = s.stored().await;
    assert_eq!(
        (stored.len(), count(&stored, "gpujob.dev/v1")),
        (12, 12),
        "{stored:?}"
    );
    assert_eq!(s.stored_versions().await, ["v1"]);

    // Step 2's CRD. The API server adds v2 to storedVersions at once, and stores new
    // writes as v2 once its handler has the new CRD: a probe written until it lands so.
    s.store(StorageVersion::V2).await;
    assert_eq!(s.stored_versions().await, ["v1", "v2"]);
    env.create(
        "probe",
        json!({"image": "busybox", "gpus": 1, "suspend": true}),
    )
    .await;
    let probes = env.gpujobs();
    let setup = &s;
    let mut n = 0;
    wait::until(
        "a write stored as v2",
        WAIT,
        Duration::from_millis(100),
        || {
            n += 1;
            let (probes, n) = (probes.clone(), n);
            async move {
                let patch = json!({"metadata": {"labels": {"probe": n.to_string()}}});
                probes
                    .patch("probe", &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .ok()?;
                (setup.stored().await["probe"] == "gpujob.dev/v2").then_some(())
            }
        },
    )
    .await
    .unwrap();
    assert_eq!(
        count(&s.stored().await, "gpujob.dev/v1"),
        12,
        "nothing else moved yet"
    );

    // Stopped after 5 (two per page): a-v1-0..4, the first in list order (the probe
    // was stored as v2 already); nothing else changed, and storedVersions still names v1.
    let (ok, log) = s.migrate(&["--limit", "5", "--page-size", "2"]).await;
    assert!(ok, "{log}");
    assert!(log.contains("stopped after 5 GpuJobs (--limit)"), "{log}");
    let stored = s.stored().await;
    let v2: Vec<&String> = stored
        .iter()
        .filter(|(_, v)| *v == "gpujob.dev/v2")
        .map(|(k, _)| k)
        .collect();
    assert_eq!(
        v2,
        ["a-v1-0", "a-v1-1", "a-v1-2", "a-v1-3", "a-v1-4", "probe"],
        "{stored:?}"
    );
    assert_eq!(
        s.stored_versions().await,
        ["v1", "v2"],
        "objects of v1 remain"
    );

    let first_run = |list: Vec<DynamicObject>| -> Vec<(Option<String>, Option<String>)> {
        list.into_iter()
            .filter(|o| o.metadata.name.as_deref() < Some("a-v1-5"))
            .map(|o| (o.metadata.name, o.metadata.resource_version))
            .collect()
    };
    let migrated = first_run(
        s.raw("v2")
            .list(&ListParams::default())
            .await
            .unwrap()
            .items,
    );
    assert_eq!(migrated.len(), 5);

    // Run again: it finishes, in pages of 5, with progress lines.
    let (ok, log) = s
        .migrate(&["--page-size", "5", "--progress-every", "4"])
        .await;
    assert!(ok, "{log}");
    assert!(
        log.contains("4/13 GpuJobs") && log.contains("13/13 GpuJobs"),
        "{log}"
    );
    assert!(log.contains("status.storedVersions is now [v2]"), "{log}");
    let stored = s.stored().await;
    assert_eq!(
        (stored.len(), count(&stored, "gpujob.dev/v2")),
        (13, 13),
        "{stored:?}"
    );
    assert_eq!(s.stored_versions().await, ["v2"]);
    assert_eq!(
        first_run(
            s.raw("v2")
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
        ),
        migrated,
        "objects stored as v2 already are not written again"
    );

    // Nothing lost: each object reads as before, in both versions (generation too: the
    // rewrite changed no spec).
    let mut after = s.snapshot().await;
    after.remove("probe");
    for (name, (v1, v2)) in &before {
        assert_eq!(&after[name].0, v1, "{name} as v1");
        assert_eq!(&after[name].1, v2, "{name} as v2");
    }
    assert_eq!(after.len(), before.len());
    assert_eq!(
        after["b-v2-1"].1["spec"]["template"]["spec"]["someFutureField"],
        json!({"kept": 1})
    );
    assert_eq!(after["b-v2-1"].1["spec"]["attemptDeadline"], "2.5s");

    // A second run changes nothing: no object written, storedVersions as it was.
    let rvs = |list: Vec<DynamicObject>| -> Vec<(Option<String>, Option<String>)> {
        list.into_iter()
            .map(|o| (o.metadata.name, o.metadata.resource_version))
            .collect()
    };
    let rv_before = rvs(s
        .raw("v2")
        .list(&ListParams::default())
        .await
        .unwrap()
        .items);
    let (ok, log) = s.migrate(&[]).await;
    assert!(ok, "{log}");
    assert!(
        log.contains("already [v2]") && log.contains("nothing to do"),
        "{log}"
    );
    assert_eq!(
        rvs(s
            .raw("v2")
            .list(&ListParams::default())
            .await
            .unwrap()
            .items),
        rv_before
    );
    assert_eq!(s.stored_versions().await, ["v2"]);

    // Stored as v2 for the API server too: with no webhook answering, v2 reads still
    // work (nothing to convert) and v1 reads fail.
    let mut r = replica.take().unwrap();
    r.signal(nix::sys::signal::Signal::SIGKILL);
    r.wait_exit(Duration::from_secs(10)).await;
    let list = s.raw("v2").list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 13);
    // A GET, not a list: from Kubernetes 1.31 a consistent list is served from the
    // watch cache, which may hold objects converted before the webhook went; a GET
    // reads etcd, so it needs the webhook exactly when the stored version is not v1.
    for o in &list.items {
        let name = o.metadata.name.as_deref().unwrap();
        let err = s.raw("v1").get(name).await.unwrap_err().to_string();
        assert!(err.contains("conversion webhook"), "{name}: {err}");
    }
    drop(r);

    // And back: storage v1 again, migrated again, nothing lost on the way.
    let _replica = s.replica(1, &[]);
    s.wait_webhook("the webhook of the restarted replica-1")
        .await;
    s.store(StorageVersion::V1).await;
    assert_eq!(s.stored_versions().await, ["v2", "v1"]);
    let mut n = 0;
    wait::until(
        "a write stored as v1",
        WAIT,
        Duration::from_millis(100),
        || {
            n += 1;
            let (probes, n) = (probes.clone(), n);
            async move {
                let patch = json!({"metadata": {"labels": {"probe": format!("back-{n}")}}});
                probes
                    .patch("probe", &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .ok()?;
                (setup.stored().await["probe"] == "gpujob.dev/v1").then_some(())
            }
        },
    )
    .await
    .unwrap();
    let (ok, log) = s.migrate(&[]).await;
    assert!(ok, "{log}");
    let stored = s.stored().await;
    assert_eq!(
        (stored.len(), count(&stored, "gpujob.dev/v1")),
        (13, 13),
        "{stored:?}"
    );
    assert_eq!(s.stored_versions().await, ["v1"]);
    let mut back = s.snapshot().await;
    back.remove("probe");
    assert_eq!(back, before, "v1 -> v2 -> v1 storage loses nothing");

    // Without the CRD there is nothing to migrate, and the tool says so.
    s.crds()
        .delete(CRD_NAME, &DeleteParams::default())
        .await
        .unwrap();
    let crds = s.crds();
    wait::until(
        "the CRD to be gone",
        WAIT,
        Duration::from_millis(200),
        || {
            let crds = crds.clone();
            async move { crds.get_opt(CRD_NAME).await.ok()?.is_none().then_some(()) }
        },
    )
    .await
    .unwrap();
    let (ok, log) = s.migrate(&[]).await;
    assert!(!ok);
    assert!(
        log.contains("the CRD gpujobs.gpujob.dev does not exist"),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_v1_only_operator_runs_a_gpujob_written_through_v2_as_its_v1_fields_say() {
    let s = Setup::new("rollb", 1).await;
    let env = &s.env;
    let replica = s.replica(1, &["--api-versions=v1"]);
    // The rolled-back operator still serves the webhook: v2 is readable through it.
    s.wait_webhook("the webhook of the v1-only replica to answer")
        .await;

    let template = json!({
        "metadata": {"labels": {"team": "vision"}},
        "spec": {
            "volumes": [{"name": "data", "emptyDir": {}}],
            "containers": [{"name": "main", "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
        },
    });
    let sent = json!({
        "image": "busybox",
        "env": sim_env(&[("SIM_FAIL_ATTEMPTS", "1")]),
        "resources": {"gpus": 1, "product": "NVIDIA-H100"},
        // A backoff of its own (3 s, under the test replicas' 4 s cap): the operator's
        // (1 s in the tests) applies instead.
        "retryPolicy": {"maxRetries": 2, "backoffSeconds": 3},
        "template": template,
    });
    // Every status the GpuJob goes through, from a watch started before it exists.
    let api = env.gpujobs();
    let from = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut events = api
        .watch(
            &WatchParams::default().fields("metadata.name=from-v2"),
            &from,
        )
        .await
        .unwrap()
        .boxed();
    s.create_v2("from-v2", sent.clone()).await;
    let mut backoffs = Vec::new();
    let done = tokio::time::timeout(WAIT, async {
        while let Some(event) = events.try_next().await.unwrap() {
            let (WatchEvent::Added(g) | WatchEvent::Modified(g)) = event else {
                continue;
            };
            let status = g.status.clone().unwrap_or_default();
            if let (Some(next), Some(failed)) = (status.next_attempt_time, &status.last_failure) {
                backoffs.push(next.duration_since(failed.time).as_secs());
            }
            if status.phase == Some(Phase::Succeeded) {
                return g;
            }
        }
        panic!("the watch ended")
    })
    .await
    .expect("from-v2 Succeeded");
    assert_eq!(done.status.as_ref().unwrap().attempts, 2);
    // A failure's time has whole seconds: seen more than a second after it, the 1 s
    // backoff is over and attempt 2 starts without one being recorded (under a loaded
    // test run it happens). The GpuJob's 3 s would be recorded unless seen 3 s late.
    assert!(
        backoffs.iter().all(|b| *b == 1),
        "the operator's 1 s backoff, not the GpuJob's 3 s: {backoffs:?}"
    );

    let jobs = env.jobs_of(&done).await;
    assert_eq!(jobs.len(), 2);
    for job in &jobs {
        let pod = &job.spec.as_ref().unwrap().template;
        let spec = pod.spec.as_ref().unwrap();
        let name = job.metadata.name.as_deref().unwrap();
        assert!(spec.volumes.is_none(), "{name}: no template volumes");
        assert!(
            spec.containers[0].volume_mounts.is_none(),
            "{name}: no template mounts"
        );
        assert!(
            !pod.metadata
                .as_ref()
                .unwrap()
                .labels
                .as_ref()
                .unwrap()
                .contains_key("team"),
            "{name}: no template labels"
        );
        assert!(
            !spec
                .node_selector
                .iter()
                .flatten()
                .any(|(k, _)| k == "nvidia.com/gpu.product"),
            "{name}: no GPU product"
        );
        assert_eq!(spec.containers[0].image.as_deref(), Some("busybox"));
    }
    // Ignored, not removed: what was written through v2 is all still there.
    let read = s.raw("v2").get("from-v2").await.unwrap();
    assert_eq!(read.data["spec"], sent);
    let stored: GpuJob = env.gpujobs().get("from-v2").await.unwrap();
    assert_eq!(stored.spec.v2.unwrap().template.unwrap(), template);
    assert!(
        replica
            .log_text()
            .contains("--api-versions=v1 (rollback mode)")
    );
}

/// With v2 stored, every replica killed and started again at once (a node drain, a
/// crash loop, a `kubectl rollout restart` with a large surge): each replica lists
/// GpuJobs as v1, which needs the conversion webhook, which the webhook Service routes
/// only to ready replicas. Readiness used to wait for that very list, so none ever
/// became ready. Here the stand-in Service routes only to ready replicas, as deploy/'s
/// does; the replicas must still become ready and run the GpuJobs.
#[tokio::test]
async fn with_v2_stored_replicas_restarted_together_become_ready_and_run_gpujobs() {
    let s = Setup(WebhookCluster::new("cold", 2, StorageVersion::V2).await);
    s.ready_only
        .store(true, std::sync::atomic::Ordering::Relaxed);
    // Ready on an empty list, as before the fix: nothing to convert yet.
    let ready = |what: &'static str| {
        let urls: Vec<String> = s
            .metrics
            .iter()
            .map(|m| format!("http://{m}/readyz"))
            .collect();
        async move {
            wait::until(what, WAIT, Duration::from_millis(100), || {
                let urls = urls.clone();
                async move {
                    for url in &urls {
                        support::prometheus::get_text(url).await.ok()?;
                    }
                    Some(())
                }
            })
            .await
            .unwrap();
        }
    };
    let mut first = [s.replica(1, &[]), s.replica(2, &[])];
    ready("both replicas ready").await;
    s.create_v2(
        "before",
        json!({"image": "busybox", "resources": {"gpus": 1}}),
    )
    .await;
    let finished = |name: &'static str| {
        let api = s.raw("v2");
        async move {
            wait::until(
                &format!("GpuJob {name} Succeeded (read as v2: no conversion)"),
                WAIT,
                Duration::from_millis(200),
                || {
                    let api = api.clone();
                    async move {
                        let o = api.get(name).await.ok()?;
                        (o.data["status"]["phase"] == "Succeeded").then_some(())
                    }
                },
            )
            .await
            .unwrap();
        }
    };
    finished("before").await;

    // Every replica goes at once; a GpuJob arrives while none runs.
    for r in &mut first {
        r.signal(nix::sys::signal::Signal::SIGKILL);
        r.wait_exit(Duration::from_secs(10)).await;
    }
    drop(first);
    s.create_v2(
        "after",
        json!({"image": "busybox", "resources": {"gpus": 1}}),
    )
    .await;
    let _again = [s.replica(1, &[]), s.replica(2, &[])];
    finished("after").await;
    ready("both restarted replicas ready").await;
}
