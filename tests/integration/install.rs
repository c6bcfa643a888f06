//! The shipped install (deploy/): every kustomize tree renders, the API server accepts
//! every rendered object (server-side dry run), the operator's service account can do
//! nothing beyond a reviewed list, and the user roles aggregate into the built-in ones.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use crate::support;

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use clap::Parser;

use devcluster::{ControlPlane, Identity, wait};
use gpujob_operator::api::GpuJob;
use k8s_openapi::api::rbac::v1::{ClusterRole, RoleBinding};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, Resource};
use serde_json::json;
use support::{CRD, POLL, WAIT};

const USER_ROLES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/crd/user-roles.yaml");
const DEPLOY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy");

/// `kubectl kustomize dir`, parsed.
fn render(dir: &Path) -> Vec<serde_json::Value> {
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(dir)
        .output()
        .expect("run kubectl kustomize");
    assert!(
        out.status.success(),
        "kubectl kustomize {} failed: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_saphyr::from_multiple(&String::from_utf8(out.stdout).unwrap()).unwrap()
}

/// Renders an overlay written to a temporary folder: `body` is its kustomization.yaml,
/// with `{deploy}` standing for the path of deploy/ (kustomize takes relative paths only).
fn render_kustomization(body: &str) -> Vec<serde_json::Value> {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "gpujob-overlay-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let up = "../".repeat(dir.components().count() - 1);
    let deploy = Path::new(DEPLOY)
        .strip_prefix("/")
        .unwrap()
        .display()
        .to_string();
    std::fs::write(
        dir.join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n{}",
            body.replace("{deploy}", &format!("{up}{deploy}"))
        ),
    )
    .unwrap();
    let objects = render(&dir);
    std::fs::remove_dir_all(&dir).unwrap();
    objects
}

/// The operator with `components` of deploy/, as docs/install.md shows it.
fn render_overlay(components: &[&str]) -> Vec<serde_json::Value> {
    let components: Vec<String> = components
        .iter()
        .map(|c| format!("{{deploy}}/{c}"))
        .collect();
    render_kustomization(&format!(
        "resources: [{{deploy}}/operator]\ncomponents: [{}]\n",
        components.join(", ")
    ))
}

fn trees() -> Vec<(&'static str, Vec<serde_json::Value>)> {
    let with_monitoring = render_overlay(&["monitoring"]);
    let secure = render_overlay(&["monitoring", "secure-metrics"]);
    vec![
        ("deploy", render(Path::new(DEPLOY))),
        ("deploy/crd", render(&Path::new(DEPLOY).join("crd"))),
        (
            "deploy/operator",
            render(&Path::new(DEPLOY).join("operator")),
        ),
        ("operator + monitoring", with_monitoring),
        ("operator + monitoring + secure-metrics", secure),
    ]
}

fn kind_name(o: &serde_json::Value) -> (String, String) {
    (
        o["kind"].as_str().unwrap().to_owned(),
        o["metadata"]["name"].as_str().unwrap().to_owned(),
    )
}

fn kinds(objects: &[serde_json::Value]) -> BTreeSet<(String, String)> {
    objects.iter().map(kind_name).collect()
}

fn named<'a>(objects: &'a [serde_json::Value], kind: &str) -> &'a serde_json::Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind}"))
}

#[test]
fn every_tree_renders_with_what_it_should_hold() {
    let trees = trees();
    let [
        (_, base),
        (_, crd),
        (_, operator),
        (_, monitoring),
        (_, secure),
    ] = &trees[..]
    else {
        unreachable!()
    };
    let s = |v: &[(&str, &str)]| -> BTreeSet<(String, String)> {
        v.iter()
            .map(|(k, n)| (k.to_string(), n.to_string()))
            .collect()
    };
    assert_eq!(
        kinds(crd),
        s(&[
            ("CustomResourceDefinition", "gpujobs.gpujob.dev"),
            ("ClusterRole", "gpujob-view"),
            ("ClusterRole", "gpujob-edit"),
            ("ClusterRole", "gpujob-migrate-storage"),
        ]),
        "deploy/crd holds the API, its user roles and the migration's role only"
    );
    assert_eq!(
        kinds(operator),
        s(&[
            ("Namespace", "gpujob-system"),
            ("ServiceAccount", "gpujob-operator"),
            ("ClusterRole", "gpujob-operator"),
            ("ClusterRoleBinding", "gpujob-operator"),
            ("Role", "gpujob-operator-lease"),
            ("RoleBinding", "gpujob-operator-lease"),
            ("Deployment", "gpujob-operator"),
            ("PodDisruptionBudget", "gpujob-operator"),
            ("Service", "gpujob-operator"),
            ("Service", "gpujob-operator-webhook"),
            ("NetworkPolicy", "gpujob-operator"),
        ]),
        "deploy/operator holds no CRD: uninstalling it keeps every GpuJob"
    );
    assert_eq!(
        kinds(base),
        kinds(crd).union(&kinds(operator)).cloned().collect(),
        "deploy/ is both"
    );
    assert_eq!(
        kinds(monitoring),
        kinds(operator)
            .union(&s(&[
                ("ServiceMonitor", "gpujob-operator"),
                ("PrometheusRule", "gpujob-operator"),
                ("ConfigMap", "gpujob-operator-dashboard"),
            ]))
            .cloned()
            .collect()
    );

    let version = env!("CARGO_PKG_VERSION");
    for (tree, objects) in &trees {
        for o in objects {
            let labels = &o["metadata"]["labels"];
            for key in ["name", "component", "part-of"] {
                assert!(
                    labels[format!("app.kubernetes.io/{key}")].is_string(),
                    "{tree}: {:?} lacks app.kubernetes.io/{key}",
                    kind_name(o)
                );
            }
            let component = labels["app.kubernetes.io/component"].as_str().unwrap();
            if component != "monitoring" {
                assert_eq!(
                    labels["app.kubernetes.io/version"],
                    version,
                    "{tree}: {:?}",
                    kind_name(o)
                );
                assert_eq!(labels["app.kubernetes.io/managed-by"], "kustomize");
            }
        }
    }
    // The component's labels are its own: they do not relabel the operator's objects.
    assert_eq!(
        named(monitoring, "Deployment")["metadata"]["labels"]["app.kubernetes.io/component"],
        "controller"
    );

    let deployment = named(operator, "Deployment");
    let pod = &deployment["spec"]["template"]["spec"];
    let image = pod["containers"][0]["image"].as_str().unwrap();
    assert_eq!(
        image,
        format!("registry.example.com/gpujob-operator:{version}")
    );
    assert_eq!(
        pod["topologySpreadConstraints"][0]["topologyKey"],
        "topology.kubernetes.io/zone"
    );
    assert_eq!(
        deployment["spec"]["selector"]["matchLabels"],
        serde_json::json!({"app.kubernetes.io/name": "gpujob-operator"}),
        "the selector never changes (immutable)"
    );
    assert_eq!(
        named(operator, "Namespace")["metadata"]["labels"]["pod-security.kubernetes.io/enforce"],
        "restricted"
    );
    let monitor = named(monitoring, "ServiceMonitor");
    assert!(
        monitor["spec"].get("namespaceSelector").is_none(),
        "the ServiceMonitor scrapes its own namespace, wherever that is"
    );
    assert_eq!(monitor["spec"]["endpoints"][0]["scheme"], "http");

    // The secure-metrics component: the same objects, the operator asked for HTTPS
    // metrics (flags the real command line accepts) with probes on a port of their own,
    // and Prometheus asked to scrape it with its token.
    assert_eq!(
        kinds(secure),
        kinds(monitoring)
            .union(&s(&[
                ("ClusterRole", "gpujob-operator-metrics-auth"),
                ("ClusterRoleBinding", "gpujob-operator-metrics-auth"),
                ("ClusterRole", "gpujob-metrics-reader"),
                ("ServiceAccount", "gpujob-operator-metrics-scraper"),
                ("Secret", "gpujob-operator-metrics-scraper-token"),
                ("ClusterRoleBinding", "gpujob-operator-metrics-scraper"),
            ]))
            .cloned()
            .collect(),
        "secure metrics brings the rights it needs, and only it"
    );
    let container = &named(secure, "Deployment")["spec"]["template"]["spec"]["containers"][0];
    let args: Vec<&str> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    let mut argv = vec!["gpujob-operator"];
    argv.extend(&args);
    let cli = gpujob_operator::cli::Cli::try_parse_from(argv).unwrap();
    let gpujob_operator::cli::Command::Run(run) = cli.command else {
        panic!("{args:?} is not `run`")
    };
    let listen = run.listen().unwrap();
    assert!(listen.tls.is_some(), "{args:?}");
    let probe_port = listen.probes.expect("a probe address").port();
    let port_named = |name: &str| {
        container["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .unwrap_or_else(|| panic!("no port {name}"))["containerPort"]
            .clone()
    };
    assert_eq!(port_named("probes"), probe_port);
    assert_eq!(port_named("metrics"), listen.metrics.port());
    for probe in ["livenessProbe", "readinessProbe"] {
        assert_eq!(container[probe]["httpGet"]["port"], "probes", "{probe}");
    }
    let endpoint = &named(secure, "ServiceMonitor")["spec"]["endpoints"][0];
    assert_eq!(endpoint["scheme"], "https");
    // The scraper's token, from the component's Secret (not the deprecated bearerTokenFile).
    assert!(endpoint.get("bearerTokenFile").is_none(), "{endpoint}");
    assert_eq!(endpoint["authorization"]["type"], "Bearer");
    assert_eq!(
        endpoint["authorization"]["credentials"],
        json!({"name": "gpujob-operator-metrics-scraper-token", "key": "token"})
    );
    assert_eq!(endpoint["tlsConfig"]["insecureSkipVerify"], true);
    assert_eq!(
        &render_overlay(&["secure-metrics", "monitoring"]),
        secure,
        "the components' order does not matter"
    );
    assert_eq!(
        render_overlay(&["secure-metrics"]).len(),
        operator.len() + 6,
        "without the monitoring component it patches the Deployment and adds its RBAC and \
         the scraper alone"
    );
    check_conversion_webhook(crd, operator);
}

/// The conversion webhook is wired end to end: the CRD names the Service, the Service
/// the container port the operator's --conversion-address listens on, the Deployment
/// mounts the Secret at --conversion-cert-dir, and the cert-manager component issues
/// that Secret for the Service's name and is what the CRD's annotation names.
fn check_conversion_webhook(crd: &[serde_json::Value], operator: &[serde_json::Value]) {
    let crd = named(crd, "CustomResourceDefinition");
    let conversion = &crd["spec"]["conversion"];
    assert_eq!(conversion["strategy"], "Webhook");
    let service_ref = &conversion["webhook"]["clientConfig"]["service"];
    let service = operator
        .iter()
        .find(|o| o["kind"] == "Service" && o["metadata"]["name"] == service_ref["name"])
        .unwrap_or_else(|| panic!("no Service {}", service_ref["name"]));
    assert_eq!(service["metadata"]["namespace"], service_ref["namespace"]);
    assert_eq!(service["spec"]["ports"][0]["port"], service_ref["port"]);
    let deployment = named(operator, "Deployment");
    // Every replica answers: the Service selects what every pod carries (the Deployment's
    // selector and this install's instance label, so not another install's pods).
    let pod_labels = &deployment["spec"]["template"]["metadata"]["labels"];
    let selector = service["spec"]["selector"].as_object().unwrap();
    for (k, v) in deployment["spec"]["selector"]["matchLabels"]
        .as_object()
        .unwrap()
    {
        assert_eq!(selector.get(k), Some(v), "the Service selects {k}");
    }
    for (k, v) in selector {
        assert_eq!(
            &pod_labels[k], v,
            "every replica answers: the pods lack {k}"
        );
    }
    assert!(
        selector.contains_key("app.kubernetes.io/instance"),
        "{selector:?}"
    );
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let args: Vec<&str> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    let mut argv = vec!["gpujob-operator"];
    argv.extend(&args);
    let gpujob_operator::cli::Command::Run(run) = gpujob_operator::cli::Cli::try_parse_from(argv)
        .unwrap()
        .command
    else {
        panic!("{args:?} is not `run`")
    };
    let target = service["spec"]["ports"][0]["targetPort"].as_str().unwrap();
    let port = container["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == target)
        .unwrap_or_else(|| panic!("no container port {target}"));
    assert_eq!(port["containerPort"], run.conversion_address.port());
    let cert_dir = run.conversion_cert_dir.expect("--conversion-cert-dir");
    let mount = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["mountPath"] == cert_dir.to_str().unwrap())
        .expect("the certificate folder is mounted");
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .unwrap();
    let secret = volume["secret"]["secretName"].as_str().unwrap();

    let with_cert_manager = render_overlay(&["cert-manager"]);
    // The serving certificate, the one whose Secret the pods mount (beside it: the root).
    let certificate = with_cert_manager
        .iter()
        .find(|o| o["kind"] == "Certificate" && o["spec"]["secretName"] == secret)
        .unwrap_or_else(|| panic!("no Certificate issues {secret}"));
    let dns = format!(
        "{}.{}.svc",
        service_ref["name"].as_str().unwrap(),
        service_ref["namespace"].as_str().unwrap()
    );
    assert!(
        certificate["spec"]["dnsNames"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n == dns.as_str()),
        "the certificate is for {dns}"
    );
    assert_eq!(
        crd["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
        format!(
            "{}/{}",
            certificate["metadata"]["namespace"].as_str().unwrap(),
            certificate["metadata"]["name"].as_str().unwrap()
        )
    );
    wiring(&render_kustomization(EVERYTHING)).unwrap();
}

/// `kubectl api-versions` of the control plane.
fn served_api_versions(cluster: &ControlPlane) -> BTreeSet<String> {
    let out = cluster
        .command("kubectl", Identity::Admin)
        .arg("api-versions")
        .output()
        .unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// `kubectl apply --server-side` of `objects`, with `extra` arguments (a dry run):
/// kubectl's output, or what it said when the API server refused. Strict field
/// validation: a field the schema does not know is refused, not dropped.
fn try_kubectl_apply(
    cluster: &ControlPlane,
    objects: &[serde_json::Value],
    extra: &[&str],
) -> Result<String, String> {
    let mut child = cluster
        .command("kubectl", Identity::Admin)
        .args([
            "apply",
            "--server-side",
            "--force-conflicts",
            "--validate=strict",
            "--field-manager=gpujob-install-test",
            "-f",
            "-",
        ])
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": objects});
    child
        .stdin
        .take()
        .unwrap()
        .write_all(list.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    if out.status.success() {
        Ok(String::from_utf8(out.stdout).unwrap())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// [`try_kubectl_apply`], which must succeed.
fn kubectl_apply(cluster: &ControlPlane, objects: &[serde_json::Value], extra: &[&str]) -> String {
    try_kubectl_apply(cluster, objects, extra)
        .unwrap_or_else(|e| panic!("kubectl apply {extra:?} failed: {e}"))
}

/// The CRDs of the Prometheus Operator (ServiceMonitor, PrometheusRule) and cert-manager
/// (Certificate, Issuer), the versions scripts/third-party-crds.sh pins: it prints the
/// file (GPUJOB_THIRD_PARTY_CRDS, which scripts/test.sh sets and starts the shared
/// control plane with, or its cache, fetching the Go modules once when missing).
fn third_party_crds() -> PathBuf {
    static FILE: OnceLock<PathBuf> = OnceLock::new();
    FILE.get_or_init(|| {
        PathBuf::from(
            run(Command::new(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/scripts/third-party-crds.sh"
            )))
            .trim(),
        )
    })
    .clone()
}

/// A control plane serving GpuJobs and the other projects' kinds the install renders.
async fn control_plane_with_third_party_crds() -> ControlPlane {
    let third_party = third_party_crds();
    ControlPlane::for_tests(&[Path::new(CRD), &third_party])
        .await
        .unwrap()
}

/// The kinds of other projects the install renders: a dry run must send each of them.
const THIRD_PARTY_KINDS: &[&str] = &["ServiceMonitor", "PrometheusRule", "Certificate", "Issuer"];

/// Every object's apiVersion is served by this control plane: nothing is left out of a
/// dry run.
fn all_served(tree: &str, objects: &[serde_json::Value], served: &BTreeSet<String>) {
    for o in objects {
        assert!(
            served.contains(o["apiVersion"].as_str().unwrap()),
            "{tree}: {:?}: {} is not served (the Prometheus Operator's and cert-manager's \
             CRDs come from scripts/third-party-crds.sh)",
            kind_name(o),
            o["apiVersion"]
        );
    }
}

#[tokio::test]
async fn the_api_server_accepts_every_rendered_object() {
    gpujob_operator::client::install_crypto_provider();
    let cluster = control_plane_with_third_party_crds().await;
    let served = served_api_versions(&cluster);
    let trees = trees();
    // Objects in gpujob-system need the namespace to exist, even in a dry run.
    let namespace = named(&trees[2].1, "Namespace").clone();
    kubectl_apply(&cluster, &[namespace], &[]);
    let mut sent = BTreeSet::new();
    for (tree, objects) in &trees {
        sent.extend(dry_run(&cluster, &served, tree, objects));
    }
    for component in ["cert-manager", "monitoring", "secure-metrics"] {
        sent.extend(dry_run(
            &cluster,
            &served,
            &format!("deploy/operator + {component}"),
            &render_overlay(&[component]),
        ));
    }
    sent.extend(dry_run(
        &cluster,
        &served,
        "deploy + every component",
        &render_kustomization(EVERYTHING),
    ));
    // Moved and renamed (into a namespace that exists: a dry run creates none).
    let ns = cluster.create_namespace("install-moved").await.unwrap();
    sent.extend(dry_run(
        &cluster,
        &served,
        "an overlay with namespace, namePrefix and the wiring",
        &render_kustomization(&format!(
            "{EVERYTHING}namespace: {ns}\nnamePrefix: {ns}-\ntransformers: [{{deploy}}/wiring]\n"
        )),
    ));
    for kind in THIRD_PARTY_KINDS {
        assert!(sent.contains(*kind), "no {kind} was dry-run: {sent:?}");
    }
}

/// The dry run would catch a mistake in the other projects' kinds: the real CRDs'
/// schemas refuse an unknown field, a malformed duration, a missing required field.
#[tokio::test]
async fn the_api_server_refuses_a_broken_monitoring_or_certificate_object() {
    gpujob_operator::client::install_crypto_provider();
    let cluster = control_plane_with_third_party_crds().await;
    let ns = cluster.create_namespace("install-broken").await.unwrap();
    let objects = render_kustomization(&format!(
        "{EVERYTHING}namespace: {ns}\ntransformers: [{{deploy}}/wiring]\n"
    ));
    let of_kind = |kind: &str| {
        objects
            .iter()
            .filter(|o| o["kind"] == kind)
            .cloned()
            .collect::<Vec<_>>()
    };
    // As rendered, each is accepted: the refusals below are the edits'.
    for kind in THIRD_PARTY_KINDS {
        kubectl_apply(&cluster, &of_kind(kind), &["--dry-run=server"]);
    }
    type Edit = fn(&mut serde_json::Value);
    let broken: [(&str, Edit, &str); 4] = [
        (
            "ServiceMonitor",
            |o| o["spec"]["endpoints"][0]["schme"] = json!("https"),
            "schme",
        ),
        (
            "PrometheusRule",
            |o| o["spec"]["groups"][0]["rules"][0]["for"] = json!("ten minutes"),
            "for",
        ),
        (
            "Certificate",
            |o| o["spec"]["dnsName"] = json!("gpujob-operator-webhook"),
            "dnsName",
        ),
        (
            "Issuer",
            |o| {
                if let Some(ca) = o["spec"]["ca"].as_object_mut() {
                    ca.remove("secretName");
                }
            },
            "secretName",
        ),
    ];
    for (kind, edit, field) in broken {
        let mut objects = of_kind(kind);
        // The CA Issuer, for the Issuer (the other is self-signed).
        objects.retain(|o| kind != "Issuer" || o["spec"]["ca"].is_object());
        assert!(!objects.is_empty(), "no {kind} to break");
        for o in &mut objects {
            edit(o);
        }
        let refused = try_kubectl_apply(&cluster, &objects, &["--dry-run=server"])
            .expect_err(&format!("a {kind} with a broken {field} was accepted"));
        assert!(refused.contains(field), "{kind}: {refused}");
    }
}

/// A server-side dry run of `objects`; every object must be served and reported
/// applied. Returns the kinds sent.
fn dry_run(
    cluster: &ControlPlane,
    served: &BTreeSet<String>,
    tree: &str,
    objects: &[serde_json::Value],
) -> BTreeSet<String> {
    all_served(tree, objects, served);
    assert!(
        objects
            .iter()
            .any(|o| o["kind"] == "Deployment" || o["kind"] == "CustomResourceDefinition"),
        "{tree}: nothing to send"
    );
    let out = kubectl_apply(cluster, objects, &["--dry-run=server"]);
    for o in objects {
        let (kind, name) = kind_name(o);
        // `<kind>[.<group>]/<name> serverside-applied (server dry run)`
        let lower = kind.to_lowercase();
        let tail = format!("/{name} serverside-applied (server dry run)");
        assert!(
            out.lines().any(|l| {
                l.ends_with(&tail)
                    && l.strip_prefix(&lower)
                        .is_some_and(|r| r.starts_with(['.', '/']))
            }),
            "{tree}: {kind}/{name} not applied: {out}"
        );
    }
    objects.iter().map(|o| kind_name(o).0).collect()
}

/// The chart against the real API server: `helm install --dry-run=server` (helm's own
/// checks: discovery, the server's OpenAPI schema, ownership of what exists; it sends
/// no object), then a server-side dry run of every object it renders (the API server's
/// validation and admission).
#[tokio::test]
async fn the_api_server_accepts_the_chart() {
    gpujob_operator::client::install_crypto_provider();
    let cluster = control_plane_with_third_party_crds().await;
    let served = served_api_versions(&cluster);
    let ns = cluster.create_namespace("install-helm").await.unwrap();
    let watched = cluster
        .create_namespace("install-helm-watched")
        .await
        .unwrap();
    let namespaced = [
        format!("watchNamespace={watched}"),
        "crds.install=false".to_owned(),
        "shards=1".to_owned(),
    ];
    let namespaced: Vec<&str> = namespaced.iter().map(String::as_str).collect();
    // A CA of its own, as scripts/webhook-cert.sh prints it: the API server parses the
    // CRD's caBundle as PEM and refuses anything else.
    let ca = {
        use base64::Engine;
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = params
            .self_signed(&rcgen::KeyPair::generate().unwrap())
            .unwrap();
        base64::engine::general_purpose::STANDARD.encode(ca.pem())
    };
    let ca_bundle = format!("webhook.caBundle={ca}");
    let everything: Vec<&str> = CHART_EVERYTHING
        .iter()
        .copied()
        .chain([
            "monitoring.labels.release=kube-prometheus-stack",
            "priorityClassName=system-cluster-critical",
        ])
        .collect();
    // Every option that adds, removes or reshapes objects, alone, then all at once.
    let settings: [&[&str]; 9] = [
        &[],
        &["webhook.certManager.enabled=true"],
        &["monitoring.enabled=true"],
        &[
            "monitoring.enabled=true",
            "monitoring.dashboard.enabled=false",
        ],
        &[
            "metrics.secure=true",
            "priorityClassName=system-cluster-critical",
        ],
        &[
            "webhook.secretName=my-webhook-tls",
            &ca_bundle,
            "networkPolicy.enabled=false",
            "podDisruptionBudget.enabled=false",
            "crds.keep=false",
        ],
        &namespaced,
        &everything,
        &[&everything[..], &namespaced[..]].concat(),
    ];
    let mut sent = BTreeSet::new();
    for sets in settings {
        let mut install = helm(Some(&cluster));
        // --take-ownership: the shared control plane already holds the CRD and the
        // operator's ClusterRole, as a cluster that moves from deploy/ to the chart does.
        install.args([
            "install",
            "gpujob-operator",
            CHART,
            "--namespace",
            &ns,
            "--dry-run=server",
            "--take-ownership",
        ]);
        for s in sets {
            install.args(["--set", s]);
        }
        let out = run(install);
        assert!(out.contains("STATUS: pending-install"), "{sets:?}: {out}");
        sent.extend(dry_run(
            &cluster,
            &served,
            &format!("the chart with {sets:?}"),
            &helm_template("gpujob-operator", &ns, sets),
        ));
    }
    for kind in THIRD_PARTY_KINDS {
        assert!(sent.contains(*kind), "no {kind} was dry-run: {sent:?}");
    }
}

/// One line of `kubectl auth can-i --list`: resource, non-resource URLs, resource
/// names, verbs.
fn can_i_lines(text: &str) -> Vec<(String, String, String, String)> {
    text.lines()
        .skip(1)
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let first = line
                .find('[')
                .unwrap_or_else(|| panic!("no list in {line:?}"));
            let resource = line[..first].trim().to_owned();
            let mut lists = Vec::new();
            let mut rest = &line[first..];
            while let Some(open) = rest.find('[') {
                let close = open + rest[open..].find(']').unwrap();
                lists.push(rest[open + 1..close].to_owned());
                rest = &rest[close + 1..];
            }
            assert_eq!(lists.len(), 3, "{line:?}");
            (
                resource,
                lists[0].clone(),
                lists[1].clone(),
                lists[2].clone(),
            )
        })
        .collect()
}

/// Reviewed: what the operator calls (deploy/operator/rbac.yaml), cluster-wide (in the
/// chart's namespaced mode: in the watched namespace only).
const OPERATOR_RIGHTS: &[(&str, &str)] = &[
    ("gpujobs.gpujob.dev", "get list watch patch delete"),
    ("gpujobs.gpujob.dev/status", "patch"),
    ("gpujobs.gpujob.dev/finalizers", "update"),
    ("jobs.batch", "get list watch create patch delete"),
    ("pods", "list watch patch delete"),
    ("services", "get create"),
    ("resourceclaimtemplates.resource.k8s.io", "get create"),
    ("resourceclaims.resource.k8s.io", "list"),
    ("podgroups.scheduling.k8s.io", "get create"),
    ("workloads.kueue.x-k8s.io", "list"),
    ("events.events.k8s.io", "create patch"),
];
/// --metrics-secure (deploy/secure-metrics): is this scraper's token valid, may its
/// user get /metrics? Questions only; neither changes anything.
const REVIEWED_SECURE_METRICS: &[(&str, &str)] = &[
    ("tokenreviews.authentication.k8s.io", "create"),
    ("subjectaccessreviews.authorization.k8s.io", "create"),
];
const LEASES: (&str, &str) = (
    "leases.coordination.k8s.io",
    "get list watch create update delete",
);
/// The Node an old attempt's pod is being deleted on (is it lost?): cluster-scoped, so
/// only a cluster-wide install has it; the chart's namespaced mode goes without.
const NODES: (&str, &str) = ("nodes", "get");

/// The shipped install's RBAC objects (and its Namespace), as they would be applied.
fn rbac_of(objects: &[serde_json::Value]) -> Vec<serde_json::Value> {
    objects
        .iter()
        .filter(|o| {
            let k = o["kind"].as_str().unwrap();
            k == "Namespace" || k == "ServiceAccount" || k.contains("Role")
        })
        .cloned()
        .collect()
}

/// Rights every authenticated user has (Kubernetes' default bindings, not the operator's):
/// ask what it may do and who it is, and read the cluster's trust bundles where the API
/// server serves them ([`everyone`]).
const EVERYONE: &[(&str, &str)] = &[
    ("selfsubjectaccessreviews.authorization.k8s.io", "create"),
    ("selfsubjectrulesreviews.authorization.k8s.io", "create"),
    ("selfsubjectreviews.authentication.k8s.io", "create"),
    (TRUST_BUNDLES, "get list watch"),
];
const TRUST_BUNDLES: &str = "clustertrustbundles.certificates.k8s.io";

/// [`EVERYONE`] on this control plane: Kubernetes grants everyone the trust bundles only
/// where it serves them (v1.37 does; v1.33, the compatibility subset's, does not by
/// default).
fn everyone(cluster: &ControlPlane) -> Vec<(&'static str, &'static str)> {
    let out = cluster
        .command("kubectl", Identity::Admin)
        .args([
            "api-resources",
            "--api-group=certificates.k8s.io",
            "-o",
            "name",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let served = String::from_utf8(out.stdout).unwrap();
    let trust_bundles = served.lines().any(|l| l.trim() == TRUST_BUNDLES);
    EVERYONE
        .iter()
        .copied()
        .filter(|(r, _)| trust_bundles || *r != TRUST_BUNDLES)
        .collect()
}

/// `kubectl auth can-i --list` of `who` (extra kubectl arguments) in `ns` is exactly
/// `wanted` (resource, verbs), waiting for the RBAC cache to show all of it first.
async fn rights_in(
    cluster: &ControlPlane,
    identity: Identity,
    who: &[&str],
    ns: &str,
    wanted: &BTreeSet<(String, String)>,
) {
    // The RBAC cache sees the bindings just applied a moment later: wait until
    // every reviewed right shows, then judge that answer.
    let text = wait::until(
        &format!("the operator's rights in {ns}"),
        WAIT,
        POLL,
        || {
            let out = cluster
                .command("kubectl", identity)
                .args(["auth", "can-i", "--list", "-n", ns])
                .args(who)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let text = String::from_utf8(out.stdout).unwrap();
            let lines = can_i_lines(&text);
            let complete = wanted
                .iter()
                .all(|(r, v)| lines.iter().any(|(lr, _, _, lv)| lr == r && lv == v));
            async move { complete.then_some(text) }
        },
    )
    .await
    .unwrap();
    let mut seen = BTreeSet::new();
    for (resource, urls, names, verbs) in can_i_lines(&text) {
        if resource.is_empty() {
            // Discovery and public info (/api, /apis, /healthz, /version, ...):
            // every authenticated user may GET them.
            assert!(
                !urls.is_empty() && verbs == "get",
                "{urls} [{verbs}]\n{text}"
            );
            continue;
        }
        assert!(names.is_empty(), "{resource} [{names}]");
        assert!(
            wanted.contains(&(resource.clone(), verbs.clone())),
            "in {ns}, the operator may {verbs} {resource}: not in the reviewed list\n{text}"
        );
        seen.insert((resource.clone(), verbs.clone()));
    }
    assert_eq!(&seen, wanted, "in {ns}:\n{text}");
    // Spelled out, what the review is for.
    for never in ["secrets", "customresourcedefinitions.apiextensions.k8s.io"] {
        assert!(!seen.iter().any(|(r, _)| r == never), "{never}");
    }
    assert!(!seen.contains(&("pods".to_owned(), "create".to_owned())));
}

fn rights(lists: &[&[(&str, &str)]]) -> BTreeSet<(String, String)> {
    lists
        .iter()
        .flat_map(|l| l.iter())
        .map(|(r, v)| (r.to_string(), v.to_string()))
        .collect()
}

/// The operator's rights in its own namespace `home` (`reviewed` and the Leases) and in
/// another one (`reviewed` alone).
async fn rights_are_exactly(
    cluster: &ControlPlane,
    identity: Identity,
    who: &[&str],
    home: &str,
    reviewed: &[(&str, &str)],
) {
    let elsewhere = cluster.create_namespace("install-can-i").await.unwrap();
    rights_in(
        cluster,
        identity,
        who,
        home,
        &rights(&[reviewed, &[LEASES]]),
    )
    .await;
    rights_in(cluster, identity, who, &elsewhere, &rights(&[reviewed])).await;
}

#[tokio::test]
async fn the_operator_can_do_nothing_beyond_the_reviewed_list() {
    gpujob_operator::client::install_crypto_provider();
    let cluster = ControlPlane::for_tests(&[Path::new(CRD)]).await.unwrap();
    // The shipped namespace, service account and RBAC, for real: the service account's
    // user (devcluster's `operator` identity) then holds exactly what it would in a
    // cluster. No TokenReview or SubjectAccessReview rights without secure metrics.
    let operator = render(&Path::new(DEPLOY).join("operator"));
    kubectl_apply(&cluster, &rbac_of(&operator), &[]);
    let everyone = everyone(&cluster);
    let reviewed: Vec<_> = OPERATOR_RIGHTS
        .iter()
        .chain(&everyone)
        .chain(&[NODES])
        .copied()
        .collect();
    rights_are_exactly(
        &cluster,
        Identity::Operator,
        &[],
        "gpujob-system",
        &reviewed,
    )
    .await;
}

/// With the secure-metrics component the operator gains the two review rights, and
/// nothing else. Applied for real from an overlay moved to a namespace of this test
/// and prefixed with it (the shared control plane's gpujob-system install stays as
/// the test above wants it): the bindings follow the overlay's names.
#[tokio::test]
async fn with_secure_metrics_the_operator_may_also_ask_who_reads_metrics() {
    gpujob_operator::client::install_crypto_provider();
    let cluster = ControlPlane::for_tests(&[Path::new(CRD)]).await.unwrap();
    let ns = cluster.create_namespace("install-secure").await.unwrap();
    let objects = render_kustomization(&format!(
        "resources: [{{deploy}}/operator]\ncomponents: [{{deploy}}/secure-metrics]\nnamespace: {ns}\nnamePrefix: {ns}-\ntransformers: [{{deploy}}/wiring]\n"
    ));
    let rbac = rbac_of(&objects);
    kubectl_apply(&cluster, &rbac, &[]);
    let user = format!("--as=system:serviceaccount:{ns}:{ns}-gpujob-operator");
    let everyone = everyone(&cluster);
    let reviewed: Vec<_> = OPERATOR_RIGHTS
        .iter()
        .chain(&everyone)
        .chain(REVIEWED_SECURE_METRICS)
        .chain(&[NODES])
        .copied()
        .collect();
    rights_are_exactly(
        &cluster,
        Identity::Admin,
        &[
            &user,
            // A service account's groups, as its token would carry them.
            "--as-group=system:serviceaccounts",
            &format!("--as-group=system:serviceaccounts:{ns}"),
            "--as-group=system:authenticated",
        ],
        &ns,
        &reviewed,
    )
    .await;
    // Leave no cluster-wide grant of this test behind.
    let cluster_scoped: Vec<_> = rbac
        .iter()
        .filter(|o| o["metadata"]["namespace"].is_null() && o["kind"] != "Namespace")
        .collect();
    for o in cluster_scoped {
        let (kind, name) = kind_name(o);
        let out = cluster
            .command("kubectl", Identity::Admin)
            .args(["delete", &kind.to_lowercase(), &name])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

fn docs(path: &str) -> Vec<serde_json::Value> {
    serde_saphyr::from_multiple(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// A client that acts as `user` (admin impersonating it: RBAC judges `user`).
async fn as_user(cluster: &ControlPlane, user: &str) -> Client {
    let mut config = cluster.config(Identity::Admin).await.unwrap();
    config.auth_info.impersonate = Some(user.to_owned());
    config.auth_info.impersonate_groups = Some(vec!["system:authenticated".to_owned()]);
    Client::try_from(config).unwrap()
}

fn gpujob(name: &str) -> GpuJob {
    serde_json::from_value(json!({
        "apiVersion": GpuJob::api_version(&()), "kind": "GpuJob",
        "metadata": {"name": name}, "spec": {"image": "registry.example.com/train:1", "gpus": 1},
    }))
    .unwrap()
}

async fn bind(admin: &Client, ns: &str, cluster_role: &str, user: &str) {
    let binding: RoleBinding = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": format!("{cluster_role}-{user}"), "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }))
    .unwrap();
    Api::<RoleBinding>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
}

fn forbidden<T: std::fmt::Debug>(r: Result<T, kube::Error>) -> bool {
    matches!(r, Err(kube::Error::Api(ref s)) if s.code == 403)
}

/// Whether the built-in ClusterRole `name` holds, after aggregation, a rule granting
/// `verb` on gpujobs.
async fn grants(admin: &Client, name: &str, verb: &str) -> bool {
    let role = Api::<ClusterRole>::all(admin.clone())
        .get(name)
        .await
        .unwrap();
    role.rules.unwrap_or_default().iter().any(|r| {
        r.api_groups
            .as_deref()
            .unwrap_or_default()
            .iter()
            .any(|g| g == "gpujob.dev")
            && r.resources
                .as_deref()
                .unwrap_or_default()
                .iter()
                .any(|x| x == "gpujobs")
            && r.verbs.iter().any(|v| v == verb)
    })
}

#[tokio::test]
async fn built_in_edit_may_create_gpujobs_and_view_may_only_read_them() {
    gpujob_operator::client::install_crypto_provider();
    let cluster = ControlPlane::for_tests(&[Path::new(CRD)]).await.unwrap();
    let admin = cluster.client(Identity::Admin).await.unwrap();
    let pp = PatchParams::apply("gpujob-tests").force();
    for role in docs(USER_ROLES) {
        let role: ClusterRole = serde_json::from_value(role).unwrap();
        let name = role.metadata.name.clone().unwrap();
        Api::<ClusterRole>::all(admin.clone())
            .patch(&name, &pp, &Patch::Apply(&role))
            .await
            .unwrap();
    }
    // kube-controller-manager's clusterrole-aggregation controller copies the rules.
    for (role, verb) in [
        ("view", "list"),
        ("edit", "create"),
        ("admin", "create"),
        ("edit", "list"),
    ] {
        wait::until(
            &format!("{verb} on gpujobs aggregated into {role}"),
            WAIT,
            POLL,
            || async { grants(&admin, role, verb).await.then_some(()) },
        )
        .await
        .unwrap();
    }
    assert!(
        !grants(&admin, "view", "create").await,
        "view may not create"
    );

    let ns = cluster.create_namespace("install-roles").await.unwrap();
    let other = cluster
        .create_namespace("install-roles-other")
        .await
        .unwrap();
    let (editor, viewer) = (format!("editor-{ns}"), format!("viewer-{ns}"));
    bind(&admin, &ns, "edit", &editor).await;
    bind(&admin, &ns, "view", &viewer).await;
    let pp = PostParams::default();

    // The API server's RBAC cache sees a new RoleBinding a moment after it is written:
    // wait for the editor's first create (only a 403 is retried), and for the viewer's
    // first read before any refusal of the viewer counts.
    let as_editor: Api<GpuJob> = Api::namespaced(as_user(&cluster, &editor).await, &ns);
    wait::until("the editor creates a GpuJob", WAIT, POLL, || async {
        match as_editor.create(&pp, &gpujob("by-editor")).await {
            Ok(_) => Some(()),
            Err(kube::Error::Api(s)) if s.code == 403 => None,
            Err(e) => panic!("create as editor: {e}"),
        }
    })
    .await
    .unwrap();
    assert_eq!(
        as_editor
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        1
    );
    let elsewhere: Api<GpuJob> = Api::namespaced(as_user(&cluster, &editor).await, &other);
    assert!(
        forbidden(elsewhere.create(&pp, &gpujob("by-editor")).await),
        "edit in one namespace grants nothing in another"
    );

    let as_viewer: Api<GpuJob> = Api::namespaced(as_user(&cluster, &viewer).await, &ns);
    let seen = wait::until("the viewer reads the GpuJob", WAIT, POLL, || async {
        match as_viewer.get("by-editor").await {
            Ok(gj) => Some(gj),
            Err(kube::Error::Api(s)) if s.code == 403 => None,
            Err(e) => panic!("get as viewer: {e}"),
        }
    })
    .await
    .unwrap();
    assert_eq!(seen.metadata.name.as_deref(), Some("by-editor"));
    assert_eq!(
        as_viewer
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        1
    );
    assert!(
        forbidden(as_viewer.create(&pp, &gpujob("by-viewer")).await),
        "view may not create GpuJobs"
    );
    assert!(
        forbidden(
            as_viewer
                .patch(
                    "by-editor",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"gpus": 2}}))
                )
                .await
        ),
        "view may not change GpuJobs"
    );
    assert!(
        forbidden(as_viewer.delete("by-editor", &Default::default()).await),
        "view may not delete GpuJobs"
    );
    as_editor
        .delete("by-editor", &Default::default())
        .await
        .unwrap();
}

/// deploy/ with every optional component.
const EVERYTHING: &str = "resources: [{deploy}]\ncomponents: [{deploy}/cert-manager, {deploy}/monitoring, {deploy}/secure-metrics]\n";

/// The references between objects of one install, whatever it is named and wherever it
/// runs: what an overlay or a release name must not break. Every problem found, or Ok.
fn wiring(objects: &[serde_json::Value]) -> Result<(), String> {
    let mut problems = Vec::new();
    let ns_of =
        |o: &serde_json::Value| o["metadata"]["namespace"].as_str().unwrap_or("").to_owned();
    let name_of = |o: &serde_json::Value| o["metadata"]["name"].as_str().unwrap_or("").to_owned();
    let find = |kind: &str, ns: &str, name: &str| {
        objects
            .iter()
            .find(|o| o["kind"] == kind && ns_of(o) == ns && name_of(o) == name)
    };
    let deployment = named(objects, "Deployment");
    let namespace = ns_of(deployment);
    let pod = &deployment["spec"]["template"]["spec"];

    // Service accounts and roles: every binding names what exists.
    let sa = pod["serviceAccountName"].as_str().unwrap();
    if find("ServiceAccount", &namespace, sa).is_none() {
        problems.push(format!(
            "the Deployment runs as {namespace}/{sa}, which is not there"
        ));
    }
    for b in objects
        .iter()
        .filter(|o| o["kind"] == "RoleBinding" || o["kind"] == "ClusterRoleBinding")
    {
        let role_kind = b["roleRef"]["kind"].as_str().unwrap();
        let role_ns = if role_kind == "Role" {
            ns_of(b)
        } else {
            String::new()
        };
        let role = b["roleRef"]["name"].as_str().unwrap();
        if find(role_kind, &role_ns, role).is_none() {
            problems.push(format!(
                "{} {} binds {role_kind} {role}, which is not there",
                b["kind"],
                name_of(b)
            ));
        }
        // Secure metrics' scraper: an account of the install bound to a role of
        // non-resource URLs (/metrics) alone.
        let urls_only = find(role_kind, &role_ns, role).is_some_and(|r| {
            r["rules"]
                .as_array()
                .is_some_and(|rules| rules.iter().all(|rule| rule["resources"].is_null()))
        });
        for subject in b["subjects"].as_array().unwrap() {
            let (sn, sns) = (
                subject["name"].as_str().unwrap(),
                subject["namespace"].as_str().unwrap(),
            );
            let operator = sn == sa && sns == namespace;
            let scraper = sn != sa
                && sns == namespace
                && urls_only
                && find("ServiceAccount", sns, sn).is_some();
            if subject["kind"] == "ServiceAccount" && !operator && !scraper {
                problems.push(format!(
                    "{} {} binds {sns}/{sn}, not the operator's {namespace}/{sa}",
                    b["kind"],
                    name_of(b)
                ));
            }
        }
    }

    // The conversion webhook: CRD -> Service -> pods; certificate for that Service.
    let webhook_secret = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|v| v["secret"]["secretName"].as_str())
        .unwrap()
        .to_owned();
    let crd = objects
        .iter()
        .find(|o| o["kind"] == "CustomResourceDefinition");
    let (svc_name, svc_ns) = match crd {
        Some(crd) => {
            let s = &crd["spec"]["conversion"]["webhook"]["clientConfig"]["service"];
            (
                s["name"].as_str().unwrap().to_owned(),
                s["namespace"].as_str().unwrap().to_owned(),
            )
        }
        None => (
            format!("{}-webhook", name_of(deployment)),
            namespace.clone(),
        ),
    };
    if find("Service", &svc_ns, &svc_name).is_none() {
        problems.push(format!(
            "the CRD calls Service {svc_ns}/{svc_name}, which is not there"
        ));
    }
    let certificates: Vec<_> = objects
        .iter()
        .filter(|o| o["kind"] == "Certificate")
        .collect();
    if !certificates.is_empty() {
        match certificates
            .iter()
            .find(|c| c["spec"]["secretName"] == webhook_secret.as_str())
        {
            None => problems.push(format!(
                "no Certificate issues the mounted Secret {webhook_secret}"
            )),
            Some(serving) => {
                let wanted = format!("{svc_name}.{svc_ns}.svc");
                let dns: Vec<&str> = serving["spec"]["dnsNames"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|n| n.as_str().unwrap())
                    .collect();
                if !dns.contains(&wanted.as_str()) || dns.iter().any(|n| !n.starts_with(&wanted)) {
                    problems.push(format!(
                        "the serving certificate is for {dns:?}; the API server calls {wanted}"
                    ));
                }
                if ns_of(serving) != namespace {
                    problems.push(format!(
                        "the serving Certificate is in {}, the pods in {namespace}",
                        ns_of(serving)
                    ));
                }
                if let Some(crd) = crd {
                    let inject = &crd["metadata"]["annotations"]["cert-manager.io/inject-ca-from"];
                    let wanted = format!("{}/{}", ns_of(serving), name_of(serving));
                    if inject != wanted.as_str() {
                        problems.push(format!(
                            "the CRD injects the CA of {inject}, not of {wanted}"
                        ));
                    }
                }
                // serving <- CA Issuer <- root Certificate (isCA) <- self-signed Issuer.
                let issuer = |c: &serde_json::Value| {
                    find(
                        "Issuer",
                        &ns_of(c),
                        c["spec"]["issuerRef"]["name"].as_str().unwrap(),
                    )
                };
                match issuer(serving) {
                    None => problems.push(format!(
                        "the serving certificate's issuer {} is not there",
                        serving["spec"]["issuerRef"]["name"]
                    )),
                    Some(ca) => match certificates
                        .iter()
                        .find(|c| c["spec"]["secretName"] == ca["spec"]["ca"]["secretName"])
                    {
                        None => problems.push(format!(
                            "the CA Issuer {} signs with {}, which no Certificate issues",
                            name_of(ca),
                            ca["spec"]["ca"]["secretName"]
                        )),
                        Some(root) => {
                            if root["spec"]["isCA"] != true {
                                problems.push(format!("{} is not a CA", name_of(root)));
                            }
                            if issuer(root).is_none_or(|i| i["spec"]["selfSigned"].is_null()) {
                                problems.push(format!("the root {} is not signed by a self-signed Issuer of this install", name_of(root)));
                            }
                        }
                    },
                }
            }
        }
    }

    // Monitoring: the scrape job's name is what every alert selects.
    if let Some(monitor) = objects.iter().find(|o| o["kind"] == "ServiceMonitor") {
        // The token it scrapes with (secure metrics): a Secret of the install, for a
        // service account of the install.
        let credentials = &monitor["spec"]["endpoints"][0]["authorization"]["credentials"];
        if let Some(secret) = credentials["name"].as_str() {
            match find("Secret", &ns_of(monitor), secret) {
                None => problems.push(format!(
                    "the ServiceMonitor sends the token of Secret {secret}, which is not there"
                )),
                Some(s) => {
                    let account =
                        s["metadata"]["annotations"]["kubernetes.io/service-account.name"]
                            .as_str()
                            .unwrap_or_default();
                    if find("ServiceAccount", &ns_of(s), account).is_none() {
                        problems.push(format!(
                            "the token Secret {secret} is for {account}, which is not there"
                        ));
                    }
                }
            }
        }
        let selector = monitor["spec"]["selector"]["matchLabels"]
            .as_object()
            .unwrap();
        let scraped: Vec<_> = objects
            .iter()
            .filter(|o| o["kind"] == "Service" && ns_of(o) == ns_of(monitor))
            .filter(|o| {
                selector
                    .iter()
                    .all(|(k, v)| &o["metadata"]["labels"][k] == v)
            })
            .filter(|o| {
                o["spec"]["ports"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|p| p["name"] == "metrics")
            })
            .collect();
        let job = match (scraped.as_slice(), monitor["spec"]["jobLabel"].as_str()) {
            ([service], Some(label)) => service["metadata"]["labels"][label]
                .as_str()
                .map(str::to_owned),
            ([service], None) => Some(name_of(service)),
            _ => None,
        };
        match job {
            None => problems.push(format!(
                "the ServiceMonitor scrapes {} metrics Services or names no job",
                scraped.len()
            )),
            Some(job) => {
                let rule = objects
                    .iter()
                    .find(|o| o["kind"] == "PrometheusRule")
                    .expect("a PrometheusRule beside the ServiceMonitor");
                let wanted = format!("job=\"{job}\"");
                for r in rule["spec"]["groups"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .flat_map(|g| g["rules"].as_array().unwrap())
                {
                    let expr = r["expr"].as_str().unwrap();
                    if expr.contains("job=") && !expr.contains(&wanted) {
                        problems.push(format!(
                            "{} selects {expr:?}; the scrape job is {job}",
                            r["alert"]
                        ));
                    }
                }
            }
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("\n"))
    }
}

/// An overlay that moves and renames the install keeps it wired with deploy/wiring
/// listed under `transformers:`; without it, the certificate and the CRD's CA injection
/// point at the old names (which is what the test would catch).
#[test]
fn an_overlay_with_namespace_and_name_prefix_stays_wired() {
    let moved = "namespace: team-gpu\nnamePrefix: team-\n";
    let with = render_kustomization(&format!(
        "{EVERYTHING}{moved}transformers: [{{deploy}}/wiring]\n"
    ));
    wiring(&with).unwrap();
    let service = with
        .iter()
        .find(|o| o["kind"] == "Service" && o["metadata"]["name"] == "team-gpujob-operator-webhook")
        .expect("the webhook Service renamed");
    assert_eq!(service["metadata"]["namespace"], "team-gpu");
    assert_eq!(
        named(&with, "CustomResourceDefinition")["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
        "team-gpu/team-gpujob-operator-webhook"
    );

    let without = render_kustomization(&format!("{EVERYTHING}{moved}"));
    let problems = wiring(&without).expect_err("without deploy/wiring the names are stale");
    assert!(
        problems.contains("gpujob-operator-webhook.gpujob-system.svc"),
        "{problems}"
    );
    assert!(problems.contains("injects the CA of"), "{problems}");

    // The wiring changes nothing where nothing moved.
    assert_eq!(
        render_kustomization(&format!("{EVERYTHING}transformers: [{{deploy}}/wiring]\n")),
        render_kustomization(EVERYTHING)
    );
}

const CHART: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/charts/gpujob-operator");

/// helm 4: scripts/test.sh builds it and exports GPUJOB_HELM (scripts/helm.sh); helm on
/// PATH otherwise. Its config, cache and data go to a folder of this process: a test
/// reads nothing of the machine's helm repositories or plugins.
fn helm(cluster: Option<&ControlPlane>) -> Command {
    let program = std::env::var("GPUJOB_HELM").unwrap_or_else(|_| "helm".to_owned());
    let mut cmd = match cluster {
        Some(c) => c.command(program, Identity::Admin),
        None => Command::new(program),
    };
    let home = std::env::temp_dir().join(format!("gpujob-helm-home-{}", std::process::id()));
    for (var, sub) in [
        ("HELM_CONFIG_HOME", "config"),
        ("HELM_CACHE_HOME", "cache"),
        ("HELM_DATA_HOME", "data"),
    ] {
        cmd.env(var, home.join(sub));
    }
    cmd
}

fn run(mut cmd: Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e} (scripts/test.sh provides helm as GPUJOB_HELM)"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A kubeconfig for the service account `sa` of `ns`: its own credentials, as its pod
/// would have them.
fn token_kubeconfig(cluster: &ControlPlane, ns: &str, sa: &str) -> PathBuf {
    let mut token = cluster.command("kubectl", Identity::Admin);
    token.args(["create", "token", sa, "-n", ns, "--duration=1h"]);
    let token = run(token);
    let admin_kubeconfig = std::fs::read_to_string(cluster.kubeconfig(Identity::Admin)).unwrap();
    let mut kubeconfig: serde_json::Value = serde_saphyr::from_str(&admin_kubeconfig).unwrap();
    kubeconfig["users"][0]["user"] = json!({"token": token.trim()});
    let path = std::env::temp_dir().join(format!(
        "gpujob-{ns}-{sa}-{}.kubeconfig",
        std::process::id()
    ));
    std::fs::write(&path, kubeconfig.to_string()).unwrap();
    path
}

/// The `run` flags of a rendered Deployment's pod (`pod`: its template's spec) that
/// watches `watched`, less what a replica started by the tests cannot use: the
/// webhook's certificate folder (no Secret here: the shared control plane's CRD
/// converts nothing) and the secure metrics' listeners (the test replicas get
/// addresses of their own). The Lease stays where POD_NAMESPACE puts it in a pod.
fn run_flags(pod: &serde_json::Value, watched: &str) -> Vec<String> {
    let args: Vec<&str> = pod["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(args[0], "run", "{args:?}");
    let namespace_flag = format!("--namespace={watched}");
    assert!(args.contains(&namespace_flag.as_str()), "{args:?}");
    args[1..]
        .iter()
        .filter(|a| {
            !a.starts_with("--conversion-cert-dir=")
                && !a.starts_with("--probe-address=")
                && **a != "--metrics-secure"
        })
        .map(|a| (*a).to_owned())
        .collect()
}

/// `helm install release` of the chart into `ns` with `sets`, for real: what it printed
/// (the notes among it).
fn helm_install(cluster: &ControlPlane, release: &str, ns: &str, sets: &[&str]) -> String {
    let mut install = helm(Some(cluster));
    install.args(["install", release, CHART, "--namespace", ns]);
    for s in sets {
        install.args(["--set", s]);
    }
    let out = run(install);
    assert!(out.contains("STATUS: deployed"), "{release}: {out}");
    out
}

/// The pod template's spec of release `release`'s Deployment in `ns`, as the API server
/// holds it (what its pods would run).
async fn installed_pod(admin: &Client, ns: &str, release: &str) -> serde_json::Value {
    let deployments = Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(admin.clone(), ns)
        .list(&ListParams::default().labels(&format!(
            "app.kubernetes.io/instance={release},app.kubernetes.io/component=controller"
        )))
        .await
        .unwrap();
    assert_eq!(
        deployments.items.len(),
        1,
        "release {release}: {deployments:?}"
    );
    serde_json::to_value(&deployments.items[0]).unwrap()["spec"]["template"]["spec"].clone()
}

/// Waits until GpuJob `ns`/train has succeeded, run by `replica` (whose log a timeout
/// shows); `whose` starts the wait's description.
async fn train_succeeded(
    admin: &Client,
    ns: &str,
    whose: &str,
    replica: &support::replicas::Replica,
) -> GpuJob {
    let api = Api::<GpuJob>::namespaced(admin.clone(), ns);
    let api = &api;
    wait::until(
        &format!("{whose}GpuJob {ns}/train to succeed"),
        WAIT,
        POLL,
        || async move {
            api.get("train")
                .await
                .ok()
                .filter(|g| support::phase(g) == Some(gpujob_operator::api::Phase::Succeeded))
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}; operator log:\n{}", replica.log_text()))
}

/// `helm template` of the chart, parsed.
fn helm_template(release: &str, namespace: &str, sets: &[&str]) -> Vec<serde_json::Value> {
    let mut cmd = helm(None);
    cmd.args(["template", release, CHART, "--namespace", namespace]);
    for s in sets {
        cmd.args(["--set", s]);
    }
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&run(cmd)).unwrap();
    docs.into_iter().filter(|d| !d.is_null()).collect()
}

/// Settings of the chart that equal deploy/ with every optional component.
const CHART_EVERYTHING: &[&str] = &[
    "webhook.certManager.enabled=true",
    "monitoring.enabled=true",
    "metrics.secure=true",
];

/// What may differ between the chart's objects and kustomize's, and why:
/// - Helm's own labels (helm.sh/chart, app.kubernetes.io/instance) and managed-by,
///   which names the tool (Helm, kustomize);
/// - the annotation helm.sh/resource-policy: keep, Helm's way to leave the CRD and its
///   roles on uninstall (kustomize users never delete deploy/crd);
/// - numbers by value: the chart reads the CRD with fromYaml, which writes 1.0 as 1;
/// - the Namespace, which the chart does not create (Helm stores the release in it first).
fn normalised(
    objects: &[serde_json::Value],
) -> std::collections::BTreeMap<String, serde_json::Value> {
    fn numbers(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Number(n) => *v = json!(n.as_f64().unwrap()),
            serde_json::Value::Array(a) => a.iter_mut().for_each(numbers),
            serde_json::Value::Object(m) => m.values_mut().for_each(numbers),
            _ => {}
        }
    }
    fn strip(meta: &mut serde_json::Value) {
        for (field, keys) in [
            (
                "labels",
                &[
                    "helm.sh/chart",
                    "app.kubernetes.io/instance",
                    "app.kubernetes.io/managed-by",
                ][..],
            ),
            ("annotations", &["helm.sh/resource-policy"][..]),
        ] {
            if let Some(m) = meta.get_mut(field).and_then(|m| m.as_object_mut()) {
                keys.iter().for_each(|k| {
                    m.remove(*k);
                });
                if m.is_empty() {
                    meta.as_object_mut().unwrap().remove(field);
                }
            }
        }
    }
    objects
        .iter()
        .filter(|o| o["kind"] != "Namespace")
        .map(|o| {
            let mut o = o.clone();
            strip(&mut o["metadata"]);
            if o["spec"]["template"]["metadata"].is_object() {
                strip(&mut o["spec"]["template"]["metadata"]);
            }
            numbers(&mut o);
            let key = format!(
                "{}/{}/{}",
                o["kind"].as_str().unwrap(),
                o["metadata"]["namespace"].as_str().unwrap_or(""),
                o["metadata"]["name"].as_str().unwrap()
            );
            (key, o)
        })
        .collect()
}

/// The JSON paths where `a` and `b` differ (for a readable failure).
fn differences(path: &str, a: &serde_json::Value, b: &serde_json::Value, out: &mut Vec<String>) {
    match (a, b) {
        (serde_json::Value::Object(x), serde_json::Value::Object(y)) => {
            for k in x.keys().chain(y.keys()).collect::<BTreeSet<_>>() {
                let null = serde_json::Value::Null;
                differences(
                    &format!("{path}.{k}"),
                    x.get(k).unwrap_or(&null),
                    y.get(k).unwrap_or(&null),
                    out,
                );
            }
        }
        (serde_json::Value::Array(x), serde_json::Value::Array(y)) if x.len() == y.len() => {
            for (i, (x, y)) in x.iter().zip(y).enumerate() {
                differences(&format!("{path}[{i}]"), x, y, out);
            }
        }
        _ if a != b => out.push(format!("{path}: kustomize {a} / helm {b}")),
        _ => {}
    }
}

fn assert_same_objects(what: &str, kustomize: &[serde_json::Value], chart: &[serde_json::Value]) {
    let (k, h) = (normalised(kustomize), normalised(chart));
    let only_k: Vec<_> = k.keys().filter(|x| !h.contains_key(*x)).collect();
    let only_h: Vec<_> = h.keys().filter(|x| !k.contains_key(*x)).collect();
    assert!(
        only_k.is_empty() && only_h.is_empty(),
        "{what}: only kustomize renders {only_k:?}; only the chart renders {only_h:?}"
    );
    let mut diff = Vec::new();
    for (key, o) in &k {
        differences(key, o, &h[key], &mut diff);
    }
    assert!(
        diff.is_empty(),
        "{what}: the objects differ:\n{}",
        diff.join("\n")
    );
}

/// The chart and the kustomize tree are one install: with the same settings they render
/// the same objects (less what normalised() says and why).
#[test]
fn the_chart_renders_what_kustomize_renders() {
    assert_same_objects(
        "defaults",
        &render(Path::new(DEPLOY)),
        &helm_template("gpujob-operator", "gpujob-system", &[]),
    );
    assert_same_objects(
        "cert-manager, monitoring, secure metrics",
        &render_kustomization(EVERYTHING),
        &helm_template("gpujob-operator", "gpujob-system", CHART_EVERYTHING),
    );
    assert_same_objects(
        "another namespace",
        &render_kustomization(&format!(
            "{EVERYTHING}namespace: team-gpu\ntransformers: [{{deploy}}/wiring]\n"
        )),
        &helm_template("gpujob-operator", "team-gpu", CHART_EVERYTHING),
    );
    // Only the Namespace is left out, and the kustomize tree does make it.
    let chart = helm_template("gpujob-operator", "gpujob-system", &[]);
    assert!(chart.iter().all(|o| o["kind"] != "Namespace"));
    assert_eq!(render(Path::new(DEPLOY)).len(), chart.len() + 1);
    // A test that compares nothing would pass: the chart renders the whole install.
    assert!(
        chart
            .iter()
            .any(|o| o["kind"] == "CustomResourceDefinition")
    );
    assert!(chart.iter().any(|o| o["kind"] == "Deployment"));
}

/// A release under another name, in another namespace, is wired as the defaults are.
#[test]
fn a_chart_release_under_any_name_stays_wired() {
    for (release, ns) in [
        ("gpujob-operator", "gpujob-system"),
        ("team-a", "team-gpu"),
        ("team-gpujob-operator", "gpujob"),
    ] {
        let objects = helm_template(release, ns, CHART_EVERYTHING);
        wiring(&objects).unwrap_or_else(|p| panic!("release {release} in {ns}:\n{p}"));
        assert_eq!(named(&objects, "Deployment")["metadata"]["namespace"], ns);
    }
}

/// The values a platform team sets reach the objects, and the defaults leave what a
/// platform decides unset (no runAsUser, no priority class, no monitoring labels).
#[test]
fn chart_values_reach_the_objects() {
    let defaults = helm_template(
        "gpujob-operator",
        "gpujob-system",
        &["monitoring.enabled=true"],
    );
    let pod = &named(&defaults, "Deployment")["spec"]["template"]["spec"];
    assert!(
        pod["securityContext"].get("runAsUser").is_none(),
        "{}",
        pod["securityContext"]
    );
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert!(pod.get("priorityClassName").is_none());
    assert!(
        named(&defaults, "ServiceMonitor")["metadata"]["labels"]
            .get("release")
            .is_none()
    );
    let rights = |objects: &[serde_json::Value]| {
        objects
            .iter()
            .filter(|o| o["kind"] == "ClusterRole")
            .flat_map(|o| o["rules"].as_array().unwrap().clone())
            .flat_map(|r| r["resources"].as_array().cloned().unwrap_or_default())
            .collect::<Vec<_>>()
    };
    assert!(
        !rights(&defaults).contains(&json!("tokenreviews")),
        "TokenReview rights only with secure metrics"
    );

    let set = helm_template(
        "gpujob-operator",
        "gpujob-system",
        &[
            "monitoring.enabled=true",
            "monitoring.labels.release=kube-prometheus-stack",
            "metrics.secure=true",
            "priorityClassName=platform-critical",
            "replicas=5",
            "shards=10",
            "image.repository=registry.internal/gpujob-operator",
            "image.digest=sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "resources.requests.memory=512Mi",
            "podSecurityContext.runAsUser=1000",
        ],
    );
    assert!(rights(&set).contains(&json!("tokenreviews")));
    for kind in ["ServiceMonitor", "PrometheusRule"] {
        assert_eq!(
            named(&set, kind)["metadata"]["labels"]["release"],
            "kube-prometheus-stack",
            "{kind}"
        );
    }
    let deployment = named(&set, "Deployment");
    assert_eq!(deployment["spec"]["replicas"], 5);
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["priorityClassName"], "platform-critical");
    assert_eq!(pod["securityContext"]["runAsUser"], 1000);
    let container = &pod["containers"][0];
    assert_eq!(
        container["image"],
        "registry.internal/gpujob-operator@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
    );
    assert_eq!(container["resources"]["requests"]["memory"], "512Mi");
    // The flags are ones the binary takes.
    let mut argv = vec!["gpujob-operator"];
    argv.extend(
        container["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap()),
    );
    let gpujob_operator::cli::Command::Run(run) = gpujob_operator::cli::Cli::try_parse_from(&argv)
        .unwrap()
        .command
    else {
        panic!("{argv:?} is not `run`")
    };
    assert_eq!(run.shards, 10, "{argv:?}");
    assert!(run.listen().unwrap().tls.is_some(), "{argv:?}");
}

/// The chart's namespaced mode (watchNamespace): the operator's rights are a Role in the
/// watched namespace, the Leases in its own, and nothing cluster-wide beyond what every
/// user has. Applied for real under a release name of this test.
#[tokio::test]
async fn the_charts_namespaced_mode_grants_rights_in_the_watched_namespace_only() {
    gpujob_operator::client::install_crypto_provider();
    let cluster = ControlPlane::for_tests(&[Path::new(CRD)]).await.unwrap();
    let home = cluster.create_namespace("install-nsmode-op").await.unwrap();
    let watched = cluster.create_namespace("install-nsmode").await.unwrap();
    let objects = helm_template(
        &home,
        &home,
        &[
            &format!("watchNamespace={watched}"),
            "crds.install=false",
            "shards=1",
        ],
    );
    assert!(
        objects
            .iter()
            .all(|o| o["kind"] != "ClusterRole" && o["kind"] != "ClusterRoleBinding"),
        "nothing cluster-wide"
    );
    let deployment = named(&objects, "Deployment");
    let mut argv = vec!["gpujob-operator"];
    argv.extend(
        deployment["spec"]["template"]["spec"]["containers"][0]["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap()),
    );
    let gpujob_operator::cli::Command::Run(run) = gpujob_operator::cli::Cli::try_parse_from(&argv)
        .unwrap()
        .command
    else {
        panic!("{argv:?} is not `run`")
    };
    assert_eq!(
        run.namespace.as_deref(),
        Some(watched.as_str()),
        "the operator watches that namespace only"
    );
    let rbac = rbac_of(&objects);
    kubectl_apply(&cluster, &rbac, &[]);
    let sa = format!(
        "--as=system:serviceaccount:{home}:{}",
        deployment["spec"]["template"]["spec"]["serviceAccountName"]
            .as_str()
            .unwrap()
    );
    // A service account's groups, as its token would carry them.
    let own_group = format!("--as-group=system:serviceaccounts:{home}");
    let who = [
        sa.as_str(),
        "--as-group=system:serviceaccounts",
        own_group.as_str(),
        "--as-group=system:authenticated",
    ];
    let everyone = everyone(&cluster);
    let elsewhere = cluster
        .create_namespace("install-nsmode-other")
        .await
        .unwrap();
    rights_in(
        &cluster,
        Identity::Admin,
        &who,
        &watched,
        &rights(&[OPERATOR_RIGHTS, &everyone]),
    )
    .await;
    rights_in(
        &cluster,
        Identity::Admin,
        &who,
        &home,
        &rights(&[&[LEASES], &everyone]),
    )
    .await;
    rights_in(
        &cluster,
        Identity::Admin,
        &who,
        &elsewhere,
        &rights(&[&everyone]),
    )
    .await;
}

/// The chart's namespaced mode, for real: the operator binary, started with the rendered
/// Deployment's flags (`--namespace` among them), authenticated as the release's service
/// account (a token from the TokenRequest API, so RBAC judges that account alone) that
/// holds only the rendered Roles, runs a GpuJob in the watched namespace to Succeeded.
/// Every write it sent was allowed, and a GpuJob in another namespace is left alone.
#[tokio::test]
async fn the_charts_namespaced_mode_runs_a_gpujob_with_its_roles_only() {
    gpujob_operator::client::install_crypto_provider();
    let cluster = ControlPlane::for_tests(&[&support::test_crd()])
        .await
        .unwrap();
    let admin = cluster.client(Identity::Admin).await.unwrap();
    let home = cluster.create_namespace("install-nsrun-op").await.unwrap();
    let watched = cluster.create_namespace("install-nsrun").await.unwrap();
    let elsewhere = cluster
        .create_namespace("install-nsrun-other")
        .await
        .unwrap();
    let objects = helm_template(
        &home,
        &home,
        &[
            &format!("watchNamespace={watched}"),
            "crds.install=false",
            "shards=1",
        ],
    );
    kubectl_apply(&cluster, &rbac_of(&objects), &[]);
    let pod = &named(&objects, "Deployment")["spec"]["template"]["spec"];
    let sa = pod["serviceAccountName"].as_str().unwrap();
    let user = format!("system:serviceaccount:{home}:{sa}");

    // What RBAC says the account may do: Jobs in the watched namespace, nowhere else.
    let can_i = |args: &[&str]| -> String {
        let out = cluster
            .command("kubectl", Identity::Admin)
            .args(["auth", "can-i"])
            .args(args)
            .arg(format!("--as={user}"))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    let can_i = &can_i;
    let (home_ns, watched_ns) = (home.as_str(), watched.as_str());
    // The authorizer's cache sees the bindings just written a moment later.
    wait::until(
        "the service account's Role to be in force",
        WAIT,
        POLL,
        || async move {
            (can_i(&["create", "jobs.batch", "-n", watched_ns]) == "yes"
                && can_i(&["update", "leases.coordination.k8s.io", "-n", home_ns]) == "yes")
                .then_some(())
        },
    )
    .await
    .unwrap();
    assert_eq!(can_i(&["list", "jobs.batch", "--all-namespaces"]), "no");
    assert_eq!(
        can_i(&["list", "gpujobs.gpujob.dev", "--all-namespaces"]),
        "no"
    );
    assert_eq!(can_i(&["create", "jobs.batch", "-n", &elsewhere]), "no");

    let kubeconfig_path = token_kubeconfig(&cluster, &home, sa);
    let args = run_flags(pod, &watched);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let audit = cluster.audit();
    let since = audit.cursor().unwrap();
    let replica = support::replicas::start_as(&cluster, &home, 1, &args, kubeconfig_path.clone());

    let gpujob = |ns: &str| -> (Api<GpuJob>, GpuJob) {
        let gj = serde_json::from_value(json!({
            "apiVersion": "gpujob.dev/v1", "kind": "GpuJob",
            "metadata": {"name": "train"},
            "spec": {
                "image": "registry.example.com/train:1", "gpus": 1,
                "env": support::sim_env(&[("SIM_DURATION_SECONDS", "1")]),
            },
        }))
        .unwrap();
        (Api::namespaced(admin.clone(), ns), gj)
    };
    for ns in [&watched, &elsewhere] {
        let (api, gj) = gpujob(ns);
        api.create(&PostParams::default(), &gj).await.unwrap();
    }
    let done = train_succeeded(&admin, &watched, "", &replica).await;
    assert_eq!(done.status.unwrap().attempts, 1);

    // The operator's writes: its Lease in its own namespace, the Job and the GpuJob's
    // status in the watched one, each allowed.
    let writes: Vec<_> = audit
        .since(since)
        .unwrap()
        .into_iter()
        .filter(|e| e.user == user && e.is_write())
        .collect();
    let refused: Vec<_> = writes.iter().filter(|e| !e.succeeded()).collect();
    assert!(
        refused.iter().all(|e| e.code != 403),
        "the operator was refused: {refused:?}"
    );
    let wrote = |resource: &str, subresource: &str, ns: &str| {
        writes.iter().any(|e| {
            e.succeeded()
                && e.resource == resource
                && e.subresource == subresource
                && e.namespace == ns
        })
    };
    assert!(wrote("leases", "", &home), "{writes:?}");
    assert!(wrote("jobs", "", &watched), "{writes:?}");
    assert!(wrote("gpujobs", "status", &watched), "{writes:?}");
    assert!(
        writes
            .iter()
            .all(|e| e.namespace == home || e.namespace == watched),
        "{writes:?}"
    );
    let other = gpujob(&elsewhere).0.get("train").await.unwrap();
    assert!(other.status.is_none(), "{:?}", other.status);
    let jobs = Api::<k8s_openapi::api::batch::v1::Job>::namespaced(admin.clone(), &elsewhere)
        .list(&ListParams::default())
        .await
        .unwrap();
    assert!(jobs.items.is_empty(), "a Job in {elsewhere}");
    // Nor was a read refused (reads are not in the audit log; the operator logs them).
    let log = replica.log_text();
    assert!(!log.to_lowercase().contains("forbidden"), "{log}");
    drop(replica);
    std::fs::remove_file(&kubeconfig_path).unwrap();
    std::fs::remove_dir_all(support::namespace_temp(support::REPLICA_LOGS, &home)).unwrap();
}

/// Two namespaced releases of the chart in one namespace, each watching a namespace of
/// its own, with secure metrics, each installed by a real `helm install` (which refuses
/// an object another release owns, cluster-wide ones included): both installs succeed,
/// each release's replica (the binary, with the flags of the Deployment helm installed)
/// runs its own GpuJob with its own account, and each holds Leases of its own (before,
/// both shared one Lease and one team's GpuJobs never ran). The CRD is the shared
/// control plane's: neither release renders it (crds.install=false), so neither takes
/// it over.
#[tokio::test]
async fn two_releases_in_one_namespace_each_run_their_gpujobs_on_leases_of_their_own() {
    gpujob_operator::client::install_crypto_provider();
    let cluster = ControlPlane::for_tests(&[&support::test_crd()])
        .await
        .unwrap();
    let admin = cluster.client(Identity::Admin).await.unwrap();
    let home = cluster.create_namespace("install-two-op").await.unwrap();
    let mut runs = Vec::new();
    for release in ["team-a-ops", "team-b-ops"] {
        let watched = cluster
            .create_namespace(&format!("install-two-{release}"))
            .await
            .unwrap();
        helm_install(
            &cluster,
            release,
            &home,
            &[
                &format!("watchNamespace={watched}"),
                // One namespace is one shard (docs/install.md, "Namespaced mode").
                "shards=1",
                "crds.install=false",
                "metrics.secure=true",
                // The operator runs as a process here (devcluster's pods run nothing);
                // pods would only add fake ones to the shared control plane.
                "replicas=0",
            ],
        );
        let pod = installed_pod(&admin, &home, release).await;
        let sa = pod["serviceAccountName"].as_str().unwrap().to_owned();
        runs.push((release, watched, pod, sa));
    }
    let mut replicas = Vec::new();
    for (n, (release, watched, pod, sa)) in runs.iter().enumerate() {
        let user = format!("system:serviceaccount:{home}:{sa}");
        let can_create_jobs = || {
            let out = cluster
                .command("kubectl", Identity::Admin)
                .args(["auth", "can-i", "create", "jobs.batch", "-n", watched])
                .arg(format!("--as={user}"))
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout).trim() == "yes"
        };
        wait::until(
            &format!("release {release}'s Role to be in force"),
            WAIT,
            POLL,
            || async { can_create_jobs().then_some(()) },
        )
        .await
        .unwrap();
        let kubeconfig = token_kubeconfig(&cluster, &home, sa);
        let args = run_flags(pod, watched);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let n = u8::try_from(n + 1).unwrap();
        replicas.push((
            support::replicas::start_as(&cluster, &home, n, &args, kubeconfig.clone()),
            kubeconfig,
            args.iter()
                .find_map(|a| a.strip_prefix("--lease-name="))
                .unwrap_or_else(|| panic!("release {release} passes no --lease-name: {args:?}"))
                .to_owned(),
        ));
        let gj: GpuJob = serde_json::from_value(json!({
            "apiVersion": "gpujob.dev/v1", "kind": "GpuJob",
            "metadata": {"name": "train"},
            "spec": {
                "image": "registry.example.com/train:1", "gpus": 1,
                "env": support::sim_env(&[("SIM_DURATION_SECONDS", "1")]),
            },
        }))
        .unwrap();
        Api::<GpuJob>::namespaced(admin.clone(), watched)
            .create(&PostParams::default(), &gj)
            .await
            .unwrap();
    }
    for ((release, watched, _, _), (replica, _, _)) in runs.iter().zip(&replicas) {
        train_succeeded(&admin, watched, &format!("release {release}'s "), replica).await;
    }
    // Each release's Leases are its own: named after its --lease-name, held by its replica.
    let (a, b) = (&replicas[0].2, &replicas[1].2);
    assert_ne!(a, b, "both releases name the same Lease");
    let leases = Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(admin.clone(), &home)
        .list(&ListParams::default())
        .await
        .unwrap();
    for (i, name) in [a, b].into_iter().enumerate() {
        let own: Vec<_> = leases
            .items
            .iter()
            .filter(|l| {
                l.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.starts_with(name.as_str()))
            })
            .collect();
        assert!(!own.is_empty(), "no Lease of {name}: {:?}", leases.items);
        let holder = format!("replica-{}", i + 1);
        assert!(
            own.iter().all(|l| l
                .spec
                .as_ref()
                .and_then(|s| s.holder_identity.as_deref())
                .is_none_or(|h| h == holder)),
            "a Lease of {name} held by another release's replica: {own:?}"
        );
    }
    for (replica, kubeconfig, _) in replicas {
        drop(replica);
        std::fs::remove_file(&kubeconfig).unwrap();
    }
    // Uninstalled: their cluster-wide roles do not pile up on the shared control plane.
    for (release, ..) in &runs {
        let mut uninstall = helm(Some(&cluster));
        uninstall.args(["uninstall", release, "--namespace", &home]);
        run(uninstall);
    }
    std::fs::remove_dir_all(support::namespace_temp(support::REPLICA_LOGS, &home)).unwrap();
}

/// GpuJob `train` reads as gpujob.dev/v2 (`v2`), which takes a conversion: at once or
/// after a wait (a replica starting, the API server taking up a new CRD), and then for two
/// seconds on end. `when` names the moment in a failure, with `replica`'s log.
async fn v2_reads(
    v2: &Api<kube::api::DynamicObject>,
    when: &str,
    replica: &support::replicas::Replica,
) {
    let last = std::sync::Mutex::new(String::new());
    let last = &last;
    wait::until(&format!("a v2 read {when}"), WAIT, POLL, || async move {
        match v2.get("train").await {
            Ok(o) => Some(o),
            Err(e) => {
                *last.lock().unwrap() = e.to_string();
                None
            }
        }
    })
    .await
    .unwrap_or_else(|e| {
        panic!(
            "{e}: {}; operator log:\n{}",
            last.lock().unwrap(),
            replica.log_text()
        )
    });
    for _ in 0..10 {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        if let Err(e) = v2.get("train").await {
            panic!("a v2 read {when} failed again: {e}");
        }
    }
}

/// The address this machine's other hosts would reach it at: the source address of its
/// route to a documentation address (a UDP connect sends nothing). Not loopback: the API
/// server refuses a loopback address in a Service's endpoints.
fn host_address() -> std::net::IpAddr {
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    socket.connect("203.0.113.1:9").unwrap_or_else(|e| {
        panic!(
            "the webhook's endpoint needs an IPv4 address that is not loopback, with a route: {e}"
        )
    });
    let ip = socket.local_addr().unwrap().ip();
    assert!(!ip.is_loopback() && !ip.is_unspecified(), "{ip}");
    ip
}

/// The webhook Secret's `key`, as bytes.
async fn secret_key(admin: &Client, ns: &str, name: &str, key: &str) -> Vec<u8> {
    let secret = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(admin.clone(), ns)
        .get(name)
        .await
        .unwrap();
    let data = secret.data.unwrap_or_default();
    data.get(key)
        .unwrap_or_else(|| panic!("Secret {ns}/{name} has no {key}: {:?}", data.keys()))
        .0
        .clone()
}

/// The CRD's conversion webhook caBundle, as bytes (PEM).
async fn crd_ca_bundle(admin: &Client) -> Vec<u8> {
    let crd = Api::<
        k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    >::all(admin.clone())
    .get("gpujobs.gpujob.dev")
    .await
    .unwrap();
    crd.spec
        .conversion
        .and_then(|c| c.webhook)
        .and_then(|w| w.client_config)
        .and_then(|c| c.ca_bundle)
        .map(|b| b.0)
        .unwrap_or_default()
}

/// The first certificate of a PEM bundle (the CA a rotation made: scripts/webhook-cert.sh
/// puts the new CA first, the previous one after it).
fn first_certificate(pem: &[u8]) -> rustls::pki_types::CertificateDer<'static> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::pem_slice_iter(pem)
        .next()
        .expect("a certificate")
        .unwrap()
}

/// A TLS handshake with the webhook at `address` as the API server makes it (the
/// Service's DNS name), trusting `ca` alone: Ok when the certificate served now is one
/// `ca` signed. Each handshake also makes the operator look at its certificate folder.
async fn serves_a_certificate_of(
    address: std::net::SocketAddr,
    name: &str,
    ca: &rustls::pki_types::CertificateDer<'static>,
) -> Result<(), String> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.clone()).map_err(|e| e.to_string())?;
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(address)
        .await
        .map_err(|e| e.to_string())?;
    let name =
        rustls::pki_types::ServerName::try_from(name.to_owned()).map_err(|e| e.to_string())?;
    tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect(name, tcp)
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// What the kubelet does when a mounted Secret changes: the new files appear whole (a
/// rename each, the key first; the operator keeps serving the old pair while the two
/// do not match).
fn mount_secret_files(dir: &Path, tls_crt: &[u8], tls_key: &[u8]) {
    for (name, bytes) in [("tls.key", tls_key), ("tls.crt", tls_crt)] {
        let part = dir.join(format!("{name}.part"));
        std::fs::write(&part, bytes).unwrap();
        std::fs::rename(&part, dir.join(name)).unwrap();
    }
}

/// Without cert-manager the webhook Secret is the one source of the conversion CA, as
/// the chart installs and upgrades it for real (`helm install`, `helm upgrade
/// --reuse-values`) on a control plane of its own (the chart's CRD, with the conversion
/// webhook, would replace the shared one's). The operator binary runs with the flags of
/// the Deployment helm installed, as its service account, serving the Secret's files,
/// and is reached where the API server sends conversions: the chart's webhook Service,
/// whose endpoint is a pod standing in for a replica at this machine's address (devcluster
/// runs kube-apiserver with `--enable-aggregator-routing`: no kube-proxy routes a
/// ClusterIP here).
///
/// 1. scripts/webhook-cert.sh makes the Secret (CA A) before the install; the install
///    (with webhook.caBundle=A too, as the docs once said) writes A; the script run for
///    another install leaves it; v2 reads work.
/// 2. The Secret is replaced by other means (CA B; the CRD untouched), the operator
///    serves B from its files (re-read without a restart), `helm upgrade --reuse-values`
///    (which keeps webhook.caBundle=A), the replica restarts: v2 reads work and the
///    CRD's caBundle is B.
/// 3. webhook-cert.sh rotates (CA C: the CRD gets C and B first, the Secret after, with
///    the same bundle as ca.crt), the operator serves C, `helm upgrade --reuse-values`,
///    a restart: v2 reads work and the CRD keeps that bundle.
///
/// With the CA taken from the value (the chart before), step 2's upgrade leaves A and
/// every v2 read after the restart fails.
#[tokio::test]
async fn without_cert_manager_the_crds_ca_follows_the_webhook_secret_through_reuse_values_upgrades()
{
    gpujob_operator::client::install_crypto_provider();
    // No kwok: it would give the Deployment's pods fake addresses, and the webhook
    // Service would send conversions there.
    let cluster = ControlPlane::start(devcluster::Options {
        pod_simulator: false,
        ..devcluster::Options::default()
    })
    .await
    .unwrap();
    let admin = cluster.client(Identity::Admin).await.unwrap();
    let ns = cluster.create_namespace("install-ca").await.unwrap();
    let release = "gpujob-operator";
    let (service, secret) = ("gpujob-operator-webhook", "gpujob-operator-webhook-tls");
    let dns = format!("{service}.{ns}.svc");
    let webhook_cert_sh = |service: &str, secret: &str| -> String {
        let mut cmd = cluster.command(
            concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/webhook-cert.sh"),
            Identity::Admin,
        );
        cmd.env("NAMESPACE", &ns)
            .env("SERVICE", service)
            .env("SECRET", secret);
        let out = cmd.output().unwrap();
        let said = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "webhook-cert.sh failed: {said}");
        said
    };

    // 1. The Secret first (the CRD does not exist yet), then the install.
    let said = webhook_cert_sh(service, secret);
    assert!(said.contains("is not installed yet"), "{said}");
    let ca_a = secret_key(&admin, &ns, secret, "ca.crt").await;
    let ca_a_value = {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(&ca_a)
    };
    helm_install(
        &cluster,
        release,
        &ns,
        &["shards=1", &format!("webhook.caBundle={ca_a_value}")],
    );
    assert_eq!(crd_ca_bundle(&admin).await, ca_a, "the install wrote CA A");
    // The script run for another install (a namespaced release beside this one, whose
    // webhook the CRD does not call) leaves the CRD's CA alone.
    let said = webhook_cert_sh(
        "team-b-ops-gpujob-operator-webhook",
        "team-b-ops-webhook-tls",
    );
    assert!(said.contains("is left alone"), "{said}");
    assert_eq!(crd_ca_bundle(&admin).await, ca_a, "another install's CA");

    // The replica: the installed Deployment's flags, the Secret's files where it reads
    // them, its webhook at this machine's address.
    let cert_dir = std::env::temp_dir().join(format!("gpujob-install-ca-{ns}"));
    std::fs::create_dir_all(&cert_dir).unwrap();
    mount_secret_files(
        &cert_dir,
        &secret_key(&admin, &ns, secret, "tls.crt").await,
        &secret_key(&admin, &ns, secret, "tls.key").await,
    );
    let ip = host_address();
    let webhook: std::net::SocketAddr = loop {
        let port = devcluster::ports::free().unwrap();
        if std::net::TcpListener::bind((ip, port)).is_ok() {
            break (ip, port).into();
        }
    };
    let pod = installed_pod(&admin, &ns, release).await;
    let args: Vec<String> = pod["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(args[0], "run", "{args:?}");
    let mounted = "--conversion-cert-dir=/etc/gpujob-operator/webhook-tls";
    assert!(args.iter().any(|a| a == mounted), "{args:?}");
    let mut args: Vec<String> = args[1..]
        .iter()
        .map(|a| {
            if a == mounted {
                format!("--conversion-cert-dir={}", cert_dir.display())
            } else {
                a.clone()
            }
        })
        .collect();
    args.push(format!("--conversion-address={webhook}"));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let sa = pod["serviceAccountName"].as_str().unwrap();
    let kubeconfig = token_kubeconfig(&cluster, &ns, sa);
    let start = || support::replicas::start_as(&cluster, &ns, 1, &args, kubeconfig.clone());
    let mut replica = start();

    // The Service's endpoint: a pod with its selector's labels and a container port
    // named as its targetPort, ready at this machine's address (no kubelet runs here to
    // say otherwise), on a node that exists (the EndpointSlice controller skips a pod
    // on a missing one).
    let selector = Api::<k8s_openapi::api::core::v1::Service>::namespaced(admin.clone(), &ns)
        .get(service)
        .await
        .unwrap()
        .spec
        .unwrap()
        .selector
        .unwrap();
    let pods = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(admin.clone(), &ns);
    let stand_in: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "metadata": {"name": "webhook-endpoint", "labels": selector},
        "spec": {
            "nodeName": devcluster::nodes::GpuNodes::name(0),
            "containers": [{
                "name": "operator", "image": "registry.example.com/stand-in:1",
                "ports": [{"name": "webhook", "containerPort": webhook.port()}],
            }],
        },
    }))
    .unwrap();
    pods.create(&PostParams::default(), &stand_in)
        .await
        .unwrap();
    pods.patch_status(
        "webhook-endpoint",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {
            "phase": "Running", "podIP": ip.to_string(), "podIPs": [{"ip": ip.to_string()}],
            "conditions": [{"type": "Ready", "status": "True"}],
        }})),
    )
    .await
    .unwrap();
    // kube-apiserver 1.33 (the compatibility subset) reaches a Service through its v1
    // Endpoints, 1.35 and later through its EndpointSlices. devcluster runs the
    // EndpointSlice controller alone, so the Endpoints the endpoints controller would
    // make of that pod are written here (nothing else writes them).
    let endpoints: k8s_openapi::api::core::v1::Endpoints = serde_json::from_value(json!({
        "metadata": {"name": service},
        "subsets": [{
            "addresses": [{"ip": ip.to_string()}],
            "ports": [{"name": "webhook", "port": webhook.port()}],
        }],
    }))
    .unwrap();
    Api::<k8s_openapi::api::core::v1::Endpoints>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &endpoints)
        .await
        .unwrap();

    // A GpuJob stored as v1: reading it as v2 takes a conversion.
    let gj: GpuJob = serde_json::from_value(json!({
        "apiVersion": "gpujob.dev/v1", "kind": "GpuJob",
        "metadata": {"name": "train"},
        "spec": {"image": "registry.example.com/train:1", "gpus": 1},
    }))
    .unwrap();
    Api::<GpuJob>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &gj)
        .await
        .unwrap();
    let v2 = {
        let gvk = kube::api::GroupVersionKind::gvk("gpujob.dev", "v2", "GpuJob");
        let resource = kube::api::ApiResource::from_gvk_with_plural(&gvk, "gpujobs");
        Api::<kube::api::DynamicObject>::namespaced_with(admin.clone(), &ns, &resource)
    };
    let v2 = &v2;
    v2_reads(v2, "after the install", &replica).await;

    // Serving the Secret's new pair, as the operator does within a handshake of the
    // kubelet updating its files.
    let serves = async |ca: rustls::pki_types::CertificateDer<'static>,
                        what: &str,
                        replica: &support::replicas::Replica| {
        let (dns, ca) = (&dns, &ca);
        wait::until(what, WAIT, POLL, || async move {
            serves_a_certificate_of(webhook, dns, ca).await.ok()
        })
        .await
        .unwrap_or_else(|e| panic!("{e}; operator log:\n{}", replica.log_text()));
    };
    let upgrade = || -> String {
        let mut upgrade = helm(Some(&cluster));
        upgrade.args([
            "upgrade",
            release,
            CHART,
            "--namespace",
            &ns,
            "--reuse-values",
        ]);
        run(upgrade)
    };

    // 2. The Secret replaced by other means (CA B), the CRD untouched.
    let (ca_b, tls_crt, tls_key) = {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let ca = params.self_signed(&ca_key).unwrap();
        let leaf_key = rcgen::KeyPair::generate().unwrap();
        let leaf = rcgen::CertificateParams::new(vec![dns.clone(), format!("{dns}.cluster.local")])
            .unwrap()
            .signed_by(&leaf_key, &ca, &ca_key)
            .unwrap();
        (ca.pem(), leaf.pem(), leaf_key.serialize_pem())
    };
    Api::<k8s_openapi::api::core::v1::Secret>::namespaced(admin.clone(), &ns)
        .patch(
            secret,
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {
                "tls.crt": tls_crt, "tls.key": tls_key, "ca.crt": ca_b,
            }})),
        )
        .await
        .unwrap();
    mount_secret_files(&cert_dir, tls_crt.as_bytes(), tls_key.as_bytes());
    serves(
        first_certificate(ca_b.as_bytes()),
        "the replica to serve CA B's certificate",
        &replica,
    )
    .await;
    let out = upgrade();
    // The API server keeps the connections it opened while the replica served the old
    // certificate, and reads through them prove nothing about the caBundle; a replica
    // that restarts (a rollout, a drain) is when a wrong one shows. So: a new process.
    drop(replica);
    replica = start();
    v2_reads(
        v2,
        "after the Secret changed, helm upgrade --reuse-values and a restart",
        &replica,
    )
    .await;
    assert_eq!(
        String::from_utf8_lossy(&crd_ca_bundle(&admin).await),
        ca_b,
        "the upgrade wrote the Secret's CA B"
    );
    assert!(
        out.contains("webhook.caBundle differs and") && out.contains("is not used"),
        "the notes say the value is not used: {out}"
    );

    // 3. webhook-cert.sh rotates (CA C, with B kept in the bundle).
    let said = webhook_cert_sh(service, secret);
    assert!(said.contains("caBundle of CRD"), "{said}");
    let bundle = secret_key(&admin, &ns, secret, "ca.crt").await;
    assert_eq!(
        crd_ca_bundle(&admin).await,
        bundle,
        "the script wrote one bundle to both"
    );
    let ca_c = first_certificate(&bundle);
    assert_ne!(ca_c, first_certificate(ca_b.as_bytes()), "a new CA");
    mount_secret_files(
        &cert_dir,
        &secret_key(&admin, &ns, secret, "tls.crt").await,
        &secret_key(&admin, &ns, secret, "tls.key").await,
    );
    serves(ca_c, "the replica to serve CA C's certificate", &replica).await;
    upgrade();
    drop(replica);
    replica = start();
    v2_reads(
        v2,
        "after webhook-cert.sh, helm upgrade --reuse-values and a restart",
        &replica,
    )
    .await;
    assert_eq!(
        crd_ca_bundle(&admin).await,
        bundle,
        "the upgrade kept the Secret's bundle"
    );

    drop(replica);
    std::fs::remove_file(&kubeconfig).unwrap();
    std::fs::remove_dir_all(&cert_dir).unwrap();
    std::fs::remove_dir_all(support::namespace_temp(support::REPLICA_LOGS, &ns)).unwrap();
}

/// values.schema.json: `helm template` and `helm lint` refuse a value of the wrong type or
/// shape, or a misspelt key, with an error that names the field; the same field with a
/// good value renders (so the refusal is the value's).
#[test]
fn the_chart_refuses_a_wrong_value_and_names_the_field() {
    for (bad, good, names) in [
        (
            "replicas=three",
            "replicas=5",
            "at '/replicas': got string, want integer",
        ),
        ("shards=0", "shards=6", "at '/shards'"),
        (
            "crds.install=yes",
            "crds.install=false",
            "at '/crds/install': got string, want boolean",
        ),
        (
            "metrics.secure=1",
            "metrics.secure=true",
            "at '/metrics/secure'",
        ),
        ("logFormat=xml", "logFormat=text", "at '/logFormat'"),
        (
            "monitoring.interval=soon",
            "monitoring.interval=1m30s",
            "at '/monitoring/interval'",
        ),
        (
            "webhook.certManager.renewBefore=monthly",
            "webhook.certManager.renewBefore=360h",
            "at '/webhook/certManager/renewBefore'",
        ),
        (
            "podDisruptionBudget.maxUnavailable=half",
            "podDisruptionBudget.maxUnavailable=50%",
            "at '/podDisruptionBudget/maxUnavailable'",
        ),
        (
            "image.digest=latest",
            "image.digest=sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "at '/image/digest'",
        ),
        (
            "replica=3",
            "replicas=3",
            "additional properties 'replica' not allowed",
        ),
        (
            "monitoring.lables.release=kube-prometheus-stack",
            "monitoring.labels.release=kube-prometheus-stack",
            "at '/monitoring': additional properties 'lables' not allowed",
        ),
    ] {
        helm_template("gpujob-operator", "gpujob-system", &[good]);
        let mut template = helm(None);
        template.args(["template", "gpujob-operator", CHART, "--set", bad]);
        let mut lint = helm(None);
        lint.args(["lint", "--strict", CHART, "--set", bad]);
        for mut cmd in [template, lint] {
            let out = cmd.output().unwrap();
            let said = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(!out.status.success(), "{cmd:?} accepted {bad}: {said}");
            assert!(said.contains(names), "{cmd:?} with {bad}: {said}");
        }
    }
}

/// Two cluster-wide releases would both write every namespace's GpuJobs, each on Leases
/// of its own. On a control plane of its own (a release installed for real on the shared
/// one would refuse the other tests' cluster-wide dry runs): the first `helm install`
/// goes through, a second release's is refused naming the first, so is a release of the
/// first's name in another namespace, and the first's own upgrade is not refused by its
/// own binding.
#[tokio::test]
async fn a_second_cluster_wide_release_is_refused_naming_the_first() {
    let cluster = ControlPlane::start(devcluster::Options {
        pod_simulator: false,
        ..devcluster::Options::default()
    })
    .await
    .unwrap();
    let first_ns = cluster.create_namespace("install-first").await.unwrap();
    let second_ns = cluster.create_namespace("install-second").await.unwrap();
    helm_install(&cluster, "first", &first_ns, &["replicas=0"]);

    // The CRD is the first's: without crds.install=false the second would be refused
    // for it too, and this test would not tell which refusal spoke.
    let mut second = helm(Some(&cluster));
    second.args([
        "install",
        "second",
        CHART,
        "--namespace",
        &second_ns,
        "--set",
        "replicas=0",
        "--set",
        "crds.install=false",
    ]);
    let out = second.output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "the second release installed: {said}"
    );
    assert!(
        said.contains("another gpujob-operator release acts on every namespace already")
            && said.contains(
                "ClusterRoleBinding first-gpujob-operator of release \"first\" in namespace"
            )
            && said.contains(&format!("{first_ns}/first-gpujob-operator")),
        "{said}"
    );

    // A release of the first's name in another namespace has bindings of the same names:
    // another release all the same (with --take-ownership, Helm would hand it the
    // first's binding).
    let mut same_name = helm(Some(&cluster));
    same_name.args([
        "install",
        "first",
        CHART,
        "--namespace",
        &second_ns,
        "--take-ownership",
        "--set",
        "replicas=0",
        "--set",
        "crds.install=false",
    ]);
    let out = same_name.output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && said.contains(&format!("of release \"first\" in namespace \"{first_ns}\"")),
        "a release of the same name in {second_ns}: {said}"
    );

    let mut upgrade = helm(Some(&cluster));
    upgrade.args([
        "upgrade",
        "first",
        CHART,
        "--namespace",
        &first_ns,
        "--reuse-values",
    ]);
    let out = run(upgrade);
    assert!(out.contains("STATUS: deployed"), "{out}");
}

/// webhook-cert.sh against a CRD without a conversion webhook (the v1-only CRD, as a
/// cluster has it before the v2 upgrade, and as the shared control plane has it): it
/// says there is nothing to trust there yet, leaves the CRD as it is, and still writes
/// the Secret with its CA as ca.crt. (A JSON patch of the missing caBundle path failed
/// the script before the Secret was written.)
#[tokio::test]
async fn the_webhook_script_writes_the_secret_beside_a_v1_only_crd() {
    let cluster = ControlPlane::for_tests(&[&support::test_crd()])
        .await
        .unwrap();
    let admin = cluster.client(Identity::Admin).await.unwrap();
    let ns = cluster.create_namespace("install-v1-only").await.unwrap();
    let crds = Api::<
        k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    >::all(admin.clone());
    let before = crds.get("gpujobs.gpujob.dev").await.unwrap();
    assert_ne!(
        before.spec.conversion.as_ref().map(|c| c.strategy.as_str()),
        Some("Webhook"),
        "this test needs the v1-only CRD"
    );
    let mut cmd = cluster.command(
        concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/webhook-cert.sh"),
        Identity::Admin,
    );
    cmd.env("NAMESPACE", &ns);
    let out = cmd.output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "webhook-cert.sh failed: {said}");
    assert!(said.contains("has no conversion webhook"), "{said}");
    let ca = secret_key(&admin, &ns, "gpujob-operator-webhook-tls", "ca.crt").await;
    assert!(
        String::from_utf8_lossy(&ca).contains("BEGIN CERTIFICATE"),
        "ca.crt holds the CA"
    );
    let after = crds.get("gpujobs.gpujob.dev").await.unwrap();
    assert_eq!(
        after.spec.conversion, before.spec.conversion,
        "the CRD's conversion was written"
    );
}
