//! The write fence, deterministically, against the real API server: a write starts only
//! for a held shard, before that shard's deadline and within the term its reconcile
//! began in; anything else is refused before it leaves this process (the audit log shows
//! no request). Reads are never fenced.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use crate::support;

use std::collections::BTreeMap;
use std::time::Duration;

use devcluster::Identity;
use gpujob_operator::api::GpuJob;
use gpujob_operator::controller::error::Error;
use gpujob_operator::lease::{Ownership, Tenure};
use gpujob_operator::shard::shard_of;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;
use support::TestEnv;
use support::harness::Harness;
use tokio::sync::watch;
use tokio::time::Instant;

fn gpujob(name: &str) -> GpuJob {
    serde_json::from_value(json!({
        "apiVersion": "gpujob.dev/v1", "kind": "GpuJob",
        "metadata": {"name": name}, "spec": {"image": "i", "gpus": 1},
    }))
    .unwrap()
}

#[tokio::test]
async fn the_client_refuses_writes_outside_a_held_shards_tenure() {
    let env = TestEnv::new("fence-client").await;
    let other = env.cluster.create_namespace("fence-other").await.unwrap();
    // A shard count that puts the two namespaces on different shards.
    let shards = (2..64)
        .find(|n| shard_of(&env.ns, *n) != shard_of(&other, *n))
        .unwrap();
    // Held until `deadline`: far off while the writes before it are made (however slow
    // the machine), then moved close and waited for.
    let held_until = |deadline| Ownership {
        held: BTreeMap::from([(
            shard_of(&env.ns, shards),
            Tenure::gained(Some(deadline), None),
        )]),
        ..Ownership::nothing_of(shards)
    };
    let (own, rx) = watch::channel(held_until(Instant::now() + Duration::from_secs(3600)));
    let config = env.cluster.config(Identity::Admin).await.unwrap();
    let metrics = gpujob_operator::metrics::Metrics::new();
    let client = gpujob_operator::client::build(
        config,
        "fence",
        Default::default(),
        Some(metrics.clone()),
        Some(rx),
    )
    .unwrap();
    let audit = env.cluster.audit();
    let start = audit.cursor().unwrap();
    let mine: Api<GpuJob> = Api::namespaced(client.clone(), &env.ns);
    let theirs: Api<GpuJob> = Api::namespaced(client.clone(), &other);

    mine.create(&PostParams::default(), &gpujob("a"))
        .await
        .expect("a held shard, before its deadline");
    let refused = theirs.create(&PostParams::default(), &gpujob("b")).await;
    assert!(refused.is_err(), "a shard not held: {refused:?}");
    assert!(
        theirs.list(&ListParams::default()).await.is_ok(),
        "reads pass"
    );

    let deadline = Instant::now() + Duration::from_millis(50);
    own.send_replace(held_until(deadline));
    tokio::time::sleep_until(deadline).await;
    let late = mine.create(&PostParams::default(), &gpujob("c")).await;
    assert!(late.is_err(), "past the deadline: {late:?}");
    assert!(
        mine.list(&ListParams::default()).await.is_ok(),
        "reads pass"
    );

    let agent = TestEnv::agent("fence");
    let writes: Vec<String> = audit
        .since(start)
        .unwrap()
        .into_iter()
        .filter(|e| e.user_agent == agent && e.is_write())
        .map(|e| format!("{} {}/{}", e.verb, e.namespace, e.name))
        .collect();
    assert_eq!(
        writes,
        vec![format!("create {}/a", env.ns)],
        "refused writes never reach the API server"
    );
    // Nor are they counted as requests: `<error>` is a transport error, and pages.
    let sent = |code: &str| {
        metrics
            .rest_requests
            .with_label_values(&[code, "POST"])
            .get()
    };
    assert_eq!((sent("201"), sent("<error>")), (1, 0));
}

#[tokio::test]
async fn a_write_computed_in_an_ended_term_is_not_sent() {
    let env = TestEnv::new("fence-term").await;
    let h = Harness::new(&env, "fence-term", env.settings()).await;
    let gj = env.create("gj", json!({"image": "i", "gpus": 1})).await;
    let audit = env.cluster.audit();
    let start = audit.cursor().unwrap();
    let fence = h.ctx.writer.fence_for(&env.ns).unwrap();
    // Lost and regained meanwhile: held again, but in a new term.
    h.set_ownership(Ownership::unfenced());
    let status = gpujob_operator::api::GpuJobStatus {
        attempts: 7,
        ..Default::default()
    };
    let result = h.ctx.writer.patch_status(&fence, &gj, &status).await;
    assert!(matches!(result, Err(Error::NotLeader)), "{result:?}");
    let note = |text: &str| gpujob_operator::controller::events::Note {
        kind: gpujob_operator::controller::events::Kind::Normal,
        reason: "AttemptStarted",
        note: text.into(),
    };
    h.ctx
        .writer
        .publish(&fence, &gj, &[note("computed in the old term")]);
    // Events are written in the background, in order: once one of the new term is
    // written, one of the old term would have been too.
    let now = h.ctx.writer.fence_for(&env.ns).unwrap();
    h.ctx
        .writer
        .publish(&now, &gj, &[note("computed in the new term")]);
    let created = h.ctx.metrics.events.with_label_values(&["created"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while created.get() < 1 {
        assert!(
            Instant::now() < deadline,
            "the new term's Event was not written"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let agent = TestEnv::agent("fence-term");
    let writes: Vec<_> = audit
        .since(start)
        .unwrap()
        .into_iter()
        .filter(|e| e.user_agent == agent && e.is_write())
        .collect();
    assert_eq!(writes.len(), 1, "only the new term's Event: {writes:#?}");
    assert_eq!(writes[0].resource, "events", "{writes:#?}");
}

/// A renewal sent before the deadline can land after it (a paused process, a slow
/// answer) and keep the term: writes in between are refused, but the GpuJobs whose
/// reconciles they belonged to must not be dropped, since no hand-over (the term never
/// changed) and no event would bring them back before the periodic resync.
#[tokio::test]
async fn a_reconcile_refused_past_the_deadline_runs_again_when_its_term_is_renewed() {
    let env = TestEnv::new("fence-renewed").await;
    // Past its deadline from the start: every write is refused until the renewal.
    let held = BTreeMap::from([(0, Tenure::gained(Some(Instant::now()), None))]);
    let (own, rx) = watch::channel(Ownership {
        held,
        ..Ownership::nothing_of(1)
    });
    let config = env.cluster.config(Identity::Replica(1)).await.unwrap();
    let status = gpujob_operator::health::Status::new(gpujob_operator::metrics::Metrics::new());
    let client = gpujob_operator::client::build(
        config,
        "fence-renewed",
        Default::default(),
        Some(status.metrics.clone()),
        Some(rx.clone()),
    )
    .unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run_status = status.clone();
    let settings = env.settings();
    let operator = tokio::spawn(async move {
        gpujob_operator::controller::run(client.clone(), client, settings, rx, run_status, async {
            let _ = stopped.await;
        })
        .await
    });
    env.create("gj", json!({"image": "i", "gpus": 1})).await;

    let refused = status
        .metrics
        .reconcile_errors_by_kind
        .with_label_values(&["not_leader"]);
    let waited = Instant::now() + support::WAIT;
    while refused.get() < 1 {
        assert!(Instant::now() < waited, "no reconcile was refused");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let jobs = env.jobs().list(&ListParams::default()).await.unwrap();
    assert!(jobs.items.is_empty(), "a refused write made a Job");

    // Renewed: the same term (same epoch), a later deadline.
    own.send_modify(|o| {
        if let Some(t) = o.held.get_mut(&0) {
            t.deadline = Some(Instant::now() + Duration::from_secs(3600));
        }
    });
    env.wait_gpujob("gj", "its first attempt running", |g| {
        g.status.as_ref().is_some_and(|s| s.attempts == 1)
    })
    .await;
    let jobs = env.jobs().list(&ListParams::default()).await.unwrap();
    assert_eq!(jobs.items.len(), 1, "one Job for the attempt");

    let _ = stop.send(());
    operator.await.unwrap().unwrap();
}
