//! Operator replicas as processes of the real binary, as the operator's service account
//! (deploy/rbac.yaml, least privilege), each with its own metrics port and log file.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use devcluster::{ControlPlane, Identity};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Client;
use kube::api::Api;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const LEASE_NAMESPACE: &str = "gpujob-system";
const LEASE: &str = "gpujob-operator";

#[derive(Debug)]
pub struct Replica {
    pub identity: String,
    pub addr: std::net::SocketAddr,
    child: Option<Child>,
}

/// Ended (SIGKILL) when dropped.
#[derive(Debug)]
pub struct Replicas(Vec<Replica>);

impl Replicas {
    pub fn start(cluster: &ControlPlane, bin: &Path, n: u8) -> anyhow::Result<Replicas> {
        let logs = std::env::temp_dir().join(format!("gpujob-loadtest-{}", std::process::id()));
        std::fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
        let mut all = Vec::new();
        for i in 1..=n {
            let identity = format!("load-{i}");
            // A free port now; the replica binds it a moment later.
            let addr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
            let log = logs.join(format!("{identity}.log"));
            let out = std::fs::File::create(&log)?;
            let child = Command::new(bin)
                .args(["run", "--identity", &identity])
                .args(["--lease-namespace", LEASE_NAMESPACE])
                .args(["--listen-address", &addr.to_string()])
                .env("KUBECONFIG", cluster.kubeconfig(Identity::Operator))
                .env("RUST_LOG", "info")
                .stdin(Stdio::null())
                .stdout(out.try_clone()?)
                .stderr(out)
                .spawn()
                .with_context(|| format!("starting {}", bin.display()))?;
            all.push(Replica {
                identity,
                addr,
                child: Some(child),
            });
        }
        eprintln!("replica logs in {}", logs.display());
        Ok(Replicas(all))
    }

    /// The Lease holder once there is one (other than `not`).
    pub async fn wait_leader(
        &self,
        admin: &Client,
        not: Option<&str>,
        deadline: Instant,
    ) -> anyhow::Result<String> {
        let leases: Api<Lease> = Api::namespaced(admin.clone(), LEASE_NAMESPACE);
        loop {
            if let Some(holder) = holder(&leases).await
                && Some(holder.as_str()) != not
            {
                return Ok(holder);
            }
            if Instant::now() >= deadline {
                bail!("no replica took the Lease {LEASE_NAMESPACE}/{LEASE} in time");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `kill -9` of the current leader; returns its identity.
    pub async fn kill_leader(&mut self, admin: &Client) -> anyhow::Result<String> {
        let leases: Api<Lease> = Api::namespaced(admin.clone(), LEASE_NAMESPACE);
        let holder = holder(&leases).await.context("no leader to kill")?;
        let replica = self
            .0
            .iter_mut()
            .find(|r| r.identity == holder)
            .with_context(|| format!("the Lease names {holder}, not one of ours"))?;
        if let Some(child) = replica.child.as_mut() {
            child.kill()?;
            child.wait()?;
        }
        replica.child = None;
        eprintln!("killed the leader {holder}");
        Ok(holder)
    }

    /// Each live replica's `/metrics` text.
    pub async fn scrape(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for r in self.0.iter().filter(|r| r.child.is_some()) {
            match get_metrics(r.addr).await {
                Ok(text) => out.push((r.identity.clone(), text)),
                Err(e) => eprintln!("scraping {} at {}: {e:#}", r.identity, r.addr),
            }
        }
        out
    }

    /// Peak and current resident memory (KiB) of each live replica, from /proc.
    pub fn memory(&self) -> Vec<(String, u64, u64)> {
        self.0
            .iter()
            .filter_map(|r| {
                let pid = r.child.as_ref()?.id();
                let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
                let kib = |key: &str| {
                    status
                        .lines()
                        .find_map(|l| l.strip_prefix(key))
                        .and_then(|v| v.split_whitespace().next())
                        .and_then(|v| v.parse::<u64>().ok())
                };
                Some((r.identity.clone(), kib("VmHWM:")?, kib("VmRSS:")?))
            })
            .collect()
    }
}

impl Drop for Replicas {
    fn drop(&mut self) {
        for r in &mut self.0 {
            if let Some(mut child) = r.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

async fn holder(leases: &Api<Lease>) -> Option<String> {
    leases
        .get_opt(LEASE)
        .await
        .ok()
        .flatten()?
        .spec?
        .holder_identity
        .filter(|h| !h.is_empty())
}

/// A plain HTTP/1.0 GET: the body of `/metrics`.
async fn get_metrics(addr: std::net::SocketAddr) -> anyhow::Result<String> {
    let exchange = async {
        let mut tcp = tokio::net::TcpStream::connect(addr).await?;
        tcp.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
            .await?;
        let mut text = String::new();
        tcp.read_to_string(&mut text).await?;
        anyhow::Ok(text)
    };
    let text = tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .context("timed out")??;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .context("no end of the response head")?;
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        bail!("answered {}", head.lines().next().unwrap_or_default());
    }
    Ok(body.to_owned())
}
