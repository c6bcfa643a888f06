//! A private control plane set up for a load: the CRD (gpujob.dev/v1 alone: the load
//! needs no v2, and a CRD serving v2 sends kube-controller-manager's reads of GpuJobs
//! to a conversion webhook nobody runs here), the operator's namespace and RBAC
//! (`deploy/`), the namespaces the GpuJobs go into, and fake GPU nodes with room for
//! every GpuJob at once (the load measures the operator, not a GPU queue).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use devcluster::nodes::GpuNodes;
use devcluster::{ControlPlane, Identity, Options};
use gpujob_operator::api::{Conversion, CrdOptions, crd_yaml_with};
use kube::Client;
use kube::api::{Api, PostParams};
use serde_json::json;

use crate::running::Budget;

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

/// The command line (program first) of a running process, from /proc.
fn command_line(pid: u32) -> anyhow::Result<Vec<String>> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline"))
        .with_context(|| format!("reading the command line of process {pid}"))?;
    Ok(raw
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect())
}

/// The client budget of the control plane's kube-controller-manager, read from its
/// command line (devcluster raises it from the default 20 qps / 30 burst).
pub fn kcm_budget(cluster: &ControlPlane) -> anyhow::Result<Budget> {
    let pid = kcm_pid(cluster)?;
    let args = command_line(pid)?;
    Budget::from_args(args.get(1..).unwrap_or_default(), "devcluster's flags")
}

fn kcm_pid(cluster: &ControlPlane) -> anyhow::Result<u32> {
    cluster
        .info()
        .pids
        .get("kube-controller-manager")
        .copied()
        .context("the control plane runs no kube-controller-manager")
}

/// A kube-controller-manager started by the load test in place of devcluster's, with
/// another client budget; ended on drop.
#[derive(Debug)]
pub struct Kcm {
    child: Child,
    pub budget: Budget,
}

impl Kcm {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Kcm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Ends devcluster's kube-controller-manager (SIGTERM to the process devcluster started
/// for this load test) and starts it again with the same flags but `budget`, its log in
/// the control plane's `logs/kube-controller-manager-budget.log`; returns once its Job
/// controller has started and every controller has synced its caches (or after a
/// minute, said on stderr). Before any
/// GpuJob exists: the Job controller has nothing to catch up on.
pub fn restart_kcm(cluster: &ControlPlane, budget: Budget) -> anyhow::Result<Kcm> {
    let pid = kcm_pid(cluster)?;
    let line = command_line(pid)?;
    let (program, args) = line
        .split_first()
        .context("kube-controller-manager's command line is empty")?;
    let args = budget_args(args, &budget);
    let status = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .context("running kill")?;
    if !status.success() {
        bail!("kill -TERM {pid} (kube-controller-manager) failed: {status}");
    }
    // devcluster reaps it at shutdown: until then it is a zombie (state Z).
    let gone = || {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                s.rsplit_once(')')
                    .map(|(_, rest)| rest.trim_start().starts_with('Z'))
            })
            .unwrap_or(true)
    };
    let until = Instant::now() + Duration::from_secs(30);
    while !gone() {
        if Instant::now() >= until {
            bail!("kube-controller-manager ({pid}) did not end within 30 s of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let log = cluster
        .info()
        .state_dir
        .join("logs")
        .join("kube-controller-manager-budget.log");
    let out = std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
    let child = Command::new(program)
        .args(&args)
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .spawn()
        .with_context(|| format!("starting {program}"))?;
    let kcm = Kcm { child, budget };
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        if synced(&std::fs::read_to_string(&log).unwrap_or_default()) {
            break;
        }
        if Instant::now() >= until {
            eprintln!(
                "the restarted kube-controller-manager's Job controller did not say it synced within 60 s; going on ({})",
                log.display()
            );
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!(
        "kube-controller-manager restarted with client budget {} qps / {} burst (log: {})",
        kcm.budget.qps,
        kcm.budget.burst,
        log.display()
    );
    Ok(kcm)
}

/// Has kube-controller-manager, by its log, started the Job controller and synced every
/// cache a controller waited for? (Its log lines do not name the controller that waits.)
fn synced(log: &str) -> bool {
    let count = |what: &str| log.lines().filter(|l| l.contains(what)).count();
    let waiting = count("\"Waiting for caches to sync\"");
    log.contains("\"Starting job controller\"")
        && waiting > 0
        && count("\"Caches are synced\"") >= waiting
}

/// `args` with their `--kube-api-qps` and `--kube-api-burst` replaced by `budget`'s.
fn budget_args(args: &[String], budget: &Budget) -> Vec<String> {
    args.iter()
        .filter(|a| !a.starts_with("--kube-api-qps=") && !a.starts_with("--kube-api-burst="))
        .cloned()
        .chain([
            format!("--kube-api-qps={}", budget.qps),
            format!("--kube-api-burst={}", budget.burst),
        ])
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_job_controller_is_ready_once_every_cache_it_waited_for_synced() {
        let start = "I1205 01:29:33.030918 30986 job_controller.go:334] \"Starting job controller\"\n\
            I1205 01:29:33.030933 30986 shared_informer.go:524] \"Waiting for caches to sync\"\n\
            I1205 01:29:33.030951 30986 shared_informer.go:524] \"Waiting for caches to sync\"\n\
            I1205 01:29:33.130584 30986 shared_informer.go:531] \"Caches are synced\"\n";
        assert!(!synced(start));
        let all = format!(
            "{start}I1205 01:29:33.130875 30986 shared_informer.go:531] \"Caches are synced\"\n"
        );
        assert!(synced(&all));
        assert!(!synced(
            &all.replace("Starting job controller", "Starting other")
        ));
    }

    #[test]
    fn the_budget_flags_are_replaced() {
        let args: Vec<String> = [
            "--leader-elect=false",
            "--kube-api-qps=300",
            "--kube-api-burst=600",
        ]
        .map(str::to_owned)
        .to_vec();
        let budget = Budget::parse("20/30").unwrap();
        let out = budget_args(&args, &budget);
        assert_eq!(
            out,
            [
                "--leader-elect=false",
                "--kube-api-qps=20",
                "--kube-api-burst=30"
            ]
        );
        assert_eq!(
            Budget::from_args(&out, "x").unwrap(),
            Budget {
                source: "x".to_owned(),
                ..budget
            }
        );
    }
}
