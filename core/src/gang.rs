//! Pure: the PodGroup that makes a multi-node attempt's pods one gang, where
//! kube-apiserver serves `scheduling.k8s.io/v1beta1` (Kubernetes 1.37 with the feature
//! gate `GenericWorkload`): kube-scheduler places all of its pods at once or none of them,
//! so a partial attempt does not hold GPUs waiting for the rest
//! (`gang::with_room_for_all_but_one_pod_…` in tests/integration). One per attempt, named
//! like its Job (the pods join it by `spec.schedulingGroup.podGroupName`), owned by the
//! Job (the garbage collector deletes it with the Job), with a gang of all of the
//! attempt's pods and, for `topology` `Required`, the level they must share
//! (`schedulingConstraints.topology`, which kube-apiserver keeps only with the gate
//! `TopologyAwareWorkloadScheduling`; without it the pods' affinity still holds them in
//! one domain). The pods name their group at creation and kube-scheduler reads it when
//! it places them, so, like the multi-node Service, it is made before any pod is let go;
//! one under that name the operator did not make holds the pods at the gate.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use serde_json::json;

use crate::api::TopologyMode;
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
    let metadata = job.attempt_object_meta()?;
    let mut spec = json!({"schedulingPolicy": {"gang": {"minCount": pods}}});
    if let Some(t) = job
        .topology
        .as_ref()
        .filter(|t| t.mode == TopologyMode::Required)
    {
        spec["schedulingConstraints"] = json!({"topology": [{"key": t.level}]});
    }
    let mut group = DynamicObject::new(&name, &resource()).within(&job.namespace);
    // The pods name the group after their Job (`job::join_gang`).
    group.metadata = ObjectMeta {
        name: Some(name),
        ..metadata
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
        let owner = &group.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
            ("Job", "job-uid", Some(true))
        );
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
