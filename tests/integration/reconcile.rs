//! The reconcile core against a real API server: attempts, retries, status, idempotency,
//! restarts. Each test runs its own operator, scoped to its own namespace.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use devcluster::audit::AuditEvent;
use devcluster::wait;
use futures::StreamExt;
use gpujob_operator::api::{GPU_RESOURCE, GpuJob, LABEL_NAME, LABEL_UID, Phase};
use gpujob_operator::controller::plan::{JobState, job_state};
use gpujob_operator::controller::validate::ServiceAccounts;
use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use support::{POLL, TestEnv, WAIT, phase, ready, sim_env};

fn created(job: &Job) -> Timestamp {
    job.metadata.creation_timestamp.as_ref().unwrap().0
}

/// Records the most Jobs of one GpuJob active at the same time, from a watch of its
/// Jobs: every change of every Job arrives, in order, so no active spell is missed (a
/// poll every 100 ms missed a 0.5 s attempt under load). [`Concurrency::most`] waits
/// until the watch has seen `jobs` Jobs finish, then stops it.
struct Concurrency {
    state: Arc<Mutex<(usize, BTreeSet<String>)>>,
    handle: tokio::task::JoinHandle<()>,
}

impl Concurrency {
    async fn most(self, jobs: usize) -> usize {
        let state = self.state.clone();
        wait::until(
            &format!("the watch to see {jobs} Jobs finish"),
            WAIT,
            POLL,
            || {
                let state = state.clone();
                async move { (state.lock().unwrap().1.len() >= jobs).then_some(()) }
            },
        )
        .await
        .unwrap();
        self.handle.abort();
        self.state.lock().unwrap().0
    }
}

fn watch_concurrency(env: &TestEnv, gj: GpuJob) -> Concurrency {
    let state = Arc::new(Mutex::new((0, BTreeSet::new())));
    let jobs = env.jobs();
    let uid = gj.metadata.uid.clone().unwrap();
    let s = state.clone();
    let handle = tokio::spawn(async move {
        let config = watcher::Config::default().labels(&format!("gpujob.dev/uid={uid}"));
        let mut events = watcher(jobs, config).default_backoff().boxed();
        let mut active: BTreeMap<String, bool> = BTreeMap::new();
        while let Some(event) = events.next().await {
            let Ok(event) = event else { continue };
            match event {
                watcher::Event::Init => active.clear(),
                watcher::Event::Apply(j) | watcher::Event::InitApply(j) => {
                    let name = j.metadata.name.clone().unwrap_or_default();
                    let is_active = job_state(&j) == JobState::Active;
                    if !is_active {
                        s.lock().unwrap().1.insert(name.clone());
                    }
                    active.insert(name, is_active);
                }
                watcher::Event::Delete(j) => {
                    active.remove(&j.metadata.name.clone().unwrap_or_default());
                }
                watcher::Event::InitDone => {}
            }
            let now = active.values().filter(|a| **a).count();
            let mut state = s.lock().unwrap();
            state.0 = state.0.max(now);
        }
    });
    Concurrency { state, handle }
}

fn operator_writes(events: &[AuditEvent], agent: &str, ns: &str) -> Vec<AuditEvent> {
    events
        .iter()
        .filter(|e| e.user_agent == agent && e.namespace == ns && e.is_write())
        .cloned()
        .collect()
}

#[tokio::test]
async fn seed_walkthrough_one_job_then_succeeded_then_collected() {
    let env = TestEnv::new("seed").await;
    let op = env.operator("seed", env.settings()).await;
    env.create(
        "train",
        json!({"image": "registry.example/train:1", "gpus": 2, "env": sim_env(&[("SIM_DURATION_SECONDS", "3")])}),
    )
    .await;

    let running = env
        .wait_gpujob("train", "Running", |g| phase(g) == Some(Phase::Running))
        .await;
    let status = running.status.clone().unwrap();
    assert_eq!(status.observed_generation, running.metadata.generation);
    assert_eq!((status.attempts, status.failures), (1, 0));
    assert_eq!(status.active_job.as_deref(), Some("train-1"));
    assert!(status.start_time.is_some());
    let (s, reason, _) = ready(&running).unwrap();
    assert_eq!((s.as_str(), reason.as_str()), ("False", "JobRunning"));

    let jobs = env.jobs_of(&running).await;
    assert_eq!(jobs.len(), 1, "exactly one Job");
    let job = &jobs[0];
    assert_eq!(job.metadata.name.as_deref(), Some("train-1"));
    let owner = &job.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.controller),
        ("GpuJob", Some(true))
    );
    assert_eq!(owner.uid, running.metadata.uid.clone().unwrap());
    let pod = job.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    let limits = pod.containers[0]
        .resources
        .as_ref()
        .unwrap()
        .limits
        .as_ref()
        .unwrap();
    assert_eq!(limits[GPU_RESOURCE].0, "2");

    let done = env
        .wait_gpujob("train", "Succeeded", |g| phase(g) == Some(Phase::Succeeded))
        .await;
    let (s, reason, _) = ready(&done).unwrap();
    assert_eq!((s.as_str(), reason.as_str()), ("True", "Succeeded"));
    let status = done.status.unwrap();
    assert!(status.completion_time.is_some());
    assert_eq!(status.active_job, None);
    assert_eq!(
        env.jobs_of(&running).await.len(),
        1,
        "still exactly one Job"
    );

    env.gpujobs()
        .delete("train", &DeleteParams::default())
        .await
        .unwrap();
    let jobs = env.jobs();
    wait::until(
        "the Job to be garbage-collected",
        Duration::from_secs(60),
        POLL,
        || {
            let jobs = jobs.clone();
            async move { jobs.get_opt("train-1").await.ok()?.is_none().then_some(()) }
        },
    )
    .await
    .unwrap();
    op.stop().await;
}

#[tokio::test]
async fn failures_retry_in_order_with_backoff_then_fail_with_the_exit_code() {
    let env = TestEnv::new("retries").await;
    let op = env.operator("retries", env.settings()).await;
    let gj = env
        .create(
            "flaky",
            json!({"image": "i", "gpus": 1, "maxRetries": 2,
                   "env": sim_env(&[("SIM_EXIT_CODE", "1"), ("SIM_DURATION_SECONDS", "0.5")])}),
        )
        .await;
    let concurrency = watch_concurrency(&env, gj.clone());

    let failed = env
        .wait_gpujob("flaky", "Failed", |g| phase(g) == Some(Phase::Failed))
        .await;
    let status = failed.status.clone().unwrap();
    assert_eq!((status.attempts, status.failures), (3, 3));
    let (s, reason, message) = ready(&failed).unwrap();
    assert_eq!((s.as_str(), reason.as_str()), ("False", "RetriesExhausted"));
    assert!(message.contains("exit code 1"), "{message}");
    assert_eq!(status.last_failure.as_ref().unwrap().exit_code, Some(1));
    assert_eq!(status.next_attempt_time, None);

    let jobs = env.jobs_of(&gj).await;
    env.assert_attempts_sequential("flaky", &jobs, 3).await;
    assert_eq!(
        concurrency.most(3).await,
        1,
        "two attempts were active at once"
    );
    // Backoff 1 s after the first failure, 2 s after the second (second precision),
    // measured from when each attempt's pod ended.
    let mut ended = Vec::new();
    for j in &jobs {
        ended.push(env.ended_at(j).await);
    }
    let gap = |k: usize| created(&jobs[k + 1]).duration_since(ended[k]).as_secs();
    let detail = || {
        jobs.iter()
            .map(|j| {
                format!(
                    "{:?} created {} failed {:?}",
                    j.metadata.name,
                    created(j),
                    job_state(j)
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert!(
        gap(0) >= 1,
        "first backoff {}s; status {:?}\n{}",
        gap(0),
        status.last_failure,
        detail()
    );
    assert!(gap(1) >= 2, "second backoff {}s\n{}", gap(1), detail());
    op.stop().await;
}

#[tokio::test]
async fn a_failed_first_attempt_then_success() {
    let env = TestEnv::new("recover").await;
    let op = env.operator("recover", env.settings()).await;
    let gj = env
        .create(
            "second-time",
            json!({"image": "i", "gpus": 1, "env": sim_env(&[("SIM_FAIL_ATTEMPTS", "1")])}),
        )
        .await;
    let done = env
        .wait_gpujob("second-time", "Succeeded", |g| {
            phase(g) == Some(Phase::Succeeded)
        })
        .await;
    let status = done.status.unwrap();
    assert_eq!((status.attempts, status.failures), (2, 1));
    assert_eq!(status.last_failure.unwrap().attempt, 1);
    env.assert_attempts_sequential("second-time", &env.jobs_of(&gj).await, 2)
        .await;
    op.stop().await;
}

#[tokio::test]
async fn three_writes_per_gpujob_to_running_and_none_when_converged() {
    let env = TestEnv::new("writes").await;
    let identity = "writes";
    let agent = TestEnv::agent(identity);
    let audit = env.cluster.audit();
    let start = audit.cursor().unwrap();
    let op = env.operator(identity, env.settings()).await;
    const N: usize = 20;
    for i in 0..N {
        env.create(
            &format!("gj-{i}"),
            json!({"image": "i", "gpus": 1, "env": sim_env(&[("SIM_DURATION_SECONDS", "300")])}),
        )
        .await;
    }
    for i in 0..N {
        env.wait_gpujob(&format!("gj-{i}"), "Running", |g| {
            phase(g) == Some(Phase::Running)
        })
        .await;
    }
    // Every attempt's pod let go (its scheduling gate removed) and running.
    wait::until("every attempt's pod running", WAIT, POLL, || async {
        let running = env.running_pods(LABEL_UID).await.len();
        (running == N).then_some(())
    })
    .await
    .unwrap();
    // Each attempt's Event written (in the background, after the status), then a while
    // for late events (the Job controller's status updates, our own echoes) to cost
    // writes they should not.
    support::signals::events_done(&op.status.metrics, N as u64).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let writes = operator_writes(&audit.since(start).unwrap(), &agent, &env.ns);
    let creates = writes
        .iter()
        .filter(|e| e.resource == "jobs" && e.verb == "create")
        .count();
    let starts = writes
        .iter()
        .filter(|e| e.resource == "pods" && e.verb == "patch")
        .count();
    let patches = writes
        .iter()
        .filter(|e| e.resource == "gpujobs" && e.subresource == "status" && e.verb == "patch")
        .count();
    let conflicts = writes.iter().filter(|e| e.code == 409).count();
    assert_eq!(
        (creates, starts, patches, conflicts),
        (N, N, N, 0),
        "writes: {writes:#?}"
    );
    // Besides those, only the "AttemptStarted" Event of each GpuJob (Events are for
    // people, not part of the control loop's writes).
    let (events, control): (Vec<_>, Vec<_>) = writes.iter().partition(|e| e.resource == "events");
    assert_eq!(
        control.len(),
        3 * N,
        "3.0 writes per GpuJob (the Job's create, the status, the pod's gate removed), nothing else: {control:#?}"
    );
    assert_eq!(
        events.len(),
        N,
        "one Event per started attempt: {events:#?}"
    );

    // Converged: forced reconciles (annotation changes), duplicate Job events (label
    // changes) and a restarted operator cost zero writes.
    let converged = audit.cursor().unwrap();
    let pp = PatchParams::default();
    for i in 0..20 {
        let patch = json!({"metadata": {"annotations": {"test/poke": i.to_string()}}});
        env.gpujobs()
            .patch("gj-0", &pp, &Patch::Merge(&patch))
            .await
            .unwrap();
        let patch = json!({"metadata": {"labels": {"test/poke": i.to_string()}}});
        env.jobs()
            .patch("gj-1-1", &pp, &Patch::Merge(&patch))
            .await
            .unwrap();
    }
    op.stop().await;
    let op = env.operator(identity, env.settings()).await;
    // Once the restarted operator has looked at every GpuJob (and a while for what
    // could follow), not after a duration that a slow start could use up.
    support::signals::first_looks_done(&op, 1).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let writes = operator_writes(&audit.since(converged).unwrap(), &agent, &env.ns);
    assert!(
        writes.is_empty(),
        "a converged GpuJob was written: {writes:#?}"
    );
    op.stop().await;
}

#[tokio::test]
async fn killed_and_restarted_operators_never_skip_repeat_or_overlap_attempts() {
    let env = TestEnv::new("restarts").await;
    let identity = "restarts";
    let audit = env.cluster.audit();
    let start = audit.cursor().unwrap();
    let mut settings = env.settings();
    settings.plan.keep_jobs = 10;
    let spec = json!({"image": "i", "gpus": 1, "maxRetries": 3,
                      "env": sim_env(&[("SIM_FAIL_ATTEMPTS", "3"), ("SIM_DURATION_SECONDS", "0.7")])});
    let names = ["a", "b", "c"];
    let mut gjs = Vec::new();
    for n in names {
        gjs.push(env.create(n, spec.clone()).await);
    }
    let watchers: Vec<_> = gjs
        .iter()
        .map(|g| watch_concurrency(&env, g.clone()))
        .collect();

    // Kill the operator at ever-changing points of its work until every GpuJob is done.
    let pauses = [300u64, 900, 150, 1300, 500, 700, 50, 1100];
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut kills = 0;
    loop {
        let op = env.operator(identity, settings.clone()).await;
        tokio::time::sleep(Duration::from_millis(pauses[kills % pauses.len()])).await;
        op.kill().await;
        kills += 1;
        let mut done = 0;
        for n in names {
            if env
                .gpujobs()
                .get(n)
                .await
                .ok()
                .and_then(|g| phase(&g))
                .is_some_and(Phase::is_final)
            {
                done += 1;
            }
        }
        if done == names.len() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not done after {kills} kills"
        );
    }
    assert!(
        kills >= 3,
        "the test should kill the operator mid-flight several times"
    );

    for ((name, gj), concurrency) in names.iter().zip(&gjs).zip(watchers) {
        let now = env.gpujobs().get(name).await.unwrap();
        let status = now.status.unwrap();
        assert_eq!(status.phase, Some(Phase::Succeeded), "{name}");
        assert_eq!((status.attempts, status.failures), (4, 3), "{name}");
        env.assert_attempts_sequential(name, &env.jobs_of(gj).await, 4)
            .await;
        assert_eq!(
            concurrency.most(4).await,
            1,
            "{name}: two attempts active at once"
        );
    }
    // No attempt's Job was created twice (a create repeated after a kill is refused by
    // its stable name). A create whose client was killed mid-request may land while
    // kube-apiserver audits it as failed, so the Jobs themselves (checked above) prove
    // that every attempt ran; the audit log proves none ran twice.
    let agent = TestEnv::agent(identity);
    let mut created: BTreeMap<String, usize> = BTreeMap::new();
    for e in operator_writes(&audit.since(start).unwrap(), &agent, &env.ns) {
        if e.resource == "jobs" && e.verb == "create" && e.succeeded() {
            *created.entry(e.name).or_default() += 1;
        }
    }
    let expected: BTreeSet<String> = names
        .iter()
        .flat_map(|n| (1..=4).map(move |k| format!("{n}-{k}")))
        .collect();
    assert!(created.keys().all(|k| expected.contains(k)), "{created:?}");
    assert!(created.values().all(|c| *c == 1), "{created:?}");
}

#[tokio::test]
async fn a_253_character_name_gets_valid_unique_job_names_and_labels() {
    let env = TestEnv::new("longname").await;
    let op = env.operator("longname", env.settings()).await;
    let base = "x".repeat(244);
    let one = format!("{base}-one-123"); // 252
    let two = format!("{base}-two-1234"); // 253
    assert_eq!(two.len(), 253);
    for n in [&one, &two] {
        env.create(
            n,
            json!({"image": "i", "gpus": 1, "env": sim_env(&[("SIM_DURATION_SECONDS", "0.5")])}),
        )
        .await;
    }
    let mut job_names = BTreeSet::new();
    for n in [&one, &two] {
        // Succeeded means the API server accepted the Job and the Job controller its pod
        // (whose job-name label must be a valid label value).
        let done = env
            .wait_gpujob(n, "Succeeded", |g| phase(g) == Some(Phase::Succeeded))
            .await;
        let jobs = env.jobs_of(&done).await;
        assert_eq!(jobs.len(), 1);
        let name = jobs[0].metadata.name.clone().unwrap();
        assert!(name.len() <= 63, "{name}");
        assert!(jobs[0].metadata.labels.as_ref().unwrap()[LABEL_NAME].len() <= 63);
        job_names.insert(name);
    }
    assert_eq!(job_names.len(), 2, "Job names collide: {job_names:?}");
    op.stop().await;
}

#[tokio::test]
async fn an_allowed_service_account_reaches_the_job() {
    let env = TestEnv::new("service-account").await;
    let mut settings = env.settings();
    settings.plan.limits.service_accounts = ServiceAccounts::parse(&["trainer"]).unwrap();
    let op = env.operator("service-account", settings).await;
    env.create(
        "as-trainer",
        json!({"image": "i", "gpus": 1, "serviceAccountName": "trainer"}),
    )
    .await;
    // `default` is not in this operator's list, so a GpuJob naming none is refused.
    env.create("as-default", json!({"image": "i", "gpus": 1}))
        .await;
    let refused = env
        .wait_gpujob("as-default", "InvalidSpec", |g| {
            ready(g).is_some_and(|(_, r, _)| r == "InvalidSpec")
        })
        .await;
    let (_, _, message) = ready(&refused).unwrap();
    assert!(message.contains("spec.serviceAccountName"), "{message}");
    let gj = env
        .wait_gpujob("as-trainer", "a Job exists", |g| {
            g.status.as_ref().is_some_and(|s| s.attempts == 1)
        })
        .await;
    let jobs = env.jobs_of(&gj).await;
    assert_eq!(jobs.len(), 1);
    let pod = jobs[0]
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap();
    assert_eq!(pod.service_account_name.as_deref(), Some("trainer"));
    assert!(env.jobs_of(&refused).await.is_empty());
    op.stop().await;
}

#[tokio::test]
async fn invalid_specs_are_reported_once_naming_the_field_and_recover_when_fixed() {
    let env = TestEnv::new("invalid").await;
    let identity = "invalid";
    let audit = env.cluster.audit();
    let start = audit.cursor().unwrap();
    let op = env.operator(identity, env.settings()).await;
    // What the schema cannot express; the test operator allows at most 8 GPUs.
    let cases = [
        (
            "image",
            json!({"image": "Registry/UPPER:case", "gpus": 1}),
            "spec.image",
            json!({"spec": {"image": "registry/lower:case"}}),
        ),
        (
            "env",
            json!({"image": "i", "gpus": 1, "env": [{"name": "1 BAD", "value": "x"}]}),
            "spec.env[0].name",
            json!({"spec": {"env": [{"name": "GOOD", "value": "x"}]}}),
        ),
        (
            "gpus",
            json!({"image": "i", "gpus": 16}),
            "spec.gpus",
            json!({"spec": {"gpus": 8}}),
        ),
        (
            "selector",
            json!({"image": "i", "gpus": 1, "nodeSelector": {"not a label key!": "x"}}),
            "spec.nodeSelector",
            // A selector the fake GPU nodes match, so the fixed attempt is scheduled.
            json!({"spec": {"nodeSelector": {"not a label key!": null, "kubernetes.io/os": "linux"}}}),
        ),
        (
            // Not in --allowed-service-accounts (default: only `default`).
            "service-account",
            json!({"image": "i", "gpus": 1, "serviceAccountName": "trainer"}),
            "spec.serviceAccountName",
            json!({"spec": {"serviceAccountName": "default"}}),
        ),
    ];
    for (name, spec, _, _) in &cases {
        env.create(name, spec.clone()).await;
    }
    for (name, _, field, _) in &cases {
        let refused = env
            .wait_gpujob(name, "InvalidSpec", |g| {
                ready(g).is_some_and(|(_, r, _)| r == "InvalidSpec")
            })
            .await;
        let status = refused.status.clone().unwrap();
        assert_eq!(status.phase, Some(Phase::Pending), "{name}");
        assert_eq!(status.attempts, 0, "{name}");
        let (_, _, message) = ready(&refused).unwrap();
        assert!(
            message.contains(field),
            "{name}: the message names {field}: {message}"
        );
        assert_eq!(status.observed_generation, refused.metadata.generation);
    }

    // No hot loop: poke them and wait until each poke was looked at; no Job was ever
    // tried, one Warning Event each.
    support::signals::events_done(&op.status.metrics, cases.len() as u64).await;
    let seen = support::signals::watched(&op, "gpujobs");
    let pp = PatchParams::default();
    for (name, _, _, _) in &cases {
        let poke = json!({"metadata": {"annotations": {"poke": "1"}}});
        env.gpujobs()
            .patch(name, &pp, &Patch::Merge(poke))
            .await
            .unwrap();
    }
    support::signals::quiet_after(&op, "gpujobs", seen + cases.len() as u64).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let agent = TestEnv::agent(identity);
    let writes = operator_writes(&audit.since(start).unwrap(), &agent, &env.ns);
    let creates = writes.iter().filter(|e| e.resource == "jobs").count();
    assert_eq!(creates, 0, "{writes:#?}");
    let events: Vec<_> = writes.iter().filter(|e| e.resource == "events").collect();
    assert_eq!(
        events.len(),
        cases.len(),
        "one InvalidSpec Event per GpuJob, no storm: {events:#?}"
    );
    let status_patches = writes.iter().filter(|e| e.subresource == "status").count();
    assert_eq!(
        status_patches,
        cases.len(),
        "reported once, not again on every look: {writes:#?}"
    );

    // Fixing the spec recovers without a restart.
    for (name, _, _, fix) in &cases {
        env.gpujobs()
            .patch(name, &pp, &Patch::Merge(fix.clone()))
            .await
            .unwrap();
    }
    for (name, _, _, _) in &cases {
        let fixed = env
            .wait_gpujob(name, "Succeeded", |g| phase(g) == Some(Phase::Succeeded))
            .await;
        assert_eq!(fixed.status.unwrap().attempts, 1, "{name}");
    }
    op.stop().await;
}

/// An upgrade from the release that created every Job suspended and started it with a
/// second write: a Job it created and had not started yet (suspended, its pods without
/// the operator's gate) is given the gate and started by this release, in one patch the
/// API server accepts for a suspended Job that never ran; its pod then waits at the gate
/// and is let go like every attempt's.
#[tokio::test]
async fn a_job_an_earlier_release_created_suspended_gets_the_gate_then_runs() {
    let env = TestEnv::new("upgrade-gate").await;
    let gj = env
        .create(
            "train",
            json!({"image": "i", "gpus": 1, "env": sim_env(&[("SIM_DURATION_SECONDS", "3600")])}),
        )
        .await;
    // As the earlier release left it: the Job made, suspended, no gate; attempt 1
    // recorded.
    let mut old = gpujob_operator::controller::job::desired_job(&gj, 1);
    if let Some(spec) = old.spec.as_mut() {
        spec.suspend = Some(true);
        if let Some(pod) = spec.template.spec.as_mut() {
            pod.scheduling_gates = None;
        }
    }
    env.jobs().create(&Default::default(), &old).await.unwrap();
    let status = json!({"status": {"attempts": 1, "phase": "Running", "activeJob": "train-1",
        "observedGeneration": gj.metadata.generation}});
    env.gpujobs()
        .patch_status("train", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    let op = env.operator("upgrade-gate", env.settings()).await;
    let uid = gj.metadata.uid.clone().unwrap();
    wait::until("attempt 1's pod running", WAIT, POLL, || async {
        let running = env.running_pods(&format!("{LABEL_UID}={uid}")).await;
        (running.len() == 1).then_some(())
    })
    .await
    .unwrap();
    let job = env.jobs().get("train-1").await.unwrap();
    let spec = job.spec.unwrap();
    assert_eq!(spec.suspend, Some(false), "started");
    let gates = spec
        .template
        .spec
        .unwrap()
        .scheduling_gates
        .unwrap_or_default();
    assert!(
        gates
            .iter()
            .any(|g| g.name == gpujob_operator::api::SCHEDULING_GATE),
        "the template got the gate: {gates:?}"
    );
    let g = env.gpujobs().get("train").await.unwrap();
    let status = g.status.unwrap();
    assert_eq!((status.attempts, status.failures), (1, 0), "{status:?}");
    op.stop().await;
}
