//! API errors in one line for the person on call.

/// One line for a person on call: the API server's code, message and reason (kube's own
/// rendering adds a debug dump of the whole `Status`), or the error and its causes.
pub fn describe(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => status_line(s),
        other => error_chain(other),
    }
}

/// `e: cause: cause ...`, each distinct message once (hyper's errors say only "client
/// error (Connect)"; the cause is in the chain).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = cause.source();
    }
    out
}

fn status_line(s: &kube::core::Status) -> String {
    let reason = &s.reason;
    match (s.message.is_empty(), s.code) {
        (true, 0) => reason.clone(),
        (true, code) => format!("{code} {reason}"),
        (false, 0) => format!("{} ({reason})", s.message),
        (false, code) => format!("{code} {} ({reason})", s.message),
    }
}

/// [`describe`] for a watch's error.
pub fn describe_watch(e: &kube::runtime::watcher::Error) -> String {
    use kube::runtime::watcher::Error as W;
    match e {
        W::InitialListFailed(e) => format!("listing failed: {}", describe(e)),
        W::WatchStartFailed(e) => format!("starting the watch failed: {}", describe(e)),
        W::WatchError(s) => format!("the API server ended the watch: {}", status_line(s)),
        W::WatchFailed(e) => format!("the watch broke: {}", describe(e)),
        W::NoResourceVersion => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_errors_read_as_one_line_without_a_debug_dump() {
        let status: kube::core::Status = serde_json::from_value(serde_json::json!({
            "status": "Failure", "code": 404, "reason": "NotFound",
            "message": "namespaces \"gpujob-system\" not found",
            "details": {"name": "gpujob-system", "kind": "namespaces"},
        }))
        .unwrap_or_default();
        let line = describe(&kube::Error::Api(Box::new(status)));
        assert_eq!(
            line,
            "404 namespaces \"gpujob-system\" not found (NotFound)"
        );
    }
}
