//! Workload-aware (gang) scheduling (`devcluster::gang`) against the real kube-scheduler
//! and the fake nodes' topology (`devcluster::nodes::Topology`): a PodGroup with a gang
//! policy lands whole or not at all, and whole in one rack when its topology constraint
//! says so; with the Job controller's integration on, a Job that asks for a gang gets
//! its Workload and PodGroup from the Job controller.
//!
//! Each test starts a control plane of its own with gang scheduling on (the test run's
//! shared one has none), so nextest runs them one at a time (.config/nextest.toml):
//! eight nodes of two GPUs, two to a rack, two racks to a block (racks 0 to 3, blocks 0
//! and 1).

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use devcluster::gang::{API_VERSION, GangScheduling};
use devcluster::nodes::{GpuNodes, RACK_LABEL, Topology, put};
use devcluster::{ControlPlane, Identity, Options, wait};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, PostParams};
use serde_json::{Value, json};

const NODES: u16 = 8;
const GPUS_PER_NODE: u16 = 2;
/// Two hosts of two GPUs: four GPUs to a rack.
const RACK_GPUS: usize = 4;
const WAIT: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(250);

fn nodes() -> GpuNodes {
    GpuNodes {
        count: NODES,
        gpus_per_node: GPUS_PER_NODE,
        topology: Topology::default(),
        ..GpuNodes::default()
    }
}

async fn cluster(gang: GangScheduling) -> ControlPlane {
    ControlPlane::start(Options {
        gpu_nodes: nodes(),
        gang: Some(gang),
        ..Options::default()
    })
    .await
    .expect("control plane with gang scheduling")
}

fn kind(kind: &str, plural: &str) -> ApiResource {
    let (group, version) = API_VERSION.split_once('/').unwrap();
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

fn workloads(client: &kube::Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, &kind("Workload", "workloads"))
}

fn pod_groups(client: &kube::Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, &kind("PodGroup", "podgroups"))
}

async fn create(api: &Api<DynamicObject>, body: Value) {
    let obj: DynamicObject = serde_json::from_value(body).unwrap();
    api.create(&PostParams::default(), &obj).await.unwrap();
}

/// A Workload `name` with one gang template `workers` of `min_count`, optionally kept in
/// one domain of node label `topology`, and its runtime PodGroup `name`, as a workload
/// controller would make them (kube-scheduler reads only the PodGroup).
async fn gang(
    client: &kube::Client,
    ns: &str,
    name: &str,
    min_count: usize,
    topology: Option<&str>,
) {
    let policy = json!({"gang": {"minCount": min_count}});
    let constraints = topology.map(|key| json!({"topology": [{"key": key}]}));
    let mut template = json!({"name": "workers", "schedulingPolicy": policy});
    if let Some(c) = &constraints {
        template["schedulingConstraints"] = c.clone();
    }
    create(
        &workloads(client, ns),
        json!({
            "apiVersion": API_VERSION, "kind": "Workload",
            "metadata": {"name": name},
            "spec": {"podGroupTemplates": [template]},
        }),
    )
    .await;
    let mut spec = json!({
        "workloadRef": {"workloadName": name, "templateName": "workers"},
        "schedulingPolicy": policy,
    });
    if let Some(c) = &constraints {
        spec["schedulingConstraints"] = c.clone();
    }
    create(
        &pod_groups(client, ns),
        json!({
            "apiVersion": API_VERSION, "kind": "PodGroup",
            "metadata": {"name": name}, "spec": spec,
        }),
    )
    .await;
    // Without TopologyAwareWorkloadScheduling kube-apiserver drops the constraint
    // without a word; say so here rather than as pods in the wrong racks.
    let stored = pod_groups(client, ns).get(name).await.unwrap();
    assert_eq!(
        stored.data["spec"].get("schedulingConstraints"),
        constraints.as_ref(),
        "PodGroup {name} as stored"
    );
}

/// Creates pod `name` asking for `gpus` GPUs, in PodGroup `group` if any; it runs for an
/// hour once placed, so its GPUs stay taken.
async fn create_pod(pods: &Api<Pod>, name: &str, gpus: u16, group: Option<&str>) {
    let mut pod = json!({
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": false,
            "containers": [{
                "name": "main", "image": "busybox",
                "env": [{"name": "SIM_DURATION_SECONDS", "value": "3600"}],
                "resources": {"limits": {"nvidia.com/gpu": gpus.to_string()}},
            }],
        },
    });
    if let Some(group) = group {
        pod["spec"]["schedulingGroup"] = json!({"podGroupName": group});
    }
    let pod: Pod = serde_json::from_value(pod).unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
}

/// The node each of `names` is bound to, once all of them are Running.
async fn all_running(pods: &Api<Pod>, names: &[String]) -> BTreeMap<String, String> {
    wait::until(
        &format!("pods {names:?} to be Running"),
        WAIT,
        POLL,
        || async {
            let mut placed = BTreeMap::new();
            for name in names {
                let pod = pods.get(name).await.ok()?;
                if pod.status.as_ref()?.phase.as_deref() != Some("Running") {
                    return None;
                }
                placed.insert(name.clone(), pod.spec?.node_name?);
            }
            Some(placed)
        },
    )
    .await
    .unwrap()
}

/// The rack of each node (its label, as the API server has it).
async fn racks(client: &kube::Client) -> BTreeMap<String, String> {
    let nodes = Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap();
    nodes
        .items
        .into_iter()
        .filter_map(|n| {
            let rack = n.metadata.labels?.get(RACK_LABEL)?.clone();
            Some((n.metadata.name?, rack))
        })
        .collect()
}

/// The condition `type_` of PodGroup `name`, as (status, reason, message).
async fn group_condition(
    groups: &Api<DynamicObject>,
    name: &str,
    type_: &str,
) -> Option<(String, String, String)> {
    let group = groups.get(name).await.ok()?;
    let conditions = group.data["status"]["conditions"].as_array()?.clone();
    let c = conditions.iter().find(|c| c["type"] == type_)?;
    let field = |f: &str| c[f].as_str().unwrap_or_default().to_owned();
    Some((field("status"), field("reason"), field("message")))
}

/// Waits until kube-scheduler has tried gang `group` of pods `names` and given up on
/// it: the PodGroup says `PodGroupInitiallyScheduled=False` (`Unschedulable`) and every
/// pod `PodScheduled=False` (`Unschedulable`). Returns the PodGroup's message.
async fn refused(
    pods: &Api<Pod>,
    groups: &Api<DynamicObject>,
    group: &str,
    names: &[String],
) -> String {
    wait::until(
        &format!("kube-scheduler to find gang {group} unschedulable"),
        WAIT,
        POLL,
        || async {
            let mut all_refused = true;
            for name in names {
                let pod = pods.get(name).await.ok()?;
                // A bound pod fails at once, not as a wait that never ends.
                let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
                assert_eq!(node, None, "pod {name} of gang {group} got a node");
                let refused = pod
                    .status
                    .and_then(|s| s.conditions)
                    .into_iter()
                    .flatten()
                    .any(|c| {
                        c.type_ == "PodScheduled"
                            && c.status == "False"
                            && c.reason.as_deref() == Some("Unschedulable")
                    });
                all_refused &= refused;
            }
            let (status, reason, message) =
                group_condition(groups, group, "PodGroupInitiallyScheduled").await?;
            (all_refused && status == "False" && reason == "Unschedulable").then_some(message)
        },
    )
    .await
    .unwrap()
}

/// Asserts that no pod of `names` is bound to a node.
async fn none_bound(pods: &Api<Pod>, names: &[String]) {
    for name in names {
        let pod = pods.get(name).await.unwrap();
        assert_eq!(
            pod.spec.as_ref().unwrap().node_name,
            None,
            "pod {name} of an unschedulable gang got a node"
        );
        assert_eq!(
            pod.status.as_ref().unwrap().phase.as_deref(),
            Some("Pending"),
            "pod {name}"
        );
    }
}

fn names(prefix: &str, count: usize) -> Vec<String> {
    (0..count).map(|i| format!("{prefix}-{i}")).collect()
}

#[tokio::test]
async fn gang_all_pods_of_a_gang_land_and_in_one_rack_when_it_asks() {
    let started = Instant::now();
    let cluster = cluster(GangScheduling::default()).await;
    let client = cluster.client(Identity::Admin).await.unwrap();
    let ns = cluster.create_namespace("gang-fits").await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let groups = pod_groups(&client, &ns);
    let rack_of = racks(&client).await;
    assert_eq!(
        rack_of.values().collect::<BTreeSet<_>>().len(),
        usize::from(NODES) / 2,
        "{rack_of:?}"
    );

    // One GPU taken on one node of each of racks 0, 1 and 2: rack 3 is the only rack
    // with four free GPUs. Single pods, placed by the scheduler on the node named.
    for (i, node) in ["gpu-node-0", "gpu-node-2", "gpu-node-4"]
        .iter()
        .enumerate()
    {
        let name = format!("filler-{i}");
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"restartPolicy": "Never", "automountServiceAccountToken": false,
                "nodeSelector": {"kubernetes.io/hostname": node},
                "containers": [{"name": "main", "image": "busybox",
                    "env": [{"name": "SIM_DURATION_SECONDS", "value": "3600"}],
                    "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
        }))
        .unwrap();
        pods.create(&PostParams::default(), &pod).await.unwrap();
    }
    all_running(&pods, &names("filler", 3)).await;

    // A gang of four one-GPU pods, all in one rack. Left to itself, the scheduler would
    // spread four pods over the five empty nodes (it prefers the least allocated), and
    // no rack has four empty nodes: only the constraint keeps them together.
    gang(&client, &ns, "rack-gang", RACK_GPUS, Some(RACK_LABEL)).await;
    let gang_pods = names("rack-gang", RACK_GPUS);
    for name in &gang_pods {
        create_pod(&pods, name, 1, Some("rack-gang")).await;
    }
    let placed = all_running(&pods, &gang_pods).await;
    let used: BTreeSet<&str> = placed.values().map(|n| rack_of[n].as_str()).collect();
    assert_eq!(
        used,
        BTreeSet::from(["rack-3"]),
        "the gang in the one rack with room for all of it: {placed:?}"
    );
    let (status, reason, _) = group_condition(&groups, "rack-gang", "PodGroupInitiallyScheduled")
        .await
        .unwrap();
    assert_eq!((status.as_str(), reason.as_str()), ("True", "Scheduled"));

    // A gang without a constraint lands whole too (eight GPUs left on the racks 0 to 2).
    gang(&client, &ns, "free-gang", 4, None).await;
    let free_pods = names("free-gang", 4);
    for name in &free_pods {
        create_pod(&pods, name, 1, Some("free-gang")).await;
    }
    let placed = all_running(&pods, &free_pods).await;
    assert_eq!(placed.len(), 4, "{placed:?}");
    println!("took {:.1}s", started.elapsed().as_secs_f64());
}

#[tokio::test]
async fn gang_with_room_for_all_but_one_pod_no_pod_gets_a_node() {
    let started = Instant::now();
    let cluster = cluster(GangScheduling::default()).await;
    let client = cluster.client(Identity::Admin).await.unwrap();
    let ns = cluster.create_namespace("gang-short").await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let groups = pod_groups(&client, &ns);

    // Nine pods of a whole node each on eight nodes: room for all but one.
    let k = usize::from(NODES) + 1;
    gang(&client, &ns, "short", k, None).await;
    let gang_pods = names("short", k);
    for name in &gang_pods {
        create_pod(&pods, name, GPUS_PER_NODE, Some("short")).await;
    }
    let message = refused(&pods, &groups, "short", &gang_pods).await;
    println!("kube-scheduler: {message}");
    assert!(message.contains("minCount (9)"), "{message}");
    none_bound(&pods, &gang_pods).await;

    // It waits, it has not failed: a ninth node makes room for all of it, and the
    // scheduler places the whole gang.
    let node = GpuNodes {
        count: NODES + 1,
        ..nodes()
    }
    .node(NODES);
    put(client.clone(), &node).await.unwrap();
    let placed = all_running(&pods, &gang_pods).await;
    let used: BTreeSet<&String> = placed.values().collect();
    assert_eq!(used.len(), k, "one node each: {placed:?}");
    println!("took {:.1}s", started.elapsed().as_secs_f64());
}

#[tokio::test]
async fn gang_larger_than_any_rack_gets_no_node_though_the_cluster_has_room() {
    let started = Instant::now();
    let cluster = cluster(GangScheduling::default()).await;
    let client = cluster.client(Identity::Admin).await.unwrap();
    let ns = cluster.create_namespace("gang-rack").await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let groups = pod_groups(&client, &ns);

    // Five one-GPU pods that must share a rack of four GPUs; sixteen GPUs are free.
    let k = RACK_GPUS + 1;
    gang(&client, &ns, "wide", k, Some(RACK_LABEL)).await;
    let gang_pods = names("wide", k);
    for name in &gang_pods {
        create_pod(&pods, name, 1, Some("wide")).await;
    }
    let message = refused(&pods, &groups, "wide", &gang_pods).await;
    println!("kube-scheduler: {message}");
    assert!(message.contains("placements are available"), "{message}");
    none_bound(&pods, &gang_pods).await;
    println!("took {:.1}s", started.elapsed().as_secs_f64());
}

#[tokio::test]
async fn gang_the_job_controller_makes_the_workload_and_podgroup_of_a_job_that_asks() {
    let started = Instant::now();
    let cluster = cluster(GangScheduling {
        job_controller: true,
        ..GangScheduling::default()
    })
    .await;
    let client = cluster.client(Identity::Admin).await.unwrap();
    let ns = cluster.create_namespace("gang-job").await.unwrap();
    let rack_of = racks(&client).await;
    // Jobs as dynamic objects: k8s-openapi has no `spec.scheduling` yet.
    let jobs: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &ns,
        &ApiResource::erase::<k8s_openapi::api::batch::v1::Job>(&()),
    );
    let job = |name: &str, owner: Option<Value>| {
        let mut job = json!({
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name},
            "spec": {
                "parallelism": 3, "completions": 3,
                "scheduling": {
                    "schedulingPolicy": {"gang": {}},
                    "schedulingConstraints": {"topology": [{"key": RACK_LABEL}]},
                },
                "template": {"spec": {
                    "restartPolicy": "Never", "automountServiceAccountToken": false,
                    "containers": [{"name": "main", "image": "busybox",
                        "env": [{"name": "SIM_DURATION_SECONDS", "value": "3600"}],
                        "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
                }},
            },
        });
        if let Some(owner) = owner {
            job["metadata"]["ownerReferences"] = json!([owner]);
        }
        job
    };
    create(&jobs, job("trio", None)).await;

    // The Job controller made the Workload (minCount defaulted to the parallelism) and
    // its PodGroup, and put each pod in the group; the three landed in one rack.
    let pods: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &ns, &ApiResource::erase::<Pod>(&()));
    let running = wait::until("the Job's three pods Running", WAIT, POLL, || async {
        let list = pods
            .list(&ListParams::default().labels("job-name=trio"))
            .await
            .ok()?;
        let running: Vec<DynamicObject> = list
            .items
            .into_iter()
            .filter(|p| p.data["status"]["phase"] == "Running")
            .collect();
        (running.len() == 3).then_some(running)
    })
    .await
    .unwrap();
    let workload_list = workloads(&client, &ns)
        .list(&ListParams::default())
        .await
        .unwrap();
    assert_eq!(workload_list.items.len(), 1);
    let workload = &workload_list.items[0];
    let template = &workload.data["spec"]["podGroupTemplates"][0];
    assert_eq!(
        template["schedulingPolicy"]["gang"]["minCount"], 3,
        "{template}"
    );
    assert_eq!(
        template["schedulingConstraints"]["topology"][0]["key"], RACK_LABEL,
        "{template}"
    );
    let group_list = pod_groups(&client, &ns)
        .list(&ListParams::default())
        .await
        .unwrap();
    assert_eq!(group_list.items.len(), 1);
    let group = &group_list.items[0];
    let group_name = group.metadata.name.clone().unwrap();
    assert_eq!(
        group.data["spec"]["workloadRef"]["workloadName"],
        json!(workload.metadata.name)
    );
    let mut used = BTreeSet::new();
    for pod in &running {
        assert_eq!(
            pod.data["spec"]["schedulingGroup"]["podGroupName"],
            json!(group_name),
            "the pod is in the Job's group"
        );
        let node = pod.data["spec"]["nodeName"].as_str().unwrap();
        used.insert(rack_of[node].clone());
    }
    assert_eq!(used.len(), 1, "one rack: {used:?}");

    // A Job that another object controls (as a GpuJob controls its attempts' Jobs) is
    // left to that controller: no Workload, no PodGroup, its pods in no group. The
    // owner here is a ConfigMap; the Job controller reads only the reference.
    let owner = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), &ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "owner"}})).unwrap(),
        )
        .await
        .unwrap();
    create(
        &jobs,
        job(
            "owned",
            Some(json!({
                "apiVersion": "v1", "kind": "ConfigMap", "name": "owner",
                "uid": owner.metadata.uid, "controller": true,
            })),
        ),
    )
    .await;
    // The Job controller makes a Job's Workload before its first pod, in the same sync:
    // once the pods exist, there is none to wait for.
    let owned_pods = wait::until("the owned Job's three pods", WAIT, POLL, || async {
        let list = pods
            .list(&ListParams::default().labels("job-name=owned"))
            .await
            .ok()?;
        (list.items.len() == 3).then_some(list.items)
    })
    .await
    .unwrap();
    for pod in &owned_pods {
        assert!(
            pod.data["spec"].get("schedulingGroup").is_none(),
            "{:?}",
            pod.data["spec"]
        );
    }
    let workload_list = workloads(&client, &ns)
        .list(&ListParams::default())
        .await
        .unwrap();
    assert_eq!(workload_list.items.len(), 1, "still only trio's");
    println!("took {:.1}s", started.elapsed().as_secs_f64());
}
