//! Kueue's MultiKueue with plain batch/v1 Jobs, on two control planes of the test's own
//! (`support::multikueue`): a Job queued on the management cluster runs on the worker
//! and its outcome comes back; a Job whose pods carry a scheduling gate nobody on the
//! worker lifts (the operator's gate, lifted only where the operator watches) stays
//! gated there, and goes from the worker when the management Job is deleted. Then
//! GpuJobs through MultiKueue: with the operator given the worker
//! (`--multikueue-worker`, as deploy/multikueue-worker/'s service account), their pods
//! are let go there by the same gate, and status, failure rules, retries and the
//! no-overlap rule hold across the two clusters; without it, a GpuJob says
//! ManagedElsewhere.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use crate::support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use gpujob_operator::api::SCHEDULING_GATE;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, PostParams};
use kube::runtime::watcher;
use serde_json::json;
use support::kueue::kueue_kind;
use support::multikueue::{MANAGED_BY, QUEUE, TwoClusters, batch_job};
use support::{POLL, TestEnv, WAIT};

/// The labels kube-apiserver puts on a Job's pod template (its selector).
const JOB_SELECTOR_LABELS: [&str; 4] = [
    "controller-uid",
    "batch.kubernetes.io/controller-uid",
    "job-name",
    "batch.kubernetes.io/job-name",
];

/// Every version of every pod of a namespace that a watch saw, in order, with when; and
/// when each pod was seen gone.
struct PodLog {
    seen: Arc<Mutex<Vec<(Instant, Pod)>>>,
    gone: Arc<Mutex<Vec<(Instant, String)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for PodLog {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl PodLog {
    fn start(env: &TestEnv) -> PodLog {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let gone = Arc::new(Mutex::new(Vec::new()));
        let api: Api<Pod> = Api::namespaced(env.admin.clone(), &env.ns);
        let (log, gone_log) = (seen.clone(), gone.clone());
        let task = tokio::spawn(async move {
            let mut events = watcher(api, watcher::Config::default()).boxed();
            while let Some(event) = events.next().await {
                match event {
                    Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => {
                        log.lock().unwrap().push((Instant::now(), pod));
                    }
                    Ok(watcher::Event::Delete(pod)) => {
                        let name = pod.metadata.name.unwrap_or_default();
                        gone_log.lock().unwrap().push((Instant::now(), name));
                    }
                    _ => {}
                }
            }
        });
        PodLog { seen, gone, task }
    }

    /// The versions seen of the pods of Job `job`.
    fn of(&self, job: &str) -> Vec<Pod> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, p)| job_of(p) == Some(job))
            .map(|(_, p)| p.clone())
            .collect()
    }

    fn count(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    /// Waits until a version of a pod of Job `job` satisfies `pred`; returns it.
    async fn wait(&self, job: &str, what: &str, pred: impl Fn(&Pod) -> bool) -> Pod {
        devcluster::wait::until(what, WAIT, Duration::from_millis(100), || async {
            self.of(job).into_iter().find(|p| pred(p))
        })
        .await
        .unwrap()
    }
}

fn job_of(pod: &Pod) -> Option<&str> {
    pod.metadata
        .labels
        .as_ref()?
        .get("batch.kubernetes.io/job-name")
        .map(String::as_str)
}

fn phase(pod: &Pod) -> Option<&str> {
    pod.status.as_ref()?.phase.as_deref()
}

fn node(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref()?.node_name.as_deref()
}

fn gates(pod: &Pod) -> Vec<String> {
    gates_of(pod.spec.as_ref())
}

/// The scheduling gates of a pod spec (a pod's, or a Job's template's), by name.
fn gates_of(spec: Option<&k8s_openapi::api::core::v1::PodSpec>) -> Vec<String> {
    spec.and_then(|s| s.scheduling_gates.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|g| g.name)
        .collect()
}

/// Condition `type_` of a Job, when True: its reason.
fn job_condition(job: &Job, type_: &str) -> Option<String> {
    job.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_ && c.status == "True")
        .map(|c| c.reason.clone().unwrap_or_default())
}

async fn wait_job(env: &TestEnv, name: &str, what: &str, pred: impl Fn(&Job) -> bool) -> Job {
    let jobs = env.jobs();
    let pred = &pred;
    devcluster::wait::until(&format!("Job {name} ({what})"), WAIT, POLL, || async {
        jobs.get_opt(name).await.ok().flatten().filter(|j| pred(j))
    })
    .await
    .unwrap()
}

/// The Workload Kueue made for the Job with uid `uid` in namespace `ns`.
async fn workload(env: &TestEnv, ns: &str, uid: &str) -> Option<serde_json::Value> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(env.admin.clone(), ns, &kueue_kind("Workload", "workloads"));
    let list = api
        .list(&ListParams::default().labels(&format!("kueue.x-k8s.io/job-uid={uid}")))
        .await
        .ok()?;
    list.items
        .into_iter()
        .next()
        .map(|w| serde_json::to_value(w).unwrap())
}

/// The state and message of the MultiKueue check on a Workload.
fn check_state(workload: &serde_json::Value) -> Option<(String, String)> {
    let check = workload["status"]["admissionChecks"]
        .as_array()?
        .iter()
        .find(|c| c["name"] == support::multikueue::CHECK)?;
    Some((
        check["state"].as_str()?.to_owned(),
        check["message"].as_str().unwrap_or_default().to_owned(),
    ))
}

/// A Job created on the manager with the queue label (and nothing else of Kueue's) gets
/// `spec.managedBy: kueue.x-k8s.io/multikueue` and `suspend: true` from Kueue's webhook;
/// it is dispatched to the worker, where its pod runs on a worker node; its end (Complete,
/// or Failed with the Job controller's reason) comes back to the management Job, whose
/// pods never exist. A Job created where Kueue's webhook is not called, without
/// `managedBy`, is rejected by the MultiKueue check and stays suspended.
#[tokio::test]
async fn a_plain_job_queued_on_the_manager_runs_on_the_worker_and_its_end_comes_back() {
    let two = TwoClusters::start("mk-plain", 4, json!({})).await;
    let (manager, worker) = (&two.manager, &two.worker);
    let manager_pods = PodLog::start(manager);
    let worker_pods = PodLog::start(worker);
    let pp = PostParams::default();

    // Each runs 3 s: an end on the worker before Kueue has started the management Job
    // (a fraction of a second after the worker's Job is made) can be lost, not copied
    // back (`multikueue_early_end_figures`: 3 of 40).
    let created = manager
        .jobs()
        .create(
            &pp,
            &batch_job("ok", &[("SIM_DURATION_SECONDS", "3")], json!({})),
        )
        .await
        .unwrap();
    let failing = manager
        .jobs()
        .create(
            &pp,
            &batch_job(
                "fails",
                &[("SIM_DURATION_SECONDS", "3"), ("SIM_EXIT_CODE", "3")],
                json!({}),
            ),
        )
        .await
        .unwrap();
    for job in [&created, &failing] {
        let spec = job.spec.as_ref().unwrap();
        assert_eq!(
            spec.managed_by.as_deref(),
            Some(MANAGED_BY),
            "set by Kueue's Job webhook on create"
        );
        assert_eq!(spec.suspend, Some(true), "suspended by Kueue's Job webhook");
    }

    // On the worker: the same Job, Kueue's, with no managedBy (the Job controller there
    // runs it), and its pod running on a worker node.
    let remote = wait_job(worker, "ok", "dispatched to the worker", |_| true).await;
    let labels = remote.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels
            .get("kueue.x-k8s.io/multikueue-origin")
            .map(String::as_str),
        Some("multikueue"),
        "{labels:?}"
    );
    assert!(
        labels.contains_key("kueue.x-k8s.io/prebuilt-workload-name"),
        "{labels:?}"
    );
    assert_eq!(remote.spec.as_ref().unwrap().managed_by, None);
    let running = worker_pods
        .wait("ok", "the pod of Job ok running on the worker", |p| {
            phase(p) == Some("Running")
        })
        .await;
    assert!(
        node(&running).is_some_and(|n| n.starts_with("gpu-node-")),
        "{:?}",
        running.spec
    );

    // Its end comes back to the management Job.
    let done = wait_job(manager, "ok", "Complete, from the worker", |j| {
        job_condition(j, "Complete").is_some()
    })
    .await;
    let status = done.status.clone().unwrap();
    assert_eq!(
        (status.succeeded, status.failed),
        (Some(1), None),
        "{status:?}"
    );
    let failed = wait_job(manager, "fails", "Failed, from the worker", |j| {
        job_condition(j, "Failed").is_some()
    })
    .await;
    assert_eq!(
        job_condition(&failed, "Failed").as_deref(),
        Some("BackoffLimitExceeded")
    );
    assert_eq!(failed.status.as_ref().unwrap().failed, Some(1));
    worker_pods
        .wait("fails", "the failing pod failed on the worker", |p| {
            phase(p) == Some("Failed")
        })
        .await;

    // Once the management Workload is finished, Kueue deletes the worker's copies.
    for name in ["ok", "fails"] {
        worker
            .wait_job_gone(
                name,
                &format!("Job {name} gone from the worker once finished"),
            )
            .await;
    }
    assert_eq!(
        manager_pods.count(),
        0,
        "no pod on the management cluster: {:?}",
        manager_pods.of("ok")
    );

    // Without Kueue's webhook the creator must set managedBy: a Job made as the
    // operator makes them (labelled, suspended) in a namespace the webhook is not
    // called for is rejected by the MultiKueue check, and stays suspended.
    let plain = format!("{}-nohook", manager.ns);
    let namespaces: Api<Namespace> = Api::all(manager.admin.clone());
    namespaces
        .create(
            &pp,
            &serde_json::from_value(json!({"metadata": {"name": plain}})).unwrap(),
        )
        .await
        .unwrap();
    let queues: Api<DynamicObject> = Api::namespaced_with(
        manager.admin.clone(),
        &plain,
        &kueue_kind("LocalQueue", "localqueues"),
    );
    queues
        .create(
            &pp,
            &serde_json::from_value(json!({
                "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
                "metadata": {"name": QUEUE},
                "spec": {"clusterQueue": support::multikueue::CLUSTER_QUEUE},
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let mut unmanaged = batch_job("unmanaged", &[], json!({}));
    unmanaged.spec.as_mut().unwrap().suspend = Some(true);
    let unmanaged = Api::<Job>::namespaced(manager.admin.clone(), &plain)
        .create(&pp, &unmanaged)
        .await
        .unwrap();
    assert_eq!(unmanaged.spec.as_ref().unwrap().managed_by, None);
    let uid = unmanaged.metadata.uid.clone().unwrap();
    let (state, message) = devcluster::wait::until(
        "the MultiKueue check to reject the Job without managedBy",
        WAIT,
        POLL,
        || async {
            let state = check_state(&workload(manager, &plain, &uid).await?)?;
            (state.0 == "Rejected").then_some(state)
        },
    )
    .await
    .unwrap();
    assert!(
        message.contains("Expecting spec.managedBy to be \"kueue.x-k8s.io/multikueue\""),
        "{state}: {message}"
    );
    let still = Api::<Job>::namespaced(manager.admin.clone(), &plain)
        .get("unmanaged")
        .await
        .unwrap();
    assert_eq!(still.spec.unwrap().suspend, Some(true));
}

/// A Job whose pod template carries the operator's scheduling gate: Kueue copies the
/// template to the worker with the gate (and the template's labels and annotations),
/// the worker's Kueue admits and starts it, and its pod waits at the gate for good (no
/// one there lifts it), its GPU held by the worker's ClusterQueue all the while, and
/// the management Job is started with no pod of its own. Deleting the
/// management Job deletes the worker's Job (in the background) and, through the worker's
/// garbage collector, its pods: the gated one and a running one of another Job alike.
/// A foreground delete of the management Job does not wait for the worker: the
/// management Jobs are gone while the running pod on the worker still runs. The test
/// prints how long each took.
#[tokio::test]
async fn a_gated_job_waits_at_its_gate_on_the_worker_and_goes_with_the_management_job() {
    let two = TwoClusters::start("mk-gated", 4, json!({})).await;
    let (manager, worker) = (&two.manager, &two.worker);
    let manager_pods = PodLog::start(manager);
    let worker_pods = PodLog::start(worker);
    let pp = PostParams::default();
    let long = [("SIM_DURATION_SECONDS", "3600")];

    let template = json!({
        "metadata": {"labels": {"gpujob.dev/attempt": "1", "example.dev/team": "a"},
                     "annotations": {"example.dev/note": "kept"}},
        "spec": {"schedulingGates": [{"name": SCHEDULING_GATE}]},
    });
    let gated = manager
        .jobs()
        .create(&pp, &batch_job("gated", &long, template))
        .await
        .unwrap();
    manager
        .jobs()
        .create(
            &pp,
            &batch_job(
                "runs",
                &[
                    ("SIM_DURATION_SECONDS", "3600"),
                    // Its container takes long to stop once deleted, as a real one
                    // may: longer than any machine takes to delete the management
                    // Jobs (the test force-deletes it at the end).
                    ("SIM_TERMINATION_SECONDS", "300"),
                ],
                json!({"spec": {"terminationGracePeriodSeconds": 600}}),
            ),
        )
        .await
        .unwrap();

    let pod = worker_pods
        .wait("gated", "the gated Job's pod on the worker", |_| true)
        .await;
    let running = worker_pods
        .wait("runs", "the other Job's pod running on the worker", |p| {
            phase(p) == Some("Running")
        })
        .await;
    assert!(node(&running).is_some());

    // The template as the worker's Job has it, against the one created.
    let remote = worker.jobs().get("gated").await.unwrap();
    let ours = gated.spec.as_ref().unwrap().template.clone();
    let theirs = remote.spec.as_ref().unwrap().template.clone();
    let gate_names = |t: &k8s_openapi::api::core::v1::PodTemplateSpec| gates_of(t.spec.as_ref());
    assert_eq!(gate_names(&theirs), vec![SCHEDULING_GATE.to_owned()]);
    assert_eq!(
        gate_names(&theirs),
        gate_names(&ours),
        "gates copied verbatim"
    );
    for (kind, ours, theirs) in [
        (
            "label",
            &ours.metadata.as_ref().unwrap().labels,
            &theirs.metadata.as_ref().unwrap().labels,
        ),
        (
            "annotation",
            &ours.metadata.as_ref().unwrap().annotations,
            &theirs.metadata.as_ref().unwrap().annotations,
        ),
    ] {
        let (mut ours, theirs) = (
            ours.clone().unwrap_or_default(),
            theirs.clone().unwrap_or_default(),
        );
        // The selector labels each API server puts on its own Job's template (the uid
        // differs between the clusters; Kueue drops the manager's).
        ours.retain(|k, _| !JOB_SELECTOR_LABELS.contains(&k.as_str()));
        for (k, v) in &ours {
            assert_eq!(
                theirs.get(k),
                Some(v),
                "template {kind} {k} copied: {theirs:?}"
            );
        }
        let added: Vec<_> = theirs
            .iter()
            .filter(|(k, _)| !ours.contains_key(*k))
            .collect();
        eprintln!("template {kind}s the worker's Job has and the created one had not: {added:?}");
    }
    eprintln!(
        "the worker's pod template spec besides the containers: nodeSelector {:?}, tolerations {:?}",
        theirs.spec.as_ref().unwrap().node_selector,
        theirs.spec.as_ref().unwrap().tolerations
    );

    // The management Job is started (Kueue admitted it once the worker had), and has no
    // pods. Its status is the worker Job's only if a change on the worker came after
    // that start: Kueue copies it on the worker's events and skips the copy while the
    // management Job is still suspended, and a gated pod changes nothing more (in one
    // run of five the status stayed empty; the next periodic look is workerLostTimeout,
    // 15 min, away). So it is shown, not required.
    let begun = wait_job(manager, "gated", "started by Kueue on the manager", |j| {
        j.spec.as_ref().and_then(|s| s.suspend) == Some(false)
    })
    .await;
    eprintln!(
        "the management Job's status once started: active {:?}, ready {:?}",
        begun.status.as_ref().and_then(|s| s.active),
        begun.status.as_ref().and_then(|s| s.ready)
    );
    // Its pod is still at the gate, unbound, and its GPU is taken on the worker.
    let now = Api::<Pod>::namespaced(worker.admin.clone(), &worker.ns)
        .get(pod.metadata.name.as_deref().unwrap())
        .await
        .unwrap();
    assert_eq!(gates(&now), vec![SCHEDULING_GATE.to_owned()]);
    assert_eq!(node(&now), None);
    let scheduled = now
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "PodScheduled"))
        .map(|c| (c.status.clone(), c.reason.clone()));
    assert_eq!(
        scheduled,
        Some(("False".to_owned(), Some("SchedulingGated".to_owned())))
    );
    let remote_uid = remote.metadata.uid.clone().unwrap();
    let remote_workload = workload(worker, &worker.ns, &remote_uid).await;
    let admitted = remote_workload.as_ref().is_some_and(|w| {
        w["status"]["conditions"].as_array().is_some_and(|c| {
            c.iter()
                .any(|c| c["type"] == "Admitted" && c["status"] == "True")
        })
    });
    assert!(
        admitted,
        "the worker admitted the gated Job: {remote_workload:?}"
    );

    // Delete the management Jobs in the foreground, as the operator deletes a running
    // attempt's Job (on one cluster that Job stays until its pods are gone). Here it has
    // no pods: it goes once its Workload is gone, not waiting for the worker. Kueue
    // deletes the worker's Jobs in the background when it sees the Workload go.
    let started = Instant::now();
    for name in ["gated", "runs"] {
        manager
            .jobs()
            .delete(name, &DeleteParams::foreground())
            .await
            .unwrap();
    }
    for name in ["gated", "runs"] {
        manager
            .wait_job_gone(name, &format!("management Job {name} gone"))
            .await;
    }
    let manager_gone = started.elapsed();
    let pods: Api<Pod> = Api::namespaced(worker.admin.clone(), &worker.ns);
    // The worker's pod of "runs" still runs: whether or not Kueue has asked for its
    // delete yet, it takes 300 s to stop.
    let left = pods.list(&ListParams::default()).await.unwrap().items;
    let still: Vec<_> = left
        .iter()
        .filter(|p| job_of(p) == Some("runs") && phase(p) == Some("Running"))
        .map(|p| {
            (
                p.metadata.name.clone(),
                p.metadata.deletion_timestamp.is_some(),
            )
        })
        .collect();
    assert_eq!(
        still.len(),
        1,
        "the management Jobs were gone ({:.2}s) while the worker's pod of runs ran on: {left:?}",
        manager_gone.as_secs_f64()
    );
    eprintln!(
        "management Jobs gone {:.2}s after their foreground delete; then on the worker: \
         pod of runs (name, deletion asked) {still:?}, {} pods in all",
        manager_gone.as_secs_f64(),
        left.len()
    );
    for name in ["gated", "runs"] {
        worker
            .wait_job_gone(name, &format!("Job {name} gone from the worker"))
            .await;
        eprintln!(
            "Job {name} gone from the worker {:.2}s after the management Jobs' delete",
            started.elapsed().as_secs_f64()
        );
    }
    // The worker's garbage collector deletes both pods: the gated one goes, the running
    // one is asked to stop; that one is then let go at once, not in 300 s.
    let runs_pod = devcluster::wait::until(
        "the gated pod gone and the running one asked to stop",
        WAIT,
        Duration::from_millis(100),
        || async {
            let left = pods.list(&ListParams::default()).await.ok()?.items;
            match left.as_slice() {
                [p] if job_of(p) == Some("runs") && p.metadata.deletion_timestamp.is_some() => {
                    p.metadata.name.clone()
                }
                _ => None,
            }
        },
    )
    .await
    .unwrap();
    let now = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    let _ = pods.delete(&runs_pod, &now).await;
    devcluster::wait::until(
        "the worker's pods gone",
        WAIT,
        Duration::from_millis(100),
        || async {
            pods.list(&ListParams::default())
                .await
                .ok()?
                .items
                .is_empty()
                .then_some(())
        },
    )
    .await
    .unwrap();
    eprintln!(
        "every pod gone from the worker {:.2}s after the management Jobs' delete (the \
         running one force-deleted)",
        started.elapsed().as_secs_f64()
    );
    // The gated pod never left its gate before it went.
    for version in worker_pods.of("gated") {
        assert_eq!(
            gates(&version),
            vec![SCHEDULING_GATE.to_owned()],
            "{version:?}"
        );
        assert_eq!(node(&version), None);
    }
    assert_eq!(manager_pods.count(), 0, "no pod on the management cluster");
}

/// Not a test: how many Jobs a second MultiKueue dispatches (Jobs created on the
/// manager at once, counted as their copies appear on the worker), with Kueue's default
/// client settings (`clientConnection` 20 qps, burst 30) and with them raised on both
/// Kueues. `GPUJOB_MK_JOBS` Jobs (default 100). Run with
/// `cargo nextest run -p gpujob-operator --features gpujob-operator/failpoints
/// --run-ignored only -E 'test(multikueue_dispatch_figures)' --no-capture`.
#[tokio::test]
#[ignore = "measurement, not a test: run on demand"]
async fn multikueue_dispatch_figures() {
    let n: usize = std::env::var("GPUJOB_MK_JOBS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    for (label, client) in [
        ("default clientConnection (20 qps, burst 30)", json!({})),
        (
            "clientConnection 500 qps, burst 1000",
            json!({"clientConnection": {"qps": 500, "burst": 1000}}),
        ),
    ] {
        let two = TwoClusters::start("mk-rate", u32::try_from(n).unwrap(), client).await;
        let (manager, worker) = (&two.manager, &two.worker);
        let long = [("SIM_DURATION_SECONDS", "3600")];
        let gets_before = worker_gets(worker).await;
        let started = Instant::now();
        let jobs = manager.jobs();
        futures::stream::iter(0..n)
            .map(|i| {
                let jobs = jobs.clone();
                async move {
                    jobs.create(
                        &PostParams::default(),
                        &batch_job(&format!("j{i}"), &long, json!({})),
                    )
                    .await
                    .unwrap();
                }
            })
            .buffer_unordered(16)
            .collect::<Vec<()>>()
            .await;
        let created = started.elapsed();
        // Seconds at which 10%, 50%, 90% and all of the Jobs were on the worker.
        let marks = [n / 10, n / 2, n * 9 / 10, n];
        let mut at = Vec::new();
        let remote = worker.jobs();
        for mark in marks {
            devcluster::wait::until(
                &format!("{mark} Jobs on the worker"),
                Duration::from_secs(600),
                Duration::from_millis(100),
                || async {
                    let count = remote.list(&ListParams::default()).await.ok()?.items.len();
                    (count >= mark).then_some(())
                },
            )
            .await
            .unwrap();
            at.push(started.elapsed().as_secs_f64());
        }
        let rate = (marks[2] - marks[0]) as f64 / (at[2] - at[0]);
        println!(
            "FIGURE multikueue dispatch, {label}: {n} Jobs created on the manager in {:.1}s; \
             on the worker 10% at {:.1}s, 50% at {:.1}s, 90% at {:.1}s, all at {:.1}s: \
             {rate:.1} Jobs/s between 10% and 90%",
            created.as_secs_f64(),
            at[0],
            at[1],
            at[2],
            at[3]
        );
        // What MultiKueue wrote on the worker (its reads are not audited), by verb,
        // resource and answer: its remote client is client-go's default, 5 qps and
        // burst 10, which no Kueue setting changes.
        let mut writes = std::collections::BTreeMap::<String, usize>::new();
        let events = worker.cluster.audit().all().unwrap();
        let ours: Vec<_> = events
            .iter()
            .filter(|e| e.user == "system:serviceaccount:kueue-system:multikueue-sa")
            .collect();
        for e in &ours {
            *writes
                .entry(format!("{} {} {}", e.verb, e.resource, e.code))
                .or_default() += 1;
        }
        let gets = worker_gets(worker).await;
        println!(
            "FIGURE multikueue on the worker, {label}: {} writes {writes:?}; GETs of one \
             workload {} and of one Job {} (every client's; the worker's own controllers \
             read from their caches)",
            ours.len(),
            gets.0 - gets_before.0,
            gets.1 - gets_before.1,
        );
        drop(two);
    }
}

/// kube-apiserver's count of GETs of single workloads and of single Jobs on `env`.
async fn worker_gets(env: &TestEnv) -> (f64, f64) {
    let metrics = env.cluster.apiserver_metrics().await.unwrap();
    let get = |resource| {
        metrics.sum(
            "apiserver_request_total",
            &[("verb", "GET"), ("resource", resource)],
        )
    };
    (get("workloads"), get("jobs"))
}

/// Not a test: whether a Job that ends on the worker before Kueue has started it on
/// the manager gets its end on the manager. Kueue copies the worker's status only while
/// the management Job is started, finishes the management Workload when the worker's
/// does, then deletes the worker's Job: an end that comes too early may never be copied.
/// `GPUJOB_MK_JOBS` Jobs (default 20) whose pods end at once; prints how many management
/// Jobs got Complete within 90 s. Run with `cargo nextest run -p gpujob-operator
/// --features gpujob-operator/failpoints --run-ignored only -E
/// 'test(multikueue_early_end_figures)' --no-capture`.
#[tokio::test]
#[ignore = "measurement, not a test: run on demand"]
async fn multikueue_early_end_figures() {
    let n: usize = std::env::var("GPUJOB_MK_JOBS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let two = TwoClusters::start("mk-early", u32::try_from(n).unwrap(), json!({})).await;
    let (manager, worker) = (&two.manager, &two.worker);
    for i in 0..n {
        manager
            .jobs()
            .create(
                &PostParams::default(),
                &batch_job(
                    &format!("e{i}"),
                    &[("SIM_DURATION_SECONDS", "0")],
                    json!({}),
                ),
            )
            .await
            .unwrap();
    }
    // Every management Workload finished and every worker copy deleted: nothing more
    // will be copied.
    let workloads: Api<DynamicObject> = Api::namespaced_with(
        manager.admin.clone(),
        &manager.ns,
        &kueue_kind("Workload", "workloads"),
    );
    devcluster::wait::until(
        "every management Workload finished and the worker's Jobs gone",
        Duration::from_secs(300),
        Duration::from_millis(200),
        || async {
            let list = workloads.list(&ListParams::default()).await.ok()?.items;
            let finished = list
                .iter()
                .filter_map(|w| serde_json::to_value(w).ok())
                .filter(|w| {
                    w["status"]["conditions"].as_array().is_some_and(|c| {
                        c.iter()
                            .any(|c| c["type"] == "Finished" && c["status"] == "True")
                    })
                })
                .count();
            let left = worker
                .jobs()
                .list(&ListParams::default())
                .await
                .ok()?
                .items
                .len();
            (finished == n && left == 0).then_some(())
        },
    )
    .await
    .unwrap();
    let jobs = manager
        .jobs()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    let complete = jobs
        .iter()
        .filter(|j| job_condition(j, "Complete").is_some())
        .count();
    let statusless: Vec<_> = jobs
        .iter()
        .filter(|j| job_condition(j, "Complete").is_none() && job_condition(j, "Failed").is_none())
        .map(|j| {
            (
                j.metadata.name.clone().unwrap_or_default(),
                j.spec.as_ref().and_then(|s| s.suspend),
                j.status.clone(),
                j.metadata.uid.clone().unwrap_or_default(),
            )
        })
        .collect();
    // What the management Workload of each says: its Finished condition.
    let mut statusless_workloads = Vec::new();
    for (name, _, _, uid) in &statusless {
        let finished = workload(manager, &manager.ns, uid).await.and_then(|w| {
            w["status"]["conditions"]
                .as_array()?
                .iter()
                .find(|c| c["type"] == "Finished")
                .map(|c| format!("{} {}: {}", c["status"], c["reason"], c["message"]))
        });
        statusless_workloads.push((name.clone(), finished));
    }
    println!(
        "FIGURE multikueue early end: {n} Jobs whose pods end at once; {complete} management \
         Jobs Complete once the worker's copies were gone; without an end (name, suspend, \
         status, uid): {statusless:?}; their Workloads' Finished: {statusless_workloads:?}"
    );
}

/// A GpuJob queued through a MultiKueue queue: Kueue's webhook makes its attempt's Job
/// a MultiKueue Job and dispatches it to the worker, where its pod waits at the
/// operator's gate. An operator not given the worker does not let it go there: the
/// GpuJob says so, Pending with reason ManagedElsewhere, rather than Running.
#[tokio::test]
async fn a_gpujob_through_a_multikueue_queue_says_its_pods_wait_on_another_cluster() {
    use gpujob_operator::api::{LABEL_UID, Phase};
    use gpujob_operator::controller::status::MANAGED_ELSEWHERE;

    let two = TwoClusters::start("mk-gpujob", 4, json!({})).await;
    let (manager, worker) = (&two.manager, &two.worker);
    let _op = manager.operator("mk-gpujob", manager.settings()).await;
    let g = manager
        .create(
            "train",
            json!({"image": "i", "gpus": 1, "maxRetries": 0,
                   "env": support::sim_env(&[("SIM_DURATION_SECONDS", "3600")]),
                   "v2": {"queueName": QUEUE}}),
        )
        .await;
    let said = manager
        .wait_gpujob("train", "Pending, its Job managed by MultiKueue", |g| {
            support::ready(g).is_some_and(|(_, r, _)| r == MANAGED_ELSEWHERE)
        })
        .await;
    assert_eq!(support::phase(&said), Some(Phase::Pending));
    let (_, _, message) = support::ready(&said).unwrap();
    assert!(message.contains(MANAGED_BY), "{message}");
    // Its pod is on the worker, at the operator's gate; none is on the manager.
    let uid = g.metadata.uid.clone().unwrap();
    let selector = ListParams::default().labels(&format!("{LABEL_UID}={uid}"));
    let worker_pods: Api<Pod> = Api::namespaced(worker.admin.clone(), &worker.ns);
    let pod = devcluster::wait::until("the attempt's pod on the worker", WAIT, POLL, || {
        let pods = worker_pods.clone();
        let selector = selector.clone();
        async move { pods.list(&selector).await.ok()?.items.into_iter().next() }
    })
    .await
    .unwrap();
    let gates = pod.spec.unwrap().scheduling_gates.unwrap_or_default();
    assert!(gates.iter().any(|g| g.name == SCHEDULING_GATE), "{gates:?}");
    let manager_pods: Api<Pod> = Api::namespaced(manager.admin.clone(), &manager.ns);
    assert!(manager_pods.list(&selector).await.unwrap().items.is_empty());
}

/// The same GpuJob with the operator given the worker (`--multikueue-worker`): its pod
/// is let go on the worker, where it runs; the GpuJob is Running, then Succeeded, from
/// the management Job's status that MultiKueue brings back. Nothing of it runs on the
/// manager.
#[tokio::test]
async fn a_gpujob_through_a_multikueue_queue_runs_on_the_worker_and_succeeds() {
    use gpujob_operator::api::{LABEL_UID, Phase};

    let two = TwoClusters::start("mk-run", 4, json!({})).await;
    let (manager, worker) = (&two.manager, &two.worker);
    let _op = manager
        .operator("mk-run", two.operator_settings().await)
        .await;
    let g = manager
        .create(
            "train",
            json!({"image": "i", "gpus": 1, "maxRetries": 0,
                   "env": support::sim_env(&[("SIM_DURATION_SECONDS", "4")]),
                   "v2": {"queueName": QUEUE}}),
        )
        .await;
    manager
        .wait_gpujob("train", "Running", |g| {
            support::phase(g) == Some(Phase::Running)
        })
        .await;
    let uid = g.metadata.uid.clone().unwrap();
    let selector = ListParams::default().labels(&format!("{LABEL_UID}={uid}"));
    let worker_pods: Api<Pod> = Api::namespaced(worker.admin.clone(), &worker.ns);
    // Running says its Job started; its pod is let go in the same reconcile or the next.
    let pods =
        devcluster::wait::until("the attempt's pod let go on the worker", WAIT, POLL, || {
            let pods = worker_pods.clone();
            let selector = selector.clone();
            async move {
                let items = pods.list(&selector).await.ok()?.items;
                let let_go = |p: &Pod| !gates(p).iter().any(|g| g == SCHEDULING_GATE);
                (!items.is_empty() && items.iter().all(let_go)).then_some(items)
            }
        })
        .await
        .unwrap();
    assert_eq!(pods.len(), 1, "one pod, on the worker");
    let done = manager
        .wait_gpujob("train", "Succeeded", |g| {
            support::phase(g).is_some_and(Phase::is_final)
        })
        .await;
    let status = done.status.unwrap();
    assert_eq!(status.phase, Some(Phase::Succeeded), "{status:?}");
    assert_eq!((status.attempts, status.failures), (1, 0));
    let manager_pods: Api<Pod> = Api::namespaced(manager.admin.clone(), &manager.ns);
    assert!(manager_pods.list(&selector).await.unwrap().items.is_empty());
}

/// Failures on the worker: a failure rule on the exit code (read from the pod on the
/// worker) fails one GpuJob at once; another's failed attempt is retried, its next
/// attempt dispatched and let go there, and it succeeds.
#[tokio::test]
async fn failure_rules_and_retries_hold_for_gpujobs_that_run_on_the_worker() {
    use gpujob_operator::api::Phase;

    let two = TwoClusters::start("mk-fail", 4, json!({})).await;
    let manager = &two.manager;
    let _op = manager
        .operator("mk-fail", two.operator_settings().await)
        .await;
    let spec = |code: &str, failing: Option<&str>, max_retries: i32, rules| {
        let mut env = vec![("SIM_EXIT_CODE", code), ("SIM_DURATION_SECONDS", "0.5")];
        if let Some(n) = failing {
            env.push(("SIM_FAIL_ATTEMPTS", n));
        }
        json!({"image": "i", "gpus": 1, "maxRetries": max_retries,
               "env": support::sim_env(&env),
               "v2": {"queueName": QUEUE, "failureRules": rules, "backoffSeconds": 1}})
    };
    let rules =
        json!([{"action": "FailGpuJob", "onExitCodes": {"operator": "In", "values": [42]}}]);
    manager
        .create("config-error", spec("42", None, 3, rules))
        .await;
    // Attempt 1 exits 3; attempt 2 succeeds.
    manager
        .create("flaky", spec("3", Some("1"), 1, json!([])))
        .await;
    let final_ = |g: &gpujob_operator::api::GpuJob| support::phase(g).is_some_and(Phase::is_final);
    let failed = manager.wait_gpujob("config-error", "Failed", final_).await;
    let status = failed.status.unwrap();
    assert_eq!(status.phase, Some(Phase::Failed), "{status:?}");
    assert_eq!((status.attempts, status.failures), (1, 1), "no retry");
    let f = status.last_failure.unwrap();
    assert_eq!((f.rule, f.exit_code), (Some(0), Some(42)), "{f:?}");

    let done = manager.wait_gpujob("flaky", "Succeeded", final_).await;
    let status = done.status.unwrap();
    assert_eq!(status.phase, Some(Phase::Succeeded), "{status:?}");
    assert_eq!((status.attempts, status.failures), (2, 1));
    let f = status.last_failure.unwrap();
    assert_eq!((f.attempt, f.exit_code), (1, Some(3)), "{f:?}");
}

/// No overlap across the two clusters: a spec change (Recreate) replaces a running
/// attempt that runs on the worker. MultiKueue deletes the worker's copy of the old Job
/// on its own schedule, so the next attempt's pod can be on the worker while the old
/// one's still runs there; it is let go only once the old pod can no longer run
/// (finished, or gone).
#[tokio::test]
async fn a_replacement_on_the_worker_is_let_go_only_once_the_old_attempts_pod_is_done() {
    use gpujob_operator::api::Phase;
    use kube::api::{Patch, PatchParams};

    let two = TwoClusters::start("mk-replace", 4, json!({})).await;
    let (manager, worker) = (&two.manager, &two.worker);
    let worker_log = PodLog::start(worker);
    let _op = manager
        .operator("mk-replace", two.operator_settings().await)
        .await;
    // Deleted, a pod takes 30 s to stop (kwok plays the stop within the grace), as a
    // real container may: long enough for the next attempt's pod to be dispatched and
    // wait beside it (one Job takes MultiKueue a few seconds here).
    let long = |lr: &str| {
        json!({"image": "i", "gpus": 1, "maxRetries": 0,
               "env": support::sim_env(&[("SIM_DURATION_SECONDS", "3600"),
                                         ("SIM_TERMINATION_SECONDS", "30"), ("LR", lr)]),
               "v2": {"queueName": QUEUE,
                      "template": {"spec": {"terminationGracePeriodSeconds": 60}}}})
    };
    manager.create("train", long("0.1")).await;
    worker_log
        .wait("train-1", "attempt 1's pod let go on the worker", |p| {
            !gates(p).iter().any(|g| g == SCHEDULING_GATE)
        })
        .await;
    manager
        .gpujobs()
        .patch(
            "train",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": long("0.01")})),
        )
        .await
        .unwrap();
    let let_go = |p: &Pod| !gates(p).iter().any(|g| g == SCHEDULING_GATE);
    worker_log
        .wait("train-2", "attempt 2's pod let go on the worker", let_go)
        .await;
    manager
        .wait_gpujob("train", "Running attempt 2", |g| {
            support::phase(g) == Some(Phase::Running)
                && g.status.as_ref().is_some_and(|s| s.attempts == 2)
        })
        .await;

    // When attempt 2's pod was first seen let go, every pod of attempt 1 was gone or
    // finished, as the watch of the worker saw them (one stream: its order is the
    // store's).
    let seen = worker_log.seen.lock().unwrap().clone();
    let gone = worker_log.gone.lock().unwrap().clone();
    let (released, _) = seen
        .iter()
        .find(|(_, p)| job_of(p) == Some("train-2") && let_go(p))
        .unwrap();
    let old: Vec<&Pod> = seen
        .iter()
        .filter(|(_, p)| job_of(p) == Some("train-1"))
        .map(|(_, p)| p)
        .collect();
    assert!(!old.is_empty(), "attempt 1 ran on the worker");
    let names: std::collections::BTreeSet<String> =
        old.iter().filter_map(|p| p.metadata.name.clone()).collect();
    for name in &names {
        let was_gone = gone.iter().any(|(at, n)| n == name && at < released);
        let last_before = seen
            .iter()
            .filter(|(at, p)| p.metadata.name.as_ref() == Some(name) && at < released)
            .map(|(_, p)| p)
            .next_back();
        let finished =
            last_before.is_some_and(|p| matches!(phase(p), Some("Succeeded" | "Failed")));
        assert!(
            was_gone || finished,
            "attempt 2's pod was let go while attempt 1's pod {name} could still run: {:?}",
            last_before.map(|p| (phase(p), p.metadata.deletion_timestamp.is_some()))
        );
    }
    let (arrived, _) = seen
        .iter()
        .find(|(_, p)| job_of(p) == Some("train-2"))
        .unwrap();
    // The gate had something to hold: attempt 2's pod was there before attempt 1's went.
    let old_gone = gone
        .iter()
        .filter(|(_, n)| names.contains(n))
        .map(|(at, _)| *at)
        .max()
        .unwrap();
    assert!(
        arrived < &old_gone,
        "attempt 2's pod came only after attempt 1's was gone: nothing was held"
    );
    println!(
        "attempt 2's pod waited at the gate {:?}; attempt 1's pods {names:?}, gone this long before attempt 2's was let go: {:?}",
        released.duration_since(*arrived),
        gone.iter()
            .filter(|(at, n)| names.contains(n) && at < released)
            .map(|(at, n)| (n, released.duration_since(*at)))
            .collect::<Vec<_>>()
    );
}

/// Not a test: how fast GpuJobs run through MultiKueue with the operator given the
/// worker. `GPUJOB_MK_GPUJOBS` GpuJobs (default 100) created at once on the manager
/// through the MultiKueue queue, each running an hour (the worker's ClusterQueue holds
/// them all), with Kueue's default client settings (`clientConnection` 20 qps, burst
/// 30; MultiKueue's remote client is client-go's default, 5 qps and burst 10, which no
/// Kueue setting changes) and the operator's defaults. Counted by polling both clusters
/// each second: the attempts' Jobs on the worker (dispatched), their pods let go there
/// by the operator, and the GpuJobs Running. Run with `cargo nextest run -p
/// gpujob-operator --features gpujob-operator/failpoints --run-ignored only -E
/// 'test(multikueue_gpujob_figures)' --no-capture`.
#[tokio::test]
#[ignore = "measurement, not a test: run on demand"]
async fn multikueue_gpujob_figures() {
    use gpujob_operator::api::{LABEL_UID, Phase};

    let n: usize = std::env::var("GPUJOB_MK_GPUJOBS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let two = TwoClusters::start("mk-gj-rate", u32::try_from(n).unwrap(), json!({})).await;
    let (manager, worker) = (&two.manager, &two.worker);
    let op = manager
        .operator("mk-gj-rate", two.operator_settings().await)
        .await;
    let spec = json!({"image": "i", "gpus": 1, "maxRetries": 0,
                      "env": support::sim_env(&[("SIM_DURATION_SECONDS", "3600")]),
                      "v2": {"queueName": QUEUE}});
    let started = Instant::now();
    futures::stream::iter(0..n)
        .map(|i| {
            let spec = spec.clone();
            async move {
                manager.create(&format!("g{i}"), spec).await;
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<()>>()
        .await;
    let created = started.elapsed().as_secs_f64();
    let marks = [n / 10, n / 2, n * 9 / 10, n];
    // For each of dispatched, pods made, let go and Running: when each mark was first
    // reached.
    let mut reached: [Vec<f64>; 4] = Default::default();
    let labelled = ListParams::default().labels(LABEL_UID);
    let (remote_jobs, remote_pods) = (
        worker.jobs(),
        Api::<Pod>::namespaced(worker.admin.clone(), &worker.ns),
    );
    let deadline = Duration::from_secs(3600);
    let mut next_report = 0.0;
    while reached.iter().any(|r| r.len() < marks.len()) {
        assert!(
            started.elapsed() < deadline,
            "not all ran within {deadline:?}: {reached:?}"
        );
        let dispatched = remote_jobs.list(&labelled).await.map(|l| l.items.len());
        let pods = remote_pods.list(&labelled).await;
        let made = pods.as_ref().map(|l| l.items.len());
        let let_go = pods.as_ref().map(|l| {
            l.items
                .iter()
                .filter(|p| !gates(p).iter().any(|g| g == SCHEDULING_GATE))
                .count()
        });
        let running = manager
            .gpujobs()
            .list(&ListParams::default())
            .await
            .map(|l| {
                l.items
                    .iter()
                    .filter(|g| support::phase(g) == Some(Phase::Running))
                    .count()
            });
        let now = started.elapsed().as_secs_f64();
        let counts = [dispatched.ok(), made.ok(), let_go.ok(), running.ok()];
        // Where the operator is, every 30 s: its work queue and the pods it let go.
        if now >= next_report {
            next_report = now + 30.0;
            let m = &op.status.metrics;
            println!(
                "at {now:.0}s: dispatched, made, let go, Running {counts:?}; the operator's \
                 queue {} keys, {} pods let go",
                m.queue.depth.get(),
                m.pods_ungated.get()
            );
        }
        for (r, count) in reached.iter_mut().zip(counts) {
            let Some(count) = count else { continue };
            while r.len() < marks.len() && count >= marks[r.len()] {
                r.push(now);
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let what = [
        "dispatched (their Jobs on the worker)",
        "with their pod made on the worker",
        "with their pod let go on the worker",
        "Running",
    ];
    for (what, at) in what.iter().zip(&reached) {
        let rate = (marks[2] - marks[0]) as f64 / (at[2] - at[0]);
        println!(
            "FIGURE multikueue GpuJobs {what}: {n} GpuJobs created on the manager in \
             {created:.1}s; 10% at {:.1}s, 50% at {:.1}s, 90% at {:.1}s, all at {:.1}s: \
             {rate:.2}/s between 10% and 90%",
            at[0], at[1], at[2], at[3]
        );
    }
}
