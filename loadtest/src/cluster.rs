//! A private control plane set up for a load: the CRD (gpujob.dev/v1 alone: the load
//! needs no v2, and a CRD serving v2 sends kube-controller-manager's reads of GpuJobs
//! to a conversion webhook nobody runs here), the operator's namespace and RBAC
//! (`deploy/`), the namespaces the GpuJobs go into, and fake GPU nodes with room for
//! every GpuJob at once (the load measures the operator, not a GPU queue).

use std::path::Path;

use anyhow::{Context, bail};
use devcluster::nodes::GpuNodes;
use devcluster::{ControlPlane, Identity, Options};
use gpujob_operator::api::{Conversion, CrdOptions, crd_yaml_with};
use kube::Client;
use kube::api::{Api, PostParams};
use serde_json::json;

/// GPUs per fake node of a load's control plane.
const GPUS_PER_NODE: u16 = 64;

/// Starts one with room for `gpujobs` one-GPU GpuJobs running at once and returns it
/// with an admin client.
pub async fn start(
    deploy: &Path,
    namespaces: &[String],
    gpujobs: usize,
    sharded_watch: bool,
) -> anyhow::Result<(ControlPlane, Client)> {
    eprintln!("starting a private control plane");
    let crd = std::env::temp_dir().join(format!("gpujob-loadtest-crd-{}.yaml", std::process::id()));
    let v1_only = CrdOptions {
        conversion: Conversion::V1Only,
        ..CrdOptions::default()
    };
    std::fs::write(&crd, crd_yaml_with(&v1_only)?)
        .with_context(|| format!("writing {}", crd.display()))?;
    let nodes = gpujobs.div_ceil(usize::from(GPUS_PER_NODE)).max(1);
    let cluster = ControlPlane::start(Options {
        crds: vec![crd.clone()],
        gpu_nodes: GpuNodes {
            count: u16::try_from(nodes).context("too many GpuJobs for the fake nodes")?,
            gpus_per_node: GPUS_PER_NODE,
            ..GpuNodes::default()
        },
        sharded_watch,
        ..Options::default()
    })
    .await
    .context("starting the control plane")?;
    let _ = std::fs::remove_file(&crd);
    kubectl_apply(&cluster, deploy)?;
    let admin = cluster.client(Identity::Admin).await?;
    let namespace_api = Api::<k8s_openapi::api::core::v1::Namespace>::all(admin.clone());
    for name in namespaces {
        let ns = serde_json::from_value(json!({"metadata": {"name": name}}))?;
        namespace_api
            .create(&PostParams::default(), &ns)
            .await
            .with_context(|| format!("creating the namespace {name}"))?;
    }
    Ok((cluster, admin))
}

fn kubectl_apply(cluster: &ControlPlane, deploy: &Path) -> anyhow::Result<()> {
    let out = cluster
        .command("kubectl", Identity::Admin)
        .arg("apply")
        .arg("-f")
        .arg(deploy.join("operator/namespace.yaml"))
        .arg("-f")
        .arg(deploy.join("operator/rbac.yaml"))
        .output()
        .context("running kubectl apply")?;
    if !out.status.success() {
        bail!(
            "kubectl apply of {}/operator/namespace.yaml and rbac.yaml failed: {}",
            deploy.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}
