//! `kubectl gpujob attempts NAME`: one row per attempt, from its Job and pods while they
//! exist, else from what the GpuJob's status and Events recorded of it.

use gpujob_core::api::{ANNOTATION_FAILURE_RULES, FailureAction, LABEL_KUEUE_QUEUE, Phase};
use gpujob_core::failure_policy::{MatchedRule, matched_rule};
use gpujob_core::job::{gated, job_name, suspended};
use gpujob_core::plan::{JobState, job_state, termination_of};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;

use crate::snapshot::{Snapshot, pod_gated, pod_node, pod_phase, time};

/// One attempt, as the table shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub attempt: i32,
    pub job: String,
    pub phase: String,
    /// `exit 137 (OOMKilled)`, a reason (`DeadlineExceeded`), or `-`.
    pub outcome: String,
    pub nodes: String,
    pub started: String,
    pub ended: String,
    /// `yes`/`no` for a failed attempt (against `retryPolicy.maxRetries`), `-` otherwise.
    pub counted: String,
}

pub const HEADER: [&str; 8] = [
    "ATTEMPT",
    "JOB",
    "PHASE",
    "EXIT/REASON",
    "NODES",
    "STARTED",
    "ENDED",
    "COUNTED",
];

/// Every attempt, 1 to the last, oldest first.
pub fn rows(s: &Snapshot) -> Vec<Row> {
    (1..=s.last_attempt()).map(|k| row(s, k)).collect()
}

fn row(s: &Snapshot, k: i32) -> Row {
    let pods = s.pods_of(k);
    // Each node once, in name order: two pods of an attempt may share one.
    let mut nodes: Vec<&str> = pods.iter().filter_map(|p| pod_node(p)).collect();
    nodes.sort_unstable();
    nodes.dedup();
    let nodes = if nodes.is_empty() {
        "-".to_owned()
    } else {
        nodes.join(",")
    };
    let status = s.gpujob.status.as_ref();
    let recorded = status
        .and_then(|st| st.last_failure.as_ref())
        .filter(|f| f.attempt == k);
    let started_event = s
        .event_about("AttemptStarted", k)
        .and_then(|e| e.time)
        .map(|t| time(Some(t)));
    let mut row = Row {
        attempt: k,
        job: job_name(s.name(), k),
        phase: "Gone".to_owned(),
        outcome: "-".to_owned(),
        nodes,
        started: started_event.unwrap_or_else(|| "-".to_owned()),
        ended: "-".to_owned(),
        counted: "-".to_owned(),
    };
    if let Some(job) = s.job(k) {
        from_job(&mut row, job, &pods);
    } else if let Some(f) = recorded {
        row.phase = if f.reason == "Disrupted" {
            "Disrupted"
        } else {
            "Failed"
        }
        .to_owned();
        row.outcome = outcome(f.exit_code, &f.reason);
        row.ended = time(Some(f.time));
        row.counted = yes_no(f.counted);
    } else if let Some(e) = s
        .event_about("AttemptFailed", k)
        .or_else(|| s.event_about("AttemptDisrupted", k))
    {
        let counted = e.reason == "AttemptFailed";
        row.phase = if e.note.contains(" was disrupted") {
            "Disrupted"
        } else {
            "Failed"
        }
        .to_owned();
        row.outcome = exit_in_note(&e.note).unwrap_or_else(|| "-".to_owned());
        row.ended = time(e.time);
        row.counted = yes_no(counted);
    } else if status.and_then(|st| st.replacing_attempt) == Some(k)
        || s.events.iter().any(|e| {
            (e.reason == "SpecChangeApplied"
                && e.note.contains(&format!("attempt {k} is replaced")))
                || (e.reason == "Suspended" && e.note.contains(&format!("attempt {k} is stopped")))
        })
    {
        // Its Job is gone (a Job still being deleted is "Stopping", above).
        row.phase = "Stopped".to_owned();
        row.outcome = "replaced or suspended (not a failure)".to_owned();
        row.counted = "no".to_owned();
    } else if k == s.attempts() && s.phase() == Some(Phase::Succeeded) {
        row.phase = "Succeeded".to_owned();
        row.outcome = "exit 0".to_owned();
    } else {
        row.outcome = "Job deleted (older than --keep-jobs)".to_owned();
    }
    row
}

fn from_job(row: &mut Row, job: &Job, pods: &[&Pod]) {
    row.job = job.metadata.name.clone().unwrap_or_default();
    let st = job.status.as_ref();
    row.started = time(
        st.and_then(|s| s.start_time.as_ref())
            .or(job.metadata.creation_timestamp.as_ref())
            .map(|t| t.0),
    );
    // The failed pod's container first: in a multi-node attempt it is why the rest stopped.
    let mut ordered: Vec<Pod> = pods
        .iter()
        .filter(|p| pod_phase(p) == "Failed")
        .chain(pods.iter().filter(|p| pod_phase(p) != "Failed"))
        .map(|p| (*p).clone())
        .collect();
    ordered.dedup_by(|a, b| a.metadata.name == b.metadata.name);
    let termination = termination_of(row.attempt, &ordered);
    match job_state(job) {
        JobState::Complete { time: t } => {
            row.phase = "Succeeded".to_owned();
            row.outcome = outcome(termination.as_ref().and_then(|t| t.exit_code), "Completed");
            row.ended = time(t);
        }
        JobState::Failed {
            time: t,
            reason,
            message,
        } => {
            let rules = job
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ANNOTATION_FAILURE_RULES))
                .map(String::as_str);
            let matched = matched_rule(&reason, &message, rules);
            let (phase, counted) = match matched {
                Some(MatchedRule::Disruption) => ("Disrupted", false),
                Some(MatchedRule::Rule {
                    action: FailureAction::RetryWithoutCounting,
                    ..
                }) => ("Failed", false),
                _ => ("Failed", true),
            };
            row.phase = phase.to_owned();
            row.counted = yes_no(counted);
            row.outcome = match &termination {
                Some(t) => outcome(t.exit_code, &t.reason),
                None => reason,
            };
            row.ended = time(t);
        }
        JobState::Active => {
            row.phase = if job.metadata.deletion_timestamp.is_some() {
                "Stopping"
            } else if suspended(job)
                && job
                    .metadata
                    .labels
                    .as_ref()
                    .is_some_and(|l| l.contains_key(LABEL_KUEUE_QUEUE))
            {
                "Queued"
            } else if pods.iter().any(|p| pod_phase(p) == "Running") {
                "Running"
            } else if gated(job) && pods.iter().any(|p| pod_gated(p)) {
                "Gated"
            } else {
                "Pending"
            }
            .to_owned();
        }
    }
}

fn outcome(exit_code: Option<i32>, reason: &str) -> String {
    match exit_code {
        Some(code) => format!("exit {code} ({reason})"),
        None if reason.is_empty() => "-".to_owned(),
        None => reason.to_owned(),
    }
}

/// `exit N (Reason)` from an AttemptFailed note ("… exit code N (Reason) …").
fn exit_in_note(note: &str) -> Option<String> {
    let rest = note.split_once("exit code ")?.1;
    let (code, rest) = rest.split_once(' ')?;
    let code: i32 = code.parse().ok()?;
    let reason = rest.strip_prefix('(')?.split_once(')')?.0;
    Some(outcome(Some(code), reason))
}

fn yes_no(b: bool) -> String {
    if b { "yes" } else { "no" }.to_owned()
}

/// The rows as a plain text table, columns two spaces apart.
pub fn render(rows: &[Row]) -> String {
    let cells: Vec<[String; 8]> = rows
        .iter()
        .map(|r| {
            [
                r.attempt.to_string(),
                r.job.clone(),
                r.phase.clone(),
                r.outcome.clone(),
                r.nodes.clone(),
                r.started.clone(),
                r.ended.clone(),
                r.counted.clone(),
            ]
        })
        .collect();
    crate::table::render(&HEADER, &cells)
}
