//! devcluster: a real local Kubernetes control plane for tests, the demo and the load test.
//!
//! etcd, kube-apiserver, kube-controller-manager and kube-scheduler run as child
//! processes on loopback ports; the scheduler places pods on fake GPU nodes
//! ([`nodes::GpuNodes`]) and kwok plays their kubelet ([`kwok`]), so that the real Job
//! controller drives Jobs to Complete or Failed. Everything the API server decides
//! (validation, conflicts, garbage collection, watches, RBAC) is therefore decided by the
//! real thing.
//!
//! Typical use in a test:
//!
//! ```no_run
//! # async fn t() -> Result<(), devcluster::Error> {
//! let cluster = devcluster::ControlPlane::for_tests(&[]).await?;
//! let ns = cluster.create_namespace("demo").await?;
//! let admin = cluster.client(devcluster::Identity::Admin).await?;
//! # let _ = (ns, admin); Ok(()) }
//! ```
//!
//! `for_tests` attaches to the control plane named by `DEVCLUSTER_DIR` (started once per
//! test run by `scripts/test.sh`) or, when unset, starts a private one for the process.
//!
//! With [`Options::dra`] set, the fake nodes also have fake Dynamic Resource Allocation
//! devices ([`dra`]) that kube-scheduler allocates ResourceClaims on. With
//! [`Options::gang`] set, kube-scheduler schedules PodGroups all-or-nothing and keeps a
//! group in one rack or block of the fake nodes' topology when it asks ([`gang`],
//! [`nodes::Topology`]).
//!
//! [`faultproxy::FaultProxy`] puts injected faults (latency, errors, resets, cut watches,
//! partitions) between one client and kube-apiserver while the others talk to it directly.

pub mod assets;
pub mod audit;
mod cluster;
pub mod dra;
mod error;
pub mod faultproxy;
pub mod gang;
pub mod identity;
pub mod kwok;
pub mod metrics;
pub mod nodes;
pub mod pki;
pub mod ports;
mod process;
pub mod wait;

pub use cluster::{ClusterInfo, ControlPlane, Options, STATE_DIR_ENV, load_crds};
pub use error::Error;
pub use identity::Identity;
pub use process::{end_stale, is_alive};

/// rustls needs exactly one process-wide crypto provider; install ring's once. A second
/// provider pulled in by another crate would otherwise make kube's TLS set-up panic.
pub fn install_crypto_provider() {
    // Err means a provider is installed already, which is all we need.
    let _ = rustls::crypto::ring::default_provider().install_default();
}
