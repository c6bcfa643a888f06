//! Sharded watches with the real binary: where kube-apiserver selects objects by shard
//! (feature gate `ShardedListAndWatch`, on in devcluster), each replica lists, watches and
//! caches only the GpuJobs and Jobs of the shards it holds and of those it would take if
//! another replica went (kept warm); after a kill the survivors work the dead replica's
//! shards, and shards given back leave their caches. Where
//! the server does not (the gate off), replicas watch everything, as before, and still
//! split the work. Caches are read from each replica's metrics; that the server, not the
//! replica, did the selecting is read from `gpujob_watch_foreign_objects_total` (objects
//! received from outside the shards asked for).

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use devcluster::faultproxy::{Fault, FaultProxy, Faults, Rule};
use devcluster::metrics::Metrics;
use devcluster::{Identity, wait};
use gpujob_operator::api::GpuJob;
use gpujob_operator::lease::balance::{self, Holder, View};
use http::Method;
use kube::api::{Api, PostParams};
use nix::sys::signal::Signal;
use serde_json::json;
use support::prometheus::{free_address, get_text};
use support::replicas::{self, Replica};
use support::shards::{self, wait_balanced};
use support::{TestEnv, sim_env};

const SHARDS: u32 = 6;

struct Running {
    replica: Replica,
    metrics: String,
}

fn start(env: &TestEnv, n: u8) -> Running {
    let address = free_address();
    let shards = SHARDS.to_string();
    let replica = replicas::start_everywhere(
        &env.cluster,
        &env.ns,
        n,
        &["--shards", &shards, "--listen-address", &address],
        None,
    );
    Running {
        replica,
        metrics: format!("http://{address}/metrics"),
    }
}

async fn scrape(r: &Running) -> Option<Metrics> {
    let text = get_text(&r.metrics).await.ok()?;
    Metrics::parse(&text).ok()
}

async fn create(env: &TestEnv, namespaces: &[(String, u32)], per_namespace: usize, tag: &str) {
    for (ns, _) in namespaces {
        let api: Api<GpuJob> = Api::namespaced(env.admin.clone(), ns);
        for i in 0..per_namespace {
            let gj: GpuJob = serde_json::from_value(json!({
                "apiVersion": "gpujob.dev/v1", "kind": "GpuJob",
                "metadata": {"name": format!("{tag}-{i}")},
                "spec": {"image": "i", "gpus": 1, "env": sim_env(&[("SIM_DURATION_SECONDS", "1")])},
            }))
            .unwrap();
            api.create(&PostParams::default(), &gj).await.unwrap();
        }
    }
}

/// The shards `who` holds, and those it holds and keeps warm (those it would take if one
/// of `live` were gone), as the Leases show them now.
async fn shards_of(env: &TestEnv, who: &str, live: &[&str]) -> (BTreeSet<u32>, BTreeSet<u32>) {
    let holders = shards::holders(&env.admin, &env.ns, SHARDS).await;
    let members: BTreeSet<String> = live.iter().map(|m| (*m).to_owned()).collect();
    let view: Vec<Holder> = holders
        .iter()
        .map(|h| match h {
            Some(h) => Holder::Held(h.clone()),
            None => Holder::Free(Duration::ZERO),
        })
        .collect();
    let warm = balance::successor_of(&View {
        me: who,
        members: &members,
        holders: &view,
        lease_duration: replicas::LEASE_DURATION,
    });
    let held: BTreeSet<u32> = (0..SHARDS)
        .filter(|s| holders[*s as usize].as_deref() == Some(who))
        .collect();
    let cached = held.union(&warm).copied().collect();
    (held, cached)
}

/// GpuJobs (and as many Jobs: one attempt each) in the namespaces of `shards`.
fn count_in(
    shards: &BTreeSet<u32>,
    namespaces: &[(String, u32)],
    counts: &BTreeMap<String, usize>,
) -> usize {
    namespaces
        .iter()
        .filter(|(_, s)| shards.contains(s))
        .map(|(ns, _)| counts[ns])
        .sum()
}

/// GpuJobs in the namespaces of the shards `who` holds, and of those it holds and keeps
/// warm ([`shards_of`]).
async fn share_of(
    env: &TestEnv,
    who: &str,
    live: &[&str],
    namespaces: &[(String, u32)],
    counts: &BTreeMap<String, usize>,
) -> (usize, usize) {
    let (held, cached) = shards_of(env, who, live).await;
    (
        count_in(&held, namespaces, counts),
        count_in(&cached, namespaces, counts),
    )
}

/// Waits until replica `r` caches exactly `gpujobs` GpuJobs and as many Jobs.
async fn wait_cached(r: &Running, who: &str, gpujobs: usize) -> Metrics {
    wait::until(
        &format!("{who} caches {gpujobs} GpuJobs and Jobs"),
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async move {
            let m = scrape(r).await?;
            let cached = |resource| m.sum("gpujob_cached_objects", &[("resource", resource)]);
            (cached("gpujobs") == gpujobs as f64 && cached("jobs") == gpujobs as f64).then_some(m)
        },
    )
    .await
    .unwrap()
}

/// `gpujob_shard_first_look_seconds_count` of each of `shards`, summed over `rs`.
async fn first_looks(rs: &[Running], shards: &[u32]) -> BTreeMap<u32, f64> {
    per_shard(rs, shards, "gpujob_shard_first_look_seconds_count").await
}

/// `metric` of each of `shards`, summed over `rs`.
async fn per_shard(rs: &[Running], shards: &[u32], metric: &str) -> BTreeMap<u32, f64> {
    let mut counts = BTreeMap::new();
    for r in rs {
        let m = scrape(r).await.unwrap();
        for s in shards {
            let shard = s.to_string();
            *counts.entry(*s).or_insert(0.0) += m.sum(metric, &[("shard", shard.as_str())]);
        }
    }
    counts
}

fn received_gpujobs(m: &Metrics) -> f64 {
    m.sum("gpujob_watch_objects_total", &[("resource", "gpujobs")])
}

fn foreign(m: &Metrics) -> f64 {
    m.sum("gpujob_watch_foreign_objects_total", &[])
}

#[tokio::test]
async fn each_replica_caches_its_shards_and_those_it_would_take_and_a_takeover_lists_the_rest() {
    let env = TestEnv::private("sharded-watch").await;
    let namespaces = shards::namespaces(&env, SHARDS, 1).await;
    let mut rs: Vec<Running> = (1..=3).map(|n| start(&env, n)).collect();
    let ids = ["replica-1", "replica-2", "replica-3"];
    wait_balanced(&env, SHARDS, &ids, 2, Duration::from_secs(60)).await;
    create(&env, &namespaces, 3, "a").await;
    let counts = shards::wait_succeeded(&env, namespaces.iter().map(|(ns, _)| ns.as_str())).await;
    let total: usize = counts.values().sum();

    // Three replicas over six shards: each holds two and keeps warm the two it would take
    // if one of the others went (one of each): four of six.
    for (r, who) in rs.iter().zip(ids) {
        let (held, cached) = share_of(&env, who, &ids, &namespaces, &counts).await;
        assert_eq!(
            held,
            total / 3,
            "{who}: two shards of six, one namespace each"
        );
        assert_eq!(cached, total * 2 / 3, "{who}: and two kept warm");
        let m = wait_cached(r, who, cached).await;
        assert_eq!(m.sum("gpujob_sharded_watch", &[]), 1.0, "{who}");
        assert_eq!(
            foreign(&m),
            0.0,
            "{who} received objects of shards it did not ask for"
        );
    }

    // replica-3 dies: the others take its shards, each one it kept warm, and work them.
    // Two replicas left: each keeps the other's shards warm, so each caches everything.
    let holders = shards::holders(&env.admin, &env.ns, SHARDS).await;
    let its: Vec<u32> = (0..SHARDS)
        .filter(|s| holders[*s as usize].as_deref() == Some("replica-3"))
        .collect();
    let looks_before = first_looks(&rs[..2], &its).await;
    let plans_before = per_shard(&rs[..2], &its, "gpujob_shard_first_plan_seconds_count").await;
    let from_caches = |m: &Metrics| m.sum("gpujob_first_looks_from_caches_total", &[]);
    let mut from_caches_before = 0.0;
    for r in &rs[..2] {
        from_caches_before += from_caches(&scrape(r).await.unwrap());
    }
    let mut watched_before = Vec::new();
    for (r, who) in rs[..2].iter().zip(ids) {
        let received = received_gpujobs(&scrape(r).await.unwrap());
        watched_before.push((shards_of(&env, who, &ids).await.1, received));
    }
    let mut three = rs.pop().unwrap();
    three.replica.signal(Signal::SIGKILL);
    three.replica.wait_exit(Duration::from_secs(10)).await;
    let two_ids = ["replica-1", "replica-2"];
    wait_balanced(&env, SHARDS, &two_ids, 3, Duration::from_secs(60)).await;
    // Each of its shards reports its hand-over: every GpuJob it had looked at.
    wait::until(
        "the survivors to report the first look of replica-3's shards",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async {
            let now = first_looks(&rs, &its).await;
            its.iter()
                .all(|s| now.get(s) > looks_before.get(s))
                .then_some(())
        },
    )
    .await
    .unwrap();
    // Every GpuJob of its shards had succeeded: none needs anything from the API server,
    // so each first look ended from the caches, with no worker and no request.
    let plans = per_shard(&rs, &its, "gpujob_shard_first_plan_seconds_count").await;
    assert!(
        its.iter().all(|s| plans.get(s) > plans_before.get(s)),
        "each gained shard reports its first plan: {plans_before:?} then {plans:?}"
    );
    let mut from_caches_after = 0.0;
    for r in &rs {
        from_caches_after += from_caches(&scrape(r).await.unwrap());
    }
    let gained: BTreeSet<u32> = its.iter().copied().collect();
    let settled = count_in(&gained, &namespaces, &counts) as f64;
    // One look each: not fewer (a worker's), not more (a second look at a shard).
    assert_eq!(
        from_caches_after - from_caches_before,
        settled,
        "first looks ended from the caches, for the GpuJobs of shards {its:?}"
    );
    // Each survivor listed only the shards it did not watch before: a shard it held or
    // kept warm went on with the watch it had.
    for ((r, who), (before, received)) in rs.iter().zip(two_ids).zip(&watched_before) {
        let (_, now) = shards_of(&env, who, &two_ids).await;
        let m = wait_cached(r, who, count_in(&now, &namespaces, &counts)).await;
        let new: BTreeSet<u32> = now.difference(before).copied().collect();
        assert_eq!(
            received_gpujobs(&m) - received,
            count_in(&new, &namespaces, &counts) as f64,
            "{who}: GpuJobs received since the kill, watching {before:?} then {now:?}"
        );
    }
    create(&env, &namespaces, 2, "b").await;
    let counts = shards::wait_succeeded(&env, namespaces.iter().map(|(ns, _)| ns.as_str())).await;
    let total: usize = counts.values().sum();
    for (r, who) in rs.iter().zip(two_ids) {
        let (_, cached) = share_of(&env, who, &two_ids, &namespaces, &counts).await;
        assert_eq!(cached, total, "{who}");
        let m = wait_cached(r, who, cached).await;
        assert_eq!(foreign(&m), 0.0);
    }

    // replica-3 is back: balance gives it two shards, and the others' caches shrink to
    // four of six again.
    rs.push(start(&env, 3));
    wait_balanced(&env, SHARDS, &ids, 2, Duration::from_secs(60)).await;
    for (r, who) in rs.iter().zip(ids) {
        let (_, cached) = share_of(&env, who, &ids, &namespaces, &counts).await;
        assert_eq!(cached, total * 2 / 3, "{who}");
        wait_cached(r, who, cached).await;
    }
}

#[tokio::test]
async fn where_the_server_cannot_select_shards_replicas_watch_everything_and_still_split_the_work()
{
    let env = TestEnv::private_without_sharded_watch("unsharded-watch").await;
    let start_at = env.cluster.audit().cursor().unwrap();
    let namespaces = shards::namespaces(&env, SHARDS, 1).await;
    let one = start(&env, 1);
    let two = start(&env, 2);
    wait_balanced(
        &env,
        SHARDS,
        &["replica-1", "replica-2"],
        3,
        Duration::from_secs(60),
    )
    .await;
    create(&env, &namespaces, 3, "a").await;
    let counts = shards::wait_succeeded(&env, namespaces.iter().map(|(ns, _)| ns.as_str())).await;
    let total: usize = counts.values().sum();
    for (r, who) in [(&one, "replica-1"), (&two, "replica-2")] {
        let m = wait_cached(r, who, total).await;
        assert_eq!(m.sum("gpujob_sharded_watch", &[]), 0.0, "{who}");
        assert_eq!(foreign(&m), 0.0, "a full watch asks for everything");
    }
    // Still only a shard's holder writes its GpuJobs.
    let events = env.cluster.audit().since(start_at).unwrap();
    shards::assert_writes_within_tenures(&events, SHARDS, replicas::WORKERS);
    let writers: std::collections::BTreeSet<String> = shards::writers_by_namespace(&events)
        .into_values()
        .flatten()
        .filter(|u| u.starts_with("replica-"))
        .collect();
    assert_eq!(writers.len(), 2, "{writers:?}");
}

/// Replica `n` as [`start`] starts it, talking to the API server through `proxy`, with
/// an 8 s lease duration (the short timings' 2 s renew deadline and 0.5 s retry period).
/// A shard lost to its renew deadline stays warm a lease duration from the next look,
/// and is taken back at a look after the proxy lets its Lease through (its Lease still
/// names this replica): 8 s leave a loaded machine more to spare than 3 s.
fn start_behind(env: &TestEnv, n: u8, proxy: &FaultProxy) -> Running {
    let address = free_address();
    let shards = SHARDS.to_string();
    let kubeconfig = proxy
        .kubeconfig(&env.cluster, Identity::Replica(n))
        .unwrap();
    let replica = replicas::start_everywhere_timed(
        &env.cluster,
        &env.ns,
        n,
        ["8s", "2s", "500ms"],
        &["--shards", &shards, "--listen-address", &address],
        Some(kubeconfig),
    );
    Running {
        replica,
        metrics: format!("http://{address}/metrics"),
    }
}

/// Waits until replica `r`'s metrics say `what` (`pred` of them); returns them.
async fn wait_metrics(r: &Running, what: &str, pred: impl Fn(&Metrics) -> bool) -> Metrics {
    let pred = &pred;
    wait::until(
        what,
        Duration::from_secs(60),
        Duration::from_millis(50),
        || async move { scrape(r).await.filter(|m| pred(m)) },
    )
    .await
    .unwrap()
}

/// `gpujob_shards_held`: the shards whose Lease the replica holds, as it sees them.
fn shards_held(m: &Metrics) -> f64 {
    m.sum("gpujob_shards_held", &[])
}

/// A replica whose renewals of a shard's Lease fail past the renew deadline (its
/// heartbeat still going through) loses the shard, and takes it back once the API server
/// answers again: a moment's failure. A shard lost so is kept warm for a lease duration,
/// its watches going on, so taking it back lists nothing again. Before, a lost shard's
/// watches stopped and its objects left the caches at once, and taking it back listed
/// every one of them again.
#[tokio::test]
async fn a_shard_lost_for_a_failed_renewal_and_taken_back_is_not_listed_again() {
    lost_and_taken_back(
        "lost-shard-warm",
        LostBy::Renewals(1),
        "stepping down from the shard",
        "stepping down from every shard",
    )
    .await;
}

/// The same with the member heartbeat failing (its shard Leases' renewals still going
/// through): the replica steps down from every shard at the renew deadline, and keeps
/// them warm, so taking them back once the heartbeat goes through lists nothing. Before,
/// every shard's watches stopped and its objects left the caches, and after an API
/// server outage each replica listed all its shards again at once.
#[tokio::test]
async fn shards_left_for_a_failed_heartbeat_and_taken_back_are_not_listed_again() {
    lost_and_taken_back(
        "heartbeat-warm",
        LostBy::Heartbeat,
        "stepping down from every shard",
        "stepping down from the shard",
    )
    .await;
}

/// What fails: one shard's Lease renewals, or the member heartbeat.
#[derive(Clone, Copy)]
enum LostBy {
    Renewals(u32),
    Heartbeat,
}

/// One replica holding every shard loses some to `by` (its log says `stepped`, never
/// `not`), and takes them back once the API server answers again, listing nothing.
async fn lost_and_taken_back(name: &str, by: LostBy, stepped: &str, not: &str) {
    let env = TestEnv::private(name).await;
    let namespaces = shards::namespaces(&env, SHARDS, 1).await;
    let proxy = FaultProxy::start(&env.cluster).unwrap();
    let r = start_behind(&env, 1, &proxy);
    let who = "replica-1";
    let all: Vec<u32> = (0..SHARDS).collect();
    wait_balanced(&env, SHARDS, &[who], all.len(), Duration::from_secs(60)).await;
    create(&env, &namespaces, 3, "a").await;
    let counts = shards::wait_succeeded(&env, namespaces.iter().map(|(ns, _)| ns.as_str())).await;
    let total = counts.values().sum::<usize>() as f64;
    // Every GpuJob cached with its last write (Succeeded): nothing more comes for them.
    wait_cached(&r, who, total as usize).await;
    let m = wait_metrics(&r, "every GpuJob cached as Succeeded", |m| {
        m.sum("gpujob_gpujobs", &[("phase", "Succeeded")]) == total
    })
    .await;
    let received = received_gpujobs(&m);
    let (failing, lost) = match by {
        LostBy::Renewals(shard) => (shards::lease_of(shard), vec![shard]),
        LostBy::Heartbeat => ("-member-".to_owned(), all.clone()),
    };
    let looks_before = first_looks(std::slice::from_ref(&r), &lost).await;

    // Writes to the failing Lease are refused (the other Leases' go through): past the
    // renew deadline the replica steps down.
    proxy.set(
        Faults::new().rule(
            Rule::new(Fault::Status {
                code: 503,
                retry_after: None,
            })
            .methods([Method::PUT])
            .resources(["leases"])
            .name_contains(&failing),
        ),
    );
    let left = SHARDS - lost.len() as u32;
    wait_metrics(&r, "the replica to step down", |m| {
        shards_held(m) == f64::from(left)
    })
    .await;
    let log = r.replica.log_text();
    assert!(
        log.lines()
            .any(|l| l.contains("renew deadline") && l.contains(stepped)),
        "the replica did not step down at its renew deadline:\n{log}"
    );

    // The API server answers again: the replica takes the shards back and looks at
    // their GpuJobs.
    proxy.clear();
    wait_metrics(&r, "the replica to hold every shard again", |m| {
        shards_held(m) == f64::from(SHARDS)
    })
    .await;
    wait::until(
        "the replica to look at the shards taken back",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async {
            let now = first_looks(std::slice::from_ref(&r), &lost).await;
            lost.iter()
                .all(|s| now.get(s) > looks_before.get(s))
                .then_some(())
        },
    )
    .await
    .unwrap();
    let m = wait_cached(&r, who, total as usize).await;
    // A relist would have received each GpuJob of the shards again.
    assert_eq!(
        received_gpujobs(&m) - received,
        0.0,
        "GpuJobs received since the shards were lost (a relist adds each of its shard's {counts:?})"
    );
    assert_eq!(foreign(&m), 0.0);
    let log = r.replica.log_text();
    assert!(
        !log.contains(not) && !log.contains("held by another"),
        "the replica lost shards otherwise too:\n{log}"
    );
    drop((r, proxy));
}
