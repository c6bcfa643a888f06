//! A replica that takes a shard over may plan from caches that still show a GpuJob as it
//! was before its predecessor's writes. A stable Job name refuses a second create only
//! while the Job exists, so a create from such a view could bring back a Job the
//! predecessor had deleted (found by the soak: a Job created twice). Here the successor's
//! GpuJob watch hangs after its list, with the real binary: it must read the GpuJob from
//! the API server before it creates anything, and create nothing for a GpuJob that is
//! gone. The read is owed only by views older than the term: a GpuJob created after the
//! replica took its shard costs none.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use crate::support;

use std::time::Duration;

use http::Method;

use devcluster::faultproxy::{Fault, FaultProxy, Faults, Rule};
use devcluster::{Identity, wait};
use gpujob_operator::api::Phase;
use kube::api::{DeleteParams, Patch, PatchParams};
use nix::sys::signal::Signal;
use serde_json::json;
use support::replicas::{self, wait_holder};
use support::{TestEnv, phase, sim_env};

/// The proxy rule that hangs GpuJob watches.
fn hang() -> Rule {
    Rule::new(Fault::Hang).watch(true).resources(["gpujobs"])
}

/// Starts replica 2 behind a fault proxy whose GpuJob watches hang (with `also`, another
/// rule), and waits until its GpuJob watch hangs after its list: its GpuJob cache keeps
/// what that list saw, while its Jobs watch stays live. Returns the proxy, the replica
/// and its metrics address.
async fn standby_with_a_hung_gpujob_watch(
    env: &TestEnv,
    also: Option<Rule>,
) -> (FaultProxy, replicas::Replica, String) {
    let proxy = FaultProxy::start(&env.cluster).unwrap();
    let mut faults = Faults::new().rule(hang());
    if let Some(rule) = also {
        faults = faults.rule(rule);
    }
    proxy.set(faults);
    let kubeconfig = proxy
        .kubeconfig(&env.cluster, Identity::Replica(2))
        .unwrap();
    let address = support::prometheus::free_address();
    let second = replicas::start_in_with_kubeconfig(
        &env.cluster,
        &env.ns,
        2,
        &["--listen-address", &address],
        kubeconfig,
    );
    proxy
        .wait_count("hang", 1, Duration::from_secs(30))
        .await
        .unwrap_or_else(|e| panic!("the standby's GpuJob watch to hang after its list: {e}"));
    (proxy, second, address)
}

/// Kills the leader `first`, waits until `second` (metrics at `address`) holds the Lease
/// and has reconciled (`what`), and returns its log.
async fn successor_reconciles(
    env: &TestEnv,
    first: &replicas::Replica,
    second: &replicas::Replica,
    address: &str,
    what: &str,
) -> String {
    first.signal(Signal::SIGKILL);
    wait_holder(&env.admin, &env.ns, Duration::from_secs(30), |h| {
        h == "replica-2"
    })
    .await;
    replicas::wait_reconciles(what, address, &[], 1.0).await;
    second.log_text()
}

#[tokio::test]
async fn a_successor_with_a_stale_cache_does_not_bring_back_a_deleted_gpujobs_job() {
    let env = TestEnv::new("stale-takeover").await;
    // Created before any replica runs: every cache lists it without a status.
    env.create(
        "gone",
        json!({"image": "i", "gpus": 1, "env": sim_env(&[("SIM_DURATION_SECONDS", "3600")])}),
    )
    .await;

    // Replica 2 lists it, then its GpuJob watch hangs (its Jobs watch stays live); its
    // Lease requests are refused for now, so replica 1 leads.
    let refuse_leases = Rule::new(Fault::Status {
        code: 503,
        retry_after: None,
    })
    .resources(["leases"]);
    let (proxy, second, address) =
        standby_with_a_hung_gpujob_watch(&env, Some(refuse_leases)).await;
    let first = replicas::start(&env.cluster, &env.ns, 1, &[]);
    wait_holder(&env.admin, &env.ns, Duration::from_secs(30), |h| {
        h == "replica-1"
    })
    .await;
    proxy.set(Faults::new().rule(hang()));

    // The leader starts attempt 1; then the GpuJob is deleted and its Job goes with it.
    let gj = env
        .wait_gpujob("gone", "Running", |g| phase(g) == Some(Phase::Running))
        .await;
    env.gpujobs()
        .delete("gone", &DeleteParams::default())
        .await
        .unwrap();
    wait::until(
        "the GpuJob's Job to be collected",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || {
            let (env, gj) = (&env, &gj);
            async move { env.jobs_of(gj).await.is_empty().then_some(()) }
        },
    )
    .await
    .unwrap();

    // The leader dies; replica 2 takes over, its cache still showing the GpuJob without a
    // status and (its Jobs watch being live) without a Job.
    let log = successor_reconciles(
        &env,
        &first,
        &second,
        &address,
        "the successor to reconcile the GpuJob it still has cached",
    )
    .await;
    assert!(
        !log.contains("attempt started"),
        "a Job was created from the stale view: {log}"
    );
    assert!(log.contains("the GpuJob is gone"), "{log}");
    assert!(env.jobs_of(&gj).await.is_empty());
    proxy.clear();
    drop((first, second));
}

#[tokio::test]
async fn a_gpujob_created_during_the_term_is_not_read_before_its_job() {
    let env = TestEnv::new("term-reads").await;
    let spec =
        || json!({"image": "i", "gpus": 1, "env": sim_env(&[("SIM_DURATION_SECONDS", "3600")])});
    // Created before the replica runs: older than its term, so confirmed before its
    // Job, by the list of its namespace that reads where the term began.
    env.create("before", spec()).await;
    // The proxy counts the replica's reads of GpuJobs: a zero delay that fires for each.
    let counting = || {
        Rule::new(Fault::Latency {
            fixed: Duration::ZERO,
            jitter: Duration::ZERO,
        })
        .methods([Method::GET])
        .resources(["gpujobs"])
        .watch(false)
    };
    let proxy = FaultProxy::start(&env.cluster).unwrap();
    // First its reads of `before` alone (a get names it; lists do not).
    proxy.set(Faults::new().rule(counting().name_contains("before")));
    let kubeconfig = proxy
        .kubeconfig(&env.cluster, Identity::Replica(1))
        .unwrap();
    let replica = replicas::start_in_with_kubeconfig(&env.cluster, &env.ns, 1, &[], kubeconfig);
    env.wait_gpujob("before", "Running", |g| phase(g) == Some(Phase::Running))
        .await;
    let log = replica.log_text();
    assert_eq!(
        proxy.count("latency"),
        0,
        "the GpuJob older than the term was read alone, not confirmed by its namespace's list: {:?}\n{log}",
        proxy.counts()
    );

    // Then every read of a GpuJob, lists and gets (not watches).
    proxy.set(Faults::new().rule(counting()));
    proxy.reset_counts();
    for i in 0..5 {
        env.create(&format!("after-{i}"), spec()).await;
    }
    for i in 0..5 {
        env.wait_gpujob(&format!("after-{i}"), "Running", |g| {
            phase(g) == Some(Phase::Running)
        })
        .await;
    }
    let log = replica.log_text();
    assert_eq!(
        proxy.count("latency"),
        0,
        "GpuJobs created during the term were read before their Jobs: {:?}\n{log}",
        proxy.counts()
    );
    assert!(proxy.count("requests") > 0, "{:?}", proxy.counts());
    drop(replica);
}

/// After a takeover whose GpuJob watch lags, the successor's cache can show a GpuJob as
/// it was before its predecessor's writes: finished, while a rerun since runs its next
/// attempt. Before, the successor deleted that attempt's Job as a stray (nothing of a
/// finished GpuJob runs) from that view, and the rerun's attempt was lost. Now every
/// delete of a Job (and every start) is sent from a view confirmed in the term: the
/// successor reads the GpuJob, finds the rerun, and its attempt runs on.
#[tokio::test]
async fn a_successor_with_a_stale_cache_does_not_delete_a_reruns_running_attempt() {
    let env = TestEnv::new("stale-rerun").await;
    let first = replicas::start(&env.cluster, &env.ns, 1, &[]);
    wait_holder(&env.admin, &env.ns, Duration::from_secs(30), |h| {
        h == "replica-1"
    })
    .await;
    env.create(
        "train",
        json!({"image": "i", "gpus": 1, "env": sim_env(&[("SIM_DURATION_SECONDS", "1")])}),
    )
    .await;
    env.wait_gpujob("train", "Succeeded", |g| phase(g) == Some(Phase::Succeeded))
        .await;

    // Replica 2 lists it finished, then its GpuJob watch hangs (its Jobs watch stays
    // live); it waits as a standby.
    let (proxy, second, address) = standby_with_a_hung_gpujob_watch(&env, None).await;

    // A rerun, running long this time: the leader starts attempt 2.
    env.gpujobs()
        .patch(
            "train",
            &PatchParams::default(),
            &Patch::Merge(json!({
                "metadata": {"annotations": {"gpujob.dev/rerun": "1"}},
                "spec": {"env": sim_env(&[("SIM_DURATION_SECONDS", "3600")])},
            })),
        )
        .await
        .unwrap();
    let rerun = env
        .wait_gpujob("train", "attempt 2 running", |g| {
            phase(g) == Some(Phase::Running) && g.status.as_ref().is_some_and(|s| s.attempts == 2)
        })
        .await;
    let uid = rerun.metadata.uid.clone().unwrap();
    wait::until(
        "attempt 2's pod running",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async {
            let pods = env
                .running_pods(&format!("gpujob.dev/uid={uid},gpujob.dev/attempt=2"))
                .await;
            (!pods.is_empty()).then_some(())
        },
    )
    .await
    .unwrap();

    // The leader dies; replica 2 takes over, its cache showing the GpuJob finished.
    let log = successor_reconciles(
        &env,
        &first,
        &second,
        &address,
        "the successor to reconcile the GpuJob it has cached as finished",
    )
    .await;
    assert!(
        log.contains("the cached GpuJob was behind the API server"),
        "no confirming read before acting on the stale view: {log}"
    );
    let two = env.jobs().get("train-2").await.unwrap();
    assert!(
        two.metadata.deletion_timestamp.is_none(),
        "the rerun's running attempt was deleted from the stale view: {log}"
    );
    let g = env.gpujobs().get("train").await.unwrap();
    let status = g.status.unwrap();
    assert_eq!(
        (status.phase, status.attempts, status.failures),
        (Some(Phase::Running), 2, 0),
        "{log}"
    );
    proxy.clear();
    drop((first, second));
}
