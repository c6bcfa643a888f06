//! Gangs (`crate::gang`): where kube-apiserver serves PodGroups, a multi-node attempt's
//! pods name one, and the gate makes it before any of them goes.

use super::gate::{LATER, Seen, kinds, pod};
use super::*;
use crate::api::{Topology, TopologyMode};

fn gang_settings() -> PlanSettings {
    PlanSettings {
        gang: true,
        ..settings()
    }
}

fn multi(nodes: i32) -> GpuJob {
    let mut g = gpujob(3);
    g.spec.v2 = Some(V2Only {
        nodes: Some(nodes),
        topology: Some(Topology {
            level: "topology.example.com/rack".into(),
            mode: TopologyMode::Required,
        }),
        ..V2Only::default()
    });
    g
}

fn created_job(p: &Plan) -> &Job {
    p.actions
        .iter()
        .find_map(|a| match a {
            Action::CreateJob { job, .. } => Some(job.as_ref()),
            _ => None,
        })
        .unwrap()
}

fn group_of(job: &Job) -> Option<String> {
    crate::job::pod_group(job)
}

#[test]
fn a_multi_node_attempts_pods_name_their_gang_only_where_pod_groups_are_served() {
    let g = multi(3);
    let p = run_with_settings(&g, &gang_settings());
    assert_eq!(group_of(created_job(&p)).as_deref(), Some("train-1"));
    let p = run_with_settings(&g, &settings());
    assert_eq!(group_of(created_job(&p)), None, "not served: no group");

    // One pod is no gang.
    let mut one = gpujob(3);
    one.spec.v2 = Some(V2Only::default());
    let p = run_with_settings(&one, &gang_settings());
    assert_eq!(group_of(created_job(&p)), None);
}

/// Attempt 1 of a three-node gang, made and recorded, its pods waiting at the gate.
fn made_gang() -> (GpuJob, Job) {
    let g = multi(3);
    let p = run_with_settings(&g, &gang_settings());
    let mut job = created_job(&p).clone();
    job.metadata.uid = Some("job-uid-1".into());
    job.metadata.resource_version = Some("101".into());
    (with_status(g, &p), job)
}

/// `g`'s plan with no Job yet.
fn run_with_settings(g: &GpuJob, settings: &PlanSettings) -> Plan {
    plan(&observed(g, &[], T0), settings)
}

#[test]
fn the_gang_exists_before_any_of_its_pods_goes_and_a_foreign_one_holds_them() {
    let (g, job) = made_gang();
    let jobs = [job];
    let pods = [pod(1, 0), pod(1, 1), pod(1, 2)];
    let p = Seen::new(&g, &jobs).cached(&pods).read(&pods).plan(LATER);
    assert_eq!(
        kinds(&p),
        vec![
            "CreateService",
            "CreatePodGroup",
            "UngatePod",
            "UngatePod",
            "UngatePod"
        ]
    );
    let Some(Action::CreatePodGroup { attempt: 1, group }) = p.actions.get(1) else {
        panic!("{:?}", p.actions)
    };
    assert_eq!(group.metadata.name.as_deref(), Some("train-1"));
    assert_eq!(
        group.data["spec"]["schedulingPolicy"]["gang"]["minCount"],
        3
    );
    assert_eq!(
        group.data["spec"]["schedulingConstraints"]["topology"][0]["key"],
        "topology.example.com/rack"
    );

    // A foreign PodGroup under its name: no pod goes; said, and looked at again.
    let message = "PodGroup ns/train-1 exists and is not this multi-node attempt's".to_owned();
    let jobs_seen = seen(&jobs);
    let p = plan(
        &Observed {
            refused: Some(Refusal {
                attempt: 1,
                reason: POD_GROUP_NAME_CONFLICT,
                message: message.clone(),
            }),
            pods: Some(pods.to_vec()),
            cached_pods: pods.iter().collect(),
            ..observed(&g, &jobs_seen, LATER)
        },
        &gang_settings(),
    );
    assert!(
        !p.actions
            .iter()
            .any(|a| matches!(a, Action::UngatePod { .. })),
        "{:?}",
        p.actions
    );
    assert_eq!(ready(&p).1, POD_GROUP_NAME_CONFLICT);
    assert_eq!(p.status.last_error.as_deref(), Some(message.as_str()));
    assert_eq!(p.next, Next::After(settings().name_conflict_retry));
}
