//! The soak: three replicas of the real binary over three shards, each talking to the
//! API server through a fault proxy of its own, GPU quota from a fake service, and Kueue
//! with its Job defaulting webhook (half the namespaces have a LocalQueue named
//! `default`, so Kueue labels, suspends, admits and starts their Jobs), on a control
//! plane of its own. GpuJobs with every kind of outcome arrive (success, a failure then
//! success, exhausted retries, spec edits under both update policies, a `gpus` edit
//! under quota, a rerun of a finished GpuJob, deletions while running and while backing
//! off) while faults are injected at random from a seed: `kill -9` and SIGSTOP/SIGCONT
//! of replicas, proxy faults of every kind, partitions of one replica, kube-apiserver
//! restarts, quota refusals and failures, quota answers lost or applied late, a
//! replica's Job creates, or its writes that let pods run (a pod's scheduling gate
//! removed, a Job started), held in flight past its freeze and its successor's
//! takeover, a replica whose GpuJob watch hangs after a relist while another dies (its
//! shards change hands to a replica whose cache lags), and halfway through a rolling
//! change of the shard count (3 to 4). Throughout, a watch of every pod checks that no
//! two attempts of one GpuJob have pods that can run (ungated or bound to a node) at
//! once, and a sampler that no reservation stays without a GpuJob needing it. Then the
//! faults stop and a checker asserts, from the audit log, the Lease history and the
//! quota service's record, that nothing was done twice, nothing leaked, nobody wrote
//! outside its tenure, no namespace had two writers within a lease duration, and
//! everything converged to what its kind means.
//!
//! `soak_short` (about 2 minutes) runs in the test command; `soak_long` (30 minutes)
//! by hand (`--run-ignored only -E 'test(soak_long)'`).
//! `GPUJOB_SOAK_SEED` replays a schedule; `GPUJOB_SOAK_REPORT` writes the report to a
//! file; `GPUJOB_REPLICA_LOG` sets the replicas' `RUST_LOG`
//! (`info,gpujob_operator::controller=debug` logs every plan). A failing run keeps the
//! audit log and the replica logs, and says where.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::time::Duration;

use devcluster::Identity;
use devcluster::audit::AuditEvent;
use devcluster::faultproxy::{Fault, FaultProxy, Faults, Partition, Rule, SplitMix64};
use gpujob_operator::api::{GpuJob, Phase};
use http::Method;
use jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use nix::sys::signal::Signal;
use serde_json::{Value, json};
use support::attempts::AttemptWatch;
use support::kueue::{Kueue, defaulting_in, gpu_queue_named, kueue_crds, wait_defaulting};
use support::quota::{FakeQuota, Mode};
use support::replicas::{self, LEASE_DURATION, Replica};
use support::{TestEnv, sim_env};
use tokio::time::Instant;

const SHARDS: u32 = 3;
/// The shard count after the rolling change halfway through the faults.
const SHARDS_AFTER: u32 = 4;
const REPLICAS: u8 = 3;
/// How long a frozen replica's Job creates are held in flight: past its lease and its
/// successor's takeover, within the replica's `--api-timeout` (a request its client
/// gave up on would not be delivered).
const HOLD: Duration = Duration::from_secs(8);
/// How long a reservation may stay without a GpuJob that needs it (existing, not
/// finished): a release waits for the GpuJob's Jobs to stop, for its shard's next
/// holder after a freeze or a kill, and for the quota service through failures and
/// backoff.
const ORPHAN_WITHIN: Duration = Duration::from_secs(45);
use support::replicas::WORKERS;

/// The whole schedule follows from the seed (the fault proxy's splitmix64).
struct Rng(SplitMix64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0.next_u64()
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.below(hi - lo + 1))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Succeed,
    FailThenSucceed,
    Exhaust,
    EditRecreate,
    EditOnNext,
    DeleteRunning,
    DeleteBackoff,
    /// `gpus` 1 → 2 while attempt 1 runs (Recreate): attempt 2 runs on a new reservation.
    EditGpus,
    /// Succeeds, then a rerun is asked for: run 2 (attempt 2) succeeds too.
    Rerun,
}

const KINDS: [(Kind, u64); 9] = [
    (Kind::Succeed, 40),
    (Kind::FailThenSucceed, 20),
    (Kind::Exhaust, 10),
    (Kind::EditRecreate, 10),
    (Kind::EditOnNext, 8),
    (Kind::DeleteRunning, 6),
    (Kind::DeleteBackoff, 6),
    (Kind::EditGpus, 6),
    (Kind::Rerun, 8),
];

impl Kind {
    fn pick(rng: &mut Rng) -> Kind {
        let total: u64 = KINDS.iter().map(|(_, w)| w).sum();
        let mut x = rng.below(total);
        for (k, w) in KINDS {
            if x < w {
                return k;
            }
            x -= w;
        }
        Kind::Succeed
    }

    fn spec(self) -> Value {
        let env = |pairs: &[(&str, &str)]| sim_env(pairs);
        match self {
            Kind::Succeed => {
                json!({"image": "i", "gpus": 1, "env": env(&[("SIM_DURATION_SECONDS", "1")])})
            }
            Kind::FailThenSucceed => json!({"image": "i", "gpus": 1, "maxRetries": 3,
                "env": env(&[("SIM_FAIL_ATTEMPTS", "1"), ("SIM_DURATION_SECONDS", "1")])}),
            Kind::Exhaust => json!({"image": "i", "gpus": 1, "maxRetries": 1,
                "env": env(&[("SIM_FAIL_ATTEMPTS", "9"), ("SIM_EXIT_CODE", "7"), ("SIM_DURATION_SECONDS", "0.5")])}),
            Kind::EditRecreate => {
                json!({"image": "i", "gpus": 1, "env": env(&[("SIM_DURATION_SECONDS", "600")])})
            }
            Kind::EditOnNext => json!({"image": "i", "gpus": 1, "updatePolicy": "OnNextAttempt",
                "env": env(&[("SIM_DURATION_SECONDS", "3")])}),
            Kind::DeleteRunning => {
                json!({"image": "i", "gpus": 1, "env": env(&[("SIM_DURATION_SECONDS", "600")])})
            }
            Kind::DeleteBackoff => json!({"image": "i", "gpus": 1, "maxRetries": 50,
                "env": env(&[("SIM_FAIL_ATTEMPTS", "99"), ("SIM_DURATION_SECONDS", "0.5")])}),
            Kind::EditGpus => {
                json!({"image": "i", "gpus": 1, "env": env(&[("SIM_DURATION_SECONDS", "600")])})
            }
            Kind::Rerun => {
                json!({"image": "i", "gpus": 1, "env": env(&[("SIM_DURATION_SECONDS", "1")])})
            }
        }
    }
}

struct Scale {
    label: &'static str,
    gpujobs: usize,
    faults_for: Duration,
    /// Every kube-apiserver restart is this far apart at least.
    apiserver_every: Duration,
}

struct Planned {
    ns: String,
    name: String,
    kind: Kind,
}

/// Retries a call through kube-apiserver restarts.
async fn retrying<T, F, Fut>(what: &str, mut call: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, kube::Error>>,
{
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        // Each try bounded: a call sent into a kube-apiserver restart may never be
        // answered. A write whose answer is lost is repeated; the callers accept the
        // "already done" answer (409 on create, 404 on delete).
        match tokio::time::timeout(Duration::from_secs(10), call()).await {
            Ok(Ok(v)) => return v,
            Ok(Err(_)) | Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Ok(Err(e)) => panic!("{what}: {e}"),
            Err(_) => panic!("{what}: no answer within 10 s, for 120 s"),
        }
    }
}

/// The workload: creates the GpuJobs over `over`, then edits and deletes those whose
/// kind asks for it once they reach the state it acts on. Returns how many edits came
/// too late (the GpuJob had finished before its running attempt was seen).
async fn workload(admin: kube::Client, plan: Vec<Planned>, over: Duration) -> usize {
    let gap = over / u32::try_from(plan.len().max(1)).unwrap_or(1);
    let mut actions = Vec::new();
    for p in plan {
        let api: Api<GpuJob> = Api::namespaced(admin.clone(), &p.ns);
        let gj: GpuJob = serde_json::from_value(json!({
            "apiVersion": "gpujob.dev/v1", "kind": "GpuJob",
            "metadata": {"name": p.name}, "spec": p.kind.spec(),
        }))
        .unwrap();
        retrying("creating a GpuJob", || async {
            match api.create(&PostParams::default(), &gj).await {
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
                other => other.map(|_| ()),
            }
        })
        .await;
        if !matches!(
            p.kind,
            Kind::Succeed | Kind::FailThenSucceed | Kind::Exhaust
        ) {
            // Acted on once it gets there (an edit, a rerun, a delete).
            actions.push(tokio::spawn(act(api, p)));
        }
        tokio::time::sleep(gap).await;
    }
    let mut too_late = 0;
    for a in actions {
        if !a.await.unwrap() {
            too_late += 1;
        }
    }
    too_late
}

/// Waits until the GpuJob is in the state its kind acts on, then acts; false when an
/// edit came too late. A GpuJob can pass through that state unseen (its short attempt
/// ran while the status writes were held up by faults): a finished one is still
/// deleted, but no longer edited.
async fn act(api: Api<GpuJob>, p: Planned) -> bool {
    let wanted = |g: &GpuJob| {
        let s = g.status.clone().unwrap_or_default();
        let ready = g
            .condition("Ready")
            .map(|c| c.reason.clone())
            .unwrap_or_default();
        match p.kind {
            Kind::DeleteBackoff => ready == "BackingOff" && s.failures >= 1,
            Kind::Rerun => s.phase == Some(Phase::Succeeded),
            _ => s.phase == Some(Phase::Running),
        }
    };
    let finished = |g: &GpuJob| {
        g.status
            .as_ref()
            .and_then(|s| s.phase)
            .is_some_and(Phase::is_final)
    };
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        // Bounded: a read sent into a kube-apiserver restart must not hold the workload.
        if let Ok(Ok(g)) = tokio::time::timeout(Duration::from_secs(5), api.get(&p.name)).await {
            if wanted(&g) {
                break;
            }
            if finished(&g) {
                if matches!(
                    p.kind,
                    Kind::EditRecreate | Kind::EditOnNext | Kind::EditGpus
                ) {
                    return false;
                }
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{}/{} never got there",
            p.ns,
            p.name
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    match p.kind {
        Kind::EditRecreate | Kind::EditOnNext | Kind::EditGpus => {
            let env = sim_env(&[("SIM_DURATION_SECONDS", "1"), ("EDITED", "yes")]);
            let patch = if p.kind == Kind::EditGpus {
                json!({"spec": {"gpus": 2, "env": env}})
            } else {
                json!({"spec": {"env": env}})
            };
            retrying("editing a GpuJob", || async {
                api.patch(&p.name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
            })
            .await;
        }
        Kind::Rerun => {
            let patch = json!({"metadata": {"annotations": {"gpujob.dev/rerun": "2"}}});
            retrying("asking for a rerun", || async {
                api.patch(&p.name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
            })
            .await;
        }
        _ => {
            retrying("deleting a GpuJob", || async {
                match api.delete(&p.name, &DeleteParams::default()).await {
                    Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                    other => other.map(|_| ()),
                }
            })
            .await;
        }
    }
    true
}

/// Random proxy faults for one replica.
fn random_faults(rng: &mut Rng) -> (String, Faults) {
    let writes = [Method::POST, Method::PATCH, Method::PUT, Method::DELETE];
    let status = |code, retry_after| Fault::Status { code, retry_after };
    let (label, rules) = match rng.below(9) {
        0 => {
            let fault = Fault::Latency {
                fixed: rng.millis(20, 200),
                jitter: rng.millis(0, 400),
            };
            ("latency", vec![Rule::new(fault)])
        }
        1 => (
            "429",
            vec![Rule::new(status(429, Some(1))).probability(0.3)],
        ),
        2 => (
            "5xx",
            vec![
                Rule::new(status(503, None)).probability(0.2),
                Rule::new(status(500, None)).probability(0.1),
            ],
        ),
        3 => (
            "reset_before",
            vec![
                Rule::new(Fault::ResetBefore)
                    .probability(0.2)
                    .methods(writes),
            ],
        ),
        4 => (
            "reset_after",
            vec![
                Rule::new(Fault::ResetAfter)
                    .probability(0.2)
                    .methods(writes),
            ],
        ),
        5 => {
            let cut = Fault::CutWatchAfter {
                max: Duration::from_secs(2),
            };
            ("watch_cut", vec![Rule::new(cut).watch(true)])
        }
        6 => (
            "gone",
            vec![Rule::new(Fault::Gone).probability(0.5).watch(true)],
        ),
        7 => (
            "expired_event",
            vec![Rule::new(Fault::ExpiredEvent).probability(0.5).watch(true)],
        ),
        _ => (
            "hang",
            vec![Rule::new(Fault::Hang).probability(0.05).watch(false)],
        ),
    };
    let faults = Faults {
        seed: rng.next(),
        rules,
        partition: None,
    };
    (label.to_owned(), faults)
}

/// One fault with an end, driven from the schedule loop.
enum Undo {
    Restart(usize),
    Continue(usize),
    ClearProxy(usize),
    QuotaOk,
}

async fn soak(scale: Scale) {
    let seed = std::env::var("GPUJOB_SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            u64::from(std::process::id()) ^ jiff::Timestamp::now().as_nanosecond() as u64
        });
    println!(
        "soak {} seed {seed} (GPUJOB_SOAK_SEED={seed} replays it)",
        scale.label
    );
    let mut rng = Rng(SplitMix64::new(seed));
    let mut env = TestEnv::private_with_crds("soak", vec![support::test_crd(), kueue_crds()]).await;
    let _kueue = Kueue::start_with_job_webhook(&env).await;
    let fake = FakeQuota::start().await;
    let mut flags = fake.flags(&env.ns);
    // Short timings throughout, as for the Leases: a request held unanswered is given up
    // on in 10 s.
    flags.extend(["--api-timeout".to_owned(), "10s".to_owned()]);
    let mut proxies = Vec::new();
    for _ in 0..REPLICAS {
        proxies.push(FaultProxy::start(&env.cluster).unwrap());
    }
    let addresses: Vec<String> = (0..REPLICAS)
        .map(|_| support::prometheus::free_address())
        .collect();
    let start_replica = |env: &TestEnv, proxies: &[FaultProxy], i: usize, shards: u32| -> Replica {
        let n = u8::try_from(i + 1).unwrap();
        let kubeconfig = proxies[i]
            .kubeconfig(&env.cluster, Identity::Replica(n))
            .unwrap();
        let shards = shards.to_string();
        let mut extra: Vec<&str> = flags.iter().map(String::as_str).collect();
        extra.extend(["--listen-address", &addresses[i], "--shards", &shards]);
        replicas::start_everywhere(&env.cluster, &env.ns, n, &extra, Some(kubeconfig))
    };
    // Each replica's shard count, and when it changed.
    let mut timeline = ShardTimeline::default();
    let mut rs: Vec<Option<Replica>> = (0..usize::from(REPLICAS))
        .map(|i| Some(start_replica(&env, &proxies, i, timeline.now(i))))
        .collect();
    let pods = AttemptWatch::start(&env.admin);
    let orphans = orphan_sampler(env.admin.clone(), fake.clone());
    let ids: Vec<String> = (1..=REPLICAS).map(|n| format!("replica-{n}")).collect();
    let id_refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    support::shards::wait_balanced(&env, SHARDS, &id_refs, 1, Duration::from_secs(60)).await;
    let namespaces = support::shards::namespaces(&env, SHARDS, 2).await;
    // Half the namespaces have a LocalQueue named `default`: Kueue labels (and suspends)
    // every new Job there, admits it (GPUs to spare) and starts it, whatever the operator
    // meant. The operator's gate still decides which pods run.
    for (ns, _) in namespaces.iter().step_by(2) {
        defaulting_in(&env, ns).await;
        gpu_queue_named(&env, 100_000, ns, "default").await;
        wait_defaulting(&env, ns).await;
    }
    let audit = env.cluster.audit();

    // A fault-free batch first: what the same kinds of GpuJob cost without faults.
    let calm = audit.cursor().unwrap();
    let baseline: Vec<Planned> = (0..12)
        .map(|i| Planned {
            ns: namespaces[i % namespaces.len()].0.clone(),
            name: format!("calm-{i}"),
            kind: [Kind::Succeed, Kind::FailThenSucceed, Kind::Exhaust][i % 3],
        })
        .collect();
    let calm_kinds: BTreeMap<(String, String), Kind> = baseline
        .iter()
        .map(|p| ((p.ns.clone(), p.name.clone()), p.kind))
        .collect();
    workload(env.admin.clone(), baseline, Duration::from_secs(2)).await;
    converge(&env, &calm_kinds).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let calm_cost = writes_by_kind(&audit.since(calm).unwrap(), &calm_kinds);
    let start = audit.cursor().unwrap();

    // The plan, from the seed.
    let plan: Vec<Planned> = (0..scale.gpujobs)
        .map(|i| {
            let (ns, _) = &namespaces[usize::try_from(rng.below(namespaces.len() as u64)).unwrap()];
            let kind = Kind::pick(&mut rng);
            Planned {
                ns: ns.clone(),
                name: format!("soak-{i}"),
                kind,
            }
        })
        .collect();
    let kinds: BTreeMap<(String, String), Kind> = plan
        .iter()
        .map(|p| ((p.ns.clone(), p.name.clone()), p.kind))
        .collect();
    let workload = tokio::spawn(workload(env.admin.clone(), plan, scale.faults_for * 2 / 3));

    // Faults, until `faults_for` is over; each with an end.
    let mut injected: BTreeMap<String, u64> = BTreeMap::new();
    let mut retried_by_the_killed: BTreeMap<String, f64> = BTreeMap::new();
    let mut undo: Vec<(Instant, Undo)> = Vec::new();
    let began = Instant::now();
    let mut last_restart = began;
    let heal = |u: Undo, rs: &mut Vec<Option<Replica>>, env: &TestEnv, t: &ShardTimeline| match u {
        Undo::Restart(i) => rs[i] = Some(start_replica(env, &proxies, i, t.now(i))),
        Undo::Continue(i) => {
            if let Some(r) = &rs[i] {
                r.signal(Signal::SIGCONT);
            }
        }
        Undo::ClearProxy(i) => proxies[i].clear(),
        Undo::QuotaOk => {
            fake.set_reserve(Mode::Ok);
            fake.set_release(Mode::Ok);
            // Calls answered with a timeout reach the service now, late.
            fake.apply_late();
        }
    };
    let change_at = scale.faults_for / 2;
    while began.elapsed() < scale.faults_for {
        tokio::time::sleep(rng.millis(1000, 3000)).await;
        let now = Instant::now();
        let due: Vec<Undo> = {
            let (due, keep): (Vec<_>, Vec<_>) = undo.drain(..).partition(|(at, _)| *at <= now);
            undo = keep;
            due.into_iter().map(|(_, u)| u).collect()
        };
        for u in due {
            heal(u, &mut rs, &env, &timeline);
        }
        if !timeline.changed() && began.elapsed() >= change_at {
            // A rolling change of the shard count, as a Deployment rollout makes it: one
            // replica at a time stopped (SIGTERM: it drains and releases its Leases) and
            // started with the new count. Faults healed first, so that nothing held in
            // flight lands after its sender's count changed.
            for (_, u) in undo.drain(..) {
                heal(u, &mut rs, &env, &timeline);
            }
            heal(Undo::QuotaOk, &mut rs, &env, &timeline);
            for (i, slot) in rs.iter_mut().enumerate() {
                if let Some(mut r) = slot.take() {
                    r.signal(Signal::SIGTERM);
                    r.wait_exit(Duration::from_secs(30)).await;
                }
                timeline.change(i);
                *slot = Some(start_replica(&env, &proxies, i, timeline.now(i)));
                tokio::time::sleep(rng.millis(1000, 3000)).await;
            }
            *injected.entry("shard_count_change".to_owned()).or_insert(0) += 1;
            continue;
        }
        // A create held past the change would land after its sender's count changed.
        let may_hold =
            timeline.changed() || began.elapsed() + HOLD + Duration::from_secs(3) < change_at;
        let busy: BTreeSet<usize> = undo
            .iter()
            .filter_map(|(_, u)| match u {
                Undo::Restart(i) | Undo::Continue(i) | Undo::ClearProxy(i) => Some(*i),
                Undo::QuotaOk => None,
            })
            .collect();
        let i = usize::try_from(rng.below(u64::from(REPLICAS))).unwrap();
        let label = match rng.below(13) {
            0 | 1 if !busy.contains(&i) && rs[i].is_some() => {
                // Its counters die with it: read them first.
                if let Ok(counted) =
                    tokio::time::timeout(Duration::from_secs(2), retries_by_code(&addresses[i..=i]))
                        .await
                {
                    for (code, n) in counted {
                        *retried_by_the_killed.entry(code).or_insert(0.0) += n;
                    }
                }
                let mut r = rs[i].take().unwrap();
                r.signal(Signal::SIGKILL);
                r.wait_exit(Duration::from_secs(10)).await;
                undo.push((now + rng.millis(2000, 6000), Undo::Restart(i)));
                "kill_9".to_owned()
            }
            2 if !busy.contains(&i) && rs[i].is_some() => {
                rs[i].as_ref().unwrap().signal(Signal::SIGSTOP);
                undo.push((
                    now + LEASE_DURATION + rng.millis(500, 3000),
                    Undo::Continue(i),
                ));
                "sigstop".to_owned()
            }
            3 if !busy.contains(&i) => {
                let p = if rng.below(2) == 0 {
                    Partition::Hang
                } else {
                    Partition::Refuse
                };
                let label = format!("partition_{p:?}").to_lowercase();
                proxies[i].set(Faults::new().seed(rng.next()).partition(p));
                undo.push((now + rng.millis(3000, 8000), Undo::ClearProxy(i)));
                label
            }
            4 if last_restart.elapsed() >= scale.apiserver_every => {
                env.cluster.stop_apiserver().unwrap();
                tokio::time::sleep(rng.millis(1000, 4000)).await;
                env.cluster.start_apiserver().await.unwrap();
                last_restart = Instant::now();
                "apiserver_restart".to_owned()
            }
            5 => {
                let (mode, label) = match rng.below(4) {
                    0 => (Mode::Refuse, "quota_refused"),
                    1 => (Mode::Fail, "quota_failed"),
                    2 => (Mode::AnswerLost, "quota_answer_lost"),
                    _ => (Mode::ApplyLate, "quota_applied_late"),
                };
                if rng.below(2) == 0 || mode == Mode::Refuse {
                    fake.set_reserve(mode);
                } else {
                    fake.set_release(mode);
                }
                undo.push((now + rng.millis(2000, 6000), Undo::QuotaOk));
                label.to_owned()
            }
            kind @ (6 | 7) if !busy.contains(&i) && rs[i].is_some() && may_hold => {
                // Its Job creates (6), or its writes that let pods run (7: a pod's
                // scheduling gate removed; a Job an earlier version made, started), wait
                // in the proxy; frozen with some in flight, it loses its shards, and they
                // land after its successor took over (and may have replaced, stopped or
                // finished those attempts).
                let hold = Fault::Latency {
                    fixed: HOLD,
                    jitter: Duration::ZERO,
                };
                let (rule, label) = if kind == 6 {
                    let rule = Rule::new(hold).methods([Method::POST]).resources(["jobs"]);
                    (rule, "create_held")
                } else {
                    let rule = Rule::new(hold)
                        .methods([Method::PATCH])
                        .resources(["pods", "jobs"]);
                    (rule, "start_held")
                };
                proxies[i].set(Faults::new().seed(rng.next()).rule(rule));
                tokio::time::sleep(rng.millis(500, 2000)).await;
                rs[i].as_ref().unwrap().signal(Signal::SIGSTOP);
                let now = Instant::now();
                undo.push((
                    now + LEASE_DURATION + rng.millis(500, 2000),
                    Undo::Continue(i),
                ));
                undo.push((now + HOLD + Duration::from_secs(1), Undo::ClearProxy(i)));
                label.to_owned()
            }
            8 => {
                // Replica i's watches cut, then its GpuJob watch hangs after the relist:
                // its GpuJob cache stops where it is. Another replica dies, so that shards
                // change hands, maybe to i, which then plans from that cache (a GpuJob
                // finished there may be running a rerun, say).
                let j = (i + 1 + usize::try_from(rng.below(u64::from(REPLICAS) - 1)).unwrap())
                    % usize::from(REPLICAS);
                if busy.contains(&i) || busy.contains(&j) || rs[i].is_none() || rs[j].is_none() {
                    continue;
                }
                proxies[i].set(Faults::new().partition(Partition::Refuse));
                tokio::time::sleep(Duration::from_millis(200)).await;
                let hang = Rule::new(Fault::Hang).watch(true).resources(["gpujobs"]);
                proxies[i].set(Faults::new().seed(rng.next()).rule(hang));
                if let Ok(counted) =
                    tokio::time::timeout(Duration::from_secs(2), retries_by_code(&addresses[j..=j]))
                        .await
                {
                    for (code, n) in counted {
                        *retried_by_the_killed.entry(code).or_insert(0.0) += n;
                    }
                }
                let mut r = rs[j].take().unwrap();
                r.signal(Signal::SIGKILL);
                r.wait_exit(Duration::from_secs(10)).await;
                let now = Instant::now();
                undo.push((now + rng.millis(4000, 8000), Undo::Restart(j)));
                undo.push((now + rng.millis(6000, 12000), Undo::ClearProxy(i)));
                "gpujob_watch_hung".to_owned()
            }
            _ if !busy.contains(&i) => {
                let (label, faults) = random_faults(&mut rng);
                proxies[i].set(faults);
                undo.push((now + rng.millis(3000, 10000), Undo::ClearProxy(i)));
                format!("proxy_{label}")
            }
            _ => continue,
        };
        *injected.entry(label).or_insert(0) += 1;
    }

    // The faults stop: everything healed, every replica running.
    for (_, u) in undo.drain(..) {
        heal(u, &mut rs, &env, &timeline);
    }
    heal(Undo::QuotaOk, &mut rs, &env, &timeline);
    let stopped = Instant::now();
    let edits_too_late = workload.await.unwrap();
    let converged = match converge(&env, &kinds).await {
        Ok(c) => c,
        Err(why) => {
            let keep = keep_evidence(&audit, seed);
            panic!(
                "{why}\n(seed {seed}; audit log kept in {}, replica logs in {})",
                keep.display(),
                support::namespace_temp(support::REPLICA_LOGS, &env.ns).display()
            );
        }
    };
    let converged_after = stopped.elapsed();

    // Let the last writes reach the audit log, then judge.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let events = audit.since(start).unwrap();
    // Tenures from the whole Lease history (shards were taken before the window opened).
    let history = audit.all().unwrap();
    let mut report = check(&fake, &kinds, &events, &history, &converged, &timeline);
    report.violations.extend(pods.overlaps());
    if pods.pods_seen() == 0 {
        report
            .violations
            .push("the pod watch saw no pod: it proves nothing".to_owned());
    }
    let orphaned = orphans.stop().await;
    report.violations.extend(orphaned.violations);
    let mut proxy_counts: BTreeMap<String, u64> = BTreeMap::new();
    for p in &proxies {
        for (k, v) in p.counts() {
            *proxy_counts.entry(k).or_insert(0) += v;
        }
    }
    let mut retries = retries_by_code(&addresses).await;
    for (code, n) in retried_by_the_killed {
        *retries.entry(code).or_insert(0.0) += n;
    }
    let mut text = String::new();
    let _ = writeln!(text, "# Soak report ({})\n", scale.label);
    let _ = writeln!(
        text,
        "Seed {seed}; {} GpuJobs over {} namespaces and {SHARDS} shards; {REPLICAS} replicas, each behind a fault proxy; faults for {:?}.\n",
        kinds.len(),
        namespaces.len(),
        scale.faults_for
    );
    let _ = writeln!(text, "| measure | value |\n|---|---|");
    let _ = writeln!(
        text,
        "| faults injected (schedule) | {} |",
        fmt_counts(&injected)
    );
    let _ = writeln!(
        text,
        "| what the proxies did | {} |",
        fmt_counts(&proxy_counts)
    );
    let _ = writeln!(
        text,
        "| shard count | {SHARDS}, then {SHARDS_AFTER} from {:.0} s (one replica at a time) |",
        change_at.as_secs_f64()
    );
    let _ = writeln!(
        text,
        "| edits that came too late (the GpuJob had finished) | {edits_too_late} |"
    );
    let _ = writeln!(
        text,
        "| attempts of one GpuJob with pods that can run at once (ungated or bound), at most (pod events watched) | {} ({}) |",
        pods.most_at_once(),
        pods.pods_seen()
    );
    let _ = writeln!(
        text,
        "| longest a reservation had no GpuJob needing it (sampled each second; allowed) | {:.0} s ({:?}) |",
        orphaned.longest.as_secs_f64(),
        ORPHAN_WITHIN
    );
    let _ = writeln!(
        text,
        "| converged after the faults stopped | {:.1} s |",
        converged_after.as_secs_f64()
    );
    let _ = writeln!(
        text,
        "| writes to GpuJobs, Jobs and pods per GpuJob | {:.2} |",
        report.writes_per_gpujob
    );
    let cost = writes_by_kind(&events, &kinds);
    for (kind, (writes, n)) in &calm_cost {
        if let Some((w, m)) = cost.get(kind) {
            let _ = writeln!(
                text,
                "| writes per {kind:?} GpuJob, fault-free / under faults | {:.2} / {:.2} |",
                *writes as f64 / (*n).max(1) as f64,
                *w as f64 / (*m).max(1) as f64
            );
        }
    }
    let _ = writeln!(
        text,
        "| client retries by code (every replica; read before each kill) | {} |",
        fmt_counts(&retries)
    );
    let _ = writeln!(text, "| outcomes | {} |", fmt_counts(&report.outcomes));
    let _ = writeln!(
        text,
        "| invariant violations | {} |",
        report.violations.len()
    );
    for v in &report.violations {
        let _ = writeln!(text, "\n- {v}");
    }
    println!("{text}");
    if let Ok(path) = std::env::var("GPUJOB_SOAK_REPORT") {
        std::fs::write(&path, &text).unwrap();
    }
    if !report.violations.is_empty() {
        let keep = keep_evidence(&audit, seed);
        panic!(
            "{} invariant violations (seed {seed}); audit log kept in {}, replica logs in {}",
            report.violations.len(),
            keep.display(),
            support::namespace_temp(support::REPLICA_LOGS, &env.ns).display()
        );
    }
    drop(rs);
}

/// Copies the audit log out of the control plane's folder, which goes with the test.
fn keep_evidence(audit: &devcluster::audit::AuditLog, seed: u64) -> std::path::PathBuf {
    let keep = std::env::temp_dir().join(format!("gpujob-soak-{seed}"));
    std::fs::create_dir_all(&keep).unwrap();
    let _ = std::fs::copy(audit.path(), keep.join("audit.log"));
    keep
}

fn fmt_counts<V: std::fmt::Display>(c: &BTreeMap<String, V>) -> String {
    c.iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// How long after the faults stop every GpuJob must have converged: a lease duration
/// for shards to find live holders, the longest retry backoff (4 s), a per-GpuJob
/// backoff grown by refused quota or failed calls, and time for replicas restarted at
/// the very end to list everything again — generously.
const CONVERGE_WITHIN: Duration = Duration::from_secs(90);

/// Waits until every GpuJob is final with its quota released and its finalizer gone, or
/// gone when its kind deletes it.
async fn converge(
    env: &TestEnv,
    kinds: &BTreeMap<(String, String), Kind>,
) -> Result<BTreeMap<(String, String), GpuJob>, String> {
    let deadline = Instant::now() + CONVERGE_WITHIN;
    loop {
        let all: Api<GpuJob> = Api::all(env.admin.clone());
        if let Ok(list) = all.list(&ListParams::default()).await {
            let by: BTreeMap<(String, String), GpuJob> = list
                .items
                .into_iter()
                .map(|g| {
                    (
                        (
                            g.metadata.namespace.clone().unwrap(),
                            g.metadata.name.clone().unwrap(),
                        ),
                        g,
                    )
                })
                .collect();
            let pending: Vec<&(String, String)> = kinds
                .iter()
                .filter(|(key, kind)| match (kind, by.get(*key)) {
                    (Kind::DeleteRunning | Kind::DeleteBackoff, found) => found.is_some(),
                    // Finished and settled: the release is done and recorded, the
                    // finalizer gone (a release still being retried is not converged).
                    (_, Some(g)) => {
                        let s = g.status.clone().unwrap_or_default();
                        !s.phase.is_some_and(Phase::is_final)
                            || s.reservation_id.is_some()
                            || g.holds_quota_finalizer()
                            || (**kind == Kind::Rerun && s.run != Some(2))
                    }
                    (_, None) => true,
                })
                .map(|(k, _)| k)
                .collect();
            if pending.is_empty() {
                return Ok(by);
            }
            if Instant::now() >= deadline {
                let why: Vec<String> = pending
                    .iter()
                    .take(5)
                    .map(|key| match by.get(*key) {
                        Some(g) => {
                            let s = g.status.clone().unwrap_or_default();
                            let ready = g.condition("Ready").map(|c| format!("{}: {}", c.reason, c.message));
                            format!(
                                "{}/{} ({:?}): phase {:?}, attempts {}, failures {}, Ready {ready:?}, deleting {}",
                                key.0,
                                key.1,
                                kinds[*key],
                                s.phase,
                                s.attempts,
                                s.failures,
                                g.metadata.deletion_timestamp.is_some()
                            )
                        }
                        None => format!("{}/{} ({:?}): missing", key.0, key.1, kinds[*key]),
                    })
                    .collect();
                return Err(format!(
                    "{} GpuJobs did not converge within {CONVERGE_WITHIN:?} of the faults stopping: {why:#?}",
                    pending.len()
                ));
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

struct Checked {
    violations: Vec<String>,
    outcomes: BTreeMap<String, usize>,
    writes_per_gpujob: f64,
}

/// Job creates by the replicas, by (namespace, name). A create the API server answered
/// with an error may still have been stored (kube-apiserver stopping after etcd took
/// it): it counts when the next successful request on that Job is not a create.
fn job_creates(events: &[AuditEvent]) -> BTreeMap<(String, String), usize> {
    let mut on_job: BTreeMap<(String, String), Vec<&AuditEvent>> = BTreeMap::new();
    for e in events
        .iter()
        .filter(|e| e.resource == "jobs" && !e.name.is_empty())
    {
        on_job
            .entry((e.namespace.clone(), e.name.clone()))
            .or_default()
            .push(e);
    }
    let mut creates = BTreeMap::new();
    for (key, mut es) in on_job {
        es.sort_by(|a, b| a.received.cmp(&b.received));
        let n = es
            .iter()
            .enumerate()
            .filter(|(_, e)| e.verb == "create" && e.user.starts_with("replica-"))
            .filter(|(i, e)| {
                e.succeeded()
                    || (e.code == 0 || e.code >= 500)
                        && es[i + 1..]
                            .iter()
                            .find(|later| later.succeeded())
                            .is_some_and(|later| later.verb != "create")
            })
            .count();
        if n > 0 {
            creates.insert(key, n);
        }
    }
    creates
}

fn check(
    fake: &FakeQuota,
    kinds: &BTreeMap<(String, String), Kind>,
    events: &[AuditEvent],
    history: &[AuditEvent],
    finished: &BTreeMap<(String, String), GpuJob>,
    timeline: &ShardTimeline,
) -> Checked {
    let mut v = Vec::new();
    // At most one Job per (GpuJob, attempt) ever created; attempts without gaps. A
    // create held in flight past its writer's tenure may land after the successor
    // created and deleted that Job: it is let through here only as the tenure check
    // below lets it (a new object by the old name, which the successor deletes again).
    let creates = job_creates(events);
    let returned = support::shards::returned_jobs_by(history, SHARDS.max(SHARDS_AFTER), |w| {
        timeline.of(&w.user, &w.received)
    });
    for ((ns, name), n) in &creates {
        let back = returned
            .get(&(ns.clone(), name.clone()))
            .copied()
            .unwrap_or(0);
        if n.saturating_sub(back) > 1 {
            v.push(format!(
                "Job {ns}/{name} created {n} times ({back} of them late, after it was deleted)"
            ));
        }
    }
    let mut outcomes: BTreeMap<String, usize> = BTreeMap::new();
    for ((ns, name), kind) in kinds {
        let mut attempts: Vec<i32> = creates
            .keys()
            .filter(|(n, job)| {
                n == ns && job.rsplit_once('-').is_some_and(|(base, _)| base == name)
            })
            .filter_map(|(_, job)| job.rsplit_once('-')?.1.parse().ok())
            .collect();
        attempts.sort();
        let Some(g) = finished.get(&(ns.clone(), name.clone())) else {
            if !matches!(kind, Kind::DeleteRunning | Kind::DeleteBackoff) {
                v.push(format!(
                    "{ns}/{name} ({kind:?}) is gone, and nobody deleted it"
                ));
            }
            *outcomes.entry("deleted".into()).or_insert(0) += 1;
            continue;
        };
        let s = g.status.clone().unwrap_or_default();
        *outcomes
            .entry(format!("{:?}", s.phase.unwrap_or(Phase::Pending)))
            .or_insert(0) += 1;
        if attempts != (1..=s.attempts).collect::<Vec<_>>() {
            v.push(format!(
                "{ns}/{name}: status says {} attempts, Jobs created {attempts:?}",
                s.attempts
            ));
        }
        let (phase, failures, exit) = match kind {
            Kind::Succeed
            | Kind::EditRecreate
            | Kind::EditOnNext
            | Kind::EditGpus
            | Kind::Rerun => (Phase::Succeeded, 0, None),
            Kind::FailThenSucceed => (Phase::Succeeded, 1, Some(1)),
            Kind::Exhaust => (Phase::Failed, 2, Some(7)),
            Kind::DeleteRunning | Kind::DeleteBackoff => {
                v.push(format!("{ns}/{name}: deleted, yet still there"));
                continue;
            }
        };
        if s.phase != Some(phase) || s.failures != failures {
            v.push(format!(
                "{ns}/{name} ({kind:?}): phase {:?}, {} failures; expected {phase:?}, {failures}",
                s.phase, s.failures
            ));
        }
        if *kind == Kind::Rerun && s.run != Some(2) {
            v.push(format!(
                "{ns}/{name} (Rerun): run {:?}, expected 2 (the rerun ran)",
                s.run
            ));
        }
        if let Some(code) = exit
            && s.last_failure.as_ref().and_then(|f| f.exit_code) != Some(code)
        {
            v.push(format!(
                "{ns}/{name}: last failure {:?}, expected exit code {code}",
                s.last_failure
            ));
        }
        if s.reservation_id.is_some() {
            v.push(format!(
                "{ns}/{name}: finished, still records reservation {:?}",
                s.reservation_id
            ));
        }
        // One reservation per run and per size: a rerun reserves again after its first
        // run released, a gpus edit after the old size was released (the service never
        // holds two for one uid: it keeps one per uid).
        let reservations = match kind {
            Kind::Rerun | Kind::EditGpus => 2,
            _ => 1,
        };
        if let Some(uid) = &g.metadata.uid
            && fake.granted(uid).len() > reservations
        {
            v.push(format!(
                "{ns}/{name} ({kind:?}): reserved {} times: {:?}",
                fake.granted(uid).len(),
                fake.granted(uid)
            ));
        }
    }
    // No reservation outlives its GpuJob's run.
    for (uid, id) in fake.live() {
        v.push(format!("reservation {id} of GpuJob uid {uid} leaked"));
    }
    // Nobody wrote outside its tenure (beyond what was in flight), and no late write
    // landed on an object another replica had written.
    let tenure = std::panic::catch_unwind(|| {
        support::shards::assert_writes_within_tenures_by(
            history,
            SHARDS.max(SHARDS_AFTER),
            WORKERS,
            |w| timeline.of(&w.user, &w.received),
        )
    });
    if let Err(e) = tenure {
        let why = e
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| e.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_default();
        v.push(format!("a write outside its writer's tenure: {why}"));
    }
    // No namespace written by two replicas at once (with the shard count changing
    // midway, replicas with different counts would map it to different Leases).
    v.extend(support::shards::two_writers(
        events,
        LEASE_DURATION,
        WORKERS,
    ));
    let control = events
        .iter()
        .filter(|e| e.user.starts_with("replica-") && e.is_write() && e.succeeded())
        .filter(|e| matches!(e.resource.as_str(), "gpujobs" | "jobs" | "pods"))
        .count();
    Checked {
        violations: v,
        outcomes,
        writes_per_gpujob: control as f64 / kinds.len().max(1) as f64,
    }
}

/// Each replica's `--shards` over time, for judging its writes against the Leases of
/// its own count.
#[derive(Debug, Default)]
struct ShardTimeline {
    /// Per replica (index from 0): when its count became `SHARDS_AFTER`.
    changed_at: BTreeMap<usize, Timestamp>,
}

impl ShardTimeline {
    /// The count replica `i` starts with now.
    fn now(&self, i: usize) -> u32 {
        if self.changed_at.contains_key(&i) {
            SHARDS_AFTER
        } else {
            SHARDS
        }
    }

    /// Replica `i` (stopped) starts with `SHARDS_AFTER` from now on.
    fn change(&mut self, i: usize) {
        self.changed_at.insert(i, Timestamp::now());
    }

    fn changed(&self) -> bool {
        !self.changed_at.is_empty()
    }

    /// The count of `user` (`replica-<n>`) at `received` (an audit timestamp; the
    /// control plane runs on this machine's clock).
    fn of(&self, user: &str, received: &str) -> u32 {
        let i = user
            .strip_prefix("replica-")
            .and_then(|n| n.parse::<usize>().ok())
            .map(|n| n - 1);
        let at: Option<Timestamp> = received.parse().ok();
        match (i.and_then(|i| self.changed_at.get(&i)), at) {
            (Some(changed), Some(at)) if at >= *changed => SHARDS_AFTER,
            _ => SHARDS,
        }
    }
}

/// What the reservation sampler found.
struct Orphans {
    longest: Duration,
    violations: Vec<String>,
}

struct OrphanSampler {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Orphans>,
}

impl OrphanSampler {
    async fn stop(self) -> Orphans {
        let _ = self.stop.send(());
        self.task.await.unwrap()
    }
}

/// Samples every second, until stopped, which reservations have no GpuJob that needs
/// them (the GpuJob of that uid exists and has not finished), and for how long.
fn orphan_sampler(admin: kube::Client, fake: FakeQuota) -> OrphanSampler {
    let (stop, mut stopped) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let all: Api<GpuJob> = Api::all(admin);
        let mut since: BTreeMap<String, Instant> = BTreeMap::new();
        let mut out = Orphans {
            longest: Duration::ZERO,
            violations: Vec::new(),
        };
        let mut reported = BTreeSet::new();
        loop {
            tokio::select! {
                _ = &mut stopped => return out,
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
            // Reservations first: one made after the list would look orphaned.
            let live = fake.live();
            let Ok(Ok(list)) =
                tokio::time::timeout(Duration::from_secs(5), all.list(&ListParams::default()))
                    .await
            else {
                // kube-apiserver restarting: judge at the next sample.
                continue;
            };
            let needing: BTreeSet<String> = list
                .items
                .iter()
                .filter(|g| {
                    !g.status
                        .as_ref()
                        .and_then(|s| s.phase)
                        .is_some_and(Phase::is_final)
                })
                .filter_map(|g| g.metadata.uid.clone())
                .collect();
            let now = Instant::now();
            since.retain(|uid, _| live.contains_key(uid) && !needing.contains(uid));
            for (uid, id) in &live {
                if needing.contains(uid) {
                    continue;
                }
                let first = *since.entry(uid.clone()).or_insert(now);
                let held = now - first;
                out.longest = out.longest.max(held);
                if held > ORPHAN_WITHIN && reported.insert(uid.clone()) {
                    out.violations.push(format!(
                        "reservation {id} of GpuJob uid {uid} was held {held:?} with no GpuJob needing it"
                    ));
                }
            }
        }
    });
    OrphanSampler { stop, task }
}

/// Successful replica writes to GpuJobs, their Jobs and their pods, and the number of
/// GpuJobs, by kind (a Job `<name>-<k>`, or its pod, counts for GpuJob `<name>`).
fn writes_by_kind(
    events: &[AuditEvent],
    kinds: &BTreeMap<(String, String), Kind>,
) -> BTreeMap<Kind, (usize, usize)> {
    let mut out: BTreeMap<Kind, (usize, usize)> = BTreeMap::new();
    for kind in kinds.values() {
        out.entry(*kind).or_default().1 += 1;
    }
    for e in events {
        if !(e.user.starts_with("replica-") && e.is_write() && e.succeeded()) {
            continue;
        }
        let owner = match e.resource.as_str() {
            "gpujobs" => e.name.clone(),
            "jobs" => e
                .name
                .rsplit_once('-')
                .map(|(b, _)| b.to_owned())
                .unwrap_or_default(),
            // `<gpujob>-<attempt>-<suffix>` (every soak GpuJob runs on one node).
            "pods" => e
                .name
                .rsplit_once('-')
                .and_then(|(job, _)| job.rsplit_once('-'))
                .map(|(b, _)| b.to_owned())
                .unwrap_or_default(),
            _ => continue,
        };
        if let Some(kind) = kinds.get(&(e.namespace.clone(), owner)) {
            out.entry(*kind).or_default().0 += 1;
        }
    }
    out
}

/// `rest_client_request_retries_total` by code, summed over the replicas at `addresses`.
async fn retries_by_code(addresses: &[String]) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for a in addresses {
        let Ok(text) = support::prometheus::get_text(&format!("http://{a}/metrics")).await else {
            continue;
        };
        for line in text
            .lines()
            .filter(|l| l.starts_with("rest_client_request_retries_total{"))
        {
            let code = line
                .split("code=\"")
                .nth(1)
                .and_then(|r| r.split('"').next())
                .unwrap_or("?");
            let value: f64 = line
                .rsplit(' ')
                .next()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0.0);
            if value > 0.0 {
                *out.entry(code.to_owned()).or_insert(0.0) += value;
            }
        }
    }
    out
}

#[tokio::test]
async fn soak_short() {
    soak(Scale {
        label: "short",
        gpujobs: 120,
        faults_for: Duration::from_secs(100),
        apiserver_every: Duration::from_secs(40),
    })
    .await;
}

#[tokio::test]
#[ignore = "30 minutes: run by hand (--run-ignored only -E 'test(soak_long)')"]
async fn soak_long() {
    soak(Scale {
        label: "long",
        gpujobs: 1000,
        faults_for: Duration::from_secs(30 * 60),
        apiserver_every: Duration::from_secs(180),
    })
    .await;
}

#[test]
fn a_create_answered_with_an_error_counts_when_the_job_turns_up() {
    let ev = |received: &str, user: &str, verb: &str, name: &str, code: u16| AuditEvent {
        user: user.into(),
        user_agent: String::new(),
        verb: verb.into(),
        api_group: "batch".into(),
        resource: "jobs".into(),
        subresource: String::new(),
        namespace: "ns".into(),
        name: name.into(),
        code,
        timestamp: received.into(),
        received: received.into(),
        lease_holder: None,
    };
    let kcm = "system:kube-controller-manager";
    let events = [
        // Stored although answered 500: the Job controller updates it next.
        ev("01", "replica-1", "create", "a-1", 500),
        ev("02", kcm, "update", "a-1", 200),
        // Not stored: the retry creates it.
        ev("03", "replica-1", "create", "b-1", 503),
        ev("04", "replica-2", "create", "b-1", 201),
        // Created twice over time: deleted between.
        ev("05", "replica-1", "create", "c-1", 201),
        ev("06", "replica-1", "delete", "c-1", 200),
        ev("07", "replica-2", "create", "c-1", 201),
        // Refused: never there.
        ev("08", "replica-1", "create", "d-1", 409),
    ];
    let got = job_creates(&events);
    let n = |name: &str| got.get(&("ns".to_owned(), name.to_owned())).copied();
    assert_eq!(
        (n("a-1"), n("b-1"), n("c-1"), n("d-1")),
        (Some(1), Some(1), Some(2), None)
    );
}

#[test]
fn two_writers_in_turns_break_the_rule_a_handover_does_not() {
    fn w(received: &str, user: &str, name: &str) -> AuditEvent {
        AuditEvent {
            user: user.into(),
            user_agent: String::new(),
            verb: "patch".into(),
            api_group: "gpujob.dev".into(),
            resource: "gpujobs".into(),
            subresource: "status".into(),
            namespace: "ns".into(),
            name: name.into(),
            code: 200,
            timestamp: received.into(),
            received: received.into(),
            lease_holder: None,
        }
    }

    let lease = Duration::from_secs(3);
    let at = |s: u32, ms: u32| format!("2026-12-02T10:00:{s:02}.{ms:03}Z");
    // A hands over to B; one of A's writes was in flight; A takes the namespace
    // back after B's lease ran out.
    let handover = vec![
        w(&at(0, 0), "replica-1", "a"),
        w(&at(1, 0), "replica-1", "b"),
        w(&at(2, 0), "replica-2", "c"),
        w(&at(2, 500), "replica-1", "d"),
        w(&at(3, 0), "replica-2", "e"),
        w(&at(9, 0), "replica-1", "f"),
    ];
    assert_eq!(
        support::shards::two_writers(&handover, lease, 1),
        Vec::<String>::new()
    );
    // Both write the namespace, in turns.
    let turns: Vec<AuditEvent> = (0..20)
        .map(|i| {
            let user = if i % 2 == 0 { "replica-1" } else { "replica-2" };
            w(&at(10 + i / 10, (i % 10) * 100), user, "x")
        })
        .collect();
    let broken = support::shards::two_writers(&turns, lease, 4);
    assert_eq!(broken.len(), 2, "{broken:#?}");
    assert_eq!(
        support::shards::two_writers(&turns[..8], lease, 4),
        Vec::<String>::new()
    );
}
