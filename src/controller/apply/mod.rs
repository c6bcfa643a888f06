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

mod reads;
mod recorder;
mod writes;

use std::sync::Arc;

use tracing::{info, warn};

use super::error::Error;
use super::events::transitions;
use super::plan::{
    Action, FinalizerRemoval, Found, FoundJob, INVALID_SPEC, JOB_NAME_CONFLICT, JobDeletion,
    OLD_ATTEMPT_STOPPING, QuotaAnswer, Read, Refusal, SERVICE_NAME_CONFLICT,
};
use super::seen_pod::SeenPod;
use super::view::{Outcome, Snapshot};
use super::{Context, Fence, Key};
use crate::api::{FINALIZER_QUOTA, GpuJob, GpuJobStatus};
use crate::failpoint;
use crate::quota::{QuotaError, Reserve};
pub use reads::Reader;
pub use writes::{Created, Writer};

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
    };
    let end = ex.run(key, actions, status).await;
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
                    let updated = w.set_finalizer(fence, &self.gpujob, true).await?;
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
                    let updated = w.set_finalizer(fence, &self.gpujob, false).await?;
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
                    w.check(fence)?;
                    let start = self
                        .ctx
                        .reader
                        .term_start(&key.namespace, fence.shard)
                        .await;
                    self.outcomes.push(Outcome::TermStart { start });
                    return Ok(End::Asked);
                }
                Action::Read(read) => {
                    self.read(key, read).await?;
                    // The plan's reads come together; the next plan hears them all.
                    if !matches!(actions.get(i + 1), Some(Action::Read(_))) {
                        return Ok(End::Asked);
                    }
                }
                Action::Reserve(req, sequence) => {
                    failpoint::hit("before-reserve");
                    return Ok(self.heard(Answer::Quota(
                        match w.reserve(fence, req, *sequence).await? {
                            Reserve::Granted { id, gpus } => {
                                failpoint::hit("after-reserve");
                                if let Some(held) = gpus.filter(|g| *g != req.gpus) {
                                    // The contract's grant holds what was asked; the
                                    // request is what is recorded (a count taken from a
                                    // service that disagrees would release and reserve
                                    // again and again).
                                    warn!(reservation = %id, asked = req.gpus, held, "the quota service granted a reservation of another size than asked; recording what was asked");
                                }
                                info!(reservation = %id, gpus = req.gpus, "GPU quota reserved");
                                QuotaAnswer::Reserved { id, gpus: req.gpus }
                            }
                            Reserve::Refused { reason, message } => {
                                self.ctx.metrics.quota_refusals.inc();
                                info!(reason = %reason, "GPU quota refused: {message}; asking again with backoff");
                                QuotaAnswer::Refused { reason, message }
                            }
                        },
                    )));
                }
                Action::Release(sequence) => {
                    let uid = self.gpujob.metadata.uid.clone().unwrap_or_default();
                    let reservation = self
                        .gpujob
                        .status
                        .as_ref()
                        .and_then(|s| s.reservation_id.clone());
                    return match w.release(fence, &uid, *sequence).await {
                        Ok(()) => {
                            failpoint::hit("after-release");
                            info!(
                                reservation = reservation.as_deref().unwrap_or("-"),
                                "GPU quota released"
                            );
                            Ok(self.heard(Answer::Quota(QuotaAnswer::Released)))
                        }
                        Err(Error::Quota(e)) => {
                            warn!(
                                reservation = reservation.as_deref().unwrap_or("-"),
                                "releasing GPU quota failed: {e}; retrying with backoff"
                            );
                            Ok(self.heard(Answer::ReleaseFailed(e)))
                        }
                        Err(e) => Err(e),
                    };
                }
                Action::ReadPods => {
                    w.check(fence)?;
                    let uid = self.gpujob.metadata.uid.as_deref().unwrap_or_default();
                    let pods = self.ctx.reader.pods(&key.namespace, uid).await?;
                    return Ok(self.heard(Answer::Pods(pods)));
                }
                Action::CreateJob { attempt, job } => {
                    if let Some(refusal) = self.create_job(*attempt, job).await? {
                        return Ok(self.heard(Answer::Refused(refusal)));
                    }
                }
                Action::CreateService { attempt, service } => {
                    let name = service.metadata.name.as_deref().unwrap_or_default();
                    if let Some(message) = w.create_service(fence, service).await? {
                        warn!(attempt, "{message}; looking again in a while");
                        return Ok(self.heard(Answer::Refused(Refusal {
                            attempt: *attempt,
                            reason: SERVICE_NAME_CONFLICT,
                            message,
                        })));
                    }
                    info!(
                        attempt,
                        service = name,
                        "the multi-node attempt's headless Service exists (created now or before)"
                    );
                }
                Action::UngatePod {
                    name,
                    uid,
                    resource_version,
                } => {
                    w.ungate_pod(fence, &key.namespace, name, resource_version)
                        .await?;
                    failpoint::hit("after-ungate");
                    self.ctx.metrics.pods_ungated.inc();
                    info!(pod = %name, pod_uid = %uid, "let the current attempt's pod go (removed the scheduling gate)");
                    self.outcomes.push(Outcome::PodUngated { uid: uid.clone() });
                }
                Action::DeletePod {
                    name,
                    uid,
                    resource_version,
                } => {
                    w.delete_pod(fence, &key.namespace, name, uid, resource_version)
                        .await?;
                    warn!(pod = %name, "deleted a pod that waited at the scheduling gate and is not the current attempt's (it never ran)");
                }
                Action::GateJob {
                    name,
                    resource_version,
                    queue,
                } => {
                    let gated = w
                        .gate_job(
                            fence,
                            &key.namespace,
                            name,
                            resource_version,
                            queue.as_deref(),
                        )
                        .await;
                    self.job_write(name, gated)?;
                    match queue {
                        Some(queue) => info!(
                            job = %name,
                            queue = %queue,
                            "a Job an earlier version created suspended got the scheduling gate and its Kueue LocalQueue; Kueue starts it on admission"
                        ),
                        None => info!(
                            job = %name,
                            "a Job an earlier version created suspended got the scheduling gate and was started"
                        ),
                    }
                    self.outcomes.push(Outcome::JobGated {
                        name: name.clone(),
                        replaced: resource_version.clone(),
                        queue: queue.clone(),
                    });
                }
                Action::DeleteJob {
                    name,
                    uid,
                    resource_version,
                    why,
                } => {
                    let foreground = why.foreground();
                    let deleted = w
                        .delete_job(
                            fence,
                            &key.namespace,
                            name,
                            uid,
                            resource_version,
                            foreground,
                        )
                        .await;
                    self.job_write(name, deleted)?;
                    match why {
                        JobDeletion::Replaced => {
                            info!(job = %name, "deleting the running attempt's Job to replace it (spec changed)")
                        }
                        JobDeletion::Suspended => {
                            info!(job = %name, "deleting the running attempt's Job to stop it (suspended)")
                        }
                        JobDeletion::Stray => {
                            warn!(job = %name, "deleting a Job that is not the current attempt's and has not finished (attempts run one at a time; a create delivered late can bring one back); no attempt starts until its pods are gone")
                        }
                        JobDeletion::Old => info!(job = %name, "deleted an old attempt's Job"),
                        JobDeletion::GpuJobDeleted => {
                            info!(job = %name, "deleting the running attempt's Job (the GpuJob is being deleted); GPU quota is released once its pods are gone")
                        }
                    }
                    self.outcomes.push(Outcome::JobDeleted {
                        name: name.clone(),
                        uid: uid.clone(),
                        foreground,
                    });
                }
                Action::DeleteGpuJob {
                    uid,
                    resource_version,
                } => {
                    w.delete_gpujob(fence, &self.gpujob, uid, resource_version)
                        .await?;
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

    /// A confirming read of the GpuJob: `None` when the run's view of it is current (the
    /// run goes on); else how the run ends: the GpuJob moved on (the view takes the
    /// read GpuJob; plan again), or is gone.
    async fn confirm(&mut self, key: &Key) -> Result<Option<End>, Error> {
        self.ctx.writer.check(self.fence)?;
        let uid = self.gpujob.metadata.uid.clone().unwrap_or_default();
        let seen = self
            .gpujob
            .metadata
            .resource_version
            .clone()
            .unwrap_or_default();
        let Some(current) = self.ctx.reader.gpujob(key, &uid).await? else {
            self.outcomes.push(Outcome::GpuJobGone);
            return Ok(Some(End::Gone));
        };
        let now_current = current.metadata.resource_version.as_deref() == Some(seen.as_str());
        if !now_current {
            info!(
                seen = %seen,
                current = current.metadata.resource_version.as_deref().unwrap_or("-"),
                "the cached GpuJob was behind the API server; deciding again from the current one"
            );
        }
        self.outcomes.push(Outcome::GpuJobRead {
            seen,
            read: Arc::new(current),
        });
        self.confirmed = now_current;
        Ok((!now_current).then_some(End::Asked))
    }

    /// One of the plan's reads: what it found goes to the next plan, and a Job of ours
    /// the cache lacked to the view too.
    async fn read(&mut self, key: &Key, read: &Read) -> Result<(), Error> {
        self.ctx.writer.check(self.fence)?;
        let uid = self.gpujob.metadata.uid.as_deref().unwrap_or_default();
        let found = self.ctx.reader.read(key, uid, read).await?;
        if let Found::Job {
            job: FoundJob::Ours(job),
            ..
        } = &found
        {
            self.outcomes.push(Outcome::JobRead(job.clone()));
        }
        self.answers.push(Answer::Found(read.clone(), found));
        Ok(())
    }

    /// Creates the attempt's Job; `Some(refusal)` when the API server will not have it.
    async fn create_job(
        &mut self,
        attempt: i32,
        job: &k8s_openapi::api::batch::v1::Job,
    ) -> Result<Option<Refusal>, Error> {
        let uid = self.gpujob.metadata.uid.as_deref().unwrap_or_default();
        let (job, how) = match self.ctx.writer.create_job(self.fence, uid, job).await? {
            Created::Job(job) => {
                failpoint::hit("after-job-create");
                self.ctx.metrics.attempts_started.inc();
                (job, "attempt started")
            }
            Created::Adopted(job) => (
                job,
                "attempt's Job already existed (created by an earlier run); adopted",
            ),
            Created::Other(job) => {
                let name = job.metadata.name.clone().unwrap_or_default();
                let message = format!(
                    "Job {name} of this GpuJob holds attempt {attempt}'s name but is {}; attempt {attempt} is created once it is gone",
                    if job.metadata.deletion_timestamp.is_some() {
                        "being deleted"
                    } else {
                        "built from another generation of the spec"
                    }
                );
                info!(attempt, "{message}");
                self.outcomes.push(Outcome::JobCreated(job));
                return Ok(Some(Refusal {
                    attempt,
                    reason: OLD_ATTEMPT_STOPPING,
                    message,
                }));
            }
            Created::Invalid(message) => {
                warn!(
                    attempt,
                    "Job refused as invalid: {message}; waiting for a spec change"
                );
                return Ok(Some(Refusal {
                    attempt,
                    reason: INVALID_SPEC,
                    message,
                }));
            }
            Created::NameTaken(message) => {
                warn!(attempt, "{message}; looking again in a while");
                return Ok(Some(Refusal {
                    attempt,
                    reason: JOB_NAME_CONFLICT,
                    message,
                }));
            }
        };
        info!(
            attempt,
            job = job.metadata.name.as_deref().unwrap_or_default(),
            "{how}"
        );
        self.outcomes.push(Outcome::JobCreated(job));
        Ok(None)
    }

    /// A write to Job `name` ended with `result`: refused for its resourceVersion, a
    /// copy the view kept is stale and goes, so the next look reads the Job again.
    fn job_write(&mut self, name: &str, result: Result<(), Error>) -> Result<(), Error> {
        if let Err(Error::Conflict { .. }) = &result {
            self.outcomes.push(Outcome::JobConflict {
                name: name.to_owned(),
            });
        }
        result
    }

    /// One status patch from the GpuJob as last seen to `status` (nothing when equal),
    /// then its Events.
    async fn write_status(&mut self, status: &GpuJobStatus) -> Result<(), Error> {
        let current = self.gpujob.status.clone().unwrap_or_default();
        if *status == current {
            return Ok(());
        }
        let written = self
            .ctx
            .writer
            .patch_status(self.fence, &self.gpujob, status)
            .await?;
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
        // Only transitions this term recorded, published while it still holds.
        self.ctx
            .writer
            .publish(self.fence, &self.gpujob, &transitions(&current, status));
        Ok(())
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
