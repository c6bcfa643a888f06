//! Calls to the quota service are fenced end to end, with the real binary: a leader
//! whose reserve is still in flight when it is frozen (SIGSTOP) and deposed cannot
//! bring back a reservation its successor has since released, because every call
//! carries the GpuJob's fencing token (a sequence recorded in its status before the
//! call) and the service refuses an older one. The token does not come from the Lease,
//! so a Lease deleted and created again (an uninstall deletes its namespace) does not
//! make the holder's calls look older than those it made before. And a replica that
//! takes over with a cache far behind (its GpuJob watch hangs) reads the GpuJob before
//! it calls the quota service, so a GpuJob that finished meanwhile is not reserved
//! again.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use crate::support;

use std::time::Duration;

use devcluster::faultproxy::{Fault, FaultProxy, Faults, Rule};
use devcluster::{Identity, wait};
use gpujob_operator::api::Phase;
use nix::sys::signal::Signal;
use serde_json::json;
use support::quota::{FakeQuota, Mode};
use support::replicas::{self, Replica, wait_holder};
use support::{TestEnv, phase, ready, sim_env};

/// A namespace, the fake quota service and the flags that point the binary at it, and
/// replica 1 of the real binary holding the Lease.
async fn leader_with_quota(prefix: &str) -> (TestEnv, FakeQuota, Vec<String>, Replica) {
    let env = TestEnv::new(prefix).await;
    let fake = FakeQuota::start().await;
    let flags = fake.flags(&env.ns);
    let as_str: Vec<&str> = flags.iter().map(String::as_str).collect();
    let first = replicas::start(&env.cluster, &env.ns, 1, &as_str);
    wait_holder(&env.admin, &env.ns, Duration::from_secs(30), |h| {
        h == "replica-1"
    })
    .await;
    (env, fake, flags, first)
}

#[tokio::test]
async fn a_deposed_leader_cannot_bring_back_a_reservation_its_successor_released() {
    let (env, fake, flags, first) = leader_with_quota("quota-fence").await;
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let second = replicas::start(&env.cluster, &env.ns, 2, &flags);

    // The leader's reserve reaches the service and is held there, unanswered.
    let hold = fake.hold_next_reserve();
    let gj = env
        .create(
            "gj",
            json!({"image": "i", "gpus": 1, "env": sim_env(&[("SIM_DURATION_SECONDS", "1")])}),
        )
        .await;
    let uid = gj.metadata.uid.clone().unwrap();
    let quota = fake.clone();
    wait::until(
        "the leader's reserve to be in flight",
        Duration::from_secs(30),
        Duration::from_millis(20),
        || {
            let quota = quota.clone();
            async move { (quota.held() == 1).then_some(()) }
        },
    )
    .await
    .unwrap();

    // Frozen with it in flight; the standby takes over, reserves, runs, releases.
    first.signal(Signal::SIGSTOP);
    wait_holder(&env.admin, &env.ns, Duration::from_secs(30), |h| {
        h == "replica-2"
    })
    .await;
    env.wait_gpujob("gj", "Succeeded, released, unfinalized", |g| {
        phase(g) == Some(Phase::Succeeded)
            && !g.holds_quota_finalizer()
            && g.status
                .as_ref()
                .is_some_and(|s| s.reservation_id.is_none())
    })
    .await;
    assert!(fake.live().is_empty(), "{:?}", fake.live());

    // Now the deposed leader's reserve lands, after its successor's release.
    drop(hold);
    let quota = fake.clone();
    let calls = wait::until(
        "the late reserve to be answered",
        Duration::from_secs(30),
        Duration::from_millis(20),
        || {
            let (quota, uid) = (quota.clone(), uid.clone());
            async move {
                let calls = quota.calls("reserve", &uid);
                (quota.held() == 0 && calls.len() >= 2).then_some(calls)
            }
        },
    )
    .await
    .unwrap();
    assert!(
        fake.live().is_empty(),
        "a late reserve of the deposed leader brought the reservation back: {:?}",
        fake.live()
    );
    let late = calls.last().unwrap();
    assert_eq!(late.code, 412, "{calls:#?}");
    let number = |t: &Option<String>| -> u64 {
        t.as_deref()
            .and_then(|t| t.rsplit_once('/'))
            .and_then(|(_, n)| n.parse().ok())
            .unwrap()
    };
    let released = fake.calls("release", &uid);
    let successor = released.iter().find(|c| c.code == 204).unwrap();
    assert!(
        number(&late.token) < number(&successor.token),
        "older call, smaller token: {calls:#?} {released:#?}"
    );
    first.signal(Signal::SIGCONT);
    drop((first, second));
}

#[tokio::test]
async fn a_successor_with_a_stale_cache_reads_before_it_reserves() {
    let (env, fake, flags, first) = leader_with_quota("quota-stale").await;
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    fake.set_reserve(Mode::Refuse);
    // One that will finish before the takeover, one that will still run.
    let mut uids = Vec::new();
    for (name, seconds) in [("done", "1"), ("long", "3600")] {
        let gj = env
            .create(
                name,
                json!({"image": "i", "gpus": 1, "env": sim_env(&[("SIM_DURATION_SECONDS", seconds)])}),
            )
            .await;
        uids.push(gj.metadata.uid.clone().unwrap());
        env.wait_gpujob(name, "QuotaRefused, finalizer held", |g| {
            g.holds_quota_finalizer() && ready(g).is_some_and(|(_, r, _)| r == "QuotaRefused")
        })
        .await;
    }

    // The standby lists GpuJobs and Jobs (seeing both GpuJobs waiting for quota, no
    // Job), and then its watches hang: its caches stay there.
    let proxy = FaultProxy::start(&env.cluster).unwrap();
    proxy.set(Faults::new().rule(Rule::new(Fault::Hang).watch(true)));
    let kubeconfig = proxy
        .kubeconfig(&env.cluster, Identity::Replica(2))
        .unwrap();
    let address = support::prometheus::free_address();
    let mut flags2 = flags.clone();
    flags2.extend(["--listen-address", &address]);
    let second = replicas::start_in_with_kubeconfig(&env.cluster, &env.ns, 2, &flags2, kubeconfig);
    proxy
        .wait_count("hang", 2, Duration::from_secs(30))
        .await
        .unwrap_or_else(|e| panic!("the standby's watches to hang after its lists: {e}"));

    // Meanwhile the leader reserves and runs both; one finishes, releases and lets go.
    fake.set_reserve(Mode::Ok);
    env.wait_gpujob("done", "Succeeded, released, unfinalized", |g| {
        phase(g) == Some(Phase::Succeeded) && !g.holds_quota_finalizer()
    })
    .await;
    env.wait_gpujob("long", "Running", |g| phase(g) == Some(Phase::Running))
        .await;
    assert_eq!(fake.granted(&uids[0]).len(), 1);
    assert_eq!(fake.live().len(), 1, "{:?}", fake.live());

    // The leader dies; the standby takes over, its caches still saying "waiting for
    // quota, no Job". It reconciles both GpuJobs of the shard it gained: each one either
    // read first and decided from what is true, or (the defects) reserved again, or
    // planned from the current GpuJob but the stale Jobs (attempt 1 of "long" taken for
    // lost).
    first.signal(Signal::SIGKILL);
    wait_holder(&env.admin, &env.ns, Duration::from_secs(30), |h| {
        h == "replica-2"
    })
    .await;
    replicas::wait_reconciles(
        "the successor to reconcile both GpuJobs",
        &address,
        &[("result", "success")],
        2.0,
    )
    .await;
    assert_eq!(
        fake.granted(&uids[0]).len(),
        1,
        "reserved again from a stale cache: {:?}",
        fake.granted(&uids[0])
    );
    assert!(
        !env.gpujobs()
            .get("done")
            .await
            .unwrap()
            .holds_quota_finalizer()
    );
    let long = env.gpujobs().get("long").await.unwrap();
    let s = long.status.clone().unwrap();
    assert_eq!(
        (s.phase, s.attempts, s.failures),
        (Some(Phase::Running), 1, 0),
        "the running attempt was taken for lost: {s:?}"
    );
    assert_eq!(env.jobs_of(&long).await.len(), 1);
    assert_eq!(fake.granted(&uids[1]).len(), 1);
    assert_eq!(fake.live().len(), 1, "{:?}", fake.live());
    assert!(
        second.log_text().contains("behind the API server"),
        "{}",
        second.log_text()
    );
    proxy.clear();
    drop((first, second));
}

/// Issue 25 (4d): the quota service keeps the newest token per GpuJob. Had the token
/// been the Lease's `leaseTransitions`, a Lease deleted and created again would start
/// from 0 under it, and the legitimate holder would be refused for good.
#[tokio::test]
async fn a_recreated_lease_does_not_make_the_holders_calls_look_stale() {
    let (env, fake, flags, mut first) = leader_with_quota("quota-lease-again").await;
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
        kube::Api::namespaced(env.admin.clone(), &env.ns);
    let transitions = |l: &k8s_openapi::api::coordination::v1::Lease| {
        l.spec
            .as_ref()
            .and_then(|s| s.lease_transitions)
            .unwrap_or(0)
    };

    // A restart of the holder is a new term of the Lease: its transitions count up.
    first.signal(Signal::SIGTERM);
    first.wait_exit(Duration::from_secs(30)).await;
    let first = replicas::start(&env.cluster, &env.ns, 1, &flags);
    let (_, lease) = wait_holder(&env.admin, &env.ns, Duration::from_secs(30), |h| {
        h == "replica-1"
    })
    .await;
    assert!(transitions(&lease) >= 1, "{lease:?}");
    let gj = env
        .create(
            "gj",
            json!({"image": "i", "gpus": 1, "env": sim_env(&[("SIM_DURATION_SECONDS", "3600")])}),
        )
        .await;
    let uid = gj.metadata.uid.clone().unwrap();
    env.wait_gpujob("gj", "Running", |g| phase(g) == Some(Phase::Running))
        .await;
    assert!(fake.live().contains_key(&uid));

    // Uninstalled and installed again: the Lease goes with its namespace and comes
    // back from 0.
    let mut first = first;
    first.signal(Signal::SIGTERM);
    first.wait_exit(Duration::from_secs(30)).await;
    leases
        .delete(replicas::LEASE, &Default::default())
        .await
        .unwrap();
    let again = replicas::start(&env.cluster, &env.ns, 1, &flags);
    let (_, lease) = wait_holder(&env.admin, &env.ns, Duration::from_secs(30), |h| {
        h == "replica-1"
    })
    .await;
    assert_eq!(transitions(&lease), 0, "{lease:?}");

    // The legitimate holder releases what its earlier term reserved.
    env.gpujobs()
        .delete("gj", &Default::default())
        .await
        .unwrap();
    let api = env.gpujobs();
    let gone = wait::until(
        "the deleted GpuJob to go",
        support::WAIT,
        Duration::from_millis(200),
        || {
            let api = api.clone();
            async move { api.get_opt("gj").await.ok()?.is_none().then_some(()) }
        },
    )
    .await;
    assert!(
        gone.is_ok(),
        "the holder's release was refused: {:#?}",
        fake.calls("release", &uid)
    );
    assert!(!fake.live().contains_key(&uid), "{:?}", fake.live());
    drop(again);
}
