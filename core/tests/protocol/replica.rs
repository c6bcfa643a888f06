//! A replica of the operator: its own caches (each watch lags on its own), the write
//! memory of its term, and one reconcile of the GpuJob made the way
//! `src/controller/reconcile.rs` makes it: gpujob-core's real plan, its actions carried
//! out in order, a confirming read, a pod read or the quota service's answer heard and
//! the plan made again. A write or a quota call may be left in flight (the replica
//! froze, or lost its lease with it on the wire): it lands whenever the network
//! delivers it.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::LazyLock;

use gpujob_core::api::{GpuJob, GpuJobSpec, GpuJobStatus, V2Only};
use gpujob_core::job::desired_job;
use gpujob_core::plan::{
    Action, Found, FoundJob, MAX_PLANS, OLD_ATTEMPT_STOPPING, Observed, PlanSettings, QuotaAnswer,
    Read, Reads, Refusal, plan,
};
use gpujob_core::seen_job::SeenJob;
use gpujob_core::seen_pod::SeenPod;
use jiff::Timestamp;
use k8s_openapi::api::batch::v1::JobCondition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::world::{
    Answer, Api, GPUJOB, GPUJOB_UID, GpuJobObj, JobObj, NAMESPACE, PodObj, Status, Write, gpus_at,
};

/// The Kueue LocalQueue of a GpuJob with `spec.queueName`.
pub const QUEUE: &str = "team-a";

/// What the model may leave out of a replica, to show the checker finds the hole.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Faults {
    /// Jobs are created without the operator's scheduling gate in their pod template:
    /// their pods run as soon as the Job controller makes them.
    pub ungated_jobs: bool,
    /// The replica takes its cached GpuJob as known current in its term, without the
    /// confirming read the plan asks for.
    pub unconfirmed: bool,
    /// The term start's list takes a cached GpuJob for current when the cache is not
    /// past the version listed (at or behind it), rather than only at it.
    pub list_confirms_behind: bool,
    /// The quota service ignores fencing tokens (a world fault: the contract makes
    /// honouring them optional).
    pub quota_ignores_tokens: bool,
    /// The node's kubelet is lost: a deleted pod that ran never stops (a world fault that
    /// does not end).
    pub node_lost: bool,
    /// The executor takes a release that failed for one that went through.
    pub release_failure_taken_as_released: bool,
    /// The executor records a grant at the size asked, not at what the service holds.
    pub records_size_asked: bool,
}

/// What a reconcile depends on besides the replica and the API server.
#[derive(Clone, Copy, Debug)]
pub struct Env {
    /// The clock, in hours (one is past any backoff).
    pub tick: u8,
    pub faults: Faults,
    /// The operator reserves GPUs from the quota service (`--quota-provider http`).
    pub quota_required: bool,
    /// The GpuJob has `spec.queueName`: its Jobs go through Kueue.
    pub queue: bool,
    /// How many of a reconcile's writes may be the one left in flight (the first ones).
    pub freezes: usize,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Replica {
    /// Believes it holds the GpuJob's shard in its current term.
    pub holds: bool,
    pub gpujob: GpuJobObj,
    pub jobs: Vec<JobObj>,
    pub pods: Vec<PodObj>,
    /// The GpuJob's resourceVersion known current in this term (read or written by it).
    pub current: Option<u32>,
    /// Where its term began (a quorum list's resourceVersion, read when a plan asks:
    /// `Action::ReadTermStart`): a cached GpuJob strictly past it, or at the version
    /// the list found, needs no confirming read (`src/controller/view/term_start.rs`).
    pub term_start: Option<u32>,
    /// A write sent and not yet landed.
    pub in_flight: Option<Write>,
}

/// What one reconcile heard so far (`Heard` in `src/controller/reconcile.rs`).
#[derive(Default)]
struct Heard {
    confirmed: bool,
    /// The term's start is not known and this reconcile may read it: only in its first
    /// plan (the executor declines it for the rest of the reconcile, as the operator's).
    term_start_due: bool,
    refused: Option<Refusal>,
    quota: Option<QuotaAnswer>,
    pods: Option<Vec<SeenPod>>,
    reads: Reads,
}

/// What follows an action.
enum Flow {
    /// The next action of the plan.
    Go,
    /// The plan is made again, with what was heard.
    Replan,
    /// The reconcile ends (an error, or the replica froze with a write in flight).
    End,
}

static SETTINGS: LazyLock<PlanSettings> = LazyLock::new(PlanSettings::default);

impl Replica {
    pub fn new(api: &Api, holds: bool) -> Replica {
        Replica {
            holds,
            gpujob: api.gpujob.clone(),
            jobs: api.jobs.clone(),
            pods: api.pods.clone(),
            current: None,
            term_start: None,
            in_flight: None,
        }
    }

    /// One reconcile against `api`, carried out to its end. At each of its first
    /// `env.freezes` writes, the replica and the API server as they would be had that
    /// write been left in flight (and the reconcile ended there) go to `frozen`.
    pub fn reconcile(&mut self, api: &mut Api, env: &Env, frozen: &mut Vec<(Replica, Api)>) {
        let now = time(env.tick);
        let mut heard = Heard {
            confirmed: env.faults.unconfirmed
                || self.current == Some(self.gpujob.rv)
                || self.term_start.is_some_and(|t| self.gpujob.rv > t),
            term_start_due: self.term_start.is_none(),
            ..Heard::default()
        };
        'plans: for _ in 0..MAX_PLANS {
            let gpujob = gpujob_at(&self.gpujob, env.queue);
            let seen_jobs: Vec<SeenJob> = self.jobs.iter().map(|j| seen_job(j, env)).collect();
            let cached: Vec<SeenPod> = self.pods.iter().map(seen_pod).collect();
            let observed = Observed {
                gpujob: &gpujob,
                jobs: seen_jobs.iter().collect(),
                termination: None,
                unschedulable: None,
                queue_wait: None,
                refused: heard.refused.clone(),
                quota_required: env.quota_required,
                quota: heard.quota.clone(),
                pods: heard.pods.clone(),
                cached_pods: cached.iter().collect(),
                confirmed: heard.confirmed,
                term_start_due: heard.term_start_due && !heard.confirmed,
                reads: heard.reads.clone(),
                nodes: Vec::new(),
                now,
            };
            let plan = plan(&observed, &SETTINGS);
            heard.term_start_due = false;
            for action in &plan.actions {
                match self.carry_out(action, api, env, &mut heard, frozen) {
                    Flow::Go => {}
                    Flow::Replan => continue 'plans,
                    Flow::End => return,
                }
            }
            if plan.actions.iter().any(|a| matches!(a, Action::Read(_))) {
                // A plan that reads asks nothing else: the next one hears the answers.
                continue 'plans;
            }
            // The plan ran to its end: its status, when it changed.
            if let Some(write) = self.status_write(&plan.status) {
                self.send(write, api, env, &mut heard, frozen);
            }
            return;
        }
        panic!(
            "the plan asked more than {MAX_PLANS} times in one reconcile (the operator's Error::Undecided)"
        );
    }

    /// The executor: one action of a plan, carried out. Every action the plan may ask
    /// for is handled here, and only here.
    fn carry_out(
        &mut self,
        action: &Action,
        api: &mut Api,
        env: &Env,
        heard: &mut Heard,
        frozen: &mut Vec<(Replica, Api)>,
    ) -> Flow {
        let write = match action {
            Action::Confirm => {
                if heard.confirmed {
                    return Flow::Go;
                }
                let read = api.gpujob.clone();
                self.current = Some(read.rv);
                heard.confirmed = true;
                if read.rv == self.gpujob.rv {
                    return Flow::Go;
                }
                // Moved on: observe again from the GpuJob as read (the other caches
                // stay as far behind as they are).
                self.gpujob = read;
                return Flow::Replan;
            }
            Action::ReadPods { .. } => {
                heard.pods = Some(api.pods.iter().map(seen_pod).collect());
                return Flow::Replan;
            }
            Action::ReadTermStart => {
                // A quorum list of the namespace's GpuJobs: its resourceVersion is the
                // store's now, and the version it found of the GpuJob is current in
                // the term (`View::record`).
                self.term_start = Some(api.rv);
                self.current = Some(api.gpujob.rv);
                let listed = if env.faults.list_confirms_behind {
                    self.gpujob.rv <= api.gpujob.rv
                } else {
                    self.gpujob.rv == api.gpujob.rv
                };
                heard.confirmed |= self.gpujob.rv > api.rv || listed;
                return Flow::Replan;
            }
            Action::Read(read) => {
                // The model's pods carry no exit code or scheduling reason, and its
                // Kueue leaves no Workload to read, and its pods are bound to no named
                // node (no Node is read): only a Job's read finds anything. A
                // Job found is remembered until the cache has it, as the view does.
                let found = match read {
                    Read::Job { attempt } => Found::Job {
                        attempt: *attempt,
                        job: match api.jobs.iter().find(|j| j.attempt == *attempt) {
                            Some(j) => {
                                if !self.jobs.iter().any(|c| c.attempt == j.attempt) {
                                    self.jobs.push(j.clone());
                                }
                                FoundJob::Ours(Box::new(seen_job(j, env)))
                            }
                            None => FoundJob::Absent,
                        },
                    },
                    _ => read.found_nothing(),
                };
                heard.reads.record(read.clone(), &found);
                return Flow::Go;
            }
            Action::RecordStatus(status) => match self.status_write(status) {
                Some(w) => w,
                None => return Flow::Go,
            },
            Action::AddFinalizer => Write::Finalizer {
                rv: self.gpujob.rv,
                on: true,
            },
            Action::RemoveFinalizer(_) => Write::Finalizer {
                rv: self.gpujob.rv,
                on: false,
            },
            Action::Reserve(request, sequence) => Write::Reserve {
                sequence: *sequence,
                gpus: request.gpus,
            },
            Action::Release(sequence) => Write::Release {
                sequence: *sequence,
            },
            Action::CreateJob { job, .. } => {
                let Some(seen) = SeenJob::of(job) else {
                    panic!("the plan built a Job without its GpuJob as controller: {job:?}")
                };
                Write::CreateJob {
                    attempt: seen.attempt.unwrap_or_default(),
                    generation: seen.generation.unwrap_or_default(),
                    suspended: seen.suspended,
                    queued: seen.queue.is_some(),
                    gated: seen.gated && !env.faults.ungated_jobs,
                }
            }
            Action::DeleteJob {
                uid,
                resource_version,
                why,
                ..
            } => Write::DeleteJob {
                uid: number(uid),
                rv: number(resource_version),
                foreground: why.foreground(),
            },
            Action::UngatePod {
                uid,
                resource_version,
                ..
            } => Write::Ungate {
                uid: number(uid),
                rv: number(resource_version),
            },
            Action::DeletePod {
                uid,
                resource_version,
                ..
            } => Write::DeletePod {
                uid: number(uid),
                rv: number(resource_version),
            },
            Action::Publish(_) => return Flow::Go,
            other => panic!(
                "the model has no {} (one node, no TTL, no Jobs of an earlier release, no deletion of the GpuJob)",
                other.name()
            ),
        };
        self.send(write, api, env, heard, frozen)
    }

    /// Sends `write` and takes in its answer.
    fn send(
        &mut self,
        write: Write,
        api: &mut Api,
        env: &Env,
        heard: &mut Heard,
        frozen: &mut Vec<(Replica, Api)>,
    ) -> Flow {
        if self.in_flight.is_none() && frozen.len() < env.freezes {
            let mut stopped = self.clone();
            stopped.in_flight = Some(write.clone());
            frozen.push((stopped, api.clone()));
        }
        // The pods as read are no longer as they are once a pod is written.
        if matches!(write, Write::Ungate { .. } | Write::DeletePod { .. }) {
            heard.pods = None;
        }
        match api.apply(&write) {
            Answer::GpuJob(written) => {
                self.current = Some(written.rv);
                heard.confirmed = true;
                self.gpujob = written;
                Flow::Go
            }
            Answer::Job(job) => {
                self.jobs.push(job);
                Flow::Go
            }
            Answer::Exists(job) => {
                let Write::CreateJob { generation, .. } = &write else {
                    unreachable!("a create's answer")
                };
                let adopt = !job.deleting && job.generation == *generation;
                self.jobs.retain(|j| j.attempt != job.attempt);
                self.jobs.push(job.clone());
                if adopt {
                    return Flow::Go;
                }
                heard.refused = Some(Refusal {
                    attempt: job.attempt,
                    reason: OLD_ATTEMPT_STOPPING,
                    message: format!("train-{} holds the name", job.attempt),
                });
                Flow::Replan
            }
            // The write memory: what this replica did shows in its view before its
            // watches bring it.
            Answer::Done => {
                self.remember(&write);
                Flow::Go
            }
            // A quota call ends the plan: it is made again with the answer.
            Answer::Quota(answer) => {
                heard.quota = Some(match (answer, &write) {
                    (QuotaAnswer::Reserved { id, gpus }, Write::Reserve { gpus: asked, .. }) => {
                        if env.faults.records_size_asked {
                            QuotaAnswer::Reserved { id, gpus: *asked }
                        } else {
                            QuotaAnswer::granted(id, Some(gpus), *asked)
                        }
                    }
                    (QuotaAnswer::ReleaseFailed { .. }, _)
                        if env.faults.release_failure_taken_as_released =>
                    {
                        QuotaAnswer::Released
                    }
                    (answer, _) => answer,
                });
                Flow::Replan
            }
            // An error ends the reconcile; it comes back with backoff.
            Answer::Refused => Flow::End,
        }
    }

    /// Its own write, as the view's write memory shows it.
    fn remember(&mut self, write: &Write) {
        match write {
            Write::DeleteJob {
                uid, foreground, ..
            } => {
                if *foreground {
                    self.jobs
                        .iter_mut()
                        .filter(|j| j.uid == *uid)
                        .for_each(|j| j.deleting = true);
                } else {
                    self.jobs.retain(|j| j.uid != *uid);
                }
            }
            Write::Ungate { uid, .. } => self
                .pods
                .iter_mut()
                .filter(|p| p.uid == *uid)
                .for_each(|p| p.gated = false),
            Write::DeletePod { uid, .. } => self.pods.retain(|p| p.uid != *uid),
            _ => {}
        }
    }

    /// The status patch from the GpuJob as this replica last saw it, if it changes it.
    fn status_write(&self, status: &GpuJobStatus) -> Option<Write> {
        if *status == self.gpujob.status.get() {
            return None;
        }
        let status = Status::of(status);
        (status != self.gpujob.status).then_some(Write::Status {
            rv: self.gpujob.rv,
            status,
        })
    }
}

static START: LazyLock<Timestamp> = LazyLock::new(|| {
    "2026-12-05T06:00:00Z"
        .parse()
        .unwrap_or(Timestamp::UNIX_EPOCH)
});

pub fn time(tick: u8) -> Timestamp {
    *START + jiff::SignedDuration::from_hours(i64::from(tick))
}

/// `pod-7`, `job-3`, `12` → 7, 3, 12.
fn number(s: &str) -> u32 {
    s.rsplit('-')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(u32::MAX)
}

/// The spec of `generation`: each edit changes the image and the GPUs it asks for.
fn spec_at(generation: i64, queue: bool) -> GpuJobSpec {
    GpuJobSpec {
        image: format!("img-{generation}"),
        command: vec![],
        args: vec![],
        env: vec![],
        gpus: gpus_at(generation),
        max_retries: 1,
        active_deadline_seconds: None,
        node_selector: Default::default(),
        service_account_name: None,
        update_policy: Default::default(),
        suspend: false,
        ttl_seconds_after_finished: None,
        v2: queue.then(|| V2Only {
            queue_name: Some(QUEUE.into()),
            ..V2Only::default()
        }),
    }
}

pub fn gpujob_at(obj: &GpuJobObj, queue: bool) -> GpuJob {
    let mut g = GpuJob::new(GPUJOB, spec_at(obj.generation, queue));
    g.metadata.namespace = Some(NAMESPACE.into());
    g.metadata.uid = Some(GPUJOB_UID.into());
    g.metadata.generation = Some(obj.generation);
    g.metadata.resource_version = Some(obj.rv.to_string());
    if obj.finalizer {
        g.metadata.finalizers = Some(vec![gpujob_core::api::FINALIZER_QUOTA.into()]);
    }
    g.status = Some(obj.status.get());
    g
}

thread_local! {
    /// The Job builder's Job of each generation and attempt, as the plan sees it.
    static BUILT: RefCell<HashMap<(i64, i32, bool), SeenJob>> = RefCell::default();
}

/// The Job as the plan sees it: built by the real Job builder from its generation's
/// spec, then as the API server, Kueue and the Job controller left it.
fn seen_job(job: &JobObj, env: &Env) -> SeenJob {
    let key = (job.generation, job.attempt, env.queue);
    let mut seen = BUILT.with(|b| {
        b.borrow_mut()
            .entry(key)
            .or_insert_with(|| {
                let owner = gpujob_at(
                    &GpuJobObj {
                        rv: 0,
                        generation: job.generation,
                        status: Status::of(&GpuJobStatus::default()),
                        finalizer: false,
                    },
                    env.queue,
                );
                let built = desired_job(&owner, job.attempt);
                let Some(seen) = SeenJob::of(&built) else {
                    panic!("the Job builder made a Job without its GpuJob as controller")
                };
                seen
            })
            .clone()
    });
    seen.uid = Some(format!("job-{}", job.uid));
    seen.resource_version = Some(job.rv.to_string());
    seen.suspended = job.suspended;
    seen.queue = job.queued.then(|| QUEUE.into());
    seen.gated = job.gated;
    if job.deleting {
        seen.deletion_timestamp = Some(Time(time(0)));
    }
    if job.completed {
        seen.status.conditions = vec![JobCondition {
            type_: "Complete".into(),
            status: "True".into(),
            last_transition_time: Some(Time(time(0))),
            ..Default::default()
        }];
    }
    if let Some(at) = job.failed_at {
        seen.status.conditions = vec![JobCondition {
            type_: "Failed".into(),
            status: "True".into(),
            reason: Some("BackoffLimitExceeded".into()),
            message: Some("Job has reached the specified backoff limit".into()),
            last_transition_time: Some(Time(time(at))),
            ..Default::default()
        }];
    }
    seen
}

fn seen_pod(pod: &PodObj) -> SeenPod {
    SeenPod {
        name: format!("{GPUJOB}-{}-p{}", pod.attempt, pod.uid),
        namespace: NAMESPACE.into(),
        owner_uid: GPUJOB_UID.into(),
        uid: Some(format!("pod-{}", pod.uid)),
        resource_version: Some(pod.rv.to_string()),
        attempt: Some(pod.attempt),
        job: Some(format!("{GPUJOB}-{}", pod.attempt)),
        job_uid: Some(format!("job-{}", pod.job_uid)),
        gated: pod.gated,
        bound: pod.bound,
        // The model has no scheduler: a pod let go is placed.
        unschedulable: false,
        node: None,
        terminal: pod.ended,
        deleting: pod.deleting,
        // One cluster: the model has no MultiKueue worker.
        cluster: None,
    }
}
