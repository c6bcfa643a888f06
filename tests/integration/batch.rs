//! What GPU batch users expect of a GpuJob, on the real control plane (kube-scheduler,
//! the Job controller, kwok as the fake GPU nodes' kubelet): a disrupted attempt (here
//! an eviction through the Eviction API, as a node drain does) is retried without
//! counting against `maxRetries`, and a pod template's `priorityClassName` reaches the
//! pods.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use crate::support;

use std::time::Duration;

use gpujob_operator::api::{LABEL_ATTEMPT, LABEL_UID, Phase};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::api::{Api, DeleteParams, EvictParams, ListParams, PostParams};
use serde_json::json;
use support::{TestEnv, phase, sim_env, with_reasons};

/// The GpuJob's pods of `attempt` that kwok runs (phase Running).
async fn running_pods(env: &TestEnv, uid: &str, attempt: i32) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(env.admin.clone(), &env.ns);
    let selector = format!("{LABEL_UID}={uid},{LABEL_ATTEMPT}={attempt}");
    pods.list(&ListParams::default().labels(&selector))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .collect()
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
    let pods: Api<Pod> = Api::namespaced(env.admin.clone(), &env.ns);
    pods.evict(
        pod.metadata.name.as_deref().unwrap(),
        &EvictParams::default(),
    )
    .await
    .unwrap();

    let second = env
        .wait_gpujob("train", "attempt 2 running", |g| {
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
