//! Pure: the Job that runs attempt k of a GpuJob, and the names and labels that tie
//! Jobs back to their GpuJob.

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    Container, EnvVar as K8sEnvVar, PodSpec, PodTemplateSpec, ResourceRequirements, Toleration,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Resource;

use crate::api::{
    ANNOTATION_GENERATION, ENV_ATTEMPT, GPU_RESOURCE, GpuJob, LABEL_ATTEMPT, LABEL_NAME, LABEL_UID,
};
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

/// The Job that runs `attempt` of `gpujob`.
pub fn desired_job(gpujob: &GpuJob, attempt: i32) -> Job {
    let spec = &gpujob.spec;
    let labels = labels(gpujob, attempt);
    let mut env: Vec<K8sEnvVar> = spec
        .env
        .iter()
        .filter(|e| e.name != ENV_ATTEMPT)
        .map(|e| K8sEnvVar {
            name: e.name.clone(),
            value: Some(e.value.clone()),
            value_from: None,
        })
        .collect();
    env.push(K8sEnvVar {
        name: ENV_ATTEMPT.to_owned(),
        value: Some(attempt.to_string()),
        value_from: None,
    });
    let gpus = Quantity(spec.gpus.to_string());
    let container = Container {
        name: CONTAINER_NAME.to_owned(),
        image: Some(spec.image.clone()),
        command: (!spec.command.is_empty()).then(|| spec.command.clone()),
        args: (!spec.args.is_empty()).then(|| spec.args.clone()),
        env: Some(env),
        resources: Some(ResourceRequirements {
            limits: Some(BTreeMap::from([(GPU_RESOURCE.to_owned(), gpus)])),
            ..ResourceRequirements::default()
        }),
        ..Container::default()
    };
    Job {
        metadata: ObjectMeta {
            name: Some(job_name(&gpujob.name_any_or_empty(), attempt)),
            namespace: gpujob.metadata.namespace.clone(),
            labels: Some(labels.clone()),
            // Which spec this attempt runs: a later spec change is seen against it.
            annotations: gpujob
                .metadata
                .generation
                .map(|g| BTreeMap::from([(ANNOTATION_GENERATION.to_owned(), g.to_string())])),
            owner_references: Some(vec![owner_reference(gpujob)]),
            ..ObjectMeta::default()
        },
        spec: Some(JobSpec {
            // One Job per attempt: retries belong to the GpuJob, not the Job controller.
            backoff_limit: Some(0),
            active_deadline_seconds: spec.active_deadline_seconds,
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    restart_policy: Some("Never".to_owned()),
                    containers: vec![container],
                    tolerations: Some(vec![Toleration {
                        key: Some(GPU_RESOURCE.to_owned()),
                        operator: Some("Exists".to_owned()),
                        effect: Some("NoSchedule".to_owned()),
                        ..Toleration::default()
                    }]),
                    node_selector: (!spec.node_selector.is_empty())
                        .then(|| spec.node_selector.clone()),
                    service_account_name: spec.service_account_name.clone(),
                    ..PodSpec::default()
                }),
            },
            ..JobSpec::default()
        }),
        status: None,
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
    use crate::api::{EnvVar, GpuJobSpec};

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
