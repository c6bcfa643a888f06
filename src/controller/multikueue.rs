//! The worker clusters of Kueue's MultiKueue (`--multikueue-worker NAME=KUBECONFIG`).
//!
//! A GpuJob whose LocalQueue's ClusterQueue has a MultiKueue admission check has each
//! attempt's Job made here, on the management cluster, as always; Kueue's webhook gives
//! it `spec.managedBy: kueue.x-k8s.io/multikueue`, and MultiKueue runs a copy of it on
//! a worker cluster (the same namespace and name, the same labels, its own uid) and
//! brings that copy's status back into it. The copy's pods carry the operator's
//! scheduling gate, so they wait there until the operator lets them go: it reads them on
//! the workers it was given, and writes them there, through clients fenced by the same
//! shard Leases as every write (the fence is keyed by namespace, and MultiKueue keeps
//! the namespace).
//!
//! What ties a worker's pod to the management cluster's Job is [`as_managed`]: a pod of
//! the live copy of a dispatched Job counts as that Job's pod; any other (a copy being
//! deleted, or one MultiKueue dispatched earlier) keeps its own Job's uid, so the gate
//! counts it as another Job's pod that may still run.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};
use tokio::sync::watch;

use crate::client::Limits;
use crate::controller::seen_pod::SeenPod;
use crate::lease::Ownership;
use crate::metrics::Metrics;

/// One worker cluster: the name it goes by in the operator's flags and logs, and a
/// client for its API server.
#[derive(Clone)]
pub struct WorkerCluster {
    pub name: String,
    pub client: Client,
}

impl std::fmt::Debug for WorkerCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerCluster")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// The worker clusters the operator was given (none: dispatched attempts wait, and say
/// why).
#[derive(Clone, Default)]
pub struct WorkerClusters(Arc<Vec<WorkerCluster>>);

impl std::fmt::Debug for WorkerClusters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|w| &w.name))
            .finish()
    }
}

impl WorkerClusters {
    pub fn new(workers: Vec<WorkerCluster>) -> WorkerClusters {
        WorkerClusters(Arc::new(workers))
    }

    /// Clients of the worker clusters `workers` (name, kubeconfig file; the file's
    /// current context), each built as the operator's own client is (`identity`,
    /// `limits`: a budget of its own per worker) and fenced by `fence`, as every write
    /// of a reconcile is.
    pub async fn connect(
        workers: &[(String, PathBuf)],
        identity: &str,
        limits: Limits,
        metrics: Option<Metrics>,
        fence: Option<watch::Receiver<Ownership>>,
    ) -> anyhow::Result<WorkerClusters> {
        let mut clusters = Vec::new();
        for (name, path) in workers {
            let what = || {
                format!(
                    "MultiKueue worker cluster {name}: kubeconfig {}",
                    path.display()
                )
            };
            let kubeconfig = Kubeconfig::read_from(path).with_context(what)?;
            let config =
                kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                    .await
                    .with_context(what)?;
            let client =
                crate::client::build(config, identity, limits, metrics.clone(), fence.clone())
                    .with_context(what)?;
            clusters.push(WorkerCluster {
                name: name.clone(),
                client,
            });
        }
        Ok(WorkerClusters::new(clusters))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &WorkerCluster> {
        self.0.iter()
    }

    /// The client of worker `name`.
    pub fn client(&self, name: &str) -> Option<&Client> {
        self.0.iter().find(|w| w.name == name).map(|w| &w.client)
    }
}

/// A Job on a worker cluster, as its metadata says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Copy {
    pub name: String,
    pub uid: String,
    pub deleting: bool,
}

/// The pods `pods` read on worker `cluster`, where MultiKueue's copies of the GpuJob's
/// Jobs are `copies`, as the gate must see them: on that cluster, and a pod of the live
/// copy of a dispatched Job (`dispatched`: its name and uid on this cluster) as that
/// Job's pod. A pod of any other Job keeps its Job's uid: the gate counts it as another
/// Job's pod, which holds the attempt until it is gone.
pub fn as_managed(
    pods: Vec<SeenPod>,
    cluster: &str,
    copies: &[Copy],
    dispatched: &[(String, String)],
) -> Vec<SeenPod> {
    pods.into_iter()
        .map(|mut pod| {
            pod.cluster = Some(cluster.to_owned());
            let live = copies
                .iter()
                .find(|c| !c.deleting && pod.job_uid.as_deref() == Some(c.uid.as_str()));
            if let Some((_, uid)) =
                live.and_then(|c| dispatched.iter().find(|(name, _)| *name == c.name))
            {
                pod.job_uid = Some(uid.clone());
            }
            pod
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, job_uid: &str) -> SeenPod {
        SeenPod {
            name: name.into(),
            job: Some("train-1".into()),
            job_uid: Some(job_uid.into()),
            ..SeenPod::default()
        }
    }

    fn copy(uid: &str, deleting: bool) -> Copy {
        Copy {
            name: "train-1".into(),
            uid: uid.into(),
            deleting,
        }
    }

    #[test]
    fn only_a_pod_of_the_live_copy_of_a_dispatched_job_counts_as_that_jobs() {
        let dispatched = [("train-1".to_owned(), "job-here".to_owned())];
        let pods = vec![pod("live", "copy-2"), pod("older", "copy-1")];
        // The first copy is being deleted; the second is live.
        let copies = [copy("copy-1", true), copy("copy-2", false)];
        let seen = as_managed(pods.clone(), "worker", &copies, &dispatched);
        let uids: Vec<_> = seen.iter().map(|p| p.job_uid.as_deref()).collect();
        assert_eq!(uids, vec![Some("job-here"), Some("copy-1")]);
        assert!(seen.iter().all(|p| p.cluster.as_deref() == Some("worker")));
        // The copy gone from the list (deleted): its pods are nobody's here.
        let seen = as_managed(pods.clone(), "worker", &[copy("copy-2", false)], &[]);
        assert_eq!(seen[0].job_uid.as_deref(), Some("copy-2"), "not dispatched");
        // A live copy whose name no dispatched Job here has: not ours to let go.
        let other = [("train-2".to_owned(), "job-2".to_owned())];
        let seen = as_managed(pods, "worker", &copies, &other);
        assert_eq!(seen[0].job_uid.as_deref(), Some("copy-2"));
    }
}
