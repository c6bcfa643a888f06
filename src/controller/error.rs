use std::time::Duration;

/// Every label [`Error::metric_label`] can return; metrics are created with these at zero.
pub const ERROR_LABELS: [&str; 15] = [
    "read_gpujob",
    "read_job",
    "read_pods",
    "create_job",
    "start_job",
    "delete_job",
    "patch_status",
    "conflict",
    "serialize",
    "not_leader",
    "quota",
    "patch_finalizers",
    "undecided",
    "delete_gpujob",
    "unconditioned",
];

/// Why a reconcile did not finish. Each variant has a stable short label for metrics and
/// Events. Everything here is retried with per-key backoff, except `NotLeader` (the key
/// looks again after a second: by then its shard's term was renewed, or the shard is
/// gone and the key comes back with it); invalid specs are not errors (they become a
/// condition and wait for a spec change).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `action` is one of [`ERROR_LABELS`].
    #[error("{} failed: {}", describe(action), crate::apierror::describe(source))]
    Kube {
        action: &'static str,
        #[source]
        source: kube::Error,
    },
    #[error("{what} changed since it was read (409 Conflict); re-reading and retrying")]
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
    #[error("not leader (lease lost or past its renew deadline); the write was not sent")]
    NotLeader,
    #[error("{0}")]
    Quota(#[from] crate::quota::QuotaError),
    /// The plan kept asking after as many answers as any GpuJob can need: a defect in
    /// planning, stopped rather than looped.
    #[error("no decision after {plans} plans (a planning defect); retrying with backoff")]
    Undecided { plans: usize },
}

fn describe(action: &str) -> &'static str {
    match action {
        "read_gpujob" => "reading the GpuJob before calling the quota service",
        "read_job" => "reading the attempt's Job",
        "read_pods" => "reading the failed attempt's pod",
        "create_job" => "creating the attempt's Job",
        "start_job" => "starting the attempt's Job (created suspended)",
        "delete_job" => "deleting an attempt's Job",
        "delete_gpujob" => "deleting the finished GpuJob (its time to live is over)",
        "patch_status" => "patching the GpuJob status",
        "patch_finalizers" => "patching the GpuJob finalizers",
        _ => "an API call",
    }
}

impl Error {
    pub fn kube(action: &'static str) -> impl FnOnce(kube::Error) -> Error {
        move |source| Error::Kube { action, source }
    }

    /// Stable label for metrics and Events.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube { action, .. } => action,
            Error::Conflict { .. } => "conflict",
            Error::Serialize { .. } => "serialize",
            Error::Unconditioned { .. } => "unconditioned",
            Error::NotLeader => "not_leader",
            Error::Quota(_) => "quota",
            Error::Undecided { .. } => "undecided",
        }
    }

    /// A conflict is expected under concurrency and resolves as soon as the cache
    /// catches up: retry soon, without growing the backoff.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Error::Conflict { .. } => Some(Duration::from_millis(200)),
            _ => None,
        }
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
    fn every_label_is_listed_and_described() {
        for label in [
            "read_job",
            "read_pods",
            "create_job",
            "start_job",
            "delete_job",
            "patch_status",
            "patch_finalizers",
        ] {
            assert!(ERROR_LABELS.contains(&label));
            assert_ne!(describe(label), "an API call", "{label}");
        }
        assert!(ERROR_LABELS.contains(&Error::NotLeader.metric_label()));
        assert!(
            ERROR_LABELS.contains(
                &Error::Conflict {
                    what: String::new()
                }
                .metric_label()
            )
        );
    }
}
