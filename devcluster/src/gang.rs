//! Workload-aware ("gang") scheduling in the real kube-scheduler: what devcluster turns
//! on with [`crate::Options::gang`], from the Kubernetes v1.37 sources.
//!
//! - The API `scheduling.k8s.io/v1beta1` ([`API_VERSION`]): `Workload` (a set of
//!   `podGroupTemplates`, each with a `schedulingPolicy` of `basic: {}` or `gang:
//!   {minCount}`) and `PodGroup` (the runtime group kube-scheduler reads: `spec.
//!   schedulingPolicy`, optionally `spec.workloadRef: {workloadName, templateName}` and
//!   `spec.schedulingConstraints.topology: [{key}]`; `status.conditions`). Beta APIs are
//!   not served unless asked for, so kube-apiserver gets `--runtime-config`.
//! - A pod joins a group by `spec.schedulingGroup.podGroupName` (immutable; the group may
//!   be created after the pod).
//! - The feature gate `GenericWorkload` (beta, off by default in 1.37) on kube-apiserver
//!   (it stores Workloads and PodGroups only with it, keeps `spec.schedulingGroup` only
//!   with it, and its admission plugin `PodGroupProtection` puts a finalizer on every
//!   PodGroup), kube-scheduler (it adds the `GangScheduling` plugin to the default
//!   profile, and schedules a group's pods together in one pod-group cycle) and
//!   kube-controller-manager (its `podgroup-protection-controller` removes that
//!   finalizer once no pod of the group is left; devcluster adds it to the controllers).
//! - The feature gate `TopologyAwareWorkloadScheduling` (alpha since 1.36) for
//!   `schedulingConstraints` (without it kube-apiserver drops the field from a new
//!   Workload or PodGroup, silently: the group is then placed anywhere) and for
//!   kube-scheduler's `TopologyPlacementGenerator` and `PodGroupPodsCount` plugins: one
//!   placement per value of the key's node label, the group placed whole in one of them.
//! - Optionally the feature gate `WorkloadWithJob` (alpha since 1.36) on
//!   kube-apiserver (the Job field `spec.scheduling`) and kube-controller-manager: the
//!   Job controller then makes a Workload and a PodGroup for every new Job that has no
//!   controller owner and whose template names no group, and creates its pods in that
//!   group (`spec.scheduling.schedulingPolicy.gang` for all-or-nothing; `basic` when the
//!   Job says nothing).
//!
//! A gang whose pods do not all fit stays unscheduled, all of it: kube-scheduler marks
//! each pod `PodScheduled=False` (`Unschedulable`) and the PodGroup
//! `PodGroupInitiallyScheduled=False` (`Unschedulable`), and tries again on a cluster
//! event that could make room. A pod that passes the Permit stage without the rest of
//! its gang waits there at most 5 minutes (the plugin's fixed `permitTimeoutDuration`).

use crate::Error;

/// The first Kubernetes minor version with `scheduling.k8s.io/v1beta1` Workloads and
/// PodGroups and pods' `spec.schedulingGroup` (1.35 and 1.36 had an alpha API of another
/// shape; 1.33, the compatibility subset's release, none).
pub const SERVED_SINCE: u32 = 37;
/// The API version of Workload and PodGroup.
pub const API_VERSION: &str = "scheduling.k8s.io/v1beta1";
/// The controller that removes a PodGroup's protection finalizer.
pub const PROTECTION_CONTROLLER: &str = "podgroup-protection-controller";
/// The feature gates, each with what it turns on.
pub const GENERIC_WORKLOAD: &str = "GenericWorkload";
pub const TOPOLOGY_AWARE: &str = "TopologyAwareWorkloadScheduling";
pub const WORKLOAD_WITH_JOB: &str = "WorkloadWithJob";

/// What of workload-aware scheduling to turn on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GangScheduling {
    /// `TopologyAwareWorkloadScheduling`: a PodGroup may keep its pods in one domain of
    /// a node label (`spec.schedulingConstraints.topology`).
    pub topology: bool,
    /// `WorkloadWithJob`: the Job controller makes a Workload and a PodGroup for new
    /// Jobs that nothing controls. Off by default: it puts every such Job's pods in a
    /// group of their own.
    pub job_controller: bool,
}

impl Default for GangScheduling {
    /// Gangs with topology constraints; the Job controller left as it is.
    fn default() -> GangScheduling {
        GangScheduling {
            topology: true,
            job_controller: false,
        }
    }
}

impl GangScheduling {
    /// The feature gates to turn on, on kube-apiserver, kube-controller-manager and
    /// kube-scheduler alike.
    pub fn feature_gates(&self) -> Vec<&'static str> {
        let mut gates = vec![GENERIC_WORKLOAD];
        if self.topology {
            gates.push(TOPOLOGY_AWARE);
        }
        if self.job_controller {
            gates.push(WORKLOAD_WITH_JOB);
        }
        gates
    }

    /// kube-apiserver's `--runtime-config` value.
    pub fn runtime_config() -> String {
        format!("{API_VERSION}=true")
    }

    /// Refuses a Kubernetes minor version without the API (`None`, unknown: let the
    /// components judge).
    pub fn check(minor: Option<u32>) -> Result<(), Error> {
        match minor {
            Some(minor) if minor < SERVED_SINCE => Err(Error::invalid(
                "gang scheduling",
                format!(
                    "Kubernetes 1.{minor} has no {API_VERSION} Workload and PodGroup API, nor pods' spec.schedulingGroup (1.{SERVED_SINCE} and later do)"
                ),
            )),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gates_by_what_is_asked_for() {
        assert_eq!(
            GangScheduling::default().feature_gates(),
            ["GenericWorkload", "TopologyAwareWorkloadScheduling"]
        );
        let all = GangScheduling {
            topology: true,
            job_controller: true,
        };
        assert_eq!(
            all.feature_gates(),
            [
                "GenericWorkload",
                "TopologyAwareWorkloadScheduling",
                "WorkloadWithJob"
            ]
        );
        let bare = GangScheduling {
            topology: false,
            job_controller: false,
        };
        assert_eq!(bare.feature_gates(), ["GenericWorkload"]);
        assert_eq!(
            GangScheduling::runtime_config(),
            "scheduling.k8s.io/v1beta1=true"
        );
    }

    #[test]
    fn refused_before_1_37() {
        let err = GangScheduling::check(Some(33)).unwrap_err().to_string();
        assert!(err.contains("Kubernetes 1.33 has no"), "{err}");
        assert!(GangScheduling::check(Some(36)).is_err());
        assert!(GangScheduling::check(Some(37)).is_ok());
        assert!(GangScheduling::check(None).is_ok());
    }
}
