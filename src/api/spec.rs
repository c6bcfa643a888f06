use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::GpuJobStatus;

/// A batch run on GPUs. The operator runs it as one batch/v1 Job per attempt and
/// retries failed attempts up to `maxRetries` times with exponential backoff.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "gpujob.dev",
    version = "v1",
    kind = "GpuJob",
    namespaced,
    status = "GpuJobStatus",
    shortname = "gj",
    category = "gpu",
    derive = "PartialEq",
    doc = "A batch run on GPUs, executed as one batch/v1 Job per attempt",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"GPUs","type":"integer","jsonPath":".spec.gpus"}"#,
    printcolumn = r#"{"name":"Attempts","type":"integer","jsonPath":".status.attempts"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","priority":1,"description":"Why it is (not) running: the Ready condition's reason","jsonPath":".status.conditions[?(@.type==\"Ready\")].reason"}"#,
    printcolumn = r#"{"name":"Next Attempt","type":"date","priority":1,"description":"While backing off: when the next attempt starts","jsonPath":".status.nextAttemptTime"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct GpuJobSpec {
    /// Container image to run.
    #[schemars(length(min = 1))]
    pub image: String,
    /// Entrypoint; the image's ENTRYPOINT when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// Arguments to the entrypoint; the image's CMD when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Environment variables of the container.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    /// Number of GPUs (`nvidia.com/gpu`) for the run.
    #[schemars(range(min = 1, max = 64))]
    pub gpus: i32,
    /// How many failed attempts are retried; at most maxRetries + 1 attempts fail.
    #[serde(default = "default_max_retries")]
    #[schemars(range(min = 0, max = 100))]
    pub max_retries: i32,
    /// Wall-clock limit of each attempt, in seconds; an attempt that runs longer fails.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub active_deadline_seconds: Option<i64>,
    /// Node labels the attempt's pod must match (for example a GPU model).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Service account the attempt's pod runs as; the namespace's default when empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_name: Option<String>,
    /// What a spec change does to a running attempt: `Recreate` (default) replaces it
    /// with a new attempt on the new spec (not counted as a failure); `OnNextAttempt`
    /// lets it run and applies the change to the next attempt, if any.
    #[serde(default, skip_serializing_if = "UpdatePolicy::is_default")]
    pub update_policy: UpdatePolicy,
    /// Suspends the GpuJob: no new attempt starts, and a running attempt's Job is
    /// deleted (not counted as a failure); `false` resumes with the next attempt. GPU
    /// quota is released while suspended.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub suspend: bool,
    /// The GpuJob (and its Jobs) is deleted this many seconds after it finished
    /// (`status.completionTime`); kept otherwise (or per the operator's
    /// --default-ttl-after-finished).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub ttl_seconds_after_finished: Option<i64>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum UpdatePolicy {
    #[default]
    Recreate,
    OnNextAttempt,
}

impl UpdatePolicy {
    fn is_default(&self) -> bool {
        *self == UpdatePolicy::Recreate
    }
}

fn default_max_retries() -> i32 {
    3
}

/// An environment variable with a literal value.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct EnvVar {
    #[schemars(length(min = 1))]
    pub name: String,
    // Omitted when empty: Kubernetes 1.20 reads an empty-string schema default as null
    // and refuses the CRD, and skipping it keeps schemars from emitting one.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub value: String,
}
