//! The shipped install (deploy/) on the real control plane: the user roles aggregate
//! into the built-in ones.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

mod support;

use std::path::Path;

use devcluster::{ControlPlane, Identity, wait};
use gpujob_operator::api::GpuJob;
use k8s_openapi::api::rbac::v1::{ClusterRole, RoleBinding};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, Resource};
use serde_json::json;
use support::{CRD, POLL, WAIT};

const USER_ROLES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/crd/user-roles.yaml");

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

    let as_editor: Api<GpuJob> = Api::namespaced(as_user(&cluster, &editor).await, &ns);
    as_editor.create(&pp, &gpujob("by-editor")).await.unwrap();
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
    let seen = as_viewer.get("by-editor").await.unwrap();
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
