//! `--metrics-secure` against the real API server: /metrics over HTTPS only to bearer
//! tokens whose user may `get` it (TokenReview, then SubjectAccessReview), each token
//! reviewed once per cache period; the probes stay plain HTTP on their own port.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use crate::support;

use std::path::PathBuf;
use std::sync::Arc;

use devcluster::identity::REPLICA_GROUP;
use devcluster::wait;
use gpujob_operator::server::auth::CACHE_TTL;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::rt::TokioExecutor;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use serde_json::json;
use support::prometheus::free_address;
use support::{POLL, TestEnv, WAIT, replicas};

const READER: &str = "gpujob-metrics-reader";
const METRICS_AUTH: &str = "gpujob-operator-metrics-auth";
/// The RBAC that comes with --metrics-secure (the secure-metrics component): the
/// operator's review rights and the reader role.
const SECURE_RBAC: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/deploy/secure-metrics/rbac.yaml"
);

fn secure_rbac(kind: &str, name: &str) -> serde_json::Value {
    std::fs::read_to_string(SECURE_RBAC)
        .map(|text| serde_saphyr::from_multiple::<serde_json::Value>(&text).unwrap())
        .unwrap()
        .into_iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("deploy/secure-metrics/rbac.yaml ships {kind} {name}"))
}

/// Whether the API server's RBAC already answers `allowed` for this question (a new
/// binding shows in its cache a moment after it is written).
async fn allowed(
    admin: &Client,
    user: &str,
    groups: &[&str],
    spec: SubjectAccessReviewSpec,
) -> bool {
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.to_owned()),
            groups: Some(groups.iter().map(|g| (*g).to_owned()).collect()),
            ..spec
        },
        ..Default::default()
    };
    Api::<SubjectAccessReview>::all(admin.clone())
        .create(&PostParams::default(), &review)
        .await
        .unwrap()
        .status
        .is_some_and(|s| s.allowed)
}

async fn wait_allowed(
    admin: &Client,
    what: &str,
    user: &str,
    groups: &[&str],
    spec: SubjectAccessReviewSpec,
) {
    wait::until(what, WAIT, POLL, || {
        let spec = spec.clone();
        async move { allowed(admin, user, groups, spec).await.then_some(()) }
    })
    .await
    .unwrap();
}

fn create_review(group: &str, resource: &str) -> SubjectAccessReviewSpec {
    SubjectAccessReviewSpec {
        resource_attributes: Some(ResourceAttributes {
            group: Some(group.to_owned()),
            resource: Some(resource.to_owned()),
            verb: Some("create".to_owned()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A service account in `ns` and a token for it from the TokenRequest API, as a pod's
/// projected token (what Prometheus sends) would be.
async fn service_account_token(admin: &Client, ns: &str, name: &str) -> String {
    let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), ns);
    let sa: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    sas.create(&PostParams::default(), &sa).await.unwrap();
    let request = TokenRequest {
        // No audiences: the API server's own, which its TokenReview accepts.
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..Default::default()
        }),
        ..Default::default()
    };
    let answer = sas
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .unwrap();
    answer.status.unwrap().token.unwrap()
}

/// A folder with `tls.crt` and `tls.key` as a mounted kubernetes.io/tls Secret has them:
/// the control plane's serving pair (for 127.0.0.1, signed by its CA).
fn cert_dir(cluster: &devcluster::ControlPlane, ns: &str) -> PathBuf {
    let pki = cluster.info().state_dir.join("pki");
    let dir = support::namespace_temp(support::METRICS_CERTS, ns);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(pki.join("apiserver.crt"), dir.join("tls.crt")).unwrap();
    std::fs::copy(pki.join("apiserver.key"), dir.join("tls.key")).unwrap();
    dir
}

type Https = HttpClient<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    Empty<bytes::Bytes>,
>;

/// An HTTP(S) client that trusts only the control plane's CA: the scrape verifies the
/// operator's certificate.
fn client(ca: &std::path::Path) -> Https {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .build();
    HttpClient::builder(TokioExecutor::new()).build(connector)
}

/// GET `url` with `token` as bearer: the status code and body, or the error.
async fn get(client: &Https, url: &str, token: Option<&str>) -> Result<(u16, String), String> {
    let mut req = http::Request::get(url);
    if let Some(t) = token {
        req = req.header(http::header::AUTHORIZATION, format!("Bearer {t}"));
    }
    let res = client
        .request(req.body(Empty::new()).unwrap())
        .await
        .map_err(|e| gpujob_operator::apierror::error_chain(&e))?;
    let code = res.status().as_u16();
    let body = res.into_body().collect().await.map_err(|e| e.to_string())?;
    Ok((code, String::from_utf8_lossy(&body.to_bytes()).into_owned()))
}

/// TokenReviews and SubjectAccessReviews made by `replica-1` since `cursor`.
fn reviews_since(
    cluster: &devcluster::ControlPlane,
    cursor: devcluster::audit::Cursor,
) -> (usize, usize) {
    let events = cluster.audit().since(cursor).unwrap();
    let count = |resource: &str| {
        events
            .iter()
            .filter(|e| e.user == "replica-1" && e.resource == resource && e.verb == "create")
            .count()
    };
    (count("tokenreviews"), count("subjectaccessreviews"))
}

#[tokio::test]
async fn metrics_are_served_over_https_to_allowed_tokens_only_and_probes_stay_plain() {
    let env = TestEnv::new("secure-metrics").await;
    let admin = &env.admin;
    let pp = PatchParams::apply("gpujob-tests").force();

    // The shipped reader role, bound to one service account of this test; another is
    // bound to nothing.
    // The shipped roles of the secure-metrics component: the reader role, and the
    // operator's review rights, bound (as that component binds them to the service
    // account) to the replica users' group.
    for name in [READER, METRICS_AUTH] {
        let role: ClusterRole = serde_json::from_value(secure_rbac("ClusterRole", name)).unwrap();
        Api::<ClusterRole>::all(admin.clone())
            .patch(name, &pp, &Patch::Apply(&role))
            .await
            .unwrap();
    }
    let mut review_binding = secure_rbac("ClusterRoleBinding", METRICS_AUTH);
    review_binding["metadata"]["name"] = json!(format!("{METRICS_AUTH}-test-replicas"));
    review_binding["subjects"] =
        json!([{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": REPLICA_GROUP}]);
    let review_binding: ClusterRoleBinding = serde_json::from_value(review_binding).unwrap();
    Api::<ClusterRoleBinding>::all(admin.clone())
        .patch(
            &format!("{METRICS_AUTH}-test-replicas"),
            &pp,
            &Patch::Apply(&review_binding),
        )
        .await
        .unwrap();
    let scraper_token = service_account_token(admin, &env.ns, "scraper").await;
    let stranger_token = service_account_token(admin, &env.ns, "stranger").await;
    let binding_name = format!("{READER}-{}", env.ns);
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": binding_name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": READER},
        "subjects": [{"kind": "ServiceAccount", "name": "scraper", "namespace": env.ns}],
    }))
    .unwrap();
    Api::<ClusterRoleBinding>::all(admin.clone())
        .patch(&binding_name, &pp, &Patch::Apply(&binding))
        .await
        .unwrap();

    // Judge only answers given after RBAC has caught up: the scraper's binding, and the
    // shipped review rights for the replica users.
    let scraper_user = format!("system:serviceaccount:{}:scraper", env.ns);
    let get_metrics = SubjectAccessReviewSpec {
        non_resource_attributes: Some(NonResourceAttributes {
            path: Some("/metrics".into()),
            verb: Some("get".into()),
        }),
        ..Default::default()
    };
    wait_allowed(
        admin,
        "the scraper may get /metrics",
        &scraper_user,
        &[],
        get_metrics.clone(),
    )
    .await;
    assert!(
        !allowed(
            admin,
            &format!("system:serviceaccount:{}:stranger", env.ns),
            &[],
            get_metrics
        )
        .await,
        "the stranger is bound to nothing"
    );
    for (group, resource) in [
        ("authentication.k8s.io", "tokenreviews"),
        ("authorization.k8s.io", "subjectaccessreviews"),
    ] {
        wait_allowed(
            admin,
            &format!("replicas may create {resource}"),
            "replica-1",
            &[REPLICA_GROUP],
            create_review(group, resource),
        )
        .await;
    }

    let certs = cert_dir(&env.cluster, &env.ns);
    let (metrics_addr, probe_addr) = (free_address(), free_address());
    let replica = replicas::start(
        &env.cluster,
        &env.ns,
        1,
        &[
            "--metrics-secure",
            "--metrics-cert-dir",
            certs.to_str().unwrap(),
            "--listen-address",
            &metrics_addr,
            "--probe-address",
            &probe_addr,
        ],
    );
    let http = client(&env.cluster.info().ca_file);
    let probes = format!("http://{probe_addr}");
    let metrics = format!("https://{metrics_addr}/metrics");

    // Probes: plain HTTP, no token, on their own port.
    wait::until("the replica to be ready", WAIT, POLL, || async {
        matches!(
            get(&http, &format!("{probes}/readyz"), None).await,
            Ok((200, _))
        )
        .then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", replica.log_text()));
    assert_eq!(
        get(&http, &format!("{probes}/healthz"), None)
            .await
            .unwrap()
            .0,
        200
    );
    assert_eq!(
        get(&http, &format!("{probes}/metrics"), None)
            .await
            .unwrap()
            .0,
        404,
        "metrics are not on the probe port"
    );
    // The metrics port speaks TLS only: a plain request gets no answer.
    assert!(
        get(&http, &format!("http://{metrics_addr}/metrics"), None)
            .await
            .is_err(),
        "plain HTTP to the metrics port"
    );

    let cursor = env.cluster.audit().cursor().unwrap();
    let (code, body) = get(&http, &metrics, None).await.unwrap();
    assert_eq!(code, 401, "no token: {body}");
    assert_eq!(
        reviews_since(&env.cluster, cursor),
        (0, 0),
        "no token, nothing to ask"
    );
    let (code, body) = get(&http, &metrics, Some("not-a-token")).await.unwrap();
    assert_eq!(code, 401, "a token the API server does not know: {body}");
    let (code, body) = get(&http, &metrics, Some(&stranger_token)).await.unwrap();
    assert_eq!(code, 403, "a valid token not bound to {READER}: {body}");
    assert!(body.contains(":stranger"), "{body}");
    assert_eq!(
        reviews_since(&env.cluster, cursor),
        (2, 1),
        "a TokenReview for each token, a SubjectAccessReview for the valid one"
    );

    let cursor = env.cluster.audit().cursor().unwrap();
    let started = tokio::time::Instant::now();
    for _ in 0..3 {
        let (code, body) = get(&http, &metrics, Some(&scraper_token)).await.unwrap();
        assert_eq!(code, 200, "{body}\n{}", replica.log_text());
        assert!(body.contains("# TYPE workqueue_depth gauge"), "{body}");
        assert!(body.contains("leader_election_master_status"), "{body}");
    }
    let (code, _) = get(&http, &metrics, Some(&stranger_token)).await.unwrap();
    assert_eq!(code, 403, "still denied");
    // Reviewed once for all three scrapes, the stranger's denial remembered too, as long
    // as the cache period has not run out meanwhile (a very slow machine).
    if started.elapsed() < CACHE_TTL {
        assert_eq!(reviews_since(&env.cluster, cursor), (1, 1));
    }
    std::fs::remove_dir_all(&certs).unwrap();
    Api::<ClusterRoleBinding>::all(admin.clone())
        .delete(&binding_name, &Default::default())
        .await
        .unwrap();
    drop(replica);
}
