//! The shipped install (deploy/): every kustomize tree renders, the API server accepts
//! every rendered object (server-side dry run), the operator's service account can do
//! nothing beyond a reviewed list, and the user roles aggregate into the built-in ones.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

mod support;

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

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

/// An overlay in a temporary folder: the operator with `components` of deploy/, as the
/// README shows it. kustomize takes relative paths only.
fn overlay(components: &[&str]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "gpujob-overlay-{}-{}",
        std::process::id(),
        components.join("-")
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let up = "../".repeat(dir.components().count() - 1);
    let deploy = Path::new(DEPLOY)
        .strip_prefix("/")
        .unwrap()
        .display()
        .to_string();
    let components: Vec<String> = components
        .iter()
        .map(|c| format!("{up}{deploy}/{c}"))
        .collect();
    std::fs::write(
        dir.join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [{up}{deploy}/operator]\ncomponents: [{}]\n",
            components.join(", ")
        ),
    )
    .unwrap();
    dir
}

fn render_overlay(components: &[&str]) -> Vec<serde_json::Value> {
    let dir = overlay(components);
    let objects = render(&dir);
    std::fs::remove_dir_all(&dir).unwrap();
    objects
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
            ("ClusterRole", "gpujob-metrics-reader"),
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
    assert_eq!(kinds(secure), kinds(monitoring));
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
    assert_eq!(
        endpoint["bearerTokenFile"],
        "/var/run/secrets/kubernetes.io/serviceaccount/token"
    );
    assert_eq!(endpoint["tlsConfig"]["insecureSkipVerify"], true);
    assert_eq!(
        render_overlay(&["secure-metrics"]).len(),
        operator.len(),
        "without the monitoring component it patches the Deployment alone"
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
    assert_eq!(
        service["spec"]["selector"], deployment["spec"]["selector"]["matchLabels"],
        "every replica answers"
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
    let certificate = named(&with_cert_manager, "Certificate");
    assert_eq!(certificate["spec"]["secretName"], secret);
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
    assert_eq!(
        named(&with_cert_manager, "Issuer")["metadata"]["name"],
        certificate["spec"]["issuerRef"]["name"]
    );
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

/// `kubectl apply --server-side` of `objects`, with `extra` arguments (a dry run).
fn kubectl_apply(cluster: &ControlPlane, objects: &[serde_json::Value], extra: &[&str]) -> String {
    let mut child = cluster
        .command("kubectl", Identity::Admin)
        .args([
            "apply",
            "--server-side",
            "--force-conflicts",
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
    assert!(
        out.status.success(),
        "kubectl apply {extra:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// What the control plane cannot take as written, and why that is fine: on a server
/// before Kubernetes 1.21 the PodDisruptionBudget (policy/v1) is checked as
/// policy/v1beta1 (the same fields), and the Prometheus Operator's kinds need its CRDs,
/// which are not installed here (rendered and checked above, not sent).
fn for_this_control_plane(
    objects: &[serde_json::Value],
    served: &BTreeSet<String>,
) -> (Vec<serde_json::Value>, Vec<(String, String)>) {
    let mut sent = Vec::new();
    let mut skipped = Vec::new();
    for o in objects {
        let mut o = o.clone();
        let api_version = o["apiVersion"].as_str().unwrap().to_owned();
        if api_version == "policy/v1" && !served.contains("policy/v1") {
            o["apiVersion"] = "policy/v1beta1".into();
        } else if api_version.starts_with("monitoring.coreos.com/")
            && !served.contains(&api_version)
        {
            skipped.push(kind_name(&o));
            continue;
        }
        assert!(
            served.contains(o["apiVersion"].as_str().unwrap()),
            "{:?}: {} is not served",
            kind_name(&o),
            o["apiVersion"]
        );
        sent.push(o);
    }
    (sent, skipped)
}

#[tokio::test]
async fn the_api_server_accepts_every_rendered_object() {
    gpujob_operator::client::install_crypto_provider();
    let cluster = ControlPlane::for_tests(&[Path::new(CRD)]).await.unwrap();
    let served = served_api_versions(&cluster);
    let trees = trees();
    // Objects in gpujob-system need the namespace to exist, even in a dry run.
    let namespace = named(&trees[2].1, "Namespace").clone();
    kubectl_apply(&cluster, &[namespace], &[]);
    for (tree, objects) in &trees {
        let (sent, skipped) = for_this_control_plane(objects, &served);
        assert!(
            skipped
                .iter()
                .all(|(k, _)| k == "ServiceMonitor" || k == "PrometheusRule"),
            "{tree}: {skipped:?}"
        );
        let out = kubectl_apply(&cluster, &sent, &["--dry-run=server"]);
        for o in &sent {
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

#[tokio::test]
async fn the_operator_can_do_nothing_beyond_the_reviewed_list() {
    gpujob_operator::client::install_crypto_provider();
    let cluster = ControlPlane::for_tests(&[Path::new(CRD)]).await.unwrap();
    let served = served_api_versions(&cluster);
    let operator = render(&Path::new(DEPLOY).join("operator"));
    // The shipped namespace, service account and RBAC, for real: the service account's
    // user (devcluster's `operator` identity) then holds exactly what it would in a
    // cluster.
    let rbac: Vec<_> = operator
        .iter()
        .filter(|o| {
            let k = o["kind"].as_str().unwrap();
            k == "Namespace" || k == "ServiceAccount" || k.contains("Role")
        })
        .cloned()
        .collect();
    let (rbac, _) = for_this_control_plane(&rbac, &served);
    kubectl_apply(&cluster, &rbac, &[]);
    let elsewhere = cluster.create_namespace("install-can-i").await.unwrap();

    // Reviewed: what the operator calls (README, deploy/operator/rbac.yaml).
    let cluster_wide: BTreeSet<(&str, &str)> = [
        ("gpujobs.gpujob.dev", "get list watch patch delete"),
        ("gpujobs.gpujob.dev/status", "patch"),
        ("gpujobs.gpujob.dev/finalizers", "update"),
        ("jobs.batch", "get list watch create patch delete"),
        ("pods", "list"),
        ("events.events.k8s.io", "create patch"),
        // --metrics-secure: is this scraper's token valid, may its user get /metrics?
        // Questions only; neither changes anything.
        ("tokenreviews.authentication.k8s.io", "create"),
        ("subjectaccessreviews.authorization.k8s.io", "create"),
        // Every authenticated user may ask what it may do and who it is, and read the
        // cluster's trust bundles (Kubernetes' default bindings, not the operator's).
        ("selfsubjectaccessreviews.authorization.k8s.io", "create"),
        ("selfsubjectrulesreviews.authorization.k8s.io", "create"),
        ("selfsubjectreviews.authentication.k8s.io", "create"),
        ("clustertrustbundles.certificates.k8s.io", "get list watch"),
    ]
    .into();
    let leases = ("leases.coordination.k8s.io", "get list create update");
    for (ns, expected_leases) in [("gpujob-system", true), (elsewhere.as_str(), false)] {
        let mut wanted: BTreeSet<(String, String)> = cluster_wide
            .iter()
            .map(|(r, v)| (r.to_string(), v.to_string()))
            .collect();
        if expected_leases {
            wanted.insert((leases.0.to_owned(), leases.1.to_owned()));
        }
        // The RBAC cache sees the bindings just applied a moment later: wait until
        // every reviewed right shows, then judge that answer.
        let text = wait::until(
            &format!("the operator's rights in {ns}"),
            WAIT,
            POLL,
            || {
                let out = cluster
                    .command("kubectl", Identity::Operator)
                    .args(["auth", "can-i", "--list", "-n", ns])
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
            let entry = (resource.as_str(), verbs.as_str());
            assert!(
                cluster_wide.contains(&entry) || (expected_leases && entry == leases),
                "in {ns}, the operator may {verbs} {resource}: not in the reviewed list\n{text}"
            );
            seen.insert((resource.clone(), verbs.clone()));
        }
        assert_eq!(seen, wanted, "in {ns}:\n{text}");
        // Spelled out, what the review is for.
        for never in ["secrets", "customresourcedefinitions.apiextensions.k8s.io"] {
            assert!(!seen.iter().any(|(r, _)| r == never), "{never}");
        }
        assert!(!seen.contains(&("pods".to_owned(), "create".to_owned())));
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
