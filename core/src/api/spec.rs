use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Devices, FailureRule, GpuJobStatus, Topology};

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
// The v2 rule (see v2.rs) on v1's spelling of the product: `spec.v2.gpuProduct`.
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "!has(self.v2) || !has(self.v2.gpuProduct) || !has(self.nodeSelector) || !('nvidia.com/gpu.product' in self.nodeSelector) || self.nodeSelector['nvidia.com/gpu.product'] == self.v2.gpuProduct",
    "message": "nodeSelector[\"nvidia.com/gpu.product\"] disagrees with the GpuJob's GPU product (v2 resources.product)",
    "fieldPath": ".nodeSelector",
    "reason": "FieldValueInvalid",
}]))]
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
    /// Number of GPUs (`nvidia.com/gpu`) for the run. With v2 `resources.devices`: the
    /// most devices one pod may get (the largest `count`), which quota counts.
    #[schemars(range(min = 1, max = 64))]
    pub gpus: i32,
    /// How many failed attempts are retried; at most maxRetries + 1 attempts fail.
    #[serde(default = "default_max_retries")]
    #[schemars(range(min = 0, max = 100))]
    pub max_retries: i32,
    /// Deprecated: use spec.attemptDeadline in gpujob.dev/v2. Wall-clock limit of each
    /// attempt, in seconds; an attempt that runs longer fails.
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
    /// Set by conversion from gpujob.dev/v2: what v1 cannot express. Leave it out of v1
    /// manifests.
    // In spec rather than an annotation: the API server bumps metadata.generation only for
    // changes outside metadata and status (compared in the storage version, v1), so a
    // template edit kept in an annotation would never count as a spec change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub v2: Option<V2Only>,
}

/// The gpujob.dev/v2 values v1 has no field for (see docs/api-versions.md).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct V2Only {
    /// v2 `spec.template`: the pod template pass-through.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserved_object")]
    pub template: Option<Value>,
    /// v2 `spec.resources.product`: the node selector `nvidia.com/gpu.product`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63), regex(pattern = LABEL_VALUE_PATTERN))]
    pub gpu_product: Option<String>,
    /// v2 `spec.retryPolicy.backoffSeconds`: the first backoff, doubling per failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub backoff_seconds: Option<i64>,
    /// v2 `spec.attemptDeadline` as written, when it is not the canonical form of
    /// `activeDeadlineSeconds` (which holds it rounded up to whole seconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt_deadline: Option<String>,
    /// v2 `spec.retryPolicy.failureRules`: what a failed attempt does, by exit code or
    /// pod condition.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 19))]
    pub failure_rules: Vec<FailureRule>,
    /// v2 `spec.nodes`, when more than one: how many pods (nodes) run each attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 2, max = 128))]
    pub nodes: Option<i32>,
    /// v2 `spec.queueName`: the Kueue LocalQueue that admits each attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63), regex(pattern = QUEUE_NAME_PATTERN))]
    pub queue_name: Option<String>,
    /// v2 `spec.resources.devices`: GPUs by Dynamic Resource Allocation, in place of
    /// `nvidia.com/gpu` (`gpus` then holds the largest count).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub devices: Option<Devices>,
    /// v2 `spec.topology`: the node label whose one domain holds each attempt's pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<Topology>,
}

impl GpuJobSpec {
    /// How many pods (nodes) run each attempt: v2 `spec.nodes`, 1 unless set.
    pub fn nodes(&self) -> i32 {
        self.v2.as_ref().and_then(|v2| v2.nodes).unwrap_or(1)
    }

    /// The devices each pod gets by DRA (v2 `spec.resources.devices`), if any.
    pub fn devices(&self) -> Option<&Devices> {
        self.v2.as_ref().and_then(|v2| v2.devices.as_ref())
    }

    /// Where each attempt's pods are kept together (v2 `spec.topology`), if anywhere.
    pub fn topology(&self) -> Option<&Topology> {
        self.v2.as_ref().and_then(|v2| v2.topology.as_ref())
    }

    /// The Kueue LocalQueue that admits each attempt (v2 `spec.queueName`), if any.
    pub fn queue_name(&self) -> Option<&str> {
        self.v2.as_ref().and_then(|v2| v2.queue_name.as_deref())
    }

    /// The GPUs of one attempt: `gpus` on each of its nodes. Quota is reserved for
    /// these, and `--max-gpus` limits them.
    pub fn total_gpus(&self) -> i32 {
        self.gpus.saturating_mul(self.nodes())
    }
}

impl V2Only {
    /// `None` when no part is set, so that a v1 object without v2 values has no `v2`.
    pub fn non_empty(self) -> Option<V2Only> {
        (self != V2Only::default()).then_some(self)
    }
}

/// A label value (the GPU product is one): at most 63 characters, alphanumeric at both
/// ends, `-`, `_` and `.` between; the schema's form of `validate`'s check.
pub(crate) const LABEL_VALUE_PATTERN: &str = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$";

/// A LocalQueue's name (a DNS-1123 subdomain, as Kueue checks the queue-name label) of
/// at most 63 characters, so that it is also a label value.
pub(crate) const QUEUE_NAME_PATTERN: &str =
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";

/// An object the API server keeps as written (`x-kubernetes-preserve-unknown-fields`):
/// the pod template. A full PodSpec schema would make the CRD too large for
/// `kubectl apply`'s last-applied annotation; the operator checks the template itself.
pub(crate) fn preserved_object(_: &mut SchemaGenerator) -> Schema {
    schemars::json_schema!({
        "type": "object",
        "nullable": true,
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum UpdatePolicy {
    #[default]
    Recreate,
    OnNextAttempt,
}

impl UpdatePolicy {
    pub(crate) fn is_default(&self) -> bool {
        *self == UpdatePolicy::Recreate
    }
}

pub(crate) fn default_max_retries() -> i32 {
    3
}

/// Most pods (nodes) one attempt may run on (`spec.nodes`): the index fits three
/// digits of the pods' host names (see `validate`).
pub const MAX_NODES: i32 = 128;

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
