//! The operator's own writes come back as watch events in any order. Here the order is
//! forced: reconcile runs with caches that lag its own writes (the Job event first, the
//! status write not yet seen; then the other way round), against the real API server.
//! Neither may cost a second status patch or a create conflict.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

mod support;

use gpujob_operator::api::GpuJob;
use gpujob_operator::controller::apply::Writer;
use gpujob_operator::controller::cache::JobIndex;
use gpujob_operator::controller::memory::WriteMemory;
use gpujob_operator::controller::{Context, Key, Next, reconcile};
use gpujob_operator::lease::Ownership;
use gpujob_operator::metrics::Metrics;
use gpujob_operator::quota::Provider;
use k8s_openapi::api::batch::v1::Job;
use kube::runtime::reflector::{self, store::Writer as StoreWriter};
use kube::runtime::watcher::Event;
use serde_json::json;
use support::{TestEnv, sim_env};
use tokio::sync::watch;

fn load<K: kube::Resource<DynamicType = ()> + Clone>(w: &mut StoreWriter<K>, objects: &[K]) {
    w.apply_watcher_event(&Event::Init);
    for o in objects {
        w.apply_watcher_event(&Event::InitApply(o.clone()));
    }
    w.apply_watcher_event(&Event::InitDone);
}

#[tokio::test]
async fn writes_echoed_out_of_order_cost_no_second_patch_and_no_conflict() {
    let env = TestEnv::new("echo").await;
    let identity = "echo";
    let config = env
        .cluster
        .config(devcluster::Identity::Replica(1))
        .await
        .unwrap();
    let client =
        gpujob_operator::client::build(config, identity, Default::default(), None, None).unwrap();
    let audit = env.cluster.audit();
    let agent = TestEnv::agent(identity);

    for order in ["job-event-first", "status-event-first"] {
        let name = format!("echo-{order}");
        let created = env
            .create(&name, json!({"image": "i", "gpus": 1, "env": sim_env(&[("SIM_DURATION_SECONDS", "300")])}))
            .await;
        let (store, mut store_writer) = reflector::store::<GpuJob>();
        load(&mut store_writer, std::slice::from_ref(&created));
        let jobs = JobIndex::default();
        jobs.apply(&Event::Init);
        jobs.apply(&Event::InitDone);
        let ctx = Context {
            client: client.clone(),
            gpujobs: store,
            jobs,
            memory: WriteMemory::default(),
            writer: Writer::new(
                client.clone(),
                watch::channel(Ownership::unfenced()).1,
                identity,
            ),
            quota: Provider::None,
            settings: env.settings(),
            metrics: Metrics::new(),
        };
        let key = Key::new(&env.ns, &name);

        let start = audit.cursor().unwrap();
        assert_eq!(reconcile(&ctx, &key).await.unwrap(), Next::Done);
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

        // Exactly one of the two echoes reaches the caches; the other lags.
        let job: Job = env.jobs().get(&format!("{name}-1")).await.unwrap();
        let fresh: GpuJob = env.gpujobs().get(&name).await.unwrap();
        if order == "job-event-first" {
            ctx.jobs.apply(&Event::Apply(job));
        } else {
            load(&mut store_writer, &[fresh]);
        }
        let again = audit.cursor().unwrap();
        for _ in 0..3 {
            assert_eq!(reconcile(&ctx, &key).await.unwrap(), Next::Done, "{order}");
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
