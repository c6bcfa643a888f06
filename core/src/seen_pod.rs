//! A pod of a GpuJob's attempt as the plan sees it: the few fields the gate at the pods
//! reads (`plan/gate.rs`), the same whether the pod came from the pod cache (which may
//! lag, and only tells the plan that a read is due) or from a read of the API server
//! (which alone lets a gate go).

use k8s_openapi::api::core::v1::{Pod, PodCondition};

use crate::api::{LABEL_ATTEMPT, LABEL_UID, SCHEDULING_GATE};

/// The pod's `PodScheduled` condition when the scheduler found no node for it (False,
/// reason `Unschedulable`); `None` when placed, not tried yet, or held at a scheduling
/// gate. The pod cache's flag and the placement read both take it from here.
pub fn not_placed(pod: &Pod) -> Option<&PodCondition> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "PodScheduled")
        .filter(|c| c.status == "False" && c.reason.as_deref() == Some("Unschedulable"))
}

/// A pod labelled with a GpuJob's uid (`gpujob.dev/uid`), as every attempt's pod is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SeenPod {
    pub name: String,
    pub namespace: String,
    /// The GpuJob's uid, from the pod's label (the label the pods are found by).
    pub owner_uid: String,
    /// Preconditions of the gate's removal.
    pub uid: Option<String>,
    pub resource_version: Option<String>,
    /// Its attempt label; `None` when missing or not a number.
    pub attempt: Option<i32>,
    /// The Job that controls it (its controller owner reference of kind Job): name and uid.
    pub job: Option<String>,
    pub job_uid: Option<String>,
    /// It carries the operator's scheduling gate: the scheduler does not place it.
    pub gated: bool,
    /// Bound to a node (`spec.nodeName`): it runs, or its kubelet may still run it.
    pub bound: bool,
    /// The scheduler found no node for it (`PodScheduled` False, reason
    /// `Unschedulable`): why is then read afresh (`Read::Placement`).
    pub unschedulable: bool,
    /// The node it is bound to (`spec.nodeName`): when it is being deleted there and
    /// that node is not Ready, only a person can end the wait (`plan/gate.rs`).
    pub node: Option<String>,
    /// Succeeded or Failed: nothing of it runs any more.
    pub terminal: bool,
    /// Being deleted (`metadata.deletionTimestamp`).
    pub deleting: bool,
    /// The worker cluster it is on, for an attempt Kueue's MultiKueue dispatched
    /// (`--multikueue-worker`); `None`: the operator's own cluster. A worker's pod has
    /// `job_uid` of the management cluster's Job when it belongs to the live copy of
    /// that Job there (the executor's read says so; the pod cache, by the Job's name
    /// alone); a pod of an older copy keeps its own Job's uid, so it counts as another
    /// Job's pod.
    pub cluster: Option<String>,
}

impl SeenPod {
    /// `None` for a pod without a name or namespace, or without the GpuJob uid label.
    pub fn of(pod: &Pod) -> Option<SeenPod> {
        let m = &pod.metadata;
        let labels = m.labels.as_ref()?;
        let owner_uid = labels.get(LABEL_UID)?.clone();
        let job = m
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true) && o.kind == "Job");
        let spec = pod.spec.as_ref();
        Some(SeenPod {
            name: m.name.clone()?,
            namespace: m.namespace.clone()?,
            owner_uid,
            uid: m.uid.clone(),
            resource_version: m.resource_version.clone(),
            attempt: labels
                .get(LABEL_ATTEMPT)
                .and_then(|a| a.parse().ok())
                .filter(|a| *a >= 1),
            job: job.map(|o| o.name.clone()),
            job_uid: job.map(|o| o.uid.clone()),
            gated: spec
                .and_then(|s| s.scheduling_gates.as_ref())
                .is_some_and(|g| g.iter().any(|g| g.name == SCHEDULING_GATE)),
            bound: spec.and_then(|s| s.node_name.as_ref()).is_some(),
            unschedulable: not_placed(pod).is_some(),
            node: spec.and_then(|s| s.node_name.clone()),
            terminal: matches!(
                pod.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Succeeded" | "Failed")
            ),
            deleting: m.deletion_timestamp.is_some(),
            cluster: None,
        })
    }

    /// Whether it runs, or may yet come to run: not finished, and bound to a node, or not
    /// being deleted. A pod being deleted before it was bound is never placed (the
    /// scheduler skips it and the API server refuses its binding); any other live pod
    /// may run: one still gated can be ungated by a removal that was in flight when its
    /// sender lost the shard (that removal carries the pod's resourceVersion, which its
    /// deletion changes, so a deleted pod stays put).
    pub fn may_run(&self) -> bool {
        !self.terminal && (self.bound || !self.deleting)
    }

    /// Whether it waits at the operator's gate and could be let go: gated, not deleted,
    /// not finished.
    pub fn waits_at_gate(&self) -> bool {
        self.gated && !self.deleting && !self.terminal
    }

    /// The node it is being deleted on while it may still run there: its kubelet has
    /// to confirm the stop, so the node's state decides how long that takes. `None` for
    /// a pod on a MultiKueue worker: the operator reads no Node there (a Node of that
    /// name here is another machine), so such a pod is only said to be stopping.
    pub fn stopping_on(&self) -> Option<&str> {
        (self.deleting && self.may_run() && self.cluster.is_none())
            .then_some(self.node.as_deref())
            .flatten()
    }

    /// Whether it belongs to the Job with uid `job_uid`.
    pub fn of_job(&self, job_uid: &str) -> bool {
        self.job_uid.as_deref() == Some(job_uid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodSchedulingGate, PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
    use std::collections::BTreeMap;

    fn pod() -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some("train-2-abcde".into());
        p.metadata.namespace = Some("team-a".into());
        p.metadata.uid = Some("pod-1".into());
        p.metadata.resource_version = Some("17".into());
        p.metadata.labels = Some(BTreeMap::from([
            (LABEL_UID.into(), "uid-1".into()),
            (LABEL_ATTEMPT.into(), "2".into()),
        ]));
        p.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "batch/v1".into(),
            kind: "Job".into(),
            name: "train-2".into(),
            uid: "job-2".into(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }]);
        p.spec = Some(PodSpec {
            scheduling_gates: Some(vec![
                PodSchedulingGate {
                    name: "example.com/other".into(),
                },
                PodSchedulingGate {
                    name: SCHEDULING_GATE.into(),
                },
            ]),
            ..PodSpec::default()
        });
        p
    }

    #[test]
    fn a_gated_pod_is_seen_with_its_attempt_job_and_gate() {
        let seen = SeenPod::of(&pod()).expect("labelled with its GpuJob's uid");
        assert_eq!(seen.owner_uid, "uid-1");
        assert_eq!(seen.attempt, Some(2));
        assert_eq!(
            (seen.job.as_deref(), seen.job_uid.as_deref()),
            (Some("train-2"), Some("job-2"))
        );
        assert!(seen.gated && !seen.bound && !seen.terminal && !seen.deleting);
        assert!(seen.waits_at_gate() && seen.may_run() && seen.of_job("job-2"));
    }

    #[test]
    fn which_pods_may_run() {
        let seen = |f: &dyn Fn(&mut Pod)| {
            let mut p = pod();
            f(&mut p);
            SeenPod::of(&p).unwrap()
        };
        let deleting = |p: &mut Pod| {
            p.metadata.deletion_timestamp = Some(Time("2026-12-05T00:00:00Z".parse().unwrap()));
        };
        let bound = |p: &mut Pod| {
            if let Some(s) = p.spec.as_mut() {
                s.scheduling_gates = None;
                s.node_name = Some("gpu-1".into());
            }
        };
        // Gated and being deleted: never placed.
        let p = seen(&deleting);
        assert!(!p.may_run() && !p.waits_at_gate());
        assert_eq!(p.stopping_on(), None);
        // Bound and being deleted: its kubelet may still run it.
        let p = seen(&|p| {
            bound(p);
            deleting(p);
        });
        assert!(p.may_run() && !p.gated);
        assert_eq!(p.stopping_on(), Some("gpu-1"));
        // The scheduler found no node for it; held at a scheduling gate is not that.
        let not_scheduled = |reason: &'static str| {
            move |p: &mut Pod| {
                p.status = Some(PodStatus {
                    conditions: Some(vec![k8s_openapi::api::core::v1::PodCondition {
                        type_: "PodScheduled".into(),
                        status: "False".into(),
                        reason: Some(reason.into()),
                        ..Default::default()
                    }]),
                    ..Default::default()
                });
            }
        };
        let p = seen(&not_scheduled("Unschedulable"));
        assert!(p.unschedulable && !p.bound);
        let p = seen(&not_scheduled("SchedulingGated"));
        assert!(!p.unschedulable);
        let p = seen(&|p| {
            bound(p);
            deleting(p);
        });
        // On a worker cluster: its Node is not this cluster's to read.
        let on_worker = SeenPod {
            cluster: Some("worker".into()),
            ..p.clone()
        };
        assert_eq!(on_worker.stopping_on(), None);
        // Finished: runs nothing, bound or not.
        let p = seen(&|p| {
            bound(p);
            p.status = Some(PodStatus {
                phase: Some("Failed".into()),
                ..PodStatus::default()
            });
        });
        assert!(!p.may_run());
        assert_eq!((p.node.as_deref(), p.stopping_on()), (Some("gpu-1"), None));
        // Ungated and not yet bound: the scheduler may place it any moment.
        let p = seen(&|p| {
            if let Some(s) = p.spec.as_mut() {
                s.scheduling_gates = None;
            }
        });
        assert!(p.may_run() && !p.gated && !p.waits_at_gate());
    }

    #[test]
    fn a_pod_without_the_gpujob_label_or_a_number_is_not_an_attempt() {
        let mut p = pod();
        p.metadata.labels = None;
        assert_eq!(SeenPod::of(&p), None);
        for bad in ["0", "x", "-3"] {
            let mut p = pod();
            if let Some(l) = p.metadata.labels.as_mut() {
                l.insert(LABEL_ATTEMPT.into(), bad.into());
            }
            assert_eq!(SeenPod::of(&p).and_then(|s| s.attempt), None, "{bad}");
        }
    }
}
