//! The first look at a gained shard's GpuJobs is made from the caches alone
//! (`Reach::Caches`), on no API budget. Against the real API server: that look sends no
//! request at all; where the plan needs the API server (a Job to create, a pod to let
//! go) it stops before the first request, and a worker's reconcile does the work; where
//! nothing is needed (a settled GpuJob, the most of a takeover), it ends there.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use crate::support;

use std::time::Duration;

use devcluster::wait;
use gpujob_operator::api::Phase;
use gpujob_operator::controller::plan::{JobState, job_state};
use gpujob_operator::controller::view::Outcome;
use gpujob_operator::controller::{Key, Looked};
use k8s_openapi::api::batch::v1::Job;
use serde_json::json;
use support::harness::Harness;
use support::{TestEnv, phase, sim_env};

/// GpuJob `gj`'s look from the caches, which must send no request.
async fn look_sending_nothing(h: &Harness) -> Looked {
    let before = h.requests_sent();
    let looked = h.look_from_caches("gj").await.unwrap();
    assert_eq!(
        h.requests_sent(),
        before,
        "a look from the caches sent a request ({looked:?})"
    );
    looked
}

#[tokio::test]
async fn a_look_from_the_caches_sends_nothing_and_stops_where_the_api_server_is_needed() {
    let env = TestEnv::new("from-caches").await;
    let mut h = Harness::new(&env, "from-caches", env.settings()).await;
    let vars = sim_env(&[("SIM_DURATION_SECONDS", "0.5")]);
    env.create("gj", json!({"image": "i", "gpus": 1, "env": vars}))
        .await;
    h.refresh(&env).await;

    // New: its Job is to be made. The look stops before the create.
    let before = h.requests_sent();
    assert_eq!(look_sending_nothing(&h).await, Looked::NeedsApi);
    assert!(
        env.jobs().get_opt("gj-1").await.unwrap().is_none(),
        "and made no Job"
    );
    // The look, the first in the namespace, was not offered the read of where this term
    // began (it makes no request): the next reconcile there is offered it, not a read of
    // its own GpuJob.
    let key = Key::new(&env.ns, "gj");
    let fence = h.ctx.writer.fence_for(&env.ns).unwrap();
    let mut next = h.ctx.view.snapshot(&key, &fence).unwrap();
    assert!(
        next.term_start_due,
        "the look kept the term-start read: the next reconcile is not offered it"
    );
    // Handed back, as a reconcile that does not make the read hands it back.
    assert!(
        h.ctx
            .view
            .record(&key, &fence, &mut next, vec![Outcome::TermStartDeclined])
    );

    // A worker's reconcile makes it (and sends: the counter counts).
    h.reconcile("gj").await.unwrap();
    assert!(
        h.requests_sent() > before,
        "the reconcile's requests are counted"
    );
    // Its pod waits at the gate: letting it go needs a pod read and a patch.
    wait::until(
        "the Job controller to make gj-1's pod",
        Duration::from_secs(30),
        Duration::from_millis(50),
        || async {
            let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
                kube::Api::namespaced(env.admin.clone(), &env.ns);
            let list = pods
                .list(&kube::api::ListParams::default().labels("job-name=gj-1"))
                .await
                .ok()?;
            (!list.items.is_empty()).then_some(())
        },
    )
    .await
    .unwrap();
    h.refresh(&env).await;
    assert_eq!(look_sending_nothing(&h).await, Looked::NeedsApi);

    // Run to the end; the status is written by a reconcile.
    h.release(&env, "gj", "gj-1").await;
    wait::until(
        "Job gj-1 to complete",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async {
            let job: Option<Job> = env.jobs().get_opt("gj-1").await.unwrap();
            job.is_some_and(|j| matches!(job_state(&j), JobState::Complete { .. }))
                .then_some(())
        },
    )
    .await
    .unwrap();
    h.refresh(&env).await;
    // Finished, not recorded: the status write is a request, so the look stops.
    assert_eq!(look_sending_nothing(&h).await, Looked::NeedsApi);
    h.reconcile("gj").await.unwrap();
    let gj = env.gpujobs().get("gj").await.unwrap();
    assert_eq!(phase(&gj), Some(Phase::Succeeded), "{:?}", gj.status);

    // Settled, and the caches show it: the look ends there, having sent nothing.
    h.refresh(&env).await;
    assert!(
        h.ctx.view.snapshot(&key, &fence).is_some(),
        "the GpuJob is cached: its look is not the one for a GpuJob gone"
    );
    let looked = look_sending_nothing(&h).await;
    assert!(matches!(looked, Looked::Ended(_)), "{looked:?}");
}
