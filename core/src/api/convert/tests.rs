#![allow(clippy::unwrap_used)]

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use proptest::collection::{btree_map, vec};
use proptest::option;
use proptest::prelude::*;
use proptest::sample::select;
use serde_json::json;

use super::*;
use crate::api::{
    Condition, ConditionStatus, EnvVar, ExitCodeOperator, ExitCodes, FailureAction, FailureRecord,
    FailureRule, GpuJobStatus, Phase, PodConditionPattern, UpdatePolicy,
};

// ---- examples: one per mapping row ----

fn v2_job(spec: Value) -> v2::GpuJob {
    serde_json::from_value(json!({
        "apiVersion": V2, "kind": "GpuJob",
        "metadata": {"name": "train", "namespace": "ml", "uid": "u-1", "generation": 4},
        "spec": spec,
    }))
    .unwrap()
}

fn v1_job(spec: Value) -> GpuJob {
    serde_json::from_value(json!({
        "apiVersion": V1, "kind": "GpuJob",
        "metadata": {"name": "train", "namespace": "ml", "uid": "u-1", "generation": 4},
        "spec": spec,
    }))
    .unwrap()
}

#[test]
fn plain_fields_map_one_to_one() {
    let y = v2_job(json!({
        "image": "img:1", "command": ["python"], "args": ["t.py"],
        "env": [{"name": "A", "value": "1"}],
        "resources": {"gpus": 4},
        "retryPolicy": {"maxRetries": 7},
        "nodeSelector": {"zone": "a"}, "serviceAccountName": "trainer",
        "updatePolicy": "OnNextAttempt", "suspend": true, "ttlSecondsAfterFinished": 60,
    }));
    let x = to_v1(&y);
    assert_eq!(x.metadata, y.metadata, "metadata is copied as is");
    let s = &x.spec;
    assert_eq!(
        (s.image.as_str(), s.command.clone(), s.args.clone()),
        ("img:1", vec!["python".to_owned()], vec!["t.py".to_owned()])
    );
    assert_eq!(
        s.env,
        vec![EnvVar {
            name: "A".into(),
            value: "1".into()
        }]
    );
    assert_eq!((s.gpus, s.max_retries), (4, 7));
    assert_eq!(s.node_selector["zone"], "a");
    assert_eq!(s.service_account_name.as_deref(), Some("trainer"));
    assert_eq!(s.update_policy, UpdatePolicy::OnNextAttempt);
    assert!(s.suspend);
    assert_eq!(s.ttl_seconds_after_finished, Some(60));
    assert_eq!(s.active_deadline_seconds, None);
    assert_eq!(s.v2, None, "nothing v2-only: no spec.v2");
    assert!(
        serde_json::to_value(&x).unwrap()["spec"]
            .get("v2")
            .is_none()
    );
    assert_eq!(to_v2(&x), y);
}

#[test]
fn failure_rules_live_in_spec_v2_of_v1() {
    let rules = json!([
        {"action": "FailGpuJob", "onExitCodes": {"operator": "In", "values": [42]}},
        {"action": "RetryWithoutCounting", "onPodConditions": [{"type": "DisruptionTarget"}]},
    ]);
    let y = v2_job(json!({"image": "i", "resources": {"gpus": 1},
        "retryPolicy": {"maxRetries": 2, "failureRules": rules}}));
    let x = to_v1(&y);
    let written = serde_json::to_value(&x.spec).unwrap();
    assert_eq!(written["v2"]["failureRules"], rules);
    assert_eq!(written["maxRetries"], 2);
    assert_eq!(to_v2(&x), y);
}

#[test]
fn retry_policy_defaults_to_three_retries_in_v2_as_max_retries_does_in_v1() {
    let y = v2_job(json!({"image": "i", "resources": {"gpus": 1}}));
    assert_eq!(y.spec.retry_policy, v2::RetryPolicy::default());
    assert_eq!(to_v1(&y).spec.max_retries, 3);
    let x = v1_job(json!({"image": "i", "gpus": 1}));
    assert_eq!(x.spec.max_retries, 3);
    assert_eq!(to_v2(&x).spec.retry_policy.max_retries, 3);
}

#[test]
fn devices_travel_in_spec_v2_and_gpus_holds_their_count() {
    let devices = json!({"firstAvailable": [
        {"name": "h200", "deviceClassName": "gpu.example.com", "count": 4,
         "selectors": [{"cel": {"expression": "device.attributes[\"gpu.example.com\"].productName == \"H200\""}}]},
        {"name": "h100", "deviceClassName": "gpu.example.com", "count": 8},
    ]});
    let y = v2_job(json!({
        "image": "i", "resources": {"devices": devices},
        "nodes": 2,
    }));
    let x = to_v1(&y);
    assert_eq!(x.spec.gpus, 8, "the largest count");
    assert_eq!(x.spec.total_gpus(), 16, "quota counts it on every node");
    assert_eq!(
        serde_json::to_value(x.spec.devices()).unwrap(),
        devices,
        "kept as written"
    );
    let back = to_v2(&x);
    assert_eq!(back, y);
    assert_eq!(back.spec.resources.gpus, None, "v2 says devices, not gpus");
    assert_eq!(
        serde_json::to_value(&back).unwrap()["spec"]["resources"],
        json!({"devices": devices})
    );
}

#[test]
fn v2_only_values_travel_in_spec_v2() {
    let template = json!({
        "metadata": {"labels": {"team": "ml"}},
        "spec": {"volumes": [{"name": "data", "futureField": {"x": [1, 2.5, null]}}],
                 "priorityClassName": "high"},
    });
    let y = v2_job(json!({
        "image": "i", "resources": {"gpus": 2, "product": "NVIDIA-A100-SXM4-80GB"},
        "retryPolicy": {"maxRetries": 1, "backoffSeconds": 30},
        "template": template,
        "nodes": 4,
        "queueName": "team-a",
    }));
    let x = to_v1(&y);
    assert_eq!(
        x.spec.v2,
        Some(V2Only {
            template: Some(template.clone()),
            gpu_product: Some("NVIDIA-A100-SXM4-80GB".into()),
            backoff_seconds: Some(30),
            attempt_deadline: None,
            failure_rules: Vec::new(),
            nodes: Some(4),
            queue_name: Some("team-a".into()),
            devices: None,
            topology: None,
        })
    );
    assert_eq!(x.spec.queue_name(), Some("team-a"));
    assert_eq!(x.spec.nodes(), 4);
    assert_eq!(x.spec.total_gpus(), 8);
    let back = to_v2(&x);
    assert_eq!(back, y);
    assert_eq!(
        back.spec.template.unwrap()["spec"]["volumes"][0]["futureField"],
        json!({"x": [1, 2.5, null]}),
        "fields k8s-openapi does not know are kept"
    );
}

#[test]
fn one_node_is_the_default_and_leaves_no_trace_in_v1() {
    for nodes in [json!(null), json!(1)] {
        let mut spec = json!({"image": "i", "resources": {"gpus": 1}});
        if !nodes.is_null() {
            spec["nodes"] = nodes;
        }
        let y = v2_job(spec);
        assert_eq!(y.spec.nodes, 1);
        let x = to_v1(&y);
        assert_eq!(x.spec.v2, None, "nothing v1 cannot say");
        assert_eq!(x.spec.nodes(), 1);
        let back = to_v2(&x);
        assert_eq!(back, y);
        assert!(
            serde_json::to_value(&back.spec)
                .unwrap()
                .get("nodes")
                .is_none(),
            "left out when 1, as v1 leaves it"
        );
    }
}

#[test]
fn attempt_deadline_becomes_whole_seconds_and_keeps_its_spelling_when_not_canonical() {
    for (text, seconds, kept) in [
        ("1h30m", 5400, false),
        ("45s", 45, false),
        ("2h", 7200, false),
        ("1m5s", 65, false),
        ("90m", 5400, true),
        ("90s", 90, true),
        ("3600s", 3600, true),
        ("2.5s", 3, true),
        ("1.5s", 2, true),
        ("500ms", 1, true),
    ] {
        let y = v2_job(json!({"image": "i", "resources": {"gpus": 1}, "attemptDeadline": text}));
        let x = to_v1(&y);
        assert_eq!(x.spec.active_deadline_seconds, Some(seconds), "{text}");
        let stored = x
            .spec
            .v2
            .as_ref()
            .and_then(|o| o.attempt_deadline.as_deref());
        assert_eq!(stored, kept.then_some(text), "{text}");
        assert_eq!(to_v2(&x).spec.attempt_deadline.as_deref(), Some(text));
    }
}

#[test]
fn active_deadline_seconds_reads_as_its_canonical_duration() {
    for (seconds, text) in [(5400, "1h30m"), (45, "45s"), (7200, "2h"), (65, "1m5s")] {
        let x = v1_job(json!({"image": "i", "gpus": 1, "activeDeadlineSeconds": seconds}));
        assert_eq!(to_v2(&x).spec.attempt_deadline.as_deref(), Some(text));
    }
    let x = v1_job(json!({"image": "i", "gpus": 1}));
    assert_eq!(to_v2(&x).spec.attempt_deadline, None);
}

#[test]
fn a_stale_stored_spelling_gives_way_to_the_seconds_a_v1_client_set() {
    // Stored from "90m"; a v1 client then set 100 seconds.
    let x = v1_job(
        json!({"image": "i", "gpus": 1, "activeDeadlineSeconds": 100,
        "v2": {"attemptDeadline": "90m"}}),
    );
    assert_eq!(to_v2(&x).spec.attempt_deadline.as_deref(), Some("1m40s"));
    // ... or removed the deadline.
    let x = v1_job(json!({"image": "i", "gpus": 1, "v2": {"attemptDeadline": "90m"}}));
    assert_eq!(to_v2(&x).spec.attempt_deadline, None);
    // Still matching: the spelling stays.
    let x = v1_job(
        json!({"image": "i", "gpus": 1, "activeDeadlineSeconds": 5400,
        "v2": {"attemptDeadline": "90m"}}),
    );
    assert_eq!(to_v2(&x).spec.attempt_deadline.as_deref(), Some("90m"));
}

#[test]
fn a_deadline_that_does_not_parse_is_kept_for_the_operator_to_report() {
    let y = v2_job(json!({"image": "i", "resources": {"gpus": 1}, "attemptDeadline": "soon"}));
    let x = to_v1(&y);
    assert_eq!(x.spec.active_deadline_seconds, None);
    assert_eq!(
        x.spec.v2.as_ref().unwrap().attempt_deadline.as_deref(),
        Some("soon")
    );
    assert_eq!(to_v2(&x), y);
}

#[test]
fn status_is_copied_both_ways() {
    let mut y = v2_job(json!({"image": "i", "resources": {"gpus": 1}}));
    y.status = Some(GpuJobStatus {
        phase: Some(Phase::Running),
        attempts: 2,
        active_job: Some("train-2".into()),
        ..GpuJobStatus::default()
    });
    let x = to_v1(&y);
    assert_eq!(x.status, y.status);
    assert_eq!(to_v2(&x).status, y.status);
}

// ---- convert(): raw objects ----

#[test]
fn convert_sets_the_api_version_and_returns_the_same_version_unchanged() {
    let raw = json!({"apiVersion": V2, "kind": "GpuJob", "metadata": {"name": "t"},
        "spec": {"image": "i", "resources": {"gpus": 2}, "attemptDeadline": "90m", "unknown": 1}});
    let same = convert(raw.clone(), V2).unwrap();
    assert_eq!(same, raw, "unchanged, unknown fields and all");
    let v1 = convert(raw, V1).unwrap();
    assert_eq!(v1["apiVersion"], V1);
    assert_eq!(v1["kind"], "GpuJob");
    assert_eq!(v1["spec"]["gpus"], 2);
    assert_eq!(v1["spec"]["activeDeadlineSeconds"], 5400);
    assert_eq!(v1["spec"]["v2"], json!({"attemptDeadline": "90m"}));
    let v2 = convert(v1, V2).unwrap();
    assert_eq!(v2["apiVersion"], V2);
    assert_eq!(v2["spec"]["attemptDeadline"], "90m");
    assert_eq!(v2["spec"]["resources"], json!({"gpus": 2}));
}

#[test]
fn convert_errors_say_what_is_wrong() {
    let ok = json!({"apiVersion": V1, "kind": "GpuJob", "metadata": {}, "spec": {"image": "i", "gpus": 1}});
    assert_eq!(
        convert(ok.clone(), "gpujob.dev/v3"),
        Err(ConvertError::UnknownDesiredVersion("gpujob.dev/v3".into()))
    );
    let mut o = ok.clone();
    o["apiVersion"] = json!("batch/v1");
    let e = convert(o, V2).unwrap_err();
    assert_eq!(e, ConvertError::UnknownApiVersion("batch/v1".into()));
    assert!(
        e.to_string()
            .contains("\"batch/v1\" is not a GpuJob version"),
        "{e}"
    );
    let mut o = ok.clone();
    o.as_object_mut().unwrap().remove("apiVersion");
    assert_eq!(convert(o, V2), Err(ConvertError::MissingApiVersion));
    let mut o = ok.clone();
    o["kind"] = json!("Job");
    assert_eq!(convert(o, V2), Err(ConvertError::WrongKind("Job".into())));

    let mut o = ok.clone();
    o["spec"]["gpus"] = json!("two");
    let e = convert(o, V2).unwrap_err();
    assert_eq!(e.metric_label(), "decode");
    let text = e.to_string();
    assert!(
        text.starts_with(
            "the gpujob.dev/v1 object does not decode: spec.gpus: invalid type: string \"two\""
        ),
        "{text}"
    );

    let v2 = json!({"apiVersion": V2, "kind": "GpuJob", "metadata": {},
        "spec": {"resources": {"gpus": 1}, "retryPolicy": {"backoffSeconds": 1.5}}});
    let text = convert(v2.clone(), V1).unwrap_err().to_string();
    assert!(
        text.contains("spec.retryPolicy.backoffSeconds: invalid type: floating point"),
        "{text}"
    );
    let mut v2 = v2;
    v2["spec"]["retryPolicy"] = json!({});
    let text = convert(v2, V1).unwrap_err().to_string();
    assert!(text.contains("spec: missing field `image`"), "{text}");
}

// ---- properties ----

fn word() -> impl Strategy<Value = String> {
    "[a-z][a-z0-9-]{0,10}"
}

fn metadata() -> impl Strategy<Value = ObjectMeta> {
    (
        word(),
        option::of(word()),
        option::of("[0-9a-f-]{8,36}"),
        option::of(1i64..1000),
        option::of(btree_map("[a-z./]{1,12}", "[a-z0-9]{0,8}", 0..3)),
        option::of(btree_map("[a-z./]{1,12}", ".{0,16}", 0..3)),
    )
        .prop_map(
            |(name, namespace, uid, generation, labels, annotations)| ObjectMeta {
                name: Some(name),
                namespace,
                uid,
                generation,
                labels,
                annotations,
                ..ObjectMeta::default()
            },
        )
}

fn timestamp() -> impl Strategy<Value = Timestamp> {
    (0i64..4_000_000_000).prop_map(|s| Timestamp::from_second(s).unwrap())
}

fn status() -> impl Strategy<Value = Option<GpuJobStatus>> {
    let phase = option::of(select(vec![
        Phase::Pending,
        Phase::Running,
        Phase::Suspended,
        Phase::Succeeded,
        Phase::Failed,
    ]));
    let condition = (
        word(),
        select(vec![ConditionStatus::True, ConditionStatus::False]),
        timestamp(),
        word(),
        ".{0,20}",
    )
        .prop_map(|(type_, status, t, reason, message)| Condition {
            type_,
            status,
            observed_generation: Some(1),
            last_transition_time: t,
            reason,
            message,
        });
    let failure = (
        1i32..10,
        timestamp(),
        option::of(any::<i32>()),
        word(),
        ".{0,20}",
        any::<bool>(),
        option::of(0i32..19),
    )
        .prop_map(
            |(attempt, time, exit_code, reason, message, counted, rule)| FailureRecord {
                attempt,
                time,
                exit_code,
                reason,
                message,
                counted,
                rule,
            },
        );
    option::of(
        (
            option::of(1i64..100),
            phase,
            vec(condition, 0..3),
            (0i32..10, 0i32..10),
            option::of(word()),
            option::of(timestamp()),
            option::of(failure),
            option::of(word()),
        )
            .prop_map(
                |(
                    observed_generation,
                    phase,
                    conditions,
                    (attempts, failures),
                    active_job,
                    next,
                    last_failure,
                    reservation_id,
                )| {
                    GpuJobStatus {
                        observed_generation,
                        phase,
                        conditions,
                        attempts,
                        failures,
                        active_job,
                        next_attempt_time: next,
                        last_failure,
                        reservation_id,
                        ..GpuJobStatus::default()
                    }
                },
            ),
    )
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        (-1.0e9f64..1.0e9).prop_map(Value::from),
        ".{0,10}".prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 32, 4, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..4).prop_map(Value::Array),
            btree_map("[a-zA-Z./-]{1,10}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A template: an object (the schema says so), often shaped like a pod template.
fn template() -> impl Strategy<Value = Value> {
    prop_oneof![
        btree_map("[a-zA-Z]{1,10}", json_value(), 0..4)
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        (json_value(), json_value()).prop_map(|(labels, volumes)| json!({
            "metadata": {"labels": labels},
            "spec": {"volumes": volumes, "containers": [{"name": "main", "x": 1}]},
        })),
    ]
}

/// Duration strings: canonical, odd spellings, composed parts, and some that do not
/// parse or are not above zero (conversion keeps those; the operator reports them).
fn duration_text() -> impl Strategy<Value = String> {
    let part = (
        0u32..5000,
        option::of(0u32..1000),
        select(vec!["h", "m", "s", "ms"]),
    )
        .prop_map(|(int, frac, unit)| match frac {
            Some(f) => format!("{int}.{f}{unit}"),
            None => format!("{int}{unit}"),
        });
    prop_oneof![
        (1i64..400_000).prop_map(format_seconds),
        (1i64..=i64::MAX).prop_map(format_seconds),
        select(vec![
            "1.5s", "90m", "500ms", "3600s", "0.5ms", ".5h", "1h0m0s", "1.s", "60m", "2.5s", "1ms",
            "+5s", "120s",
        ])
        .prop_map(str::to_owned),
        vec(part, 1..4).prop_map(|p| p.concat()),
        select(vec![
            "",
            "soon",
            "0s",
            "0",
            "-5s",
            "1d",
            "99999999999999999999999h",
        ])
        .prop_map(str::to_owned),
    ]
}

fn env() -> impl Strategy<Value = Vec<EnvVar>> {
    vec(
        ("[A-Z_]{1,8}", ".{0,8}").prop_map(|(name, value)| EnvVar { name, value }),
        0..3,
    )
}

fn policy() -> impl Strategy<Value = UpdatePolicy> {
    select(vec![UpdatePolicy::Recreate, UpdatePolicy::OnNextAttempt])
}

/// The v1 fields every object has, plus `spec.v2` without an attempt deadline.
#[allow(clippy::type_complexity)]
fn v1_base() -> impl Strategy<Value = GpuJob> {
    (
        metadata(),
        (
            "[a-z/:.0-9]{1,20}",
            vec(word(), 0..3),
            vec(".{0,8}", 0..3),
            env(),
        ),
        (1i32..=64, 0i32..=100),
        (
            btree_map("[a-z./]{1,12}", "[a-z0-9]{0,8}", 0..3),
            option::of(word()),
            policy(),
            any::<bool>(),
            option::of(0i64..1_000_000),
        ),
        (
            option::of(template()),
            option::of(".{0,20}"),
            option::of(1i64..100_000),
            failure_rules(),
            option::of(2i32..=128),
            option::of("[a-z][a-z0-9-]{0,10}[a-z0-9]"),
        ),
        status(),
    )
        .prop_map(
            |(
                metadata,
                (image, command, args, env),
                (gpus, max_retries),
                (node_selector, service_account_name, update_policy, suspend, ttl),
                (template, gpu_product, backoff_seconds, failure_rules, nodes, queue_name),
                status,
            )| {
                GpuJob {
                    metadata,
                    spec: GpuJobSpec {
                        image,
                        command,
                        args,
                        env,
                        gpus,
                        max_retries,
                        active_deadline_seconds: None,
                        node_selector,
                        service_account_name,
                        update_policy,
                        suspend,
                        ttl_seconds_after_finished: ttl,
                        v2: Some(V2Only {
                            template,
                            gpu_product,
                            backoff_seconds,
                            attempt_deadline: None,
                            failure_rules,
                            nodes,
                            queue_name,
                            // With devices, v1's gpus is derived (their largest count):
                            // `devices_travel_in_spec_v2_and_gpus_holds_their_count`.
                            devices: None,
                            topology: None,
                        }),
                    },
                    status,
                }
            },
        )
}

/// Up to three failure rules, each on exit codes or on pod conditions.
fn failure_rules() -> impl Strategy<Value = Vec<FailureRule>> {
    let action = prop_oneof![
        Just(FailureAction::FailGpuJob),
        Just(FailureAction::Retry),
        Just(FailureAction::RetryWithoutCounting),
    ];
    let exit_codes = (any::<bool>(), vec(1i32..256, 1..4)).prop_map(|(not_in, values)| {
        Some(ExitCodes {
            operator: if not_in {
                ExitCodeOperator::NotIn
            } else {
                ExitCodeOperator::In
            },
            values,
        })
    });
    let conditions = vec(
        ("[A-Za-z]{1,12}", any::<bool>()).prop_map(|(type_, unset)| PodConditionPattern {
            type_,
            status: (!unset).then_some(ConditionStatus::False),
        }),
        1..3,
    );
    let rule = (action, any::<bool>(), exit_codes, conditions).prop_map(
        |(action, by_code, codes, conditions)| FailureRule {
            action,
            on_exit_codes: by_code.then_some(codes).flatten(),
            on_pod_conditions: (!by_code).then_some(conditions),
        },
    );
    vec(rule, 0..3)
}

fn active_deadline() -> impl Strategy<Value = Option<i64>> {
    prop_oneof![
        Just(None),
        (1i64..200_000).prop_map(Some),
        (1i64..=i64::MAX).prop_map(Some),
    ]
}

/// Sets the deadline fields of `x`; `spec.v2` is left as `Some` even when empty, as a
/// v1 client might write it.
fn with_deadline(mut x: GpuJob, seconds: Option<i64>, text: Option<String>) -> GpuJob {
    x.spec.active_deadline_seconds = seconds;
    if let Some(only) = x.spec.v2.as_mut() {
        only.attempt_deadline = text;
    }
    x
}

/// A v1 object as to_v1 would store it: `spec.v2.attemptDeadline`, when set, stands for
/// `activeDeadlineSeconds` and is not its canonical form (or does not parse, and there
/// are no seconds); `spec.v2` is absent rather than empty.
fn consistent(x: &GpuJob) -> bool {
    let Some(only) = &x.spec.v2 else { return true };
    if *only == V2Only::default() {
        return false;
    }
    only.attempt_deadline.as_ref().is_none_or(|text| {
        let seconds = x.spec.active_deadline_seconds;
        deadline_seconds(text) == seconds && seconds.map(format_seconds).as_ref() != Some(text)
    })
}

/// What a v1 object reads as after a round trip through v2: a stale or canonical
/// `spec.v2.attemptDeadline` is dropped, an empty `spec.v2` is absent. The identity on
/// consistent objects.
fn normalized(mut x: GpuJob) -> GpuJob {
    let seconds = x.spec.active_deadline_seconds;
    if let Some(only) = x.spec.v2.as_mut() {
        let keep = only.attempt_deadline.as_ref().is_some_and(|text| {
            deadline_seconds(text) == seconds && seconds.map(format_seconds).as_ref() != Some(text)
        });
        if !keep {
            only.attempt_deadline = None;
        }
    }
    x.spec.v2 = x.spec.v2.take().and_then(V2Only::non_empty);
    x
}

/// v1 objects whose `spec.v2` is consistent (see [`consistent`]).
fn v1_consistent() -> impl Strategy<Value = GpuJob> {
    (v1_base(), active_deadline(), 0usize..4).prop_map(|(x, seconds, pick)| {
        let text = match seconds {
            // Spellings of exactly these seconds, rounded up.
            Some(n) => [
                None,
                Some(format!("{n}s")),
                Some(format!("{}.5s", n - 1)),
                n.checked_mul(1000).map(|ms| format!("{}ms", ms - 1)),
            ][pick]
                .clone(),
            None => [None, Some("soon".to_owned()), Some("1d".to_owned()), None][pick].clone(),
        };
        let text = text.filter(|t| seconds.map(format_seconds).as_ref() != Some(t));
        normalized(with_deadline(x, seconds, text))
    })
}

/// Any v1 object, `spec.v2` possibly stale (a v1 client changed the seconds) or empty.
fn v1_any() -> impl Strategy<Value = GpuJob> {
    (
        v1_base(),
        active_deadline(),
        option::of(duration_text()),
        any::<bool>(),
    )
        .prop_map(|(x, seconds, text, drop_v2)| {
            let mut x = with_deadline(x, seconds, text);
            if drop_v2 {
                x.spec.v2 = None;
            }
            x
        })
}

fn v2_any() -> impl Strategy<Value = v2::GpuJob> {
    (v1_base(), option::of(duration_text())).prop_map(|(x, attempt_deadline)| {
        let mut y = to_v2(&x);
        y.spec.attempt_deadline = attempt_deadline;
        y
    })
}

proptest! {
    #[test]
    fn v2_to_v1_and_back_is_the_identity(y in v2_any()) {
        let x = to_v1(&y);
        prop_assert!(consistent(&x), "to_v1 stores consistently: {:?}", x.spec.v2);
        prop_assert_eq!(to_v2(&x), y);
    }

    #[test]
    fn consistent_v1_to_v2_and_back_is_the_identity(x in v1_consistent()) {
        prop_assert!(consistent(&x));
        prop_assert_eq!(to_v1(&to_v2(&x)), x);
    }

    /// The one loss, on v1 objects only: a `spec.v2.attemptDeadline` that no longer
    /// stands for `activeDeadlineSeconds` (or is its canonical form), and an empty
    /// `spec.v2`, are dropped; nothing else changes.
    #[test]
    fn any_v1_to_v2_and_back_drops_only_what_is_stale(x in v1_any()) {
        let back = to_v1(&to_v2(&x));
        prop_assert_eq!(normalized(x.clone()) == x, consistent(&x));
        prop_assert_eq!(&back, &normalized(x.clone()));
        prop_assert_eq!(back.spec.active_deadline_seconds, x.spec.active_deadline_seconds);
    }

    #[test]
    fn raw_objects_convert_both_ways(y in v2_any()) {
        let raw = serde_json::to_value(&y).unwrap();
        let v1 = convert(raw.clone(), V1).unwrap();
        prop_assert_eq!(&v1, &serde_json::to_value(to_v1(&y)).unwrap());
        prop_assert_eq!(convert(v1.clone(), V1).unwrap(), v1.clone());
        prop_assert_eq!(convert(v1, V2).unwrap(), raw);
    }

    #[test]
    fn raw_v1_objects_convert_both_ways(x in v1_consistent()) {
        let raw = serde_json::to_value(&x).unwrap();
        let v2 = convert(raw.clone(), V2).unwrap();
        prop_assert_eq!(convert(v2, V1).unwrap(), raw);
    }
}

#[test]
fn the_generators_cover_the_cases_the_properties_are_about() {
    // Each property is only as strong as its inputs: spot-check that stale spellings,
    // kept spellings and templates occur.
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let (mut stale, mut kept, mut templates) = (0, 0, 0);
    for _ in 0..300 {
        let x = v1_any().new_tree(&mut runner).unwrap().current();
        if !consistent(&x) {
            stale += 1;
        }
        let y = v2_any().new_tree(&mut runner).unwrap().current();
        let stored = to_v1(&y);
        if stored
            .spec
            .v2
            .as_ref()
            .is_some_and(|o| o.attempt_deadline.is_some())
        {
            kept += 1;
        }
        if y.spec.template.is_some() {
            templates += 1;
        }
    }
    assert!(
        stale > 30 && kept > 30 && templates > 30,
        "{stale} {kept} {templates}"
    );
}
