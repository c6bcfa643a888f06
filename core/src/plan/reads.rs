//! The reads a plan asks for before it decides: what the caches cannot say, read from
//! the API server by the executor ([`Action::Read`]) and handed back to the next plan
//! of the same reconcile. The caches are enough for most GpuJobs most of the time; these
//! reads are due only when a decision depends on something they may lag behind or never
//! hold (a foreign Job, a pod's exit code, the scheduler's reason, Kueue's Workload,
//! whether the node of a pod being deleted is Ready).
//!
//! A read has no effect, so none waits for a confirmed view. Each is asked at most once
//! per reconcile ([`Reads`] remembers what was asked), and the Jobs' reads come first
//! (what they find decides which attempt the others are about): a reconcile makes at
//! most two rounds of them (a Node is read in the second, from the pod cache, never in
//! a round of its own after the pod read).

use k8s_openapi::api::core::v1::{Node, Pod};

use super::{
    Action, CLAIM_TEMPLATE_NAME_CONFLICT, JOB_NAME_CONFLICT, JobState, Planner, PodsWaiting,
    QueueWait, Refusal, Termination, Unschedulable, pods_waiting, seen_state,
};
use crate::api::{DeviceAllocation, Phase};
use crate::claims;
use crate::job::{job_name, name_taken};
use crate::seen_job::SeenJob;
use crate::seen_pod::{SeenPod, not_placed};
use crate::status::READY;

/// A read of the API server a plan asks for before deciding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Read {
    /// The Job holding the name of `attempt`'s Job. For the recorded attempt, whose Job
    /// the cache does not have: the cache may lag (a restart, a slow watch), and a Job
    /// taken for gone starts the next attempt. For the next attempt, while a foreign Job
    /// held its name when last tried: still held, nothing is reserved for an attempt
    /// that cannot start (no cache watches foreign Jobs).
    Job { attempt: i32 },
    /// How a failed attempt's container ended, from its Job's pods (by `controller-uid`):
    /// the Job itself only says `BackoffLimitExceeded`. `dispatched`: the Job runs on a
    /// worker cluster through MultiKueue ([`SeenJob::dispatched`]), where its pods are
    /// those of the attempt labelled with the GpuJob's uid.
    Termination {
        attempt: i32,
        job_uid: String,
        dispatched: bool,
    },
    /// Why the newest attempt's pods are not placed (their `PodScheduled` condition),
    /// once the scheduler's grace is over ([`pods_waiting`]) and the pod cache shows
    /// one of them unschedulable. `dispatched`: as for `Termination`.
    Placement {
        attempt: i32,
        job_uid: String,
        dispatched: bool,
    },
    /// Why Kueue holds the attempt's Job (its Workload, by `kueue.x-k8s.io/job-uid`).
    Workload { attempt: i32, job_uid: String },
    /// The Node a pod of the GpuJob is being deleted on while it may still run there
    /// ([`SeenPod::stopping_on`]): whether its kubelet can still confirm the stop
    /// (no cache watches Nodes).
    Node { name: String },
    /// The ResourceClaimTemplate the next attempt would be made with (`name`), while a
    /// foreign one held it when last tried: still held, nothing is reserved for an
    /// attempt that cannot start (as for a Job name: no cache watches templates).
    ClaimTemplate { attempt: i32, name: String },
    /// Which `firstAvailable` alternative the running attempt's pods were allocated,
    /// from their ResourceClaims (labelled with the GpuJob's uid and the attempt), once
    /// all of its pods are placed and before status says it.
    Devices { attempt: i32 },
}

impl Read {
    /// What the read answers when it finds nothing: no Job, no exit code, no reason the
    /// scheduler gave, a Workload Kueue has not decided on. (For tests and the protocol
    /// model, whose pods carry none of these.)
    pub fn found_nothing(&self) -> Found {
        match self {
            Read::Job { attempt } => Found::Job {
                attempt: *attempt,
                job: FoundJob::Absent,
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
            Read::Workload { attempt, .. } => Found::Workload(QueueWait {
                attempt: *attempt,
                reason: "Pending".to_owned(),
                message: "Kueue has not decided on the Workload yet".to_owned(),
            }),
            Read::Node { name } => Found::Node(NodeHealth {
                name: name.clone(),
                state: NodeState::Gone,
            }),
            Read::Devices { attempt } => Found::Devices {
                attempt: *attempt,
                claims: Vec::new(),
            },
            Read::ClaimTemplate { attempt, .. } => Found::ClaimTemplate {
                attempt: *attempt,
                foreign: false,
            },
        }
    }
}

/// What a read of a Node found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeHealth {
    pub name: String,
    pub state: NodeState,
}

impl NodeHealth {
    /// What Ready says while attempt `k` waits for `pod`, being deleted on this lost
    /// node: which node, and what a person does about it.
    pub(super) fn waiting_message(&self, k: i32, pod: &SeenPod) -> String {
        self.stopping_message(&format!("attempt {k} starts"), pod)
    }

    /// What waits (`waits`, e.g. "attempt 2 starts") for `pod`, being deleted on this
    /// node, and what to do.
    pub(super) fn stopping_message(&self, waits: &str, pod: &SeenPod) -> String {
        let of = pod
            .attempt
            .map_or_else(String::new, |a| format!(" (attempt {a})"));
        let how = match &self.state {
            NodeState::NotReady { status, reason } if reason.is_empty() => {
                format!("is not Ready (Ready={status})")
            }
            NodeState::NotReady { status, reason } => {
                format!("is not Ready (Ready={status}, {reason})")
            }
            _ => "is gone".to_owned(),
        };
        let name = &self.name;
        format!(
            "{waits} once pod {}{of} is gone: it is being deleted on node {name}, which {how}, so nothing confirms that it stopped; once the node is known to be down, mark it out of service (kubectl taint nodes {name} node.kubernetes.io/out-of-service=nodeshutdown:NoExecute) and its pods are deleted",
            pod.name
        )
    }
}

/// Whether a Node's kubelet can still stop the pods bound to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeState {
    /// Its Ready condition is True.
    Ready,
    /// Its Ready condition is False or Unknown, or missing (`status`: which, `reason`:
    /// the node's own words, `NodeStatusUnknown` from the node lifecycle controller):
    /// a pod being deleted there stops only once its kubelet is back, or a person marks
    /// the node out of service.
    NotReady { status: String, reason: String },
    /// No such Node: nothing will confirm the stop of a pod bound to it but the pod
    /// garbage collector.
    Gone,
    /// The operator may not read Nodes (a namespaced install without a ClusterRole):
    /// the node's state is unknown, and the wait says only that the pod is stopping.
    Unreadable,
}

impl NodeState {
    /// Whether the node cannot confirm a pod's stop: only a person (or the node's
    /// return) ends a wait for one.
    pub fn lost(&self) -> bool {
        matches!(self, NodeState::NotReady { .. } | NodeState::Gone)
    }
}

/// A Node's state from its Ready condition.
pub fn node_state_of(node: &Node) -> NodeState {
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"));
    match ready {
        Some(c) if c.status == "True" => NodeState::Ready,
        Some(c) => NodeState::NotReady {
            status: c.status.clone(),
            reason: c.reason.clone().unwrap_or_default(),
        },
        None => NodeState::NotReady {
            status: "Unknown".to_owned(),
            reason: "NoReadyCondition".to_owned(),
        },
    }
}

/// What a [`Read`] found.
#[derive(Debug, Clone, PartialEq)]
pub enum Found {
    /// The Job holding `attempt`'s name.
    Job {
        attempt: i32,
        job: FoundJob,
    },
    Termination {
        attempt: i32,
        termination: Option<Termination>,
    },
    /// `pods`: the attempt's pods as read; one waiting at the gate there is as good a
    /// hint as the pod cache's (which may have missed it).
    Placement {
        attempt: i32,
        unschedulable: Option<Unschedulable>,
        pods: Vec<SeenPod>,
    },
    Workload(QueueWait),
    Node(NodeHealth),
    /// The attempt's ResourceClaims: for each, the alternative it was allocated (`None`
    /// while it is not allocated).
    Devices {
        attempt: i32,
        claims: Vec<Option<String>>,
    },
    /// Whether a template this GpuJob does not own holds the name of `attempt`'s.
    ClaimTemplate {
        attempt: i32,
        foreign: bool,
    },
}

/// Who holds an attempt's Job name.
#[derive(Debug, Clone, PartialEq)]
pub enum FoundJob {
    /// A Job this GpuJob controls (the view remembers it until its cache has it).
    Ours(Box<SeenJob>),
    /// A Job this GpuJob does not control.
    Foreign,
    /// No Job.
    Absent,
}

/// The reads this reconcile has made, and what they found that the rest of
/// [`super::Observed`] does not carry.
#[derive(Debug, Clone, Default)]
pub struct Reads {
    made: Vec<Read>,
    /// Every read counts as made (what the plan is given is all there is to know).
    every: bool,
    /// Attempts whose Job name a foreign Job holds.
    foreign: Vec<i32>,
    /// The attempt whose ResourceClaims were read, and what each was allocated.
    devices: Option<(i32, Vec<Option<String>>)>,
    /// Attempts whose ResourceClaimTemplate name a foreign template holds.
    foreign_templates: Vec<i32>,
}

impl Reads {
    /// As if every read had been made and found nothing more than the plan is given.
    pub fn every() -> Reads {
        Reads {
            every: true,
            ..Reads::default()
        }
    }

    /// Whether `read` was made in this reconcile.
    pub fn made(&self, read: &Read) -> bool {
        self.every || self.made.contains(read)
    }

    /// `read` was made and found `found` (what it found about the Job name; the rest is
    /// handed to the plan through [`super::Observed`]'s fields).
    pub fn record(&mut self, read: Read, found: &Found) {
        if let Found::Job {
            attempt,
            job: FoundJob::Foreign,
        } = found
        {
            self.foreign.push(*attempt);
        }
        if let Found::Devices { attempt, claims } = found {
            self.devices = Some((*attempt, claims.clone()));
        }
        if let Found::ClaimTemplate {
            attempt,
            foreign: true,
        } = found
        {
            self.foreign_templates.push(*attempt);
        }
        self.made.push(read);
    }

    /// How many reads were made.
    pub fn count(&self) -> usize {
        self.made.len()
    }
}

impl Planner<'_, '_> {
    /// The reads due before this GpuJob can be decided, not made yet in this reconcile:
    /// the Jobs' first, then (with them answered) those about an attempt's pods or
    /// Workload. Empty: decide.
    ///
    /// A GpuJob being deleted reads only its recorded attempt's Job (a Job taken for gone
    /// is neither deleted nor waited for, and its pods, which it may still make, would
    /// hold no reservation once it is released) and, while its release waits for its
    /// pods, the Nodes they are being deleted on.
    pub(super) fn reads_due(&self) -> Vec<Read> {
        let status = &self.current;
        let k = status.attempts;
        let final_ = status.phase.is_some_and(Phase::is_final);
        let deleting = self.gj.metadata.deletion_timestamp.is_some();
        let mut due = Vec::new();
        if !final_ && k >= 1 && !self.by_attempt.contains_key(&k) {
            due.push(Read::Job { attempt: k });
        }
        if let Some(next) = self.name_conflict_attempt()
            && !self.by_attempt.contains_key(&next)
            && !deleting
        {
            due.push(Read::Job { attempt: next });
        }
        if let Some((attempt, name)) = self.template_conflict()
            && !self.by_attempt.contains_key(&attempt)
            && !deleting
        {
            due.push(Read::ClaimTemplate { attempt, name });
        }
        due.retain(|r| !self.obs.reads.made(r));
        if deleting && due.is_empty() && self.release_waits_on_deletion() {
            // Its release waits for its pods: one being deleted on a node that cannot
            // confirm the stop is said (`settle_deletion`).
            due.extend(self.nodes_stopping_pods());
            due.retain(|r| !self.obs.reads.made(r));
        }
        if !due.is_empty() || deleting {
            return due;
        }
        // A fact heard in this reconcile about another attempt (the GpuJob moved on
        // since) does not answer for this one.
        let unknown = |a: Option<i32>, attempt: i32| a.is_none_or(|a| a != attempt);
        let uid_of = |j: &SeenJob| j.uid.clone();
        if let Some((attempt, job)) = self.unrecorded_failure()
            && unknown(self.obs.termination.as_ref().map(|t| t.attempt), attempt)
            && let Some(job_uid) = uid_of(job)
        {
            due.push(Read::Termination {
                attempt,
                job_uid,
                dispatched: job.dispatched(),
            });
        }
        if let Some((&attempt, job)) = self.by_attempt.last_key_value() {
            // Only once the scheduler has said so of a pod of the attempt, as the pod
            // cache shows (its watch queues the GpuJob then): until then a pod let go, or
            // placed while the Job's ready count lags it (the Job controller writes that,
            // on its own budget), has nothing to tell, and each reconcile in between
            // would list the pods. The read gets the scheduler's words afresh.
            let unplaceable = |u: &str| {
                self.obs
                    .cached_pods
                    .iter()
                    .any(|p| p.of_job(u) && p.unschedulable && !p.terminal && !p.deleting)
            };
            if let Some(job_uid) = uid_of(job) {
                if pods_waiting(job, self.obs.now) == PodsWaiting::ReadPod
                    && unplaceable(&job_uid)
                    && unknown(self.obs.unschedulable.as_ref().map(|u| u.attempt), attempt)
                {
                    due.push(Read::Placement {
                        attempt,
                        job_uid: job_uid.clone(),
                        dispatched: job.dispatched(),
                    });
                }
                if self.allocation_due(attempt, job, &job_uid) {
                    due.push(Read::Devices { attempt });
                }
                if job.queued()
                    && !job.deleting()
                    && unknown(self.obs.queue_wait.as_ref().map(|w| w.attempt), attempt)
                {
                    due.push(Read::Workload { attempt, job_uid });
                }
            }
        }
        // A pod being deleted on a node while the next attempt (or a finished GpuJob's
        // quota release) waits for it: whether that node can still stop it (from the pod
        // cache, so it is read with the reads above, not in a round of its own after the
        // pod read).
        if !final_ || self.release_waits_when_done() {
            due.extend(self.nodes_stopping_pods());
        }
        due.retain(|r| !self.obs.reads.made(r));
        due
    }

    /// A read of each Node a cached pod of the GpuJob is being deleted on while it may
    /// still run there.
    fn nodes_stopping_pods(&self) -> Vec<Read> {
        let mut nodes: Vec<&str> = self
            .obs
            .cached_pods
            .iter()
            .filter_map(|p| p.stopping_on())
            .collect();
        nodes.sort_unstable();
        nodes.dedup();
        nodes
            .into_iter()
            .map(|n| Read::Node { name: n.to_owned() })
            .collect()
    }

    /// Whether the ResourceClaims of `attempt` (its Job `job`, uid `job_uid`) are to be
    /// read: the recorded attempt's, running, with alternatives to choose from, not said
    /// in status yet, and all of its pods placed (the scheduler allocates a pod's claims
    /// before it binds the pod), so one read finds every claim allocated. A finished
    /// attempt's claims go with its pods: not read (an attempt that ends before the read
    /// leaves status without its alternatives).
    fn allocation_due(&self, attempt: i32, job: &SeenJob, job_uid: &str) -> bool {
        let alternatives = job
            .devices
            .as_ref()
            .is_some_and(|d| !d.first_available.is_empty());
        let said = self
            .current
            .devices
            .as_ref()
            .is_some_and(|d| d.attempt == attempt);
        let placed = self
            .obs
            .cached_pods
            .iter()
            .filter(|p| p.of_job(job_uid) && p.attempt == Some(attempt) && p.bound)
            .count();
        let pods = usize::try_from(job.nodes.unwrap_or(1)).unwrap_or(usize::MAX);
        alternatives
            && !said
            && attempt == self.current.attempts
            && !self.current.phase.is_some_and(Phase::is_final)
            && seen_state(job) == JobState::Active
            && !job.deleting()
            && placed >= pods
    }

    /// What attempt `k`'s pods (of Job `job`) were allocated, once a read of this
    /// reconcile found every one of its claims allocated: the alternatives, each once,
    /// in the order of preference.
    pub(super) fn allocation(&self, k: i32, job: &SeenJob) -> Option<DeviceAllocation> {
        let (attempt, claims) = self.obs.reads.devices.as_ref()?;
        let pods = usize::try_from(job.nodes.unwrap_or(1)).ok()?;
        let got: Vec<&str> = claims.iter().flatten().map(String::as_str).collect();
        if *attempt != k || got.len() < pods {
            return None;
        }
        let alternatives = job
            .devices
            .as_ref()?
            .first_available
            .iter()
            .map(|a| a.name.clone())
            .filter(|name| got.contains(&name.as_str()))
            .collect();
        Some(DeviceAllocation {
            attempt: k,
            alternatives,
        })
    }

    /// The next attempt, while a foreign Job held its name when last tried (Ready says
    /// so): its name is read again.
    fn name_conflict_attempt(&self) -> Option<i32> {
        self.waiting_for_name(JOB_NAME_CONFLICT)
    }

    /// The next attempt and its ResourceClaimTemplate's name, while a foreign template
    /// held that name when last tried (Ready says so): the name is read again.
    fn template_conflict(&self) -> Option<(i32, String)> {
        let attempt = self.waiting_for_name(CLAIM_TEMPLATE_NAME_CONFLICT)?;
        let template = claims::template(self.gj, attempt)?;
        Some((attempt, template.metadata.name?))
    }

    /// The next attempt, while Ready says it waits for a name taken (`reason`).
    fn waiting_for_name(&self, reason: &str) -> Option<i32> {
        let status = &self.current;
        let waiting = !status.phase.is_some_and(Phase::is_final)
            && status.condition(READY).is_some_and(|c| c.reason == reason);
        waiting.then(|| status.attempts.checked_add(1)).flatten()
    }

    /// The Job of the next attempt cannot be created: the API server refused it (or its
    /// template) in this reconcile, or a read found a foreign Job or template holding
    /// its name.
    pub(super) fn refusal(&self) -> Option<Refusal> {
        if let Some(r) = &self.obs.refused {
            return Some(r.clone());
        }
        let ns = self.gj.metadata.namespace.as_deref().unwrap_or_default();
        if let Some((attempt, name)) = self.template_conflict()
            && self.obs.reads.foreign_templates.contains(&attempt)
            && !self.by_attempt.contains_key(&attempt)
        {
            return Some(Refusal {
                attempt,
                reason: CLAIM_TEMPLATE_NAME_CONFLICT,
                message: claims::name_taken(ns, &name),
            });
        }
        let attempt = self.name_conflict_attempt()?;
        if !self.obs.reads.foreign.contains(&attempt) || self.by_attempt.contains_key(&attempt) {
            return None;
        }
        Some(Refusal {
            attempt,
            reason: JOB_NAME_CONFLICT,
            message: name_taken(ns, &job_name(&self.name, attempt)),
        })
    }

    /// The newest failed attempt whose failure the status does not record yet (by
    /// `status.lastFailure`). Not simply the newest Job: when the next attempt's Job
    /// already exists (its start was recorded, the failure before it was not), the
    /// failure to record is the one before.
    fn unrecorded_failure(&self) -> Option<(i32, &SeenJob)> {
        let recorded = self.current.last_failure.as_ref().map(|f| f.attempt);
        self.by_attempt
            .iter()
            .rev()
            .find(|(a, j)| {
                recorded.is_none_or(|r| **a > r) && matches!(seen_state(j), JobState::Failed { .. })
            })
            .map(|(a, j)| (*a, *j))
    }
}

/// How a failed attempt's container ended, from its pods as read.
pub fn termination_of(attempt: i32, pods: &[Pod]) -> Option<Termination> {
    // The last to end: a pod of an earlier copy of the Job (MultiKueue dispatches one
    // again after an eviction on a worker) ended before the copy that failed.
    let t = pods
        .iter()
        .filter_map(|pod| {
            let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
            statuses
                .iter()
                .find_map(|c| c.state.as_ref()?.terminated.clone())
        })
        .max_by(|a, b| a.finished_at.cmp(&b.finished_at))?;
    Some(Termination {
        attempt,
        exit_code: Some(t.exit_code),
        reason: t.reason.unwrap_or_else(|| "Error".to_owned()),
        message: t.message.unwrap_or_default(),
    })
}

/// The scheduler's reason for not placing the attempt's pods, from their `PodScheduled`
/// condition (`None` when placed, not tried yet, or waiting at a scheduling gate).
pub fn unschedulable_of(attempt: i32, pods: &[Pod]) -> Option<Unschedulable> {
    pods.iter().find_map(|pod| {
        let c = not_placed(pod)?;
        Some(Unschedulable {
            attempt,
            message: c.message.clone().unwrap_or_default(),
        })
    })
}

/// What a Workload's conditions say of why it is not admitted.
pub fn workload_wait(workload: &serde_json::Value, attempt: i32) -> QueueWait {
    let conditions = workload
        .pointer("/status/conditions")
        .and_then(serde_json::Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let find = |type_: &str, status: &str| {
        conditions.iter().find(|c| {
            c.get("type").and_then(serde_json::Value::as_str) == Some(type_)
                && c.get("status").and_then(serde_json::Value::as_str) == Some(status)
        })
    };
    let said = find("Evicted", "True")
        .or_else(|| find("QuotaReserved", "False"))
        .or_else(|| find("Admitted", "False"));
    let text = |c: &serde_json::Value, field: &str| {
        c.get(field)
            .and_then(serde_json::Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    match said {
        Some(c) => QueueWait {
            attempt,
            reason: condition_reason(&text(c, "reason")),
            message: text(c, "message"),
        },
        None => QueueWait {
            attempt,
            reason: "Pending".to_owned(),
            message: "Kueue has not decided on the Workload yet".to_owned(),
        },
    }
}

/// `reason` when it has the form of a metav1.Condition reason (CamelCase; Kueue's do),
/// else `Pending`: the GpuJob's schema would take any string, but tools that read
/// conditions expect that form.
fn condition_reason(reason: &str) -> String {
    let ok = reason.len() <= 1024
        && reason.starts_with(|c: char| c.is_ascii_alphabetic())
        && reason
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | ',' | ':'))
        && !reason.ends_with([',', ':']);
    if ok {
        reason.to_owned()
    } else {
        "Pending".to_owned()
    }
}

impl Action {
    /// Whether the action reads without writing (the plan's questions to the API server).
    pub fn reads(&self) -> bool {
        matches!(
            self,
            Action::Read(_) | Action::Confirm | Action::ReadPods { .. } | Action::ReadTermStart
        )
    }
}
