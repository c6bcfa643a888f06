//! High availability against the real control plane, with the real binary: three
//! replicas, each under its own API user, contend for one Lease. Short timings (3 s
//! lease, 2 s renew deadline, 0.5 s retry); assertions are facts and generous bounds.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use devcluster::audit::AuditEvent;
use gpujob_operator::api::{LABEL_UID, Phase};
use gpujob_operator::controller::job::attempt_of;
use k8s_openapi::api::batch::v1::Job;
use kube::api::ListParams;
use nix::sys::signal::Signal;
use serde_json::json;
use support::replicas::{self, LEASE_DURATION, Replica, holder, times, wait_holder};
use support::{TestEnv, phase, sim_env};

use support::replicas::WORKERS;

async fn start_three(env: &TestEnv) -> Vec<Replica> {
    (1..=3)
        .map(|n| replicas::start(&env.cluster, &env.ns, n, &[]))
        .collect()
}

fn leader_index(replicas: &[Replica], holder: &str) -> usize {
    replicas
        .iter()
        .position(|r| r.identity() == holder)
        .unwrap()
}

/// Waits until every GpuJob of the namespace is final; returns how many.
async fn wait_all_final(env: &TestEnv, expected: usize, within: Duration) {
    env.wait_gpujobs("every GpuJob to finish", within, |all| {
        all.len() == expected && all.iter().all(|g| phase(g).is_some_and(Phase::is_final))
    })
    .await
    .unwrap();
}

/// Every GpuJob's attempts are 1..=n without gaps or repeats, and none started before
/// the previous one failed.
async fn assert_attempts_sound(env: &TestEnv) {
    let jobs = env.jobs().list(&ListParams::default()).await.unwrap().items;
    let mut by_owner: BTreeMap<String, Vec<Job>> = BTreeMap::new();
    for j in jobs {
        let uid = j.metadata.labels.as_ref().unwrap()[LABEL_UID].clone();
        by_owner.entry(uid).or_default().push(j);
    }
    for gj in env
        .gpujobs()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
    {
        let uid = gj.metadata.uid.clone().unwrap();
        let name = gj.metadata.name.clone().unwrap();
        let mut jobs = by_owner.remove(&uid).unwrap_or_default();
        jobs.sort_by_key(|j| attempt_of(j).unwrap_or(0));
        let attempts = gj.status.clone().unwrap().attempts;
        env.assert_attempts_sequential(&name, &jobs, attempts).await;
    }
}

fn writes_on_gpujobs_and_jobs(events: &[AuditEvent], ns: &str) -> Vec<AuditEvent> {
    events
        .iter()
        .filter(|e| {
            e.namespace == ns && e.is_write() && (e.resource == "gpujobs" || e.resource == "jobs")
        })
        .filter(|e| e.user.starts_with("replica-"))
        .cloned()
        .collect()
}

#[tokio::test]
async fn three_replicas_one_leader_and_only_it_writes() {
    let env = TestEnv::new("ha-three").await;
    let audit = env.cluster.audit();
    let start = audit.cursor().unwrap();
    // Default timings: on a machine loaded by the other tests, a 2 s renew deadline
    // could hand the Lease over for real, which is not what this test is about.
    let replicas: Vec<Replica> = (1..=3)
        .map(|n| replicas::start_with(&env.cluster, &env.ns, n, replicas::DEFAULT, &[]))
        .collect();
    let (leader, _) = wait_holder(&env.admin, &env.ns, Duration::from_secs(30), |_| true).await;
    for i in 0..10 {
        let env_vars = if i % 3 == 0 {
            sim_env(&[("SIM_FAIL_ATTEMPTS", "1")])
        } else {
            sim_env(&[])
        };
        env.create(
            &format!("gj-{i}"),
            json!({"image": "i", "gpus": 1, "env": env_vars}),
        )
        .await;
    }
    wait_all_final(&env, 10, Duration::from_secs(90)).await;
    assert_attempts_sound(&env).await;

    let (still, _) = wait_holder(&env.admin, &env.ns, Duration::from_secs(5), |_| true).await;
    assert_eq!(
        still, leader,
        "the Lease did not change hands while everyone was healthy"
    );
    let writers: BTreeSet<String> =
        writes_on_gpujobs_and_jobs(&audit.since(start).unwrap(), &env.ns)
            .into_iter()
            .map(|e| e.user)
            .collect();
    assert_eq!(
        writers,
        BTreeSet::from([leader.clone()]),
        "only the leader writes"
    );
    drop(replicas);
}

#[tokio::test]
async fn kill_9_of_the_leader_under_load_hands_over_without_repeating_anything() {
    let env = TestEnv::new("ha-kill").await;
    let mut replicas = start_three(&env).await;
    let (leader, _) = wait_holder(&env.admin, &env.ns, Duration::from_secs(30), |_| true).await;
    const N: usize = 200;
    for i in 0..N {
        let vars = match i % 4 {
            0 => sim_env(&[("SIM_FAIL_ATTEMPTS", "1"), ("SIM_DURATION_SECONDS", "1")]),
            1 => sim_env(&[("SIM_DURATION_SECONDS", "3")]),
            _ => sim_env(&[("SIM_DURATION_SECONDS", "1.5")]),
        };
        env.create(
            &format!("load-{i}"),
            json!({"image": "i", "gpus": 1, "env": vars}),
        )
        .await;
    }
    // Mid-flight: some GpuJobs have started.
    env.wait_gpujobs("some GpuJobs to run", Duration::from_secs(60), |all| {
        all.iter().filter(|g| phase(g).is_some()).count() >= 20
    })
    .await
    .unwrap();

    let before = replicas::lease(&env.admin, &env.ns).await.unwrap();
    let i = leader_index(&replicas, &leader);
    replicas[i].signal(Signal::SIGKILL);
    replicas[i].wait_exit(Duration::from_secs(5)).await;
    let killed_at = tokio::time::Instant::now();
    let (successor, after) = wait_holder(&env.admin, &env.ns, Duration::from_secs(30), |h| {
        h != leader
    })
    .await;
    println!(
        "failover after kill -9: {:?} (lease {LEASE_DURATION:?})",
        killed_at.elapsed()
    );
    let (_, old_renew) = times(&before);
    let (new_acquire, _) = times(&after);
    // The standby waited out a full lease duration since the record last changed. The
    // last renewal may have landed after `before` was read, so allow one retry period.
    let lease_secs = LEASE_DURATION.as_secs_f64() - 0.5;
    assert!(
        new_acquire.duration_since(old_renew).as_secs_f64() >= lease_secs,
        "acquired at {new_acquire}, old renew {old_renew}"
    );
    assert_ne!(successor, leader);

    wait_all_final(&env, N, Duration::from_secs(180)).await;
    assert_attempts_sound(&env).await;
    let succeeded = env
        .gpujobs()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|g| phase(g) == Some(Phase::Succeeded))
        .count();
    assert_eq!(succeeded, N);
}

/// How soon a standby takes a released Lease is the lease logic's (unit tests in
/// `gpujob-core`, on an injected clock) and a figure (`failover_figures`); here, with
/// the real binary, the facts of the hand-over: the leader's release is written before
/// it exits, and the successor's claim is the next write, of that released record.
#[tokio::test]
async fn sigterm_releases_the_lease_before_exit_and_a_standby_takes_the_released_lease() {
    let env = TestEnv::new("ha-term").await;
    let audit = env.cluster.audit();
    let mut replicas = start_three(&env).await;
    let (leader, _) = wait_holder(&env.admin, &env.ns, Duration::from_secs(30), |_| true).await;
    let i = leader_index(&replicas, &leader);
    let start = audit.cursor().unwrap();
    let sent = tokio::time::Instant::now();
    replicas[i].signal(Signal::SIGTERM);
    let status = replicas[i].wait_exit(Duration::from_secs(30)).await;
    assert!(status.success(), "{status}");
    // By the time it exited, the Lease was released: not held by it now, and written
    // empty by it (in the audit log, which the API server writes after storing a write:
    // read until it shows the release).
    let now = replicas::lease(&env.admin, &env.ns).await.unwrap();
    assert_ne!(
        holder(&now).as_deref(),
        Some(leader.as_str()),
        "still held by the exited replica"
    );
    // In the order the API server committed them: each carries the resourceVersion it
    // was computed from, so the one received first committed first.
    let lease_writes = || {
        let mut writes: Vec<_> = replicas::writes_in(&audit, start, &env.ns)
            .into_iter()
            .filter(|e| e.resource == "leases" && e.name == replicas::LEASE)
            .collect();
        writes.sort_by(|a, b| a.received.cmp(&b.received));
        writes
            .into_iter()
            .map(|e| (e.user, e.lease_holder.unwrap_or_default()))
            .collect::<Vec<_>>()
    };
    let released = (leader.clone(), String::new());
    let logged = |what: &'static str, write: (String, String)| {
        devcluster::wait::until(
            what,
            Duration::from_secs(30),
            Duration::from_millis(50),
            move || {
                let writes = lease_writes();
                let found = writes.contains(&write);
                async move { found.then_some(writes) }
            },
        )
    };
    logged("the leader's release in the audit log", released.clone())
        .await
        .unwrap_or_else(|e| panic!("no release by the leader: {e}; {:?}", lease_writes()));
    let (successor, _) = wait_holder(&env.admin, &env.ns, Duration::from_secs(30), |h| {
        h != leader
    })
    .await;
    println!(
        "failover after SIGTERM: {:?} (lease {LEASE_DURATION:?})",
        sent.elapsed()
    );
    assert_ne!(successor, leader);
    // The writes since: the leader's renewals, its release, then the successor's claim.
    // A claim made on an expired record instead would follow a renewal; one made over
    // the leader's record before the release would come before it. The API server
    // audits a write after storing it: a reader can see the new holder first.
    let claim = (successor.clone(), successor.clone());
    let writes = logged("the successor's claim in the audit log", claim.clone())
        .await
        .unwrap();
    let release_at = writes.iter().position(|w| *w == released).unwrap();
    assert!(
        writes[..release_at].iter().all(|(user, _)| *user == leader),
        "another replica wrote the Lease before the leader released it: {writes:?}"
    );
    assert_eq!(
        writes.get(release_at + 1),
        Some(&claim),
        "the successor's claim is not the write after the release: {writes:?}"
    );
    assert!(
        replicas[i].log_text().contains("lease released"),
        "{}",
        replicas[i].log_text()
    );

    // A standby has nothing to drain: its drain, if it began one, ends on its own, not
    // at the bound.
    let standby = replicas
        .iter()
        .position(|r| r.identity() != leader && r.identity() != successor)
        .unwrap();
    replicas[standby].signal(Signal::SIGTERM);
    let status = replicas[standby].wait_exit(Duration::from_secs(30)).await;
    assert!(status.success(), "{status}");
    let log = replicas[standby].log_text();
    assert!(!log.contains("did not finish within"), "{log}");
}

#[tokio::test]
async fn a_paused_leader_resumed_after_losing_the_lease_sends_only_what_is_safe_when_late() {
    let env = TestEnv::new("ha-pause").await;
    let audit = env.cluster.audit();
    let replicas = start_three(&env).await;
    let (leader, _) = wait_holder(&env.admin, &env.ns, Duration::from_secs(30), |_| true).await;
    let spec =
        |d: &str| json!({"image": "i", "gpus": 1, "env": sim_env(&[("SIM_DURATION_SECONDS", d)])});
    // A burst, and the leader frozen in the middle of working through it: it resumes
    // with reconciles in flight and keys queued, every one of which must be fenced.
    let names: Vec<String> = (0..40).map(|i| format!("before-{i}")).collect();
    futures::future::join_all(names.iter().map(|n| env.create(n, spec("2")))).await;
    let start = audit.cursor().unwrap();
    let i = leader_index(&replicas, &leader);
    replicas[i].signal(Signal::SIGSTOP);
    for j in 0..10 {
        // Work keeps arriving while the leader is frozen (it may even hold writes).
        env.create(&format!("paused-{j}"), spec("1")).await;
    }
    let (successor, _) = wait_holder(&env.admin, &env.ns, Duration::from_secs(30), |h| {
        h != leader
    })
    .await;
    replicas[i].signal(Signal::SIGCONT);
    for j in 0..10 {
        env.create(&format!("after-{j}"), spec("1")).await;
    }
    // Give the resumed replica every chance to misbehave, and watch the Lease meanwhile.
    for _ in 0..20 {
        let l = replicas::lease(&env.admin, &env.ns).await.unwrap();
        assert_eq!(
            holder(&l).as_deref(),
            Some(successor.as_str()),
            "the resumed replica took the Lease back"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    wait_all_final(&env, 60, Duration::from_secs(90)).await;
    assert_attempts_sound(&env).await;

    let events = replicas::writes_in(&audit, start, &env.ns);
    let late = replicas::assert_late_writes_are_safe(&events, &leader, &successor, WORKERS);
    println!("the deposed leader's writes received after its successor's first: {late}");
    drop(replicas);
}

/// Not a test: measures failover time (kill -9 and SIGTERM of the leader, at short and
/// default timings; median of 5 runs) for docs/ha-and-sharding.md. Run with
/// `./scripts/test.sh --run-ignored only -E 'test(failover_figures)' --no-capture`.
#[tokio::test]
#[ignore = "measurement, not a test: run on demand"]
async fn failover_figures() {
    for (label, timing) in [
        ("short 3s/2s/0.5s", replicas::SHORT),
        ("default 15s/10s/2s", replicas::DEFAULT),
    ] {
        for signal in [Signal::SIGKILL, Signal::SIGTERM] {
            let mut took = Vec::new();
            for _ in 0..5 {
                let env = TestEnv::new("failover").await;
                let rs: Vec<Replica> = (1..=3)
                    .map(|n| replicas::start_with(&env.cluster, &env.ns, n, timing, &[]))
                    .collect();
                let (leader, _) =
                    wait_holder(&env.admin, &env.ns, Duration::from_secs(60), |_| true).await;
                // Let the standbys observe the record first, as in steady state.
                tokio::time::sleep(Duration::from_secs(3)).await;
                let i = leader_index(&rs, &leader);
                let sent = tokio::time::Instant::now();
                rs[i].signal(signal);
                wait_holder(&env.admin, &env.ns, Duration::from_secs(60), |h| {
                    h != leader
                })
                .await;
                took.push(sent.elapsed());
                drop(rs);
            }
            took.sort();
            println!(
                "FIGURE failover {label} {signal:?}: median {:?} (runs {took:?})",
                took[took.len() / 2]
            );
        }
    }
}
