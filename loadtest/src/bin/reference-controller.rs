//! The reference controller of `--compare`: GpuJobs run the plain kube-runtime way
//! (`Controller::new(gpujobs).owns(jobs)`, default configuration, kube's default client
//! without a rate limit), as a stock operator would be written. Each reconcile creates
//! the first attempt's Job (the same Job the operator builds; an existing one answers
//! 409, which is fine) and patches the status when it differs. Its own process, so its
//! memory and CPU are its own; it runs until killed, with the KUBECONFIG it is given.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use gpujob_operator::api::{GpuJob, Phase};
use gpujob_operator::controller::job::{desired_job, job_name};
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::json;

async fn reconcile(gj: Arc<GpuJob>, client: Arc<Client>) -> Result<Action, kube::Error> {
    let ns = gj.namespace().unwrap_or_default();
    let jobs: Api<Job> = Api::namespaced((*client).clone(), &ns);
    // Created running: a stock controller has no late-create protection to pay for.
    let mut job = desired_job(&gj, 1);
    if let Some(spec) = job.spec.as_mut() {
        spec.suspend = None;
    }
    match jobs.create(&PostParams::default(), &job).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(e),
    }
    let status = gj.status.clone().unwrap_or_default();
    let wanted = (
        gj.metadata.generation,
        1,
        Some(Phase::Running),
        Some(job_name(&gj.name_any(), 1)),
    );
    let current = (
        status.observed_generation,
        status.attempts,
        status.phase,
        status.active_job.clone(),
    );
    if current != wanted {
        let api: Api<GpuJob> = Api::namespaced((*client).clone(), &ns);
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

fn error_policy(_: Arc<GpuJob>, _: &kube::Error, _: Arc<Client>) -> Action {
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
    let client = Client::try_default().await?;
    let gpujobs: Api<GpuJob> = Api::all(client.clone());
    let jobs: Api<Job> = Api::all(client.clone());
    Controller::new(gpujobs, watcher::Config::default())
        .owns(jobs, watcher::Config::default())
        .run(reconcile, error_policy, Arc::new(client))
        .for_each(|_| async {})
        .await;
    Ok(())
}
