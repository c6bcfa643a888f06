//! Pure decisions: `(GpuJob, its Jobs, what the outside answered, now) -> Plan`. No
//! client here; every step is decided here and unit-tested without a cluster:
//! validation (first: an invalid spec never reserves anything), the quota protocol
//! (`reservation.rs`: finalizer, reserve, record, release, finalizer removal), attempt
//! numbering, retry timing, spec changes, phase and conditions (`attempts.rs`).
//!
//! A plan is carried out by the executor (`apply`), which alone reads and writes. The
//! plan asks for every read it needs as an action: what the caches cannot say
//! ([`Action::Read`], `reads.rs`, asked before anything is decided), a confirming read
//! of the GpuJob before the first effect from a view not known current
//! ([`Action::Confirm`], or once per namespace and term [`Action::ReadTermStart`]), the
//! GpuJob's pods before a gate goes or quota is released ([`Action::ReadPods`]). Actions
//! that ask (those reads, reserve, release, a Job the API server may refuse) end a plan:
//! their answer comes back through [`Observed`] and the plan is made again, at most
//! [`MAX_PLANS`] times per reconcile, so every decision that depends on an answer is made
//! here too. A confirming read that finds the view current lets the same plan go on.
//!
//! Which attempt may run is decided in one place, at its pods (`gate.rs`): every
//! attempt's pod is created with the operator's scheduling gate, and only the plan's
//! [`Action::UngatePod`] lets one go, after a read of the API server shows it is the
//! current attempt's and no other attempt's pod can run.

mod attempts;
mod gate;
mod lifecycle;
mod reads;
mod reservation;

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use kube::core::DynamicObject;

use crate::api::{ConditionStatus, GpuJob, GpuJobStatus};
use crate::events::Note;
use crate::quota::ReserveRequest;
use crate::seen_job::SeenJob;
use crate::seen_pod::SeenPod;
pub use crate::status::{
    ADMITTED, CLAIM_TEMPLATE_NAME_CONFLICT, POD_GROUP_NAME_CONFLICT, QUEUED, SERVICE_NAME_CONFLICT,
    SPEC_CHANGE_PENDING, UNSCHEDULABLE, WAITING_FOR_LOST_NODE,
};
use crate::status::{READY, seconds, set_condition};
use crate::validate::{SpecLimits, multi_node_name, validate};

pub use attempts::{
    JobState, PodsWaiting, backoff, backoff_for, job_state, pods_waiting, seen_state,
};
pub use reads::{
    Found, FoundJob, NodeHealth, NodeState, Read, Reads, node_state_of, termination_of,
    unschedulable_of, workload_wait,
};

/// How many plans one reconcile may make. A plan is made again only once a question it
/// ended with is answered, and no plan asks again what its reconcile has answered. What
/// may come, at most, before the plan that ends:
/// - the reads (`reads.rs`): two rounds (the Jobs', then those the Jobs found make due);
///   a plan that reads asks nothing else;
/// - the term's start, only in a reconcile's first plan (the executor declines it for
///   the rest of the reconcile once a run has not read it), so never beside the first
///   reads: with them, one;
/// - a confirming read that finds the GpuJob moved on (once: the version read is
///   current), and two more rounds of reads for the version it found;
/// - the pods (a second time only after a pod write, which comes at most once before a
///   question: the gate's writes end a plan's questions);
/// - the quota service (a reserve, a release) and a create refused (the Job, or the
///   Service before it: either ends the attempt's start).
///
/// That is 2 + 1 + 2 + 2 + 2 + 1 = 10 questions, 11 plans; 12 leaves one to spare. More
/// is a planning defect, which must not loop: the operator reports it as an error
/// (`Undecided`), and the protocol model fails on it in every state it explores.
pub const MAX_PLANS: usize = 12;
/// Condition reason for a spec the operator cannot run; it waits for a spec change.
pub const INVALID_SPEC: &str = "InvalidSpec";
/// Condition reason: a Job this GpuJob does not control holds the next attempt's name.
pub const JOB_NAME_CONFLICT: &str = "JobNameConflict";
/// How long a new attempt's pods get to be placed before the operator reads why not:
/// the scheduler's first pass takes milliseconds, and most attempts are running by then,
/// so most never cost a pod read.
pub const SCHEDULING_GRACE: Duration = Duration::from_secs(5);
/// Condition reason: the next attempt waits until an earlier attempt's pods are gone.
pub const OLD_ATTEMPT_STOPPING: &str = "OldAttemptStopping";
/// How often a GpuJob waiting for a pod on a lost node ([`WAITING_FOR_LOST_NODE`])
/// reads that node again: nothing watches Nodes, and a node that comes back, or a pod
/// a person force-deletes, ends the wait (the latter is an event too).
pub const LOST_NODE_RECHECK: Duration = Duration::from_secs(60);
/// Why a GpuJob with `spec.queueName` does not run where the operator reserves quota.
const BOTH_QUEUES: &str = "invalid spec: spec.queueName: this operator reserves GPUs from an external quota service (--quota-provider http); a GpuJob queues through Kueue or through that service, not both: remove spec.queueName, or run it where the operator has no quota service";
/// How a reason found by checking the spec here begins (the API server's refusals do not).
const INVALID_LEAD: &str = "invalid spec: ";
/// Ready reason: a failure rule (`FailGpuJob`) ended the GpuJob.
pub const FAILURE_RULE: &str = "FailureRuleMatched";

/// Operator settings the plan depends on.
#[derive(Debug, Clone)]
pub struct PlanSettings {
    /// Backoff after the first failure; doubles per failure.
    pub backoff_base: Duration,
    /// Longest backoff.
    pub backoff_max: Duration,
    /// Jobs of this many most recent attempts are kept for debugging; older ones deleted.
    pub keep_jobs: i32,
    /// What a spec may ask for (semantic validation): GPUs, service accounts.
    pub limits: SpecLimits,
    /// How long releasing quota may keep failing before the GpuJob says CleanupStuck.
    pub cleanup_timeout: Duration,
    /// How often a GpuJob whose next Job name is taken by a foreign Job looks again.
    pub name_conflict_retry: Duration,
    /// Finished GpuJobs without `ttlSecondsAfterFinished` are deleted this long after
    /// they finished; `None`: kept.
    pub default_ttl: Option<Duration>,
    /// The API versions whose meaning the operator applies (`--api-versions`).
    pub api_versions: ApiVersions,
    /// kube-apiserver serves PodGroups (`--gang-scheduling`): each multi-node attempt's
    /// pods are one gang (`crate::gang`).
    pub gang: bool,
    /// The operator reads and lets go pods on the worker clusters of Kueue's MultiKueue
    /// (`--multikueue-worker`): a dispatched attempt's pods wait at the gate there.
    pub multikueue: bool,
}

/// What the operator knows of the GpuJob API (`--api-versions`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ApiVersions {
    /// v1 and v2: `spec.v2` (template, GPU product, per-GpuJob backoff, deadline as
    /// written) shapes each attempt.
    #[default]
    V1AndV2,
    /// The rollback mode: v1 as it was before v2 existed. `spec.v2` is ignored (never
    /// removed: the plan reads a copy without it, and no write touches the spec), so a
    /// GpuJob written through v2 runs as its v1 fields say.
    V1,
}

impl Default for PlanSettings {
    fn default() -> PlanSettings {
        // As the Job controller does for pod failures: 10 s doubling to 6 min.
        PlanSettings {
            backoff_base: Duration::from_secs(10),
            backoff_max: Duration::from_secs(360),
            keep_jobs: 3,
            limits: SpecLimits::default(),
            cleanup_timeout: Duration::from_secs(15 * 60),
            name_conflict_retry: Duration::from_secs(60),
            default_ttl: None,
            api_versions: ApiVersions::default(),
            gang: false,
            multikueue: false,
        }
    }
}

/// How a failed attempt's container ended, read from its pod.
#[derive(Debug, Clone, PartialEq)]
pub struct Termination {
    pub attempt: i32,
    pub exit_code: Option<i32>,
    pub reason: String,
    pub message: String,
}

/// What the operator sees of one GpuJob, and what the outside answered so far in this
/// reconcile.
#[derive(Debug)]
pub struct Observed<'a> {
    pub gpujob: &'a GpuJob,
    /// Jobs controlled by this GpuJob, authoritative: a Job missing here is gone.
    pub jobs: Vec<&'a SeenJob>,
    /// The pod outcome of the newest failed Job, when its failure is not recorded yet.
    pub termination: Option<Termination>,
    /// The running attempt's pod cannot be placed (read once [`pods_waiting`] says so).
    pub unschedulable: Option<Unschedulable>,
    /// Why Kueue holds the current attempt's Job, from its Workload (read while the Job
    /// waits in its queue: [`SeenJob::queued`]).
    pub queue_wait: Option<QueueWait>,
    /// The next attempt's Job cannot be created: the API server refused it just now, or
    /// a foreign Job still holds its name. Plan as if it was not started.
    pub refused: Option<Refusal>,
    /// External GPU quota is in use: attempts start only once a reservation is recorded.
    pub quota_required: bool,
    /// The quota service's answer to this reconcile's reserve or release.
    pub quota: Option<QuotaAnswer>,
    /// The GpuJob's pods, read from the API server in this reconcile
    /// ([`Action::ReadPods`]); `None` when not read. Only such a read lets a gate go.
    pub pods: Option<Vec<SeenPod>>,
    /// The GpuJob's pods as the pod cache has them. It may lag: it only tells the plan
    /// that a read is due (a pod waits at the gate).
    pub cached_pods: Vec<&'a SeenPod>,
    /// The GpuJob is known current in this term of its shard: read from the API server,
    /// or written by this replica, at this version (every write carries a
    /// resourceVersion precondition), or changed after the term began. Another cached
    /// view may lag behind the previous holder's writes.
    pub confirmed: bool,
    /// Where the term of the GpuJob's shard began is not known in its namespace, and
    /// this reconcile is the one to read it ([`Action::ReadTermStart`]) rather than
    /// confirm its GpuJob.
    pub term_start_due: bool,
    /// The reads ([`Action::Read`]) made in this reconcile.
    pub reads: Reads,
    /// The Nodes read in this reconcile ([`Read::Node`]): those a pod of the GpuJob is
    /// being deleted on.
    pub nodes: Vec<NodeHealth>,
    pub now: Timestamp,
}

/// The running attempt's pod that kube-scheduler could not place, and its reason.
#[derive(Debug, Clone, PartialEq)]
pub struct Unschedulable {
    pub attempt: i32,
    /// The scheduler's message (`0/4 nodes are available: 4 Insufficient nvidia.com/gpu`).
    pub message: String,
}

/// Why Kueue has not admitted an attempt's Job, from its Workload's conditions.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueWait {
    pub attempt: i32,
    /// Kueue's reason (`Pending`, `Preempted`, …), or the operator's when it found no
    /// Workload (`NoWorkload`, `KueueNotInstalled`).
    pub reason: String,
    /// Kueue's words (`couldn't assign flavors to pod set main: insufficient unused
    /// quota for nvidia.com/gpu in flavor gpu, 8 more needed`).
    pub message: String,
}

/// A Job create the API server refused for a reason that retrying soon will not fix.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    pub attempt: i32,
    /// [`INVALID_SPEC`] (422: waits for a spec change), [`JOB_NAME_CONFLICT`] or
    /// [`SERVICE_NAME_CONFLICT`] or [`CLAIM_TEMPLATE_NAME_CONFLICT`] (the attempt's Job
    /// exists, and is not started).
    pub reason: &'static str,
    pub message: String,
}

/// What the quota service answered.
#[derive(Debug, Clone, PartialEq)]
pub enum QuotaAnswer {
    /// Granted; `gpus`: what the service says the reservation holds (the request's
    /// count when it does not say).
    Reserved {
        id: String,
        gpus: i32,
    },
    Refused {
        reason: String,
        message: String,
    },
    Released,
    ReleaseFailed {
        message: String,
    },
}

impl QuotaAnswer {
    /// A grant of reservation `id`, holding `held` GPUs by the service's word (`None`:
    /// it did not say), for a reserve of `asked`, as it is recorded. A reservation the
    /// service held already (a reserve whose answer was lost, a release that did not
    /// land) comes back as it is, whatever size is asked: one smaller than asked is
    /// recorded as it is, so that it does not count as covering more (the plan
    /// releases it and reserves anew once no pod runs). One larger covers what was
    /// asked, which is recorded: taken as held, a service that rounds grants up would
    /// be released and asked again without end.
    pub fn granted(id: String, held: Option<i32>, asked: i32) -> QuotaAnswer {
        QuotaAnswer::Reserved {
            id,
            gpus: held.unwrap_or(asked).min(asked),
        }
    }
}

/// Why the quota finalizer goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinalizerRemoval {
    /// The reservation was released and that is recorded.
    Released,
    /// Quota is switched off: nothing can be released any more (abandoned).
    QuotaDisabled,
    /// An administrator asked for deletion without a release (abandoned, audited).
    ReleaseSkipped,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Write this status before the actions that follow (they depend on it being
    /// recorded: a reservation before the Job that uses it; a replaced attempt must
    /// never be taken for a failed one after a crash).
    RecordStatus(Box<GpuJobStatus>),
    /// Add the quota finalizer (before anything exists outside the cluster).
    AddFinalizer,
    /// Remove the quota finalizer.
    RemoveFinalizer(FinalizerRemoval),
    /// Read the GpuJob from the API server before an action made from a view not known
    /// current in this term ([`Action::needs_current_view`]); when it changed since, the
    /// plan is made again from it. The API server refuses a stale write of the GpuJob
    /// (resourceVersion), but the quota service cannot refuse a call made from a stale
    /// view (a reserve for a GpuJob that meanwhile finished would never be released), a
    /// Job create is refused only while the Job exists (one the previous holder deleted
    /// to replace it would be created again), and a stale view takes a rerun's running
    /// attempt for a stray or a replaced attempt for the current one.
    Confirm,
    /// Read where the term of the GpuJob's shard began (the resourceVersion of a quorum
    /// list of its namespace's GpuJobs), in place of a [`Action::Confirm`]: every GpuJob
    /// of the namespace changed after it, or cached at the version the list found,
    /// counts as current in the term, so most need no read of their own. One reconcile
    /// per namespace and term reads it. Ends the plan.
    ReadTermStart,
    /// Read what the caches cannot say before deciding ([`Read`], `reads.rs`). A plan
    /// that asks for reads asks for nothing else; the next plan has their answers.
    Read(Read),
    /// Ask the quota service for a reservation, with this fencing sequence (recorded in
    /// `status.quotaCall` before). Ends the plan: the answer comes back.
    Reserve(ReserveRequest, i64),
    /// Release the GpuJob's reservation, with this fencing sequence (recorded in
    /// `status.quotaCall` before). Ends the plan: the answer comes back.
    Release(i64),
    /// Read the GpuJob's pods from the API server (a quorum list), before a gate goes or
    /// quota is released: the pod cache may lag, and a Job gone (deleted in the
    /// foreground) does not prove its pods are (the Job controller can create a pod for
    /// a Job whose deletion it has not seen yet). Ends the plan: the answer comes back.
    /// `workers`: on every MultiKueue worker cluster too (`status.multiKueueDispatched`,
    /// or a dispatched Job or a worker's pod seen now).
    ReadPods { workers: bool },
    /// Create the Job of `attempt` (stable name: a second create is refused while the
    /// first Job exists). Its pods come out gated. The API server may refuse it; then the
    /// plan is made again with the refusal.
    CreateJob { attempt: i32, job: Box<Job> },
    /// Create a multi-node attempt's headless Service (`crate::rendezvous`), before its
    /// Job starts: its pods find each other through it from their first moment. One of
    /// that name owned by the Job already is the same Service (done); a foreign one is a
    /// refusal ([`SERVICE_NAME_CONFLICT`]), and the plan is made again with it.
    CreateService { attempt: i32, service: Box<Service> },
    /// Create the ResourceClaimTemplate of an attempt whose pods get their GPUs by DRA
    /// (`crate::claims`), before its Job: the ResourceClaim controller makes each pod's
    /// claim from the template that holds the name when the pod appears. One of that
    /// name owned by the GpuJob already is done (a create before a crash); a foreign one
    /// is a refusal ([`CLAIM_TEMPLATE_NAME_CONFLICT`]): the plan is made again with it,
    /// and the attempt does not start.
    CreateClaimTemplate {
        attempt: i32,
        template: Box<ResourceClaimTemplate>,
    },
    /// Create a multi-node attempt's PodGroup (`crate::gang`), where kube-apiserver
    /// serves them, before any of its pods is let go: kube-scheduler places the gang
    /// whole or not at all. As with the Service: one of that name owned by the Job
    /// already is done; a foreign one is a refusal ([`POD_GROUP_NAME_CONFLICT`]).
    CreatePodGroup {
        attempt: i32,
        group: Box<DynamicObject>,
    },
    /// Let one pod of the current attempt go: remove the operator's scheduling gate, with
    /// the pod's resourceVersion as precondition (the pod as the read found it; one
    /// changed since, a deletion begun say, is read and decided again). Only the gate
    /// (`gate.rs`) plans it.
    UngatePod {
        name: String,
        uid: String,
        resource_version: String,
        /// The worker cluster the pod is on ([`SeenPod::cluster`]); `None`: this one.
        cluster: Option<String>,
    },
    /// Delete a pod that waits at the gate but is not the current attempt's, and that no
    /// Job deletion will take (its Job has finished and is kept, or no Job owns it), with
    /// uid and resourceVersion preconditions: it never ran and never will, but until it is
    /// gone it holds the current attempt's gate. Only `gate.rs` plans it.
    DeletePod {
        name: String,
        uid: String,
        resource_version: String,
        cluster: Option<String>,
    },
    /// A Job an earlier version of the operator created suspended, whose pod template
    /// has no gate: the gate is added to its template, and without a Kueue LocalQueue it
    /// is unsuspended; with one (`queue`: the Job's label, or the GpuJob's
    /// `spec.queueName`, which that version added only when it started the Job) it gets
    /// the queue's label and stays suspended for Kueue to admit. One patch, with the Job's
    /// resourceVersion as precondition (a suspended Job that never ran may have its
    /// scheduling gates changed). Its pods then wait at the gate like every attempt's.
    GateJob {
        name: String,
        resource_version: String,
        queue: Option<String>,
    },
    /// Delete a Job, with uid and resourceVersion preconditions; `why` decides how.
    DeleteJob {
        name: String,
        uid: String,
        resource_version: String,
        why: JobDeletion,
    },
    /// An Event that no status transition carries.
    Publish(Note),
    /// Delete the GpuJob itself (its time to live after finishing is over), with uid and
    /// resourceVersion preconditions; its Jobs go with it (garbage collection).
    DeleteGpuJob {
        uid: String,
        resource_version: String,
    },
}

impl Action {
    /// The action's kind, for logs.
    pub fn name(&self) -> &'static str {
        match self {
            Action::RecordStatus(_) => "RecordStatus",
            Action::AddFinalizer => "AddFinalizer",
            Action::RemoveFinalizer(_) => "RemoveFinalizer",
            Action::Confirm => "Confirm",
            Action::ReadTermStart => "ReadTermStart",
            Action::Read(Read::Job { .. }) => "ReadJob",
            Action::Read(Read::Termination { .. }) => "ReadTermination",
            Action::Read(Read::Placement { .. }) => "ReadPlacement",
            Action::Read(Read::Workload { .. }) => "ReadWorkload",
            Action::Read(Read::Node { .. }) => "ReadNode",
            Action::Read(Read::Devices { .. }) => "ReadDevices",
            Action::Read(Read::ClaimTemplate { .. }) => "ReadClaimTemplate",
            Action::Reserve(..) => "Reserve",
            Action::Release(_) => "Release",
            Action::ReadPods { .. } => "ReadPods",
            Action::CreateJob { .. } => "CreateJob",
            Action::CreateService { .. } => "CreateService",
            Action::CreateClaimTemplate { .. } => "CreateClaimTemplate",
            Action::CreatePodGroup { .. } => "CreatePodGroup",
            Action::UngatePod { .. } => "UngatePod",
            Action::DeletePod { .. } => "DeletePod",
            Action::GateJob { .. } => "GateJob",
            Action::DeleteJob { .. } => "DeleteJob",
            Action::Publish(_) => "Publish",
            Action::DeleteGpuJob { .. } => "DeleteGpuJob",
        }
    }

    /// Whether the action's answer is needed before anything else can be decided.
    pub fn asks(&self) -> bool {
        matches!(
            self,
            Action::Reserve(..)
                | Action::Release(_)
                | Action::ReadPods { .. }
                | Action::ReadTermStart
                | Action::Read(_)
        )
    }

    /// Whether the action writes a pod: a pod read made before it is stale after it.
    pub fn writes_pods(&self) -> bool {
        matches!(self, Action::UngatePod { .. } | Action::DeletePod { .. })
    }

    /// Whether the action is sent from the plan's view of the GpuJob without a
    /// precondition on the GpuJob itself: a view not known current must be confirmed
    /// first ([`Action::Confirm`]). The GpuJob's own writes carry its resourceVersion,
    /// and an Event reports what this term recorded.
    fn needs_current_view(&self) -> bool {
        matches!(
            self,
            Action::Reserve(..)
                | Action::Release(_)
                | Action::ReadPods { .. }
                | Action::CreateJob { .. }
                | Action::CreateService { .. }
                | Action::CreateClaimTemplate { .. }
                | Action::CreatePodGroup { .. }
                | Action::UngatePod { .. }
                | Action::DeletePod { .. }
                | Action::GateJob { .. }
                | Action::DeleteJob { .. }
        )
    }
}

/// Why a Job is deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobDeletion {
    /// The running attempt, replaced after a spec change (`Recreate`).
    Replaced,
    /// The running attempt, stopped by `spec.suspend`.
    Suspended,
    /// Not the current attempt's Job, and not finished: attempts run one at a time. A
    /// create sent by a replica that then lost the shard can land late and bring back
    /// the Job of an attempt its successor had already ended.
    Stray,
    /// A finished attempt's Job beyond the `keep_jobs` most recent.
    Old,
    /// A running Job of a GpuJob being deleted: its quota is released once it is gone.
    GpuJobDeleted,
}

impl JobDeletion {
    /// In the foreground, the Job stays (deleting) until its pods are gone, so the
    /// next attempt, which waits for it, never overlaps them. A finished Job's pods have
    /// ended: it goes at once (background; batch/v1 would orphan its pods otherwise).
    pub fn foreground(self) -> bool {
        !matches!(self, JobDeletion::Old)
    }
}

/// What a pod read says of the pods that may still run ([`Planner::pods_left`]).
#[derive(Debug, Clone, PartialEq)]
enum PodsLeft {
    /// None: go on.
    None,
    /// Not read in this reconcile: the plan now ends asking for them.
    Asked,
    /// This one, at least (why, for Ready).
    Some(String),
}

/// What the queue does with a GpuJob after its plan is carried out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Converged for now: wait for an event.
    Done,
    /// Look again after this long (a backoff between attempts ends).
    After(Duration),
    /// Waiting on something outside (quota refused, a release failing): ask again with
    /// per-key exponential backoff, so a long shortage costs few calls.
    Backoff,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// In order. When the last one asks the outside ([`Action::asks`]), the status
    /// below is not written: the plan is made again with the answer.
    pub actions: Vec<Action>,
    pub status: GpuJobStatus,
    pub next: Next,
}

impl Plan {
    /// Whether carrying out this plan ends with a question rather than a status.
    pub fn asks(&self) -> bool {
        self.actions.last().is_some_and(Action::asks)
    }
}

pub fn plan(obs: &Observed<'_>, settings: &PlanSettings) -> Plan {
    // The rollback mode plans on a copy without spec.v2: validation, the Job and the
    // backoff then see only what v1 said before v2 existed.
    let v1_only;
    let stripped;
    let obs = match settings.api_versions {
        ApiVersions::V1 if obs.gpujob.spec.v2.is_some() => {
            let mut gj = obs.gpujob.clone();
            gj.spec.v2 = None;
            v1_only = gj;
            stripped = Observed {
                gpujob: &v1_only,
                jobs: obs.jobs.clone(),
                termination: obs.termination.clone(),
                unschedulable: obs.unschedulable.clone(),
                queue_wait: obs.queue_wait.clone(),
                refused: obs.refused.clone(),
                quota_required: obs.quota_required,
                quota: obs.quota.clone(),
                pods: obs.pods.clone(),
                cached_pods: obs.cached_pods.clone(),
                confirmed: obs.confirmed,
                term_start_due: obs.term_start_due,
                reads: obs.reads.clone(),
                nodes: Vec::new(),
                now: obs.now,
            };
            &stripped
        }
        _ => obs,
    };
    let mut p = Planner::new(obs, settings);
    let due = p.reads_due();
    if !due.is_empty() {
        // Nothing is decided without them.
        return Plan {
            actions: due.into_iter().map(Action::Read).collect(),
            status: p.current,
            next: Next::Done,
        };
    }
    p.run();
    // A question ends the plan: what follows is decided again with its answer.
    if let Some(i) = p.actions.iter().position(Action::asks) {
        p.actions.truncate(i + 1);
    }
    p.confirm_before_effects();
    Plan {
        actions: p.actions,
        status: p.next,
        next: p.requeue,
    }
}

/// The attempt `job` runs, if it is one this operator could have created for the GpuJob
/// named `gpujob` whose status records `recorded` attempts: named as that attempt's Job,
/// and numbered at most one past `recorded` (the next attempt's Job, whose create may
/// have landed before its status, or late). Anything else (a number past that, a label
/// on a Job of another name: anyone who may create Jobs can add a controller reference
/// to the GpuJob) is a stray, never an attempt.
pub fn recognized_attempt(job: &SeenJob, gpujob: &str, recorded: i32) -> Option<i32> {
    let a = job.attempt?;
    let limit = recorded.max(0).saturating_add(1);
    (a <= limit && job.name == crate::job::job_name(gpujob, a)).then_some(a)
}

/// One planning pass; its fields are what every step reads and writes.
struct Planner<'a, 'o> {
    gj: &'a GpuJob,
    obs: &'a Observed<'o>,
    settings: &'a PlanSettings,
    now: Timestamp,
    generation: Option<i64>,
    name: String,
    current: GpuJobStatus,
    /// The status as recorded by the last `RecordStatus` of this plan (initially the
    /// stored one): each checkpoint builds on the one before.
    recorded: GpuJobStatus,
    next: GpuJobStatus,
    actions: Vec<Action>,
    requeue: Next,
    /// The GpuJob's attempt Jobs: those this operator could have created, by attempt
    /// ([`Planner::recognized`]). Any other Job it controls is a stray.
    by_attempt: BTreeMap<i32, &'a SeenJob>,
    /// Why no attempt may start for this generation (`InvalidSpec` and the field), if so.
    invalid: Option<(&'static str, String)>,
    /// The next attempt's Job cannot be created ([`Planner::refusal`]).
    refused: Option<Refusal>,
}

impl<'a, 'o> Planner<'a, 'o> {
    fn new(obs: &'a Observed<'o>, settings: &'a PlanSettings) -> Planner<'a, 'o> {
        let gj = obs.gpujob;
        let current = gj.status.clone().unwrap_or_default();
        let mut next = current.clone();
        // Seen once, kept: the workers are read for this GpuJob from now on.
        let on_worker = |p: &SeenPod| p.cluster.is_some();
        next.multi_kueue_dispatched |= obs.jobs.iter().any(|j| j.dispatched())
            || obs.cached_pods.iter().any(|p| on_worker(p))
            || obs.pods.iter().flatten().any(on_worker);
        Planner {
            gj,
            obs,
            settings,
            now: seconds(obs.now),
            generation: gj.metadata.generation,
            name: gj.metadata.name.clone().unwrap_or_default(),
            next,
            recorded: current.clone(),
            current,
            actions: Vec::new(),
            requeue: Next::Done,
            by_attempt: BTreeMap::new(),
            invalid: None,
            refused: None,
        }
        .with_attempts()
    }

    /// Files the attempt Jobs by number ([`Planner::recognized`]), and what refuses the
    /// next one.
    fn with_attempts(mut self) -> Self {
        let obs = self.obs;
        self.by_attempt = obs
            .jobs
            .iter()
            .filter_map(|j| self.recognized(j).map(|a| (a, *j)))
            .collect();
        self.refused = self.refusal();
        self
    }

    /// [`recognized_attempt`] of `job` for this GpuJob.
    fn recognized(&self, job: &SeenJob) -> Option<i32> {
        recognized_attempt(job, &self.name, self.current.attempts)
    }

    fn run(&mut self) {
        if self.gj.metadata.deletion_timestamp.is_some() {
            // Being deleted: the garbage collector takes the Jobs; start nothing. Only
            // the quota finalizer is this operator's to settle.
            self.settle_deletion();
            return;
        }
        self.next.observed_generation = self.generation;
        // Validation first: nothing is reserved or started for a spec that cannot run.
        self.invalid = self.invalid_reason();
        if !self.obs.quota_required && self.gj.holds_quota_finalizer() {
            self.actions
                .push(Action::RemoveFinalizer(FinalizerRemoval::QuotaDisabled));
        }
        let final_ = |s: &GpuJobStatus| s.phase.is_some_and(crate::api::Phase::is_final);
        if final_(&self.current)
            && let Some(token) = self.rerun_requested()
        {
            self.start_new_run(token);
        }
        let attempt = if final_(&self.current) {
            self.finished();
            // Nothing of a finished GpuJob runs.
            self.stop_strays(None);
            self.stop_stray_pods(None);
            self.current.attempts
        } else {
            self.suspension();
            if self.obs.quota_required && !self.reserve_first() {
                return;
            }
            let attempt = self.attempts();
            self.stop_strays(Some(attempt));
            self.stop_stray_pods(Some(attempt));
            attempt
        };
        self.collect_old_jobs(attempt);
        self.terminal_conditions();
        if self.obs.quota_required {
            self.release_when_done_or_blocked();
        }
        self.expire_after_ttl();
    }

    /// Why attempts cannot start: the spec fails validation, or the API server refused
    /// this generation's Job already (recorded in Ready), or just now.
    fn invalid_reason(&self) -> Option<(&'static str, String)> {
        if let Err(e) = validate(&self.gj.spec, &self.settings.limits)
            .and_then(|()| multi_node_name(&self.name, &self.gj.spec))
        {
            return Some((INVALID_SPEC, format!("{INVALID_LEAD}{e}")));
        }
        if self.obs.quota_required && self.gj.spec.queue_name().is_some() {
            return Some((INVALID_SPEC, BOTH_QUEUES.to_owned()));
        }
        self.refused_before()
    }

    /// What Ready recorded of a refusal of this generation's attempt, as it was refused:
    /// without the failure of the attempt before it, which Ready says first
    /// (`attempts::after_failure`) and which is added again, or it would be added once
    /// more on every look (and every look would write). Not a reason found by checking the
    /// spec here (`INVALID_LEAD`): that is checked afresh, so a change of the operator's
    /// limits, or of its quota provider, lets an attempt start.
    fn refused_before(&self) -> Option<(&'static str, String)> {
        let c = self.current.conditions.iter().find(|c| {
            c.type_ == READY && c.reason == INVALID_SPEC && c.observed_generation == self.generation
        })?;
        let failure = self.current.last_failure.as_ref();
        let refusal = failure
            .and_then(|f| {
                c.message
                    .strip_prefix(&attempts::after_failure(&f.message, ""))
            })
            .unwrap_or(&c.message);
        (!refusal.starts_with(INVALID_LEAD)).then(|| (INVALID_SPEC, refusal.to_owned()))
    }

    fn ready(&mut self, status: ConditionStatus, reason: &str, message: String) {
        self.condition(READY, status, reason, message);
    }

    fn condition(&mut self, type_: &str, status: ConditionStatus, reason: &str, message: String) {
        set_condition(
            &mut self.next.conditions,
            type_,
            status,
            reason,
            message,
            self.generation,
            self.now,
        );
    }

    /// Records `change` before the actions that follow: applied to the last recorded
    /// status (so checkpoints build on each other) and to the final one.
    fn checkpoint(&mut self, change: impl Fn(&mut GpuJobStatus)) {
        change(&mut self.recorded);
        change(&mut self.next);
        self.actions
            .push(Action::RecordStatus(Box::new(self.recorded.clone())));
    }

    /// Look again after `d` at the latest (a backoff to the outside stays).
    fn requeue_within(&mut self, d: Duration) {
        self.requeue = match self.requeue {
            Next::Done => Next::After(d),
            Next::After(x) => Next::After(x.min(d)),
            Next::Backoff => Next::Backoff,
        };
    }

    /// Asks for the GpuJob's pods, on the MultiKueue workers too when a pod of it may be
    /// there.
    fn ask_pods(&mut self) {
        let workers = self.next.multi_kueue_dispatched;
        self.ask(Action::ReadPods { workers });
    }

    /// Whether any of the GpuJob's pods may still run ([`SeenPod::may_run`]), from a pod
    /// read of this reconcile; without one, asks for it ([`Action::ReadPods`]). Pods are
    /// watched, but only a read is sure: while some remain, the GpuJob looks again with
    /// backoff (their end is an event too).
    fn pods_left(&mut self) -> PodsLeft {
        let Some(pods) = &self.obs.pods else {
            self.ask_pods();
            return PodsLeft::Asked;
        };
        match pods.iter().find(|p| p.may_run()) {
            None => PodsLeft::None,
            Some(p) => {
                self.requeue = Next::Backoff;
                PodsLeft::Some(gate::not_stopped(p))
            }
        }
    }

    /// Ends the plan with a question to the outside: nothing else is planned after it.
    fn ask(&mut self, action: Action) {
        debug_assert!(action.asks());
        self.actions.push(action);
    }

    /// Puts [`Action::Confirm`] before the first action sent from the view of the GpuJob
    /// without a precondition on it ([`Action::needs_current_view`]: a reserve or release,
    /// a Job create, which a stable name refuses only while the Job exists, a stray's
    /// delete, a pod read for a gate), unless the view is known current in this term.
    /// The executor passes over it when an earlier write of this run (which carries the
    /// GpuJob's resourceVersion) has shown the view current.
    fn confirm_before_effects(&mut self) {
        if self.obs.confirmed {
            return;
        }
        let Some(i) = self.actions.iter().position(Action::needs_current_view) else {
            return;
        };
        // A finalizer patch always writes, with the GpuJob's resourceVersion: when one
        // comes first, it confirms the view by itself.
        let confirmed_before = self.actions[..i]
            .iter()
            .any(|a| matches!(a, Action::AddFinalizer | Action::RemoveFinalizer(_)));
        if confirmed_before {
            return;
        }
        if self.obs.term_start_due {
            // Read first; the next plan knows whether this version is past it.
            self.actions.insert(i, Action::ReadTermStart);
            self.actions.truncate(i + 1);
        } else {
            self.actions.insert(i, Action::Confirm);
        }
    }

    /// Whether the Ready condition about to be written has this reason.
    fn ready_reason_is(&self, reasons: &[&str]) -> bool {
        self.next
            .condition(READY)
            .is_some_and(|c| reasons.contains(&c.reason.as_str()))
    }
}

#[cfg(test)]
mod tests;
