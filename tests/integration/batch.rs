//! What GPU batch users expect of a GpuJob, on the real control plane (kube-scheduler,
//! the Job controller, kwok as the fake GPU nodes' kubelet): a disrupted attempt (here
//! an eviction through the Eviction API, as a node drain does) is retried without
//! counting against `maxRetries`, a pod template's `priorityClassName` reaches the
//! pods, failure rules decide what a failed attempt does, and a multi-node GpuJob runs
//! each attempt as an Indexed Job whose pods find each other through a headless Service.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use crate::support;

use std::time::Duration;

use gpujob_operator::api::{FailureRecord, LABEL_ATTEMPT, LABEL_UID, Phase, SCHEDULING_GATE};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::api::{Api, DeleteParams, EvictParams, ListParams, PostParams};
use serde_json::json;
use support::{TestEnv, phase, sim_env, with_reasons};

/// The GpuJob's pods of `attempt` that kwok runs (phase Running).
async fn running_pods(env: &TestEnv, uid: &str, attempt: i32) -> Vec<Pod> {
    env.running_pods(&format!("{LABEL_UID}={uid},{LABEL_ATTEMPT}={attempt}"))
        .await
}

async fn wait_running_pod(env: &TestEnv, uid: &str, attempt: i32) -> Pod {
    devcluster::wait::until(
        &format!("a running pod of attempt {attempt}"),
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async { running_pods(env, uid, attempt).await.into_iter().next() },
    )
    .await
    .unwrap()
}

/// Evicts `pod` (as a node drain does: the API server marks it DisruptionTarget, then
/// deletes it) and waits for GpuJob `name` to run attempt 2; checks that the disruption
/// was recorded as attempt 1's, not counted, and returns that record.
async fn evict_and_wait_for_attempt_2(env: &TestEnv, name: &str, pod: &Pod) -> FailureRecord {
    let pods: Api<Pod> = Api::namespaced(env.admin.clone(), &env.ns);
    pods.evict(
        pod.metadata.name.as_deref().unwrap(),
        &EvictParams::default(),
    )
    .await
    .unwrap();
    let second = env
        .wait_gpujob(name, "attempt 2 running", |g| {
            g.status.as_ref().is_some_and(|s| s.attempts == 2) && phase(g) == Some(Phase::Running)
        })
        .await;
    let status = second.status.unwrap();
    assert_eq!(status.failures, 0, "the disruption was counted: {status:?}");
    let f = status.last_failure.unwrap();
    assert_eq!(
        (f.attempt, f.reason.as_str(), f.counted),
        (1, "Disrupted", false)
    );
    f
}

#[tokio::test]
async fn an_evicted_attempt_is_retried_without_counting_against_max_retries() {
    let env = TestEnv::new("disrupted").await;
    let op = env.operator("disrupted", env.settings()).await;
    // No retries: a counted failure would end the GpuJob Failed.
    let created = env
        .create(
            "train",
            json!({"image": "i", "gpus": 1, "maxRetries": 0,
                   "env": sim_env(&[("SIM_DURATION_SECONDS", "3600")])}),
        )
        .await;
    let uid = created.metadata.uid.clone().unwrap();
    let pod = wait_running_pod(&env, &uid, 1).await;

    // A node drain evicts it: the API server marks it DisruptionTarget, then deletes it.
    let f = evict_and_wait_for_attempt_2(&env, "train", &pod).await;
    assert!(
        f.message.contains("DisruptionTarget") && f.message.contains("without counting"),
        "{}",
        f.message
    );
    // The next attempt runs, on the same quota of retries (none).
    wait_running_pod(&env, &uid, 2).await;
    let events = env
        .events_of("train", with_reasons(&["AttemptDisrupted"]))
        .await;
    let reasons: Vec<&str> = events.iter().map(|(_, r, _, _)| r.as_str()).collect();
    assert!(reasons.contains(&"AttemptDisrupted"), "{events:?}");
    assert!(!reasons.contains(&"AttemptFailed"), "{events:?}");
    // Counted apart from failures (right after the status write that recorded it).
    let metrics = devcluster::wait::until(
        "the uncounted attempt in the metrics",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || async {
            let text = op.status.render_metrics();
            text.contains("gpujob_attempts_uncounted_total 1\n")
                .then_some(text)
        },
    )
    .await
    .unwrap();
    assert!(
        metrics.contains("gpujob_attempts_failed_total 0\n"),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_templates_priority_class_reaches_the_pods() {
    let env = TestEnv::new("priority").await;
    let _op = env.operator("priority", env.settings()).await;
    // Priority classes are cluster-wide: one named after this test's namespace.
    let name = format!("{}-high", env.ns);
    let classes: Api<PriorityClass> = Api::all(env.admin.clone());
    let class: PriorityClass = serde_json::from_value(json!({
        "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
        "metadata": {"name": name}, "value": 100000,
    }))
    .unwrap();
    classes
        .create(&PostParams::default(), &class)
        .await
        .unwrap();

    let created = env
        .create(
            "ranked",
            json!({"image": "i", "gpus": 1,
                   "env": sim_env(&[("SIM_DURATION_SECONDS", "3600")]),
                   // v2's spec.template, as v1 carries it.
                   "v2": {"template": {"spec": {"priorityClassName": name}}}}),
        )
        .await;
    let uid = created.metadata.uid.clone().unwrap();
    let pod = wait_running_pod(&env, &uid, 1).await;
    let spec = pod.spec.unwrap();
    assert_eq!(spec.priority_class_name.as_deref(), Some(name.as_str()));
    // Admission resolved the class: the pod carries its value.
    assert_eq!(spec.priority, Some(100000));
    classes
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
}

/// A GpuJob whose main container fails with `code` (attempts 1 to `failing` when given).
fn failing_spec(
    code: &str,
    failing: Option<&str>,
    max_retries: i32,
    rules: serde_json::Value,
) -> serde_json::Value {
    let mut env = vec![("SIM_EXIT_CODE", code), ("SIM_DURATION_SECONDS", "0.5")];
    if let Some(n) = failing {
        env.push(("SIM_FAIL_ATTEMPTS", n));
    }
    json!({"image": "i", "gpus": 1, "maxRetries": max_retries, "env": sim_env(&env),
           // v2's retryPolicy.failureRules and backoffSeconds, as v1 carries them.
           "v2": {"failureRules": rules, "backoffSeconds": 1}})
}

#[tokio::test]
async fn a_failure_rule_on_an_exit_code_fails_the_gpujob_at_once() {
    let env = TestEnv::new("rule-fail").await;
    let _op = env.operator("rule-fail", env.settings()).await;
    let rules =
        json!([{"action": "FailGpuJob", "onExitCodes": {"operator": "In", "values": [42]}}]);
    env.create("config-error", failing_spec("42", None, 3, rules))
        .await;
    let failed = env
        .wait_gpujob("config-error", "Failed", |g| {
            phase(g) == Some(Phase::Failed)
        })
        .await;
    let status = failed.status.clone().unwrap();
    assert_eq!((status.attempts, status.failures), (1, 1), "no retry");
    let f = status.last_failure.unwrap();
    assert_eq!((f.rule, f.exit_code), (Some(0), Some(42)));
    let (_, reason, message) = support::ready(&failed).unwrap();
    assert_eq!(reason, "FailureRuleMatched");
    assert!(
        message.contains("failure rule 0 (FailGpuJob) matched"),
        "{message}"
    );
    let events = env
        .events_of("config-error", with_reasons(&["AttemptFailed"]))
        .await;
    assert!(
        events
            .iter()
            .any(|(_, r, note, _)| r == "AttemptFailed" && note.contains("failure rule 0")),
        "{events:?}"
    );
}

#[tokio::test]
async fn a_failure_rule_that_does_not_count_lets_a_gpujob_without_retries_succeed() {
    let env = TestEnv::new("rule-retry").await;
    let _op = env.operator("rule-retry", env.settings()).await;
    let rules = json!([{"action": "RetryWithoutCounting", "onExitCodes": {"operator": "In", "values": [7]}}]);
    // Attempts 1 and 2 exit 7; the third succeeds, with no retries allowed.
    env.create("flaky", failing_spec("7", Some("2"), 0, rules))
        .await;
    let done = env
        .wait_gpujob("flaky", "Succeeded", |g| {
            phase(g).is_some_and(|p| p.is_final())
        })
        .await;
    let status = done.status.unwrap();
    assert_eq!(status.phase, Some(Phase::Succeeded), "{status:?}");
    assert_eq!((status.attempts, status.failures), (3, 0));
    let f = status.last_failure.unwrap();
    assert_eq!((f.attempt, f.rule, f.counted), (2, Some(0), false));
}

#[tokio::test]
async fn the_api_server_refuses_a_malformed_failure_rule_and_names_it() {
    let env = TestEnv::new("rule-invalid").await;
    // Untyped, so that a value the types refuse reaches the API server.
    let resource = kube::api::ApiResource::erase::<gpujob_operator::api::GpuJob>(&());
    let api: Api<kube::api::DynamicObject> =
        Api::namespaced_with(env.admin.clone(), &env.ns, &resource);
    let refused = |rules: serde_json::Value| {
        let api = api.clone();
        async move {
            let gj: kube::api::DynamicObject = serde_json::from_value(json!({
                "apiVersion": "gpujob.dev/v1", "kind": "GpuJob",
                "metadata": {"name": "bad"},
                "spec": {"image": "i", "gpus": 1, "v2": {"failureRules": rules}},
            }))
            .unwrap();
            match api.create(&PostParams::default(), &gj).await {
                Err(kube::Error::Api(s)) => (s.code, s.message),
                other => panic!("accepted: {other:?}"),
            }
        }
    };
    let (code, message) = refused(json!([{"action": "Retry",
        "onExitCodes": {"operator": "In", "values": [1]},
        "onPodConditions": [{"type": "DisruptionTarget"}]}]))
    .await;
    assert_eq!(code, 422);
    assert!(
        message.contains("spec.v2.failureRules[0]")
            && message.contains("exactly one of onExitCodes and onPodConditions"),
        "{message}"
    );
    let (_, message) = refused(json!([{"action": "Retry",
        "onExitCodes": {"operator": "In", "values": [0, 1]}}]))
    .await;
    assert!(
        message.contains("spec.v2.failureRules[0].onExitCodes") && message.contains("0 is success"),
        "{message}"
    );
    let (_, message) = refused(json!([{"action": "Sometimes",
        "onExitCodes": {"operator": "In", "values": [1]}}]))
    .await;
    assert!(
        message.contains("spec.v2.failureRules[0].action"),
        "{message}"
    );
}

/// The Services of `uid`'s attempts.
async fn services_of(env: &TestEnv, uid: &str) -> Vec<Service> {
    let api: Api<Service> = Api::namespaced(env.admin.clone(), &env.ns);
    api.list(&ListParams::default().labels(&format!("{LABEL_UID}={uid}")))
        .await
        .unwrap()
        .items
}

/// The host names the EndpointSlices of Service `service` list (what the cluster DNS
/// serves as `<host>.<service>`), sorted.
async fn endpoint_hosts(env: &TestEnv, service: &str) -> Vec<String> {
    let api: Api<EndpointSlice> = Api::namespaced(env.admin.clone(), &env.ns);
    let selector = format!("kubernetes.io/service-name={service}");
    let mut hosts: Vec<String> = api
        .list(&ListParams::default().labels(&selector))
        .await
        .unwrap()
        .items
        .into_iter()
        .flat_map(|s| s.endpoints.into_iter().flatten())
        .filter_map(|e| e.hostname)
        .collect();
    hosts.sort();
    hosts
}

#[tokio::test]
async fn a_two_node_gpujob_runs_indexed_pods_on_two_nodes_that_find_each_other() {
    let env = TestEnv::new("two-node").await;
    let mut settings = env.settings();
    // --max-gpus counts the GpuJob's GPUs on all its nodes.
    settings.plan.limits.max_gpus = 16;
    let op = env.operator("two-node", settings).await;
    // 8 GPUs on each node: one fake GPU node holds one pod, no more.
    let created = env
        .create(
            "dist",
            json!({"image": "i", "gpus": 8, "maxRetries": 0,
                   "env": sim_env(&[("SIM_DURATION_SECONDS", "3600")]),
                   // v2's spec.nodes, as v1 carries it.
                   "v2": {"nodes": 2}}),
        )
        .await;
    let uid = created.metadata.uid.clone().unwrap();
    let pods = devcluster::wait::until(
        "both pods of attempt 1 running",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async {
            let pods = running_pods(&env, &uid, 1).await;
            (pods.len() == 2).then_some(pods)
        },
    )
    .await
    .unwrap();
    let mut hosts = Vec::new();
    let mut nodes = Vec::new();
    for pod in &pods {
        let spec = pod.spec.clone().unwrap();
        assert_eq!(spec.subdomain.as_deref(), Some("dist-1"));
        hosts.push(spec.hostname.clone().unwrap());
        nodes.push(spec.node_name.clone().unwrap());
        let env_of = |name: &str| {
            spec.containers[0]
                .env
                .iter()
                .flatten()
                .find(|e| e.name == name)
                .cloned()
                .unwrap_or_else(|| panic!("{name} in {:?}", spec.containers[0].env))
        };
        assert_eq!(env_of("WORLD_SIZE").value.as_deref(), Some("2"));
        assert_eq!(
            env_of("MASTER_ADDR").value.as_deref(),
            Some("dist-1-0.dist-1")
        );
        let rank = env_of("RANK").value_from.unwrap().field_ref.unwrap();
        // The pod's own index, which its host name ends in.
        let index =
            pod.metadata.annotations.as_ref().unwrap()["batch.kubernetes.io/job-completion-index"]
                .clone();
        assert!(rank.field_path.contains("job-completion-index"), "{rank:?}");
        assert_eq!(spec.hostname.as_deref(), Some(&*format!("dist-1-{index}")));
    }
    hosts.sort();
    assert_eq!(hosts, ["dist-1-0", "dist-1-1"]);
    assert_ne!(nodes[0], nodes[1], "one node each (8 GPUs per pod)");

    // The attempt's headless Service, owned by its Job, names both pods.
    let services = services_of(&env, &uid).await;
    assert_eq!(services.len(), 1, "{services:?}");
    let svc = &services[0];
    assert_eq!(svc.metadata.name.as_deref(), Some("dist-1"));
    assert_eq!(
        svc.spec.as_ref().unwrap().cluster_ip.as_deref(),
        Some("None")
    );
    let jobs: Api<Job> = Api::namespaced(env.admin.clone(), &env.ns);
    let job = jobs.get("dist-1").await.unwrap();
    let owner = &svc.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), &owner.uid),
        ("Job", job.metadata.uid.as_ref().unwrap())
    );
    let listed = devcluster::wait::until(
        "the Service's endpoints naming both pods",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async {
            let hosts = endpoint_hosts(&env, "dist-1").await;
            (hosts.len() == 2).then_some(hosts)
        },
    )
    .await
    .unwrap();
    assert_eq!(listed, hosts);

    // One pod disrupted fails the whole attempt (its partner is stopped with it); the
    // next attempt starts on two nodes again, not counted.
    evict_and_wait_for_attempt_2(&env, "dist", &pods[1]).await;
    devcluster::wait::until(
        "both pods of attempt 2 running",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async { (running_pods(&env, &uid, 2).await.len() == 2).then_some(()) },
    )
    .await
    .unwrap();
    let names: Vec<String> = services_of(&env, &uid)
        .await
        .into_iter()
        .filter_map(|s| s.metadata.name)
        .collect();
    assert!(names.contains(&"dist-2".to_owned()), "{names:?}");
    let text = op.status.render_metrics();
    assert!(
        text.contains("gpujob_reconcile_errors_total{error=\"create_service\"} 0\n"),
        "{}",
        text.lines()
            .filter(|l| l.contains("create_service"))
            .collect::<Vec<_>>()
            .join("\n")
    );

    // Deleted: its Jobs go, and their Services with them (garbage collection).
    env.gpujobs()
        .delete("dist", &DeleteParams::default())
        .await
        .unwrap();
    devcluster::wait::until(
        "the attempts' Services collected",
        Duration::from_secs(90),
        Duration::from_millis(500),
        || async { services_of(&env, &uid).await.is_empty().then_some(()) },
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn a_foreign_service_under_the_attempts_name_holds_its_job_until_it_is_gone() {
    let env = TestEnv::new("svc-clash").await;
    let _op = env.operator("svc-clash", env.settings()).await;
    let services: Api<Service> = Api::namespaced(env.admin.clone(), &env.ns);
    let foreign: Service = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "clash-1"},
        "spec": {"clusterIP": "None", "selector": {"app": "other"}},
    }))
    .unwrap();
    services
        .create(&PostParams::default(), &foreign)
        .await
        .unwrap();
    let created = env
        .create(
            "clash",
            json!({"image": "i", "gpus": 1,
                   "env": sim_env(&[("SIM_DURATION_SECONDS", "3600")]),
                   "v2": {"nodes": 2}}),
        )
        .await;
    let uid = created.metadata.uid.clone().unwrap();
    // The name taken: the Job is not started, and the GpuJob says why.
    let waiting = env
        .wait_gpujob("clash", "waiting for the Service name", |g| {
            support::ready(g).is_some_and(|(_, reason, _)| reason == "ServiceNameConflict")
        })
        .await;
    assert_eq!(phase(&waiting), Some(Phase::Pending));
    let (_, _, message) = support::ready(&waiting).unwrap();
    assert!(
        message.contains(&format!("Service {}/clash-1 exists", env.ns)),
        "{message}"
    );
    let events = env
        .events_of("clash", with_reasons(&["ServiceNameConflict"]))
        .await;
    assert!(
        events
            .iter()
            .any(|(_, r, note, _)| r == "ServiceNameConflict" && note.contains("clash-1")),
        "{events:?}"
    );
    let pods: Api<Pod> = Api::namespaced(env.admin.clone(), &env.ns);
    let made = pods
        .list(&ListParams::default().labels("job-name=clash-1"))
        .await
        .unwrap();
    assert!(
        made.items.iter().all(|p| p
            .spec
            .as_ref()
            .and_then(|s| s.scheduling_gates.as_ref())
            .is_some_and(|g| g.iter().any(|g| g.name == SCHEDULING_GATE))),
        "not let go while its pods could not find each other: {:?}",
        made.items
    );
    assert!(running_pods(&env, &uid, 1).await.is_empty());
    let kept = services.get("clash-1").await.unwrap();
    assert_eq!(
        kept.spec.unwrap().selector.unwrap()["app"],
        "other",
        "the foreign Service is left as it was"
    );

    // Gone: the attempt's own Service is made and its Job starts.
    services
        .delete("clash-1", &DeleteParams::default())
        .await
        .unwrap();
    devcluster::wait::until(
        "both pods of attempt 1 running",
        Duration::from_secs(120),
        Duration::from_millis(200),
        || async { (running_pods(&env, &uid, 1).await.len() == 2).then_some(()) },
    )
    .await
    .unwrap();
    let own = services.get("clash-1").await.unwrap();
    assert_eq!(
        own.metadata.owner_references.unwrap()[0].kind,
        "Job",
        "the attempt's own Service now"
    );
}
