//! Failure rules (v2 `spec.retryPolicy.failureRules`, v1 `spec.v2.failureRules`): what a
//! failed attempt does to the GpuJob, by the main container's exit code or by the pod's
//! conditions. Each attempt's Job carries them as its pod failure policy (`job.rs`).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::ConditionStatus;

/// The most rules a GpuJob may have: a Job's pod failure policy holds 20, and the
/// operator adds one (a disruption is retried without counting).
pub const MAX_FAILURE_RULES: usize = 19;

/// What a failure that matches a rule does.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum FailureAction {
    /// The GpuJob fails at once, whatever retries are left (a code that means "bad
    /// configuration": retrying is waste).
    FailGpuJob,
    /// Retried after backoff and counted against `maxRetries` (what a failure no rule
    /// matches does; a rule says it explicitly, ahead of a later rule).
    Retry,
    /// Retried after the first backoff, not counted against `maxRetries`.
    RetryWithoutCounting,
}

/// One failure rule: exactly one of `onExitCodes` and `onPodConditions`. Rules are
/// tried in order; the first that matches decides.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "has(self.onExitCodes) != has(self.onPodConditions)",
    "message": "set exactly one of onExitCodes and onPodConditions",
}]))]
pub struct FailureRule {
    pub action: FailureAction,
    /// The main container's exit code.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_exit_codes: Option<ExitCodes>,
    /// The pod's conditions: the rule matches if any pattern does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 20))]
    pub on_pod_conditions: Option<Vec<PodConditionPattern>>,
}

/// Exit codes of the main container.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "self.operator == 'NotIn' || !(0 in self.values)",
    "message": "0 is success, which no failure has: In may not list it",
}]))]
pub struct ExitCodes {
    pub operator: ExitCodeOperator,
    #[schemars(length(min = 1, max = 255))]
    pub values: Vec<i32>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ExitCodeOperator {
    In,
    NotIn,
}

/// A pod condition: its type, and its status (`True` when not set).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodConditionPattern {
    #[serde(rename = "type")]
    #[schemars(length(min = 1, max = 316))]
    pub type_: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<ConditionStatus>,
}
