//! A Job create carries no precondition: a stable name refuses a second create only while
//! the first Job exists. A leader whose create of attempt k is still in flight when it
//! is frozen and deposed can therefore bring attempt k back, on its old spec, after its
//! successor has created attempt k, replaced it (a spec change under `Recreate`) and
//! started k + 1; or bring the next attempt's Job, numbered past what the status
//! records, after a change that forbids it. And a removal of the scheduling gate, or a
//! pod the Job controller makes for a Job whose end it has not seen, can land late too.
//! Here with the real binary: the fault proxy holds the leader's writes until the
//! successor has taken over (and acted), then delivers them. A returned Job's pods must
//! never be able to run (they wait at the operator's scheduling gate, which only the
//! holder removes, from the current attempt's pods), the successor must delete it, and
//! at no moment may two attempts' Jobs have pods that can run (ungated or bound to a
//! node; seen through watches of the GpuJob's pods and Jobs, in the order the API server
//! committed them).
//!
//! The GpuJob runs on a node of its own with room for two attempts, so nothing but the
//! operator keeps the returned Job's pod from running: the Job controller creates it at
//! once, and the scheduler would place it before the successor's delete lands.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use devcluster::Identity;
use devcluster::faultproxy::{Fault, FaultProxy, Faults, Rule};
use futures::StreamExt;
use gpujob_operator::api::{GpuJob, LABEL_UID, Phase, SCHEDULING_GATE};
use http::Method;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::watcher;
use nix::sys::signal::Signal;
use serde_json::json;
use support::nodes::OwnNode;
use support::replicas::{self, wait_holder};
use support::{TestEnv, phase, ready, sim_env, with_reasons};
use tokio::sync::watch;

/// How long a held write may take to land once let go, and the successor to see the
/// returned Job and have it gone.
const UNDO: Duration = Duration::from_secs(30);
/// A label the test puts on the GpuJob's Jobs and pods to know when the watches have
/// seen everything committed before it ([`in_sync`]).
const MARK: &str = "gpujob.test/mark";

/// What the watches saw of the GpuJob's Jobs and pods.
#[derive(Debug, Default, Clone)]
pub(crate) struct Seen {
    /// Jobs by uid, in the order they appeared: name, and whether it is gone.
    jobs: Vec<(String, String, bool)>,
    /// Pods that can run (ungated or bound to a node, not terminated, not gone): pod uid
    /// → the uid of its Job.
    live: BTreeMap<String, String>,
    /// Jobs (uids) with a pod that was ever bound to a node.
    bound: BTreeSet<String>,
    /// Jobs (uids) with a pod that could ever run (ungated or bound).
    ran: BTreeSet<String>,
    /// Jobs (uids) that ever had a pod, gated or not.
    had_pods: BTreeSet<String>,
    /// Pods (names) that were ever bound to a node.
    bound_pods: BTreeSet<String>,
    /// The label [`MARK`] seen, as `job:<value>` on a Job and `pod:<value>` on a pod.
    marks: BTreeSet<String>,
    /// Each moment at which pods of more than one Job were live: those Jobs' names.
    pub(crate) overlaps: Vec<Vec<String>>,
}

impl Seen {
    fn name_of(&self, uid: &str) -> String {
        self.jobs
            .iter()
            .find(|(u, _, _)| u == uid)
            .map_or_else(|| format!("(Job {uid})"), |(_, n, _)| n.clone())
    }

    /// The Jobs with live pods, by name.
    pub(crate) fn live_jobs(&self) -> BTreeSet<String> {
        self.live.values().map(|u| self.name_of(u)).collect()
    }

    /// Uids of the Jobs named `name`, oldest first.
    fn uids_named(&self, name: &str) -> Vec<String> {
        self.jobs
            .iter()
            .filter(|(_, n, _)| n == name)
            .map(|(u, _, _)| u.clone())
            .collect()
    }

    fn gone(&self, uid: &str) -> bool {
        self.jobs.iter().any(|(u, _, gone)| u == uid && *gone)
    }

    fn mark(&mut self, kind: &str, meta: &kube::api::ObjectMeta) {
        if let Some(v) = meta.labels.as_ref().and_then(|l| l.get(MARK)) {
            self.marks.insert(format!("{kind}:{v}"));
        }
    }

    fn job(&mut self, job: &Job, gone: bool) {
        self.mark("job", &job.metadata);
        let (Some(uid), Some(name)) = (job.metadata.uid.clone(), job.metadata.name.clone()) else {
            return;
        };
        match self.jobs.iter_mut().find(|(u, _, _)| *u == uid) {
            Some(entry) => entry.2 |= gone,
            None => self.jobs.push((uid, name, gone)),
        }
    }

    fn pod(&mut self, pod: &Pod, gone: bool) {
        self.mark("pod", &pod.metadata);
        let Some(uid) = pod.metadata.uid.clone() else {
            return;
        };
        let job = pod
            .metadata
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.kind == "Job" && o.controller == Some(true))
            .map(|o| o.uid.clone())
            .unwrap_or_default();
        let spec = pod.spec.as_ref();
        let bound = spec.is_some_and(|s| s.node_name.is_some());
        let gated = spec
            .and_then(|s| s.scheduling_gates.as_ref())
            .is_some_and(|g| g.iter().any(|g| g.name == SCHEDULING_GATE));
        let terminated = matches!(
            pod.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        );
        self.had_pods.insert(job.clone());
        if bound {
            self.bound.insert(job.clone());
            self.bound_pods
                .insert(pod.metadata.name.clone().unwrap_or_default());
        }
        if (bound || !gated) && !terminated && !gone {
            self.ran.insert(job.clone());
            self.live.insert(uid, job);
        } else {
            self.live.remove(&uid);
        }
        let owners: BTreeSet<&String> = self.live.values().collect();
        if owners.len() > 1 {
            let names = owners.iter().map(|u| self.name_of(u)).collect();
            self.overlaps.push(names);
        }
    }
}

/// Watches the Jobs and pods of `gj` into a [`Seen`]; each watch applies its events in
/// the order the API server committed them.
pub(crate) fn watch_attempts(env: &TestEnv, gj: &GpuJob) -> watch::Receiver<Seen> {
    let selector = format!("{LABEL_UID}={}", gj.metadata.uid.clone().unwrap());
    let config = watcher::Config::default().labels(&selector);
    let jobs = watcher(
        Api::<Job>::namespaced(env.admin.clone(), &env.ns),
        config.clone(),
    )
    .map(|e| e.map(|e| Either::Job(Box::new(e))));
    let pods = watcher(Api::<Pod>::namespaced(env.admin.clone(), &env.ns), config)
        .map(|e| e.map(|e| Either::Pod(Box::new(e))));
    let (tx, rx) = watch::channel(Seen::default());
    tokio::spawn(async move {
        let mut events = futures::stream::select(jobs.boxed(), pods.boxed());
        while let Some(event) = events.next().await {
            let Ok(event) = event else { continue };
            // The watches start before the GpuJob's first Job and run for a minute or
            // two: a relist would only repeat what they saw.
            tx.send_modify(|seen| match event {
                Either::Job(e) => match *e {
                    watcher::Event::Apply(j) | watcher::Event::InitApply(j) => seen.job(&j, false),
                    watcher::Event::Delete(j) => seen.job(&j, true),
                    _ => {}
                },
                Either::Pod(e) => match *e {
                    watcher::Event::Apply(p) | watcher::Event::InitApply(p) => seen.pod(&p, false),
                    watcher::Event::Delete(p) => seen.pod(&p, true),
                    _ => {}
                },
            });
        }
    });
    rx
}

enum Either {
    Job(Box<watcher::Event<Job>>),
    Pod(Box<watcher::Event<Pod>>),
}

/// Waits, without polling, until what the watches saw satisfies `pred`.
pub(crate) async fn until(
    seen: &mut watch::Receiver<Seen>,
    what: &str,
    within: Duration,
    pred: impl Fn(&Seen) -> bool,
) -> Seen {
    let found = match tokio::time::timeout(within, seen.wait_for(|s| pred(s))).await {
        Ok(Ok(s)) => Some(s.clone()),
        _ => None,
    };
    found.unwrap_or_else(|| {
        panic!(
            "{what}: not within {}s; the watches saw {:#?}",
            within.as_secs(),
            *seen.borrow()
        )
    })
}

/// The GpuJob's spec: one GPU on `node`, a long run, `edit` to make a spec change.
fn spec(node: &OwnNode, edit: &str) -> serde_json::Value {
    node.place(json!({
        "image": "i", "gpus": 1,
        "env": sim_env(&[("SIM_DURATION_SECONDS", "3600"), ("EDIT", edit)]),
    }))
}

async fn edit(env: &TestEnv, node: &OwnNode, edit: &str) {
    env.gpujobs()
        .patch(
            "train",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": spec(node, edit)})),
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn a_late_job_create_never_runs_beside_the_next_attempt() {
    let env = TestEnv::new("late-create").await;
    let node = OwnNode::create(&env, 2).await;

    // Replica 1 leads, through the fault proxy; replica 2 stands by.
    let (proxy, first, second) = leader_behind_proxy(&env, &[]).await;
    let audit = env.cluster.audit();
    let start = audit.cursor().unwrap();

    let gj = env.create("train", spec(&node, "1")).await;
    let mut seen = watch_attempts(&env, &gj);
    runs_alone(&mut seen, "train-1").await;

    // From now on the leader's Job creates wait in the proxy. A spec change: the leader
    // replaces attempt 1, and its create of attempt 2 is held. Frozen with it in flight;
    // replica 2 takes over and runs attempt 2 itself.
    hold(&proxy, Method::POST, &["jobs"]);
    edit(&env, &node, "2").await;
    freeze_once_held(
        &env,
        &proxy,
        &first,
        "the leader's create of attempt 2 to be held",
    )
    .await;
    let s = runs_alone(&mut seen, "train-2").await;
    let successors_two = s.uids_named("train-2");
    assert_eq!(successors_two.len(), 1, "{s:#?}");

    // Another spec change: the successor replaces attempt 2 by attempt 3.
    edit(&env, &node, "3").await;
    let s = runs_alone(&mut seen, "train-3").await;
    assert_eq!(s.uids_named("train-2").len(), 1, "{s:#?}");

    // The held create lands: attempt 2 again, on the spec of generation 2.
    release(&proxy);
    let (s, late) = lands_then_goes(&mut seen, "train-2", 2).await;

    assert!(
        s.overlaps.is_empty(),
        "two attempts had live pods at once: {:?}",
        s.overlaps
    );
    assert!(
        !s.ran.contains(&late),
        "the returned attempt 2 had a pod that could run: {s:#?}"
    );
    assert!(
        s.bound.contains(&successors_two[0]),
        "a started Job's pod runs: the watch saw it"
    );
    assert_eq!(
        s.live_jobs(),
        BTreeSet::from(["train-3".to_owned()]),
        "attempt 3 runs on"
    );
    let writes = replicas::writes_in(&audit, start, &env.ns);
    let created = |user: &str, name: &str| {
        writes
            .iter()
            .filter(|e| e.user == user && e.verb == "create" && e.resource == "jobs")
            .filter(|e| e.name == name)
            .map(|e| e.received.clone())
            .max()
    };
    let (late_create, three) = (
        created("replica-1", "train-2").unwrap(),
        created("replica-2", "train-3").unwrap(),
    );
    assert!(
        late_create.parse::<jiff::Timestamp>().unwrap() > three.parse().unwrap(),
        "the deposed leader's create landed after attempt 3 was created: {late_create} vs {three}"
    );
    let events = env
        .events_of("train", with_reasons(&["StrayJobDeleted"]))
        .await;
    assert!(
        events
            .iter()
            .any(|e| e.1 == "StrayJobDeleted" && e.2.contains("Job train-2 (attempt 2)")),
        "{events:#?}"
    );
    let gj = env.gpujobs().get("train").await.unwrap();
    let status = gj.status.clone().unwrap();
    assert_eq!(
        (phase(&gj), status.attempts, status.failures),
        (Some(Phase::Running), 3, 0),
        "{status:#?}"
    );
    assert_eq!(status.active_job.as_deref(), Some("train-3"));
    let log = second.log_text();
    assert!(
        log.contains("deleting a Job that is not the current attempt's"),
        "{log}"
    );

    clean_up(&env, node, first, second).await;
}

/// A Job gone is not proof that its pods are: deleting a Job in the foreground, the
/// garbage collector can miss a pod the Job controller created as the delete began (the
/// soak found one running beside the next attempt). Here such a pod is made by hand: a
/// pod of attempt 1, labelled as the Job controller labels it, without the operator's
/// gate (as an earlier version made pods), that no Job owns and no node takes. Attempt 1
/// fails; attempt 2's Job is created, but its pod waits at the gate while that pod is
/// there, and is let go once it is gone.
#[tokio::test]
async fn a_pod_that_outlived_its_job_holds_the_next_attempt() {
    let env = TestEnv::new("late-pod").await;
    let op = env.operator("late-pod", env.settings()).await;
    let gj = env
        .create(
            "train",
            json!({"image": "i", "gpus": 1, "maxRetries": 1,
                "env": sim_env(&[("SIM_FAIL_ATTEMPTS", "1"), ("SIM_DURATION_SECONDS", "3")])}),
        )
        .await;
    let uid = gj.metadata.uid.clone().unwrap();
    // Made while attempt 1 runs (one made before would hold attempt 1 too: a pod of the
    // GpuJob not of the current attempt's Job that may run holds every gate).
    devcluster::wait::until(
        "attempt 1's pod running",
        Duration::from_secs(60),
        Duration::from_millis(50),
        || async {
            let running = env.running_pods(&format!("{LABEL_UID}={uid}")).await;
            (!running.is_empty()).then_some(())
        },
    )
    .await
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(env.admin.clone(), &env.ns);
    let orphan: Pod = serde_json::from_value(json!({
        "metadata": {"name": "train-1-orphan", "labels": {
            LABEL_UID: uid, gpujob_operator::api::LABEL_ATTEMPT: "1"}},
        "spec": {"containers": [{"name": "main", "image": "i"}],
            "nodeSelector": {"gpujob.test/nowhere": "true"}},
    }))
    .unwrap();
    pods.create(&Default::default(), &orphan).await.unwrap();

    let held = env
        .wait_gpujob("train", "attempt 2 held by the pod of attempt 1", |g| {
            g.status.as_ref().is_some_and(|s| s.attempts == 2)
                && ready(g).is_some_and(|(_, reason, message)| {
                    reason == "OldAttemptStopping" && message.contains("train-1-orphan")
                })
        })
        .await;
    assert_eq!(phase(&held), Some(Phase::Pending));
    let gated = devcluster::wait::until(
        "attempt 2's pod, waiting at the gate",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || async {
            let list = pods
                .list(&kube::api::ListParams::default().labels("job-name=train-2"))
                .await
                .ok()?;
            list.items.into_iter().next()
        },
    )
    .await
    .unwrap();
    let gates = gated
        .spec
        .and_then(|s| s.scheduling_gates)
        .unwrap_or_default();
    assert!(
        gates.iter().any(|g| g.name == SCHEDULING_GATE),
        "not let go while the pod of attempt 1 is there: {gates:?}"
    );

    pods.delete("train-1-orphan", &DeleteParams::default())
        .await
        .unwrap();
    let done = env
        .wait_gpujob("train", "Succeeded", |g| phase(g) == Some(Phase::Succeeded))
        .await;
    let status = done.status.unwrap();
    assert_eq!((status.attempts, status.failures), (2, 1));
    op.stop().await;
}

/// Waits until the Job named `job` alone has pods that can run; returns what was seen.
async fn runs_alone(seen: &mut watch::Receiver<Seen>, job: &str) -> Seen {
    until(
        seen,
        &format!("{job} to run, alone"),
        Duration::from_secs(60),
        |s| s.live_jobs() == BTreeSet::from([job.to_owned()]),
    )
    .await
}

/// Waits until the `nth` Job named `name` (a create held in flight) has landed, then until
/// the successor has deleted it; returns what was seen and that Job's uid.
async fn lands_then_goes(
    seen: &mut watch::Receiver<Seen>,
    name: &str,
    nth: usize,
) -> (Seen, String) {
    let s = until(
        seen,
        &format!("the deposed leader's create of {name} to land"),
        UNDO,
        |s| s.uids_named(name).len() == nth,
    )
    .await;
    let late = s.uids_named(name)[nth - 1].clone();
    let s = until(
        seen,
        &format!("the successor to delete the late {name}"),
        UNDO,
        |s| s.gone(&late),
    )
    .await;
    (s, late)
}

/// Lets the frozen leader go on, stops both replicas, deletes the GpuJob and the node.
async fn clean_up(
    env: &TestEnv,
    node: OwnNode,
    first: replicas::Replica,
    second: replicas::Replica,
) {
    first.signal(Signal::SIGCONT);
    drop((first, second));
    env.gpujobs()
        .delete("train", &DeleteParams::default())
        .await
        .unwrap();
    node.remove(env).await;
}

/// Starts replica 1 through a fault proxy and waits until it holds the Lease, then
/// replica 2 beside it, each with `extra` flags.
async fn leader_behind_proxy(
    env: &TestEnv,
    extra: &[&str],
) -> (FaultProxy, replicas::Replica, replicas::Replica) {
    let proxy = FaultProxy::start(&env.cluster).unwrap();
    let kubeconfig = proxy
        .kubeconfig(&env.cluster, Identity::Replica(1))
        .unwrap();
    let first = replicas::start_in_with_kubeconfig(&env.cluster, &env.ns, 1, extra, kubeconfig);
    wait_holder(&env.admin, &env.ns, Duration::from_secs(30), |h| {
        h == "replica-1"
    })
    .await;
    let second = replicas::start(&env.cluster, &env.ns, 2, extra);
    (proxy, first, second)
}

/// From now on, `method` requests to `resources` wait in the proxy until [`release`].
fn hold(proxy: &FaultProxy, method: Method, resources: &[&str]) {
    proxy.set(
        Faults::new().rule(
            Rule::new(Fault::Hold)
                .methods([method])
                .resources(resources.iter().copied()),
        ),
    );
}

/// Holds nothing more, and lets the held requests go on to the API server.
fn release(proxy: &FaultProxy) {
    proxy.clear();
    proxy.release_held();
}

/// Waits until the proxy holds a request ([`hold`]), freezes `leader` with it in flight,
/// and waits for replica 2 to lead.
async fn freeze_once_held(
    env: &TestEnv,
    proxy: &FaultProxy,
    leader: &replicas::Replica,
    what: &str,
) {
    freeze_when_held(proxy, leader, what).await;
    wait_holder(&env.admin, &env.ns, Duration::from_secs(30), |h| {
        h == "replica-2"
    })
    .await;
}

/// Waits until the proxy holds a request ([`hold`]) and freezes `leader` with it in
/// flight.
async fn freeze_when_held(proxy: &FaultProxy, leader: &replicas::Replica, what: &str) {
    proxy
        .wait_count("held", 1, Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    leader.signal(Signal::SIGSTOP);
}

/// Lets the held requests go ([`release`]), waits until the API server has answered
/// every one, then until the watches have seen a label put on the pods and Jobs
/// named after that: what the held writes did to them is in what they saw (not yet
/// what the scheduler or the Job controller make of it).
async fn land_held(
    env: &TestEnv,
    proxy: &FaultProxy,
    gj: &GpuJob,
    seen: &mut watch::Receiver<Seen>,
) {
    release(proxy);
    let held = proxy.count("held");
    proxy
        .wait_count("held_answered", held, Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| panic!("the held writes to land: {e}"));
    in_sync(env, gj, seen, "landed").await;
}

/// Labels the Jobs and pods of `gj` that exist now with [`MARK`] `value`, then waits
/// until the watches ([`watch_attempts`]) have seen it on one of each: each watch
/// delivers events in the order they were committed, so it has seen every change made
/// before the label.
async fn in_sync(env: &TestEnv, gj: &GpuJob, seen: &mut watch::Receiver<Seen>, value: &str) {
    let selector = format!("{LABEL_UID}={}", gj.metadata.uid.clone().unwrap());
    let list = kube::api::ListParams::default().labels(&selector);
    let patch = Patch::Merge(json!({"metadata": {"labels": {MARK: value}}}));
    let mut want = BTreeSet::new();
    for job in env.jobs().list(&list).await.unwrap() {
        let name = job.metadata.name.unwrap();
        // One gone meanwhile is not needed: another, or none, carries the label.
        if env
            .jobs()
            .patch(&name, &PatchParams::default(), &patch)
            .await
            .is_ok()
        {
            want.insert(format!("job:{value}"));
        }
    }
    let pods: Api<Pod> = Api::namespaced(env.admin.clone(), &env.ns);
    for pod in pods.list(&list).await.unwrap() {
        let name = pod.metadata.name.unwrap();
        if pods
            .patch(&name, &PatchParams::default(), &patch)
            .await
            .is_ok()
        {
            want.insert(format!("pod:{value}"));
        }
    }
    assert!(!want.is_empty(), "no Job or pod of the GpuJob to label");
    until(seen, "the watches to see the label", UNDO, |s| {
        want.is_subset(&s.marks)
    })
    .await;
}

/// The next attempt's Job, created by a leader that lost the shard before its status
/// write, lands after a change that forbids that attempt (here the spec turned invalid:
/// more GPUs than the operator allows). Before the gate it was taken for the current
/// attempt (its number past the status) and started on the replaced spec. Now it is
/// taken only when the attempt would be started now from the same spec: it is a stray,
/// its pods never leave the gate, and the GpuJob waits for a valid spec.
#[tokio::test]
async fn a_late_create_of_the_next_attempt_is_not_run_after_a_change_that_forbids_it() {
    let env = TestEnv::new("late-next").await;
    let node = OwnNode::create(&env, 2).await;
    let (proxy, first, second) = leader_behind_proxy(&env, &["--max-gpus-per-job", "1"]).await;
    let mut spec = node.place(json!({
        "image": "i", "gpus": 1, "maxRetries": 3,
        "env": sim_env(&[("SIM_FAIL_ATTEMPTS", "1"), ("SIM_DURATION_SECONDS", "2")]),
    }));
    spec["v2"]["backoffSeconds"] = json!(1);
    let gj = env.create("train", spec).await;
    let mut seen = watch_attempts(&env, &gj);
    runs_alone(&mut seen, "train-1").await;
    // Attempt 1 fails; the leader's create of attempt 2 is held, and the leader frozen
    // before it could record attempt 2.
    hold(&proxy, Method::POST, &["jobs"]);
    freeze_when_held(
        &proxy,
        &first,
        "the leader's create of attempt 2 to be held",
    )
    .await;
    // The spec turns invalid (2 GPUs, one allowed): no attempt may start. Changed while
    // the leader is frozen and before replica 2 leads, so replica 2's first look sees it
    // (changed after, it could race replica 2's start of attempt 2 from the valid spec).
    env.gpujobs()
        .patch(
            "train",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"gpus": 2}})),
        )
        .await
        .unwrap();
    wait_holder(&env.admin, &env.ns, Duration::from_secs(30), |h| {
        h == "replica-2"
    })
    .await;
    env.wait_gpujob("train", "waiting on the invalid spec", |g| {
        ready(g).is_some_and(|(_, reason, _)| reason == "InvalidSpec")
    })
    .await;
    release(&proxy);
    let (s, late) = lands_then_goes(&mut seen, "train-2", 1).await;
    assert!(
        !s.ran.contains(&late),
        "the late attempt 2 had a pod that could run: {s:#?}"
    );
    let g = env.gpujobs().get("train").await.unwrap();
    let status = g.status.clone().unwrap();
    assert_eq!(
        (phase(&g), status.attempts, status.failures),
        (Some(Phase::Pending), 1, 1),
        "{status:#?}"
    );
    clean_up(&env, node, first, second).await;
}

/// The Job controller can create a pod for a Job whose end it has not seen yet (a pod of
/// a replaced attempt, made from its Job's template), and the leader's write that lets
/// the next attempt run can land after the leader lost the shard. Here both at once:
/// the leader's start of attempt 2 is held in flight and the leader frozen; a pod of
/// attempt 1 is made from attempt 1's Job as the Job controller makes pods; the held
/// write lands after that pod was made, and the successor waits for the pod. Before the
/// gate, that pod ran (its Job's template had no gate; its process is made to stop
/// slowly here, so it still ran then) and the late start ran attempt 2 beside it. Now
/// the pod waits at the gate, never runs, and is deleted; attempt 2 runs alone.
#[tokio::test]
async fn a_late_start_and_a_pod_made_for_a_replaced_attempt_never_run_two_attempts() {
    let env = TestEnv::new("late-start").await;
    let node = OwnNode::create(&env, 2).await;
    let (proxy, first, second) = leader_behind_proxy(&env, &[]).await;
    let gj = env.create("train", spec(&node, "1")).await;
    let mut seen = watch_attempts(&env, &gj);
    runs_alone(&mut seen, "train-1").await;
    let one = env.jobs().get("train-1").await.unwrap();
    // The writes that let an attempt run: a pod's gate removed (a Job's start, before).
    // Replaced (a spec change): attempt 1 stops, attempt 2 is made, and its start held;
    // the leader frozen with it in flight, replica 2 takes over.
    hold(&proxy, Method::PATCH, &["jobs", "pods"]);
    edit(&env, &node, "2").await;
    freeze_once_held(
        &env,
        &proxy,
        &first,
        "the leader's start of attempt 2 to be held",
    )
    .await;
    // A pod of attempt 1, made from its Job's template as the Job controller makes them.
    let template = one.spec.clone().unwrap().template;
    let mut race: Pod = Pod {
        metadata: template.metadata.clone().unwrap_or_default(),
        spec: template.spec.clone(),
        status: None,
    };
    race.metadata.name = Some("train-1-race".into());
    // Its process stops slowly: were it running, it would still run when the held
    // write lands.
    if let Some(spec) = race.spec.as_mut() {
        spec.termination_grace_period_seconds = Some(300);
        if let Some(main) = spec.containers.first_mut() {
            main.env
                .get_or_insert_with(Vec::new)
                .push(k8s_openapi::api::core::v1::EnvVar {
                    name: "SIM_TERMINATION_SECONDS".into(),
                    value: Some("300".into()),
                    value_from: None,
                });
        }
    }
    race.metadata.owner_references = Some(vec![
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "batch/v1".into(),
            kind: "Job".into(),
            name: "train-1".into(),
            uid: one.metadata.uid.clone().unwrap(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        },
    ]);
    let pods: Api<Pod> = Api::namespaced(env.admin.clone(), &env.ns);
    pods.create(&Default::default(), &race).await.unwrap();
    // The held write lands after it was made (replica 2 leads already); attempt 2 then
    // runs, alone.
    land_held(&env, &proxy, &gj, &mut seen).await;
    let s = until(
        &mut seen,
        "attempt 2 to run",
        Duration::from_secs(60),
        |s| s.live_jobs() == BTreeSet::from(["train-2".to_owned()]),
    )
    .await;
    assert!(
        s.overlaps.is_empty(),
        "two attempts had pods that could run at once: {:?}",
        s.overlaps
    );
    assert!(
        !s.bound_pods.contains("train-1-race"),
        "the pod made for the replaced attempt ran: {s:#?}"
    );
    assert_eq!(
        s.live_jobs(),
        BTreeSet::from(["train-2".to_owned()]),
        "attempt 2 runs alone"
    );
    let g = env.gpujobs().get("train").await.unwrap();
    let status = g.status.clone().unwrap();
    assert_eq!((status.attempts, status.failures), (2, 0), "{status:#?}");
    clean_up(&env, node, first, second).await;
}
