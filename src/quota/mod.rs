//! External GPU quota: reserve before a GpuJob runs, release when it is done. Both calls
//! are idempotent and keyed by the GpuJob's UID, so a crash anywhere leads to a repeated
//! call, never a second reservation or a leak. The contract is in docs/quota-api.md.

mod http;

use std::future::Future;

pub use self::http::{FENCING_TOKEN_HEADER, HttpProvider, HttpSettings};

pub use gpujob_core::quota::ReserveRequest;

/// The fencing token of a GpuJob's quota call: `<uid>/<sequence>`, the sequence as
/// recorded in the GpuJob's `status.quotaCall` before the call (docs/quota-api.md).
/// Per GpuJob, never per Lease: a Lease can be deleted and recreated (an uninstall
/// deletes its namespace) and its `leaseTransitions` start again from 0, while a
/// GpuJob's status lives as long as any reservation of it can.
pub fn fencing_token(uid: &str, sequence: i64) -> String {
    format!("{uid}/{sequence}")
}

/// How a call is made: with the GpuJob's fencing token (a provider that honours it
/// refuses a token older than the newest it has seen for that reservation), ending,
/// answered or not, by the caller's lease deadline.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Call {
    /// [`fencing_token`]; `None`: no header.
    pub token: Option<String>,
    /// The caller's lease deadline; `None`: only the provider's own timeout applies.
    pub deadline: Option<tokio::time::Instant>,
}

/// The answer to a reserve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reserve {
    Granted {
        id: String,
        /// The GPUs the service says the reservation holds, when it says.
        gpus: Option<i32>,
    },
    /// Not enough quota now; ask again later.
    Refused { reason: String, message: String },
}

/// A call that did not get a usable answer; retried with backoff.
#[derive(Debug, thiserror::Error)]
pub enum QuotaError {
    #[error("quota service {op} {url}: {message}")]
    Transport {
        op: &'static str,
        url: String,
        message: String,
    },
    #[error("quota service {op} {url} answered {code}: {body}")]
    Status {
        op: &'static str,
        url: String,
        code: u16,
        body: String,
    },
    #[error("quota service {op} {url} timed out after {after:?}{}", if *.capped { " (the time left before this replica's lease deadline)" } else { "" })]
    Timeout {
        op: &'static str,
        url: String,
        after: std::time::Duration,
        /// Cut short by the lease deadline rather than `--quota-timeout`.
        capped: bool,
    },
    /// 412: the service has seen a newer fencing token for this reservation: a later
    /// call for the GpuJob (from another replica, or recorded since this one was
    /// decided). The GpuJob is read and decided again.
    #[error(
        "quota service {op} {url} refused the fencing token {token:?}: it has seen a later call for this GpuJob ({body})"
    )]
    Fenced {
        op: &'static str,
        url: String,
        token: String,
        body: String,
    },
    #[error("quota service configuration: {0}")]
    Config(String),
}

impl QuotaError {
    /// What status says of this error: the error without what changes from one call to
    /// the next (how long a timed-out call had, the service's answer body). A failure
    /// retried with backoff then writes status once, not on every retry: each status
    /// write's watch echo queues the GpuJob again at once, which would cut its backoff
    /// short. The whole error goes to the log and the reconcile's error.
    pub fn summary(&self) -> String {
        match self {
            QuotaError::Transport { .. } | QuotaError::Config(_) => self.to_string(),
            QuotaError::Status { op, url, code, .. } => {
                format!("quota service {op} {url} answered {code}")
            }
            QuotaError::Timeout { op, url, .. } => format!("quota service {op} {url} timed out"),
            QuotaError::Fenced { op, url, .. } => format!(
                "quota service {op} {url} refused the fencing token: it has seen a later call for this GpuJob"
            ),
        }
    }
}

/// Where GPU quota comes from.
pub trait QuotaProvider {
    /// Reserves quota for a GpuJob; repeated calls for one UID return the same
    /// reservation.
    fn reserve(
        &self,
        req: &ReserveRequest,
        call: &Call,
    ) -> impl Future<Output = Result<Reserve, QuotaError>> + Send;
    /// Releases a GpuJob's reservation; releasing an unknown one succeeds.
    fn release(
        &self,
        uid: &str,
        call: &Call,
    ) -> impl Future<Output = Result<(), QuotaError>> + Send;
}

/// The backends, chosen by `--quota-provider`.
#[derive(Debug, Clone)]
pub enum Provider {
    /// No external quota: nothing reserved, no finalizer.
    None,
    Http(HttpProvider),
}

impl Provider {
    pub fn enabled(&self) -> bool {
        !matches!(self, Provider::None)
    }
}

impl QuotaProvider for Provider {
    async fn reserve(&self, req: &ReserveRequest, call: &Call) -> Result<Reserve, QuotaError> {
        match self {
            Provider::None => Ok(Reserve::Granted {
                id: String::new(),
                gpus: None,
            }),
            Provider::Http(h) => h.reserve(req, call).await,
        }
    }

    async fn release(&self, uid: &str, call: &Call) -> Result<(), QuotaError> {
        match self {
            Provider::None => Ok(()),
            Provider::Http(h) => h.release(uid, call).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Two failures of one kind read the same in status, however long each call had or
    /// whatever body the service sent.
    #[test]
    fn a_summary_leaves_out_what_changes_from_call_to_call() {
        let timeout = |after, capped| QuotaError::Timeout {
            op: "release",
            url: "https://quota/v1/reservations/u".to_owned(),
            after: Duration::from_millis(after),
            capped,
        };
        assert_ne!(
            timeout(8_610, true).to_string(),
            timeout(9_120, true).to_string()
        );
        assert_eq!(
            timeout(8_610, true).summary(),
            timeout(9_120, false).summary()
        );
        assert_eq!(
            timeout(8_610, true).summary(),
            "quota service release https://quota/v1/reservations/u timed out"
        );
        let status = |body: &str| QuotaError::Status {
            op: "release",
            url: "https://quota/v1/reservations/u".to_owned(),
            code: 503,
            body: body.to_owned(),
        };
        assert_eq!(
            status("request 1 failed").summary(),
            status("request 2 failed").summary()
        );
        assert!(status("x").summary().ends_with("answered 503"));
    }
}
