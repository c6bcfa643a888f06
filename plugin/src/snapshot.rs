//! What the plugin reads of one GpuJob: the GpuJob (as v2), the Jobs it controls, the
//! pods of its attempts and its Events. Pure helpers over them; `cluster.rs` fills it.

use gpujob_core::api::Phase;
use gpujob_core::api::v2::GpuJob;
use gpujob_core::job::{COMPLETION_INDEX, attempt_of, is_controlled_by};
use gpujob_core::seen_pod::SeenPod;
use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;

/// One Event on the GpuJob, as `kubectl describe` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct SeenEvent {
    /// `Normal` or `Warning`.
    pub type_: String,
    pub reason: String,
    pub note: String,
    /// When it was last seen.
    pub time: Option<Timestamp>,
    pub count: i32,
}

#[derive(Debug, Clone)]
pub struct Snapshot {
    pub gpujob: GpuJob,
    /// Jobs controlled by the GpuJob (any attempt).
    pub jobs: Vec<Job>,
    /// Pods labelled with the GpuJob's uid.
    pub pods: Vec<Pod>,
    /// Events on the GpuJob, oldest first.
    pub events: Vec<SeenEvent>,
}

impl Snapshot {
    pub fn name(&self) -> &str {
        self.gpujob.metadata.name.as_deref().unwrap_or_default()
    }

    pub fn namespace(&self) -> &str {
        self.gpujob
            .metadata
            .namespace
            .as_deref()
            .unwrap_or_default()
    }

    pub fn uid(&self) -> &str {
        self.gpujob.metadata.uid.as_deref().unwrap_or_default()
    }

    pub fn phase(&self) -> Option<Phase> {
        self.gpujob.status.as_ref().and_then(|s| s.phase)
    }

    /// Attempts started, as status says.
    pub fn attempts(&self) -> i32 {
        self.gpujob.status.as_ref().map_or(0, |s| s.attempts)
    }

    /// The Job of `attempt`, if it still exists (controlled by this GpuJob).
    pub fn job(&self, attempt: i32) -> Option<&Job> {
        self.jobs
            .iter()
            .find(|j| attempt_of(j) == Some(attempt) && is_controlled_by(j, self.uid()))
    }

    /// The pods of `attempt`, by completion index (rank), newest first within one index.
    pub fn pods_of(&self, attempt: i32) -> Vec<&Pod> {
        let mut pods: Vec<&Pod> = self
            .pods
            .iter()
            .filter(|p| pod_attempt(p) == Some(attempt))
            .collect();
        pods.sort_by(|a, b| {
            rank_of(a)
                .cmp(&rank_of(b))
                .then_with(|| created(b).cmp(&created(a)))
        });
        pods
    }

    /// The highest attempt number anything shows: status, a Job or a pod.
    pub fn last_attempt(&self) -> i32 {
        let jobs = self.jobs.iter().filter_map(attempt_of);
        let pods = self.pods.iter().filter_map(pod_attempt);
        jobs.chain(pods).fold(self.attempts(), i32::max)
    }

    /// The newest Event with `reason` whose note is about `attempt` ("attempt k …").
    pub fn event_about(&self, reason: &str, attempt: i32) -> Option<&SeenEvent> {
        let prefix = format!("attempt {attempt} ");
        self.events
            .iter()
            .rev()
            .find(|e| e.reason == reason && e.note.starts_with(&prefix))
    }
}

/// A pod's attempt, from its `gpujob.dev/attempt` label, as the operator reads it
/// (`SeenPod`).
pub fn pod_attempt(pod: &Pod) -> Option<i32> {
    SeenPod::of(pod)?.attempt
}

/// Whether the pod carries the operator's scheduling gate, as the operator reads it.
pub fn pod_gated(pod: &Pod) -> bool {
    SeenPod::of(pod).is_some_and(|p| p.gated)
}

/// A pod's rank: the completion index the Job controller gives each pod of an Indexed
/// Job (annotation, and label on Kubernetes 1.28+); 0 for a single-node attempt's pod.
pub fn rank_of(pod: &Pod) -> i32 {
    let m = &pod.metadata;
    m.annotations
        .as_ref()
        .and_then(|a| a.get(COMPLETION_INDEX))
        .or_else(|| m.labels.as_ref().and_then(|l| l.get(COMPLETION_INDEX)))
        .and_then(|i| i.parse().ok())
        .unwrap_or(0)
}

fn created(pod: &Pod) -> Option<Timestamp> {
    pod.metadata.creation_timestamp.as_ref().map(|t| t.0)
}

pub fn pod_name(pod: &Pod) -> &str {
    pod.metadata.name.as_deref().unwrap_or_default()
}

pub fn pod_phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Unknown")
}

pub fn pod_node(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref().and_then(|s| s.node_name.as_deref())
}

/// `2026-12-05T10:01:02Z`, or `-`.
pub fn time(t: Option<Timestamp>) -> String {
    t.map_or_else(
        || "-".to_owned(),
        |t| t.round(jiff::Unit::Second).unwrap_or(t).to_string(),
    )
}

/// How long ago, as `42s`, `5m`, `3h`, `2d`.
pub fn age(t: Timestamp, now: Timestamp) -> String {
    let s = now.duration_since(t).as_secs().max(0);
    match s {
        0..120 => format!("{s}s"),
        120..7200 => format!("{}m", s / 60),
        7200..172_800 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}
