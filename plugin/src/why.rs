//! `kubectl gpujob why NAME`: one paragraph saying what the GpuJob waits for now, from
//! its status (phase, the Ready condition's reason and message, the conditions beside
//! it), its pods and its latest Warning Event.

use gpujob_core::api::{ANNOTATION_RERUN, ConditionStatus, FINALIZER_QUOTA, Phase};
use gpujob_core::plan::{
    INVALID_SPEC, JOB_NAME_CONFLICT, OLD_ATTEMPT_STOPPING, SPEC_CHANGE_PENDING,
};
use gpujob_core::seen_pod::SeenPod;
use gpujob_core::status::{
    ADMITTED, BACKING_OFF, CLAIM_TEMPLATE_NAME_CONFLICT, CLEANUP_STUCK, DISPATCHING, JOB_RUNNING,
    MANAGED_ELSEWHERE, POD_GROUP_NAME_CONFLICT, QUEUED, QUOTA_PENDING, QUOTA_REFUSED,
    QUOTA_RESERVED, READY, REPLACING, RERUN, SERVICE_NAME_CONFLICT, SUSPENDED, UNSCHEDULABLE,
    WAITING_FOR_LOST_NODE,
};
use jiff::Timestamp;

use crate::snapshot::{Snapshot, age, pod_attempt, pod_gated, pod_name, pod_node, pod_phase, time};

/// The paragraph, wrapped at `width` columns.
pub fn paragraph(s: &Snapshot, now: Timestamp, width: usize) -> String {
    wrap(&sentences(s, now).join(" "), width)
}

/// What the paragraph says, sentence by sentence.
pub fn sentences(s: &Snapshot, now: Timestamp) -> Vec<String> {
    let name = format!("GpuJob {}/{}", s.namespace(), s.name());
    let gj = &s.gpujob;
    let Some(status) = gj.status.as_ref().filter(|st| st.phase.is_some()) else {
        return vec![format!(
            "{name} has no status yet: it waits for an operator replica to look at it (is the \
             operator running, and does a replica hold the shard of namespace {}?).",
            s.namespace()
        )];
    };
    let mut out = Vec::new();
    let phase = status
        .phase
        .map_or("Unknown".to_owned(), |p| format!("{p:?}"));
    let run = status.run.unwrap_or(1);
    let attempt = if status.attempts > 0 {
        format!(
            ", attempt {}{}",
            status.attempts,
            if run > 1 {
                format!(" (run {run})")
            } else {
                String::new()
            }
        )
    } else {
        ", no attempt started yet".to_owned()
    };
    out.push(format!("{name} is {phase}{attempt}."));
    if let (Some(g), Some(o)) = (gj.metadata.generation, status.observed_generation)
        && g > o
    {
        out.push(format!(
            "The operator has not processed its latest spec yet (generation {g}; it has seen {o})."
        ));
    }
    if gj.metadata.deletion_timestamp.is_some() {
        let quota = gj
            .metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == FINALIZER_QUOTA);
        out.push(if quota {
            format!(
                "It is being deleted and waits for its GPU quota reservation to be released \
                 (finalizer {FINALIZER_QUOTA}); once no pod of it can run, the operator \
                 releases it."
            )
        } else {
            "It is being deleted.".to_owned()
        });
    }
    let ready = status.condition(READY);
    let reason = ready.map_or("", |c| c.reason.as_str());
    let message = ready.map_or("", |c| c.message.as_str());
    let said = |m: &str| {
        if m.is_empty() {
            String::new()
        } else {
            format!(": {}", m.trim_end_matches('.'))
        }
    };
    let current = status.attempts;
    match (status.phase, reason) {
        (Some(Phase::Succeeded), _) => {
            out.push(format!(
                "It succeeded{}; it waits for nothing.",
                status
                    .completion_time
                    .map(|t| format!(" at {}", time(Some(t))))
                    .unwrap_or_default()
            ));
        }
        (Some(Phase::Failed), _) => {
            out.push(format!(
                "It failed ({reason}{}); it waits for nothing, and `kubectl gpujob rerun {}` \
                 starts a new run.",
                said(message),
                s.name()
            ));
        }
        (Some(Phase::Suspended), _) | (_, SUSPENDED) => {
            let since = status
                .condition(SUSPENDED)
                .filter(|c| c.status == ConditionStatus::True)
                .map(|c| format!(" since {}", time(Some(c.last_transition_time))))
                .unwrap_or_default();
            let stopping = status
                .replacing_attempt
                .map(|k| format!("; attempt {k} is being stopped (not counted as a failure)"))
                .unwrap_or_default();
            out.push(format!(
                "It waits to be resumed: spec.suspend is true{since}{stopping}; \
                 `kubectl gpujob resume {}` lets the next attempt start.",
                s.name()
            ));
        }
        (_, QUOTA_PENDING | QUOTA_REFUSED) => {
            let quota = status
                .condition(QUOTA_RESERVED)
                .map(|c| format!(" ({}{})", c.reason, said(&c.message)))
                .unwrap_or_default();
            out.push(format!(
                "It waits for GPU quota from the quota service{}{quota}.",
                said(message)
            ));
        }
        (_, QUEUED) => {
            let queue = gj.spec.queue_name.as_deref().map_or_else(
                || "its Kueue LocalQueue".to_owned(),
                |q| format!("Kueue LocalQueue {q}"),
            );
            let admitted = status
                .condition(ADMITTED)
                .map(|c| format!(" ({}{})", c.reason, said(&c.message)))
                .unwrap_or_default();
            out.push(format!(
                "It waits for Kueue admission: attempt {current} is queued in {queue}{admitted}."
            ));
        }
        (_, UNSCHEDULABLE) => {
            out.push(format!(
                "It waits for nodes: kube-scheduler finds no node for its pods{}; it runs once \
                 GPUs free up.",
                said(message)
            ));
        }
        (_, WAITING_FOR_LOST_NODE) => {
            out.push(format!(
                "It waits for a lost node{}. Only a person ends this wait: once the node is \
                 really down, mark it out of service \
                 (docs/runbooks.md#gpujobwaitingforlostnode).",
                said(message)
            ));
        }
        (_, OLD_ATTEMPT_STOPPING) => {
            let old = old_pods(s, current);
            out.push(format!(
                "It waits for an old attempt's pods to be gone before attempt {} may run{}{}.",
                current.max(1),
                said(message),
                if old.is_empty() {
                    String::new()
                } else {
                    format!("; still there: {}", old.join(", "))
                }
            ));
        }
        (
            _,
            JOB_NAME_CONFLICT
            | SERVICE_NAME_CONFLICT
            | CLAIM_TEMPLATE_NAME_CONFLICT
            | POD_GROUP_NAME_CONFLICT,
        ) => {
            out.push(format!(
                "It waits for a name conflict to end{}; the operator looks again every \
                 minute, and a person ends it by deleting or renaming that object.",
                said(message)
            ));
        }
        (_, BACKING_OFF) => {
            let next = status
                .next_attempt_time
                .map(|t| {
                    let wait = if t > now {
                        format!(" (in {})", age(now, t))
                    } else {
                        String::new()
                    };
                    format!(" until {}{wait}", time(Some(t)))
                })
                .unwrap_or_default();
            let last = status
                .last_failure
                .as_ref()
                .map(|f| format!(" after {}", f.message.trim_end_matches('.')))
                .unwrap_or_default();
            out.push(format!(
                "It waits for its retry backoff{next}{last}; then attempt {} starts.",
                current + 1
            ));
        }
        (_, DISPATCHING) => {
            out.push(format!(
                "It waits for its Job's copy on a MultiKueue worker cluster to run{}.",
                said(message)
            ));
        }
        (_, MANAGED_ELSEWHERE) => {
            // The operator's message names the controller and what to do.
            out.push(format!(
                "It does not run: its Job is managed elsewhere{}.",
                said(message)
            ));
        }
        (_, INVALID_SPEC) => {
            out.push(format!(
                "It waits for a spec change: its spec is invalid{}; nothing is retried until \
                 the spec changes.",
                said(message)
            ));
        }
        (_, REPLACING) => {
            out.push(format!(
                "It waits for the running attempt to stop after a spec change{}.",
                said(message)
            ));
        }
        (_, RERUN) => {
            out.push(format!("A new run is starting{}.", said(message)));
        }
        (_, JOB_RUNNING) => out.push(running(s, current)),
        (_, "") => out.push("It has no Ready condition yet.".to_owned()),
        (_, other) => out.push(format!(
            "Ready is {} ({other}{}).",
            ready.map_or("Unknown".to_owned(), |c| format!("{:?}", c.status)),
            said(message)
        )),
    }
    if let Some(c) = status
        .condition(SPEC_CHANGE_PENDING)
        .filter(|c| c.status == ConditionStatus::True)
    {
        out.push(format!(
            "A spec change waits for the next attempt ({}{}).",
            c.reason,
            said(&c.message)
        ));
    }
    if let Some(c) = status
        .condition(CLEANUP_STUCK)
        .filter(|c| c.status == ConditionStatus::True)
    {
        out.push(format!("Its cleanup is stuck{}.", said(&c.message)));
    }
    let token = gj
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_RERUN));
    if let Some(token) = token
        && status.rerun_token.as_ref() != Some(token)
    {
        out.push(format!(
            "A rerun is requested ({ANNOTATION_RERUN}={token}) and not answered yet: it starts \
             once the GpuJob has finished."
        ));
    }
    if let Some(e) = s.events.iter().rev().find(|e| e.type_ == "Warning") {
        let when = e
            .time
            .map(|t| format!(" ({} ago)", age(t, now)))
            .unwrap_or_default();
        out.push(format!(
            "Latest Warning Event{when}: {}: {}.",
            e.reason,
            e.note.trim_end_matches('.')
        ));
    }
    out
}

/// What a running GpuJob's current attempt looks like.
fn running(s: &Snapshot, current: i32) -> String {
    let pods = s.pods_of(current);
    let job = s
        .job(current)
        .and_then(|j| j.metadata.name.clone())
        .unwrap_or_else(|| gpujob_core::job::job_name(s.name(), current));
    if pods.is_empty() {
        return format!(
            "It waits for the Job controller to create the pods of attempt {current} (Job {job})."
        );
    }
    let gated: Vec<&str> = pods
        .iter()
        .filter(|p| pod_gated(p))
        .map(|p| pod_name(p))
        .collect();
    if !gated.is_empty() {
        return format!(
            "Attempt {current} (Job {job}) has pods waiting at the operator's scheduling gate \
             ({}): the operator lets them go once a read shows no other attempt's pod can run.",
            gated.join(", ")
        );
    }
    let mut nodes: Vec<&str> = pods.iter().filter_map(|p| pod_node(p)).collect();
    nodes.dedup();
    let all_running = pods.iter().all(|p| pod_phase(p) == "Running");
    if all_running {
        format!(
            "It waits for nothing: attempt {current} runs (Job {job}) on {}.",
            nodes.join(", ")
        )
    } else {
        let states: Vec<String> = pods
            .iter()
            .map(|p| format!("{} {}", pod_name(p), pod_phase(p)))
            .collect();
        format!(
            "Attempt {current} runs (Job {job}); its pods: {}.",
            states.join(", ")
        )
    }
}

/// Pods of attempts other than `current` that may still run: named with their attempt,
/// phase and node.
fn old_pods(s: &Snapshot, current: i32) -> Vec<String> {
    s.pods
        .iter()
        .filter(|p| pod_attempt(p) != Some(current))
        // What holds the gate, as the operator reads it: a pod deleted before it was
        // bound never runs, a finished one no more.
        .filter(|p| SeenPod::of(p).is_some_and(|seen| seen.may_run()))
        .map(|p| {
            let deleting = if p.metadata.deletion_timestamp.is_some() {
                ", being deleted"
            } else {
                ""
            };
            format!(
                "pod {} (attempt {}, {}{}{deleting})",
                pod_name(p),
                pod_attempt(p).map_or("?".to_owned(), |a| a.to_string()),
                pod_phase(p),
                pod_node(p)
                    .map(|n| format!(", on node {n}"))
                    .unwrap_or_default()
            )
        })
        .collect()
}

/// Words wrapped at `width` columns (a word longer than that stands alone).
pub fn wrap(text: &str, width: usize) -> String {
    let mut out = String::new();
    let mut line = 0;
    for word in text.split_whitespace() {
        let len = word.chars().count();
        if line > 0 && line + 1 + len > width {
            out.push('\n');
            line = 0;
        } else if line > 0 {
            out.push(' ');
            line += 1;
        }
        out.push_str(word);
        line += len;
    }
    out.push('\n');
    out
}
