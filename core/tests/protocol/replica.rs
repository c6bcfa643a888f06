//! A replica of the operator: its own caches (each watch lags on its own), the write
//! memory of its term, and one reconcile of the GpuJob made the way
//! `src/controller/reconcile.rs` makes it: gpujob-core's real plan, its actions carried
//! out in order, a confirming read or a pod read answered and the plan made again. A
//! write may be left in flight (the replica froze, or lost its lease with it on the
//! wire): it lands whenever the network delivers it.

use gpujob_core::api::{GpuJob, GpuJobSpec, GpuJobStatus};
use gpujob_core::job::desired_job;
use gpujob_core::plan::{
    Action, Found, FoundJob, MAX_PLANS, OLD_ATTEMPT_STOPPING, Observed, PlanSettings, Read, Reads,
    Refusal, plan,
};
use gpujob_core::seen_job::SeenJob;
use gpujob_core::seen_pod::SeenPod;
use jiff::Timestamp;
use k8s_openapi::api::batch::v1::JobCondition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::world::{Answer, Api, GPUJOB, GPUJOB_UID, GpuJobObj, JobObj, NAMESPACE, PodObj, Write};

/// What the model may leave out of a replica, to show the checker finds the hole.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Faults {
    /// Jobs are created without the operator's scheduling gate in their pod template:
    /// their pods run as soon as the Job controller makes them.
    pub ungated_jobs: bool,
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
    /// Where its term began (a quorum list's resourceVersion): a cached GpuJob strictly
    /// past it needs no confirming read (`src/controller/view/term_start.rs`).
    pub term_start: Option<u32>,
    /// A write sent and not yet landed.
    pub in_flight: Option<Write>,
}

impl Replica {
    pub fn new(api: &Api, holds: bool) -> Replica {
        Replica {
            holds,
            gpujob: api.gpujob.clone(),
            jobs: api.jobs.clone(),
            pods: api.pods.clone(),
            current: None,
            term_start: holds.then_some(api.rv),
            in_flight: None,
        }
    }

    /// One reconcile against `api` at `tick`. The write numbered `freeze_at` (from 0) is
    /// not landed: it is left in flight, and the reconcile ends there.
    pub fn reconcile(&mut self, api: &mut Api, tick: u8, freeze_at: Option<u8>, faults: Faults) {
        let settings = PlanSettings::default();
        let now = time(tick);
        let mut confirmed = self.current == Some(self.gpujob.rv)
            || self.term_start.is_some_and(|t| self.gpujob.rv > t);
        let mut refused: Option<Refusal> = None;
        let mut pods: Option<Vec<SeenPod>> = None;
        let mut reads = Reads::default();
        let mut writes = 0u8;
        'plans: for _ in 0..MAX_PLANS {
            let gpujob = gpujob_at(&self.gpujob);
            let seen_jobs: Vec<SeenJob> = self.jobs.iter().map(seen_job).collect();
            let cached: Vec<SeenPod> = self.pods.iter().map(seen_pod).collect();
            let observed = Observed {
                gpujob: &gpujob,
                jobs: seen_jobs.iter().collect(),
                termination: None,
                unschedulable: None,
                queue_wait: None,
                refused: refused.clone(),
                quota_required: false,
                quota: None,
                pods: pods.clone(),
                cached_pods: cached.iter().collect(),
                confirmed,
                term_start_due: false,
                reads: reads.clone(),
                now,
            };
            let plan = plan(&observed, &settings);
            for action in &plan.actions {
                let write = match action {
                    Action::Confirm => {
                        if confirmed {
                            continue;
                        }
                        let read = api.gpujob.clone();
                        self.current = Some(read.rv);
                        confirmed = true;
                        if read.rv == self.gpujob.rv {
                            continue;
                        }
                        // Moved on: observe again from the GpuJob as read (the other
                        // caches stay as far behind as they are).
                        self.gpujob = read;
                        continue 'plans;
                    }
                    Action::ReadPods => {
                        pods = Some(api.pods.iter().map(seen_pod).collect());
                        continue 'plans;
                    }
                    Action::Read(read) => {
                        // The model's pods carry no exit code or scheduling reason, and
                        // it has no Kueue: only a Job's read finds anything.
                        let found = match read {
                            Read::Job { attempt } => Found::Job {
                                attempt: *attempt,
                                job: match api.jobs.iter().find(|j| j.attempt == *attempt) {
                                    Some(j) => {
                                        self.jobs.retain(|c| c.attempt != j.attempt);
                                        self.jobs.push(j.clone());
                                        FoundJob::Ours(Box::new(seen_job(j)))
                                    }
                                    None => FoundJob::Absent,
                                },
                            },
                            Read::Termination { attempt, .. } => Found::Termination {
                                attempt: *attempt,
                                termination: None,
                            },
                            Read::Placement { attempt, .. } => Found::Placement {
                                attempt: *attempt,
                                unschedulable: None,
                                pods: Vec::new(),
                            },
                            Read::Workload { .. } => panic!("the model has no Kueue"),
                        };
                        reads.record(read.clone(), &found);
                        continue;
                    }
                    Action::RecordStatus(status) => match self.status_write(status) {
                        Some(w) => w,
                        None => continue,
                    },
                    Action::CreateJob { job, .. } => {
                        let Some(seen) = SeenJob::of(job) else {
                            panic!("the plan built a Job without its GpuJob as controller: {job:?}")
                        };
                        Write::CreateJob {
                            attempt: seen.attempt.unwrap_or_default(),
                            generation: seen.generation.unwrap_or_default(),
                            suspended: seen.suspended,
                            gated: seen.gated && !faults.ungated_jobs,
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
                    Action::Publish(_) => continue,
                    other => panic!(
                        "the model has no {} (no quota, one node, no TTL, no Jobs of an earlier release)",
                        other.name()
                    ),
                };
                if freeze_at == Some(writes) && self.in_flight.is_none() {
                    self.in_flight = Some(write);
                    return;
                }
                writes += 1;
                // The pods as read are no longer as they are once a pod is written.
                if matches!(write, Write::Ungate { .. } | Write::DeletePod { .. }) {
                    pods = None;
                }
                match api.apply(&write) {
                    Answer::GpuJob(written) => {
                        self.current = Some(written.rv);
                        confirmed = true;
                        self.gpujob = written;
                    }
                    Answer::Job(job) => self.jobs.push(job),
                    Answer::Exists(job) => {
                        let Write::CreateJob { generation, .. } = &write else {
                            unreachable!("a create's answer")
                        };
                        let adopt = !job.deleting && job.generation == *generation;
                        self.jobs.retain(|j| j.attempt != job.attempt);
                        self.jobs.push(job.clone());
                        if !adopt {
                            refused = Some(Refusal {
                                attempt: job.attempt,
                                reason: OLD_ATTEMPT_STOPPING,
                                message: format!("train-{} holds the name", job.attempt),
                            });
                            continue 'plans;
                        }
                    }
                    // The write memory: what this replica did shows in its view
                    // before its watches bring it.
                    Answer::Done => self.remember(&write),
                    // An error ends the reconcile; it comes back with backoff.
                    Answer::Refused => return,
                }
            }
            if plan.actions.iter().any(|a| matches!(a, Action::Read(_))) {
                // A plan that reads asks nothing else: the next one hears the answers.
                continue 'plans;
            }
            // The plan ran to its end: its status, when it changed.
            if let Some(write) = self.status_write(&plan.status) {
                if freeze_at == Some(writes) && self.in_flight.is_none() {
                    self.in_flight = Some(write);
                    return;
                }
                if let Answer::GpuJob(written) = api.apply(&write) {
                    self.current = Some(written.rv);
                    self.gpujob = written;
                }
            }
            return;
        }
        panic!(
            "the plan asked more than {MAX_PLANS} times in one reconcile (the operator's Error::Undecided)"
        );
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
            Write::Status { .. } | Write::CreateJob { .. } => {}
        }
    }

    /// The status patch from the GpuJob as this replica last saw it, if it changes it.
    fn status_write(&self, status: &GpuJobStatus) -> Option<Write> {
        let json = status_json(status);
        (json != self.gpujob.status).then_some(Write::Status {
            rv: self.gpujob.rv,
            status: json,
        })
    }
}

pub fn status_json(status: &GpuJobStatus) -> String {
    serde_json::to_string(status).unwrap_or_default()
}

fn time(tick: u8) -> Timestamp {
    let start: Timestamp = "2026-12-05T06:00:00Z"
        .parse()
        .unwrap_or(Timestamp::UNIX_EPOCH);
    start + jiff::SignedDuration::from_hours(i64::from(tick))
}

/// `pod-7`, `job-3`, `12` → 7, 3, 12.
fn number(s: &str) -> u32 {
    s.rsplit('-')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(u32::MAX)
}

/// The spec of `generation`: each edit changes the image.
fn spec_at(generation: i64) -> GpuJobSpec {
    GpuJobSpec {
        image: format!("img-{generation}"),
        command: vec![],
        args: vec![],
        env: vec![],
        gpus: 1,
        max_retries: 1,
        active_deadline_seconds: None,
        node_selector: Default::default(),
        service_account_name: None,
        update_policy: Default::default(),
        suspend: false,
        ttl_seconds_after_finished: None,
        v2: None,
    }
}

pub fn gpujob_at(obj: &GpuJobObj) -> GpuJob {
    let mut g = GpuJob::new(GPUJOB, spec_at(obj.generation));
    g.metadata.namespace = Some(NAMESPACE.into());
    g.metadata.uid = Some(GPUJOB_UID.into());
    g.metadata.generation = Some(obj.generation);
    g.metadata.resource_version = Some(obj.rv.to_string());
    g.status = serde_json::from_str(&obj.status).ok();
    g
}

/// The Job as the plan sees it: built by the real Job builder from its generation's
/// spec, then as the API server and the Job controller left it.
fn seen_job(job: &JobObj) -> SeenJob {
    let owner = gpujob_at(&GpuJobObj {
        rv: 0,
        generation: job.generation,
        status: String::new(),
    });
    let built = desired_job(&owner, job.attempt);
    let Some(mut seen) = SeenJob::of(&built) else {
        panic!("the Job builder made a Job without its GpuJob as controller")
    };
    seen.uid = Some(format!("job-{}", job.uid));
    seen.resource_version = Some(job.rv.to_string());
    seen.suspended = job.suspended;
    seen.gated = job.gated;
    if job.deleting {
        seen.deletion_timestamp = Some(Time(time(0)));
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
        terminal: pod.failed,
        deleting: pod.deleting,
    }
}
