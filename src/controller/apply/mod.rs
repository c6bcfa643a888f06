//! The executor: the only place that reads or writes the API server or calls the
//! outside world for a reconcile. It carries out a plan's actions in order: reads
//! (`reads.rs`: a confirming read of the GpuJob, its pods, where the shard's term began,
//! the plan's other [`Read`]s) and writes, each fenced (`writes.rs`: nothing starts
//! unless the reconcile's shard is still held in the same term, before its deadline),
//! writes the status at the end when it changed (a plan may also ask for a status write
//! earlier, before a step that must find it recorded) and publishes the Events its
//! transitions deserve (`recorder.rs`). Nothing here decides. It returns what the view
//! must remember ([`Outcome`]s: writes accepted, what reads found), what the next plan
//! must hear ([`Answer`]s: quota, a refused Job, reads), and how the run ended.

mod jobs;
mod quota;
mod reads;
mod recorder;
mod writes;

use std::sync::Arc;

use tracing::{info, warn};

use super::error::Error;
use super::events::transitions;
use super::plan::{Action, FinalizerRemoval, Found, QuotaAnswer, Read, Refusal};
use super::seen_pod::SeenPod;
use super::view::{Outcome, Snapshot};
use super::{Context, Fence, Key};
use crate::api::{FINALIZER_QUOTA, GpuJob, GpuJobStatus};
use crate::quota::QuotaError;
pub use reads::Reader;
pub use writes::{Created, PodRef, Writer};

/// What a run of the executor did: what the view must remember (also of the actions
/// before a failure), what the next plan must hear, and how it ended.
#[derive(Debug)]
pub struct Run {
    pub outcomes: Vec<Outcome>,
    pub answers: Vec<Answer>,
    pub end: Result<End, Error>,
}

/// How far the actions got.
#[derive(Debug, PartialEq, Eq)]
pub enum End {
    /// Every action ran and the status is written (if it changed).
    Done,
    /// The plan ended with a question, answered ([`Run::answers`], or a read the view
    /// took: the GpuJob moved on, the term's start); nothing after it ran. Plan again.
    Asked,
    /// A confirming read found the GpuJob gone (or replaced by a new one of its name).
    Gone,
}

/// An answer from outside the plan, for the next plan of the reconcile.
#[derive(Debug)]
pub enum Answer {
    Quota(QuotaAnswer),
    /// The release failed; the error is reported once the failure is recorded.
    ReleaseFailed(QuotaError),
    /// A Job create, or a multi-node attempt's Service, refused: plan again with it.
    Refused(Refusal),
    /// The GpuJob's pods, read from the API server ([`Action::ReadPods`]).
    Pods(Vec<SeenPod>),
    /// What one of the plan's [`Read`]s found.
    Found(Read, Found),
}

/// Whether [`execute`] would send nothing for this plan: no action, and the status as the
/// snapshot's GpuJob has it (`write_status` writes only a change).
pub fn sends_nothing(snap: &Snapshot, actions: &[Action], status: &GpuJobStatus) -> bool {
    actions.is_empty() && status_as_written(&snap.gpujob, status)
}

/// Whether `gpujob` already has `status` (none counts as the default): then no status
/// patch is sent.
fn status_as_written(gpujob: &GpuJob, status: &GpuJobStatus) -> bool {
    gpujob
        .status
        .as_ref()
        .map_or(*status == GpuJobStatus::default(), |s| s == status)
}

/// What a run that did not read where the term began says of it, when `snap` was offered
/// that read: declined, so that the view offers it to the next reconcile of the
/// namespace at once, not after the offer times out.
fn unread_term_start(snap: &Snapshot) -> Option<Outcome> {
    snap.term_start_due.then_some(Outcome::TermStartDeclined)
}

/// Carries out `actions` for the GpuJob `key` in the term `fence`, from the view in
/// `snap`, then writes `status` (when every action ran). Each write is made from the
/// GpuJob as the one before it left it.
pub async fn execute(
    ctx: &Context,
    fence: &Fence,
    key: &Key,
    snap: &Snapshot,
    actions: &[Action],
    status: &GpuJobStatus,
) -> Run {
    let mut ex = Execution {
        ctx,
        fence,
        gpujob: snap.gpujob.clone(),
        confirmed: snap.confirmed,
        outcomes: Vec::new(),
        answers: Vec::new(),
        gpujob_refused: false,
        snap,
    };
    let mut end = ex.run(key, actions, status).await;
    if ex.gpujob_refused {
        // The GpuJob changed since this view of it (409): read it, so that the retry
        // plans from its current version instead of the same lagging cache.
        if let Err(read) = ex.confirm(key).await {
            end = Err(read);
        }
    }
    let read_term_start = ex
        .outcomes
        .iter()
        .any(|o| matches!(o, Outcome::TermStart { .. }));
    if !read_term_start {
        ex.outcomes.extend(unread_term_start(snap));
    }
    Run {
        outcomes: ex.outcomes,
        answers: ex.answers,
        end,
    }
}

/// One run: the GpuJob as its last write left it, and what the run found and did.
struct Execution<'a> {
    ctx: &'a Context,
    fence: &'a Fence,
    gpujob: Arc<GpuJob>,
    /// The snapshot's view was current in this term, or this run has since written or
    /// read the GpuJob (the view records either so: `View::record`).
    confirmed: bool,
    outcomes: Vec<Outcome>,
    answers: Vec<Answer>,
    /// A write of the GpuJob was refused because it changed since `gpujob` (409).
    gpujob_refused: bool,
    /// The view the plan was made from: which of the GpuJob's Jobs MultiKueue
    /// dispatched, and its pods cached on worker clusters (`read_pods`).
    snap: &'a Snapshot,
}

impl Execution<'_> {
    async fn run(
        &mut self,
        key: &Key,
        actions: &[Action],
        status: &GpuJobStatus,
    ) -> Result<End, Error> {
        let w = &self.ctx.writer;
        let fence = self.fence;
        for (i, action) in actions.iter().enumerate() {
            match action {
                Action::RecordStatus(status) => self.write_status(status).await?,
                Action::AddFinalizer => {
                    let updated = w.set_finalizer(fence, &self.gpujob, true).await;
                    let updated = self.refused_if_conflict(updated)?;
                    self.written(updated);
                }
                Action::RemoveFinalizer(why) => {
                    match why {
                        FinalizerRemoval::Released => {}
                        FinalizerRemoval::QuotaDisabled => warn!(
                            "quota is disabled but the GpuJob still holds {FINALIZER_QUOTA}; removing it (any reservation is abandoned)"
                        ),
                        FinalizerRemoval::ReleaseSkipped => warn!(
                            reservation = self
                                .gpujob
                                .status
                                .as_ref()
                                .and_then(|s| s.reservation_id.as_deref())
                                .unwrap_or("-"),
                            "deletion allowed without releasing GPU quota (annotation); the reservation is abandoned"
                        ),
                    }
                    let updated = w.set_finalizer(fence, &self.gpujob, false).await;
                    let updated = self.refused_if_conflict(updated)?;
                    self.written(updated);
                }
                Action::Confirm => {
                    if self.confirmed {
                        // Known current in this term (read, or written by this replica
                        // with a resourceVersion precondition).
                        continue;
                    }
                    if let Some(end) = self.confirm(key).await? {
                        return Ok(end);
                    }
                }
                Action::ReadTermStart => {
                    self.read_term_start(key).await?;
                    return Ok(End::Asked);
                }
                Action::Read(read) => {
                    self.read(key, read).await?;
                    // The plan's reads come together; the next plan hears them all.
                    if !matches!(actions.get(i + 1), Some(Action::Read(_))) {
                        return Ok(End::Asked);
                    }
                }
                Action::Reserve(req, sequence) => return self.reserve(req, *sequence).await,
                Action::Release(sequence) => return self.release(*sequence).await,
                Action::ReadPods { workers } => {
                    self.read_pods(key, *workers).await?;
                    return Ok(End::Asked);
                }
                Action::CreateJob { attempt, job } => {
                    if let Some(refusal) = self.create_job(*attempt, job).await? {
                        return Ok(self.heard(Answer::Refused(refusal)));
                    }
                }
                Action::CreateService { attempt, service } => {
                    if let Some(refusal) = self.create_service(*attempt, service).await? {
                        return Ok(self.heard(Answer::Refused(refusal)));
                    }
                }
                Action::CreatePodGroup { attempt, group } => {
                    if let Some(refusal) = self.create_pod_group(*attempt, group).await? {
                        return Ok(self.heard(Answer::Refused(refusal)));
                    }
                }
                Action::CreateClaimTemplate { attempt, template } => {
                    if let Some(refusal) = self.create_claim_template(*attempt, template).await? {
                        return Ok(self.heard(Answer::Refused(refusal)));
                    }
                }
                Action::UngatePod {
                    name,
                    uid,
                    resource_version,
                    cluster,
                } => {
                    let pod = PodRef::new(name, uid, resource_version, cluster);
                    self.ungate_pod(key, &pod).await?
                }
                Action::DeletePod {
                    name,
                    uid,
                    resource_version,
                    cluster,
                } => {
                    let pod = PodRef::new(name, uid, resource_version, cluster);
                    self.delete_pod(key, &pod).await?
                }
                Action::GateJob {
                    name,
                    resource_version,
                    queue,
                } => self.gate_job(key, name, resource_version, queue).await?,
                Action::DeleteJob {
                    name,
                    uid,
                    resource_version,
                    why,
                } => {
                    self.delete_job(key, name, uid, resource_version, *why)
                        .await?
                }
                Action::DeleteGpuJob {
                    uid,
                    resource_version,
                } => {
                    let deleted = w
                        .delete_gpujob(fence, &self.gpujob, uid, resource_version)
                        .await;
                    self.refused_if_conflict(deleted)?;
                    info!("deleted: finished, and its time to live after finishing is over");
                    return Ok(End::Done);
                }
                Action::Publish(note) => {
                    w.publish(fence, &self.gpujob, std::slice::from_ref(note));
                }
            }
        }
        self.write_status(status).await?;
        Ok(End::Done)
    }

    /// The plan ends with `answer`.
    fn heard(&mut self, answer: Answer) -> End {
        self.answers.push(answer);
        End::Asked
    }

    /// One status patch from the GpuJob as last seen to `status` (nothing when equal),
    /// then its Events.
    async fn write_status(&mut self, status: &GpuJobStatus) -> Result<(), Error> {
        if status_as_written(&self.gpujob, status) {
            return Ok(());
        }
        let current = self.gpujob.status.clone().unwrap_or_default();
        let written = self
            .ctx
            .writer
            .patch_status(self.fence, &self.gpujob, status)
            .await;
        let written = self.refused_if_conflict(written)?;
        if status.phase != current.phase {
            let phase = status.phase.map_or("-".to_owned(), |p| format!("{p:?}"));
            info!(
                phase,
                attempts = status.attempts,
                failures = status.failures,
                "phase changed"
            );
        }
        let newly_failed = status.failures - current.failures;
        if newly_failed > 0 {
            self.ctx
                .metrics
                .attempts_failed
                .inc_by(u64::try_from(newly_failed).unwrap_or(0));
        }
        let uncounted = status.last_failure.as_ref().is_some_and(|f| {
            !f.counted
                && current
                    .last_failure
                    .as_ref()
                    .is_none_or(|b| b.attempt < f.attempt)
        });
        if uncounted {
            self.ctx.metrics.attempts_uncounted.inc();
        }
        self.written(written);
        // Only transitions this term recorded: the write went through.
        self.ctx
            .writer
            .publish_recorded(&self.gpujob, &transitions(&current, status));
        Ok(())
    }

    /// The result of a write of the GpuJob: a conflict is remembered, so the run ends
    /// with a read of the GpuJob ([`execute`]).
    fn refused_if_conflict<T>(&mut self, written: Result<T, Error>) -> Result<T, Error> {
        if matches!(written, Err(Error::Conflict { .. })) {
            self.gpujob_refused = true;
        }
        written
    }

    /// The next write starts from a GpuJob this run just wrote; the view remembers it.
    fn written(&mut self, written: GpuJob) {
        let written = Arc::new(written);
        let replaced = self
            .gpujob
            .metadata
            .resource_version
            .clone()
            .unwrap_or_default();
        self.gpujob = written.clone();
        self.confirmed = true;
        self.outcomes
            .push(Outcome::GpuJobWritten { replaced, written });
    }
}
