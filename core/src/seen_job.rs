//! A Job as the plan sees it: exactly the fields a plan reads, whichever way the Job came
//! (a cache, a GET past a lagging cache, a create's answer). A cache keeps only these, so
//! a plan that read a field outside them would see it from one source and not from
//! another; here it cannot read it at all.

use k8s_openapi::api::batch::v1::{Job, JobCondition};
use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};

use crate::api::{
    ANNOTATION_FAILURE_RULES, Devices, LABEL_ATTEMPT, LABEL_KUEUE_QUEUE, LABEL_NAME, LABEL_UID,
    Topology,
};
use crate::job::{
    MANAGED_BY, attempt_of, controller_of, devices, gated, generation_of, gpus, name_label,
    pod_group, suspended, topology,
};

/// A Job controlled by a GpuJob (its controller owner reference, not its labels).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SeenJob {
    pub name: String,
    pub namespace: String,
    /// The controlling GpuJob's name and uid.
    pub owner: String,
    pub owner_uid: String,
    /// Preconditions of a start or delete.
    pub uid: Option<String>,
    pub resource_version: Option<String>,
    pub deletion_timestamp: Option<Time>,
    /// `spec.suspend: true`: waiting for Kueue to admit it (or evicted by Kueue), or made
    /// by an earlier version, which created every Job suspended.
    pub suspended: bool,
    /// Its pod template carries the operator's scheduling gate, so its pods are created
    /// gated (every Job this version builds; one an earlier version made does not).
    pub gated: bool,
    /// The GPUs its pods ask for together (per-pod limit × pods).
    pub gpus: Option<i32>,
    /// The attempt it runs (`gpujob.dev/attempt`, from 1); `None` when the label is
    /// missing or not a number.
    pub attempt: Option<i32>,
    /// The GpuJob generation it was built from (`gpujob.dev/generation`).
    pub generation: Option<i64>,
    /// What its failure rules mean (`gpujob.dev/failure-rules`), when the GpuJob had
    /// rules of its own.
    pub failure_rules: Option<String>,
    /// Pods per attempt when more than one (an Indexed Job's completions: a multi-node
    /// attempt, whose pods find each other through a headless Service).
    pub nodes: Option<i32>,
    /// The Kueue LocalQueue it is in (`kueue.x-k8s.io/queue-name`): set when it was created
    /// for a GpuJob with `spec.queueName`, or by Kueue's LocalQueue defaulting; Kueue
    /// unsuspends it on admission (and suspends it again should it evict it).
    pub queue: Option<String>,
    /// The devices its pods get by DRA (`gpujob.dev/devices`): its ResourceClaimTemplate
    /// (`crate::claims`) asks for them.
    pub devices: Option<Devices>,
    /// The PodGroup its pods are in (`spec.schedulingGroup`): a multi-node attempt's
    /// gang, made by the plan before any of its pods is let go (`crate::gang`).
    pub pod_group: Option<String>,
    /// Where its pods are kept together (`gpujob.dev/topology`).
    pub topology: Option<Topology>,
    /// The controller that makes its pods when not the Job controller (`spec.managedBy`:
    /// Kueue's MultiKueue, which runs it on another cluster).
    pub managed_by: Option<String>,
    pub status: SeenJobStatus,
}

/// What a plan reads of a Job's status: the conditions and completion time (finished?),
/// the pod counts and start (do its pods wait for a node? may some still run?).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SeenJobStatus {
    pub conditions: Vec<JobCondition>,
    pub completion_time: Option<Time>,
    pub active: Option<i32>,
    /// `None` where the API server does not count ready pods (before Kubernetes 1.24).
    pub ready: Option<i32>,
    pub start_time: Option<Time>,
    /// Only when some are (zero is what nearly every Job says).
    pub terminating: Option<i32>,
}

/// `spec.managedBy` of a Job Kueue's MultiKueue dispatches to a worker cluster: a copy
/// of it runs there, and its status comes back here.
pub const MULTIKUEUE: &str = "kueue.x-k8s.io/multikueue";

/// `spec.managedBy` of a Job the Job controller runs (the default).
const JOB_CONTROLLER: &str = "kubernetes.io/job-controller";

impl SeenJob {
    /// Whether Kueue's MultiKueue runs it on a worker cluster ([`MULTIKUEUE`]).
    pub fn dispatched(&self) -> bool {
        self.managed_by.as_deref() == Some(MULTIKUEUE)
    }

    /// The metadata of an object of this Job's attempt (its Service, its PodGroup): named
    /// like the Job, in its namespace, labelled as the attempt's pods are (GpuJob name
    /// and uid, attempt, managed-by), with the Job as its controller owner, so the garbage
    /// collector deletes it with the Job. `None` without a uid or an attempt.
    pub fn attempt_object_meta(&self) -> Option<ObjectMeta> {
        let uid = self.uid.clone()?;
        let labels = BTreeMap::from([
            (LABEL_NAME.to_owned(), name_label(&self.owner)),
            (LABEL_UID.to_owned(), self.owner_uid.clone()),
            (LABEL_ATTEMPT.to_owned(), self.attempt?.to_string()),
            (MANAGED_BY.0.to_owned(), MANAGED_BY.1.to_owned()),
        ]);
        Some(ObjectMeta {
            name: Some(self.name.clone()),
            namespace: Some(self.namespace.clone()),
            labels: Some(labels),
            owner_references: Some(vec![OwnerReference {
                api_version: "batch/v1".to_owned(),
                kind: "Job".to_owned(),
                name: self.name.clone(),
                uid,
                controller: Some(true),
                // Blocking the Job's deletion would need update rights on jobs/finalizers.
                block_owner_deletion: None,
            }]),
            ..ObjectMeta::default()
        })
    }

    /// `None` for a Job without a name or namespace, or not controlled by a GpuJob.
    pub fn of(job: &Job) -> Option<SeenJob> {
        let m = &job.metadata;
        let owner = controller_of(job)?;
        let status = job.status.as_ref();
        Some(SeenJob {
            name: m.name.clone()?,
            namespace: m.namespace.clone()?,
            owner: owner.name.clone(),
            owner_uid: owner.uid.clone(),
            uid: m.uid.clone(),
            resource_version: m.resource_version.clone(),
            deletion_timestamp: m.deletion_timestamp.clone(),
            suspended: suspended(job),
            gated: gated(job),
            gpus: gpus(job),
            attempt: attempt_of(job),
            generation: generation_of(job),
            failure_rules: m
                .annotations
                .as_ref()
                .and_then(|a| a.get(ANNOTATION_FAILURE_RULES))
                .cloned(),
            nodes: job
                .spec
                .as_ref()
                .filter(|s| s.completion_mode.as_deref() == Some("Indexed"))
                .and_then(|s| s.completions)
                .filter(|n| *n > 1),
            queue: m
                .labels
                .as_ref()
                .and_then(|l| l.get(LABEL_KUEUE_QUEUE))
                .cloned(),
            devices: devices(job),
            pod_group: pod_group(job),
            topology: topology(job),
            managed_by: job
                .spec
                .as_ref()
                .and_then(|s| s.managed_by.clone())
                .filter(|m| m != JOB_CONTROLLER),
            status: SeenJobStatus {
                conditions: status
                    .and_then(|s| s.conditions.clone())
                    .unwrap_or_default(),
                completion_time: status.and_then(|s| s.completion_time.clone()),
                active: status.and_then(|s| s.active),
                ready: status.and_then(|s| s.ready),
                start_time: status.and_then(|s| s.start_time.clone()),
                terminating: status.and_then(|s| s.terminating).filter(|n| *n > 0),
            },
        })
    }

    /// In a Kueue LocalQueue and not admitted (or evicted since): suspended, with a queue.
    pub fn queued(&self) -> bool {
        self.suspended && self.queue.is_some()
    }

    pub fn deleting(&self) -> bool {
        self.deletion_timestamp.is_some()
    }

    pub fn is_controlled_by(&self, uid: &str) -> bool {
        self.owner_uid == uid
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::GpuJob;
    use crate::api::LABEL_ATTEMPT;
    use crate::job::desired_job;
    use k8s_openapi::api::batch::v1::JobStatus;

    fn gpujob() -> GpuJob {
        let mut g = crate::job::tests::gpujob("train");
        g.metadata.generation = Some(4);
        g
    }

    #[test]
    fn a_desired_job_is_seen_with_its_attempt_generation_and_owner() {
        let mut job = desired_job(&gpujob(), 2);
        job.status = Some(JobStatus {
            active: Some(1),
            ready: Some(0),
            ..JobStatus::default()
        });
        let seen = SeenJob::of(&job).expect("controlled by a GpuJob");
        assert_eq!(seen.name, "train-2");
        assert_eq!(seen.namespace, "team-a");
        assert_eq!(
            (seen.owner.as_str(), seen.owner_uid.as_str()),
            ("train", "uid-1")
        );
        assert_eq!(seen.attempt, Some(2));
        assert_eq!(seen.generation, Some(4));
        assert!(
            !seen.suspended && seen.gated,
            "created running, its pods gated"
        );
        assert_eq!(seen.gpus, Some(gpujob().spec.total_gpus()));
        assert!(seen.is_controlled_by("uid-1") && !seen.is_controlled_by("uid-2"));
        assert_eq!((seen.status.active, seen.status.ready), (Some(1), Some(0)));
    }

    #[test]
    fn a_job_without_a_gpujob_controller_or_a_name_is_not_seen() {
        let mut foreign = desired_job(&gpujob(), 1);
        foreign.metadata.owner_references = None;
        assert_eq!(SeenJob::of(&foreign), None);
        let mut nameless = desired_job(&gpujob(), 1);
        nameless.metadata.name = None;
        assert_eq!(SeenJob::of(&nameless), None);
    }

    #[test]
    fn a_bad_attempt_label_is_no_attempt() {
        let mut job = desired_job(&gpujob(), 1);
        for bad in ["0", "-1", "x"] {
            job.metadata
                .labels
                .get_or_insert_default()
                .insert(LABEL_ATTEMPT.into(), bad.into());
            assert_eq!(SeenJob::of(&job).and_then(|s| s.attempt), None, "{bad}");
        }
    }
}
