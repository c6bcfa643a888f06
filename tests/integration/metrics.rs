//! The metrics a replica serves, checked after known actions against the real API server.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use crate::support;

use devcluster::metrics::Metrics as Scrape;
use devcluster::wait;
use gpujob_operator::api::Phase;
use serde_json::json;
use support::{TestEnv, phase, sim_env};

#[tokio::test]
async fn counters_and_gauges_follow_what_happened() {
    let env = TestEnv::new("metrics").await;
    let op = env.operator("metrics", env.settings()).await;
    env.create(
        "ok",
        json!({"image": "i", "gpus": 1, "env": sim_env(&[("SIM_DURATION_SECONDS", "0.5")])}),
    )
    .await;
    env.create(
        "bad",
        json!({"image": "i", "gpus": 1, "maxRetries": 1, "env": sim_env(&[("SIM_EXIT_CODE", "2"), ("SIM_DURATION_SECONDS", "0.5")])}),
    )
    .await;
    env.wait_gpujob("ok", "Succeeded", |g| phase(g) == Some(Phase::Succeeded))
        .await;
    env.wait_gpujob("bad", "Failed", |g| phase(g) == Some(Phase::Failed))
        .await;

    // The last Events follow the last status patch, written in the background: at
    // least seven (attempt started ×3, attempt failed ×2, succeeded, failed; backing off
    // too when a status showed it).
    support::signals::events_done(&op.status.metrics, 7).await;
    // Parse what /metrics would serve (the scrape hooks run, as on a real scrape).
    let text = op.status.render_metrics();
    let m = Scrape::parse(&text).unwrap();
    let value = |name: &str, labels: &[(&str, &str)]| m.sum(name, labels);
    assert_eq!(
        value("gpujob_gpujobs", &[("phase", "Succeeded")]),
        1.0,
        "{text}"
    );
    assert_eq!(value("gpujob_gpujobs", &[("phase", "Failed")]), 1.0);
    assert_eq!(value("gpujob_gpujobs", &[("phase", "Running")]), 0.0);
    assert_eq!(value("gpujob_unconverged", &[]), 0.0);
    // One attempt for "ok", two for "bad" (maxRetries 1); both of "bad" failed.
    assert_eq!(value("gpujob_attempts_started_total", &[]), 3.0);
    assert_eq!(value("gpujob_attempts_failed_total", &[]), 2.0);
    // What the watches received: each GpuJob, each of the three Jobs and each of their
    // pods at least once (their status changes come again).
    assert!(value("gpujob_watch_objects_total", &[("resource", "gpujobs")]) >= 2.0);
    assert!(value("gpujob_watch_objects_total", &[("resource", "jobs")]) >= 3.0);
    assert!(value("gpujob_watch_objects_total", &[("resource", "pods")]) >= 3.0);
    // Every write went through the client: three Job creates and the Events (those
    // above), all 201s on POST. Counted once the answer is in, so read again until the
    // two agree (a backing-off Event may still be on its way): a write the client did
    // not count never lets them.
    let audited_events = || {
        env.cluster
            .audit()
            .all()
            .unwrap()
            .into_iter()
            .filter(|e| e.user_agent == TestEnv::agent("metrics") && e.namespace == env.ns)
            .filter(|e| e.resource == "events" && e.verb == "create" && e.code == 201)
            .count()
    };
    let posts = || {
        let m = Scrape::parse(&op.status.render_metrics()).unwrap();
        m.sum(
            "rest_client_requests_total",
            &[("code", "201"), ("method", "POST")],
        )
    };
    let events = wait::until(
        "every POST counted by the client (three Job creates and the Events)",
        support::WAIT,
        support::POLL,
        || {
            let events = audited_events();
            std::future::ready((posts() == (3 + events) as f64).then_some(events))
        },
    )
    .await
    .unwrap();
    assert!(events >= 5, "Events were recorded: {events}");
    assert!(
        value(
            "rest_client_requests_total",
            &[("code", "200"), ("method", "PATCH")]
        ) >= 4.0,
        "status patches"
    );
    assert!(
        value(
            "controller_runtime_reconcile_total",
            &[("result", "success")]
        ) >= 2.0
    );
    // (Whether a reconcile fell inside the 1 s backoff, counting "requeue_after",
    // depends on how fast the cluster reported the failure, so it is not asserted.)
    assert_eq!(value("controller_runtime_reconcile_errors_total", &[]), 0.0);
    assert!(value("workqueue_adds_total", &[]) >= 2.0);
    assert!(value("workqueue_work_duration_seconds_count", &[]) >= 2.0);
    assert_eq!(
        value("leader_election_master_status", &[("name", "gpujob")]),
        1.0,
        "alone, it leads"
    );
    assert!(value("rest_client_rate_limiter_duration_seconds_count", &[]) >= 3.0);
    op.stop().await;
}
