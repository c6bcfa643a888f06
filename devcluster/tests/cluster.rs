//! devcluster against the real thing: the shared control plane of the test run (or a
//! private one when `DEVCLUSTER_DIR` is unset). Each test works in its own namespace.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use std::io::Write;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use futures::StreamExt;

use devcluster::audit::AuditEvents;
use devcluster::identity::REPLICA_GROUP;
use devcluster::{ControlPlane, Identity, wait};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, PodTemplate};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::json;

const WIDGET_CRD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/widget-crd.yaml");
const WAIT: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(250);

async fn cluster() -> ControlPlane {
    ControlPlane::for_tests(&[Path::new(WIDGET_CRD)])
        .await
        .expect("control plane")
}

fn job_manifest(ns: &str, name: &str, env: serde_json::Value) -> String {
    json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"backoffLimit": 0, "template": {"spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "busybox", "env": env}],
        }}},
    })
    .to_string()
}

/// Creates a Job with kubectl (so the command helper and a real client are exercised)
/// and waits for the Job controller to give it a terminal condition.
async fn run_job(
    cluster: &ControlPlane,
    ns: &str,
    name: &str,
    env: serde_json::Value,
) -> (Job, Pod) {
    let mut kubectl = cluster
        .command("kubectl", Identity::Admin)
        .args(["create", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl");
    kubectl
        .stdin
        .take()
        .unwrap()
        .write_all(job_manifest(ns, name, env).as_bytes())
        .unwrap();
    let out = kubectl.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "kubectl create: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let client = cluster.client(Identity::Admin).await.unwrap();
    let jobs: Api<Job> = Api::namespaced(client.clone(), ns);
    let job =
        wait::until(&format!("Job {ns}/{name} to finish"), WAIT, POLL, || {
            let jobs = jobs.clone();
            async move {
                let job = jobs.get(name).await.ok()?;
                let done =
                    job.status.as_ref()?.conditions.as_ref()?.iter().any(|c| {
                        (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True"
                    });
                done.then_some(job)
            }
        })
        .await
        .unwrap();
    let uid = job.metadata.uid.clone().unwrap();
    let pods: Api<Pod> = Api::namespaced(client, ns);
    let list = pods
        .list(&ListParams::default().labels(&format!("controller-uid={uid}")))
        .await
        .unwrap();
    assert_eq!(list.items.len(), 1, "one pod per Job (backoffLimit 0)");
    (job, list.items.into_iter().next().unwrap())
}

fn condition(job: &Job, type_: &str) -> bool {
    job.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == type_ && c.status == "True"))
}

fn terminated(pod: &Pod) -> (i32, String) {
    let state = pod
        .status
        .as_ref()
        .unwrap()
        .container_statuses
        .as_ref()
        .unwrap()[0]
        .state
        .clone()
        .unwrap();
    let t = state.terminated.expect("terminated container state");
    (t.exit_code, t.reason.unwrap_or_default())
}

#[tokio::test]
async fn a_job_runs_to_complete() {
    let cluster = cluster().await;
    let ns = cluster.create_namespace("dc-complete").await.unwrap();
    let (job, pod) = run_job(
        &cluster,
        &ns,
        "ok",
        json!([{"name": "SIM_DURATION_SECONDS", "value": "0.5"}]),
    )
    .await;
    assert!(condition(&job, "Complete"), "{:?}", job.status);
    assert_eq!(job.status.as_ref().unwrap().succeeded, Some(1));
    assert_eq!(
        pod.status.as_ref().unwrap().phase.as_deref(),
        Some("Succeeded")
    );
    assert_eq!(terminated(&pod), (0, "Completed".to_owned()));
}

#[tokio::test]
async fn a_failing_pod_fails_its_job_with_the_exit_code() {
    let cluster = cluster().await;
    let ns = cluster.create_namespace("dc-fail").await.unwrap();
    let (job, pod) = run_job(
        &cluster,
        &ns,
        "three",
        json!([{"name": "SIM_EXIT_CODE", "value": "3"}]),
    )
    .await;
    assert!(condition(&job, "Failed"), "{:?}", job.status);
    assert!(!condition(&job, "Complete"));
    assert_eq!(
        pod.status.as_ref().unwrap().phase.as_deref(),
        Some("Failed")
    );
    assert_eq!(terminated(&pod), (3, "Error".to_owned()));
}

#[tokio::test]
async fn fail_attempts_follow_the_attempt_label() {
    let cluster = cluster().await;
    let ns = cluster.create_namespace("dc-attempts").await.unwrap();
    let env = |attempt: &str| {
        json!([
            {"name": "SIM_FAIL_ATTEMPTS", "value": "1"},
            {"name": "GPUJOB_ATTEMPT", "value": attempt},
            {"name": "SIM_DURATION_SECONDS", "value": "0"},
        ])
    };
    let (first, _) = run_job(&cluster, &ns, "attempt-1", env("1")).await;
    let (second, _) = run_job(&cluster, &ns, "attempt-2", env("2")).await;
    assert!(condition(&first, "Failed"));
    assert!(condition(&second, "Complete"));
}

#[tokio::test]
async fn an_owned_object_is_collected_after_its_custom_resource_owner_is_deleted() {
    let cluster = cluster().await;
    let ns = cluster.create_namespace("dc-gc").await.unwrap();
    let client = cluster.client(Identity::Admin).await.unwrap();
    let gvk = GroupVersionKind::gvk("devcluster.dev", "v1", "Widget");
    let widgets: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &ns, &ApiResource::from_gvk(&gvk));
    let widget: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "devcluster.dev/v1", "kind": "Widget", "metadata": {"name": "owner"},
    }))
    .unwrap();
    let owner = widgets
        .create(&PostParams::default(), &widget)
        .await
        .unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(client, &ns);
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "owned", "ownerReferences": [{
            "apiVersion": "devcluster.dev/v1", "kind": "Widget", "name": "owner",
            "uid": owner.metadata.uid.unwrap(), "controller": true,
        }]},
    }))
    .unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();

    // Nothing is collected while the owner exists.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        cms.get_opt("owned").await.unwrap().is_some(),
        "collected while its owner exists"
    );

    widgets
        .delete("owner", &DeleteParams::default())
        .await
        .unwrap();
    wait::until(
        "the owned ConfigMap to be garbage-collected",
        WAIT,
        POLL,
        || {
            let cms = cms.clone();
            async move { cms.get_opt("owned").await.ok()?.is_none().then_some(()) }
        },
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn writes_are_audited_under_the_user_who_made_them_and_rbac_is_enforced() {
    let cluster = cluster().await;
    let ns = cluster.create_namespace("dc-audit").await.unwrap();
    let audit = cluster.audit();
    let cursor = audit.cursor().unwrap();
    let admin = cluster.client(Identity::Admin).await.unwrap();
    let replica = cluster.client(Identity::Replica(1)).await.unwrap();
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "from-replica"}})).unwrap();

    // Replicas are granted nothing by devcluster: RBAC refuses the write.
    let denied = Api::<ConfigMap>::namespaced(replica.clone(), &ns)
        .create(&PostParams::default(), &cm)
        .await
        .unwrap_err();
    assert!(
        matches!(&denied, kube::Error::Api(s) if s.code == 403),
        "{denied:?}"
    );

    let role: Role = serde_json::from_value(json!({
        "metadata": {"name": "configmap-writer"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]}],
    }))
    .unwrap();
    Api::<Role>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &role)
        .await
        .unwrap();
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "replicas-write-configmaps"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "configmap-writer"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": REPLICA_GROUP}],
    }))
    .unwrap();
    Api::<RoleBinding>::namespaced(admin, &ns)
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();

    let cms = Api::<ConfigMap>::namespaced(replica, &ns);
    wait::until("RBAC to allow the replica", WAIT, POLL, || {
        let cms = cms.clone();
        let cm = cm.clone();
        async move { cms.create(&PostParams::default(), &cm).await.ok() }
    })
    .await
    .unwrap();

    let events = wait::until("the write to reach the audit log", WAIT, POLL, || {
        let events = audit.since(cursor).unwrap();
        let found = events
            .iter()
            .any(|e| e.name == "from-replica" && e.succeeded());
        async move { found.then_some(events) }
    })
    .await
    .unwrap();
    let writes = events.writes_in(&ns);
    let by_replica: Vec<_> = writes.iter().filter(|e| e.user == "replica-1").collect();
    assert!(
        by_replica
            .iter()
            .any(|e| e.verb == "create" && e.resource == "configmaps" && e.code == 403)
    );
    let ok = by_replica
        .iter()
        .find(|e| e.code == 201)
        .expect("the accepted create");
    assert_eq!(
        (ok.verb.as_str(), ok.name.as_str()),
        ("create", "from-replica")
    );
    assert_eq!(ok.user_agent, "devcluster-test/replica-1");
    assert!(
        writes
            .iter()
            .any(|e| e.user == "admin" && e.resource == "rolebindings")
    );
    assert!(events.iter().all(|e| e.is_write()), "reads are not audited");
}

/// A burst of pods, as when a few hundred Jobs start at once: every pod still gets
/// exactly two status changes from kwok (Running, then its end), however far its watch
/// falls behind. kwok does act on stale pods under load (its watch lags, a relist
/// replays old states); the Stages' JSON patches test the phase they were decided on,
/// so kube-apiserver refuses those (422) instead of moving a pod back.
#[tokio::test]
async fn a_burst_of_pods_moves_each_pod_exactly_twice() {
    const PODS: usize = 300;
    let cluster = cluster().await;
    let ns = cluster.create_namespace("dc-burst").await.unwrap();
    let audit = cluster.audit();
    let cursor = audit.cursor().unwrap();
    let pods: Api<Pod> = Api::namespaced(cluster.client(Identity::Admin).await.unwrap(), &ns);
    let pod = |i: usize| -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": format!("p-{i}")},
            "spec": {"restartPolicy": "Never", "automountServiceAccountToken": false,
                "containers": [{"name": "main", "image": "busybox",
                    "env": [{"name": "SIM_DURATION_SECONDS", "value": "2"}]}]},
        }))
        .unwrap()
    };
    // The namespace's default service account comes from kube-controller-manager.
    wait::until("the first pod to be admitted", WAIT, POLL, || {
        let pods = pods.clone();
        async move { pods.create(&PostParams::default(), &pod(0)).await.ok() }
    })
    .await
    .unwrap();
    futures::stream::iter(1..PODS)
        .for_each_concurrent(32, |i| {
            let pods = pods.clone();
            let p = pod(i);
            async move {
                pods.create(&PostParams::default(), &p).await.unwrap();
            }
        })
        .await;

    wait::until(
        "every pod to succeed",
        Duration::from_secs(120),
        POLL,
        || {
            let pods = pods.clone();
            async move {
                let list = pods.list(&ListParams::default()).await.ok()?;
                let done = list
                    .items
                    .iter()
                    .filter(|p| {
                        p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Succeeded")
                    })
                    .count();
                (done == PODS).then_some(())
            }
        },
    )
    .await
    .unwrap();

    let events = audit.since(cursor).unwrap();
    let mut patches: std::collections::BTreeMap<&str, usize> = Default::default();
    for e in events.writes_in(&ns) {
        if e.resource == "pods" && e.subresource == "status" {
            assert_eq!(e.user, "devcluster:kwok", "{}", e.user_agent);
            assert!(e.code == 200 || e.code == 422, "{e:?}");
            if e.code == 200 {
                *patches.entry(e.name.as_str()).or_default() += 1;
            }
        }
    }
    assert_eq!(patches.len(), PODS);
    let repeated: Vec<_> = patches.iter().filter(|(_, n)| **n != 2).collect();
    assert!(
        repeated.is_empty(),
        "{} of {PODS} pods not patched exactly twice, e.g. {:?}",
        repeated.len(),
        &repeated[..repeated.len().min(5)]
    );
}

#[tokio::test]
async fn apiserver_request_total_counts_a_write() {
    let cluster = cluster().await;
    let ns = cluster.create_namespace("dc-metrics").await.unwrap();
    // Nothing else in the test run creates PodTemplates, so the count is exact.
    let labels = [
        ("resource", "podtemplates"),
        ("verb", "POST"),
        ("code", "201"),
    ];
    let before = cluster
        .apiserver_metrics()
        .await
        .unwrap()
        .sum("apiserver_request_total", &labels);
    let api: Api<PodTemplate> =
        Api::namespaced(cluster.client(Identity::Admin).await.unwrap(), &ns);
    let pt: PodTemplate = serde_json::from_value(json!({
        "metadata": {"name": "t"},
        "template": {"spec": {"containers": [{"name": "c", "image": "busybox"}]}},
    }))
    .unwrap();
    api.create(&PostParams::default(), &pt).await.unwrap();
    let after = cluster
        .apiserver_metrics()
        .await
        .unwrap()
        .sum("apiserver_request_total", &labels);
    assert_eq!(after - before, 1.0, "before {before}, after {after}");
}

/// Creates a bare pod (retrying until the namespace's default service account exists)
/// with `env` on its only container and `labels`, and returns the Api for it.
async fn create_pod(
    cluster: &ControlPlane,
    ns: &str,
    name: &str,
    env: serde_json::Value,
    labels: serde_json::Value,
) -> Api<Pod> {
    let pods: Api<Pod> = Api::namespaced(cluster.client(Identity::Admin).await.unwrap(), ns);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {"restartPolicy": "Never", "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 30,
            "containers": [{"name": "main", "image": "busybox", "env": env}]},
    }))
    .unwrap();
    wait::until(
        &format!("pod {ns}/{name} to be admitted"),
        WAIT,
        POLL,
        || {
            let pods = pods.clone();
            let pod = pod.clone();
            async move { pods.create(&PostParams::default(), &pod).await.ok() }
        },
    )
    .await
    .unwrap();
    pods
}

/// Waits for the pod to reach `phase` and returns it.
async fn wait_phase(pods: &Api<Pod>, name: &str, phase: &str) -> Pod {
    wait::until(&format!("pod {name} to be {phase}"), WAIT, POLL, || {
        let pods = pods.clone();
        async move {
            let pod = pods.get(name).await.ok()?;
            (pod.status.as_ref()?.phase.as_deref() == Some(phase)).then_some(pod)
        }
    })
    .await
    .unwrap()
}

/// Runs a bare pod to its end and returns its phase, exit code and reason.
async fn run_pod(
    cluster: &ControlPlane,
    ns: &str,
    name: &str,
    env: serde_json::Value,
    labels: serde_json::Value,
) -> (String, i32, String) {
    let pods = create_pod(cluster, ns, name, env, labels).await;
    let pod = wait::until(&format!("pod {ns}/{name} to end"), WAIT, POLL, || {
        let pods = pods.clone();
        async move {
            let pod = pods.get(name).await.ok()?;
            let phase = pod.status.as_ref()?.phase.clone()?;
            (phase == "Succeeded" || phase == "Failed").then_some(pod)
        }
    })
    .await
    .unwrap();
    let (code, reason) = terminated(&pod);
    let phase = pod.status.unwrap().phase.unwrap();
    (phase, code, reason)
}

#[tokio::test]
async fn the_reason_and_exit_code_come_from_the_env() {
    let cluster = cluster().await;
    let ns = cluster.create_namespace("dc-reason").await.unwrap();
    let oom = json!([
        {"name": "SIM_EXIT_CODE", "value": "137"},
        {"name": "SIM_REASON", "value": "OOMKilled"},
        {"name": "SIM_DURATION_SECONDS", "value": "0.2"},
    ]);
    assert_eq!(
        run_pod(&cluster, &ns, "oom", oom, json!({})).await,
        ("Failed".to_owned(), 137, "OOMKilled".to_owned())
    );
}

#[tokio::test]
async fn fail_attempts_read_the_attempt_label_when_the_env_has_none() {
    let cluster = cluster().await;
    let ns = cluster.create_namespace("dc-label").await.unwrap();
    let env = json!([
        {"name": "SIM_FAIL_ATTEMPTS", "value": "1"},
        {"name": "SIM_EXIT_CODE", "value": "7"},
        {"name": "SIM_DURATION_SECONDS", "value": "0"},
    ]);
    let first = run_pod(
        &cluster,
        &ns,
        "a1",
        env.clone(),
        json!({"gpujob.dev/attempt": "1"}),
    );
    let second = run_pod(
        &cluster,
        &ns,
        "a2",
        env.clone(),
        json!({"gpujob.dev/attempt": "2"}),
    );
    let (first, second) = futures::join!(first, second);
    assert_eq!(first, ("Failed".to_owned(), 7, "Error".to_owned()));
    assert_eq!(second, ("Succeeded".to_owned(), 0, "Completed".to_owned()));
}

/// A typo in a test's env fails its pod visibly rather than running it as if unset.
#[tokio::test]
async fn a_value_that_does_not_parse_fails_the_pod_with_the_reason() {
    let cluster = cluster().await;
    let ns = cluster.create_namespace("dc-badenv").await.unwrap();
    let cases = [
        (
            "code",
            json!([{"name": "SIM_EXIT_CODE", "value": "three"}]),
            "SIM_EXIT_CODE",
        ),
        (
            "duration",
            json!([{"name": "SIM_DURATION_SECONDS", "value": "-1"}]),
            "SIM_DURATION_SECONDS",
        ),
        (
            "attempt",
            json!([{"name": "SIM_FAIL_ATTEMPTS", "value": "1"}]),
            "GPUJOB_ATTEMPT",
        ),
        (
            "termination",
            json!([{"name": "SIM_TERMINATION_SECONDS", "value": "soon"}]),
            "SIM_TERMINATION_SECONDS",
        ),
    ];
    let runs = cases
        .iter()
        .map(|(name, env, _)| run_pod(&cluster, &ns, name, env.clone(), json!({})));
    let ends = futures::future::join_all(runs).await;
    for ((name, _, names), (phase, code, reason)) in cases.iter().zip(ends) {
        assert_eq!((phase.as_str(), code), ("Failed", 128), "{name}: {reason}");
        assert!(
            reason.starts_with("InvalidSimulatorEnv: ") && reason.contains(names),
            "{name}: {reason}"
        );
    }
}

/// A deleted running pod stops as a kubelet stops it: it stays Terminating for its
/// `SIM_TERMINATION_SECONDS`, ends with exit code 143, and is then removed.
#[tokio::test]
async fn a_deleted_pod_stops_with_143_after_its_termination_time() {
    let cluster = cluster().await;
    let ns = cluster.create_namespace("dc-stop").await.unwrap();
    let env = json!([
        {"name": "SIM_DURATION_SECONDS", "value": "3600"},
        {"name": "SIM_TERMINATION_SECONDS", "value": "3"},
    ]);
    let pods = create_pod(&cluster, &ns, "slow-stop", env, json!({})).await;
    wait_phase(&pods, "slow-stop", "Running").await;
    // Watched from before the delete, so the stopped state is seen even though the pod
    // is removed right after it.
    let mut events = kube::runtime::watcher::watch_object(pods.clone(), "slow-stop").boxed();
    let asked = std::time::Instant::now();
    pods.delete("slow-stop", &DeleteParams::default())
        .await
        .unwrap();
    let mut stopped = None;
    let gone = tokio::time::timeout(WAIT, async {
        while let Some(event) = events.next().await {
            match event.unwrap() {
                Some(pod) => {
                    let failed =
                        pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Failed");
                    if failed && stopped.is_none() {
                        stopped = Some((asked.elapsed(), terminated(&pod)));
                    }
                }
                None => return asked.elapsed(),
            }
        }
        panic!("the watch ended");
    })
    .await
    .expect("the pod to be removed");
    let (after, end) = stopped.expect("the pod to end Failed before it went");
    assert_eq!(end, (143, "Error".to_owned()));
    // deletionTimestamp has whole seconds, so the stop may come up to 1 s early.
    assert!(after >= Duration::from_secs(2), "stopped after {after:?}");
    assert!(gone >= after);
}

/// No pod takes longer to stop than its grace period, whatever its env says.
#[tokio::test]
async fn the_grace_period_bounds_the_termination_time() {
    let cluster = cluster().await;
    let ns = cluster.create_namespace("dc-grace").await.unwrap();
    let env = json!([
        {"name": "SIM_DURATION_SECONDS", "value": "3600"},
        {"name": "SIM_TERMINATION_SECONDS", "value": "600"},
    ]);
    let pods = create_pod(&cluster, &ns, "capped", env, json!({})).await;
    wait_phase(&pods, "capped", "Running").await;
    let asked = std::time::Instant::now();
    pods.delete(
        "capped",
        &DeleteParams {
            grace_period_seconds: Some(2),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    wait::until("the pod to be removed", WAIT, POLL, || {
        let pods = pods.clone();
        async move { pods.get_opt("capped").await.ok()?.is_none().then_some(()) }
    })
    .await
    .unwrap();
    assert!(
        asked.elapsed() < Duration::from_secs(30),
        "took {:?}",
        asked.elapsed()
    );
}

/// A pod that had finished is removed at once when deleted: nothing is left to stop.
#[tokio::test]
async fn a_finished_pod_is_removed_at_once() {
    let cluster = cluster().await;
    let ns = cluster.create_namespace("dc-remove").await.unwrap();
    let env = json!([
        {"name": "SIM_DURATION_SECONDS", "value": "0"},
        {"name": "SIM_TERMINATION_SECONDS", "value": "600"},
    ]);
    let pods = create_pod(&cluster, &ns, "done", env, json!({})).await;
    let pod = wait_phase(&pods, "done", "Succeeded").await;
    assert_eq!(terminated(&pod), (0, "Completed".to_owned()));
    let asked = std::time::Instant::now();
    pods.delete("done", &DeleteParams::default()).await.unwrap();
    wait::until("the pod to be removed", WAIT, POLL, || {
        let pods = pods.clone();
        async move { pods.get_opt("done").await.ok()?.is_none().then_some(()) }
    })
    .await
    .unwrap();
    assert!(
        asked.elapsed() < Duration::from_secs(20),
        "took {:?}",
        asked.elapsed()
    );
}

/// A lost node stays NotReady (kwok no longer reports it Ready), a pod deleted there
/// hangs Terminating, and once the node is marked out of service the pod garbage
/// collector deletes it.
#[tokio::test]
async fn a_lost_nodes_terminating_pod_goes_once_the_node_is_out_of_service() {
    use devcluster::nodes::{GpuNodes, lose, mark_out_of_service, put};
    use k8s_openapi::api::core::v1::Node;

    let cluster = cluster().await;
    let ns = cluster.create_namespace("dc-lost").await.unwrap();
    let admin = cluster.client(Identity::Admin).await.unwrap();
    let name = format!("lost-{ns}");
    let mut node = GpuNodes {
        count: 1,
        gpus_per_node: 1,
        products: vec![name.clone()],
        ..GpuNodes::default()
    }
    .node(0);
    node["metadata"]["name"] = json!(name);
    node["metadata"]["labels"]["kubernetes.io/hostname"] = json!(name);
    put(admin.clone(), &node).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &ns);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "stuck"},
        "spec": {"restartPolicy": "Never", "automountServiceAccountToken": false,
            "nodeName": name, "terminationGracePeriodSeconds": 3600,
            "containers": [{"name": "main", "image": "busybox", "env": [
                {"name": "SIM_DURATION_SECONDS", "value": "3600"},
                {"name": "SIM_TERMINATION_SECONDS", "value": "3600"},
            ]}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    wait_phase(&pods, "stuck", "Running").await;

    lose(admin.clone(), &name).await.unwrap();
    pods.delete("stuck", &DeleteParams::default())
        .await
        .unwrap();
    let nodes: Api<Node> = Api::all(admin.clone());
    let ready = |n: &Node| {
        n.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
            .map(|c| c.status.clone())
    };
    // Well past kwok's reaction time: still NotReady, the pod still there.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        ready(&nodes.get(&name).await.unwrap()).as_deref(),
        Some("Unknown")
    );
    let p = pods.get("stuck").await.unwrap();
    assert!(p.metadata.deletion_timestamp.is_some());

    mark_out_of_service(admin.clone(), &name).await.unwrap();
    // The pod garbage collector looks every 20 s.
    wait::until(
        "the pod to be deleted",
        Duration::from_secs(90),
        POLL,
        || {
            let pods = pods.clone();
            async move { pods.get_opt("stuck").await.ok()?.is_none().then_some(()) }
        },
    )
    .await
    .unwrap();
    nodes.delete(&name, &DeleteParams::default()).await.unwrap();
}
