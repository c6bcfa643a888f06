//! Pure: the Job that runs attempt k of a GpuJob, and the names and labels that tie
//! Jobs back to their GpuJob.

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{Container, EnvVar as K8sEnvVar, PodTemplateSpec, Toleration};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Resource;

use crate::api::decode::{DecodeError, decode, join};
use crate::api::{
    ANNOTATION_FAILURE_RULES, ANNOTATION_GENERATION, ENV_ATTEMPT, GPU_RESOURCE, GpuJob, GpuJobSpec,
    LABEL_ATTEMPT, LABEL_GPU_PRODUCT, LABEL_NAME, LABEL_PREFIX, LABEL_UID,
};
use crate::failure_policy;
use crate::hash::fnv1a64;

/// Longest Job name: the Job controller copies it into the pods' `job-name` label, whose
/// values are limited to 63 characters.
const MAX_JOB_NAME: usize = 63;
const MAX_LABEL_VALUE: usize = 63;
pub const CONTAINER_NAME: &str = "main";
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

/// The Job that runs `attempt` of `gpujob`, created suspended: its pods exist only once
/// the shard's holder starts it ([`started`]), so a create delivered late (sent by a
/// replica that then lost the shard) brings back a Job that runs nothing until the plan
/// deletes it as a stray. Expects a spec that passed validation: a
/// pod template that does not decode is left out here (validation reports it, and no
/// Job is made for such a spec), and what validation refuses in a template (the fields
/// the operator owns) is overwritten.
pub fn desired_job(gpujob: &GpuJob, attempt: i32) -> Job {
    let spec = &gpujob.spec;
    let labels = labels(gpujob, attempt);
    let template = pod_template(spec).ok().flatten().unwrap_or_default();
    Job {
        metadata: ObjectMeta {
            name: Some(job_name(&gpujob.name_any_or_empty(), attempt)),
            namespace: gpujob.metadata.namespace.clone(),
            labels: Some(labels.clone()),
            // Which spec this attempt runs: a later spec change is seen against it.
            annotations: annotations(gpujob),
            owner_references: Some(vec![owner_reference(gpujob)]),
            ..ObjectMeta::default()
        },
        spec: Some(JobSpec {
            // One Job per attempt: retries belong to the GpuJob, not the Job controller.
            backoff_limit: Some(0),
            pod_failure_policy: Some(failure_policy::pod_failure_policy(spec)),
            suspend: Some(true),
            active_deadline_seconds: spec.active_deadline_seconds,
            template: pod(spec, attempt, labels, template),
            ..JobSpec::default()
        }),
        status: None,
    }
}

/// The Job's annotations: the generation it runs, and what its failure rules mean.
fn annotations(gpujob: &GpuJob) -> Option<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    if let Some(g) = gpujob.metadata.generation {
        out.insert(ANNOTATION_GENERATION.to_owned(), g.to_string());
    }
    if let Some(rules) = failure_policy::annotation(&gpujob.spec) {
        out.insert(ANNOTATION_FAILURE_RULES.to_owned(), rules);
    }
    (!out.is_empty()).then_some(out)
}

/// Whether the holder has started `job` (or it was made before Jobs were created
/// suspended): `spec.suspend` is not true.
pub fn started(job: &Job) -> bool {
    job.spec.as_ref().and_then(|s| s.suspend) != Some(true)
}

/// The attempt's pod: the GpuJob's pod template with the operator's part on top (its
/// labels, restartPolicy, the GPU toleration, node selectors, service account and the
/// `main` container).
fn pod(
    spec: &GpuJobSpec,
    attempt: i32,
    labels: BTreeMap<String, String>,
    template: PodTemplateSpec,
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
    containers.insert(0, main_container(spec, attempt, base));
    pod.containers = containers;
    pod.restart_policy = Some("Never".to_owned());
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
            annotations: meta.annotations.filter(|a| !a.is_empty()),
            ..ObjectMeta::default()
        }),
        spec: Some(pod),
    }
}

/// The operator's container: `base` (the template's container of that name: volume
/// mounts, CPU and memory, more env, …) with image, command, args, the GPUs and the
/// attempt number from the GpuJob.
fn main_container(spec: &GpuJobSpec, attempt: i32, base: Container) -> Container {
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
        .collect();
    env.push(K8sEnvVar {
        name: ENV_ATTEMPT.to_owned(),
        value: Some(attempt.to_string()),
        value_from: None,
    });
    let mut resources = base.resources.unwrap_or_default();
    let mut limits = resources.limits.take().unwrap_or_default();
    limits.insert(GPU_RESOURCE.to_owned(), Quantity(spec.gpus.to_string()));
    resources.limits = Some(limits);
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
