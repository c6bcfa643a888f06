//! The Lease election itself against the real API server: compare-and-swap means two
//! contenders on an expired Lease never both win.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use crate::support;

use std::time::Duration;

use devcluster::Identity;
use gpujob_operator::lease::{Attempt, Elector, Timing};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Client;
use kube::api::{Api, PostParams};
use support::TestEnv;
use tokio::time::Instant;

const ROUNDS: usize = 50;

fn timing() -> Timing {
    Timing {
        lease_duration: Duration::from_secs(1),
        renew_deadline: Duration::from_millis(800),
        retry_period: Duration::from_millis(100),
    }
}

async fn client(env: &TestEnv, n: u8, identity: &str) -> Client {
    let config = env.cluster.config(Identity::Replica(n)).await.unwrap();
    let limits = gpujob_operator::client::Limits {
        qps: 1000.0,
        burst: 1000,
        ..Default::default()
    };
    gpujob_operator::client::build(config, identity, limits, None, None).unwrap()
}

/// A successful attempt: when its write was sent, and the Lease's `leaseTransitions`
/// it left (one number per term: it grows with every gain).
type Win = (Instant, i32);

/// Keeps trying for `for_how_long`; returns the attempts that said this contender holds it.
async fn contend(elector: &Elector, for_how_long: Duration) -> Vec<Win> {
    let deadline = Instant::now() + for_how_long;
    let mut wins = Vec::new();
    while Instant::now() < deadline {
        let attempt = if wins.is_empty() {
            elector.acquire().await
        } else {
            elector.renew().await
        };
        if let Ok(Attempt::Held { sent, transitions }) = attempt {
            wins.push((sent, transitions));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    wins
}

/// What compare-and-swap and the local deadline guarantee, whatever the machine's load:
/// the two never win the same term, and a contender's write is never sent inside the
/// other's tenure (a win sent at `t` lets its holder act until `t + renew_deadline`; the
/// other may take over only after seeing the Lease unchanged for a lease duration, which
/// is longer). Under load a holder can miss its renewals and lose the Lease for real,
/// so "only one ever wins" is not guaranteed and not asserted.
fn assert_never_both(round: usize, a: &[Win], b: &[Win]) {
    assert!(!a.is_empty() || !b.is_empty(), "round {round}: nobody won");
    let renew_deadline = timing().renew_deadline;
    for (mine, theirs, who) in [(a, b, "a"), (b, a, "b")] {
        for &(sent, term) in mine {
            for &(their_sent, their_term) in theirs {
                assert_ne!(
                    term, their_term,
                    "round {round}: both won term {term} (CAS let two writes through)"
                );
                assert!(
                    !(their_sent <= sent && sent < their_sent + renew_deadline),
                    "round {round}: {who} won {:?} into the other's tenure",
                    sent - their_sent
                );
            }
        }
    }
}

#[tokio::test]
async fn two_contenders_on_an_expired_lease_never_both_win() {
    let env = TestEnv::new("lease-race").await;
    let a_client = client(&env, 1, "a").await;
    let b_client = client(&env, 2, "b").await;
    let leases: Api<Lease> = Api::namespaced(env.admin.clone(), &env.ns);
    let mut rounds = Vec::new();
    for round in 0..ROUNDS {
        let name = format!("race-{round}");
        // Held by someone who is gone: expired once unchanged for a lease duration.
        let mut lease = Lease::default();
        lease.metadata.name = Some(name.clone());
        lease.spec = Some(LeaseSpec {
            holder_identity: Some("gone".into()),
            lease_duration_seconds: Some(1),
            renew_time: Some(MicroTime("2026-01-01T00:00:00Z".parse().unwrap())),
            ..LeaseSpec::default()
        });
        leases.create(&PostParams::default(), &lease).await.unwrap();
        let a = Elector::new(a_client.clone(), &env.ns, &name, "a", timing());
        let b = Elector::new(b_client.clone(), &env.ns, &name, "b", timing());
        rounds.push(async move {
            let window = Duration::from_millis(3000);
            let (wins_a, wins_b) = tokio::join!(contend(&a, window), contend(&b, window));
            (round, wins_a, wins_b)
        });
    }
    // Ten races at a time keep the API server's load (and so the timing) reasonable.
    let mut results = Vec::new();
    let mut rounds = rounds.into_iter();
    loop {
        let batch: Vec<_> = rounds.by_ref().take(10).collect();
        if batch.is_empty() {
            break;
        }
        results.extend(futures::future::join_all(batch).await);
    }
    for (round, a, b) in &results {
        assert_never_both(*round, a, b);
    }
    // Each round's Lease names the contender whose win came last.
    for (round, a, b) in results {
        let last = |w: &[Win]| w.iter().map(|(sent, _)| *sent).max();
        let l = leases.get(&format!("race-{round}")).await.unwrap();
        let holder = l.spec.unwrap().holder_identity.unwrap();
        assert_eq!(
            holder,
            if last(&a) > last(&b) { "a" } else { "b" },
            "round {round}"
        );
    }
}

#[tokio::test]
async fn every_new_term_raises_lease_transitions_so_fencing_tokens_only_grow() {
    let env = TestEnv::new("lease-terms").await;
    let a = Elector::new(client(&env, 1, "a").await, &env.ns, "terms", "a", timing());
    let b = Elector::new(client(&env, 2, "b").await, &env.ns, "terms", "b", timing());
    let transitions = |attempt| match attempt {
        Ok(Attempt::Held { transitions, .. }) => transitions,
        other => panic!("expected to hold the Lease, got {other:?}"),
    };
    let first = transitions(a.acquire().await);
    assert_eq!(
        transitions(a.renew().await),
        first,
        "a renewal is the same term"
    );
    // The same replica starting over (restarted, or back after stepping down): a new
    // term, so a late call of the old term carries the smaller token.
    let second = transitions(a.acquire().await);
    assert_eq!(second, first + 1);
    // Released, then taken by another replica: newer still.
    assert!(a.release().await.unwrap());
    let third = transitions(b.acquire().await);
    assert_eq!(third, second + 1);
    assert!(
        matches!(a.renew().await, Ok(Attempt::Lost)),
        "a renewal never silently starts a term"
    );
}
