//! `suspend`, `resume` and `rerun`: what the API documents (docs/day-2.md), as merge
//! patches, and what to say about them.

use gpujob_core::api::v2::GpuJob;
use gpujob_core::api::{ANNOTATION_RERUN, Phase};
use serde_json::{Value, json};

/// `spec.suspend` set to `suspend` (what `kubectl patch gj NAME --type merge -p
/// '{"spec":{"suspend":true}}'` sends).
pub fn suspend_patch(suspend: bool) -> Value {
    json!({"spec": {"suspend": suspend}})
}

/// The rerun request: annotation `gpujob.dev/rerun` set to a new value.
pub fn rerun_patch(token: &str) -> Value {
    json!({"metadata": {"annotations": {ANNOTATION_RERUN: token}}})
}

fn who(gj: &GpuJob) -> String {
    format!(
        "GpuJob {}/{}",
        gj.metadata.namespace.as_deref().unwrap_or_default(),
        gj.metadata.name.as_deref().unwrap_or_default()
    )
}

/// Whether a suspend (or resume) changes anything; when not, what to say instead.
pub fn suspend_needed(gj: &GpuJob, suspend: bool) -> Result<(), String> {
    if gj.spec.suspend == suspend {
        return Err(format!(
            "{} is already {} (spec.suspend: {suspend}); nothing changed",
            who(gj),
            if suspend {
                "suspended"
            } else {
                "not suspended"
            }
        ));
    }
    Ok(())
}

/// What a suspend or resume did, said of the GpuJob as the patch returned it.
pub fn suspend_done(gj: &GpuJob, suspend: bool) -> String {
    let status = gj.status.as_ref();
    if suspend {
        let running = status
            .and_then(|s| s.active_job.as_ref())
            .map(|job| {
                format!("; its running attempt (Job {job}) is stopped, not counted as a failure")
            })
            .unwrap_or_default();
        format!(
            "{} suspended (spec.suspend: true): no new attempt starts{running}",
            who(gj)
        )
    } else if let Some(phase) = status.and_then(|s| s.phase).filter(|p| p.is_final()) {
        format!(
            "{} resumed (spec.suspend: false); it has finished ({phase:?}), so no attempt \
             starts: `kubectl gpujob rerun` starts a new run",
            who(gj)
        )
    } else {
        format!(
            "{} resumed (spec.suspend: false): the next attempt starts, after what remains of \
             a retry backoff",
            who(gj)
        )
    }
}

/// Whether `token` is a new rerun request for `gj`.
pub fn rerun_needed(gj: &GpuJob, token: &str) -> Result<(), String> {
    let status = gj.status.as_ref();
    if status.and_then(|s| s.rerun_token.as_deref()) == Some(token) {
        return Err(format!(
            "{} already answered rerun request {token} (status.rerunToken); pass a new --token",
            who(gj)
        ));
    }
    Ok(())
}

/// What a rerun request did.
pub fn rerun_done(gj: &GpuJob, token: &str) -> String {
    let status = gj.status.as_ref();
    let phase = status.and_then(|s| s.phase);
    let run = status.and_then(|s| s.run).unwrap_or(1);
    let attempts = status.map_or(0, |s| s.attempts);
    let next = if phase.is_some_and(Phase::is_final) {
        format!(
            "run {} starts with attempt {} (retries counted from 0 again)",
            run + 1,
            attempts + 1
        )
    } else {
        format!(
            "it has not finished ({}): run {} starts once it has",
            phase.map_or("no phase yet".to_owned(), |p| format!("{p:?}")),
            run + 1
        )
    };
    format!(
        "{}: rerun requested ({ANNOTATION_RERUN}={token}); {next}",
        who(gj)
    )
}
