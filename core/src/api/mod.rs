//! The `GpuJob` API (`gpujobs.gpujob.dev/v1`, and `v2` served beside it): spec (the user's intent), status (observed
//! facts only) and the CRD generated from them. `v2` is the next version's types and
//! `convert` the lossless conversion between the two (docs/api-versions.md); the
//! operator works on v1 types, whose `spec.v2` carries what only v2 can say.

pub mod convert;
pub mod crd;
pub mod decode;
pub mod devices;
pub mod duration;
mod failure;
mod spec;
mod status;
mod topology;
pub mod v2;

pub use crd::{Conversion, CrdOptions, StorageVersion, crd_yaml, crd_yaml_with};
pub use devices::{
    CelSelector, DEVICE_REQUEST, DeviceAlternative, DeviceSelector, Devices, ExactDevices,
};
pub use failure::{
    ExitCodeOperator, ExitCodes, FailureAction, FailureRule, MAX_FAILURE_RULES, PodConditionPattern,
};
pub use spec::{EnvVar, GpuJob, GpuJobSpec, MAX_NODES, UpdatePolicy, V2Only};
pub use status::{
    Condition, ConditionStatus, DeviceAllocation, FailureRecord, GpuJobStatus, Phase, QuotaCall,
    QuotaOp,
};
pub use topology::{KUEUE_PREFERRED_TOPOLOGY, KUEUE_REQUIRED_TOPOLOGY, Topology, TopologyMode};

/// Label on Jobs and pods: the owning GpuJob's name (hash-truncated to 63 characters).
pub const LABEL_NAME: &str = "gpujob.dev/name";
/// Label on Jobs and pods: the owning GpuJob's UID. Jobs are watched by this label.
pub const LABEL_UID: &str = "gpujob.dev/uid";
/// Label on Jobs and pods: the attempt number, from 1.
pub const LABEL_ATTEMPT: &str = "gpujob.dev/attempt";
/// The operator's container in each attempt's pod; a template's container of this name
/// adds to it.
pub const CONTAINER_NAME: &str = "main";
/// Container env var holding the attempt number.
pub const ENV_ATTEMPT: &str = "GPUJOB_ATTEMPT";
/// The env vars a multi-node attempt's pods get (`spec.nodes` > 1), as PyTorch's
/// launchers and the Kubeflow training operator name them: how many nodes, this pod's
/// index among them, and where rank 0 listens.
pub const ENV_WORLD_SIZE: &str = "WORLD_SIZE";
pub const ENV_RANK: &str = "RANK";
pub const ENV_MASTER_ADDR: &str = "MASTER_ADDR";
pub const ENV_MASTER_PORT: &str = "MASTER_PORT";
/// The env vars the operator sets on a multi-node attempt's `main` container.
pub const MULTI_NODE_ENV: [&str; 4] = [ENV_WORLD_SIZE, ENV_RANK, ENV_MASTER_ADDR, ENV_MASTER_PORT];
/// The port `MASTER_PORT` says (PyTorch's default rendezvous port).
pub const MASTER_PORT: u16 = 29500;
/// Annotation on Jobs with failure rules: the action of each rule of the Job's pod
/// failure policy, in order (`job.rs`).
pub const ANNOTATION_FAILURE_RULES: &str = "gpujob.dev/failure-rules";
/// Annotation on Jobs of a GpuJob with `devices` (DRA): the request the attempt's pods
/// claim, as JSON (their ResourceClaimTemplate, made just before the Job from the same
/// spec, is named after a hash of it): what the Job was built for, whatever the spec
/// says later. Quota counts from it, and `status.devices` names its alternatives.
pub const ANNOTATION_DEVICES: &str = "gpujob.dev/devices";
/// Annotation on Jobs of a GpuJob with `topology`: where its pods are kept together, as
/// JSON (a gang's PodGroup is built from the Job, after it).
pub const ANNOTATION_TOPOLOGY: &str = "gpujob.dev/topology";
/// Annotation on Jobs: the GpuJob generation the Job was built from.
pub const ANNOTATION_GENERATION: &str = "gpujob.dev/generation";
/// Finalizer held while an external quota reservation may exist.
pub const FINALIZER_QUOTA: &str = "gpujob.dev/quota-release";
/// Annotation that lets deletion finish without releasing the quota reservation.
pub const ANNOTATION_SKIP_RELEASE: &str = "gpujob.dev/skip-quota-release";
/// Annotation asking for a new run of a finished GpuJob: each new value, once.
pub const ANNOTATION_RERUN: &str = "gpujob.dev/rerun";
/// Label that hands a Job to Kueue: the LocalQueue (in the Job's namespace) that admits
/// it. The operator creates the Job of a GpuJob with `spec.queueName` suspended and with
/// this label; Kueue, not the operator, unsuspends it. Kueue may also add it (its
/// LocalQueue defaulting labels every new Job in a namespace with a LocalQueue named
/// `default`).
pub const LABEL_KUEUE_QUEUE: &str = "kueue.x-k8s.io/queue-name";
/// The operator's scheduling gate (`spec.schedulingGates`) on every attempt's pod: the
/// scheduler places no pod that carries it. Only the holder of the GpuJob's shard
/// removes it, pod by pod, once a read from the API server shows the pod is the current
/// attempt's and no other attempt's pod can run (`plan/gate.rs`).
pub const SCHEDULING_GATE: &str = "gpujob.dev/current-attempt";
/// The extended resource GPUs are requested as.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";
/// Node label holding the GPU product name (NVIDIA GPU feature discovery): v2's
/// `spec.resources.product` becomes a node selector on it.
pub const LABEL_GPU_PRODUCT: &str = "nvidia.com/gpu.product";
/// Prefix of the operator's own labels: a pod template may not set these.
pub const LABEL_PREFIX: &str = "gpujob.dev/";

impl GpuJob {
    /// Whether the GpuJob holds the quota finalizer.
    pub fn holds_quota_finalizer(&self) -> bool {
        self.metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == FINALIZER_QUOTA)
    }

    /// Condition `type_` of the status, if any.
    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.status.as_ref()?.condition(type_)
    }
}

impl GpuJobStatus {
    /// Condition `type_`, if any.
    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.type_ == type_)
    }
}
