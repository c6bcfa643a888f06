//! The reference controller of `--compare`: GpuJobs run the way a careful kube-rs
//! operator is written. `Controller::new(gpujobs)` with its Jobs from a reflector
//! (`owns_stream`: one Job watch, whose store the reconcile reads), default watcher
//! configuration, kube's default client without a rate limit. Each reconcile creates the
//! first attempt's Job (the same Job the operator builds) only when neither its Job
//! cache nor the GpuJob's status shows it already (a create that still meets one answers
//! 409, which is fine), and patches the status only when it differs. Its own process, so
//! its memory and CPU are its own; it runs until killed, with the KUBECONFIG it is given,
//! and logs what failed (a reconcile, a watch) to stderr, which the load test keeps.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use gpujob_operator::api::{GpuJob, Phase};
use gpujob_operator::controller::job::{desired_job, job_name};
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;

struct Ctx {
    client: Client,
    jobs: Store<Job>,
}

async fn reconcile(gj: Arc<GpuJob>, ctx: Arc<Ctx>) -> Result<Action, kube::Error> {
    let ns = gj.namespace().unwrap_or_default();
    let name = job_name(&gj.name_any(), 1);
    let status = gj.status.clone().unwrap_or_default();
    let known = status.active_job.as_deref() == Some(name.as_str())
        || ctx.jobs.get(&ObjectRef::new(&name).within(&ns)).is_some();
    if !known {
        // Created running: a plain controller has no late-create protection to pay for.
        let mut job = desired_job(&gj, 1);
        if let Some(spec) = job.spec.as_mut() {
            spec.suspend = None;
        }
        let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), &ns);
        match jobs.create(&PostParams::default(), &job).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e),
        }
    }
    let wanted = (
        gj.metadata.generation,
        1,
        Some(Phase::Running),
        Some(name.clone()),
    );
    let current = (
        status.observed_generation,
        status.attempts,
        status.phase,
        status.active_job.clone(),
    );
    if current != wanted {
        let api: Api<GpuJob> = Api::namespaced(ctx.client.clone(), &ns);
        let patch = json!({"status": {
            "observedGeneration": wanted.0, "attempts": wanted.1,
            "phase": "Running", "activeJob": wanted.3,
        }});
        api.patch_status(
            &gj.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
    }
    Ok(Action::await_change())
}

fn error_policy(_: Arc<GpuJob>, _: &kube::Error, _: Arc<Ctx>) -> Action {
    Action::requeue(Duration::from_secs(5))
}

fn main() -> anyhow::Result<()> {
    gpujob_operator::client::install_crypto_provider();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(run())
}

async fn run() -> anyhow::Result<()> {
    // RUST_LOG as the load test sets it. On stderr, which the load test keeps (fmt's
    // default, stdout, it does not).
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    let client = Client::try_default().await?;
    let gpujobs: Api<GpuJob> = Api::all(client.clone());
    let (jobs, writer) = reflector::store();
    let job_events = watcher(Api::<Job>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .reflect(writer)
        .touched_objects();
    Controller::new(gpujobs, watcher::Config::default())
        .owns_stream(job_events)
        .run(reconcile, error_policy, Arc::new(Ctx { client, jobs }))
        .for_each(|result| async move {
            // What kube-runtime's examples log: a failed reconcile, a watch that broke.
            if let Err(e) = result {
                tracing::warn!("{e}");
            }
        })
        .await;
    Ok(())
}
