//! Faults between one replica and kube-apiserver (devcluster's fault proxy), while the
//! others talk to it directly: the API server saying "later" (429 with Retry-After,
//! 5xx), answers lost after the write happened, watches cut or expired (410), and a
//! replica partitioned from the API server. Effects are counted from the audit log.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use crate::support;

use std::collections::BTreeMap;
use std::time::Duration;

use devcluster::audit::AuditEvent;
use devcluster::faultproxy::{Fault, FaultProxy, Faults, Partition, Rule};
use devcluster::{Identity, wait};
use gpujob_operator::api::Phase;
use http::Method;
use nix::sys::signal::Signal;
use serde_json::json;
use support::replicas::{self, wait_holder};
use support::{TestEnv, phase, sim_env};

use support::replicas::WORKERS;

fn on(fault: Fault, rate: f64, methods: &[Method], resource: &str) -> Rule {
    Rule::new(fault)
        .probability(rate)
        .methods(methods.iter().cloned())
        .resources([resource])
}

fn on_watches(fault: Fault, rate: f64) -> Rule {
    Rule::new(fault).probability(rate).watch(true)
}

/// Successful creates of each Job name in the namespace.
fn job_creates(events: &[AuditEvent], ns: &str) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for e in events {
        if e.namespace == ns && e.resource == "jobs" && e.verb == "create" && e.succeeded() {
            *out.entry(e.name.clone()).or_insert(0) += 1;
        }
    }
    out
}

async fn create_many(env: &TestEnv, prefix: &str, n: usize, duration: &str) {
    for i in 0..n {
        env.create(
            &format!("{prefix}-{i}"),
            json!({"image": "i", "gpus": 1, "env": sim_env(&[("SIM_DURATION_SECONDS", duration)])}),
        )
        .await;
    }
}

async fn wait_succeeded(env: &TestEnv, n: usize) {
    env.wait_gpujobs("every GpuJob to succeed", Duration::from_secs(120), |all| {
        all.len() == n && all.iter().all(|g| phase(g) == Some(Phase::Succeeded))
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn the_api_server_saying_later_is_retried_as_told_and_counted() {
    let env = TestEnv::new("faults-later").await;
    let proxy = FaultProxy::start(&env.cluster).unwrap();
    proxy.set(Faults {
        rules: vec![
            on(
                Fault::Status {
                    code: 429,
                    retry_after: Some(1),
                },
                0.5,
                &[Method::POST],
                "jobs",
            ),
            on(
                Fault::Status {
                    code: 503,
                    retry_after: None,
                },
                0.3,
                &[Method::PATCH],
                "gpujobs",
            ),
        ],
        partition: None,
        seed: 7,
    });
    let config = proxy
        .config(&env.cluster, Identity::Replica(1))
        .await
        .unwrap();
    let op = env
        .operator_with(config, "faults-later", env.settings())
        .await;
    let audit = env.cluster.audit();
    let start = audit.cursor().unwrap();
    create_many(&env, "later", 10, "0.5").await;
    wait_succeeded(&env, 10).await;

    let counts = proxy.counts();
    assert!(
        counts.get("status_429").copied().unwrap_or(0) > 0,
        "{counts:?}"
    );
    assert!(
        counts.get("status_503").copied().unwrap_or(0) > 0,
        "{counts:?}"
    );
    let text = op.status.render_metrics();
    let retried = |code: &str, method: &str| {
        text.lines()
            .find(|l| {
                l.starts_with("rest_client_request_retries_total")
                    && l.contains(&format!("code=\"{code}\""))
                    && l.contains(&format!("method=\"{method}\""))
            })
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    assert!(retried("429", "POST") >= 1.0, "{text}");
    assert!(retried("503", "PATCH") >= 1.0, "{text}");
    // Retried, never doubled: one Job per attempt.
    let creates = job_creates(&audit.since(start).unwrap(), &env.ns);
    assert_eq!(creates.len(), 10, "{creates:?}");
    assert!(creates.values().all(|n| *n == 1), "{creates:?}");
    op.stop().await;
}

#[tokio::test]
async fn a_write_whose_answer_is_lost_is_resolved_by_reading_again() {
    let env = TestEnv::new("faults-lost").await;
    let proxy = FaultProxy::start(&env.cluster).unwrap();
    proxy.set(Faults {
        rules: vec![
            on(Fault::ResetAfter, 0.5, &[Method::POST], "jobs"),
            on(Fault::ResetAfter, 0.3, &[Method::PATCH], "gpujobs"),
            on(
                Fault::ResetBefore,
                0.2,
                &[Method::POST, Method::PATCH],
                "gpujobs",
            ),
        ],
        partition: None,
        seed: 11,
    });
    let config = proxy
        .config(&env.cluster, Identity::Replica(1))
        .await
        .unwrap();
    let op = env
        .operator_with(config, "faults-lost", env.settings())
        .await;
    let audit = env.cluster.audit();
    let start = audit.cursor().unwrap();
    create_many(&env, "lost", 12, "0.5").await;
    wait_succeeded(&env, 12).await;

    let counts = proxy.counts();
    assert!(
        counts.get("reset_after").copied().unwrap_or(0) > 0,
        "{counts:?}"
    );
    let events = audit.since(start).unwrap();
    let creates = job_creates(&events, &env.ns);
    assert_eq!(creates.len(), 12, "{creates:?}");
    assert!(
        creates.values().all(|n| *n == 1),
        "a lost answer led to a second create: {creates:?}"
    );
    // No fact lost: every GpuJob says one attempt, no failure, its Job.
    for g in env.gpujobs().list(&Default::default()).await.unwrap().items {
        let s = g.status.clone().unwrap();
        assert_eq!((s.attempts, s.failures), (1, 0), "{:?}", g.metadata.name);
        assert!(s.completion_time.is_some() && s.start_time.is_some());
    }
    op.stop().await;
}

#[tokio::test]
async fn cut_and_expired_watches_recover_without_redoing_work() {
    let env = TestEnv::new("faults-watch").await;
    let proxy = FaultProxy::start(&env.cluster).unwrap();
    proxy.set(Faults {
        rules: vec![
            on_watches(Fault::Gone, 0.3),
            on_watches(Fault::ExpiredEvent, 0.2),
            on_watches(
                Fault::CutWatchAfter {
                    max: Duration::from_millis(1500),
                },
                1.0,
            ),
        ],
        partition: None,
        seed: 3,
    });
    let config = proxy
        .config(&env.cluster, Identity::Replica(1))
        .await
        .unwrap();
    let op = env
        .operator_with(config, "faults-watch", env.settings())
        .await;
    let audit = env.cluster.audit();
    let start = audit.cursor().unwrap();
    create_many(&env, "watch", 10, "2").await;
    wait_succeeded(&env, 10).await;
    // Then watches cut again (each at most 1.5 s after it began), and the relists that
    // follow look at everything again: they must write nothing new.
    let before = proxy.count("watch_cut");
    proxy
        .wait_count("watch_cut", before + 3, support::WAIT)
        .await
        .unwrap_or_else(|e| panic!("three more watch cuts: {e}"));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let agent = TestEnv::agent("faults-watch");
    let writes: Vec<AuditEvent> = audit
        .since(start)
        .unwrap()
        .into_iter()
        .filter(|e| e.user_agent == agent && e.succeeded())
        .filter(|e| matches!(e.resource.as_str(), "gpujobs" | "jobs" | "pods"))
        .collect();
    // One Job create, its pod let go (the scheduling gate removed) and two status patches
    // (Running, Succeeded) per GpuJob.
    assert_eq!(writes.len(), 40, "{writes:#?}");
    op.stop().await;
}

#[tokio::test]
async fn a_request_that_is_never_answered_is_abandoned_and_the_work_goes_on() {
    let env = TestEnv::new("faults-hang").await;
    let proxy = FaultProxy::start(&env.cluster).unwrap();
    let config = proxy
        .config(&env.cluster, Identity::Replica(1))
        .await
        .unwrap();
    let limits = gpujob_operator::client::Limits {
        timeout: Duration::from_secs(3),
        ..Default::default()
    };
    let settings = gpujob_operator::controller::Settings {
        watch_timeout: gpujob_operator::client::watch_timeout(limits.timeout),
        ..env.settings()
    };
    let op = env
        .operator_with_limits(config, "faults-hang", settings, limits)
        .await;
    create_many(&env, "before", 3, "0.5").await;
    wait_succeeded(&env, 3).await;

    // Every request but a watch is held unanswered, and every watch is told to relist:
    // the relists, the writes and the reads of the workers all hang, for good.
    proxy.set(Faults {
        rules: vec![
            Rule::new(Fault::Hang).watch(false),
            on_watches(Fault::Gone, 1.0),
        ],
        partition: None,
        seed: 5,
    });
    create_many(&env, "during", 5, "0.5").await;
    // Until the operator has met the fault (a request held), however slow the machine.
    wait::until(
        "a request held by the proxy",
        support::WAIT,
        support::POLL,
        || {
            let held = proxy.counts().get("hang").copied().unwrap_or(0);
            std::future::ready((held > 0).then_some(()))
        },
    )
    .await
    .unwrap();
    proxy.clear();
    // The held requests are never answered: the operator must give up on them by itself.
    wait_succeeded(&env, 8).await;
    op.stop().await;
}

#[tokio::test]
async fn a_partitioned_leader_steps_down_and_writes_nothing_when_the_partition_heals() {
    let env = TestEnv::new("faults-partition").await;
    let proxies = [
        FaultProxy::start(&env.cluster).unwrap(),
        FaultProxy::start(&env.cluster).unwrap(),
        FaultProxy::start(&env.cluster).unwrap(),
    ];
    let audit = env.cluster.audit();
    let mut rs = Vec::new();
    for (i, p) in proxies.iter().enumerate() {
        let n = u8::try_from(i + 1).unwrap();
        let kubeconfig = p.kubeconfig(&env.cluster, Identity::Replica(n)).unwrap();
        rs.push(replicas::start_in_with_kubeconfig(
            &env.cluster,
            &env.ns,
            n,
            &[],
            kubeconfig,
        ));
    }
    let (leader, _) = wait_holder(&env.admin, &env.ns, Duration::from_secs(30), |_| true).await;
    let i = rs.iter().position(|r| r.identity() == leader).unwrap();
    create_many(&env, "before", 20, "2").await;
    env.wait_gpujobs("some to run", Duration::from_secs(60), |all| {
        all.iter().filter(|g| phase(g).is_some()).count() >= 5
    })
    .await
    .unwrap();

    let start = audit.cursor().unwrap();
    proxies[i].set(Faults {
        rules: vec![],
        partition: Some(Partition::Hang),
        seed: 1,
    });
    let (successor, _) = wait_holder(&env.admin, &env.ns, Duration::from_secs(30), |h| {
        h != leader
    })
    .await;
    // Healed well after its lease (3 s) ran out.
    tokio::time::sleep(Duration::from_secs(3)).await;
    proxies[i].clear();
    create_many(&env, "after", 10, "1").await;
    for _ in 0..20 {
        let l = replicas::lease(&env.admin, &env.ns).await.unwrap();
        assert_eq!(
            replicas::holder(&l).as_deref(),
            Some(successor.as_str()),
            "the healed replica took the Lease back"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    wait_succeeded(&env, 30).await;
    assert!(
        rs[i].log_text().contains("stepping down"),
        "{}",
        rs[i].log_text()
    );
    let events = replicas::writes_in(&audit, start, &env.ns);
    replicas::assert_late_writes_are_safe(&events, &leader, &successor, WORKERS);
    rs[i].signal(Signal::SIGCONT);
    drop(rs);
}
