//! Sharding with the real binary, as separate processes each under its own API user, on
//! a control plane of each test's own (the replicas work on every namespace): shards
//! split evenly, only a shard's holder writes its GpuJobs, a killed replica's shards
//! move to the survivors and back with no more moves than balance needs, a scale-out
//! moves only the surplus, and a frozen holder neither writes for its lost shards nor
//! takes them back; a replica with another count or map waits while the established one
//! works, and a rolling update from `--shards 1` to many never gives one namespace two
//! writers (rollouts between sharded counts: `rollout.rs`). Short timings: 3 s
//! lease, 2 s renew deadline, 0.5 s retry period.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use crate::support;

use std::time::Duration;

use devcluster::audit::AuditEvent;
use gpujob_operator::api::{GpuJob, Phase};
use gpujob_operator::controller::job::attempt_of;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ListParams, PostParams};
use nix::sys::signal::Signal;
use serde_json::json;
use support::replicas::{self, LEASE_DURATION, Replica};
use support::shards::{self, assert_writes_within_tenures, moves, wait_balanced};
use support::{TestEnv, phase, sim_env};

use support::replicas::WORKERS;

fn replica(env: &TestEnv, n: u8, shards: u32) -> Replica {
    replicas::start_sharded(&env.cluster, &env.ns, n, shards)
}

/// `per_namespace` GpuJobs in each namespace, some failing once.
async fn create_gpujobs(
    env: &TestEnv,
    namespaces: &[(String, u32)],
    per_namespace: usize,
    tag: &str,
) {
    for (ns, _) in namespaces {
        let api: Api<GpuJob> = Api::namespaced(env.admin.clone(), ns);
        for i in 0..per_namespace {
            let vars = if i % 3 == 0 {
                sim_env(&[("SIM_FAIL_ATTEMPTS", "1"), ("SIM_DURATION_SECONDS", "1")])
            } else {
                sim_env(&[("SIM_DURATION_SECONDS", "1.5")])
            };
            let gj: GpuJob = serde_json::from_value(json!({
                "apiVersion": "gpujob.dev/v1", "kind": "GpuJob",
                "metadata": {"name": format!("{tag}-{i}")},
                "spec": {"image": "i", "gpus": 1, "env": vars},
            }))
            .unwrap();
            api.create(&PostParams::default(), &gj).await.unwrap();
        }
    }
}

/// Waits until every GpuJob in `namespaces` is final, then checks that each ran its
/// attempts 1..=n in order, one at a time (each started after the one before ended).
async fn wait_all_final_and_sound(env: &TestEnv, namespaces: &[(String, u32)], within: Duration) {
    let deadline = tokio::time::Instant::now() + within;
    for (ns, _) in namespaces {
        let api: Api<GpuJob> = Api::namespaced(env.admin.clone(), ns);
        loop {
            let all = api.list(&ListParams::default()).await.unwrap().items;
            if all.iter().all(|g| phase(g).is_some_and(Phase::is_final)) {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "GpuJobs of {ns} not final: {:?}",
                all.iter()
                    .map(|g| (g.metadata.name.clone(), phase(g)))
                    .collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let jobs: Api<k8s_openapi::api::batch::v1::Job> = Api::namespaced(env.admin.clone(), ns);
        let all_jobs = jobs.list(&ListParams::default()).await.unwrap().items;
        for gj in api.list(&ListParams::default()).await.unwrap().items {
            let uid = gj.metadata.uid.clone().unwrap();
            let mut mine: Vec<_> = all_jobs
                .iter()
                .filter(|j| {
                    j.metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get("gpujob.dev/uid"))
                        == Some(&uid)
                })
                .cloned()
                .collect();
            mine.sort_by_key(|j| attempt_of(j).unwrap_or(0));
            let n = gj.status.clone().unwrap().attempts;
            let name = format!("{ns}/{}", gj.metadata.name.clone().unwrap());
            env.assert_attempts_sequential(&name, &mine, n).await;
            assert_eq!(
                phase(&gj),
                Some(Phase::Succeeded),
                "{ns}/{:?}",
                gj.metadata.name
            );
        }
    }
}

fn audit_since(env: &TestEnv, start: devcluster::audit::Cursor) -> Vec<AuditEvent> {
    env.cluster.audit().since(start).unwrap()
}

#[tokio::test]
async fn three_replicas_hold_two_of_six_shards_each_and_only_a_holder_writes() {
    let env = TestEnv::private("shards-three").await;
    let start = env.cluster.audit().cursor().unwrap();
    let namespaces = shards::namespaces(&env, 6, 1).await;
    let rs: Vec<Replica> = (1..=3).map(|n| replica(&env, n, 6)).collect();
    let ids = ["replica-1", "replica-2", "replica-3"];
    wait_balanced(&env, 6, &ids, 2, Duration::from_secs(60)).await;
    create_gpujobs(&env, &namespaces, 4, "gj").await;
    wait_all_final_and_sound(&env, &namespaces, Duration::from_secs(120)).await;

    let events = audit_since(&env, start);
    let late = assert_writes_within_tenures(&events, 6, WORKERS);
    println!("writes received outside their writer's tenure: {late}");
    // Every replica worked (each holds two shards, each shard has GpuJobs).
    let writers: std::collections::BTreeSet<String> = shards::writers_by_namespace(&events)
        .into_values()
        .flatten()
        .filter(|u| u.starts_with("replica-"))
        .collect();
    assert_eq!(writers.len(), 3, "{writers:?}");
    drop(rs);
}

#[tokio::test]
async fn a_killed_replicas_shards_go_to_the_survivors_and_come_back_with_two_moves() {
    let env = TestEnv::private("shards-kill").await;
    let start = env.cluster.audit().cursor().unwrap();
    let namespaces = shards::namespaces(&env, 6, 1).await;
    let mut rs: Vec<Replica> = (1..=3).map(|n| replica(&env, n, 6)).collect();
    let three = ["replica-1", "replica-2", "replica-3"];
    let before = wait_balanced(&env, 6, &three, 2, Duration::from_secs(60)).await;
    create_gpujobs(&env, &namespaces, 6, "a").await;

    rs[2].signal(Signal::SIGKILL);
    rs[2].wait_exit(Duration::from_secs(5)).await;
    let killed_at = tokio::time::Instant::now();
    let after = wait_balanced(&env, 6, &three[..2], 3, Duration::from_secs(60)).await;
    println!(
        "shards of the killed replica taken over after {:?} (lease {LEASE_DURATION:?})",
        killed_at.elapsed()
    );
    // The survivors kept their own and split the dead replica's two.
    for (s, h) in before.iter().enumerate() {
        if h.as_deref() != Some("replica-3") {
            assert_eq!(&after[s], h, "shard {s} moved though its holder lived");
        }
    }
    wait_all_final_and_sound(&env, &namespaces, Duration::from_secs(180)).await;

    let back_at = jiff::Timestamp::now();
    rs[2] = replica(&env, 3, 6);
    wait_balanced(&env, 6, &three, 2, Duration::from_secs(60)).await;
    // Let anything still in motion settle before counting.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let events = audit_since(&env, start);
    let moved = moves(&events, 6, back_at);
    assert_eq!(
        moved.len(),
        2,
        "the returning replica takes one shard from each survivor, nothing else moves: {moved:?} {:#?}",
        shards::tenures(&events, 6)
    );
    let all = audit_since(&env, start);
    assert_writes_within_tenures(&all, 6, WORKERS);
    shards::assert_no_shard_taken_from_a_live_holder(&all, 6, LEASE_DURATION);
    drop(rs);
}

#[tokio::test]
async fn a_fourth_replica_takes_two_of_eight_shards_and_nothing_else_moves() {
    let env = TestEnv::private("shards-scale").await;
    let start = env.cluster.audit().cursor().unwrap();
    let namespaces = shards::namespaces(&env, 8, 1).await;
    let mut rs: Vec<Replica> = (1..=3).map(|n| replica(&env, n, 8)).collect();
    let env_ref = &env;
    let settled = devcluster::wait::until(
        "8 shards over 3 replicas: 3, 3, 2",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async move {
            let h = shards::holders(&env_ref.admin, &env_ref.ns, 8).await;
            let mut c: Vec<usize> = shards::counts(&h).into_values().collect();
            c.sort();
            (h.iter().all(Option::is_some) && c == vec![2, 3, 3]).then_some(h)
        },
    )
    .await
    .unwrap();
    println!("8 shards over 3 replicas: {settled:?}");
    create_gpujobs(&env, &namespaces, 4, "s").await;

    let scaled_at = jiff::Timestamp::now();
    rs.push(replica(&env, 4, 8));
    let four = ["replica-1", "replica-2", "replica-3", "replica-4"];
    wait_balanced(&env, 8, &four, 2, Duration::from_secs(60)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let events = audit_since(&env, start);
    let moved = moves(&events, 8, scaled_at);
    assert_eq!(
        moved.len(),
        2,
        "only the two surplus shards move: {moved:?} {:#?}",
        shards::tenures(&events, 8)
    );

    wait_all_final_and_sound(&env, &namespaces, Duration::from_secs(120)).await;
    let all = audit_since(&env, start);
    let late = assert_writes_within_tenures(&all, 8, WORKERS);
    println!("writes received outside their writer's tenure: {late}");
    shards::assert_no_shard_taken_from_a_live_holder(&all, 8, LEASE_DURATION);
    drop(rs);
}

#[tokio::test]
async fn a_frozen_holder_writes_nothing_for_its_lost_shards_and_does_not_take_them_back() {
    let env = TestEnv::private("shards-stop").await;
    let start = env.cluster.audit().cursor().unwrap();
    let namespaces = shards::namespaces(&env, 6, 1).await;
    let rs: Vec<Replica> = (1..=3).map(|n| replica(&env, n, 6)).collect();
    let three = ["replica-1", "replica-2", "replica-3"];
    let before = wait_balanced(&env, 6, &three, 2, Duration::from_secs(60)).await;
    let frozen_shards: Vec<usize> = before
        .iter()
        .enumerate()
        .filter(|(_, h)| h.as_deref() == Some("replica-1"))
        .map(|(s, _)| s)
        .collect();
    // Work in flight, then replica-1 frozen past its lease.
    create_gpujobs(&env, &namespaces, 6, "p").await;
    rs[0].signal(Signal::SIGSTOP);
    wait_balanced(&env, 6, &three[1..], 3, Duration::from_secs(60)).await;
    rs[0].signal(Signal::SIGCONT);
    // Resumed: its heartbeat makes it live again, so the survivors hand it shards back.
    wait_balanced(&env, 6, &three, 2, Duration::from_secs(60)).await;
    wait_all_final_and_sound(&env, &namespaces, Duration::from_secs(180)).await;
    let events = audit_since(&env, start);
    let late = assert_writes_within_tenures(&events, 6, WORKERS);
    println!(
        "writes received outside their writer's tenure: {late}; replica-1 held {frozen_shards:?} before"
    );
    // It may get shards again, but only handed over (released by a survivor that saw
    // it live again) or expired, never taken from a holder whose Lease was valid.
    shards::assert_no_shard_taken_from_a_live_holder(&events, 6, LEASE_DURATION);
    drop(rs);
}

/// State-change Events still queued when their shards move are written all the same,
/// once each: replica-1 records 8 attempts started, its Events go out one every 5 s, and
/// it is frozen past its Leases while most still wait; replica-2 takes every shard and
/// sends none for changes already recorded; replica-1, resumed, writes the rest.
#[tokio::test]
async fn state_change_events_queued_when_their_shards_move_are_still_written() {
    use k8s_openapi::api::events::v1::Event;
    let env = TestEnv::private("shards-events").await;
    let namespaces = shards::namespaces(&env, 4, 2).await;
    let slow = ["--shards", "4", "--event-qps", "0.2", "--event-burst", "1"];
    let one = replicas::start_everywhere(&env.cluster, &env.ns, 1, &slow, None);
    wait_balanced(&env, 4, &["replica-1"], 4, Duration::from_secs(60)).await;
    let vars = sim_env(&[("SIM_DURATION_SECONDS", "600")]);
    for (ns, _) in &namespaces {
        let api: Api<GpuJob> = Api::namespaced(env.admin.clone(), ns);
        let gj: GpuJob = serde_json::from_value(json!({
            "apiVersion": "gpujob.dev/v1", "kind": "GpuJob",
            "metadata": {"name": "ev"},
            "spec": {"image": "i", "gpus": 1, "env": vars},
        }))
        .unwrap();
        api.create(&PostParams::default(), &gj).await.unwrap();
    }
    for (ns, _) in &namespaces {
        let api: Api<GpuJob> = Api::namespaced(env.admin.clone(), ns);
        devcluster::wait::until(
            &format!("{ns}/ev: attempt 1 recorded"),
            Duration::from_secs(60),
            Duration::from_millis(100),
            || {
                let api = api.clone();
                async move {
                    let gj = api.get("ev").await.ok()?;
                    (gj.status?.attempts == 1).then_some(())
                }
            },
        )
        .await
        .unwrap();
    }
    one.signal(Signal::SIGSTOP);
    let events: Api<Event> = Api::all(env.admin.clone());
    let started = || async {
        let mut by_ns: std::collections::BTreeMap<String, Vec<String>> = Default::default();
        for e in events.list(&ListParams::default()).await.unwrap().items {
            if e.reason.as_deref() == Some("AttemptStarted") {
                let ns = e.metadata.namespace.clone().unwrap_or_default();
                let by = e.reporting_instance.clone().unwrap_or_default();
                by_ns.entry(ns).or_default().push(by);
            }
        }
        by_ns
    };
    let two = replica(&env, 2, 4);
    wait_balanced(&env, 4, &["replica-2"], 4, Duration::from_secs(60)).await;
    let written_before = started().await.values().map(Vec::len).sum::<usize>();
    assert!(
        written_before < namespaces.len(),
        "some Events must still wait when the shards move: {written_before} written"
    );
    one.signal(Signal::SIGCONT);
    let all = devcluster::wait::until(
        "an AttemptStarted Event on every GpuJob",
        Duration::from_secs(90),
        Duration::from_millis(250),
        || async {
            let all = started().await;
            (all.len() == namespaces.len()).then_some(all)
        },
    )
    .await
    .unwrap();
    // Nothing more comes: another round of the writer's budget, then count again.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let all_after = started().await;
    assert_eq!(all, all_after);
    for (ns, by) in &all_after {
        assert_eq!(
            by,
            &["replica-1"],
            "{ns}: one AttemptStarted Event, by replica-1"
        );
    }
    println!("AttemptStarted Events written before the shards moved: {written_before} of 8");
    drop((one, two));
}

#[tokio::test]
async fn a_replica_with_another_shard_count_waits_while_the_established_one_works() {
    let env = TestEnv::private("shards-mixed").await;
    let namespaces = shards::namespaces(&env, 6, 1).await;
    let three = replica(&env, 1, 3);
    wait_balanced(&env, 3, &["replica-1"], 3, Duration::from_secs(30)).await;
    // A replica with another count joins, as in a rollout that changes --shards: the
    // established count keeps its shards and works; the new one takes nothing.
    let mut six = replica(&env, 2, 6);
    wait_log(&six, &["its split holds the shards"]).await;
    let start = env.cluster.audit().cursor().unwrap();
    create_gpujobs(&env, &namespaces, 2, "mixed").await;
    wait_all_final_and_sound(&env, &namespaces, Duration::from_secs(120)).await;
    let events = audit_since(&env, start);
    for (ns, writers) in shards::writers_by_namespace(&events) {
        let replicas: Vec<&String> = writers
            .iter()
            .filter(|u| u.starts_with("replica-"))
            .collect();
        assert_eq!(replicas, vec!["replica-1"], "namespace {ns}");
    }
    let held = shards::holders(&env.admin, &env.ns, 3).await;
    assert!(
        held.iter().all(|h| h.as_deref() == Some("replica-1")),
        "{held:?}"
    );
    // The 3-shard replica goes (its shard Leases run out): the other takes all six.
    let mut three = three;
    three.signal(Signal::SIGKILL);
    three.wait_exit(Duration::from_secs(10)).await;
    wait_balanced(&env, 6, &["replica-2"], 6, Duration::from_secs(30)).await;
    six.signal(Signal::SIGTERM);
    six.wait_exit(Duration::from_secs(30)).await;
}

#[tokio::test]
async fn a_live_shard_holder_with_another_shard_map_holds_a_new_replica_back_until_it_goes() {
    // A release with another shard map would, with the same --shards, map some
    // namespaces to other Leases. Its shard Leases state its count and its map; while one
    // is held and renewed, a replica of this release takes nothing.
    let env = TestEnv::private("shards-old-map").await;
    let leases: Api<Lease> = Api::namespaced(env.admin.clone(), &env.ns);
    let name = shards::lease_of(2);
    let mut old = Lease::default();
    old.metadata.name = Some(name.clone());
    old.metadata.labels = Some(
        [
            (gpujob_operator::lease::LABEL_GROUP, replicas::LEASE),
            (gpujob_operator::lease::LABEL_ROLE, "shard"),
            (gpujob_operator::lease::LABEL_SHARDS, "3"),
            (gpujob_operator::lease::LABEL_SHARD_MAP, "another-map"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect(),
    );
    old.spec = Some(LeaseSpec {
        holder_identity: Some("another-release".to_owned()),
        lease_duration_seconds: Some(3),
        renew_time: Some(MicroTime(jiff::Timestamp::now())),
        ..LeaseSpec::default()
    });
    leases.create(&PostParams::default(), &old).await.unwrap();
    // It renews, as a live replica does (every change restarts its expiry).
    let renewing = {
        let leases = leases.clone();
        let name = name.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(500)).await;
                let now = MicroTime(jiff::Timestamp::now());
                let patch = json!({"spec": {"renewTime": now}});
                let _ = leases
                    .patch(&name, &Default::default(), &kube::api::Patch::Merge(&patch))
                    .await;
            }
        })
    };
    let current = replica(&env, 1, 3);
    wait_log(&current, &["its split holds the shards"]).await;
    let held = shards::holders(&env.admin, &env.ns, 3).await;
    assert_eq!(
        held,
        [None, None, Some("another-release".to_owned())],
        "the new replica took shards beside another map's holder"
    );
    let log = current.log_text();
    assert!(log.contains("another-map"), "{log}");
    // That replica is gone (its shard Lease runs out): the shards are taken.
    renewing.abort();
    wait_balanced(&env, 3, &["replica-1"], 3, Duration::from_secs(30)).await;
}

#[tokio::test]
async fn replicas_restarted_under_the_same_names_with_a_new_count_take_the_shards() {
    // Stable identities (a StatefulSet, or `--identity`): the member Leases outlive the
    // processes and must come to say the new count, or each replica keeps seeing the
    // others' (and its own) old count and nobody takes anything.
    let env = TestEnv::private("shards-renamed").await;
    let mut old = vec![replica(&env, 1, 3), replica(&env, 2, 3)];
    // 3 shards over 2 replicas: 2 and 1.
    devcluster::wait::until(
        "all 3 shards held",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || async {
            let h = shards::holders(&env.admin, &env.ns, 3).await;
            h.iter().all(Option::is_some).then_some(())
        },
    )
    .await
    .unwrap();
    let mut new = Vec::new();
    for (n, mut r) in (1..).zip(old.drain(..)) {
        r.signal(Signal::SIGTERM);
        r.wait_exit(Duration::from_secs(30)).await;
        new.push(replica(&env, n, 4));
    }
    wait_balanced(
        &env,
        4,
        &["replica-1", "replica-2"],
        2,
        Duration::from_secs(60),
    )
    .await;
    let leases: Api<Lease> = Api::namespaced(env.admin.clone(), &env.ns);
    for l in leases.list(&Default::default()).await.unwrap().items {
        let labels = l.metadata.labels.clone().unwrap_or_default();
        let name = l.metadata.name.clone().unwrap_or_default();
        if name.contains("-member-")
            || ["0", "1", "2", "3"]
                .iter()
                .any(|i| name.ends_with(&format!("-shard-{i}")))
        {
            assert_eq!(
                labels
                    .get(gpujob_operator::lease::LABEL_SHARDS)
                    .map(String::as_str),
                Some("4"),
                "{name}: {labels:?}"
            );
            assert_eq!(
                labels
                    .get(gpujob_operator::lease::LABEL_SHARD_MAP)
                    .map(String::as_str),
                Some(gpujob_operator::lease::KEPT_MAP),
                "{name}: {labels:?}"
            );
        }
    }
    drop(new);
}

/// Waits until `replica`'s log contains one of `any`.
async fn wait_log(replica: &Replica, any: &[&str]) {
    devcluster::wait::until(
        &format!("{} to log one of {any:?}", replica.identity()),
        Duration::from_secs(30),
        Duration::from_millis(100),
        || async {
            let log = replica.log_text();
            any.iter().any(|s| log.contains(s)).then_some(())
        },
    )
    .await
    .unwrap();
}

/// A rolling update from `--shards 1` to `--shards 6`, as a Deployment's RollingUpdate
/// runs it: an old leader and an old standby (`--shards 1`) beside a new replica
/// (`--shards 6`); the old leader stops gracefully and releases the single Lease. The
/// new replica holds nothing while the old leader leads, then takes all six shards; the
/// old standby never leads beside it, and no namespace is written by two replicas.
/// `standby_first`: the old standby starts (and looks at the Lease) before the new
/// replica exists, so it meets the sharded replica only after acquiring the released
/// Lease; otherwise it sees the sharded replica before it ever campaigns.
async fn rolling_update_from_one_shard_to_six(tag: &str, standby_first: bool) {
    let env = TestEnv::private(tag).await;
    let namespaces = shards::namespaces(&env, 6, 1).await;
    let mut old_leader = replica(&env, 1, 1);
    replicas::wait_holder(&env.admin, &env.ns, Duration::from_secs(30), |h| {
        h == "replica-1"
    })
    .await;
    // The standby has looked at the single Lease (it names the old leader, or the
    // sharded replica it defers to).
    let standby_looked = ["this replica stands by", "more than one shard is live"];
    let (old_standby, new) = if standby_first {
        let standby = replica(&env, 2, 1);
        wait_log(&standby, &standby_looked).await;
        let new = replica(&env, 3, 6);
        (standby, new)
    } else {
        let new = replica(&env, 3, 6);
        let standby = replica(&env, 2, 1);
        wait_log(&standby, &standby_looked).await;
        (standby, new)
    };
    wait_log(
        &new,
        &["a replica running with --shards 1 holds the single Lease"],
    )
    .await;
    let held = shards::holders(&env.admin, &env.ns, 6).await;
    assert!(
        held.iter().all(Option::is_none),
        "the new replica took shards while the old leader led: {held:?}"
    );

    // The rolling update stops the old leader: it drains and releases the single Lease.
    let handover = env.cluster.audit().cursor().unwrap();
    old_leader.signal(Signal::SIGTERM);
    old_leader.wait_exit(Duration::from_secs(30)).await;
    wait_balanced(&env, 6, &["replica-3"], 6, Duration::from_secs(30)).await;
    create_gpujobs(&env, &namespaces, 3, "after").await;
    wait_all_final_and_sound(&env, &namespaces, Duration::from_secs(120)).await;

    let events = audit_since(&env, handover);
    for (ns, writers) in shards::writers_by_namespace(&events) {
        let replicas: Vec<&String> = writers
            .iter()
            .filter(|u| u.starts_with("replica-"))
            .collect();
        assert_eq!(
            replicas,
            vec!["replica-3"],
            "namespace {ns} written by {replicas:?} after the old leader stopped"
        );
    }
    let single = replicas::lease(&env.admin, &env.ns).await.unwrap();
    assert_ne!(
        replicas::holder(&single).as_deref(),
        Some("replica-2"),
        "the old standby holds the single Lease beside the sharded replica"
    );
    let log = old_standby.log_text();
    assert!(
        log.contains("a replica running with more than one shard is live"),
        "the old standby does not say why it does not lead: {log}"
    );
    drop((old_standby, new));
}

#[tokio::test]
async fn one_to_six_shards_standby_looks_first_never_two_writers() {
    rolling_update_from_one_shard_to_six("shards-roll-a", true).await;
}

#[tokio::test]
async fn one_to_six_shards_new_replica_looks_first_never_two_writers() {
    rolling_update_from_one_shard_to_six("shards-roll-b", false).await;
}

/// A `--shards 1` leader this replica cannot talk to (an older release, which does not
/// look for sharded replicas, took the released single Lease): the sharded replica gives
/// up every shard it holds while that Lease is renewed, and takes them back once it
/// expires. The test writes the old leader's Lease itself.
#[tokio::test]
async fn a_sharded_replica_gives_up_its_shards_while_a_one_shard_leader_renews() {
    use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    let env = TestEnv::private("shards-legacy").await;
    let new = replica(&env, 3, 6);
    wait_balanced(&env, 6, &["replica-3"], 6, Duration::from_secs(30)).await;

    let leases: Api<Lease> = Api::namespaced(env.admin.clone(), &env.ns);
    let record = |rv: Option<String>| {
        let mut l = Lease::default();
        l.metadata.name = Some(replicas::LEASE.to_owned());
        l.metadata.resource_version = rv;
        l.spec = Some(LeaseSpec {
            holder_identity: Some("another-release".to_owned()),
            lease_duration_seconds: Some(3),
            renew_time: Some(MicroTime(jiff::Timestamp::now())),
            ..LeaseSpec::default()
        });
        l
    };
    leases
        .create(&PostParams::default(), &record(None))
        .await
        .unwrap();
    // The old leader renews every 0.5 s until told to stop.
    let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
    let renewer = {
        let leases = leases.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                    _ = &mut stopped => return,
                }
                let rv = leases
                    .get(replicas::LEASE)
                    .await
                    .unwrap()
                    .metadata
                    .resource_version;
                leases
                    .replace(replicas::LEASE, &PostParams::default(), &record(rv))
                    .await
                    .unwrap();
            }
        })
    };
    devcluster::wait::until(
        "every shard given up",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || async {
            let h = shards::holders(&env.admin, &env.ns, 6).await;
            h.iter().all(Option::is_none).then_some(())
        },
    )
    .await
    .unwrap();
    let log = new.log_text();
    assert!(
        log.contains("a replica running with --shards 1 holds the single Lease"),
        "{log}"
    );
    // The old leader goes silent: after its lease duration the shards come back.
    stop.send(()).unwrap();
    renewer.await.unwrap();
    wait_balanced(&env, 6, &["replica-3"], 6, Duration::from_secs(30)).await;
    drop(new);
}

#[tokio::test]
async fn a_stopped_replica_deletes_its_member_lease_and_a_killed_ones_is_deleted_after_ten_lease_durations()
 {
    let env = TestEnv::private("shards-members").await;
    let start = env.cluster.audit().cursor().unwrap();
    let mut rs: Vec<Replica> = (1..=3).map(|n| replica(&env, n, 3)).collect();
    let three = ["replica-1", "replica-2", "replica-3"];
    wait_balanced(&env, 3, &three, 1, Duration::from_secs(60)).await;
    let leases: Api<Lease> = Api::namespaced(env.admin.clone(), &env.ns);
    let member = |n: u8| format!("{}-member-replica-{n}", replicas::LEASE);
    for n in 1..=3 {
        assert!(leases.get_opt(&member(n)).await.unwrap().is_some());
    }

    // Stopped gracefully: its member Lease is gone by the time it has exited.
    rs[1].signal(Signal::SIGTERM);
    rs[1].wait_exit(Duration::from_secs(30)).await;
    assert_eq!(
        leases.get_opt(&member(2)).await.unwrap().map(|l| l.spec),
        None,
        "replica-2 stopped: its member Lease is deleted"
    );

    // Killed: its member Lease stays until it has been expired for ten lease durations
    // on the survivor's clock (expired a lease duration after its last renewal), then
    // the survivor deletes it.
    rs[2].signal(Signal::SIGKILL);
    rs[2].wait_exit(Duration::from_secs(5)).await;
    let killed_at = tokio::time::Instant::now();
    let threshold = LEASE_DURATION * 10;
    tokio::time::sleep(threshold - Duration::from_secs(2)).await;
    let left = leases.get_opt(&member(3)).await.unwrap();
    assert_eq!(
        left.as_ref()
            .and_then(|l| l.spec.as_ref()?.holder_identity.clone()),
        Some("replica-3".to_owned()),
        "the killed replica's member Lease stays for ten lease durations"
    );
    devcluster::wait::until(
        "the killed replica's member Lease deleted",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async {
            leases
                .get_opt(&member(3))
                .await
                .unwrap()
                .is_none()
                .then_some(())
        },
    )
    .await
    .unwrap();
    let after = killed_at.elapsed();
    println!("member Lease of the killed replica deleted {after:?} after the kill");
    assert!(
        after >= threshold,
        "deleted {after:?} after the kill: before ten lease durations"
    );
    // The survivor keeps its own, and holds every shard.
    assert!(leases.get_opt(&member(1)).await.unwrap().is_some());
    wait_balanced(&env, 3, &three[..1], 3, Duration::from_secs(30)).await;
    // Who deleted what: each replica its own at its stop, the survivor the killed one's.
    let deletes: Vec<(String, String)> = audit_since(&env, start)
        .into_iter()
        .filter(|e| e.resource == "leases" && e.verb == "delete" && e.code < 300)
        .map(|e| (e.user, e.name))
        .collect();
    assert_eq!(
        deletes,
        [
            ("replica-2".to_owned(), member(2)),
            ("replica-1".to_owned(), member(3)),
        ],
        "{deletes:?}"
    );
    drop(rs);
}
