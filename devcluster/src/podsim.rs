//! The pod simulator plays the kubelet of devcluster's fake GPU nodes: once
//! kube-scheduler has bound a pod to one, it moves the pod to Running and then to
//! Succeeded or Failed by patching the `status` subresource, with a terminated container
//! status carrying an exit code and a reason. The real Job controller then marks the Job
//! Complete or Failed. A pod that is not bound is the scheduler's and is left alone, so a
//! pod that fits no node stays Pending, as on a real cluster.
//!
//! A bound pod being deleted ends as a kubelet ends it: its containers stop (exit code
//! 143, phase Failed, unless it had already finished), then the pod is removed with a
//! zero grace period. Until then it is Terminating, like a real pod shutting down.
//!
//! Each pod says how it should behave through its first container's env:
//! - `SIM_DURATION_SECONDS` (default 1, fractions allowed): time from Running to the end;
//! - `SIM_EXIT_CODE` (default 0): the container's exit code;
//! - `SIM_FAIL_ATTEMPTS=n`: attempts 1..=n fail (with `SIM_EXIT_CODE`, or 1 when that is
//!   0), later attempts succeed; the attempt is read from env `GPUJOB_ATTEMPT` or the label
//!   `gpujob.dev/attempt`;
//! - `SIM_REASON`: the terminated reason (default `Completed` for 0, `Error` otherwise);
//! - `SIM_TERMINATION_SECONDS` (default 0, fractions allowed): how long a deleted pod takes
//!   to stop, at most its grace period (`terminationGracePeriodSeconds`).
//!
//! The simulator runs on a thread with its own runtime, so it is not tied to any test's
//! runtime, and it derives everything from the pod (start time included): restarting it
//! neither repeats nor loses a transition.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use serde_json::json;
use tokio::sync::oneshot;

use crate::Error;

pub const DEFAULT_DURATION: Duration = Duration::from_secs(1);
const ATTEMPT_LABEL: &str = "gpujob.dev/attempt";
/// The exit code of a container stopped by SIGTERM.
pub const TERMINATED_EXIT_CODE: i32 = 143;

/// How a pod is to end, read from its env.
#[derive(Debug, Clone, PartialEq)]
pub struct Behaviour {
    pub duration: Duration,
    pub exit_code: i32,
    pub reason: String,
    /// From deletion to stopped (bounded by the grace period).
    pub termination: Duration,
}

impl Behaviour {
    /// Reads the `SIM_*` env of the pod's first container. A value that does not parse
    /// makes the pod fail with reason `InvalidSimulatorEnv` and exit code 128, so a typo
    /// in a test shows up instead of silently passing.
    pub fn of(pod: &Pod) -> Behaviour {
        match Self::try_of(pod) {
            Ok(b) => b,
            Err(message) => Behaviour {
                duration: Duration::ZERO,
                exit_code: 128,
                reason: format!("InvalidSimulatorEnv: {message}"),
                termination: Duration::ZERO,
            },
        }
    }

    fn try_of(pod: &Pod) -> Result<Behaviour, String> {
        let env = |name: &str| -> Option<String> {
            pod.spec
                .as_ref()?
                .containers
                .first()?
                .env
                .as_ref()?
                .iter()
                .find(|e| e.name == name)?
                .value
                .clone()
        };
        let seconds = |name: &str, default: Duration| -> Result<Duration, String> {
            match env(name) {
                Some(v) => v
                    .trim()
                    .parse::<f64>()
                    .ok()
                    .and_then(|s| Duration::try_from_secs_f64(s).ok())
                    .ok_or_else(|| format!("{name}={v:?} is not a non-negative number")),
                None => Ok(default),
            }
        };
        let duration = seconds("SIM_DURATION_SECONDS", DEFAULT_DURATION)?;
        let termination = seconds("SIM_TERMINATION_SECONDS", Duration::ZERO)?;
        let exit_code = match env("SIM_EXIT_CODE") {
            Some(v) => v
                .trim()
                .parse::<i32>()
                .map_err(|_| format!("SIM_EXIT_CODE={v:?} is not an integer"))?,
            None => 0,
        };
        let exit_code = match env("SIM_FAIL_ATTEMPTS") {
            Some(v) => {
                let fail = v
                    .trim()
                    .parse::<u32>()
                    .map_err(|_| format!("SIM_FAIL_ATTEMPTS={v:?} is not a whole number"))?;
                let attempt = attempt_of(pod, env("GPUJOB_ATTEMPT"))?;
                match (attempt <= fail, exit_code) {
                    (true, 0) => 1,
                    (true, code) => code,
                    (false, _) => 0,
                }
            }
            None => exit_code,
        };
        let reason = env("SIM_REASON")
            .unwrap_or_else(|| if exit_code == 0 { "Completed" } else { "Error" }.to_owned());
        Ok(Behaviour {
            duration,
            exit_code,
            reason,
            termination,
        })
    }
}

fn attempt_of(pod: &Pod, env: Option<String>) -> Result<u32, String> {
    let label = pod
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(ATTEMPT_LABEL).cloned());
    let Some(raw) = env.or(label) else {
        return Err("SIM_FAIL_ATTEMPTS is set but the pod has no GPUJOB_ATTEMPT env or gpujob.dev/attempt label".to_owned());
    };
    raw.trim()
        .parse()
        .map_err(|_| format!("attempt {raw:?} is not a whole number"))
}

/// What the simulator does next with a pod.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Finished, not bound to a node yet, or otherwise not ours to move.
    Ignore,
    /// Bound and Pending: mark it Running now.
    Start,
    /// Running: end it at this time.
    FinishAt(Timestamp),
    /// Bound and being deleted: stop it (unless finished) and remove it at this time.
    TerminateAt(Timestamp),
}

/// Pure decision for one observed pod.
pub fn step(pod: &Pod, now: Timestamp) -> Step {
    let bound = pod.spec.as_ref().is_some_and(|s| s.node_name.is_some());
    if !bound {
        // The scheduler's; an unbound pod's delete takes effect at once.
        return Step::Ignore;
    }
    if let Some(deadline) = &pod.metadata.deletion_timestamp {
        let deadline = deadline.0;
        let grace = pod.metadata.deletion_grace_period_seconds.unwrap_or(0);
        let asked = deadline
            .checked_sub(SignedDuration::from_secs(grace))
            .unwrap_or(deadline);
        let stop =
            SignedDuration::try_from(Behaviour::of(pod).termination).unwrap_or(SignedDuration::MAX);
        let at = asked.saturating_add(stop).unwrap_or(deadline);
        return Step::TerminateAt(at.min(deadline));
    }
    let status = pod.status.as_ref();
    match status.and_then(|s| s.phase.as_deref()) {
        Some("Succeeded") | Some("Failed") | Some("Unknown") => Step::Ignore,
        Some("Running") => {
            let started = status
                .and_then(|s| s.start_time.as_ref())
                .map_or(now, |t| t.0);
            let run = SignedDuration::try_from(Behaviour::of(pod).duration)
                .unwrap_or(SignedDuration::MAX);
            Step::FinishAt(started.saturating_add(run).unwrap_or(started))
        }
        _ => Step::Start,
    }
}

/// The status patch that moves a pod to Running.
pub fn running_patch(pod: &Pod, now: Timestamp) -> serde_json::Value {
    let statuses: Vec<_> = containers(pod)
        .map(|(name, image)| {
            json!({
                "name": name, "image": image, "imageID": "", "ready": true, "restartCount": 0,
                "started": true, "state": {"running": {"startedAt": now.to_string()}},
            })
        })
        .collect();
    json!({"status": {
        "phase": "Running",
        "startTime": now.to_string(),
        "hostIP": "127.0.0.1",
        "podIP": "127.0.0.1",
        "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": now.to_string()},
            {"type": "Ready", "status": "True", "lastTransitionTime": now.to_string()},
        ],
        "containerStatuses": statuses,
    }})
}

/// The status patch that ends a pod as `behaviour` says.
pub fn finished_patch(pod: &Pod, behaviour: &Behaviour, now: Timestamp) -> serde_json::Value {
    let started = pod
        .status
        .as_ref()
        .and_then(|s| s.start_time.as_ref())
        .map_or(now, |t| t.0);
    let phase = if behaviour.exit_code == 0 {
        "Succeeded"
    } else {
        "Failed"
    };
    let statuses: Vec<_> = containers(pod)
        .map(|(name, image)| {
            json!({
                "name": name, "image": image, "imageID": "", "ready": false, "restartCount": 0,
                "started": false,
                "state": {"terminated": {
                    "exitCode": behaviour.exit_code,
                    "reason": behaviour.reason,
                    "startedAt": started.to_string(),
                    "finishedAt": now.to_string(),
                }},
            })
        })
        .collect();
    json!({"status": {
        "phase": phase,
        "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": started.to_string()},
            {"type": "Ready", "status": "False", "reason": "PodCompleted", "lastTransitionTime": now.to_string()},
        ],
        "containerStatuses": statuses,
    }})
}

fn finished(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// What a kubelet does with a deleted pod: stop its containers (as by SIGTERM) unless
/// they had finished, then remove the pod with a zero grace period. Finalizers (the Job
/// controller's tracking finalizer) may keep it a little longer; that is theirs to lift.
async fn terminate(api: &Api<Pod>, pod: &Pod) -> Result<(), kube::Error> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    if !finished(pod) {
        let stopped = Behaviour {
            duration: Duration::ZERO,
            exit_code: TERMINATED_EXIT_CODE,
            reason: "Error".to_owned(),
            termination: Duration::ZERO,
        };
        let patch = finished_patch(pod, &stopped, Timestamp::now());
        api.patch_status(&name, &PatchParams::default(), &Patch::Merge(patch))
            .await?;
    }
    let params = kube::api::DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: pod
            .metadata
            .uid
            .clone()
            .map(|uid| kube::api::Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
        ..Default::default()
    };
    match api.delete(&name, &params).await {
        Ok(_) => Ok(()),
        // Gone already, or a new pod of the same name: nothing of this one is left.
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

fn containers(pod: &Pod) -> impl Iterator<Item = (String, String)> + '_ {
    pod.spec
        .iter()
        .flat_map(|s| s.containers.iter())
        .map(|c| (c.name.clone(), c.image.clone().unwrap_or_default()))
}

/// A running simulator; stops when dropped.
#[derive(Debug)]
pub struct PodSimulator {
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl PodSimulator {
    /// Starts the simulator on its own thread, acting on every pod of the cluster that
    /// `config` reaches (it needs get/watch pods and patch pods/status).
    pub fn start(config: kube::Config) -> Result<PodSimulator, Error> {
        let (stop_tx, stop_rx) = oneshot::channel();
        let thread = std::thread::Builder::new()
            .name("pod-simulator".to_owned())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                    Ok(rt) => rt,
                    Err(e) => {
                        tracing::error!("pod simulator: cannot build its runtime: {e}; pods will stay Pending");
                        return;
                    }
                };
                rt.block_on(async move {
                    tokio::select! {
                        _ = stop_rx => {}
                        r = run(config) => {
                            if let Err(e) = r {
                                tracing::error!("pod simulator stopped: {e}; pods will stay Pending");
                            }
                        }
                    }
                });
            })
            .map_err(Error::io("starting the pod simulator thread"))?;
        Ok(PodSimulator {
            stop: Some(stop_tx),
            thread: Some(thread),
        })
    }
}

impl Drop for PodSimulator {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// How often every known pod is looked at again, events or not: a patch that failed
/// (kube-apiserver restarting, say) is retried from here, since a quiet pod sends no
/// further events.
const RESYNC: Duration = Duration::from_secs(2);

/// Pod uids for which the simulator has set a step in motion. The store can lag far
/// behind the pods under load; without these, every pass would patch pods it already
/// started again, each pass would take longer, the watch would fall further behind
/// (until kube-apiserver drops it as too slow) and pods would stop moving at all.
#[derive(Debug, Clone, Default)]
struct Claims(Arc<Mutex<HashSet<String>>>);

impl Claims {
    /// False when `uid` was already claimed.
    fn claim(&self, uid: &str) -> bool {
        self.0
            .lock()
            .map(|mut s| s.insert(uid.to_owned()))
            .unwrap_or(false)
    }

    fn release(&self, uid: &str) {
        if let Ok(mut s) = self.0.lock() {
            s.remove(uid);
        }
    }

    fn retain(&self, live: &HashSet<&str>) {
        if let Ok(mut s) = self.0.lock() {
            s.retain(|uid| live.contains(uid.as_str()));
        }
    }
}

#[derive(Clone)]
struct Simulator {
    client: kube::Client,
    /// A Running patch is in flight or was accepted.
    started: Claims,
    /// The end is scheduled or its patch was accepted.
    ending: Claims,
    /// Its removal after a delete is scheduled or was accepted.
    terminating: Claims,
}

async fn run(config: kube::Config) -> Result<(), Error> {
    let client = kube::Client::try_from(config).map_err(Error::kube("pod simulator client"))?;
    let pods: Api<Pod> = Api::all(client.clone());
    let (store, writer) = reflector::store::<Pod>();
    let sim = Simulator {
        client,
        started: Claims::default(),
        ending: Claims::default(),
        terminating: Claims::default(),
    };
    let mut events = reflector::reflector(
        writer,
        watcher(pods, watcher::Config::default()).default_backoff(),
    )
    .applied_objects()
    .boxed();
    let mut tick = tokio::time::interval(RESYNC);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        // `act` only spawns: this loop never waits on the API server, so it keeps up
        // with the watch however many pods there are.
        tokio::select! {
            event = events.next() => match event {
                Some(Ok(pod)) => sim.act(pod),
                Some(Err(e)) => tracing::warn!("pod simulator: watch error: {e}; the watch retries with backoff"),
                None => return Ok(()),
            },
            _ = tick.tick() => {
                let pods = store.state();
                // Deleted pods: forget them.
                let live: HashSet<&str> = pods.iter().filter_map(|p| p.metadata.uid.as_deref()).collect();
                sim.started.retain(&live);
                sim.ending.retain(&live);
                sim.terminating.retain(&live);
                for pod in &pods {
                    sim.act((**pod).clone());
                }
            }
        }
    }
}

impl Simulator {
    fn act(&self, pod: Pod) {
        let (Some(ns), Some(name), Some(uid)) = (
            pod.metadata.namespace.clone(),
            pod.metadata.name.clone(),
            pod.metadata.uid.clone(),
        ) else {
            return;
        };
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        match step(&pod, Timestamp::now()) {
            // Finished or going away: nothing more to do for it.
            Step::Ignore => {}
            Step::Start => {
                if !self.started.claim(&uid) {
                    return;
                }
                let sim = self.clone();
                tokio::spawn(async move {
                    let patch = running_patch(&pod, Timestamp::now());
                    match api
                        .patch_status(&name, &PatchParams::default(), &Patch::Merge(patch))
                        .await
                    {
                        // Schedule its end from the pod the API server returned, not
                        // from the watch, which may be behind.
                        Ok(running) => sim.act(running),
                        Err(e) => {
                            tracing::warn!(
                                "pod simulator: cannot mark pod {ns}/{name} Running: {e}; retrying on the next pass"
                            );
                            sim.started.release(&uid);
                        }
                    }
                });
            }
            Step::TerminateAt(at) => {
                if !self.terminating.claim(&uid) {
                    return;
                }
                let terminating = self.terminating.clone();
                tokio::spawn(async move {
                    let wait = Timestamp::now().duration_until(at);
                    if let Ok(wait) = Duration::try_from(wait) {
                        tokio::time::sleep(wait).await;
                    }
                    if let Err(e) = terminate(&api, &pod).await {
                        tracing::warn!(
                            "pod simulator: cannot remove deleted pod {ns}/{name}: {e}; retrying on the next pass"
                        );
                        terminating.release(&uid);
                    }
                });
            }
            Step::FinishAt(at) => {
                if !self.ending.claim(&uid) {
                    return;
                }
                let ending = self.ending.clone();
                tokio::spawn(async move {
                    let wait = Timestamp::now().duration_until(at);
                    if let Ok(wait) = Duration::try_from(wait) {
                        tokio::time::sleep(wait).await;
                    }
                    let behaviour = Behaviour::of(&pod);
                    let patch = finished_patch(&pod, &behaviour, Timestamp::now());
                    if let Err(e) = api
                        .patch_status(&name, &PatchParams::default(), &Patch::Merge(patch))
                        .await
                    {
                        tracing::warn!(
                            "pod simulator: cannot end pod {ns}/{name}: {e}; retrying on the next pass"
                        );
                        ending.release(&uid);
                    }
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, EnvVar, PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn pod(env: &[(&str, &str)], labels: &[(&str, &str)], phase: Option<&str>) -> Pod {
        let mut p = Pod::default();
        p.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        p.spec = Some(PodSpec {
            containers: vec![Container {
                name: "main".into(),
                image: Some("busybox".into()),
                env: Some(
                    env.iter()
                        .map(|(k, v)| EnvVar {
                            name: k.to_string(),
                            value: Some(v.to_string()),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }],
            ..Default::default()
        });
        p.status = phase.map(|ph| PodStatus {
            phase: Some(ph.into()),
            ..Default::default()
        });
        p
    }

    #[test]
    fn defaults_succeed_quickly() {
        let b = Behaviour::of(&pod(&[], &[], None));
        assert_eq!(
            b,
            Behaviour {
                duration: DEFAULT_DURATION,
                exit_code: 0,
                reason: "Completed".into(),
                termination: Duration::ZERO,
            }
        );
    }

    #[test]
    fn exit_code_and_duration_from_env() {
        let b = Behaviour::of(&pod(
            &[("SIM_EXIT_CODE", "3"), ("SIM_DURATION_SECONDS", "0.5")],
            &[],
            None,
        ));
        assert_eq!(b.exit_code, 3);
        assert_eq!(b.reason, "Error");
        assert_eq!(b.duration, Duration::from_millis(500));
        let oom = Behaviour::of(&pod(
            &[("SIM_EXIT_CODE", "137"), ("SIM_REASON", "OOMKilled")],
            &[],
            None,
        ));
        assert_eq!((oom.exit_code, oom.reason.as_str()), (137, "OOMKilled"));
    }

    #[test]
    fn fail_attempts_reads_env_then_label() {
        let by_env = |a: &str| {
            Behaviour::of(&pod(
                &[("SIM_FAIL_ATTEMPTS", "2"), ("GPUJOB_ATTEMPT", a)],
                &[],
                None,
            ))
            .exit_code
        };
        assert_eq!((by_env("1"), by_env("2"), by_env("3")), (1, 1, 0));
        let by_label = |a: &str| {
            Behaviour::of(&pod(
                &[("SIM_FAIL_ATTEMPTS", "1"), ("SIM_EXIT_CODE", "7")],
                &[(ATTEMPT_LABEL, a)],
                None,
            ))
            .exit_code
        };
        assert_eq!((by_label("1"), by_label("2")), (7, 0));
    }

    #[test]
    fn bad_env_fails_the_pod_visibly() {
        for env in [
            ("SIM_EXIT_CODE", "three"),
            ("SIM_DURATION_SECONDS", "-1"),
            ("SIM_FAIL_ATTEMPTS", "1"),
            ("SIM_TERMINATION_SECONDS", "soon"),
        ] {
            let b = Behaviour::of(&pod(&[env], &[], None));
            assert_eq!(b.exit_code, 128, "{env:?}");
            assert!(
                b.reason.starts_with("InvalidSimulatorEnv"),
                "{env:?}: {}",
                b.reason
            );
        }
    }

    fn bound(mut p: Pod) -> Pod {
        p.spec.as_mut().unwrap().node_name = Some("gpu-node-0".into());
        p
    }

    #[test]
    fn unbound_pods_are_the_schedulers() {
        let now: Timestamp = "2026-11-30T06:00:00Z".parse().unwrap();
        assert_eq!(step(&pod(&[], &[], None), now), Step::Ignore);
        assert_eq!(step(&pod(&[], &[], Some("Pending")), now), Step::Ignore);
        let mut deleted = pod(&[], &[], Some("Pending"));
        deleted.metadata.deletion_timestamp = Some(Time(now));
        assert_eq!(step(&deleted, now), Step::Ignore);
    }

    #[test]
    fn a_deleted_pod_stops_after_its_termination_time_within_its_grace() {
        let now: Timestamp = "2026-11-30T06:00:00Z".parse().unwrap();
        let deleted = |env: &[(&str, &str)], grace: i64| {
            let mut p = bound(pod(env, &[], Some("Running")));
            p.metadata.deletion_grace_period_seconds = Some(grace);
            p.metadata.deletion_timestamp = Some(Time(
                now.checked_add(SignedDuration::from_secs(grace)).unwrap(),
            ));
            step(&p, now)
        };
        assert_eq!(deleted(&[], 30), Step::TerminateAt(now));
        assert_eq!(
            deleted(&[("SIM_TERMINATION_SECONDS", "5")], 30),
            Step::TerminateAt("2026-11-30T06:00:05Z".parse().unwrap())
        );
        // A kubelet kills what outlives the grace period.
        assert_eq!(
            deleted(&[("SIM_TERMINATION_SECONDS", "60")], 10),
            Step::TerminateAt("2026-11-30T06:00:10Z".parse().unwrap())
        );
    }

    #[test]
    fn steps_follow_the_phase() {
        let now: Timestamp = "2026-11-30T06:00:00Z".parse().unwrap();
        let pod =
            |env: &[(&str, &str)], labels: &[(&str, &str)], phase| bound(pod(env, labels, phase));
        assert_eq!(step(&pod(&[], &[], None), now), Step::Start);
        assert_eq!(step(&pod(&[], &[], Some("Pending")), now), Step::Start);
        assert_eq!(step(&pod(&[], &[], Some("Succeeded")), now), Step::Ignore);
        assert_eq!(step(&pod(&[], &[], Some("Failed")), now), Step::Ignore);

        let mut running = pod(&[("SIM_DURATION_SECONDS", "5")], &[], Some("Running"));
        let started: Timestamp = "2026-11-30T05:59:58Z".parse().unwrap();
        running.status.as_mut().unwrap().start_time = Some(Time(started));
        // Measured from the recorded start, so a restarted simulator keeps the schedule.
        assert_eq!(
            step(&running, now),
            Step::FinishAt("2026-11-30T06:00:03Z".parse().unwrap())
        );

        running.metadata.deletion_timestamp = Some(Time(now));
        assert_eq!(step(&running, now), Step::TerminateAt(now));
    }

    #[test]
    fn finished_patch_carries_exit_code_and_reason() {
        let p = pod(&[("SIM_EXIT_CODE", "3")], &[], Some("Running"));
        let now: Timestamp = "2026-11-30T06:00:00Z".parse().unwrap();
        let patch = finished_patch(&p, &Behaviour::of(&p), now);
        assert_eq!(patch["status"]["phase"], "Failed");
        let term = &patch["status"]["containerStatuses"][0]["state"]["terminated"];
        assert_eq!(term["exitCode"], 3);
        assert_eq!(term["reason"], "Error");
        assert_eq!(running_patch(&p, now)["status"]["phase"], "Running");
    }
}
