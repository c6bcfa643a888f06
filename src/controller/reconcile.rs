//! One reconcile: a snapshot from the view → plan (pure) → execute (the only reader and
//! writer) → the view records what the run wrote and read. When the plan ended with a
//! question (a read, the quota service, a Job create the API server may refuse), the
//! executor's answer goes to the next plan, made from the snapshot as the view now has
//! it; nothing here decides, reads or writes.

use jiff::Timestamp;
use tracing::info;

use super::apply::{self, Answer, End};
use super::error::Error;
use super::plan::{
    Action, Found, MAX_PLANS, Next, NodeHealth, Observed, QueueWait, QuotaAnswer, Reads, Refusal,
    Termination, Unschedulable, plan,
};
use super::seen_pod::SeenPod;
use super::view::Snapshot;
use super::{Context, Key};
use crate::quota::QuotaError;

/// What the outside answered during one reconcile.
#[derive(Debug, Default)]
struct Heard {
    quota: Option<QuotaAnswer>,
    refused: Option<Refusal>,
    pods: Option<Vec<SeenPod>>,
    termination: Option<Termination>,
    unschedulable: Option<Unschedulable>,
    queue_wait: Option<QueueWait>,
    /// Pods a placement read found: a pod waiting at the gate there is as good a hint as
    /// the pod cache's (which may have missed it). The read comes only once the cache
    /// shows a pod unschedulable, so this seldom finds one; a gated pod the cache lags
    /// on queues its GpuJob when the pod watch delivers it.
    placed: Vec<SeenPod>,
    /// The Nodes read: those a pod of the GpuJob is being deleted on.
    nodes: Vec<NodeHealth>,
    reads: Reads,
    /// A failed release, reported as this reconcile's error once recorded in status.
    release_error: Option<QuotaError>,
}

impl Heard {
    fn record(&mut self, answer: Answer) {
        match answer {
            Answer::Quota(a) => self.quota = Some(a),
            Answer::ReleaseFailed(e) => {
                self.quota = Some(QuotaAnswer::ReleaseFailed {
                    message: e.summary(),
                });
                self.release_error = Some(e);
            }
            Answer::Refused(r) => self.refused = Some(r),
            Answer::Pods(pods) => self.pods = Some(pods),
            Answer::Found(read, found) => {
                self.reads.record(read, &found);
                match found {
                    // The Reads keep what these found.
                    Found::Job { .. } | Found::Devices { .. } | Found::ClaimTemplate { .. } => {}
                    Found::Termination { termination, .. } => self.termination = termination,
                    Found::Placement {
                        unschedulable,
                        pods,
                        ..
                    } => {
                        self.unschedulable = unschedulable;
                        self.placed.extend(pods);
                    }
                    Found::Workload(wait) => self.queue_wait = Some(wait),
                    Found::Node(node) => self.nodes.push(node),
                }
            }
        }
    }

    /// What the plan sees: `snap`, with what was heard so far.
    fn observed<'s>(
        &'s self,
        snap: &'s Snapshot,
        quota_required: bool,
        now: Timestamp,
    ) -> Observed<'s> {
        Observed {
            gpujob: &snap.gpujob,
            jobs: snap.jobs.iter().map(AsRef::as_ref).collect(),
            termination: self.termination.clone(),
            unschedulable: self.unschedulable.clone(),
            queue_wait: self.queue_wait.clone(),
            refused: self.refused.clone(),
            quota_required,
            quota: self.quota.clone(),
            pods: self.pods.clone(),
            cached_pods: snap
                .cached_pods
                .iter()
                .map(AsRef::as_ref)
                .chain(&self.placed)
                .collect(),
            confirmed: snap.confirmed,
            term_start_due: snap.term_start_due,
            reads: self.reads.clone(),
            nodes: self.nodes.clone(),
            now,
        }
    }
}

/// How far a reconcile may go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// As far as its plans ask: reads, writes, the quota service.
    Api,
    /// Only as far as the caches answer: it stops before its first request. The first
    /// look at a gained shard's GpuJobs goes so, all at once and on no budget; those
    /// that need the API server go to a worker (`runner/first_look.rs`).
    Caches,
}

/// How a reconcile ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Looked {
    /// To an outcome: what comes next.
    Ended(Next),
    /// Stopped before its first request ([`Reach::Caches`] only): nothing was sent or
    /// recorded (such a look is never offered the term-start read:
    /// [`View::snapshot_from_caches`]).
    ///
    /// [`View::snapshot_from_caches`]: crate::controller::view::View::snapshot_from_caches
    NeedsApi,
}

/// Reconciles one GpuJob: at most [`MAX_PLANS`] plans (why that bounds it: there).
pub async fn reconcile(ctx: &Context, key: &Key, reach: Reach) -> Result<Looked, Error> {
    let fence = ctx.writer.fence_for(&key.namespace)?;
    let snap = match reach {
        Reach::Api => ctx.view.snapshot(key, &fence),
        Reach::Caches => ctx.view.snapshot_from_caches(key, &fence),
    };
    let Some(mut snap) = snap else {
        return Ok(Looked::Ended(Next::Done));
    };
    let now = Timestamp::now();
    let quota_required = ctx.writer.quota_enabled();
    let mut heard = Heard::default();
    for _ in 0..MAX_PLANS {
        let plan = plan(
            &heard.observed(&snap, quota_required, now),
            &ctx.settings.plan,
        );
        tracing::debug!(
            rv = snap.gpujob.metadata.resource_version.as_deref().unwrap_or("-"),
            confirmed = snap.confirmed,
            jobs = ?snap.jobs.iter().map(|j| j.name.as_str()).collect::<Vec<_>>(),
            actions = ?plan.actions.iter().map(Action::name).collect::<Vec<_>>(),
            phase = ?plan.status.phase,
            next = ?plan.next,
            "planned"
        );
        if reach == Reach::Caches && !apply::sends_nothing(&snap, &plan.actions, &plan.status) {
            return Ok(Looked::NeedsApi);
        }
        let run = apply::execute(ctx, &fence, key, &snap, &plan.actions, &plan.status).await;
        // The pods as read are no longer as they are once this run wrote one.
        if plan.actions.iter().any(Action::writes_pods) {
            heard.pods = None;
        }
        for answer in run.answers {
            heard.record(answer);
        }
        if !ctx.view.record(key, &fence, &mut snap, run.outcomes) {
            info!("the GpuJob is gone (read from the API server); nothing is done for it");
            return Ok(Looked::Ended(Next::Done));
        }
        match run.end? {
            End::Asked => {}
            End::Gone => return Ok(Looked::Ended(Next::Done)),
            End::Done => {
                tracing::Span::current().record("attempt", plan.status.attempts);
                return match heard.release_error {
                    Some(e) => Err(e.into()),
                    None => Ok(Looked::Ended(plan.next)),
                };
            }
        }
    }
    Err(Error::Undecided { plans: MAX_PLANS })
}
