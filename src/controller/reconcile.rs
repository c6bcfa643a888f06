//! One reconcile: a snapshot from the view → plan (pure) → execute (the only writer)
//! → the view records what the writes did. When the executor hears an answer from
//! outside (the quota service, a refused Job) or the plan asks for a read (a confirming
//! read of the GpuJob, its pods), the plan is made again with it, from the snapshot as
//! the view now has it; nothing here decides or writes.

use jiff::Timestamp;
use tracing::info;

use super::apply::{self, Answer, End, Read};
use super::error::Error;
use super::plan::{Action, Next, QuotaAnswer, Refusal, plan};
use super::seen_pod::SeenPod;
use super::view::Confirmed;
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
    pods: Option<Vec<SeenPod>>,
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
            Answer::Refused(r) => self.refused = Some(r),
        }
    }
}

/// What comes after a plan that did not run to its end.
#[derive(Debug, PartialEq, Eq)]
enum Then {
    /// Plan again, with what was heard.
    Plan,
    /// Take a new snapshot, then plan again.
    Observe,
}

/// Reconciles one GpuJob.
pub async fn reconcile(ctx: &Context, key: &Key) -> Result<Next, Error> {
    let fence = ctx.writer.fence_for(&key.namespace)?;
    let Some(mut snap) = ctx.view.snapshot(key, &fence).await? else {
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
            jobs = ?snap.jobs.iter().map(|j| j.name.as_str()).collect::<Vec<_>>(),
            actions = ?plan.actions.iter().map(super::plan::Action::name).collect::<Vec<_>>(),
            phase = ?plan.status.phase,
            next = ?plan.next,
            "planned"
        );
        // The plan's actions, from `from` on: a confirming read that finds the view
        // current lets the same plan go on. The snapshot is then confirmed, so the
        // executor passes over any later confirm of this plan: this loop ends.
        let mut from = 0;
        let then = loop {
            let actions = &plan.actions[from..];
            let run = apply::execute(ctx, &fence, key, &snap, actions, &plan.status).await;
            // The pods as read are no longer as they are once this run wrote one.
            if actions.iter().any(Action::writes_pods) {
                heard.pods = None;
            }
            ctx.view.record(key, &fence, &mut snap, run.outcomes);
            match run.end? {
                End::Read(Read::Confirm { resume }) => {
                    match ctx.view.confirm(key, &fence, &mut snap).await? {
                        Confirmed::Current => from += resume,
                        Confirmed::Moved => break Then::Observe,
                        Confirmed::Gone => {
                            info!(
                                "the GpuJob is gone (read from the API server); nothing is done for it"
                            );
                            return Ok(Next::Done);
                        }
                    }
                }
                End::Read(Read::Pods) => {
                    heard.pods = Some(ctx.view.read_pods(key, &snap).await?);
                    break Then::Plan;
                }
                End::Heard(answer) => {
                    heard.record(answer);
                    break Then::Plan;
                }
                End::Done => {
                    tracing::Span::current().record("attempt", plan.status.attempts);
                    return match heard.release_error {
                        Some(e) => Err(e.into()),
                        None => Ok(plan.next),
                    };
                }
            }
        };
        if then == Then::Observe {
            // The rest of the snapshot (the Jobs above all) came from caches as far
            // behind as the GpuJob was: observe again, now from the current GpuJob
            // (the view remembers it), so that a running attempt whose Job the
            // cache has not seen is looked up rather than taken for lost.
            let Some(again) = ctx.view.snapshot(key, &fence).await? else {
                return Ok(Next::Done);
            };
            snap = again;
        }
    }
    Err(Error::Undecided { plans: MAX_PLANS })
}
