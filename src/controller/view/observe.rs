//! A snapshot: what the view knows of one GpuJob, from the caches and the write memory,
//! with the direct reads the caches cannot answer (a Job the cache has not seen, the
//! exit code of a failed attempt's pod, why a running attempt's pod is not placed,
//! why Kueue holds a queued attempt, whether a foreign Job still holds the next attempt's
//! name, and where the shard's term began: `term_start.rs`).

use std::sync::Arc;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use kube::core::GroupVersionKind;

use jiff::Timestamp;

use super::View;
use crate::api::{GpuJob, LABEL_UID, Phase};
use crate::controller::error::{ApiCall, Error};
use crate::controller::job::{job_name, name_taken};
use crate::controller::plan::{
    JOB_NAME_CONFLICT, JobState, Observed, PodsWaiting, QueueWait, QuotaAnswer, Refusal,
    Termination, Unschedulable, pods_waiting, recognized_attempt, seen_state,
};
use crate::controller::seen_job::SeenJob;
use crate::controller::seen_pod::SeenPod;
use crate::controller::status::READY;
use crate::controller::{Fence, Key};

#[derive(Debug)]
pub struct Snapshot {
    pub gpujob: Arc<GpuJob>,
    pub jobs: Vec<Arc<SeenJob>>,
    /// The GpuJob's pods as the pod cache has them (it may lag: they only tell the plan
    /// that a read is due).
    pub cached_pods: Vec<Arc<SeenPod>>,
    pub termination: Option<Termination>,
    pub unschedulable: Option<Unschedulable>,
    pub queue_wait: Option<QueueWait>,
    /// A foreign Job still holds the name of the next attempt.
    pub refused: Option<Refusal>,
    /// `gpujob` is known current in this term: read from the API server or written by
    /// this replica at this version. Otherwise the cache may lag behind the previous
    /// holder of the shard.
    pub confirmed: bool,
}

impl Snapshot {
    /// What the plan sees: this snapshot, with what the outside answered so far.
    pub fn observed(
        &self,
        quota_required: bool,
        quota: Option<QuotaAnswer>,
        refused: Option<Refusal>,
        pods: Option<Vec<SeenPod>>,
        now: Timestamp,
    ) -> Observed<'_> {
        Observed {
            gpujob: &self.gpujob,
            jobs: self.jobs.iter().map(AsRef::as_ref).collect(),
            termination: self.termination.clone(),
            unschedulable: self.unschedulable.clone(),
            queue_wait: self.queue_wait.clone(),
            refused: refused.or_else(|| self.refused.clone()),
            quota_required,
            quota,
            pods,
            cached_pods: self.cached_pods.iter().map(AsRef::as_ref).collect(),
            confirmed: self.confirmed,
            now,
        }
    }
}

/// `None` when the GpuJob is gone. `fence`: the term of the GpuJob's shard, in which the
/// view counts as confirmed if its version is known current, or strictly past the
/// term's start (`term_start.rs`).
pub(super) async fn observe(
    view: &View,
    key: &Key,
    fence: &Fence,
) -> Result<Option<Snapshot>, Error> {
    let cached = || view.gpujobs.get(key);
    let Some(gpujob) = view.memory.gpujob(key, cached) else {
        view.memory.forget(key);
        return Ok(None);
    };
    let uid = gpujob.metadata.uid.clone().unwrap_or_default();
    let mut jobs = view.memory.jobs(key, &uid, || view.jobs.jobs_of(&uid));

    // The status says attempt k runs but the cache has no Job for it: the cache may
    // simply lag (a restart, a slow watch). Ask the API server before concluding the
    // Job is gone, because that conclusion starts the next attempt.
    let status = gpujob.status.clone().unwrap_or_default();
    let k = status.attempts;
    let final_ = status.phase.is_some_and(Phase::is_final);
    let attempt_of = |j: &SeenJob| recognized_attempt(j, &key.name, k);
    if k >= 1 && !final_ && !jobs.iter().any(|j| attempt_of(j) == Some(k)) {
        let api: Api<Job> = Api::namespaced(view.client.clone(), &key.namespace);
        let name = job_name(&key.name, k);
        if let Some(job) = api
            .get_opt(&name)
            .await
            .map_err(Error::kube(ApiCall::ReadJob))?
            .as_ref()
            .and_then(SeenJob::of)
            && job.is_controlled_by(&uid)
        {
            // Remembered until the cache has it: should it go before then, only the
            // relist ending the lag can say so, and it names GpuJobs by this memory.
            view.memory.job_read(key, &gpujob, &job);
            jobs.push(Arc::new(job));
        }
    }

    let refused = name_still_taken(view, key, &gpujob, &mut jobs).await?;
    let recorded = status.last_failure.as_ref().map(|f| f.attempt);
    // Only the Jobs that are attempts: a label anyone can write says nothing.
    let attempts: Vec<(i32, &SeenJob)> = jobs
        .iter()
        .filter_map(|j| attempt_of(j).map(|a| (a, j.as_ref())))
        .collect();
    let termination = match unrecorded_failure(&attempts, recorded) {
        Some((attempt, job)) => termination_of(view, &key.namespace, job, attempt).await?,
        None => None,
    };
    let newest = attempts.iter().copied().max_by_key(|(a, _)| *a);
    let mut cached_pods = view.pods_of(key, &uid);
    // A pod that waits at the operator's gate waits for the gate, not for a node: the
    // gate reads the pods when it lets it go, and the scheduler has nothing to say yet.
    let at_gate = |job: &SeenJob| {
        job.uid
            .as_deref()
            .is_some_and(|u| cached_pods.iter().any(|p| p.of_job(u) && p.waits_at_gate()))
    };
    let unschedulable =
        match newest.filter(|(_, j)| waits_for_a_node(j, Timestamp::now()) && !at_gate(j)) {
            Some((attempt, job)) => {
                let (why, read) = unschedulable_of(view, &key.namespace, job, attempt).await?;
                // Read anyway: a pod that waits at the gate there is as good a hint as the
                // pod cache's (which may have missed it), so the gate reads and lets it go.
                cached_pods.extend(read.into_iter().map(Arc::new));
                why
            }
            None => None,
        };
    let queue_wait = match newest.filter(|(_, j)| j.queued() && !j.deleting()) {
        Some((attempt, job)) => queue_wait_of(view, &key.namespace, job, attempt).await?,
        None => None,
    };
    let rv = gpujob
        .metadata
        .resource_version
        .as_deref()
        .unwrap_or_default();
    let confirmed = view.memory.is_current(key, fence.epoch, rv)
        || view
            .term_starts
            .covers(fence.shard, fence.epoch, &key.namespace, rv)
            .await;
    Ok(Some(Snapshot {
        gpujob,
        jobs,
        cached_pods,
        termination,
        unschedulable,
        queue_wait,
        refused,
        confirmed,
    }))
}

/// The GpuJob as the API server has it now (a quorum read), before a call to the quota
/// service or a Job create from a view not known current; `None` when it is gone, or
/// replaced by a new GpuJob of the same name.
pub(super) async fn read_gpujob(
    view: &View,
    key: &Key,
    uid: &str,
) -> Result<Option<GpuJob>, Error> {
    let api: Api<GpuJob> = Api::namespaced(view.client.clone(), &key.namespace);
    let current = api
        .get_opt(&key.name)
        .await
        .map_err(Error::kube(ApiCall::ReadGpuJob))?;
    Ok(current.filter(|g| g.metadata.uid.as_deref() == Some(uid)))
}

/// A GpuJob waiting because a foreign Job held its next attempt's name looks again (no
/// cache watches foreign Jobs): still taken is a refusal, so nothing is reserved for an
/// attempt that cannot start; free (or ours after all) lets the plan go on.
async fn name_still_taken(
    view: &View,
    key: &Key,
    gpujob: &GpuJob,
    jobs: &mut Vec<Arc<SeenJob>>,
) -> Result<Option<Refusal>, Error> {
    let status = gpujob.status.clone().unwrap_or_default();
    let waiting = !status.phase.is_some_and(Phase::is_final)
        && status
            .condition(READY)
            .is_some_and(|c| c.reason == JOB_NAME_CONFLICT);
    if !waiting {
        return Ok(None);
    }
    let Some(attempt) = status.attempts.checked_add(1) else {
        return Ok(None);
    };
    let name = job_name(&key.name, attempt);
    let api: Api<Job> = Api::namespaced(view.client.clone(), &key.namespace);
    let uid = gpujob.metadata.uid.as_deref().unwrap_or_default();
    let found = api
        .get_opt(&name)
        .await
        .map_err(Error::kube(ApiCall::ReadJob))?;
    match found.as_ref().map(SeenJob::of) {
        Some(Some(job)) if job.is_controlled_by(uid) => {
            if !jobs.iter().any(|j| j.attempt == Some(attempt)) {
                jobs.push(Arc::new(job));
            }
            Ok(None)
        }
        Some(_) => Ok(Some(Refusal {
            attempt,
            reason: JOB_NAME_CONFLICT,
            message: name_taken(&key.namespace, &name),
        })),
        None => Ok(None),
    }
}

/// The newest failed attempt whose failure the status does not record yet (`recorded`:
/// the attempt of `status.lastFailure`), among the attempt Jobs `attempts`. Not simply
/// the newest Job: when the next attempt's Job already exists (its start was recorded,
/// the failure before it was not), the failure to record is the one before.
fn unrecorded_failure<'a>(
    attempts: &[(i32, &'a SeenJob)],
    recorded: Option<i32>,
) -> Option<(i32, &'a SeenJob)> {
    attempts
        .iter()
        .copied()
        .filter(|(a, j)| {
            recorded.is_none_or(|r| *a > r) && matches!(seen_state(j), JobState::Failed { .. })
        })
        .max_by_key(|(a, _)| *a)
}

/// Whether `job` is active with no pod running past the scheduler's grace
/// ([`pods_waiting`]): its pod says why.
fn waits_for_a_node(job: &SeenJob, now: Timestamp) -> bool {
    pods_waiting(job, now) == PodsWaiting::ReadPod
}

/// Kueue's Workloads (`kueue.x-k8s.io/v1beta2`, served from Kueue 0.15).
fn workloads() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kueue.x-k8s.io", "v1beta2", "Workload"),
        "workloads",
    )
}

/// Why Kueue holds the attempt's Job, from its Workload (found by Kueue's label
/// `kueue.x-k8s.io/job-uid`): an eviction's reason and words while evicted, else why
/// its quota is not reserved. A cluster without Kueue's API says so.
async fn queue_wait_of(
    view: &View,
    ns: &str,
    job: &SeenJob,
    attempt: i32,
) -> Result<Option<QueueWait>, Error> {
    let Some(job_uid) = job.uid.as_deref() else {
        return Ok(None);
    };
    let api: Api<DynamicObject> = Api::namespaced_with(view.client.clone(), ns, &workloads());
    let listed = api
        .list(&ListParams::default().labels(&format!("kueue.x-k8s.io/job-uid={job_uid}")))
        .await;
    let list = match listed {
        Ok(list) => list,
        Err(kube::Error::Api(e)) if e.code == 404 => {
            return Ok(Some(QueueWait {
                attempt,
                reason: "KueueNotInstalled".to_owned(),
                message: "the cluster serves no kueue.x-k8s.io/v1beta2 Workloads: is Kueue (0.15 or later) installed?".to_owned(),
            }));
        }
        Err(e) => return Err(Error::kube(ApiCall::ReadWorkload)(e)),
    };
    let Some(workload) = list.items.first() else {
        return Ok(Some(QueueWait {
            attempt,
            reason: "NoWorkload".to_owned(),
            message: "Kueue has made no Workload for the Job yet".to_owned(),
        }));
    };
    Ok(Some(workload_wait(&workload.data, attempt)))
}

/// What a Workload's conditions say of why it is not admitted.
fn workload_wait(workload: &serde_json::Value, attempt: i32) -> QueueWait {
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

/// The scheduler's reason for not placing the attempt's pod, from the pod's
/// `PodScheduled` condition (`None` when it is placed, not yet tried, or waits at a
/// scheduling gate), and the pods as read.
async fn unschedulable_of(
    view: &View,
    ns: &str,
    job: &SeenJob,
    attempt: i32,
) -> Result<(Option<Unschedulable>, Vec<SeenPod>), Error> {
    let pods = pods_of(view, ns, job).await?;
    let why = pods.iter().find_map(|pod| {
        let c = pod
            .status
            .as_ref()?
            .conditions
            .as_ref()?
            .iter()
            .find(|c| c.type_ == "PodScheduled")?;
        (c.status == "False" && c.reason.as_deref() == Some("Unschedulable")).then(|| {
            Unschedulable {
                attempt,
                message: c.message.clone().unwrap_or_default(),
            }
        })
    });
    Ok((why, pods.iter().filter_map(SeenPod::of).collect()))
}

/// The GpuJob's pods (label `gpujob.dev/uid`), read from the API server: a list without
/// a resourceVersion, which the API server answers with what is current (a quorum read).
/// Asked for by the plan ([`crate::controller::plan::Action::ReadPods`]) before a gate
/// goes or quota is released.
pub(super) async fn read_pods(view: &View, ns: &str, uid: &str) -> Result<Vec<SeenPod>, Error> {
    let pods: Api<Pod> = Api::namespaced(view.client.clone(), ns);
    let list = pods
        .list(&ListParams::default().labels(&format!("{LABEL_UID}={uid}")))
        .await
        .map_err(Error::kube(ApiCall::ReadPods))?;
    Ok(list.items.iter().filter_map(SeenPod::of).collect())
}

/// The pods of `job`, found by its `controller-uid` label (none for a Job without uid).
async fn pods_of(view: &View, ns: &str, job: &SeenJob) -> Result<Vec<Pod>, Error> {
    let Some(job_uid) = job.uid.as_deref() else {
        return Ok(Vec::new());
    };
    let pods: Api<Pod> = Api::namespaced(view.client.clone(), ns);
    let list = pods
        .list(&ListParams::default().labels(&format!("controller-uid={job_uid}")))
        .await
        .map_err(Error::kube(ApiCall::ReadPods))?;
    Ok(list.items)
}

/// How the failed attempt's container ended, from its pod (found by the Job's
/// `controller-uid` label; the Job itself only says `BackoffLimitExceeded`).
async fn termination_of(
    view: &View,
    ns: &str,
    job: &SeenJob,
    attempt: i32,
) -> Result<Option<Termination>, Error> {
    let terminated = pods_of(view, ns, job).await?.into_iter().find_map(|pod| {
        let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
        statuses
            .iter()
            .find_map(|c| c.state.as_ref()?.terminated.clone())
    });
    Ok(terminated.map(|t| Termination {
        attempt,
        exit_code: Some(t.exit_code),
        reason: t.reason.unwrap_or_else(|| "Error".to_owned()),
        message: t.message.unwrap_or_default(),
    }))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::batch::v1::{JobCondition, JobStatus};

    use super::*;
    use crate::api::{GpuJob, GpuJobSpec};
    use crate::controller::job::desired_job;

    fn gpujob(name: &str) -> GpuJob {
        let mut g = GpuJob::new(
            name,
            GpuJobSpec {
                image: "registry.example/train:1".into(),
                command: vec![],
                args: vec![],
                env: vec![],
                gpus: 1,
                max_retries: 3,
                active_deadline_seconds: None,
                node_selector: Default::default(),
                service_account_name: None,
                update_policy: Default::default(),
                suspend: false,
                ttl_seconds_after_finished: None,
                v2: None,
            },
        );
        g.metadata.namespace = Some("team-a".into());
        g.metadata.uid = Some("uid-1".into());
        g
    }

    fn job(attempt: i32, failed: bool) -> Arc<SeenJob> {
        let mut j = desired_job(&gpujob("train"), attempt);
        if failed {
            j.status = Some(JobStatus {
                conditions: Some(vec![JobCondition {
                    type_: "Failed".into(),
                    status: "True".into(),
                    reason: Some("BackoffLimitExceeded".into()),
                    ..Default::default()
                }]),
                ..Default::default()
            });
        }
        Arc::new(SeenJob::of(&j).expect("controlled by its GpuJob"))
    }

    fn attempt(jobs: &[Arc<SeenJob>], recorded: Option<i32>) -> Option<i32> {
        let attempts: Vec<(i32, &SeenJob)> = jobs
            .iter()
            .filter_map(|j| j.attempt.map(|a| (a, j.as_ref())))
            .collect();
        unrecorded_failure(&attempts, recorded).map(|(a, _)| a)
    }

    #[test]
    fn the_pod_read_is_the_newest_failure_not_yet_recorded() {
        // The newest attempt failed, not recorded: its pod.
        assert_eq!(attempt(&[job(1, true), job(2, true)], Some(1)), Some(2));
        // Recorded already: no pod read.
        assert_eq!(attempt(&[job(1, true), job(2, true)], Some(2)), None);
        // Attempt 2 runs, attempt 1's failure is not recorded yet: attempt 1's pod (the
        // newest Job alone would lose its exit code).
        assert_eq!(attempt(&[job(1, true), job(2, false)], None), Some(1));
        assert_eq!(attempt(&[job(1, true), job(2, false)], Some(1)), None);
        assert_eq!(attempt(&[job(1, false)], None), None);
        assert_eq!(attempt(&[], None), None);
    }

    #[test]
    fn a_workload_says_why_kueue_holds_the_attempt() {
        let workload = |conditions: serde_json::Value| serde_json::json!({"status": {"conditions": conditions}});
        let pending = workload(serde_json::json!([{
            "type": "QuotaReserved", "status": "False", "reason": "Pending",
            "message": "couldn't assign flavors to pod set main: insufficient quota",
        }]));
        let w = workload_wait(&pending, 2);
        assert_eq!((w.attempt, w.reason.as_str()), (2, "Pending"));
        assert!(w.message.contains("insufficient quota"), "{w:?}");
        // Evicted and waiting for quota again: the eviction is the news.
        let evicted = workload(serde_json::json!([
            {"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": "x"},
            {"type": "Evicted", "status": "True", "reason": "Preempted",
             "message": "Preempted to accommodate a higher priority Workload"},
        ]));
        assert_eq!(workload_wait(&evicted, 1).reason, "Preempted");
        // Nothing decided yet; a reason the API server would refuse is not copied.
        assert_eq!(workload_wait(&serde_json::json!({}), 1).reason, "Pending");
        let odd = workload(serde_json::json!([
            {"type": "QuotaReserved", "status": "False", "reason": "not a reason!"},
        ]));
        assert_eq!(workload_wait(&odd, 1).reason, "Pending");
    }
}
