//! Everything around the replicas: the API server's objects (with resourceVersions and
//! preconditions), the Job controller (whose informer may lag a delete), kube-scheduler,
//! the kubelet, the garbage collector, Kueue, the quota service and the user. Only the
//! replicas decide with the real plan (`replica.rs`); what is here is how the world
//! answers them.

use std::collections::HashMap;
use std::sync::{LazyLock, RwLock};

use gpujob_core::api::GpuJobStatus;
use gpujob_core::plan::QuotaAnswer;

/// One GpuJob, `train` in namespace `ns`, uid `uid-1`.
pub const GPUJOB: &str = "train";
pub const NAMESPACE: &str = "ns";
pub const GPUJOB_UID: &str = "uid-1";

/// A GpuJob status, interned: the states hold a number, so hashing and comparing them
/// is cheap, and each status is parsed once. Two statuses are the same when the API
/// server would store the same JSON.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct Status(u32);

#[derive(Default)]
struct Statuses {
    ids: HashMap<String, u32>,
    all: Vec<GpuJobStatus>,
}

static STATUSES: LazyLock<RwLock<Statuses>> = LazyLock::new(RwLock::default);

impl Status {
    pub fn of(status: &GpuJobStatus) -> Status {
        let json = serde_json::to_string(status).unwrap_or_default();
        if let Some(id) = STATUSES.read().ok().and_then(|s| s.ids.get(&json).copied()) {
            return Status(id);
        }
        let mut all = STATUSES.write().unwrap_or_else(|e| e.into_inner());
        let next = u32::try_from(all.all.len()).unwrap_or(u32::MAX);
        let id = *all.ids.entry(json).or_insert(next);
        if id == next {
            all.all.push(status.clone());
        }
        Status(id)
    }

    pub fn get(self) -> GpuJobStatus {
        let all = STATUSES.read().unwrap_or_else(|e| e.into_inner());
        all.all[self.0 as usize].clone()
    }
}

/// The GpuJob as the API server has it.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct GpuJobObj {
    pub rv: u32,
    pub generation: i64,
    pub status: Status,
    /// It holds the quota finalizer.
    pub finalizer: bool,
}

/// A Job of the GpuJob: which attempt, from which generation, and what its controller
/// and deletion did to it.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct JobObj {
    pub uid: u32,
    pub rv: u32,
    pub attempt: i32,
    pub generation: i64,
    pub suspended: bool,
    /// Labelled for a Kueue LocalQueue: Kueue admits it (unsuspends it).
    pub queued: bool,
    /// Its pod template carries the operator's scheduling gate.
    pub gated: bool,
    /// Deleted in the foreground: stays until its pods are gone.
    pub deleting: bool,
    /// The Job controller marked it Failed, at this tick.
    pub failed_at: Option<u8>,
    /// The Job controller marked it Complete.
    pub completed: bool,
}

/// A pod, made by the Job controller for the Job `job_uid`.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct PodObj {
    pub uid: u32,
    pub rv: u32,
    pub job_uid: u32,
    pub attempt: i32,
    /// The GPUs it asks for (its Job's generation's spec).
    pub gpus: i32,
    pub gated: bool,
    pub bound: bool,
    /// Its containers ended: it failed, was stopped, or succeeded.
    pub ended: bool,
    pub succeeded: bool,
    pub deleting: bool,
}

impl PodObj {
    /// Let go of its gate or on a node, and not ended: it runs or may run.
    pub fn can_run(&self) -> bool {
        (!self.gated || self.bound) && !self.ended
    }
}

/// A write a replica sends; the API server checks its preconditions when it lands,
/// which may be long after it was sent.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub enum Write {
    Status {
        rv: u32,
        status: Status,
    },
    /// Adds or removes the quota finalizer (a patch with the GpuJob's resourceVersion).
    Finalizer {
        rv: u32,
        on: bool,
    },
    CreateJob {
        attempt: i32,
        generation: i64,
        suspended: bool,
        queued: bool,
        gated: bool,
    },
    DeleteJob {
        uid: u32,
        rv: u32,
        foreground: bool,
    },
    Ungate {
        uid: u32,
        rv: u32,
    },
    DeletePod {
        uid: u32,
        rv: u32,
    },
    /// A call to the quota service, with its fencing sequence.
    Reserve {
        sequence: i64,
        gpus: i32,
    },
    Release {
        sequence: i64,
    },
}

/// What the API server answered a write.
#[derive(Debug)]
pub enum Answer {
    GpuJob(GpuJobObj),
    Job(JobObj),
    /// A Job of that name exists (409 AlreadyExists): this one.
    Exists(JobObj),
    /// Done to a Job or pod.
    Done,
    /// The quota service's answer.
    Quota(QuotaAnswer),
    /// A precondition failed, the object is gone (409 / 404), or a reserve failed
    /// (412, 503, a timeout): the executor returns an error, and the reconcile ends.
    Refused,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Api {
    /// The last resourceVersion handed out (one counter for every object, as etcd's).
    pub rv: u32,
    pub uids: u32,
    pub gpujob: GpuJobObj,
    pub jobs: Vec<JobObj>,
    pub pods: Vec<PodObj>,
    /// Set when a status write lowered `status.attempts`.
    pub attempts_fell: bool,
    /// Set when a Job was created for an attempt past the next one after every
    /// attempt created before it (a gap).
    pub attempt_skipped: bool,
    /// Set when a replica's create made again the Job of an attempt the status records
    /// (one that lands late, sent before, may: it never runs; and the Job of an attempt
    /// never recorded, made from an older spec, is made again from the new one).
    pub job_made_again: bool,
    /// The node's kubelet is gone: deleted pods that ran never stop.
    pub node_lost: bool,
    /// A write in flight is landing ([`Api::land_late`]).
    landing_late: bool,
    /// The attempts whose pods ran, in the order they first did.
    pub ran: Vec<i32>,
    /// Jobs gone from the API server, as they last were: the Job controller's informer
    /// may not have seen them go.
    pub gone_jobs: Vec<JobObj>,
    /// The Jobs the Job controller made a pod for (one each: the model does not replace
    /// a deleted pod).
    pub made_pod_for: Vec<u32>,
    pub quota: QuotaService,
}

/// The quota service as docs/quota-api.md asks of one that honours fencing tokens: one
/// reservation per GpuJob UID (calls are idempotent by it), and the largest fencing
/// sequence it has seen; a call with a smaller one is refused (412) and does nothing.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq)]
pub struct QuotaService {
    /// The GPUs reserved for the GpuJob, if any.
    pub held: Option<i32>,
    pub fence: i64,
    /// A service that ignores the token (docs/quota-api.md allows it): late calls go
    /// through.
    pub ignores_tokens: bool,
    /// How it answers now.
    pub outage: Outage,
    /// A replica heard a release fail (a 412, a 503, a timeout).
    pub release_failed: bool,
}

/// How the quota service answers while a fault lasts (`Step::QuotaFault`).
#[derive(Clone, Copy, Debug, Default, Hash, PartialEq, Eq)]
pub enum Outage {
    /// As docs/quota-api.md says.
    #[default]
    None,
    /// At its quota: a reserve of a GpuJob that holds none is refused (409 with a
    /// reason); a release goes through.
    Full,
    /// Down (a 503): a call does nothing.
    Unavailable,
    /// A call takes effect but its answer is lost (a timeout).
    AnswersLost,
}

impl Api {
    pub fn new(status: Status) -> Api {
        Api {
            rv: 1,
            uids: 0,
            gpujob: GpuJobObj {
                rv: 1,
                generation: 1,
                status,
                finalizer: false,
            },
            jobs: Vec::new(),
            pods: Vec::new(),
            attempts_fell: false,
            attempt_skipped: false,
            job_made_again: false,
            node_lost: false,
            landing_late: false,
            ran: Vec::new(),
            gone_jobs: Vec::new(),
            made_pod_for: Vec::new(),
            quota: QuotaService::default(),
        }
    }

    fn next_rv(&mut self) -> u32 {
        self.rv += 1;
        self.rv
    }

    fn next_uid(&mut self) -> u32 {
        self.uids += 1;
        self.uids
    }

    pub fn job(&self, uid: u32) -> Option<&JobObj> {
        self.jobs.iter().find(|j| j.uid == uid)
    }

    fn job_mut(&mut self, uid: u32) -> Option<&mut JobObj> {
        self.jobs.iter_mut().find(|j| j.uid == uid)
    }

    pub fn pod(&self, uid: u32) -> Option<&PodObj> {
        self.pods.iter().find(|p| p.uid == uid)
    }

    fn pod_mut(&mut self, uid: u32) -> Option<&mut PodObj> {
        self.pods.iter_mut().find(|p| p.uid == uid)
    }

    /// Lands `write`, sent some steps before by a replica that may since have reconciled
    /// again or lost the shard.
    pub fn land_late(&mut self, write: &Write) {
        self.landing_late = true;
        self.apply(write);
        self.landing_late = false;
    }

    /// Lands `write` now.
    pub fn apply(&mut self, write: &Write) -> Answer {
        match write {
            Write::Status { rv, status } => {
                if *rv != self.gpujob.rv {
                    return Answer::Refused;
                }
                if status.get().attempts < self.gpujob.status.get().attempts {
                    self.attempts_fell = true;
                }
                self.gpujob.status = *status;
                self.gpujob.rv = self.next_rv();
                Answer::GpuJob(self.gpujob.clone())
            }
            Write::Finalizer { rv, on } => {
                if *rv != self.gpujob.rv {
                    return Answer::Refused;
                }
                self.gpujob.finalizer = *on;
                self.gpujob.rv = self.next_rv();
                Answer::GpuJob(self.gpujob.clone())
            }
            Write::CreateJob {
                attempt,
                generation,
                suspended,
                queued,
                gated,
            } => {
                // Jobs have stable names (`train-<attempt>`): the name is the attempt.
                if let Some(j) = self.jobs.iter().find(|j| j.attempt == *attempt) {
                    return Answer::Exists(j.clone());
                }
                let newest = self
                    .jobs
                    .iter()
                    .chain(&self.gone_jobs)
                    .map(|j| j.attempt)
                    .max();
                if *attempt > newest.unwrap_or(0) + 1 {
                    self.attempt_skipped = true;
                }
                let recorded = *attempt <= self.gpujob.status.get().attempts;
                let had_one = self.gone_jobs.iter().any(|j| j.attempt == *attempt);
                if recorded && had_one && !self.landing_late {
                    self.job_made_again = true;
                }
                let job = JobObj {
                    uid: self.next_uid(),
                    rv: self.next_rv(),
                    attempt: *attempt,
                    generation: *generation,
                    suspended: *suspended,
                    queued: *queued,
                    gated: *gated,
                    deleting: false,
                    failed_at: None,
                    completed: false,
                };
                self.jobs.push(job.clone());
                Answer::Job(job)
            }
            Write::DeleteJob {
                uid,
                rv,
                foreground,
            } => {
                // Gone already is done (the executor takes a 404 so); another version
                // is a conflict.
                let Some(job) = self.job(*uid) else {
                    return Answer::Done;
                };
                if job.rv != *rv {
                    return Answer::Refused;
                }
                if *foreground {
                    let rv = self.next_rv();
                    if let Some(j) = self.job_mut(*uid) {
                        j.deleting = true;
                        j.rv = rv;
                    }
                } else {
                    // In the background the Job goes at once; the garbage collector
                    // takes its pods after.
                    self.collect_job(*uid);
                }
                Answer::Done
            }
            Write::Ungate { uid, rv } => {
                if self.pod(*uid).is_none_or(|p| p.rv != *rv) {
                    return Answer::Refused;
                }
                let rv = self.next_rv();
                if let Some(p) = self.pod_mut(*uid) {
                    p.gated = false;
                    p.rv = rv;
                }
                self.bind(*uid);
                Answer::Done
            }
            Write::DeletePod { uid, rv } => {
                let Some(pod) = self.pod(*uid) else {
                    return Answer::Done;
                };
                if pod.rv != *rv {
                    return Answer::Refused;
                }
                self.delete_pod(*uid);
                Answer::Done
            }
            Write::Reserve { sequence, gpus } => {
                if *sequence < self.quota.fence && !self.quota.ignores_tokens {
                    return Answer::Refused;
                }
                match self.quota.outage {
                    Outage::Unavailable => return Answer::Refused,
                    Outage::Full if self.quota.held.is_none() => {
                        self.quota.fence = self.quota.fence.max(*sequence);
                        return Answer::Quota(QuotaAnswer::Refused {
                            reason: "InsufficientQuota".into(),
                            message: format!("no room for {gpus} GPUs"),
                        });
                    }
                    _ => {}
                }
                self.quota.fence = self.quota.fence.max(*sequence);
                // One reservation per uid: a repeated PUT returns it as it is, with the
                // GPUs it holds (docs/quota-api.md, "Idempotency").
                let gpus = *self.quota.held.get_or_insert(*gpus);
                if self.quota.outage == Outage::AnswersLost {
                    return Answer::Refused;
                }
                Answer::Quota(QuotaAnswer::Reserved {
                    id: "rsv-1".into(),
                    gpus,
                })
            }
            // The executor hands any failure of a release to the plan as an answer.
            Write::Release { sequence } => {
                if *sequence < self.quota.fence && !self.quota.ignores_tokens {
                    return self.release_failed("412: it has seen a later call");
                }
                if self.quota.outage == Outage::Unavailable {
                    return self.release_failed("503");
                }
                self.quota.fence = self.quota.fence.max(*sequence);
                self.quota.held = None;
                if self.quota.outage == Outage::AnswersLost {
                    return self.release_failed("timed out");
                }
                Answer::Quota(QuotaAnswer::Released)
            }
        }
    }

    /// A release answered with a failure; noted when its sender hears it.
    fn release_failed(&mut self, why: &str) -> Answer {
        self.quota.release_failed |= !self.landing_late;
        Answer::Quota(QuotaAnswer::ReleaseFailed {
            message: why.to_owned(),
        })
    }

    /// The GPUs the pods that can run ask for.
    pub fn running_gpus(&self) -> i32 {
        self.pods
            .iter()
            .filter(|p| p.can_run())
            .map(|p| p.gpus)
            .sum()
    }

    /// A pod on a node stops first (the kubelet); one on no node goes at once.
    fn delete_pod(&mut self, uid: u32) {
        let Some(p) = self.pod(uid) else { return };
        if p.bound && !p.ended {
            let rv = self.next_rv();
            if let Some(p) = self.pod_mut(uid) {
                p.deleting = true;
                p.rv = rv;
            }
        } else {
            self.pods.retain(|p| p.uid != uid);
        }
    }

    /// The Job controller makes a pod for a Job its informer has, whether or not the
    /// API server still has that Job.
    pub fn create_pod(&mut self, job: u32) {
        let Some(seen) = self
            .jobs
            .iter()
            .chain(&self.gone_jobs)
            .find(|j| j.uid == job)
        else {
            return;
        };
        let seen = seen.clone();
        self.made_pod_for.push(job);
        let pod = PodObj {
            uid: self.next_uid(),
            rv: self.next_rv(),
            job_uid: seen.uid,
            attempt: seen.attempt,
            gpus: gpus_at(seen.generation),
            gated: seen.gated,
            bound: false,
            ended: false,
            succeeded: false,
            deleting: false,
        };
        let (uid, gated) = (pod.uid, pod.gated);
        self.pods.push(pod);
        if !gated {
            self.bind(uid);
        }
    }

    /// kube-scheduler places a pod no gate holds (the fake nodes have room for it).
    fn bind(&mut self, uid: u32) {
        let rv = self.next_rv();
        let Some(p) = self.pod_mut(uid) else { return };
        p.bound = true;
        p.rv = rv;
        let attempt = p.attempt;
        self.ran.push(attempt);
    }

    /// A running pod's containers end: it failed, or it succeeded.
    pub fn end_pod(&mut self, uid: u32, succeeded: bool) {
        let rv = self.next_rv();
        if let Some(p) = self.pod_mut(uid) {
            p.ended = true;
            p.succeeded = succeeded;
            p.rv = rv;
        }
    }

    /// The Job controller records a Job's end from its pod's: Complete when it
    /// succeeded, else Failed (its backoff limit is 0).
    pub fn end_job(&mut self, uid: u32, tick: u8) {
        let rv = self.next_rv();
        let succeeded = self.pods.iter().any(|p| p.job_uid == uid && p.succeeded);
        if let Some(j) = self.job_mut(uid) {
            if succeeded {
                j.completed = true;
            } else {
                j.failed_at = Some(tick);
            }
            j.rv = rv;
        }
    }

    /// The Jobs whose pod ended and whose end the Job controller has not recorded.
    pub fn ending_jobs(&self) -> Vec<u32> {
        self.jobs
            .iter()
            .filter(|j| j.failed_at.is_none() && !j.completed)
            .filter(|j| self.pods.iter().any(|p| p.job_uid == j.uid && p.ended))
            .map(|j| j.uid)
            .collect()
    }

    /// The kubelet stopped a deleted pod that ran: it ends Failed (the Job controller
    /// counts it), and goes once the garbage collector or its Job's deletion takes it.
    pub fn stop_pod(&mut self, uid: u32) {
        let rv = self.next_rv();
        if let Some(p) = self.pod_mut(uid) {
            p.ended = true;
            p.rv = rv;
        }
    }

    /// The garbage collector: a pod whose Job is gone or deleted in the foreground is
    /// deleted; a Job deleted in the foreground goes once its pods have.
    pub fn collect_pod(&mut self, uid: u32) {
        if self.pod(uid).is_some_and(|p| p.deleting) {
            self.pods.retain(|p| p.uid != uid);
        } else {
            self.delete_pod(uid);
        }
    }

    pub fn collect_job(&mut self, uid: u32) {
        if let Some(i) = self.jobs.iter().position(|j| j.uid == uid) {
            let gone = self.jobs.remove(i);
            self.gone_jobs.push(gone);
        }
    }

    /// The Jobs the Job controller may make a pod for: one its informer may have (in
    /// the API server, or gone and not yet seen to go) that is not suspended, not seen
    /// failed and has no pod yet. Its informer may lag, so any version of the Job it
    /// could hold is taken as the newest here (the gate is in the template from the
    /// create on, and suspension only ends).
    pub fn pod_makers(&self) -> Vec<u32> {
        self.jobs
            .iter()
            .chain(&self.gone_jobs)
            .filter(|j| !j.suspended && j.failed_at.is_none() && !j.completed)
            .filter(|j| !self.made_pod_for.contains(&j.uid))
            .map(|j| j.uid)
            .collect()
    }

    /// The pods the garbage collector may act on now.
    pub fn collectable_pods(&self) -> Vec<u32> {
        self.pods
            .iter()
            .filter(|p| {
                let owner_going = self.job(p.job_uid).is_none_or(|j| j.deleting);
                // A deleting pod still running waits for its kubelet.
                owner_going && (!p.deleting || p.ended || !p.bound)
            })
            .map(|p| p.uid)
            .collect()
    }

    pub fn collectable_jobs(&self) -> Vec<u32> {
        self.jobs
            .iter()
            .filter(|j| j.deleting && !self.pods.iter().any(|p| p.job_uid == j.uid))
            .map(|j| j.uid)
            .collect()
    }

    pub fn edit(&mut self) {
        self.gpujob.generation += 1;
        self.gpujob.rv = self.next_rv();
    }
}

/// The GPUs the spec of `generation` asks for: each edit asks for one more, so a
/// reservation made before an edit no longer covers an attempt of the spec after it.
pub fn gpus_at(generation: i64) -> i32 {
    i32::try_from(generation).unwrap_or(i32::MAX)
}

impl Api {
    /// Once faults stop, everything but the replicas acts until nothing is left to do:
    /// the kubelet stops deleted pods, the Job controller records ended pods and makes
    /// the pods of the Jobs that exist (its informer has caught up), the garbage
    /// collector collects, Kueue admits, the clock passes a backoff.
    pub fn settle(&mut self, tick: &mut u8) {
        loop {
            let stop: Vec<u32> = self
                .pods
                .iter()
                .filter(|p| p.deleting && p.bound && !p.ended && !self.node_lost)
                .map(|p| p.uid)
                .collect();
            let ended = self.ending_jobs();
            let make: Vec<u32> = self
                .pod_makers()
                .into_iter()
                .filter(|uid| self.job(*uid).is_some_and(|j| !j.deleting))
                .collect();
            let pods = self.collectable_pods();
            let jobs = self.collectable_jobs();
            let admit = self.admissible();
            let backoff = self.jobs.iter().any(|j| j.failed_at == Some(*tick));
            if stop.is_empty()
                && ended.is_empty()
                && make.is_empty()
                && pods.is_empty()
                && jobs.is_empty()
                && admit.is_empty()
                && !backoff
            {
                return;
            }
            stop.into_iter().for_each(|p| self.stop_pod(p));
            ended.into_iter().for_each(|j| self.end_job(j, *tick));
            make.into_iter().for_each(|j| self.create_pod(j));
            pods.into_iter().for_each(|p| self.collect_pod(p));
            jobs.into_iter().for_each(|j| self.collect_job(j));
            admit.into_iter().for_each(|j| self.admit(j));
            if backoff {
                *tick += 1;
            }
        }
    }

    /// Kueue admits a Job waiting in its LocalQueue: it unsuspends it.
    pub fn admit(&mut self, uid: u32) {
        let rv = self.next_rv();
        if let Some(j) = self.job_mut(uid) {
            j.suspended = false;
            j.rv = rv;
        }
    }

    /// The Jobs Kueue may admit: suspended, labelled for a queue, not being deleted.
    pub fn admissible(&self) -> Vec<u32> {
        self.jobs
            .iter()
            .filter(|j| j.suspended && j.queued && !j.deleting && j.failed_at.is_none())
            .filter(|j| !j.completed)
            .map(|j| j.uid)
            .collect()
    }
}
