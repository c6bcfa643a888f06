//! Pure: the values of the domain gauges (GpuJobs by phase, deliberately waiting,
//! unconverged) from the cached GpuJobs of the shards a replica holds, so a `sum()`
//! across replicas never counts a GpuJob twice. The operator publishes a [`Snapshot`]
//! (`Metrics::publish_domain`), and zero when it holds no shard.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use jiff::Timestamp;

use crate::api::{GpuJob, Phase};
use crate::status::{CLEANUP_STUCK, READY};

/// Ready reasons of a GpuJob that waits on purpose: not stuck, with metrics of its own.
/// `Queued`: Kueue holds the attempt, as its ClusterQueue's quota and policy say.
/// `WaitingForLostNode`: the next attempt waits for an old pod on a node that is not
/// Ready; only a person ends it (its own alert, `GpuJobWaitingForLostNode`).
pub const WAITING_REASONS: [&str; 6] = [
    "BackingOff",
    "QuotaRefused",
    "InvalidSpec",
    "Suspended",
    "Queued",
    "WaitingForLostNode",
];
/// The `phase` label values, `Unknown` for GpuJobs without a phase yet.
pub const PHASES: [&str; 6] = [
    "Pending",
    "Running",
    "Suspended",
    "Succeeded",
    "Failed",
    "Unknown",
];

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    pub by_phase: BTreeMap<&'static str, i64>,
    pub waiting: BTreeMap<&'static str, i64>,
    pub unconverged: i64,
    pub oldest_unconverged: Duration,
    /// GpuJobs whose quota release keeps failing past the cleanup timeout.
    pub cleanup_stuck: i64,
}

/// When this replica first saw each GpuJob's current generation unprocessed (keyed by
/// uid): how long a spec change has waited is not recorded anywhere in the object.
pub type FirstSeen = HashMap<String, (i64, Timestamp)>;

/// `threshold`: how long a GpuJob may stay Pending without a running attempt (and
/// without a deliberate reason) before it counts as unconverged.
pub fn snapshot<G: std::borrow::Borrow<GpuJob>>(
    gpujobs: impl IntoIterator<Item = G>,
    now: Timestamp,
    threshold: Duration,
    first_seen: &mut FirstSeen,
) -> Snapshot {
    let mut snap = Snapshot {
        by_phase: PHASES.iter().map(|p| (*p, 0)).collect(),
        waiting: WAITING_REASONS.iter().map(|r| (*r, 0)).collect(),
        ..Snapshot::default()
    };
    let mut seen_now = FirstSeen::new();
    for gj in gpujobs {
        let gj = gj.borrow();
        let stuck = gj.status.as_ref().and_then(|s| s.condition(CLEANUP_STUCK));
        if stuck.is_some_and(|c| c.status == crate::api::ConditionStatus::True) {
            snap.cleanup_stuck += 1;
        }
        if gj.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let uid = gj.metadata.uid.clone().unwrap_or_default();
        let status = gj.status.clone().unwrap_or_default();
        let phase = status.phase.map_or("Unknown", phase_label);
        *snap.by_phase.entry(phase).or_default() += 1;
        let ready = status.condition(READY);
        let waiting = ready
            .map(|c| c.reason.as_str())
            .and_then(|r| WAITING_REASONS.iter().find(|w| **w == r).copied())
            .filter(|_| !status.phase.is_some_and(Phase::is_final));
        if let Some(reason) = waiting {
            *snap.waiting.entry(reason).or_default() += 1;
        }

        let generation = gj.metadata.generation.unwrap_or(0);
        let behind = status.observed_generation.unwrap_or(0) < generation;
        let mut age = None;
        if behind {
            let since = match first_seen.get(&uid) {
                Some((g, t)) if *g == generation => *t,
                _ => now,
            };
            seen_now.insert(uid.clone(), (generation, since));
            age = Some(now.duration_since(since));
        }
        let pending = matches!(status.phase, None | Some(Phase::Pending));
        if pending && waiting.is_none() {
            // Pending since its Ready condition last changed (or since it was created).
            let since = ready
                .map(|c| c.last_transition_time)
                .or(gj.metadata.creation_timestamp.as_ref().map(|t| t.0))
                .unwrap_or(now);
            let pending_for = now.duration_since(since);
            if pending_for.as_secs_f64() > threshold.as_secs_f64() {
                age = Some(age.map_or(pending_for, |a| a.max(pending_for)));
            }
        }
        if let Some(age) = age {
            snap.unconverged += 1;
            let age = Duration::try_from(age).unwrap_or_default();
            snap.oldest_unconverged = snap.oldest_unconverged.max(age);
        }
    }
    *first_seen = seen_now;
    snap
}

fn phase_label(p: Phase) -> &'static str {
    match p {
        Phase::Pending => "Pending",
        Phase::Running => "Running",
        Phase::Suspended => "Suspended",
        Phase::Succeeded => "Succeeded",
        Phase::Failed => "Failed",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{Condition, ConditionStatus, GpuJobSpec, GpuJobStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn gj(uid: &str, generation: i64, status: Option<GpuJobStatus>) -> GpuJob {
        let spec: GpuJobSpec =
            serde_json::from_value(serde_json::json!({"image": "i", "gpus": 1})).unwrap();
        let mut g = GpuJob::new(uid, spec);
        g.metadata.uid = Some(uid.into());
        g.metadata.generation = Some(generation);
        g.metadata.creation_timestamp = Some(Time(t("2026-11-30T06:00:00Z")));
        g.status = status;
        g
    }

    fn status(phase: Phase, observed: i64, reason: &str, since: &str) -> GpuJobStatus {
        GpuJobStatus {
            phase: Some(phase),
            observed_generation: Some(observed),
            conditions: vec![Condition {
                type_: READY.into(),
                status: ConditionStatus::False,
                observed_generation: Some(observed),
                last_transition_time: t(since),
                reason: reason.into(),
                message: String::new(),
            }],
            ..Default::default()
        }
    }

    const TEN_MIN: Duration = Duration::from_secs(600);

    #[test]
    fn counts_phases_and_deliberate_waits() {
        let all = [
            gj(
                "a",
                1,
                Some(status(
                    Phase::Running,
                    1,
                    "JobRunning",
                    "2026-11-30T06:00:00Z",
                )),
            ),
            gj(
                "b",
                1,
                Some(status(
                    Phase::Pending,
                    1,
                    "BackingOff",
                    "2026-11-30T06:00:00Z",
                )),
            ),
            gj(
                "c",
                1,
                Some(status(
                    Phase::Pending,
                    1,
                    "InvalidSpec",
                    "2026-11-30T06:00:00Z",
                )),
            ),
            gj(
                "d",
                1,
                Some(status(
                    Phase::Succeeded,
                    1,
                    "Succeeded",
                    "2026-11-30T06:00:00Z",
                )),
            ),
            gj("e", 1, None),
        ];
        let snap = snapshot(
            &all,
            t("2026-11-30T06:01:00Z"),
            TEN_MIN,
            &mut FirstSeen::new(),
        );
        assert_eq!(snap.by_phase["Running"], 1);
        assert_eq!(snap.by_phase["Pending"], 2);
        assert_eq!(snap.by_phase["Unknown"], 1);
        assert_eq!(snap.waiting["BackingOff"], 1);
        assert_eq!(snap.waiting["InvalidSpec"], 1);
        assert_eq!(snap.waiting["QuotaRefused"], 0);
        // "e" has never been looked at (generation 1, nothing observed): behind, but for
        // no time at all yet.
        assert_eq!(snap.unconverged, 1);
        assert_eq!(snap.oldest_unconverged, Duration::ZERO);
    }

    #[test]
    fn pending_without_progress_past_the_threshold_is_unconverged() {
        let stuck = gj(
            "s",
            1,
            Some(status(
                Phase::Pending,
                1,
                "JobPending",
                "2026-11-30T06:00:00Z",
            )),
        );
        let running = gj(
            "r",
            1,
            Some(status(
                Phase::Running,
                1,
                "JobRunning",
                "2026-11-30T05:00:00Z",
            )),
        );
        let backing_off = gj(
            "b",
            1,
            Some(status(
                Phase::Pending,
                1,
                "BackingOff",
                "2026-11-30T05:00:00Z",
            )),
        );
        // Held by Kueue for an hour: its ClusterQueue is full, on purpose.
        let queued = gj(
            "q",
            1,
            Some(status(Phase::Pending, 1, "Queued", "2026-11-30T05:00:00Z")),
        );
        // Waiting for an old pod on a lost node: its own gauge and alert.
        let lost = gj(
            "l",
            1,
            Some(status(
                Phase::Pending,
                1,
                "WaitingForLostNode",
                "2026-11-30T05:00:00Z",
            )),
        );
        let all = [stuck, running, backing_off, queued, lost];
        let early = snapshot(
            &all,
            t("2026-11-30T06:09:00Z"),
            TEN_MIN,
            &mut FirstSeen::new(),
        );
        assert_eq!(early.unconverged, 0, "within the threshold");
        let late = snapshot(
            &all,
            t("2026-11-30T06:15:00Z"),
            TEN_MIN,
            &mut FirstSeen::new(),
        );
        assert_eq!(
            late.unconverged, 1,
            "only the one without a deliberate reason or a running attempt"
        );
        assert_eq!(late.oldest_unconverged, Duration::from_secs(900));
        assert_eq!(late.waiting["Queued"], 1);
        assert_eq!(late.waiting["WaitingForLostNode"], 1);
    }

    #[test]
    fn an_unprocessed_spec_change_ages_from_when_it_was_first_seen() {
        let mut seen = FirstSeen::new();
        let changed = [gj(
            "g",
            2,
            Some(status(
                Phase::Running,
                1,
                "JobRunning",
                "2026-11-30T06:00:00Z",
            )),
        )];
        let first = snapshot(&changed, t("2026-11-30T07:00:00Z"), TEN_MIN, &mut seen);
        assert_eq!(
            (first.unconverged, first.oldest_unconverged),
            (1, Duration::ZERO)
        );
        let later = snapshot(&changed, t("2026-11-30T07:20:00Z"), TEN_MIN, &mut seen);
        assert_eq!(later.oldest_unconverged, Duration::from_secs(1200));
        // Processed: gone, and forgotten.
        let done = [gj(
            "g",
            2,
            Some(status(
                Phase::Running,
                2,
                "JobRunning",
                "2026-11-30T06:00:00Z",
            )),
        )];
        assert_eq!(
            snapshot(&done, t("2026-11-30T07:21:00Z"), TEN_MIN, &mut seen).unconverged,
            0
        );
        assert!(seen.is_empty());
    }
}
