//! gpujob.dev/v2 served through the operator's conversion webhook, on a real control
//! plane of this test's own (the webhook CRD points at a URL on this machine; the
//! shared control plane keeps the v1-only CRD its other tests need). kube-apiserver
//! calls `https://127.0.0.1:<port>/convert`; the port is a small TCP forwarder standing
//! in for the webhook Service, passing each connection to the first replica that
//! accepts it, as a Service with ready endpoints would.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use crate::support;

use std::time::Duration;

use devcluster::{Identity, wait};
use gpujob_operator::api::{GpuJob, Phase, StorageVersion, v2};
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use nix::sys::signal::Signal;
use serde_json::{Value, json};
use support::replicas;
use support::webhook::WebhookCluster;
use support::{TestEnv, WAIT, phase, sim_env};

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

    fn v2(&self) -> Api<v2::GpuJob> {
        Api::namespaced(self.env.admin.clone(), &self.env.ns)
    }

    /// Waits until a replica's webhook converts and the API server can read every GpuJob
    /// there is as v2.
    async fn wait_v2_readable(&self, what: &str) {
        self.wait_webhook(what).await;
        let api = self.raw("v2");
        wait::until(what, WAIT, Duration::from_millis(100), || {
            let api = api.clone();
            // Each object by a GET, not only the list: from Kubernetes 1.31 a list is
            // served from the watch cache, which holds objects converted before the
            // webhook went, so it answers before the webhook does.
            async move {
                let list = api.list(&ListParams::default()).await.ok()?;
                for o in &list.items {
                    api.get(o.metadata.name.as_deref()?).await.ok()?;
                }
                Some(())
            }
        })
        .await
        .unwrap();
    }

    /// GpuJob `name` read as v1 and as v2 at one resourceVersion (the operator may write
    /// its status between two reads).
    async fn both(&self, name: &str) -> (GpuJob, v2::GpuJob) {
        let (v1, v2) = (self.env.gpujobs(), self.v2());
        wait::until(
            &format!("GpuJob {name} read as v1 and v2 at one resourceVersion"),
            WAIT,
            Duration::from_millis(100),
            || {
                let (v1, v2) = (v1.clone(), v2.clone());
                async move {
                    let a = v1.get(name).await.ok()?;
                    let b = v2.get(name).await.ok()?;
                    (a.metadata.resource_version == b.metadata.resource_version).then_some((a, b))
                }
            },
        )
        .await
        .unwrap()
    }

    /// `gpujob_conversion_requests_total{result}` of replica `n`.
    async fn conversions(&self, n: usize, result: &str) -> f64 {
        let text =
            support::prometheus::get_text(&format!("http://{}/metrics", self.metrics[n - 1]))
                .await
                .unwrap();
        devcluster::metrics::Metrics::parse(&text)
            .unwrap()
            .sum("gpujob_conversion_requests_total", &[("result", result)])
    }
}

fn spec(object: &DynamicObject) -> &Value {
    &object.data["spec"]
}

/// kubectl as the admin in the test's namespace, off the runtime's threads (the
/// forwarder in front of the webhook runs on them, and kubectl's reads need it).
async fn kubectl(env: &TestEnv, args: &[&str]) -> std::process::Output {
    let mut cmd = env.cluster.command("kubectl", Identity::Admin);
    cmd.arg("-n").arg(&env.ns).args(args);
    tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap()
}

/// examples/ teach gpujob.dev/v2, and the API server takes every one of them as
/// written (its v2 schema, strict field validation, and the webhook's conversion to the
/// stored v1, in a server-side dry run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_examples_are_v2_and_the_api_server_takes_them() {
    let examples = concat!(env!("CARGO_MANIFEST_DIR"), "/examples");
    let mut count = 0;
    for entry in std::fs::read_dir(examples).unwrap() {
        let path = entry.unwrap().path();
        let docs: Vec<serde_json::Value> =
            serde_saphyr::from_multiple(&std::fs::read_to_string(&path).unwrap()).unwrap();
        for d in docs.iter().filter(|d| !d.is_null()) {
            assert_eq!(d["apiVersion"], "gpujob.dev/v2", "{}", path.display());
            count += 1;
        }
    }
    assert!(count >= 4, "{count} examples");
    let s = Setup::new("examples", 1).await;
    let _replica = s.replica(1, &[]);
    s.wait_v2_readable("the webhook of replica-1 to answer")
        .await;
    let out = kubectl(
        &s.env,
        &[
            "apply",
            "--server-side",
            "--dry-run=server",
            "--validate=strict",
            "-f",
            examples,
        ],
    )
    .await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout
            .matches("serverside-applied (server dry run)")
            .count(),
        count,
        "{stdout}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_gpujob_read_as_v1_or_v2_with_each_versions_defaults() {
    let s = Setup::new("conv", 1).await;
    let env = &s.env;
    let _replica = s.replica(1, &[]);
    s.wait_v2_readable("the webhook of replica-1 to answer")
        .await;

    // Created as v1, it reads as v2 (status too, once the operator has run it) and back.
    env.create(
        "from-v1",
        json!({"image": "busybox", "gpus": 2, "maxRetries": 1, "activeDeadlineSeconds": 90,
               "env": sim_env(&[("SIM_EXIT_CODES", "0")])}),
    )
    .await;
    env.wait_gpujob("from-v1", "Succeeded", |g| {
        phase(g) == Some(Phase::Succeeded)
    })
    .await;
    let (done, as_v2) = s.both("from-v1").await;
    assert_eq!(as_v2.spec.resources.gpus, Some(2));
    assert_eq!(as_v2.spec.retry_policy.max_retries, 1);
    assert_eq!(as_v2.spec.attempt_deadline.as_deref(), Some("1m30s"));
    assert_eq!(as_v2.status, done.status, "the status, converted too");
    assert_eq!(
        as_v2.status.as_ref().and_then(|s| s.phase),
        Some(Phase::Succeeded)
    );
    assert_eq!(
        gpujob_operator::api::convert::to_v1(&as_v2),
        done,
        "v1 -> v2 -> v1 is the identity"
    );
    assert!(
        done.spec.v2.is_none(),
        "a v1 object that never met v2 has no spec.v2"
    );

    // Created as v2 with what only v2 can say: it survives in v1's spec.v2.
    let sent = json!({
        "apiVersion": "gpujob.dev/v2", "kind": "GpuJob",
        "metadata": {"name": "from-v2"},
        "spec": {
            "image": "busybox",
            "env": sim_env(&[("SIM_EXIT_CODES", "0")]),
            "resources": {"gpus": 1, "product": "NVIDIA-A100-SXM4-80GB"},
            "retryPolicy": {"maxRetries": 2, "backoffSeconds": 5},
            "attemptDeadline": "90m",
            "template": {"spec": {"tolerations": [{"key": "dedicated", "operator": "Exists"}]}},
        },
    });
    let created = s
        .raw("v2")
        .create(
            &PostParams::default(),
            &serde_json::from_value(sent.clone()).unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(
        spec(&created),
        &sent["spec"],
        "v2 -> v1 (stored) -> v2 is the identity"
    );
    let stored: GpuJob = env.gpujobs().get("from-v2").await.unwrap();
    assert_eq!(stored.spec.gpus, 1);
    assert_eq!(stored.spec.max_retries, 2);
    assert_eq!(stored.spec.active_deadline_seconds, Some(5400));
    let only = stored
        .spec
        .v2
        .clone()
        .expect("spec.v2 holds what v1 cannot say");
    assert_eq!(only.gpu_product.as_deref(), Some("NVIDIA-A100-SXM4-80GB"));
    assert_eq!(only.backoff_seconds, Some(5));
    assert_eq!(only.attempt_deadline.as_deref(), Some("90m"));
    assert_eq!(
        only.template.unwrap(),
        sent["spec"]["template"],
        "the template, as written"
    );
    env.wait_gpujob("from-v2", "Succeeded", |g| {
        phase(g) == Some(Phase::Succeeded)
    })
    .await;
    let (succeeded, read) = s.both("from-v2").await;
    assert_eq!(serde_json::to_value(&read.spec).unwrap(), sent["spec"]);
    assert_eq!(
        read.status, succeeded.status,
        "the status the operator wrote in v1, read in v2"
    );

    // Defaults: v2 without optional fields reads back with v2's, and as v1 with v1's.
    let bare = json!({
        "apiVersion": "gpujob.dev/v2", "kind": "GpuJob",
        "metadata": {"name": "bare"},
        "spec": {"image": "busybox", "resources": {"gpus": 1}, "suspend": true},
    });
    s.raw("v2")
        .create(
            &PostParams::default(),
            &serde_json::from_value(bare).unwrap(),
        )
        .await
        .unwrap();
    let as_v2 = s.raw("v2").get("bare").await.unwrap();
    assert_eq!(
        spec(&as_v2),
        &json!({"image": "busybox", "resources": {"gpus": 1}, "retryPolicy": {"maxRetries": 3}, "suspend": true}),
        "v2's defaults"
    );
    let as_v1 = s.raw("v1").get("bare").await.unwrap();
    assert_eq!(
        spec(&as_v1),
        &json!({"image": "busybox", "gpus": 1, "maxRetries": 3, "suspend": true}),
        "v1's defaults, and no spec.v2"
    );

    // v2's CEL rules refuse, naming the field, what the operator would otherwise only
    // report as InvalidSpec after the fact.
    for (name, spec, field) in [
        (
            "product-disagrees",
            json!({"image": "busybox", "resources": {"gpus": 1, "product": "NVIDIA-A100-SXM4-80GB"},
                   "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}}),
            "spec.nodeSelector",
        ),
        (
            "deadline-zero",
            json!({"image": "busybox", "resources": {"gpus": 1}, "attemptDeadline": "0s"}),
            "spec.attemptDeadline",
        ),
        (
            "product-empty",
            json!({"image": "busybox", "resources": {"gpus": 1, "product": ""}}),
            "spec.resources.product",
        ),
        (
            "gpus-and-devices",
            json!({"image": "busybox", "resources": {"gpus": 1,
                   "devices": {"exactly": {"deviceClassName": "gpu.example.com"}}}}),
            "spec.resources",
        ),
        (
            "neither-gpus-nor-devices",
            json!({"image": "busybox", "resources": {}}),
            "spec.resources",
        ),
        (
            "product-with-devices",
            json!({"image": "busybox", "resources": {"product": "NVIDIA-H100",
                   "devices": {"exactly": {"deviceClassName": "gpu.example.com"}}}}),
            "spec.resources.product",
        ),
        (
            "exactly-and-alternatives",
            json!({"image": "busybox", "resources": {"devices": {
                   "exactly": {"deviceClassName": "gpu.example.com"},
                   "firstAvailable": [{"name": "a", "deviceClassName": "gpu.example.com"}]}}}),
            "spec.resources.devices",
        ),
    ] {
        let object = json!({
            "apiVersion": "gpujob.dev/v2", "kind": "GpuJob",
            "metadata": {"name": name}, "spec": spec,
        });
        let err = s
            .raw("v2")
            .create(
                &PostParams::default(),
                &serde_json::from_value(object).unwrap(),
            )
            .await
            .expect_err(&format!("{name}: {spec} must be refused"));
        let kube::Error::Api(status) = err else {
            panic!("{name}: not an API error: {err:?}");
        };
        assert_eq!(status.code, 422, "{name}: {}", status.message);
        assert!(
            status.message.contains(field),
            "{name}: message does not name {field}: {}",
            status.message
        );
    }

    // kubectl: the preferred version is v2 (its columns); v1 warns that it is deprecated.
    let out = kubectl(env, &["get", "gj", "-o", "wide"]).await;
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for name in ["from-v1", "from-v2", "bare"] {
        assert!(table.contains(name), "{table}");
    }
    let from_v1_row = table.lines().find(|l| l.starts_with("from-v1")).unwrap();
    assert!(
        from_v1_row.split_whitespace().nth(2) == Some("2"),
        "GPUs from spec.resources.gpus: {table}"
    );
    let out = kubectl(
        env,
        &["get", "gpujobs.v1.gpujob.dev", "from-v1", "-o", "name"],
    )
    .await;
    assert!(out.status.success());
    let warning = String::from_utf8_lossy(&out.stderr);
    assert!(
        warning.contains("gpujob.dev/v1 GpuJob is deprecated; use gpujob.dev/v2"),
        "{warning}"
    );
    let out = kubectl(
        env,
        &[
            "get",
            "gj",
            "from-v2",
            "-o",
            "jsonpath={.apiVersion} {.spec.resources.product}",
        ],
    )
    .await;
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "gpujob.dev/v2 NVIDIA-A100-SXM4-80GB"
    );

    assert!(s.conversions(1, "success").await > 0.0);
    assert_eq!(s.conversions(1, "failed").await, 0.0);

    // Last, as it replaces the CRD's caBundle: scripts/webhook-cert.sh (clusters without
    // cert-manager) writes the Secret and puts its CA into the CRD beside the one in use,
    // so the certificate the replicas serve still passes; a second rotation drops the
    // test's CA, and then it no longer does.
    script_makes_the_secret_and_the_ca_bundle(&s).await;
}

/// The CRD's caBundle, decoded.
async fn ca_bundle(s: &Setup) -> Vec<u8> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let crd = Api::<CustomResourceDefinition>::all(s.env.admin.clone())
        .get("gpujobs.gpujob.dev")
        .await
        .unwrap();
    crd.spec
        .conversion
        .unwrap()
        .webhook
        .unwrap()
        .client_config
        .unwrap()
        .ca_bundle
        .unwrap()
        .0
}

/// The first PEM certificate of `bundle`, with its line end.
fn first_pem(bundle: &[u8]) -> String {
    let text = String::from_utf8_lossy(bundle);
    let end = "-----END CERTIFICATE-----";
    let at = text.find(end).expect("a PEM certificate") + end.len();
    format!("{}\n", &text[..at])
}

/// Runs scripts/webhook-cert.sh (`args`) for the test's namespace, keeping its files in
/// `keep`; returns its standard error.
async fn webhook_cert_script(s: &Setup, keep: &std::path::Path, args: &[&str]) -> (bool, String) {
    let mut cmd = s.env.cluster.command(
        concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/webhook-cert.sh"),
        Identity::Admin,
    );
    cmd.env("NAMESPACE", &s.env.ns)
        .env("KEEP_DIR", keep)
        .args(args);
    let out = tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

async fn script_makes_the_secret_and_the_ca_bundle(s: &Setup) {
    use k8s_openapi::api::core::v1::Secret;
    let keep = s.cert_dir.join("script");
    let (ok, err) = webhook_cert_script(s, &keep, &["--check"]).await;
    assert!(!ok && err.contains("no readable certificate"), "{err}");
    let before = ca_bundle(s).await;
    let (ok, err) = webhook_cert_script(s, &keep, &[]).await;
    assert!(ok, "webhook-cert.sh: {err}");
    assert!(err.contains("valid until"), "it says when to renew: {err}");
    let secret = Api::<Secret>::namespaced(s.env.admin.clone(), &s.env.ns)
        .get("gpujob-operator-webhook-tls")
        .await
        .unwrap();
    assert_eq!(secret.type_.as_deref(), Some("kubernetes.io/tls"));
    let data = secret.data.unwrap();
    assert_eq!(
        data["tls.crt"].0,
        std::fs::read(keep.join("tls.crt")).unwrap()
    );
    assert_eq!(
        data["tls.key"].0,
        std::fs::read(keep.join("tls.key")).unwrap()
    );
    let ca = std::fs::read_to_string(keep.join("ca.crt")).unwrap();
    // (Compared without carriage returns: a PEM may end its lines either way.)
    assert_eq!(
        String::from_utf8(ca_bundle(s).await)
            .unwrap()
            .replace('\r', ""),
        format!("{ca}{}", first_pem(&before)).replace('\r', ""),
        "the caBundle is the script's CA, then the one in use"
    );
    // 365 days: --check says so, and passes.
    let (ok, err) = webhook_cert_script(s, &keep, &["--check"]).await;
    assert!(ok && err.contains("valid until"), "{err}");
    let text = std::process::Command::new("openssl")
        .args(["x509", "-noout", "-text", "-in"])
        .arg(keep.join("tls.crt"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains(&format!("DNS:gpujob-operator-webhook.{}.svc", s.env.ns)),
        "for the Service's name: {text}"
    );
    // The replicas still serve the test's certificate: it still passes.
    let api = s.raw("v2");
    api.get("from-v1").await.unwrap();
    // A second rotation keeps the first script CA and drops the test's.
    let first = ca;
    let (ok, err) = webhook_cert_script(s, &keep, &[]).await;
    assert!(ok, "webhook-cert.sh: {err}");
    let ca = std::fs::read_to_string(keep.join("ca.crt")).unwrap();
    assert_eq!(
        String::from_utf8(ca_bundle(s).await)
            .unwrap()
            .replace('\r', ""),
        format!("{ca}{first}").replace('\r', "")
    );
    wait::until(
        "the API server to refuse the certificate the new caBundle did not sign",
        WAIT,
        Duration::from_millis(100),
        || {
            let api = api.clone();
            async move {
                let err = api.get("from-v1").await.err()?.to_string();
                err.contains("x509").then_some(())
            }
        },
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conversion_survives_a_leader_kill_and_a_webhook_outage_loses_nothing() {
    let s = Setup::new("convha", 2).await;
    let env = &s.env;
    let mut replicas = vec![s.replica(1, &[]), s.replica(2, &[])];
    s.wait_v2_readable("the webhooks to answer").await;
    let (leader, _) =
        replicas::wait_holder(&env.admin, &env.ns, WAIT, |h| h.starts_with("replica-")).await;

    let sent = json!({
        "apiVersion": "gpujob.dev/v2", "kind": "GpuJob",
        "metadata": {"name": "kept"},
        "spec": {"image": "busybox", "resources": {"gpus": 1, "product": "NVIDIA-H100"},
                 "retryPolicy": {"maxRetries": 1, "backoffSeconds": 2}, "attemptDeadline": "2.5s",
                 "suspend": true},
    });
    s.raw("v2")
        .create(
            &PostParams::default(),
            &serde_json::from_value(sent.clone()).unwrap(),
        )
        .await
        .unwrap();

    // kill -9 of the leader: the other replica answers every conversion from then on,
    // and takes over the reconciling.
    let i = replicas
        .iter()
        .position(|r| r.identity() == leader)
        .unwrap();
    let mut dead = replicas.remove(i);
    dead.signal(Signal::SIGKILL);
    dead.wait_exit(Duration::from_secs(10)).await;
    for _ in 0..20 {
        let read = s.raw("v2").get("kept").await.unwrap();
        assert_eq!(spec(&read), &sent["spec"]);
    }
    env.create(
        "after-kill",
        json!({"image": "busybox", "gpus": 1, "env": sim_env(&[("SIM_EXIT_CODES", "0")])}),
    )
    .await;
    env.wait_gpujob("after-kill", "Succeeded under the new leader", |g| {
        phase(g) == Some(Phase::Succeeded)
    })
    .await;
    let read = s.raw("v2").get("after-kill").await.unwrap();
    assert_eq!(read.data["status"]["phase"], "Succeeded");

    // No replica left: v2 cannot be read, and the error says why; v1 still can.
    let before: GpuJob = env.gpujobs().get("kept").await.unwrap();
    let mut last = replicas.pop().unwrap();
    last.signal(Signal::SIGKILL);
    last.wait_exit(Duration::from_secs(10)).await;
    let err = s.raw("v2").get("kept").await.unwrap_err().to_string();
    assert!(err.contains("conversion webhook"), "{err}");
    // A list may still be answered: from Kubernetes 1.31 a consistent list is served
    // from the watch cache, which holds the objects it converted before the outage. It
    // then holds exactly what was there; otherwise it fails naming the webhook.
    match s.raw("v2").list(&ListParams::default()).await {
        Err(e) => assert!(e.to_string().contains("conversion webhook"), "{e}"),
        Ok(list) => {
            let mut names: Vec<_> = list
                .items
                .iter()
                .filter_map(|o| o.metadata.name.clone())
                .collect();
            names.sort();
            assert_eq!(names, ["after-kill", "kept"]);
            assert!(list.items.iter().all(|o| {
                o.types
                    .as_ref()
                    .is_some_and(|t| t.api_version == "gpujob.dev/v2")
            }));
        }
    }
    let during: GpuJob = env.gpujobs().get("kept").await.unwrap();
    assert_eq!(during, before, "v1, the stored version, needs no webhook");
    assert_eq!(
        env.gpujobs()
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        2
    );

    // A replica comes back: v2 again, nothing lost.
    drop(dead);
    let _back = s.replica(1, &[]);
    s.wait_v2_readable("the webhook of the restarted replica-1")
        .await;
    let read = s.raw("v2").get("kept").await.unwrap();
    assert_eq!(spec(&read), &sent["spec"]);
    let after: GpuJob = env.gpujobs().get("kept").await.unwrap();
    assert_eq!(after, before);
}
