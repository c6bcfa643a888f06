//! Pure: the Job that runs attempt k of a GpuJob, and the names and labels that tie
//! Jobs back to their GpuJob.

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    Affinity, Container, EnvVar as K8sEnvVar, EnvVarSource, ObjectFieldSelector, PodAffinity,
    PodAffinityTerm, PodAntiAffinity, PodResourceClaim, PodSchedulingGate, PodSchedulingGroup,
    PodSpec, PodTemplateSpec, ResourceClaim, Toleration, WeightedPodAffinityTerm,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use kube::Resource;

use crate::api::decode::{DecodeError, decode, join};
use crate::api::{
    ANNOTATION_DEVICES, ANNOTATION_FAILURE_RULES, ANNOTATION_GENERATION, ANNOTATION_TOPOLOGY,
    DEVICE_REQUEST, Devices, ENV_ATTEMPT, ENV_MASTER_ADDR, ENV_MASTER_PORT, ENV_RANK,
    ENV_WORLD_SIZE, GPU_RESOURCE, GpuJob, GpuJobSpec, LABEL_ATTEMPT, LABEL_GPU_PRODUCT,
    LABEL_KUEUE_QUEUE, LABEL_NAME, LABEL_PREFIX, LABEL_UID, MASTER_PORT, MULTI_NODE_ENV,
    SCHEDULING_GATE, Topology, TopologyMode,
};
use crate::failure_policy;
use crate::hash::fnv1a64;

/// Longest Job name: the Job controller copies it into the pods' `job-name` label, whose
/// values are limited to 63 characters.
const MAX_JOB_NAME: usize = 63;
const MAX_LABEL_VALUE: usize = 63;
pub use crate::api::CONTAINER_NAME;
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "gpujob-operator");

/// `<gpujob>-<attempt>`, or, when that is longer than 63 characters,
/// `<prefix>-<hash of the full name>-<attempt>`: stable, unique per GpuJob name, valid.
pub fn job_name(gpujob: &str, attempt: i32) -> String {
    let suffix = format!("-{attempt}");
    let full = format!("{gpujob}{suffix}");
    if full.len() <= MAX_JOB_NAME {
        return full;
    }
    format!("{}{suffix}", shorten(gpujob, MAX_JOB_NAME - suffix.len()))
}

/// The name of the ResourceClaimTemplate (`crate::claims`) of the attempt whose Job is
/// `job`, for `devices`: `<job>-<10 hex digits of FNV-1a 64 of the request's JSON>`.
/// The pods name it, and a template made for another request has another name.
pub fn claim_template_name(job: &str, devices: &Devices) -> String {
    let json = serde_json::to_string(devices).unwrap_or_default();
    let hash = format!("{:016x}", fnv1a64(json.as_bytes()));
    format!("{job}-{}", &hash[..10])
}

/// A label value for the GpuJob name: the name itself when it fits in 63 characters,
/// else a prefix and a hash of the whole name.
pub fn name_label(gpujob: &str) -> String {
    if gpujob.len() <= MAX_LABEL_VALUE {
        gpujob.to_owned()
    } else {
        shorten(gpujob, MAX_LABEL_VALUE)
    }
}

/// `<prefix>-<10 hex digits of FNV-1a 64 of name>`, at most `max` characters, with the
/// prefix cut so that it does not end in `-` or `.` (names and labels must end
/// alphanumeric).
fn shorten(name: &str, max: usize) -> String {
    let hash = format!("{:016x}", fnv1a64(name.as_bytes()));
    let hash = &hash[..10];
    let keep = max.saturating_sub(hash.len() + 1);
    // Names are ASCII (DNS subdomains), so byte slicing is on character boundaries.
    let prefix = name.get(..keep.min(name.len())).unwrap_or_default();
    let prefix = prefix.trim_end_matches(['-', '.']);
    format!("{prefix}-{hash}")
}

/// The labels every Job and pod of a GpuJob carry.
pub fn labels(gpujob: &GpuJob, attempt: i32) -> BTreeMap<String, String> {
    BTreeMap::from([
        (
            LABEL_NAME.to_owned(),
            name_label(&gpujob.name_any_or_empty()),
        ),
        (
            LABEL_UID.to_owned(),
            gpujob.metadata.uid.clone().unwrap_or_default(),
        ),
        (LABEL_ATTEMPT.to_owned(), attempt.to_string()),
        (MANAGED_BY.0.to_owned(), MANAGED_BY.1.to_owned()),
    ])
}

/// The pod template a GpuJob adds to its pods (v2 `spec.template`, kept in v1 as
/// `spec.v2.template`), decoded; `None` when it has none. The error names the field that
/// does not decode, from `spec.template`.
pub fn pod_template(spec: &GpuJobSpec) -> Result<Option<PodTemplateSpec>, DecodeError> {
    let Some(template) = spec.v2.as_ref().and_then(|v2| v2.template.as_ref()) else {
        return Ok(None);
    };
    decode::<PodTemplateSpec>(template)
        .map(Some)
        .map_err(|e| DecodeError {
            path: join(TEMPLATE_FIELD, &e.path),
            message: e.message,
        })
}

/// Where a GpuJob's pod template is, as users write it (v2).
pub const TEMPLATE_FIELD: &str = "spec.template";

/// The operator's toleration of the GPU nodes' taint.
fn gpu_toleration() -> Toleration {
    Toleration {
        key: Some(GPU_RESOURCE.to_owned()),
        operator: Some("Exists".to_owned()),
        effect: Some("NoSchedule".to_owned()),
        ..Toleration::default()
    }
}

/// The Job that runs `attempt` of `gpujob`. Its pods are created with the operator's
/// scheduling gate ([`SCHEDULING_GATE`]): whoever creates or starts the Job (this
/// operator, a deposed replica whose create lands late, Kueue, the Job controller racing
/// a delete), no pod of it runs until the shard's holder removes the gate from that pod,
/// after a read shows it is the current attempt's (`plan/gate.rs`). So the Job is created
/// running, and the Job controller makes its pods at once, gated. With `spec.queueName`
/// it is created suspended and labelled for that Kueue LocalQueue: Kueue admits it and
/// unsuspends it, and its pods wait at the gate all the same. Expects a spec that passed
/// validation: a pod template that does not decode is left out here (validation reports
/// it, and no Job is made for such a spec), and what validation refuses in a template
/// (the fields the operator owns) is overwritten.
///
/// With `spec.nodes` > 1 it is an Indexed Job of that many pods, started together: each
/// pod's host name is `<job>-<index>` (the Job controller sets it), its subdomain the
/// attempt's headless Service (`crate::rendezvous`, named like the Job), and its
/// environment says the world size, its rank and rank 0's address. `backoffLimit: 0`
/// holds for the whole Job: one pod's failure fails the attempt.
pub fn desired_job(gpujob: &GpuJob, attempt: i32) -> Job {
    let spec = &gpujob.spec;
    let labels = labels(gpujob, attempt);
    let template = pod_template(spec).ok().flatten().unwrap_or_default();
    let name = job_name(&gpujob.name_any_or_empty(), attempt);
    let nodes = spec.nodes();
    let multi = (nodes > 1).then_some(MultiNode { job: &name, nodes });
    let queue = spec.queue_name();
    let mut job_labels = labels.clone();
    if let Some(q) = queue {
        job_labels.insert(LABEL_KUEUE_QUEUE.to_owned(), q.to_owned());
    }
    Job {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: gpujob.metadata.namespace.clone(),
            labels: Some(job_labels),
            // Which spec this attempt runs: a later spec change is seen against it.
            annotations: annotations(gpujob),
            owner_references: Some(vec![owner_reference(gpujob)]),
            ..ObjectMeta::default()
        },
        spec: Some(JobSpec {
            // One Job per attempt: retries belong to the GpuJob, not the Job controller.
            backoff_limit: Some(0),
            pod_failure_policy: Some(failure_policy::pod_failure_policy(spec)),
            // Kueue admits a Job only while it is suspended; without a queue the gate
            // alone holds its pods.
            suspend: queue.map(|_| true),
            active_deadline_seconds: spec.active_deadline_seconds,
            completion_mode: multi.map(|_| "Indexed".to_owned()),
            completions: multi.map(|m| m.nodes),
            parallelism: multi.map(|m| m.nodes),
            template: pod(spec, attempt, &name, labels, template, multi),
            ..JobSpec::default()
        }),
        status: None,
    }
}

/// The Job's annotations: the generation it runs, what its failure rules mean, and the
/// devices its ResourceClaimTemplate asks for.
fn annotations(gpujob: &GpuJob) -> Option<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    if let Some(g) = gpujob.metadata.generation {
        out.insert(ANNOTATION_GENERATION.to_owned(), g.to_string());
    }
    if let Some(devices) = gpujob.spec.devices()
        && let Ok(json) = serde_json::to_string(devices)
    {
        out.insert(ANNOTATION_DEVICES.to_owned(), json);
    }
    if let Some(topology) = gpujob.spec.topology()
        && let Ok(json) = serde_json::to_string(topology)
    {
        out.insert(ANNOTATION_TOPOLOGY.to_owned(), json);
    }
    if let Some(rules) = failure_policy::annotation(&gpujob.spec) {
        out.insert(ANNOTATION_FAILURE_RULES.to_owned(), rules);
    }
    (!out.is_empty()).then_some(out)
}

/// Whether `job`'s pod template carries the operator's scheduling gate (every Job this
/// version builds does; one an earlier version created suspended does not).
pub fn gated(job: &Job) -> bool {
    job.spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.scheduling_gates.as_ref())
        .is_some_and(|gates| gates.iter().any(|g| g.name == SCHEDULING_GATE))
}

/// Whether `job` is suspended (`spec.suspend: true`).
pub fn suspended(job: &Job) -> bool {
    job.spec.as_ref().and_then(|s| s.suspend) == Some(true)
}

/// Puts the pods of multi-node attempt `job` in one gang: a PodGroup named like the Job
/// (`crate::gang`), which the plan makes before any of its pods is let go. Only where
/// kube-apiserver serves PodGroups: elsewhere it drops the field, or refuses it.
pub fn join_gang(job: &mut Job) {
    let Some(name) = job.metadata.name.clone() else {
        return;
    };
    let Some(spec) = job.spec.as_mut().filter(|s| s.completions.unwrap_or(1) > 1) else {
        // One pod is a gang of itself: no group to make, none to wait for.
        return;
    };
    if let Some(pod) = spec.template.spec.as_mut() {
        pod.scheduling_group = Some(PodSchedulingGroup {
            pod_group_name: Some(name),
        });
    }
}

/// The PodGroup `job`'s pods are in (`spec.schedulingGroup.podGroupName`), if any.
pub fn pod_group(job: &Job) -> Option<String> {
    job.spec
        .as_ref()?
        .template
        .spec
        .as_ref()?
        .scheduling_group
        .as_ref()?
        .pod_group_name
        .clone()
}

/// Where `job`'s pods are kept together (`gpujob.dev/topology`), if anywhere.
pub fn topology(job: &Job) -> Option<Topology> {
    let json = job
        .metadata
        .annotations
        .as_ref()?
        .get(ANNOTATION_TOPOLOGY)?;
    serde_json::from_str(json).ok()
}

/// The devices `job`'s ResourceClaimTemplate asks for (`None`: the Job asks for
/// `nvidia.com/gpu`, or its annotation does not decode).
pub fn devices(job: &Job) -> Option<Devices> {
    let json = job.metadata.annotations.as_ref()?.get(ANNOTATION_DEVICES)?;
    serde_json::from_str(json).ok()
}

/// The GPUs all of `job`'s pods ask for together: its `main` container's GPU limit (or
/// the most devices its claim may get) times its completions (one pod per node).
pub fn gpus(job: &Job) -> Option<i32> {
    let spec = job.spec.as_ref()?;
    if let Some(d) = devices(job) {
        return d
            .max_count()
            .checked_mul(spec.completions.unwrap_or(1).max(1));
    }
    let per_pod = spec
        .template
        .spec
        .as_ref()?
        .containers
        .iter()
        .find(|c| c.name == CONTAINER_NAME)?
        .resources
        .as_ref()?
        .limits
        .as_ref()?
        .get(GPU_RESOURCE)?
        .0
        .parse::<i32>()
        .ok()?;
    per_pod.checked_mul(spec.completions.unwrap_or(1).max(1))
}

/// What a multi-node attempt's pods are told of each other.
#[derive(Debug, Clone, Copy)]
struct MultiNode<'a> {
    /// The Job's name: its pods' host names start with it, and its headless Service
    /// (their subdomain) has it.
    job: &'a str,
    nodes: i32,
}

impl MultiNode<'_> {
    /// Rank 0's host name under the Service: resolved through the pod's DNS search
    /// path (its own namespace first).
    fn master_addr(&self) -> String {
        format!("{job}-0.{job}", job = self.job)
    }

    fn env(&self) -> Vec<K8sEnvVar> {
        let value = |name: &str, value: String| K8sEnvVar {
            name: name.to_owned(),
            value: Some(value),
            value_from: None,
        };
        vec![
            value(ENV_WORLD_SIZE, self.nodes.to_string()),
            K8sEnvVar {
                name: ENV_RANK.to_owned(),
                value: None,
                // The Job controller writes each pod's index in this annotation.
                value_from: Some(EnvVarSource {
                    field_ref: Some(ObjectFieldSelector {
                        field_path: format!("metadata.annotations['{COMPLETION_INDEX}']"),
                        api_version: None,
                    }),
                    ..EnvVarSource::default()
                }),
            },
            value(ENV_MASTER_ADDR, self.master_addr()),
            value(ENV_MASTER_PORT, MASTER_PORT.to_string()),
        ]
    }
}

/// A multi-node attempt's pods each on a node of their own: `spec.nodes` counts nodes,
/// and GPUs are per node.
fn one_per_node(labels: &BTreeMap<String, String>) -> PodAffinityTerm {
    let of_attempt = [LABEL_UID, LABEL_ATTEMPT]
        .into_iter()
        .filter_map(|k| labels.get(k).map(|v| (k.to_owned(), v.clone())))
        .collect();
    PodAffinityTerm {
        label_selector: Some(LabelSelector {
            match_labels: Some(of_attempt),
            ..LabelSelector::default()
        }),
        topology_key: HOSTNAME_LABEL.to_owned(),
        ..PodAffinityTerm::default()
    }
}

/// An affinity among an attempt's pods on the topology's level: each pod goes to the
/// domain where the attempt's others are (required), or prefers it (preferred).
fn keep_together(pod: &mut PodSpec, labels: &BTreeMap<String, String>, t: &Topology) {
    let term = PodAffinityTerm {
        topology_key: t.level.clone(),
        ..one_per_node(labels)
    };
    let affinity = pod
        .affinity
        .get_or_insert_with(Affinity::default)
        .pod_affinity
        .get_or_insert_with(PodAffinity::default);
    match t.mode {
        TopologyMode::Required => affinity
            .required_during_scheduling_ignored_during_execution
            .get_or_insert_with(Vec::new)
            .push(term),
        TopologyMode::Preferred => affinity
            .preferred_during_scheduling_ignored_during_execution
            .get_or_insert_with(Vec::new)
            .push(WeightedPodAffinityTerm {
                weight: 100,
                pod_affinity_term: term,
            }),
    }
}

/// The node label every kubelet sets to its node's name.
const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

/// The annotation in which the Job controller gives each pod of an Indexed Job its index.
pub const COMPLETION_INDEX: &str = "batch.kubernetes.io/job-completion-index";

/// The attempt's pod: the GpuJob's pod template with the operator's part on top (its
/// labels, restartPolicy, the GPU toleration, node selectors, service account and the
/// `main` container; for a multi-node attempt the subdomain and the ranks' env).
fn pod(
    spec: &GpuJobSpec,
    attempt: i32,
    job: &str,
    labels: BTreeMap<String, String>,
    template: PodTemplateSpec,
    multi: Option<MultiNode<'_>>,
) -> PodTemplateSpec {
    let meta = template.metadata.unwrap_or_default();
    let mut pod_labels: BTreeMap<String, String> = meta
        .labels
        .unwrap_or_default()
        .into_iter()
        .filter(|(k, _)| !k.starts_with(LABEL_PREFIX))
        .collect();
    pod_labels.extend(labels);
    let mut pod = template.spec.unwrap_or_default();
    let mut containers = std::mem::take(&mut pod.containers);
    let base = containers
        .iter()
        .position(|c| c.name == CONTAINER_NAME)
        .map(|i| containers.remove(i))
        .unwrap_or_default();
    containers.insert(0, main_container(spec, attempt, base, multi));
    pod.containers = containers;
    if let Some(m) = multi {
        pod.subdomain = Some(m.job.to_owned());
        // The Job controller names each pod's host `<job>-<index>`.
        pod.hostname = None;
        let affinity = pod.affinity.get_or_insert_with(Affinity::default);
        let anti = affinity
            .pod_anti_affinity
            .get_or_insert_with(PodAntiAffinity::default);
        anti.required_during_scheduling_ignored_during_execution
            .get_or_insert_with(Vec::new)
            .push(one_per_node(&pod_labels));
    }
    let mut pod_annotations = meta.annotations.unwrap_or_default();
    if let Some(t) = spec.topology() {
        if spec.queue_name().is_some() {
            // Kueue places the pod set in one domain as it admits it.
            let (key, level) = t.kueue_annotation();
            pod_annotations.insert(key.to_owned(), level.to_owned());
        } else {
            // Without Kueue, kube-scheduler keeps the pods together by affinity (and, in
            // a gang, by its PodGroup's constraint: `crate::gang`).
            keep_together(&mut pod, &pod_labels, t);
        }
    }
    if spec.devices().is_some() {
        // Each pod gets a ResourceClaim of its own from the attempt's template (named like
        // the Job: `crate::claims`), made before any of its pods is let go.
        let mut claims = vec![PodResourceClaim {
            name: DEVICE_REQUEST.to_owned(),
            resource_claim_template_name: spec.devices().map(|d| claim_template_name(job, d)),
            resource_claim_name: None,
        }];
        claims.extend(
            pod.resource_claims
                .take()
                .into_iter()
                .flatten()
                .filter(|c| c.name != DEVICE_REQUEST),
        );
        pod.resource_claims = Some(claims);
    }
    pod.restart_policy = Some("Never".to_owned());
    // The operator's gate first; a template's own gates (another scheduler's, Kueue's)
    // stay beside it.
    let mut gates = vec![PodSchedulingGate {
        name: SCHEDULING_GATE.to_owned(),
    }];
    gates.extend(
        pod.scheduling_gates
            .take()
            .into_iter()
            .flatten()
            .filter(|g| g.name != SCHEDULING_GATE),
    );
    pod.scheduling_gates = Some(gates);
    let mut tolerations = vec![gpu_toleration()];
    tolerations.extend(
        pod.tolerations
            .take()
            .into_iter()
            .flatten()
            .filter(|t| *t != gpu_toleration()),
    );
    pod.tolerations = Some(tolerations);
    let mut node_selector = pod.node_selector.take().unwrap_or_default();
    node_selector.extend(spec.node_selector.clone());
    if let Some(product) = spec.v2.as_ref().and_then(|v2| v2.gpu_product.as_ref()) {
        node_selector.insert(LABEL_GPU_PRODUCT.to_owned(), product.clone());
    }
    pod.node_selector = (!node_selector.is_empty()).then_some(node_selector);
    pod.service_account_name = spec.service_account_name.clone();
    pod.service_account = None;
    PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(pod_labels),
            annotations: (!pod_annotations.is_empty()).then_some(pod_annotations),
            ..ObjectMeta::default()
        }),
        spec: Some(pod),
    }
}

/// The operator's container: `base` (the template's container of that name: volume
/// mounts, CPU and memory, more env, …) with image, command, args, the GPUs and the
/// attempt number from the GpuJob (and a multi-node attempt's env: validation refuses
/// those names elsewhere, and the operator's values win here).
fn main_container(
    spec: &GpuJobSpec,
    attempt: i32,
    base: Container,
    multi: Option<MultiNode<'_>>,
) -> Container {
    let mut env: Vec<K8sEnvVar> = spec
        .env
        .iter()
        .map(|e| K8sEnvVar {
            name: e.name.clone(),
            value: Some(e.value.clone()),
            value_from: None,
        })
        .chain(base.env.into_iter().flatten())
        .filter(|e| e.name != ENV_ATTEMPT)
        .filter(|e| multi.is_none() || !MULTI_NODE_ENV.contains(&e.name.as_str()))
        .collect();
    env.push(K8sEnvVar {
        name: ENV_ATTEMPT.to_owned(),
        value: Some(attempt.to_string()),
        value_from: None,
    });
    env.extend(multi.iter().flat_map(MultiNode::env));
    let mut resources = base.resources.unwrap_or_default();
    let mut limits = resources.limits.take().unwrap_or_default();
    if spec.devices().is_some() {
        // The GPUs come from the pod's claim, not the extended resource.
        limits.remove(GPU_RESOURCE);
        let mut claims = vec![ResourceClaim {
            name: DEVICE_REQUEST.to_owned(),
            request: None,
        }];
        claims.extend(
            resources
                .claims
                .take()
                .into_iter()
                .flatten()
                .filter(|c| c.name != DEVICE_REQUEST),
        );
        resources.claims = Some(claims);
    } else {
        limits.insert(GPU_RESOURCE.to_owned(), Quantity(spec.gpus.to_string()));
    }
    resources.limits = (!limits.is_empty()).then_some(limits);
    if let Some(requests) = resources.requests.as_mut() {
        // Only the GPU count of the spec is requested (validation refuses another).
        requests.remove(GPU_RESOURCE);
    }
    Container {
        name: CONTAINER_NAME.to_owned(),
        image: Some(spec.image.clone()),
        command: (!spec.command.is_empty()).then(|| spec.command.clone()),
        args: (!spec.args.is_empty()).then(|| spec.args.clone()),
        env: Some(env),
        resources: Some(resources),
        ..base
    }
}

/// The controller owner reference from a Job to its GpuJob: the Job is garbage-collected
/// with the GpuJob, and Job events find their GpuJob through it.
pub fn owner_reference(gpujob: &GpuJob) -> OwnerReference {
    OwnerReference {
        api_version: GpuJob::api_version(&()).into_owned(),
        kind: GpuJob::kind(&()).into_owned(),
        name: gpujob.name_any_or_empty(),
        uid: gpujob.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// The GpuJob that controls `job`: its controller owner reference of kind GpuJob (not
/// merely its labels, which anyone can set). The one owner check.
pub fn controller_of(job: &Job) -> Option<&OwnerReference> {
    job.metadata.owner_references.iter().flatten().find(|o| {
        o.controller == Some(true) && o.kind == "GpuJob" && o.api_version.starts_with("gpujob.dev/")
    })
}

/// Whether `existing` has the controller owner (kind and uid) that `desired` names: the
/// object an earlier run of the create made for the same owner, not a foreign one under
/// the name. An object without a controller is never the same.
pub fn same_controller(existing: &ObjectMeta, desired: &ObjectMeta) -> bool {
    let controller = |m: &ObjectMeta| {
        m.owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true))
            .map(|o| (o.kind.clone(), o.uid.clone()))
    };
    controller(existing).is_some_and(|c| Some(c) == controller(desired))
}

/// Whether `job` is controlled by the GpuJob with `uid`.
pub fn is_controlled_by(job: &Job, uid: &str) -> bool {
    controller_of(job).is_some_and(|o| o.uid == uid)
}

/// What a Job-name conflict says, wherever it is found.
pub fn name_taken(ns: &str, name: &str) -> String {
    format!("Job {ns}/{name} exists and is not controlled by this GpuJob; delete or rename it")
}

/// The GpuJob generation a Job was built from, from its annotation.
pub fn generation_of(job: &Job) -> Option<i64> {
    job.metadata
        .annotations
        .as_ref()?
        .get(ANNOTATION_GENERATION)?
        .parse()
        .ok()
}

/// The attempt number a Job runs, from its label.
pub fn attempt_of(job: &Job) -> Option<i32> {
    job.metadata
        .labels
        .as_ref()?
        .get(LABEL_ATTEMPT)?
        .parse()
        .ok()
        .filter(|a| *a >= 1)
}

trait NameOrEmpty {
    fn name_any_or_empty(&self) -> String;
}

impl NameOrEmpty for GpuJob {
    fn name_any_or_empty(&self) -> String {
        self.metadata.name.clone().unwrap_or_default()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::api::EnvVar;
    use serde_json::json;

    pub(crate) fn gpujob(name: &str) -> GpuJob {
        let mut g = GpuJob::new(
            name,
            GpuJobSpec {
                image: "registry.example/train:1".into(),
                command: vec!["python".into()],
                args: vec!["train.py".into()],
                env: vec![
                    EnvVar {
                        name: "EPOCHS".into(),
                        value: "3".into(),
                    },
                    EnvVar {
                        name: ENV_ATTEMPT.into(),
                        value: "spoofed".into(),
                    },
                ],
                gpus: 2,
                max_retries: 3,
                active_deadline_seconds: Some(600),
                node_selector: BTreeMap::from([("gpu".into(), "a100".into())]),
                service_account_name: None,
                update_policy: Default::default(),
                suspend: false,
                ttl_seconds_after_finished: None,
                v2: None,
            },
        );
        g.metadata.namespace = Some("team-a".into());
        g.metadata.uid = Some("uid-1".into());
        g
    }

    #[test]
    fn short_names_are_name_dash_attempt() {
        assert_eq!(job_name("train", 1), "train-1");
        assert_eq!(job_name("train", 12), "train-12");
        assert_eq!(name_label("train"), "train");
    }

    #[test]
    fn long_names_are_truncated_with_a_hash_and_stay_unique_and_valid() {
        let base = "a".repeat(240);
        let one = format!("{base}-one.x");
        let two = format!("{base}-two.x");
        for attempt in [1, 9, 100] {
            let (a, b) = (job_name(&one, attempt), job_name(&two, attempt));
            assert!(a.len() <= 63 && b.len() <= 63, "{a} {b}");
            assert_ne!(a, b, "two GpuJobs must not share Job names");
            assert!(a.ends_with(&format!("-{attempt}")));
            assert_eq!(a, job_name(&one, attempt), "stable");
            assert!(valid_dns_label(&a), "{a}");
        }
        let (la, lb) = (name_label(&one), name_label(&two));
        assert_eq!(la.len(), 63);
        assert_ne!(la, lb);
        assert!(valid_dns_label(&la));
        // Exactly at the limit: unchanged.
        let sixty = "b".repeat(61);
        assert_eq!(job_name(&sixty, 1), format!("{sixty}-1"));
        assert_ne!(job_name(&sixty, 10), format!("{sixty}-10"));
        assert!(job_name(&sixty, 10).len() <= 63);
    }

    #[test]
    fn truncation_never_leaves_a_dash_or_dot_before_the_hash() {
        // Cut point falls on "-" and "." runs.
        let name = format!(
            "{}{}",
            "c".repeat(40),
            "-.-.-.-.-.-.-.-.-.-.-.-.-.-.-.-.-.-.-.-."
        );
        let label = name_label(&name);
        assert!(valid_dns_label(&label), "{label}");
        assert!(!label.contains("--"), "{label}");
    }

    fn valid_dns_label(s: &str) -> bool {
        s.len() <= 63
            && s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
            && s.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
            && s.chars().last().is_some_and(|c| c.is_ascii_alphanumeric())
    }

    #[test]
    fn the_job_runs_one_attempt_with_gpus_owner_and_labels() {
        let g = gpujob("train");
        let job = desired_job(&g, 2);
        assert_eq!(job.metadata.name.as_deref(), Some("train-2"));
        assert_eq!(job.metadata.namespace.as_deref(), Some("team-a"));
        let labels = job.metadata.labels.clone().unwrap();
        assert_eq!(labels[LABEL_NAME], "train");
        assert_eq!(labels[LABEL_UID], "uid-1");
        assert_eq!(labels[LABEL_ATTEMPT], "2");
        let owner = &job.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
            ("GpuJob", "uid-1", Some(true))
        );
        assert!(is_controlled_by(&job, "uid-1"));
        assert!(!is_controlled_by(&job, "uid-2"));
        assert_eq!(attempt_of(&job), Some(2));

        let spec = job.spec.unwrap();
        assert_eq!(spec.backoff_limit, Some(0));
        let rules = &spec.pod_failure_policy.as_ref().unwrap().rules;
        assert_eq!(rules.len(), 1, "the disruption rule alone");
        assert_eq!(rules[0].action, "FailJob");
        assert_eq!(
            rules[0].on_pod_conditions.as_ref().unwrap()[0].type_,
            "DisruptionTarget"
        );
        assert_eq!(spec.active_deadline_seconds, Some(600));
        let template = spec.template;
        assert_eq!(template.metadata.unwrap().labels.unwrap(), labels);
        let pod = template.spec.unwrap();
        assert_eq!(pod.restart_policy.as_deref(), Some("Never"));
        assert_eq!(
            pod.tolerations.unwrap()[0].key.as_deref(),
            Some(GPU_RESOURCE)
        );
        assert_eq!(pod.node_selector.unwrap()["gpu"], "a100");
        let c = &pod.containers[0];
        assert_eq!(c.image.as_deref(), Some("registry.example/train:1"));
        assert_eq!(c.command.as_deref(), Some(&["python".to_owned()][..]));
        assert_eq!(
            c.resources.as_ref().unwrap().limits.as_ref().unwrap()[GPU_RESOURCE].0,
            "2"
        );
        let env = c.env.as_ref().unwrap();
        let attempt: Vec<_> = env.iter().filter(|e| e.name == ENV_ATTEMPT).collect();
        assert_eq!(
            attempt.len(),
            1,
            "the operator's GPUJOB_ATTEMPT replaces the user's"
        );
        assert_eq!(attempt[0].value.as_deref(), Some("2"));
        assert!(env.iter().any(|e| e.name == "EPOCHS"));
    }

    #[test]
    fn a_multi_node_attempt_is_an_indexed_job_whose_pods_know_their_ranks() {
        let mut g = gpujob("train");
        g.spec.v2 = Some(crate::api::V2Only {
            nodes: Some(4),
            ..crate::api::V2Only::default()
        });
        let job = desired_job(&g, 2);
        let spec = job.spec.unwrap();
        assert_eq!(spec.completion_mode.as_deref(), Some("Indexed"));
        assert_eq!((spec.completions, spec.parallelism), (Some(4), Some(4)));
        assert_eq!(
            spec.backoff_limit,
            Some(0),
            "one pod's failure fails the attempt"
        );
        let pod = spec.template.spec.unwrap();
        assert_eq!(pod.subdomain.as_deref(), Some("train-2"));
        let c = &pod.containers[0];
        assert_eq!(
            c.resources.as_ref().unwrap().limits.as_ref().unwrap()[GPU_RESOURCE].0,
            "2",
            "GPUs are per node"
        );
        let env = c.env.as_ref().unwrap();
        let value = |name: &str| {
            let found: Vec<_> = env.iter().filter(|e| e.name == name).collect();
            assert_eq!(found.len(), 1, "{name} once: {env:?}");
            found[0].clone()
        };
        assert_eq!(value(ENV_WORLD_SIZE).value.as_deref(), Some("4"));
        assert_eq!(
            value(ENV_MASTER_ADDR).value.as_deref(),
            Some("train-2-0.train-2")
        );
        assert_eq!(value(ENV_MASTER_PORT).value.as_deref(), Some("29500"));
        let rank = value(ENV_RANK);
        let field = rank.value_from.unwrap().field_ref.unwrap().field_path;
        assert_eq!(field, format!("metadata.annotations['{COMPLETION_INDEX}']"));
        let terms = pod
            .affinity
            .unwrap()
            .pod_anti_affinity
            .unwrap()
            .required_during_scheduling_ignored_during_execution
            .unwrap();
        assert_eq!(terms.len(), 1);
        assert_eq!(terms[0].topology_key, "kubernetes.io/hostname");
        let selector = terms[0]
            .label_selector
            .clone()
            .unwrap()
            .match_labels
            .unwrap();
        assert_eq!(
            selector,
            BTreeMap::from([
                (LABEL_UID.to_owned(), "uid-1".to_owned()),
                (LABEL_ATTEMPT.to_owned(), "2".to_owned()),
            ]),
            "one pod of the attempt per node"
        );
    }

    #[test]
    fn an_attempt_of_dra_devices_claims_them_from_its_template_not_nvidia_gpus() {
        let mut g = gpujob("train");
        let devices = serde_json::json!({"firstAvailable": [
            {"name": "h200", "deviceClassName": "gpu.example.com", "count": 2},
            {"name": "h100", "deviceClassName": "gpu.example.com", "count": 4},
        ]});
        g.spec.gpus = 4;
        g.spec.v2 = Some(crate::api::V2Only {
            devices: Some(serde_json::from_value(devices.clone()).unwrap()),
            nodes: Some(2),
            template: Some(serde_json::json!({"spec": {
                "resourceClaims": [{"name": "scratch", "resourceClaimName": "shared"}],
                "containers": [{"name": "main", "resources": {
                    "limits": {"memory": "1Gi"}, "claims": [{"name": "scratch"}]}}],
            }})),
            ..crate::api::V2Only::default()
        });
        let job = desired_job(&g, 2);
        let pod = job.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
        let claims = pod.resource_claims.as_ref().unwrap();
        assert_eq!(claims[0].name, "gpus");
        assert_eq!(
            claims[0].resource_claim_template_name,
            Some(claim_template_name("train-2", g.spec.devices().unwrap())),
            "the attempt's template, named after its Job and its request"
        );
        assert_eq!(
            crate::claims::template(&g, 2).unwrap().metadata.name,
            claims[0].resource_claim_template_name,
            "the template the plan makes is the one the pods name"
        );
        assert_eq!(claims[1].name, "scratch", "the template's own claims stay");
        let main = &pod.containers[0];
        let resources = main.resources.as_ref().unwrap();
        let names: Vec<&str> = resources
            .claims
            .iter()
            .flatten()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(names, vec!["gpus", "scratch"]);
        let limits = resources.limits.as_ref().unwrap();
        assert!(!limits.contains_key(GPU_RESOURCE), "{limits:?}");
        assert_eq!(limits["memory"].0, "1Gi");
        let annotation = &job.metadata.annotations.as_ref().unwrap()[ANNOTATION_DEVICES];
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(annotation).unwrap(),
            devices
        );
        assert_eq!(gpus(&job), Some(8), "the largest count on each of 2 nodes");
        assert_eq!(
            crate::seen_job::SeenJob::of(&job).unwrap().devices,
            g.spec.devices().cloned()
        );
    }

    #[test]
    fn a_topology_is_kueues_annotation_with_a_queue_and_an_affinity_without() {
        use crate::api::{
            KUEUE_PREFERRED_TOPOLOGY, KUEUE_REQUIRED_TOPOLOGY, Topology, TopologyMode,
        };
        const RACK: &str = "topology.example.com/rack";
        let with = |queue: Option<&str>, mode: TopologyMode| {
            let mut g = gpujob("train");
            g.spec.v2 = Some(crate::api::V2Only {
                nodes: Some(2),
                queue_name: queue.map(str::to_owned),
                topology: Some(Topology {
                    level: RACK.into(),
                    mode,
                }),
                ..crate::api::V2Only::default()
            });
            desired_job(&g, 1)
        };
        let pod_of = |job: &Job| job.spec.clone().unwrap().template;

        let queued = pod_of(&with(Some("team"), TopologyMode::Required));
        let annotations = queued.metadata.unwrap().annotations.unwrap();
        assert_eq!(annotations[KUEUE_REQUIRED_TOPOLOGY], RACK);
        let affinity = queued.spec.unwrap().affinity.unwrap();
        assert!(
            affinity.pod_affinity.is_none(),
            "Kueue places it: {affinity:?}"
        );
        let queued = pod_of(&with(Some("team"), TopologyMode::Preferred));
        assert_eq!(
            queued.metadata.unwrap().annotations.unwrap()[KUEUE_PREFERRED_TOPOLOGY],
            RACK
        );

        let job = with(None, TopologyMode::Required);
        assert_eq!(topology(&job).unwrap().level, RACK, "the Job says it");
        let pod = pod_of(&job);
        assert!(pod.metadata.unwrap().annotations.is_none());
        let together = pod.spec.unwrap().affinity.unwrap().pod_affinity.unwrap();
        let term = &together
            .required_during_scheduling_ignored_during_execution
            .unwrap()[0];
        assert_eq!(term.topology_key, RACK);
        let selector = term.label_selector.clone().unwrap().match_labels.unwrap();
        assert_eq!(selector[LABEL_ATTEMPT], "1", "the attempt's own pods");
        let preferred = pod_of(&with(None, TopologyMode::Preferred))
            .spec
            .unwrap()
            .affinity
            .unwrap()
            .pod_affinity
            .unwrap()
            .preferred_during_scheduling_ignored_during_execution
            .unwrap();
        assert_eq!(preferred[0].pod_affinity_term.topology_key, RACK);
    }

    #[test]
    fn an_object_is_the_same_only_with_the_same_controller() {
        let meta = |refs: serde_json::Value| -> ObjectMeta {
            serde_json::from_value(serde_json::json!({"ownerReferences": refs})).unwrap()
        };
        let owner = |kind: &str, uid: &str, controller: bool| {
            serde_json::json!({"apiVersion": "v1", "kind": kind, "name": "n", "uid": uid,
                               "controller": controller})
        };
        let desired = meta(serde_json::json!([owner("Job", "u1", true)]));
        assert!(same_controller(
            &meta(serde_json::json!([owner("Job", "u1", true)])),
            &desired
        ));
        assert!(!same_controller(
            &meta(serde_json::json!([owner("Job", "u2", true)])),
            &desired
        ));
        assert!(!same_controller(
            &meta(serde_json::json!([owner("GpuJob", "u1", true)])),
            &desired
        ));
        assert!(
            !same_controller(
                &meta(serde_json::json!([owner("Job", "u1", false)])),
                &desired
            ),
            "an owner that is not the controller"
        );
        assert!(!same_controller(&ObjectMeta::default(), &desired));
        assert!(!same_controller(&desired, &ObjectMeta::default()));
    }

    #[test]
    fn a_one_node_attempt_is_a_plain_job() {
        let spec = desired_job(&gpujob("train"), 1).spec.unwrap();
        assert_eq!(spec.completion_mode, None);
        assert_eq!((spec.completions, spec.parallelism), (None, None));
        let pod = spec.template.spec.unwrap();
        assert_eq!(pod.subdomain, None);
        assert_eq!(pod.affinity, None);
        let env = pod.containers[0].env.clone().unwrap();
        assert!(
            !env.iter()
                .any(|e| MULTI_NODE_ENV.contains(&e.name.as_str())),
            "{env:?}"
        );
    }

    fn with_template(template: serde_json::Value, product: Option<&str>) -> GpuJob {
        let mut g = gpujob("train");
        g.spec.v2 = Some(crate::api::V2Only {
            template: Some(template),
            gpu_product: product.map(str::to_owned),
            ..Default::default()
        });
        g
    }

    #[test]
    fn an_empty_template_changes_nothing() {
        let plain = desired_job(&gpujob("train"), 3);
        assert_eq!(desired_job(&with_template(json!({}), None), 3), plain);
        assert_eq!(
            desired_job(&with_template(json!({"metadata": {}, "spec": {}}), None), 3),
            plain
        );
    }

    #[test]
    fn the_template_adds_to_the_pod_and_the_operator_keeps_its_part() {
        let template = json!({
            "metadata": {
                "labels": {"team": "ml", LABEL_ATTEMPT: "99"},
                "annotations": {"prometheus.io/scrape": "true"},
            },
            "spec": {
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "ds"}}],
                "tolerations": [
                    {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"},
                    {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"},
                ],
                "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [
                        {"key": "zone", "operator": "In", "values": ["a"]}]}]}}},
                "priorityClassName": "high",
                "imagePullSecrets": [{"name": "regcred"}],
                "securityContext": {"runAsNonRoot": true},
                "nodeSelector": {"pool": "gpu"},
                "initContainers": [{"name": "fetch", "image": "busybox"}],
                "containers": [
                    {"name": "sidecar", "image": "log:1"},
                    {"name": CONTAINER_NAME,
                     "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                     "env": [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
                     "resources": {"requests": {"cpu": 4, "memory": "32Gi"}, "limits": {"memory": "64Gi"}}},
                ],
            },
        });
        let job = desired_job(&with_template(template, Some("NVIDIA-A100-SXM4-80GB")), 2);
        let pod = job.spec.unwrap().template;
        let meta = pod.metadata.unwrap();
        let labels = meta.labels.unwrap();
        assert_eq!(labels["team"], "ml");
        assert_eq!(labels[LABEL_ATTEMPT], "2", "the operator's labels win");
        assert_eq!(labels[LABEL_UID], "uid-1");
        assert_eq!(meta.annotations.unwrap()["prometheus.io/scrape"], "true");
        let pod = pod.spec.unwrap();
        assert_eq!(pod.restart_policy.as_deref(), Some("Never"));
        assert_eq!(pod.volumes.unwrap()[0].name, "data");
        assert_eq!(pod.priority_class_name.as_deref(), Some("high"));
        assert_eq!(pod.image_pull_secrets.unwrap()[0].name, "regcred");
        assert_eq!(pod.security_context.unwrap().run_as_non_root, Some(true));
        assert!(pod.affinity.is_some());
        let tolerations = pod.tolerations.unwrap();
        assert_eq!(
            tolerations.len(),
            2,
            "the GPU toleration once: {tolerations:?}"
        );
        assert_eq!(tolerations[0].key.as_deref(), Some(GPU_RESOURCE));
        assert_eq!(tolerations[1].key.as_deref(), Some("dedicated"));
        let selector = pod.node_selector.unwrap();
        assert_eq!(
            selector,
            BTreeMap::from([
                ("gpu".to_owned(), "a100".to_owned()),
                ("pool".to_owned(), "gpu".to_owned()),
                (
                    LABEL_GPU_PRODUCT.to_owned(),
                    "NVIDIA-A100-SXM4-80GB".to_owned()
                ),
            ])
        );
        assert_eq!(pod.init_containers.unwrap()[0].name, "fetch");
        let names: Vec<_> = pod.containers.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            [CONTAINER_NAME, "sidecar"],
            "the operator's container first"
        );
        let main = &pod.containers[0];
        assert_eq!(main.image.as_deref(), Some("registry.example/train:1"));
        assert_eq!(main.volume_mounts.as_ref().unwrap()[0].mount_path, "/data");
        let resources = main.resources.as_ref().unwrap();
        assert_eq!(resources.requests.as_ref().unwrap()["cpu"].0, "4");
        let limits = resources.limits.as_ref().unwrap();
        assert_eq!(
            (limits["memory"].0.as_str(), limits[GPU_RESOURCE].0.as_str()),
            ("64Gi", "2")
        );
        let env: Vec<_> = main
            .env
            .as_ref()
            .unwrap()
            .iter()
            .map(|e| e.name.as_str())
            .collect();
        assert_eq!(env, ["EPOCHS", "TOKEN", ENV_ATTEMPT]);
    }

    #[test]
    fn the_gpu_product_selects_nodes_without_a_template() {
        let mut g = gpujob("train");
        g.spec.v2 = Some(crate::api::V2Only {
            gpu_product: Some("NVIDIA-H100".into()),
            ..Default::default()
        });
        let pod = desired_job(&g, 1).spec.unwrap().template.spec.unwrap();
        assert_eq!(pod.node_selector.unwrap()[LABEL_GPU_PRODUCT], "NVIDIA-H100");
    }

    #[test]
    fn template_decode_errors_name_the_field_under_spec_template() {
        let g = with_template(json!({"spec": {"tolerations": [{"key": 1}]}}), None);
        let e = pod_template(&g.spec).unwrap_err();
        assert_eq!(e.path, "spec.template.spec.tolerations[0].key");
        assert!(e.message.contains("invalid type: integer `1`"), "{e}");
        // Such a spec gets no Job from the plan; built anyway, the template is left out.
        assert_eq!(desired_job(&g, 1), desired_job(&gpujob("train"), 1));
    }

    #[test]
    fn attempt_label_must_be_a_positive_number() {
        let mut job = desired_job(&gpujob("t"), 1);
        job.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(LABEL_ATTEMPT.into(), "zero".into());
        assert_eq!(attempt_of(&job), None);
        job.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(LABEL_ATTEMPT.into(), "0".into());
        assert_eq!(attempt_of(&job), None);
    }
}
