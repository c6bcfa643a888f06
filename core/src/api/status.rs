use jiff::Timestamp;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Observed facts about a GpuJob. Nothing here is intent: the spec is the only input.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuJobStatus {
    /// The generation the operator has processed, including a decision to wait.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    // Absent rather than null when unknown: Kubernetes 1.20 refuses a CRD whose enum
    // lists null.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Phase")]
    pub phase: Option<Phase>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Attempts started.
    #[serde(default)]
    pub attempts: i32,
    /// Attempts failed.
    #[serde(default)]
    pub failures: i32,
    /// Name of the Job of the attempt that is running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_job: Option<String>,
    /// When the next attempt starts, while backing off after a failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>")]
    pub next_attempt_time: Option<Timestamp>,
    /// The most recent error: a failed attempt, or a problem the operator hit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// The most recent failed attempt, as observed from its Job and pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failure: Option<FailureRecord>,
    /// The external GPU quota reservation held for this GpuJob (recorded before any Job
    /// exists; cleared once released).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservation_id: Option<String>,
    /// The GPUs that reservation holds, as the quota service granted them (`gpus` ×
    /// `nodes` of the spec it was made for). A spec that asks for another number has it
    /// released and made again before its next attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservation_gpus: Option<i32>,
    /// The last call to the quota service for this GpuJob, recorded before it was sent
    /// (docs/quota-api.md, "Fencing tokens"). Its number is the fencing sequence: a
    /// later call never carries a smaller one, so a call that lands late is refused by
    /// a service that honours it; and a reserve whose answer was never recorded may have
    /// taken effect, so it is released when the GpuJob no longer needs quota.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota_call: Option<QuotaCall>,
    /// Since when releasing the reservation has been failing (cleanup is retried; past
    /// the cleanup timeout, condition CleanupStuck).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>")]
    pub release_failing_since: Option<Timestamp>,
    /// The attempt being replaced because of a spec change (its Job is being deleted;
    /// this is not a failure).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replacing_attempt: Option<i32>,
    /// An attempt's Job was dispatched by MultiKueue: a pod of this GpuJob may run on a
    /// worker cluster, so every read of its pods (before a gate goes, or quota is
    /// released) reads the workers too. Recorded before any pod there is let go, and
    /// kept: a worker may still run an earlier attempt's pod once its Job here is gone.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub multi_kueue_dispatched: bool,
    /// When the first attempt's Job was created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>")]
    pub start_time: Option<Timestamp>,
    /// The run the attempts belong to, from 1 (absent: 1); a rerun request starts the
    /// next.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<i32>,
    /// The first attempt of the current run (absent: 1). Attempt numbers continue across
    /// runs, so Job names stay unique.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_first_attempt: Option<i32>,
    /// The `gpujob.dev/rerun` request the current run answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rerun_token: Option<String>,
    /// Which alternatives of `resources.devices.firstAvailable` an attempt's pods were
    /// allocated (the newest attempt read; `attempt` says which), read from their
    /// ResourceClaims once they were all placed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub devices: Option<DeviceAllocation>,
    /// When the GpuJob reached Succeeded or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>")]
    pub completion_time: Option<Timestamp>,
}

/// What an attempt's pods were allocated, from their ResourceClaims.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeviceAllocation {
    /// The attempt.
    pub attempt: i32,
    /// The `firstAvailable` alternatives its pods got, each once, in order of
    /// preference: one name when all of its pods got the same.
    pub alternatives: Vec<String>,
}

/// A call to the quota service, as recorded before it was sent.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QuotaCall {
    pub op: QuotaOp,
    /// Sent as `Gpujob-Fencing-Token: <uid>/<sequence>`. A repeat of the same call whose
    /// answer is not recorded reuses it; any other call takes the next number.
    pub sequence: i64,
    /// Its answer is not recorded: it may or may not have taken effect on the service.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pending: bool,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum QuotaOp {
    Reserve,
    Release,
}

/// Pending: no attempt is running (waiting for the first Job, or backing off before the
/// next). Running: the current attempt's Job exists and has not finished. Suspended:
/// `spec.suspend` holds it (no attempt runs). Succeeded and Failed are final.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum Phase {
    Pending,
    Running,
    Suspended,
    Succeeded,
    Failed,
}

impl Phase {
    pub fn is_final(self) -> bool {
        matches!(self, Phase::Succeeded | Phase::Failed)
    }
}

/// A failed attempt: what the Job and its pod said.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailureRecord {
    pub attempt: i32,
    /// When the attempt's Job failed; the backoff before the next attempt counts from here.
    #[schemars(with = "String")]
    pub time: Timestamp,
    /// Container exit code, when the pod reported one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Short reason (`Error`, `OOMKilled`, `DeadlineExceeded`, `JobDeleted`,
    /// `Disrupted`, …).
    pub reason: String,
    pub message: String,
    /// Whether it counts against `retryPolicy.maxRetries`: not for a disruption
    /// (preemption, eviction, a node drain), whose attempt is retried at once, nor for
    /// a failure rule that says `RetryWithoutCounting`.
    #[serde(default = "counted_by_default", skip_serializing_if = "is_counted")]
    pub counted: bool,
    /// The failure rule that matched (its index in `retryPolicy.failureRules`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<i32>,
}

fn counted_by_default() -> bool {
    true
}

fn is_counted(counted: &bool) -> bool {
    *counted
}

/// The metav1.Condition shape.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: ConditionStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[schemars(with = "String")]
    pub last_transition_time: Timestamp,
    pub reason: String,
    // Omitted when empty, so that no empty-string default lands in the schema (see
    // EnvVar::value).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ConditionStatus {
    True,
    False,
    Unknown,
}
