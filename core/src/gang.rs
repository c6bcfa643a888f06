//! Pure: the PodGroup that makes a multi-node attempt's pods one gang, where
//! kube-apiserver serves `scheduling.k8s.io/v1beta1` (Kubernetes 1.37 with the feature
//! gate `GenericWorkload`): kube-scheduler places all of its pods at once or none of them,
//! so a partial attempt never holds GPUs waiting for the rest. One per attempt, named
//! like its Job (the pods join it by `spec.schedulingGroup.podGroupName`), owned by the
//! Job (the garbage collector deletes it with the Job), with a gang of all of the
//! attempt's pods and, for `topology` `Required`, the level they must share
//! (`schedulingConstraints.topology`, which kube-apiserver keeps only with the gate
//! `TopologyAwareWorkloadScheduling`; without it the pods' affinity still holds them in
//! one domain). The pods name their group at creation and kube-scheduler reads it when
//! it places them, so, like the multi-node Service, it is made before any pod is let go;
//! one under that name the operator did not make holds the pods at the gate.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use serde_json::json;

use crate::api::{LABEL_ATTEMPT, LABEL_NAME, LABEL_UID, TopologyMode};
use crate::job::{MANAGED_BY, name_label};
use crate::seen_job::SeenJob;

/// Where PodGroups are served.
pub const GROUP: &str = "scheduling.k8s.io";
pub const VERSION: &str = "v1beta1";
pub const KIND: &str = "PodGroup";
pub const PLURAL: &str = "podgroups";

/// The API resource of PodGroups (k8s-openapi has no type for them yet).
pub fn resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, VERSION, KIND), PLURAL)
}

/// The PodGroup of `job`'s attempt; `None` unless its pods name one (`SeenJob::pod_group`)
/// and the Job has a uid, an attempt and more than one pod.
pub fn pod_group(job: &SeenJob) -> Option<DynamicObject> {
    let name = job.pod_group.clone()?;
    let pods = job.nodes?;
    let uid = job.uid.clone()?;
    let attempt = job.attempt?.to_string();
    let labels = BTreeMap::from([
        (LABEL_NAME.to_owned(), name_label(&job.owner)),
        (LABEL_UID.to_owned(), job.owner_uid.clone()),
        (LABEL_ATTEMPT.to_owned(), attempt),
        (MANAGED_BY.0.to_owned(), MANAGED_BY.1.to_owned()),
    ]);
    let mut spec = json!({"schedulingPolicy": {"gang": {"minCount": pods}}});
    if let Some(t) = job
        .topology
        .as_ref()
        .filter(|t| t.mode == TopologyMode::Required)
    {
        spec["schedulingConstraints"] = json!({"topology": [{"key": t.level}]});
    }
    let mut group = DynamicObject::new(&name, &resource()).within(&job.namespace);
    group.metadata = ObjectMeta {
        name: Some(name),
        namespace: Some(job.namespace.clone()),
        labels: Some(labels),
        owner_references: Some(vec![OwnerReference {
            api_version: "batch/v1".to_owned(),
            kind: "Job".to_owned(),
            name: job.name.clone(),
            uid,
            controller: Some(true),
            // Blocking the Job's deletion would need update rights on jobs/finalizers.
            block_owner_deletion: None,
        }]),
        ..ObjectMeta::default()
    };
    group.data = json!({"spec": spec});
    Some(group)
}

/// What a PodGroup name held by a foreign PodGroup says, wherever it is found.
pub fn name_taken(ns: &str, name: &str) -> String {
    format!(
        "PodGroup {ns}/{name} exists and is not this multi-node attempt's (not owned by its Job {name}); its pods would be scheduled as that group says, so they wait, not started; delete or rename that PodGroup"
    )
}

/// Whether `group` is the one of the Job with `job_uid` (its controller owner
/// reference), not a foreign PodGroup under the same name.
pub fn is_of_job(group: &DynamicObject, job_uid: &str) -> bool {
    group
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && o.kind == "Job" && o.uid == job_uid)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::api::{Topology, V2Only};
    use crate::job::{desired_job, join_gang};

    fn seen(nodes: Option<i32>, topology: Option<Topology>, gang: bool) -> SeenJob {
        let mut g = crate::job::tests::gpujob("train");
        g.spec.v2 = Some(V2Only {
            nodes,
            topology,
            ..V2Only::default()
        });
        let mut job = desired_job(&g, 3);
        if gang {
            join_gang(&mut job);
        }
        job.metadata.uid = Some("job-uid".into());
        SeenJob::of(&job).expect("controlled by a GpuJob")
    }

    fn rack(mode: TopologyMode) -> Option<Topology> {
        Some(Topology {
            level: "topology.example.com/rack".into(),
            mode,
        })
    }

    #[test]
    fn a_multi_node_attempt_in_a_gang_gets_a_pod_group_of_all_its_pods() {
        let group = pod_group(&seen(Some(4), rack(TopologyMode::Required), true)).unwrap();
        assert_eq!(group.metadata.name.as_deref(), Some("train-3"));
        assert_eq!(group.metadata.namespace.as_deref(), Some("team-a"));
        assert_eq!(
            group
                .types
                .as_ref()
                .map(|t| (t.api_version.as_str(), t.kind.as_str())),
            Some(("scheduling.k8s.io/v1beta1", "PodGroup"))
        );
        assert!(is_of_job(&group, "job-uid"));
        assert!(!is_of_job(&group, "another"));
        assert_eq!(
            group.data["spec"],
            json!({"schedulingPolicy": {"gang": {"minCount": 4}},
                   "schedulingConstraints": {"topology": [{"key": "topology.example.com/rack"}]}})
        );
        // A preference is the pods' affinity's, not the group's constraint.
        let group = pod_group(&seen(Some(4), rack(TopologyMode::Preferred), true)).unwrap();
        assert_eq!(
            group.data["spec"],
            json!({"schedulingPolicy": {"gang": {"minCount": 4}}})
        );
    }

    #[test]
    fn none_without_a_gang_or_for_one_pod() {
        assert!(pod_group(&seen(Some(4), None, false)).is_none());
        assert!(pod_group(&seen(None, None, true)).is_none());
    }
}
