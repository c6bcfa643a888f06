//! One reconcile: observe → plan (pure) → execute (the only writer). When the executor
//! hears an answer from outside (the quota service, a refused Job), the plan is made
//! again with it, from the snapshot as the executor left it; nothing here decides or
//! writes.

use jiff::Timestamp;

use super::apply::{self, Answer, Executed};
use super::error::Error;
use super::observe::observe;
use super::plan::{Action, LivePod, Next, QuotaAnswer, Refusal, plan};
use super::{Context, Key};
use crate::quota::QuotaError;

/// A plan asks at most: a read that finds the GpuJob moved on, reserve, (a Job
/// refused), the pods, release; more means a planning bug, which must not loop.
const MAX_PLANS: usize = 7;

/// What the outside answered during one reconcile.
#[derive(Debug, Default)]
struct Heard {
    quota: Option<QuotaAnswer>,
    refused: Option<Refusal>,
    pods: Option<Vec<LivePod>>,
    /// A failed release, reported as this reconcile's error once recorded in status.
    release_error: Option<QuotaError>,
}

impl Heard {
    fn record(&mut self, answer: Answer) {
        match answer {
            Answer::Quota(a) => self.quota = Some(a),
            Answer::ReleaseFailed(e) => {
                self.quota = Some(QuotaAnswer::ReleaseFailed {
                    message: e.to_string(),
                });
                self.release_error = Some(e);
            }
            Answer::JobRefused(r) => self.refused = Some(r),
            Answer::Pods(p) => self.pods = Some(p),
            // Nothing heard from outside (the reconcile observes again).
            Answer::Moved => {}
        }
    }
}

/// Reconciles one GpuJob.
pub async fn reconcile(ctx: &Context, key: &Key) -> Result<Next, Error> {
    let fence = ctx.writer.fence_for(&key.namespace)?;
    let Some(mut snap) = observe(ctx, key, &fence).await? else {
        return Ok(Next::Done);
    };
    let now = Timestamp::now();
    let quota_required = ctx.writer.quota_enabled();
    let mut heard = Heard::default();
    for _ in 0..MAX_PLANS {
        let observed = snap.observed(
            quota_required,
            heard.quota.clone(),
            heard.refused.clone(),
            heard.pods.clone(),
            now,
        );
        let plan = plan(&observed, &ctx.settings.plan);
        tracing::debug!(
            rv = snap.gpujob.metadata.resource_version.as_deref().unwrap_or("-"),
            confirmed = snap.confirmed,
            jobs = ?snap.jobs.iter().map(|j| j.metadata.name.as_deref().unwrap_or("-")).collect::<Vec<_>>(),
            actions = ?plan.actions.iter().map(Action::name).collect::<Vec<_>>(),
            phase = ?plan.status.phase,
            next = ?plan.next,
            "planned"
        );
        match apply::execute(ctx, &fence, key, &mut snap, &plan).await? {
            Executed::Heard(Answer::Moved) => {
                // The rest of the snapshot (the Jobs above all) came from caches as far
                // behind as the GpuJob was: observe again, now from the current GpuJob
                // (the write memory holds it), so that a running attempt whose Job the
                // cache has not seen is looked up rather than taken for lost.
                let Some(again) = observe(ctx, key, &fence).await? else {
                    return Ok(Next::Done);
                };
                snap = again;
            }
            Executed::Heard(answer) => heard.record(answer),
            Executed::Gone => return Ok(Next::Done),
            Executed::Done => {
                tracing::Span::current().record("attempt", plan.status.attempts);
                return match heard.release_error {
                    Some(e) => Err(e.into()),
                    None => Ok(plan.next),
                };
            }
        }
    }
    Err(Error::Undecided { plans: MAX_PLANS })
}
