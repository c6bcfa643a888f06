//! `devcluster`: start, inspect and stop a local control plane from the shell.

use std::num::NonZeroU16;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use devcluster::assets::Assets;
use devcluster::dra::DraDevices;
use devcluster::gang::GangScheduling;
use devcluster::nodes::{GpuNodes, Topology};
use devcluster::{ControlPlane, Identity, Options};

#[derive(Debug, Parser)]
#[command(
    name = "devcluster",
    version,
    about = "A real local Kubernetes control plane for tests and demos"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Print the folder holding etcd, kube-apiserver, kube-controller-manager and
    /// kube-scheduler, then the path of kwok, building them with Go when missing.
    Assets,
    /// Start a control plane and keep it running until SIGINT or SIGTERM.
    Up {
        /// State folder (emptied at start; holds kubeconfigs, logs and the audit log).
        #[arg(long, env = "DEVCLUSTER_DIR")]
        state_dir: PathBuf,
        /// CRD manifest to install before the controllers start (repeatable).
        #[arg(long = "crd")]
        crds: Vec<PathBuf>,
        /// Number of replica-N users.
        #[arg(long, default_value_t = 3)]
        replicas: u8,
        /// Do not run kwok (pods bound to the fake nodes then stay Pending).
        #[arg(long)]
        no_pod_simulator: bool,
        /// Fake GPU nodes for kube-scheduler to place pods on.
        #[arg(long, default_value_t = GpuNodes::default().count)]
        gpu_nodes: u16,
        /// `nvidia.com/gpu` each fake node has.
        #[arg(long, default_value_t = GpuNodes::default().gpus_per_node)]
        gpus_per_node: u16,
        /// GPU products (node label `nvidia.com/gpu.product`) the nodes take in turn.
        #[arg(long, value_delimiter = ',', default_values_t = GpuNodes::default().products)]
        gpu_products: Vec<String>,
        /// Fake nodes per rack (node label topology.devcluster.dev/rack); nodes fill
        /// racks in order.
        #[arg(long, default_value_t = Topology::default().hosts_per_rack)]
        hosts_per_rack: NonZeroU16,
        /// Racks per block (node label topology.devcluster.dev/block).
        #[arg(long, default_value_t = Topology::default().racks_per_block)]
        racks_per_block: NonZeroU16,
        /// Publish fake DRA devices (resource.k8s.io/v1): a DeviceClass
        /// `gpu.devcluster.dev` and, per fake node, a ResourceSlice with one device per
        /// GPU (attribute productName, capacity memory), and run the ResourceClaim
        /// controller. Needs Kubernetes 1.34 or later.
        #[arg(long)]
        dra: bool,
        /// With --dra: the memory of a product's devices, PRODUCT=QUANTITY (repeatable;
        /// the A100 80GB, H100 and H200 are known).
        #[arg(long = "dra-memory", value_parser = parse_memory, requires = "dra")]
        dra_memory: Vec<(String, String)>,
        /// Turn on workload-aware (gang) scheduling: the feature gates GenericWorkload
        /// and TopologyAwareWorkloadScheduling on kube-apiserver, kube-controller-manager
        /// and kube-scheduler, the API scheduling.k8s.io/v1beta1 (Workload, PodGroup),
        /// and the PodGroup protection controller. Needs Kubernetes 1.37 or later.
        #[arg(long)]
        gang: bool,
        /// With --gang: also the feature gate WorkloadWithJob, with which the Job
        /// controller makes a Workload and a PodGroup for every new Job that no other
        /// object controls, and puts its pods in that group.
        #[arg(long, requires = "gang")]
        gang_jobs: bool,
    },
    /// Stop the control plane whose state folder this is (its `up` process, or processes
    /// left behind by one that was killed).
    Down {
        #[arg(long, env = "DEVCLUSTER_DIR")]
        state_dir: PathBuf,
    },
}

fn main() -> ExitCode {
    use std::io::IsTerminal;
    // The readiness poll expects refused connections and 500s while kube-apiserver
    // starts; kube's client logs each one as an error, which would only mislead.
    let default_filter = "info,kube_client::client::builder=off";
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter)),
        )
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Cmd::Assets => Assets::prepare()
            .and_then(|a| Ok((a, devcluster::kwok::prepare()?)))
            .map(|(a, kwok)| {
                println!("{}", a.dir().display());
                println!("{}", kwok.display());
            })
            .map_err(anyhow::Error::from),
        Cmd::Up {
            state_dir,
            crds,
            replicas,
            no_pod_simulator,
            gpu_nodes,
            gpus_per_node,
            gpu_products,
            hosts_per_rack,
            racks_per_block,
            dra,
            dra_memory,
            gang,
            gang_jobs,
        } => up(Options {
            state_dir: Some(state_dir),
            crds,
            replicas,
            pod_simulator: !no_pod_simulator,
            gpu_nodes: GpuNodes {
                count: gpu_nodes,
                gpus_per_node,
                products: gpu_products,
                topology: Topology {
                    hosts_per_rack,
                    racks_per_block,
                },
            },
            dra: dra.then(|| {
                let mut devices = DraDevices::default();
                devices.memory.extend(dra_memory);
                devices
            }),
            gang: gang.then_some(GangScheduling {
                job_controller: gang_jobs,
                ..GangScheduling::default()
            }),
            ..Options::default()
        }),
        Cmd::Down { state_dir } => down(&state_dir),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("devcluster: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `NVIDIA-H200=141Gi` → (`NVIDIA-H200`, `141Gi`); the API server judges the quantity.
fn parse_memory(arg: &str) -> Result<(String, String), String> {
    match arg.split_once('=') {
        Some((product, memory)) if !product.is_empty() && !memory.is_empty() => {
            Ok((product.to_owned(), memory.to_owned()))
        }
        _ => Err(format!(
            "{arg:?} is not PRODUCT=QUANTITY (e.g. NVIDIA-H200=141Gi)"
        )),
    }
}

fn up(opts: Options) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the runtime")?;
    rt.block_on(async move {
        let state_dir = opts.state_dir.clone().unwrap_or_default();
        let pid_file = state_dir.with_extension("up.pid");
        let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .context("installing the SIGTERM handler")?;
        // Ctrl-C during start-up must tear down too: race the start against the signals.
        let cluster = tokio::select! {
            c = ControlPlane::start(opts) => c?,
            _ = tokio::signal::ctrl_c() => return Ok(()),
            _ = sigterm.recv() => return Ok(()),
        };
        let _ = std::fs::write(&pid_file, format!("{}\n", std::process::id()));
        let info = cluster.info();
        println!(
            "control plane ready in {:.1}s: {}",
            info.startup_seconds, info.server
        );
        println!("  state:      {}", info.state_dir.display());
        println!(
            "  kubeconfig: {}",
            info.kubeconfig(Identity::Admin).display()
        );
        println!("  audit log:  {}", info.audit_log.display());
        println!(
            "  use it:     export KUBECONFIG={} DEVCLUSTER_DIR={}",
            info.kubeconfig(Identity::Admin).display(),
            info.state_dir.display()
        );
        println!(
            "  stop it:    Ctrl-C, or devcluster down --state-dir {}",
            info.state_dir.display()
        );
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = sigterm.recv() => {}
        }
        eprintln!("devcluster: stopping");
        let _ = std::fs::remove_file(state_dir.join("cluster.json"));
        cluster.shutdown();
        let _ = std::fs::remove_file(&pid_file);
        Ok(())
    })
}

fn down(state_dir: &std::path::Path) -> anyhow::Result<()> {
    let state_dir = std::path::absolute(state_dir).unwrap_or_else(|_| state_dir.to_path_buf());
    let pid_file = state_dir.with_extension("up.pid");
    if let Ok(text) = std::fs::read_to_string(&pid_file)
        && let Ok(pid) = text.trim().parse::<i32>()
    {
        let pid = nix::unistd::Pid::from_raw(pid);
        if nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).is_ok() {
            // `up` stops its components (5 s grace each) and exits.
            for _ in 0..400 {
                if nix::sys::signal::kill(pid, None).is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        let _ = std::fs::remove_file(&pid_file);
    }
    let ended = devcluster::end_stale(&state_dir);
    for e in &ended {
        eprintln!("devcluster: ended {e}");
    }
    println!("stopped the control plane of {}", state_dir.display());
    Ok(())
}
