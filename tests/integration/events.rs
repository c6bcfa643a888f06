//! Events as a person on call reads them in `kubectl describe gj`, read back from the
//! real API server: each attempt's Events name that attempt, and only truly identical
//! Events are folded into one series.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use crate::support;

use gpujob_operator::api::Phase;
use gpujob_operator::controller::events::{Kind, Note};
use serde_json::json;
use support::harness::Harness;
use support::{TestEnv, phase, sim_env};

#[tokio::test]
async fn each_attempts_events_name_that_attempt() {
    let env = TestEnv::new("events-attempts").await;
    let op = env.operator("events-attempts", env.settings()).await;
    let vars = sim_env(&[("SIM_FAIL_ATTEMPTS", "2"), ("SIM_DURATION_SECONDS", "0.5")]);
    env.create("finetune", json!({"image": "i", "gpus": 1, "env": vars}))
        .await;
    env.wait_gpujob("finetune", "Succeeded", |g| {
        phase(g) == Some(Phase::Succeeded)
    })
    .await;
    let events = env
        .events_of("finetune", |events| {
            let n = |r: &str| events.iter().filter(|e| e.1 == r).count();
            n("AttemptStarted") >= 3 && n("AttemptFailed") >= 2
        })
        .await;
    let of = |reason: &str| -> Vec<(String, i32)> {
        events
            .iter()
            .filter(|e| e.1 == reason)
            .map(|e| (e.2.clone(), e.3))
            .collect()
    };
    assert_eq!(
        of("AttemptStarted"),
        vec![
            ("attempt 1 started (Job finetune-1)".to_owned(), 1),
            ("attempt 2 started (Job finetune-2)".to_owned(), 1),
            ("attempt 3 started (Job finetune-3)".to_owned(), 1),
        ],
        "{events:#?}"
    );
    let failed = of("AttemptFailed");
    assert_eq!(failed.len(), 2, "{events:#?}");
    assert!(failed[0].0.starts_with("attempt 1 failed"), "{failed:?}");
    assert!(failed[1].0.starts_with("attempt 2 failed"), "{failed:?}");
    op.stop().await;
}

#[tokio::test]
async fn only_identical_events_are_folded_into_one_series() {
    let env = TestEnv::new("events-series").await;
    let h = Harness::new(&env, "events-series", env.settings()).await;
    let gj = env.create("gj", json!({"image": "i", "gpus": 1})).await;
    let fence = h.ctx.writer.fence_for(&env.ns).unwrap();
    let note = |text: &str| Note {
        kind: Kind::Warning,
        reason: "QuotaRefused",
        note: text.to_owned(),
    };
    let notes = [
        note("InsufficientQuota: 8 GPUs requested, 2 free"),
        note("InsufficientQuota: 8 GPUs requested, 2 free"),
        note("InsufficientQuota: 8 GPUs requested, 0 free"),
        note("InsufficientQuota: 8 GPUs requested, 2 free"),
    ];
    h.ctx.writer.publish(&fence, &gj, &notes);
    // All four written (in order, by one task): three counted into one series.
    let written = |events: &[support::EventSeen]| events.iter().map(|e| e.3).sum::<i32>() >= 4;
    let events = env.events_of("gj", written).await;
    let seen: Vec<(&str, i32)> = events.iter().map(|e| (e.2.as_str(), e.3)).collect();
    assert_eq!(
        seen,
        vec![
            ("InsufficientQuota: 8 GPUs requested, 2 free", 3),
            ("InsufficientQuota: 8 GPUs requested, 0 free", 1),
        ],
        "{events:#?}"
    );
}
