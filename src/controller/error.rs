use std::time::Duration;

/// Why a reconcile did not finish. Each variant has a stable short label for metrics and
/// Events. Everything here is retried with per-key backoff; invalid specs are not errors
/// (they become a condition and wait for a spec change).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{action} failed: {source}")]
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
