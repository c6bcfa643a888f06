//! The conversion webhook's stand-ins for the tests that run it on a control plane of
//! their own (tests/integration/conversion.rs, tests/integration/migration.rs): its certificates, a TCP
//! forwarder in the place of its Service, and the control plane whose CRD calls it
//! ([`WebhookCluster`]).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use gpujob_operator::api::{Conversion, CrdOptions, StorageVersion};
use std::time::Duration;

use devcluster::wait;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use serde_json::json;

use super::prometheus::{free_address, get_text};
use super::replicas::{self, Replica};
use super::{TestEnv, WAIT};

/// A private control plane whose CRD sends conversions to a [`forwarder`] in front of
/// the replicas' webhook addresses (fixed, so a restarted replica comes back there).
pub struct WebhookCluster {
    pub env: TestEnv,
    pub cert_dir: PathBuf,
    /// The CRD's webhook URL and CA, to make the CRD again (another storage version).
    pub url: String,
    pub ca: String,
    /// Each replica's webhook address.
    pub webhook: Vec<String>,
    /// Each replica's metrics address.
    pub metrics: Vec<String>,
    /// Route conversions only to replicas whose `/readyz` answers ok, as the webhook
    /// Service of deploy/ does (its endpoints are the ready pods). Off by default.
    pub ready_only: Arc<AtomicBool>,
}

impl WebhookCluster {
    pub async fn new(prefix: &str, replicas: usize, storage: StorageVersion) -> WebhookCluster {
        let cert_dir =
            std::env::temp_dir().join(format!("gpujob-webhook-{prefix}-{}", std::process::id()));
        let ca = webhook_certs(&cert_dir);
        let webhook: Vec<String> = (0..replicas).map(|_| free_address()).collect();
        let metrics: Vec<String> = (0..replicas).map(|_| free_address()).collect();
        let ready_only = Arc::new(AtomicBool::new(false));
        let backends = webhook
            .iter()
            .zip(&metrics)
            .map(|(w, m)| Backend {
                address: w.parse().unwrap(),
                readyz: format!("http://{m}/readyz"),
            })
            .collect();
        let front = forwarder(backends, ready_only.clone()).await;
        let url = format!("https://{front}/convert");
        let crd = gpujob_operator::api::crd_yaml_with(&CrdOptions {
            conversion: Conversion::Url(url.clone()),
            ca_bundle: Some(ca.clone().into_bytes()),
            storage,
        })
        .unwrap();
        let crd_file = cert_dir.join("crd.yaml");
        std::fs::write(&crd_file, crd).unwrap();
        let env = TestEnv::private_with_crd(prefix, crd_file).await;
        WebhookCluster {
            env,
            cert_dir,
            url,
            ca,
            webhook,
            metrics,
            ready_only,
        }
    }

    /// Replica `n` (from 1) of the real binary, serving the webhook, with `extra` flags.
    pub fn replica(&self, n: u8, extra: &[&str]) -> Replica {
        let i = usize::from(n - 1);
        let mut args = vec![
            "--conversion-cert-dir",
            self.cert_dir.to_str().unwrap(),
            "--conversion-address",
            &self.webhook[i],
            "--listen-address",
            &self.metrics[i],
        ];
        args.extend_from_slice(extra);
        replicas::start(&self.env.cluster, &self.env.ns, n, &args)
    }

    /// Waits until a replica's webhook converts (a dry-run create of a v2 object: an
    /// empty list would not need the webhook at all).
    pub async fn wait_webhook(&self, what: &str) {
        let api = self.raw("v2");
        let object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "gpujob.dev/v2", "kind": "GpuJob",
            "metadata": {"name": "webhook-check"},
            "spec": {"image": "busybox", "resources": {"gpus": 1}},
        }))
        .unwrap();
        let dry_run = PostParams {
            dry_run: true,
            ..PostParams::default()
        };
        wait::until(what, WAIT, Duration::from_millis(100), || {
            let (api, object, dry_run) = (api.clone(), object.clone(), dry_run.clone());
            async move { api.create(&dry_run, &object).await.ok().map(|_| ()) }
        })
        .await
        .unwrap();
    }

    /// The raw objects as the API server sends them in `version` (no serde defaults
    /// filling in what the server left out).
    pub fn raw(&self, version: &str) -> Api<DynamicObject> {
        let gvk = GroupVersionKind::gvk("gpujob.dev", version, "GpuJob");
        let resource = ApiResource::from_gvk_with_plural(&gvk, "gpujobs");
        Api::namespaced_with(self.env.admin.clone(), &self.env.ns, &resource)
    }
}

impl Drop for WebhookCluster {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.cert_dir);
    }
}

/// A CA and a serving certificate for 127.0.0.1 it signed, in `dir` as a
/// kubernetes.io/tls Secret mounts them; returns the CA's PEM (the CRD's caBundle).
pub fn webhook_certs(dir: &Path) -> String {
    std::fs::create_dir_all(dir).unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()])
        .unwrap()
        .signed_by(&leaf_key, &ca, &ca_key)
        .unwrap();
    std::fs::write(dir.join("tls.crt"), leaf.pem()).unwrap();
    std::fs::write(dir.join("tls.key"), leaf_key.serialize_pem()).unwrap();
    ca.pem()
}

/// One replica behind the [`forwarder`].
#[derive(Debug, Clone)]
pub struct Backend {
    pub address: SocketAddr,
    /// Its readiness probe.
    pub readyz: String,
}

/// The stand-in for the webhook Service: each connection goes to the first backend that
/// accepts it (with `ready_only` set, the first whose `/readyz` answers ok, as a
/// Service's endpoints are its ready pods); with none, the connection is closed at once.
pub async fn forwarder(backends: Vec<Backend>, ready_only: Arc<AtomicBool>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut client, _)) = listener.accept().await else {
                continue;
            };
            let backends = backends.clone();
            let ready_only = ready_only.load(Ordering::Relaxed);
            tokio::spawn(async move {
                for backend in backends {
                    if ready_only && get_text(&backend.readyz).await.is_err() {
                        continue;
                    }
                    if let Ok(mut server) = tokio::net::TcpStream::connect(backend.address).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                        return;
                    }
                }
            });
        }
    });
    addr
}
