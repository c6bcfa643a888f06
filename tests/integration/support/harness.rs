//! A reconcile driven by hand, against the real API server: a controller context whose
//! caches the test loads itself, so that their lag behind the operator's own writes (or
//! behind someone else's) is forced rather than hoped for.

use gpujob_operator::api::{GpuJob, LABEL_UID, SCHEDULING_GATE};
use gpujob_operator::controller::apply::Writer;
use gpujob_operator::controller::error::Error;
use gpujob_operator::controller::view::View;
use gpujob_operator::controller::view::scope::Scope;
use gpujob_operator::controller::{Context, Key, Looked, Next, Reach, Settings, reconcile};
use gpujob_operator::lease::Ownership;
use gpujob_operator::metrics::Metrics;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::runtime::watcher::Event;
use tokio::sync::watch;

use super::TestEnv;

pub struct Harness {
    pub ctx: Context,
    ns: String,
    own: watch::Sender<Ownership>,
}

impl Harness {
    /// Empty caches (listed, so "ready"); writes as user `replica-1` with a User-Agent
    /// naming `identity`, unfenced.
    pub async fn new(env: &TestEnv, identity: &str, settings: Settings) -> Harness {
        let config = env
            .cluster
            .config(devcluster::Identity::Replica(1))
            .await
            .unwrap();
        // Its client counts what it sends into the context's metrics; Events, written in
        // the background, go through a client of their own, uncounted.
        let metrics = Metrics::new();
        let client = gpujob_operator::client::build(
            config.clone(),
            identity,
            Default::default(),
            Some(metrics.clone()),
            None,
        )
        .unwrap();
        let events =
            gpujob_operator::client::build(config, identity, Default::default(), None, None)
                .unwrap();
        let view = View::default();
        view.job_event(&Event::Init, &Scope::All);
        view.job_event(&Event::InitDone, &Scope::All);
        let (own, rx) = watch::channel(Ownership::unfenced());
        let writer = Writer::new(
            client.clone(),
            events,
            rx,
            identity,
            settings.quota.clone(),
            metrics.events.clone(),
        );
        let mut h = Harness {
            ctx: Context {
                writer,
                reader: gpujob_operator::controller::apply::Reader::new(client.clone()),
                view,
                settings,
                metrics,
            },
            ns: env.ns.clone(),
            own,
        };
        h.load_gpujobs(&[]);
        h
    }

    /// What this context holds from now on.
    pub fn set_ownership(&self, own: Ownership) {
        self.own.send_replace(own);
    }

    /// The GpuJob cache holds exactly `objects` (a relist).
    pub fn load_gpujobs(&mut self, objects: &[GpuJob]) {
        self.ctx.view.gpujob_event(&Event::Init, &Scope::All);
        for o in objects {
            self.ctx
                .view
                .gpujob_event(&Event::InitApply(o.clone()), &Scope::All);
        }
        self.ctx.view.gpujob_event(&Event::InitDone, &Scope::All);
    }

    /// The Job cache holds exactly `jobs` (a relist).
    pub fn load_jobs(&self, jobs: &[Job]) {
        self.ctx.view.job_event(&Event::Init, &Scope::All);
        for j in jobs {
            self.ctx
                .view
                .job_event(&Event::InitApply(j.clone()), &Scope::All);
        }
        self.ctx.view.job_event(&Event::InitDone, &Scope::All);
    }

    /// The pod cache holds exactly `pods` (a relist).
    pub fn load_pods(&self, pods: &[Pod]) {
        self.ctx.view.pod_event(&Event::Init, &Scope::All);
        for p in pods {
            self.ctx
                .view
                .pod_event(&Event::InitApply(p.clone()), &Scope::All);
        }
        self.ctx.view.pod_event(&Event::InitDone, &Scope::All);
    }

    /// The caches catch up with the API server now.
    pub async fn refresh(&mut self, env: &TestEnv) {
        let gpujobs = env.gpujobs().list(&ListParams::default()).await.unwrap();
        self.load_gpujobs(&gpujobs.items);
        let jobs = env
            .jobs()
            .list(&ListParams::default().labels(LABEL_UID))
            .await
            .unwrap();
        self.load_jobs(&jobs.items);
        let pods: Api<Pod> = Api::namespaced(env.admin.clone(), &env.ns);
        let pods = pods
            .list(&ListParams::default().labels(LABEL_UID))
            .await
            .unwrap();
        self.load_pods(&pods.items);
    }

    pub async fn reconcile(&self, name: &str) -> Result<Next, Error> {
        match reconcile(&self.ctx, &Key::new(&self.ns, name), Reach::Api).await? {
            Looked::Ended(next) => Ok(next),
            Looked::NeedsApi => panic!("a reconcile that may ask the API server stopped short"),
        }
    }

    /// A first look from the caches alone, as at a shard's gain.
    pub async fn look_from_caches(&self, name: &str) -> Result<Looked, Error> {
        reconcile(&self.ctx, &Key::new(&self.ns, name), Reach::Caches).await
    }

    /// Requests this context's client has sent, of every verb (Events apart).
    pub fn requests_sent(&self) -> u64 {
        use prometheus::core::Collector;
        self.ctx
            .metrics
            .rest_requests
            .collect()
            .iter()
            .flat_map(|f| f.get_metric())
            .map(|m| m.get_counter().get_value() as u64)
            .sum()
    }

    /// Lets Job `job` of GpuJob `gpujob` run: once the Job controller has made its pod
    /// (waiting at the operator's scheduling gate), the caches catch up and a reconcile
    /// lets the pod go (this harness has no watch to bring the pod).
    pub async fn release(&mut self, env: &TestEnv, gpujob: &str, job: &str) {
        let pods: Api<Pod> = Api::namespaced(env.admin.clone(), &env.ns);
        let selector = format!("job-name={job}");
        devcluster::wait::until(
            &format!("the Job controller to make Job {job}'s pod"),
            std::time::Duration::from_secs(30),
            std::time::Duration::from_millis(50),
            || async {
                let list = pods
                    .list(&ListParams::default().labels(&selector))
                    .await
                    .ok()?;
                (!list.items.is_empty()).then_some(())
            },
        )
        .await
        .unwrap();
        self.refresh(env).await;
        self.reconcile(gpujob).await.unwrap();
        let list = pods
            .list(&ListParams::default().labels(&selector))
            .await
            .unwrap();
        let gated = list.items.iter().any(|p| {
            p.spec
                .as_ref()
                .and_then(|s| s.scheduling_gates.as_ref())
                .is_some_and(|g| g.iter().any(|g| g.name == SCHEDULING_GATE))
        });
        assert!(!gated, "{job}'s pod let go");
    }
}
