//! The operator's own writes come back as watch events in any order. Here the order is
//! forced: reconcile runs with caches that lag its own writes (the Job event first, the
//! status write not yet seen; then the other way round), against the real API server.
//! Neither may cost a second status patch, a create conflict or a second Event.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use crate::support;

use gpujob_operator::api::GpuJob;
use gpujob_operator::controller::Next;
use gpujob_operator::controller::events::transitions;
use gpujob_operator::controller::plan::SCHEDULING_GRACE;
use gpujob_operator::controller::view::scope::Scope;
use k8s_openapi::api::batch::v1::Job;
use kube::runtime::watcher::Event;
use serde_json::json;
use support::harness::Harness;
use support::{TestEnv, sim_env};

#[tokio::test]
async fn writes_echoed_out_of_order_cost_no_second_patch_and_no_conflict() {
    let env = TestEnv::new("echo").await;
    let identity = "echo";
    let audit = env.cluster.audit();
    let agent = TestEnv::agent(identity);

    for order in ["job-event-first", "status-event-first"] {
        let name = format!("echo-{order}");
        let created = env
            .create(&name, json!({"image": "i", "gpus": 1, "env": sim_env(&[("SIM_DURATION_SECONDS", "300")])}))
            .await;
        let mut h = Harness::new(&env, identity, env.settings()).await;
        h.load_gpujobs(std::slice::from_ref(&created));

        let start = audit.cursor().unwrap();
        assert_eq!(h.reconcile(&name).await.unwrap(), Next::Done);
        let first: Vec<_> = audit
            .since(start)
            .unwrap()
            .into_iter()
            .filter(|e| e.user_agent == agent && e.resource != "events")
            .collect();
        assert_eq!(
            first.len(),
            2,
            "{order}: one Job create, one status patch: {first:#?}"
        );

        // Exactly one of the two echoes reaches the caches; the other lags. The Job as
        // its create's echo shows it: created suspended, before the Job controller
        // marks it so (that mark is what the start waits for, a write of its own).
        let mut job: Job = env.jobs().get(&format!("{name}-1")).await.unwrap();
        job.status = None;
        let fresh: GpuJob = env.gpujobs().get(&name).await.unwrap();
        // The first reconcile's Events are written in the background: let them land
        // before the writes of the next reconciles are counted.
        let published = transitions(&Default::default(), fresh.status.as_ref().unwrap()).len();
        assert!(
            published >= 1,
            "{order}: starting attempt 1 publishes an Event"
        );
        support::signals::events_done(&h.ctx.metrics, published as u64).await;
        if order == "job-event-first" {
            h.ctx.view.job_event(&Event::Apply(job), &Scope::All);
        } else {
            h.load_gpujobs(&[fresh]);
        }
        let again = audit.cursor().unwrap();
        for _ in 0..3 {
            // Done, or a look when the scheduler's grace for the attempt's pod ends
            // (its pod may not be running yet): a timer, not a write.
            let next = h.reconcile(&name).await.unwrap();
            assert!(
                next == Next::Done || matches!(next, Next::After(d) if d <= SCHEDULING_GRACE),
                "{order}: {next:?}"
            );
        }
        let writes: Vec<_> = audit
            .since(again)
            .unwrap()
            .into_iter()
            .filter(|e| e.user_agent == agent)
            .collect();
        assert!(
            writes.is_empty(),
            "{order}: a lagging cache cost writes: {writes:#?}"
        );
    }
}
