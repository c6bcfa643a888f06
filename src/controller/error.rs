/// The API call that failed, named in the error and counted by its label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiCall {
    /// The confirming read of the GpuJob (before a quota call or a Job create).
    ReadGpuJob,
    ReadJob,
    ReadPods,
    /// MultiKueue's copies of the GpuJob's Jobs on a worker cluster (their metadata).
    ReadJobCopies,
    /// The Kueue Workload of a queued attempt's Job (why Kueue holds it).
    ReadWorkload,
    /// The Node a pod of the GpuJob is being deleted on (whether it is lost).
    ReadNode,
    /// The running attempt's ResourceClaims (which alternative its pods got).
    ReadClaims,
    /// The ResourceClaimTemplate name the next attempt waits for (a foreign one held it).
    ReadClaimTemplate,
    CreateJob,
    /// A multi-node attempt's headless Service (its create, or the read after a 409).
    CreateService,
    /// The ResourceClaimTemplate of an attempt whose pods get GPUs by DRA (its create, or
    /// the read after a 409).
    CreateClaimTemplate,
    /// A multi-node attempt's PodGroup (its gang; the create, or the read after a 409).
    CreatePodGroup,
    /// The removal of the operator's scheduling gate from a pod of the current attempt.
    UngatePod,
    /// The delete of a pod that waits at the gate and is not the current attempt's.
    DeletePod,
    /// The gate added to a Job an earlier version created suspended.
    GateJob,
    DeleteJob,
    DeleteGpuJob,
    PatchStatus,
    PatchFinalizers,
}

impl ApiCall {
    pub const ALL: [ApiCall; 19] = [
        ApiCall::ReadGpuJob,
        ApiCall::ReadJob,
        ApiCall::ReadPods,
        ApiCall::ReadJobCopies,
        ApiCall::ReadWorkload,
        ApiCall::ReadNode,
        ApiCall::ReadClaims,
        ApiCall::ReadClaimTemplate,
        ApiCall::CreateJob,
        ApiCall::CreateService,
        ApiCall::CreateClaimTemplate,
        ApiCall::CreatePodGroup,
        ApiCall::UngatePod,
        ApiCall::DeletePod,
        ApiCall::GateJob,
        ApiCall::DeleteJob,
        ApiCall::DeleteGpuJob,
        ApiCall::PatchStatus,
        ApiCall::PatchFinalizers,
    ];

    /// The stable label of `gpujob_reconcile_errors_by_kind_total` and of logs.
    pub fn label(self) -> &'static str {
        match self {
            ApiCall::ReadGpuJob => "read_gpujob",
            ApiCall::ReadJob => "read_job",
            ApiCall::ReadPods => "read_pods",
            ApiCall::ReadJobCopies => "read_job_copies",
            ApiCall::ReadWorkload => "read_workload",
            ApiCall::ReadNode => "read_node",
            ApiCall::ReadClaims => "read_claims",
            ApiCall::ReadClaimTemplate => "read_claim_template",
            ApiCall::CreateJob => "create_job",
            ApiCall::CreateService => "create_service",
            ApiCall::CreateClaimTemplate => "create_claim_template",
            ApiCall::CreatePodGroup => "create_pod_group",
            ApiCall::UngatePod => "ungate_pod",
            ApiCall::DeletePod => "delete_pod",
            ApiCall::GateJob => "gate_job",
            ApiCall::DeleteJob => "delete_job",
            ApiCall::DeleteGpuJob => "delete_gpujob",
            ApiCall::PatchStatus => "patch_status",
            ApiCall::PatchFinalizers => "patch_finalizers",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            ApiCall::ReadGpuJob => "reading the GpuJob from the API server (a confirming read)",
            ApiCall::ReadJob => "reading an attempt's Job",
            ApiCall::ReadPods => "reading the GpuJob's pods",
            ApiCall::ReadJobCopies => "reading MultiKueue's copies of the GpuJob's Jobs",
            ApiCall::ReadWorkload => "reading the queued attempt's Kueue Workload",
            ApiCall::ReadNode => "reading the Node an old attempt's pod is being deleted on",
            ApiCall::ReadClaims => "reading the running attempt's ResourceClaims",
            ApiCall::ReadClaimTemplate => {
                "reading the ResourceClaimTemplate name the next attempt waits for"
            }
            ApiCall::CreateJob => "creating the attempt's Job",
            ApiCall::CreateService => "creating the multi-node attempt's headless Service",
            ApiCall::CreateClaimTemplate => "creating the attempt's ResourceClaimTemplate",
            ApiCall::CreatePodGroup => "creating the multi-node attempt's PodGroup (its gang)",
            ApiCall::UngatePod => {
                "letting the current attempt's pod go (removing the scheduling gate)"
            }
            ApiCall::DeletePod => {
                "deleting a pod that waits at the gate and is not the current attempt's"
            }
            ApiCall::GateJob => "adding the scheduling gate to a Job an earlier version created",
            ApiCall::DeleteJob => "deleting an attempt's Job",
            ApiCall::DeleteGpuJob => "deleting the finished GpuJob (its time to live is over)",
            ApiCall::PatchStatus => "patching the GpuJob status",
            ApiCall::PatchFinalizers => "patching the GpuJob finalizers",
        }
    }
}

/// Every label [`Error::metric_label`] can return besides the [`ApiCall`] ones; metrics
/// are created with all of them at zero ([`error_labels`]).
const OTHER_LABELS: [&str; 7] = [
    "conflict",
    "serialize",
    "unconditioned",
    "not_leader",
    "quota",
    "undecided",
    "unknown_cluster",
];

/// Every label [`Error::metric_label`] can return.
pub fn error_labels() -> impl Iterator<Item = &'static str> {
    ApiCall::ALL
        .iter()
        .map(|c| c.label())
        .chain(OTHER_LABELS.iter().copied())
}

/// Why a reconcile did not finish. Each variant has a stable short label for metrics and
/// logs. Everything here is retried with per-key backoff, except `NotLeader` (the key
/// looks again after a second: by then its shard's term was renewed, or the shard is
/// gone and the key comes back with it); invalid specs are not errors (they become a
/// condition and wait for a spec change).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{} failed: {}", call.describe(), crate::apierror::describe(source))]
    Kube {
        call: ApiCall,
        #[source]
        source: kube::Error,
    },
    #[error(
        "{what} changed since it was read (409 Conflict); deciding again from its current version, with backoff"
    )]
    Conflict { what: String },
    #[error("serialising {what}: {source}")]
    Serialize {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    /// The view of an object has no resourceVersion, so a write computed from it could
    /// not carry one: never sent (a late write without a precondition could overwrite
    /// a newer holder's); the object is read again.
    #[error(
        "{what} has no resourceVersion in this replica's view; the write was not sent, re-reading"
    )]
    Unconditioned { what: String },
    #[error(
        "not leader (lease lost or past its renew deadline); the call (a write, or a read a plan asked for) was not sent"
    )]
    NotLeader,
    #[error("{0}")]
    Quota(#[from] crate::quota::QuotaError),
    /// The plan kept asking after as many answers as any GpuJob can need: a defect in
    /// planning, stopped rather than looped.
    #[error("no decision after {plans} plans (a planning defect); retrying with backoff")]
    Undecided { plans: usize },
    /// A pod write for a worker cluster the operator was not given: a defect (the pod
    /// came from a read of that cluster).
    #[error(
        "no MultiKueue worker cluster named {name} was given (--multikueue-worker); the pod write was not sent; retrying with backoff"
    )]
    UnknownCluster { name: String },
    /// A call to a MultiKueue worker cluster failed: which one, and the failure. Until it
    /// answers, no pod of a dispatched attempt of the GpuJob is let go (the gate needs
    /// a read of every worker).
    #[error("on MultiKueue worker cluster {worker}: {source}")]
    OnWorker {
        worker: String,
        #[source]
        source: Box<Error>,
    },
}

impl Error {
    pub fn kube(call: ApiCall) -> impl FnOnce(kube::Error) -> Error {
        move |source| Error::Kube { call, source }
    }

    /// Stable label for metrics and logs.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube { call, .. } => call.label(),
            Error::Conflict { .. } => "conflict",
            Error::Serialize { .. } => "serialize",
            Error::Unconditioned { .. } => "unconditioned",
            Error::NotLeader => "not_leader",
            Error::Quota(_) => "quota",
            Error::Undecided { .. } => "undecided",
            Error::UnknownCluster { .. } => "unknown_cluster",
            Error::OnWorker { source, .. } => source.metric_label(),
        }
    }

    /// Names worker cluster `worker` (when the call went there) in an API call's error.
    pub fn on_worker(worker: Option<&str>) -> impl FnOnce(Error) -> Error {
        move |e| match (worker, e) {
            (Some(worker), e @ Error::Kube { .. }) => Error::OnWorker {
                worker: worker.to_owned(),
                source: Box::new(e),
            },
            (_, e) => e,
        }
    }

    /// Expected under concurrency: someone else changed the object. The run that met it
    /// on a write of the GpuJob read the GpuJob again (a Job or pod is read by the next
    /// plan), so the retry decides from the current version; the retries back off per
    /// GpuJob all the same (logged as information, not as a failure), as a writer that
    /// keeps changing it would otherwise be answered by a loop.
    pub fn is_conflict(&self) -> bool {
        matches!(self, Error::Conflict { .. })
    }
}

/// The HTTP status code of an API error, if it is one.
pub fn api_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_label_is_listed_once() {
        let labels: Vec<&str> = error_labels().collect();
        let mut unique = labels.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), labels.len(), "{labels:?}");
        let errors = [
            Error::NotLeader,
            Error::Conflict {
                what: String::new(),
            },
            Error::Unconditioned {
                what: String::new(),
            },
            Error::Undecided { plans: 1 },
            Error::UnknownCluster {
                name: String::new(),
            },
        ];
        for e in &errors {
            assert!(labels.contains(&e.metric_label()), "{}", e.metric_label());
        }
    }
}
