//! GpuJobs queued through Kueue (`spec.queueName`), with the real Kueue controller
//! (`support::kueue`) on a control plane of the test's own, kube-scheduler and the fake
//! GPU nodes: each attempt's Job is handed to the LocalQueue suspended and runs only
//! once Kueue admits all of its pods against the ClusterQueue's GPUs; a GpuJob Kueue
//! holds says Queued, with Kueue's reason, and one Kueue preempts for a higher-priority
//! GpuJob is queued again in the same attempt, nothing counted. Without Kueue in the
//! cluster, the GpuJob says so instead of waiting silently.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use crate::support;

use std::time::Duration;

use gpujob_operator::api::{
    Condition, ConditionStatus, GpuJob, LABEL_KUEUE_QUEUE, LABEL_UID, Phase,
};
use gpujob_operator::controller::job::desired_job;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;
use support::attempts::AttemptWatch;
use support::kueue::{Kueue, gpu_queue, gpu_queue_named, kueue_crds, wait_defaulting, workload_of};
use support::{TestEnv, phase, sim_env, test_crd};

fn condition<'a>(g: &'a GpuJob, type_: &str) -> Option<&'a Condition> {
    g.status.as_ref()?.condition(type_)
}

fn reason_of(g: &GpuJob, type_: &str) -> Option<String> {
    condition(g, type_).map(|c| c.reason.clone())
}

/// The Jobs of the GpuJob with uid `uid`.
async fn jobs_of(env: &TestEnv, uid: &str) -> Vec<Job> {
    env.jobs()
        .list(&ListParams::default().labels(&format!("{LABEL_UID}={uid}")))
        .await
        .unwrap()
        .items
}

/// The GpuJob's pods that kwok runs.
async fn running_pods(env: &TestEnv, uid: &str) -> Vec<Pod> {
    env.running_pods(&format!("{LABEL_UID}={uid}")).await
}

#[tokio::test]
async fn gpujobs_queued_through_kueue_run_when_kueue_admits_all_their_pods() {
    let env = TestEnv::private_with_crds("kueue", vec![test_crd(), kueue_crds()]).await;
    let _kueue = Kueue::start(&env).await;
    // 8 GPUs in the ClusterQueue: one GpuJob of 8 at a time.
    gpu_queue(&env, 8).await;
    let mut settings = env.settings();
    settings.plan.limits.max_gpus = 16;
    let op = env.operator("kueue", settings).await;

    // Two nodes of 4 GPUs: one Workload of 2 pods, admitted together.
    let long = sim_env(&[("SIM_DURATION_SECONDS", "3600")]);
    let first = env
        .create(
            "pair",
            json!({"image": "i", "gpus": 4, "maxRetries": 0, "env": long,
                   "v2": {"nodes": 2, "queueName": "team"}}),
        )
        .await;
    let first_uid = first.metadata.uid.clone().unwrap();
    let running = env
        .wait_gpujob("pair", "admitted and running", |g| {
            phase(g) == Some(Phase::Running)
                && condition(g, "Admitted").is_some_and(|c| c.status == ConditionStatus::True)
        })
        .await;
    let admitted = condition(&running, "Admitted").unwrap();
    assert!(
        admitted.message.contains("attempt 1") && admitted.message.contains("team"),
        "{admitted:?}"
    );
    let jobs = jobs_of(&env, &first_uid).await;
    assert_eq!(jobs.len(), 1);
    let job = &jobs[0];
    assert_eq!(
        job.metadata
            .labels
            .as_ref()
            .unwrap()
            .get(LABEL_KUEUE_QUEUE)
            .map(String::as_str),
        Some("team"),
        "handed to the LocalQueue"
    );
    let workload = workload_of(&env, job.metadata.uid.as_deref().unwrap())
        .await
        .expect("Kueue made a Workload for the attempt's Job");
    let assignment = &workload["status"]["admission"]["podSetAssignments"][0];
    assert_eq!(
        assignment["count"], 2,
        "both pods admitted at once: {workload}"
    );
    assert_eq!(
        assignment["resourceUsage"]["nvidia.com/gpu"], "8",
        "{workload}"
    );
    let pods = devcluster::wait::until(
        "both pods of the admitted attempt running",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async {
            let pods = running_pods(&env, &first_uid).await;
            (pods.len() == 2).then_some(pods)
        },
    )
    .await
    .unwrap();
    assert_eq!(pods.len(), 2);

    // A second GpuJob of 8 GPUs waits in the queue: its Job stays suspended, no pod
    // exists, and the GpuJob says why in Kueue's words.
    let second = env
        .create(
            "solo",
            json!({"image": "i", "gpus": 8, "maxRetries": 0, "env": long,
                   "v2": {"queueName": "team"}}),
        )
        .await;
    let second_uid = second.metadata.uid.clone().unwrap();
    let queued = env
        .wait_gpujob("solo", "queued, with Kueue's reason", |g| {
            reason_of(g, "Ready").as_deref() == Some("Queued")
                && condition(g, "Admitted").is_some_and(|c| c.message.contains("quota"))
        })
        .await;
    assert_eq!(phase(&queued), Some(Phase::Pending));
    let ready = condition(&queued, "Ready").unwrap();
    assert!(ready.message.contains("LocalQueue team"), "{ready:?}");
    let admitted = condition(&queued, "Admitted").unwrap();
    assert_eq!(admitted.status, ConditionStatus::False, "{admitted:?}");
    let jobs = jobs_of(&env, &second_uid).await;
    assert_eq!(jobs.len(), 1);
    assert_eq!(
        jobs[0].spec.as_ref().unwrap().suspend,
        Some(true),
        "held by Kueue, not started by the operator"
    );
    let pods: Api<Pod> = Api::namespaced(env.admin.clone(), &env.ns);
    let its_pods = pods
        .list(&ListParams::default().labels(&format!("{LABEL_UID}={second_uid}")))
        .await
        .unwrap();
    assert!(its_pods.items.is_empty(), "{:?}", its_pods.items);

    // The first GpuJob goes: its Job and Workload go with it, and Kueue admits the
    // second, which then runs as attempt 1.
    env.gpujobs()
        .delete("pair", &DeleteParams::foreground())
        .await
        .unwrap();
    let admitted = env
        .wait_gpujob("solo", "admitted and running", |g| {
            phase(g) == Some(Phase::Running)
                && reason_of(g, "Admitted").as_deref() == Some("Admitted")
        })
        .await;
    let status = admitted.status.unwrap();
    assert_eq!((status.attempts, status.failures), (1, 0));
    devcluster::wait::until(
        "the admitted GpuJob's pod running",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async { (running_pods(&env, &second_uid).await.len() == 1).then_some(()) },
    )
    .await
    .unwrap();
    drop(op);
}

#[tokio::test]
async fn a_gpujob_kueue_preempts_for_a_higher_priority_one_waits_queued_in_the_same_attempt() {
    let env = TestEnv::private_with_crds("kueue-preempt", vec![test_crd(), kueue_crds()]).await;
    let _kueue = Kueue::start(&env).await;
    gpu_queue(&env, 8).await;
    // Kueue ranks Workloads by their pods' priority class.
    let classes: Api<PriorityClass> = Api::all(env.admin.clone());
    for (name, value) in [("batch-low", 10), ("batch-high", 1000)] {
        let class: PriorityClass = serde_json::from_value(json!({
            "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": {"name": name}, "value": value,
        }))
        .unwrap();
        classes
            .create(&PostParams::default(), &class)
            .await
            .unwrap();
    }
    let op = env.operator("kueue-preempt", env.settings()).await;
    let long = sim_env(&[("SIM_DURATION_SECONDS", "3600")]);
    let spec = |class: &str| {
        json!({"image": "i", "gpus": 8, "maxRetries": 0, "env": long,
               "v2": {"queueName": "team",
                      "template": {"spec": {"priorityClassName": class}}}})
    };
    let low = env.create("low", spec("batch-low")).await;
    let low_uid = low.metadata.uid.clone().unwrap();
    env.wait_gpujob("low", "admitted and running", |g| {
        phase(g) == Some(Phase::Running) && reason_of(g, "Admitted").as_deref() == Some("Admitted")
    })
    .await;
    devcluster::wait::until(
        "the low-priority pod running",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async { (running_pods(&env, &low_uid).await.len() == 1).then_some(()) },
    )
    .await
    .unwrap();

    // The high-priority GpuJob takes the ClusterQueue's GPUs: Kueue evicts the low one
    // (suspends its Job), which waits Queued again, in attempt 1, no failure counted.
    env.create("high", spec("batch-high")).await;
    env.wait_gpujob("high", "admitted and running", |g| {
        phase(g) == Some(Phase::Running) && reason_of(g, "Admitted").as_deref() == Some("Admitted")
    })
    .await;
    let evicted = env
        .wait_gpujob("low", "queued again after Kueue's preemption", |g| {
            reason_of(g, "Ready").as_deref() == Some("Queued")
                && reason_of(g, "Admitted").as_deref() == Some("Preempted")
        })
        .await;
    assert_eq!(phase(&evicted), Some(Phase::Pending));
    let status = evicted.status.clone().unwrap();
    assert_eq!(
        (status.attempts, status.failures),
        (1, 0),
        "an eviction by Kueue is neither a new attempt nor a failure: {status:?}"
    );
    assert!(status.last_failure.is_none(), "{status:?}");
    let jobs = jobs_of(&env, &low_uid).await;
    assert_eq!(jobs.len(), 1, "the same attempt's Job, held by Kueue");
    assert_eq!(jobs[0].spec.as_ref().unwrap().suspend, Some(true));

    // The high one goes: Kueue admits the low one again, and the same attempt runs.
    env.gpujobs()
        .delete("high", &DeleteParams::foreground())
        .await
        .unwrap();
    let back = env
        .wait_gpujob("low", "admitted again and running", |g| {
            phase(g) == Some(Phase::Running)
                && reason_of(g, "Admitted").as_deref() == Some("Admitted")
        })
        .await;
    let status = back.status.unwrap();
    assert_eq!((status.attempts, status.failures), (1, 0), "{status:?}");
    // What `kubectl describe` tells: admitted, evicted by Kueue, admitted again (the
    // two identical Admitted Events are one series of count 2).
    let admitted = |e: &[support::EventSeen]| -> i32 {
        e.iter()
            .filter(|(_, r, _, _)| r == "Admitted")
            .map(|(_, _, _, n)| *n)
            .sum()
    };
    let events = env
        .events_of("low", |e| {
            admitted(e) >= 2 && e.iter().any(|(_, r, _, _)| r == "Evicted")
        })
        .await;
    assert_eq!(admitted(&events), 2, "{events:?}");
    let evicted: Vec<_> = events
        .iter()
        .filter(|(_, r, _, _)| r == "Evicted")
        .collect();
    assert_eq!(evicted.len(), 1, "{events:?}");
    assert!(
        evicted[0].0 == "Warning" && evicted[0].2.contains("Preempted"),
        "{evicted:?}"
    );
    drop(op);
}

#[tokio::test]
async fn a_gpujob_queued_where_kueue_is_not_installed_says_so_and_runs_nothing() {
    let env = TestEnv::new("no-kueue").await;
    let op = env.operator("no-kueue", env.settings()).await;
    let created = env
        .create(
            "waits",
            json!({"image": "i", "gpus": 1, "v2": {"queueName": "team"}}),
        )
        .await;
    let uid = created.metadata.uid.clone().unwrap();
    let g = env
        .wait_gpujob("waits", "queued, saying Kueue is missing", |g| {
            reason_of(g, "Admitted").as_deref() == Some("KueueNotInstalled")
        })
        .await;
    assert_eq!(phase(&g), Some(Phase::Pending));
    assert_eq!(reason_of(&g, "Ready").as_deref(), Some("Queued"));
    let jobs = jobs_of(&env, &uid).await;
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].spec.as_ref().unwrap().suspend, Some(true));
    assert_eq!(
        jobs[0]
            .metadata
            .labels
            .as_ref()
            .unwrap()
            .get(LABEL_KUEUE_QUEUE)
            .map(String::as_str),
        Some("team")
    );
    drop(op);
}

/// Kueue's LocalQueue defaulting labels (and suspends) every new Job of a namespace with
/// a LocalQueue named `default`: the operator's Jobs too, with no `spec.queueName`. Kueue
/// then admits and starts the attempt, not the operator; its pods still wait at the
/// operator's gate until the operator lets them go, and a multi-node attempt's Service
/// exists before they run (before the gate, a Job labelled by Kueue counted as started:
/// no Service was made and the pods could not find each other). A Job of another attempt
/// (a create that lands late, made here as the operator makes Jobs) is admitted by Kueue
/// as well: its pods never leave the gate, and it is deleted.
#[tokio::test]
async fn a_job_kueue_labels_by_default_runs_only_through_the_operators_gate() {
    let env = TestEnv::private_with_crds("kueue-default", vec![test_crd(), kueue_crds()]).await;
    let _kueue = Kueue::start_with_job_webhook(&env).await;
    gpu_queue_named(&env, 16, &env.ns, "default").await;
    wait_defaulting(&env, &env.ns).await;
    let attempts = AttemptWatch::start(&env.admin);
    let mut settings = env.settings();
    settings.plan.limits.max_gpus = 16;
    let op = env.operator("kueue-default", settings).await;

    let long = sim_env(&[("SIM_DURATION_SECONDS", "3600")]);
    let created = env
        .create(
            "pair",
            json!({"image": "i", "gpus": 4, "maxRetries": 0, "env": long, "v2": {"nodes": 2}}),
        )
        .await;
    let uid = created.metadata.uid.clone().unwrap();
    let running = env
        .wait_gpujob(
            "pair",
            "admitted from the default LocalQueue and running",
            |g| {
                phase(g) == Some(Phase::Running)
                    && condition(g, "Admitted").is_some_and(|c| c.status == ConditionStatus::True)
            },
        )
        .await;
    let jobs = jobs_of(&env, &uid).await;
    assert_eq!(jobs.len(), 1);
    let labels = jobs[0].metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels.get(LABEL_KUEUE_QUEUE).map(String::as_str),
        Some("default"),
        "labelled by Kueue's defaulting, not by the operator"
    );
    // Both pods run, and the Service they find each other through is the attempt's.
    devcluster::wait::until(
        "both pods of the attempt running",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async { (running_pods(&env, &uid).await.len() == 2).then_some(()) },
    )
    .await
    .unwrap();
    let services: Api<Service> = Api::namespaced(env.admin.clone(), &env.ns);
    let service = services
        .get_opt("pair-1")
        .await
        .unwrap()
        .expect("the multi-node attempt's headless Service");
    let owner = &service.metadata.owner_references.unwrap()[0];
    assert_eq!(owner.uid, jobs[0].metadata.uid.clone().unwrap());

    // A Job of attempt 2 lands while attempt 1 runs: Kueue labels and admits it too
    // (16 GPUs in the queue); the operator never lets its pods go, and deletes it.
    let late = desired_job(&running, 2);
    env.jobs()
        .create(&PostParams::default(), &late)
        .await
        .unwrap();
    env.wait_job_gone("pair-2", "the late Job of attempt 2 gone")
        .await;
    assert!(
        attempts.overlaps().is_empty(),
        "two attempts had pods that could run at once: {:?}",
        attempts.overlaps()
    );
    let g = env.gpujobs().get("pair").await.unwrap();
    let status = g.status.unwrap();
    assert_eq!((status.attempts, status.failures), (1, 0), "{status:?}");
    assert_eq!(running_pods(&env, &uid).await.len(), 2, "attempt 1 runs on");
    drop(op);
}

/// Kueue's TopologyAwareScheduling with a plain batch/v1 Job (no operator): a Job of four
/// pods of 4 GPUs whose template says `kueue.x-k8s.io/podset-required-topology: <rack
/// label>` is admitted by the ClusterQueue of a TAS ResourceFlavor and its pods all land
/// in one rack (two nodes of 8 GPUs), the one rack of the flavor's three with room for
/// all of it. What Kueue does to the pods, and that it leaves
/// another scheduling gate alone: at admission it adds its gate `kueue.x-k8s.io/topology`
/// (and the flavor's node labels, as a nodeSelector) to the Job's template beside the
/// operator's gate the template already has; its topology ungater then takes only its
/// own gate off each pod, adding a nodeSelector on the host Kueue assigned it. The pods
/// wait at the operator's gate until that is removed too, and then run on those hosts.
#[tokio::test]
async fn a_plain_job_requiring_one_rack_is_admitted_by_kueue_tas_and_lands_in_one_rack() {
    use devcluster::nodes::{HOST_LABEL, RACK_LABEL};
    use gpujob_operator::api::SCHEDULING_GATE;
    use kube::api::{Patch, PatchParams};
    use support::kueue::TAS_QUEUE;

    const KUEUE_GATE: &str = "kueue.x-k8s.io/topology";
    let env = TestEnv::private_with_crds("kueue-tas", vec![test_crd(), kueue_crds()]).await;
    let _kueue = Kueue::start(&env).await;
    let rack_of = tas_with_one_rack_free(&env).await;
    let pods_api: Api<Pod> = Api::namespaced(env.admin.clone(), &env.ns);

    // Created suspended and labelled for the queue, as Kueue's Job webhook (not
    // registered here) would have it, with the operator's gate on its pods.
    let job: Job = serde_json::from_value(json!({
        "metadata": {"name": "rack", "labels": {LABEL_KUEUE_QUEUE: TAS_QUEUE}},
        "spec": {
            "parallelism": 4, "completions": 4, "suspend": true,
            "template": {
                "metadata": {"annotations": {
                    "kueue.x-k8s.io/podset-required-topology": RACK_LABEL,
                }},
                "spec": {
                    "restartPolicy": "Never", "automountServiceAccountToken": false,
                    "schedulingGates": [{"name": SCHEDULING_GATE}],
                    "containers": [{"name": "main", "image": "i",
                        "env": sim_env(&[("SIM_DURATION_SECONDS", "3600")]),
                        "resources": {"limits": {"nvidia.com/gpu": "4"}}}],
                },
            },
        },
    }))
    .unwrap();
    let job = env
        .jobs()
        .create(&PostParams::default(), &job)
        .await
        .unwrap();
    let job_uid = job.metadata.uid.clone().unwrap();

    // Admitted, with a topology assignment down to hosts.
    let workload = devcluster::wait::until(
        "Kueue to admit the Job's Workload by topology",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async {
            let w = workload_of(&env, &job_uid).await?;
            let assignment = &w["status"]["admission"]["podSetAssignments"][0];
            (!assignment["topologyAssignment"].is_null()).then_some(w)
        },
    )
    .await
    .unwrap();
    let topology = &workload["status"]["admission"]["podSetAssignments"][0]["topologyAssignment"];
    println!("Kueue's topology assignment: {topology}");
    let levels = topology["levels"].as_array().unwrap();
    assert_eq!(levels.last().unwrap(), HOST_LABEL, "{topology}");

    // The Job Kueue started (its Job reconciler follows the admission): its template
    // carries both gates and the flavor's labels.
    let started = devcluster::wait::until(
        "Kueue to start the admitted Job",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async {
            let job = env.jobs().get("rack").await.ok()?;
            (job.spec.as_ref()?.suspend == Some(false)).then_some(job)
        },
    )
    .await
    .unwrap();
    let template = started.spec.unwrap().template.spec.unwrap();
    println!(
        "the started Job's template: schedulingGates {:?}, nodeSelector {:?}",
        template.scheduling_gates, template.node_selector
    );
    let gates: Vec<String> = template
        .scheduling_gates
        .unwrap_or_default()
        .into_iter()
        .map(|g| g.name)
        .collect();
    assert_eq!(gates, [SCHEDULING_GATE, KUEUE_GATE]);
    assert_eq!(
        template
            .node_selector
            .unwrap_or_default()
            .get(FLAVOR_LABEL)
            .map(String::as_str),
        Some("true")
    );

    // Kueue's ungater takes its own gate off each pod and pins it to a host; the
    // operator's gate stays, so no pod is bound yet.
    let pods = devcluster::wait::until(
        "Kueue to take its gate off the Job's four pods",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async {
            let pods = pods_api
                .list(&ListParams::default().labels("job-name=rack"))
                .await
                .ok()?
                .items;
            let ungated = pods.iter().all(|p| {
                let spec = p.spec.as_ref();
                !spec
                    .and_then(|s| s.scheduling_gates.as_ref())
                    .is_some_and(|g| g.iter().any(|g| g.name == KUEUE_GATE))
            });
            (pods.len() == 4 && ungated).then_some(pods)
        },
    )
    .await
    .unwrap();
    let mut hosts = std::collections::BTreeMap::new();
    for pod in &pods {
        let name = pod.metadata.name.clone().unwrap();
        let spec = pod.spec.as_ref().unwrap();
        let gates: Vec<&str> = spec
            .scheduling_gates
            .iter()
            .flatten()
            .map(|g| g.name.as_str())
            .collect();
        assert_eq!(
            gates,
            [SCHEDULING_GATE],
            "pod {name}: only the operator's gate left"
        );
        assert_eq!(spec.node_name, None, "pod {name} is still gated");
        let selector = spec.node_selector.clone().unwrap_or_default();
        println!(
            "pod {name}: nodeSelector {selector:?}, annotations {:?}, labels {:?}",
            pod.metadata.annotations, pod.metadata.labels
        );
        hosts.insert(name, selector.get(HOST_LABEL).cloned().unwrap());
    }
    let racks: std::collections::BTreeSet<&str> =
        hosts.values().map(|h| rack_of[h].as_str()).collect();
    assert_eq!(
        racks,
        std::collections::BTreeSet::from(["rack-2"]),
        "Kueue assigned hosts in the one rack with room: {hosts:?}"
    );

    // The operator's gate off (with the gates read, as the operator removes it): the
    // pods run on the hosts Kueue assigned.
    for pod in &pods {
        let name = pod.metadata.name.as_deref().unwrap();
        let patch = json!([
            {"op": "test", "path": "/metadata/resourceVersion",
             "value": pod.metadata.resource_version},
            {"op": "remove", "path": "/spec/schedulingGates"},
        ]);
        pods_api
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Json::<()>(serde_json::from_value(patch).unwrap()),
            )
            .await
            .unwrap();
    }
    for (name, host) in &hosts {
        let pod = devcluster::wait::until(
            &format!("pod {name} Running"),
            Duration::from_secs(60),
            Duration::from_millis(200),
            || async {
                let p = pods_api.get(name).await.ok()?;
                (p.status.as_ref()?.phase.as_deref() == Some("Running")).then_some(p)
            },
        )
        .await
        .unwrap();
        assert_eq!(
            pod.spec.unwrap().node_name.as_ref(),
            Some(host),
            "pod {name}"
        );
    }
}

/// The flavor's nodes of [`tas_with_one_rack_free`]: racks 0, 1 and 2 (nodes 0 to 5).
const FLAVOR_LABEL: &str = "gpujob.test/tas";

/// Kueue's TopologyAwareScheduling queue `tas` (`support::kueue::tas_queue`) over racks
/// 0, 1 and 2 (nodes 0 to 5, two nodes of 8 GPUs a rack), with 4 GPUs taken on one node
/// of racks 0 and 1 by pods Kueue does not admit (it counts them on their nodes all the
/// same): rack 2 is the only one with 16 free GPUs. Returns each node's rack.
async fn tas_with_one_rack_free(env: &TestEnv) -> std::collections::BTreeMap<String, String> {
    use devcluster::nodes::{HOST_LABEL, RACK_LABEL};
    use k8s_openapi::api::core::v1::Node;
    use kube::api::{Patch, PatchParams};
    use support::kueue::tas_queue;

    let nodes_api: Api<Node> = Api::all(env.admin.clone());
    for i in 0..6 {
        let patch = json!({"metadata": {"labels": {FLAVOR_LABEL: "true"}}});
        nodes_api
            .patch(
                &format!("gpu-node-{i}"),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .unwrap();
    }
    let pods_api: Api<Pod> = Api::namespaced(env.admin.clone(), &env.ns);
    for node in ["gpu-node-0", "gpu-node-2"] {
        let filler: Pod = serde_json::from_value(json!({
            "metadata": {"name": format!("filler-{node}")},
            "spec": {"restartPolicy": "Never", "automountServiceAccountToken": false,
                "nodeSelector": {HOST_LABEL: node},
                "containers": [{"name": "main", "image": "i",
                    "env": sim_env(&[("SIM_DURATION_SECONDS", "3600")]),
                    "resources": {"limits": {"nvidia.com/gpu": "4"}}}]},
        }))
        .unwrap();
        pods_api
            .create(&PostParams::default(), &filler)
            .await
            .unwrap();
    }
    for node in ["gpu-node-0", "gpu-node-2"] {
        devcluster::wait::until(
            &format!("the filler pod on {node} Running"),
            Duration::from_secs(60),
            Duration::from_millis(200),
            || async {
                let p = pods_api.get(&format!("filler-{node}")).await.ok()?;
                (p.status?.phase.as_deref() == Some("Running")).then_some(())
            },
        )
        .await
        .unwrap();
    }
    tas_queue(env, 32, (FLAVOR_LABEL, "true")).await;
    Api::<Node>::all(env.admin.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|n| {
            Some((
                n.metadata.name?,
                n.metadata.labels?.get(RACK_LABEL)?.clone(),
            ))
        })
        .collect()
}

#[tokio::test]
async fn a_multi_node_gpujob_with_a_rack_topology_lands_in_one_rack_through_kueue_tas() {
    use devcluster::nodes::RACK_LABEL;
    use support::kueue::TAS_QUEUE;

    let env = TestEnv::private_with_crds("kueue-tas-gj", vec![test_crd(), kueue_crds()]).await;
    let _kueue = Kueue::start(&env).await;
    let rack_of = tas_with_one_rack_free(&env).await;
    let mut settings = env.settings();
    settings.plan.limits.max_gpus = 16;
    let op = env.operator("kueue-tas-gj", settings).await;
    // Two whole nodes in one rack: rack 2 is the only rack with both free.
    env.create(
        "pair",
        json!({"image": "i", "gpus": 8, "maxRetries": 0,
               "env": sim_env(&[("SIM_DURATION_SECONDS", "3600")]),
               "v2": {"nodes": 2, "queueName": TAS_QUEUE, "topology": {"level": RACK_LABEL}}}),
    )
    .await;
    let running = env
        .wait_gpujob("pair", "admitted and running", |g| {
            phase(g) == Some(Phase::Running)
                && condition(g, "Admitted").is_some_and(|c| c.status == ConditionStatus::True)
        })
        .await;
    let uid = running.metadata.uid.clone().unwrap();
    let pods = devcluster::wait::until(
        "both pods of the pair Running",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async {
            let pods = running_pods(&env, &uid).await;
            (pods.len() == 2).then_some(pods)
        },
    )
    .await
    .unwrap();
    let racks: std::collections::BTreeSet<&str> = pods
        .iter()
        .map(|p| rack_of[p.spec.as_ref().unwrap().node_name.as_deref().unwrap()].as_str())
        .collect();
    assert_eq!(
        racks,
        std::collections::BTreeSet::from(["rack-2"]),
        "{:?}",
        pods.iter()
            .map(|p| p.spec.as_ref().unwrap().node_name.clone())
            .collect::<Vec<_>>()
    );
    drop(op);
}
