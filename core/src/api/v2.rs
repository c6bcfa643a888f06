//! `gpujob.dev/v2` types. The operator works on v1 (the storage version during the
//! compatibility window); [`super::convert`] maps between the two without loss, v1
//! keeping what only v2 can say in `spec.v2`. See docs/api-versions.md.

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::spec::{LABEL_VALUE_PATTERN, QUEUE_NAME_PATTERN, default_max_retries, preserved_object};
use super::{Devices, EnvVar, FailureRule, GpuJobStatus, Topology, UpdatePolicy};

/// A batch run on GPUs. The operator runs it as one batch/v1 Job per attempt and
/// retries failed attempts up to `retryPolicy.maxRetries` times with exponential backoff.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "gpujob.dev",
    version = "v2",
    kind = "GpuJob",
    namespaced,
    status = "GpuJobStatus",
    shortname = "gj",
    category = "gpu",
    derive = "PartialEq",
    doc = "A batch run on GPUs, executed as one batch/v1 Job per attempt",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"GPUs","type":"integer","jsonPath":".spec.resources.gpus"}"#,
    printcolumn = r#"{"name":"Attempts","type":"integer","jsonPath":".status.attempts"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","priority":1,"description":"Why it is (not) running: the Ready condition's reason","jsonPath":".status.conditions[?(@.type==\"Ready\")].reason"}"#,
    printcolumn = r#"{"name":"Next Attempt","type":"date","priority":1,"description":"While backing off: when the next attempt starts","jsonPath":".status.nextAttemptTime"}"#
)]
#[serde(rename_all = "camelCase")]
// Cross-field rules the API server checks with CEL, so `kubectl apply` refuses them up
// front; the operator's own check (`validate`) stays for objects stored before
// a rule existed.
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "!has(self.resources.product) || !has(self.nodeSelector) || !('nvidia.com/gpu.product' in self.nodeSelector) || self.nodeSelector['nvidia.com/gpu.product'] == self.resources.product",
    "message": "nodeSelector[\"nvidia.com/gpu.product\"] disagrees with resources.product; set the product in one of them",
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
    /// What the run needs of a node.
    pub resources: Resources,
    /// How many nodes run each attempt (default 1): with more than one, an attempt is an
    /// Indexed Job of that many pods, one per node, each with `resources` (GPUs are per
    /// node), reachable by name through a headless Service, with the environment a
    /// distributed launcher reads (`WORLD_SIZE`, `RANK`, `MASTER_ADDR`, `MASTER_PORT`).
    /// One pod's failure fails the attempt. See docs/api.md, "Multi-node runs".
    #[serde(default = "one_node", skip_serializing_if = "is_one_node")]
    #[schemars(range(min = 1, max = 128))]
    pub nodes: i32,
    /// The Kueue LocalQueue (in this namespace) that admits each attempt: its Job is
    /// handed to Kueue suspended, and runs once Kueue admits all of its pods against the
    /// queue's ClusterQueue. Without it the operator starts attempts itself (behind the
    /// external quota service, where the operator has one; a GpuJob uses one or the
    /// other). See docs/api.md, "Queueing through Kueue".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63), regex(pattern = QUEUE_NAME_PATTERN))]
    pub queue_name: Option<String>,
    /// Keeps each attempt's pods close together: in one domain of a node label (a rack,
    /// a block). See docs/api.md, "Topology".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<Topology>,
    /// How failed attempts are retried.
    #[serde(default)]
    pub retry_policy: RetryPolicy,
    /// Wall-clock limit of each attempt, as a duration (`"90s"`, `"1h30m"`, `"2.5s"`,
    /// `"500ms"`; units h, m, s, ms; more than zero); an attempt that runs longer fails.
    /// The Job gets it rounded up to whole seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        regex(pattern = r"^[+]?(([0-9]+(\.[0-9]*)?|\.[0-9]+)(h|m|s|ms))+$"),
        length(max = 64),
        extend("x-kubernetes-validations" = [{
            "rule": "duration(self) > duration('0s')",
            "message": "must be more than zero",
        }]),
    )]
    pub attempt_deadline: Option<String>,
    /// Node labels the attempt's pod must match.
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
    /// Pod template merged into each attempt's pod: `metadata` (labels, annotations) and
    /// `spec` (volumes, tolerations, affinity, priorityClassName, imagePullSecrets, other
    /// containers, …). A container named `main` adds to the operator's container
    /// (volumeMounts, CPU and memory, env). The operator owns restartPolicy, the GPU
    /// resource, the service account, main's image, command and args, the GPUJOB_ATTEMPT
    /// env var and `gpujob.dev/` labels; a template that sets them is an invalid spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserved_object")]
    pub template: Option<Value>,
}

/// What the run needs of a node: `gpus` (the extended resource `nvidia.com/gpu`) or
/// `devices` (Dynamic Resource Allocation), one of the two.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "has(self.gpus) != has(self.devices)",
    "message": "set one of gpus (nvidia.com/gpu) and devices (DRA)",
    "reason": "FieldValueInvalid",
}, {
    "rule": "!has(self.devices) || !has(self.product)",
    "message": "product selects nodes for gpus; with devices, select the product in a device selector",
    "fieldPath": ".product",
    "reason": "FieldValueForbidden",
}]))]
pub struct Resources {
    /// Number of GPUs (`nvidia.com/gpu`) for the run, on each node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 64))]
    pub gpus: Option<i32>,
    /// GPUs by Dynamic Resource Allocation (`resource.k8s.io/v1`), on each node: each
    /// attempt's pods get them through a ResourceClaimTemplate the operator makes for
    /// the attempt. Needs a cluster whose DRA driver publishes the devices. See
    /// docs/api.md, "GPUs by Dynamic Resource Allocation".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub devices: Option<Devices>,
    /// GPU product name (the node label `nvidia.com/gpu.product`, e.g.
    /// `NVIDIA-A100-SXM4-80GB`) the run's node must have.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63), regex(pattern = LABEL_VALUE_PATTERN))]
    pub product: Option<String>,
}

/// How failed attempts are retried.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RetryPolicy {
    /// How many failed attempts are retried; at most maxRetries + 1 attempts fail.
    #[serde(default = "default_max_retries")]
    #[schemars(range(min = 0, max = 100))]
    pub max_retries: i32,
    /// Wait before the attempt after the first failure, in seconds; doubles per failure,
    /// up to the operator's longest backoff. The operator's --retry-backoff-base when
    /// not set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub backoff_seconds: Option<i64>,
    /// What a failed attempt does, by the main container's exit code or the pod's
    /// conditions: fail the GpuJob at once, retry and count, or retry without counting.
    /// The first rule that matches decides; a failure none matches is retried and
    /// counted. A disruption (the pod's `DisruptionTarget` condition: preemption,
    /// eviction, a node drain) that no rule matches is retried at once without counting.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 19))]
    pub failure_rules: Vec<FailureRule>,
}

fn one_node() -> i32 {
    1
}

fn is_one_node(nodes: &i32) -> bool {
    *nodes == 1
}

impl Default for RetryPolicy {
    fn default() -> RetryPolicy {
        RetryPolicy {
            max_retries: default_max_retries(),
            backoff_seconds: None,
            failure_rules: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use kube::CustomResourceExt;
    use serde_json::json;

    use super::*;

    #[test]
    fn the_v2_schema_keeps_the_template_as_written_and_checks_the_rest() {
        let crd = serde_json::to_value(GpuJob::crd()).unwrap();
        let version = &crd["spec"]["versions"][0];
        assert_eq!(version["name"], "v2");
        let spec = &version["schema"]["openAPIV3Schema"]["properties"]["spec"];
        let template = &spec["properties"]["template"];
        assert_eq!(template["type"], "object");
        assert_eq!(template["x-kubernetes-preserve-unknown-fields"], true);
        assert!(template.get("properties").is_none(), "no PodSpec schema");
        assert!(
            template["description"]
                .as_str()
                .unwrap()
                .starts_with("Pod template merged"),
            "{template}"
        );
        let resources = &spec["properties"]["resources"];
        assert_eq!(resources["properties"]["gpus"]["maximum"], 64.0);
        assert_eq!(
            resources["required"],
            serde_json::Value::Null,
            "gpus or devices"
        );
        let rules = resources["x-kubernetes-validations"].as_array().unwrap();
        assert_eq!(rules[0]["rule"], "has(self.gpus) != has(self.devices)");
        let devices = &resources["properties"]["devices"];
        assert_eq!(
            devices["x-kubernetes-validations"][0]["rule"],
            "has(self.exactly) != has(self.firstAvailable)"
        );
        assert_eq!(
            devices["properties"]["firstAvailable"]["maxItems"],
            json!(8)
        );
        let retry = &spec["properties"]["retryPolicy"];
        assert_eq!(retry["default"], json!({"maxRetries": 3}));
        assert_eq!(retry["properties"]["backoffSeconds"]["minimum"], 1.0);
        assert_eq!(spec["required"], json!(["image", "resources"]));
        let deadline = &spec["properties"]["attemptDeadline"]["pattern"];
        assert!(
            deadline.as_str().unwrap().contains("(h|m|s|ms)"),
            "{deadline}"
        );
        let columns = &version["additionalPrinterColumns"];
        assert_eq!(columns[1]["jsonPath"], ".spec.resources.gpus");
        // Small enough for kubectl apply's last-applied annotation (256 KiB) many times over.
        assert!(crd.to_string().len() < 32 * 1024);
    }

    #[test]
    fn a_missing_retry_policy_is_the_default() {
        let spec: GpuJobSpec =
            serde_json::from_value(json!({"image": "i", "resources": {"gpus": 1}})).unwrap();
        assert_eq!(spec.retry_policy, RetryPolicy::default());
        assert_eq!(spec.retry_policy.max_retries, 3);
        let spec: GpuJobSpec = serde_json::from_value(
            json!({"image": "i", "resources": {"gpus": 1}, "retryPolicy": {"backoffSeconds": 5}}),
        )
        .unwrap();
        assert_eq!(
            spec.retry_policy.max_retries, 3,
            "default inside the object too"
        );
    }
}
