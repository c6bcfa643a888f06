//! Pure: the values of the domain gauges (GpuJobs by phase, deliberately waiting,
//! unconverged) from the [`Facts`] of the cached GpuJobs of the shards a replica holds, so a `sum()`
//! across replicas never counts a GpuJob twice. The operator publishes a [`Snapshot`]
//! (`Metrics::publish_domain`), and zero when it holds no shard.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use jiff::Timestamp;

use crate::api::{GpuJob, Phase};
use crate::plan::INVALID_SPEC;
use crate::status::{
    ADMITTED, BACKING_OFF, CLEANUP_STUCK, QUEUED, QUOTA_REFUSED, QUOTA_RESERVED, READY, SUSPENDED,
    WAITING_FOR_LOST_NODE,
};

/// Ready reasons of a GpuJob that waits on purpose: not stuck, with metrics of its own.
/// `Queued`: Kueue holds the attempt, as its ClusterQueue's quota and policy say.
/// `WaitingForLostNode`: the next attempt (or the quota release of a GpuJob finished or
/// deleted, the one reason counted for those) waits for an old pod on a node that is not
/// Ready; only a person ends it (its own alert, `GpuJobWaitingForLostNode`).
pub const WAITING_REASONS: [&str; 6] = [
    BACKING_OFF,
    QUOTA_REFUSED,
    INVALID_SPEC,
    SUSPENDED,
    QUEUED,
    WAITING_FOR_LOST_NODE,
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
/// a hash of its uid, [`Facts`]): how long a spec change has waited is not recorded
/// anywhere in the object.
pub type FirstSeen = HashMap<u64, (i64, Timestamp)>;

/// What the gauges need of one GpuJob, taken from it once, when the cache takes it in
/// (a watch event decodes it anyway), so that a scrape decodes nothing: at ten thousand
/// GpuJobs, decoding each on every scrape cost more CPU than the reconciles.
/// [`Facts::LEN`] bytes as [`Facts::to_bytes`] writes them, in the cache's record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Facts {
    /// FNV-1a of the uid: the key of [`FirstSeen`].
    uid: u64,
    generation: i64,
    observed_generation: i64,
    /// When its Ready condition last changed, else when it was created (nanoseconds since
    /// the epoch); `None`: neither is known.
    pending_since: Option<i128>,
    /// Index in [`PHASES`].
    phase: u8,
    /// 1 + index in [`WAITING_REASONS`]; 0: not waiting on purpose.
    waiting: u8,
    /// [`PENDING`], [`DELETING`], [`CLEANUP`].
    flags: u8,
}

/// Phase `None` or `Pending`.
const PENDING: u8 = 1;
/// Being deleted: not counted by phase.
const DELETING: u8 = 2;
/// `CleanupStuck=True`.
const CLEANUP: u8 = 4;

impl Facts {
    pub const LEN: usize = 8 + 8 + 8 + 16 + 3;

    pub fn of(gj: &GpuJob) -> Facts {
        let status = gj.status.as_ref();
        let stuck = status.and_then(|s| s.condition(CLEANUP_STUCK));
        let ready = status.and_then(|s| s.condition(READY));
        let admitted = status
            .and_then(|s| s.condition(ADMITTED))
            .filter(|c| c.status == crate::api::ConditionStatus::True)
            .map(|c| c.last_transition_time);
        let phase = status.and_then(|s| s.phase);
        let deleting = gj.metadata.deletion_timestamp.is_some();
        // A finished GpuJob whose reservation a pod on a lost node keeps.
        let quota_kept = status
            .and_then(|s| s.condition(QUOTA_RESERVED))
            .map(|c| c.reason.as_str())
            .filter(|r| *r == WAITING_FOR_LOST_NODE);
        let waiting = ready
            .map(|c| c.reason.as_str())
            // A finished GpuJob waits on nothing but a pod on a lost node that keeps its
            // quota; one being deleted may wait for such a pod before its release.
            .filter(|r| {
                !phase.is_some_and(Phase::is_final) || (deleting && *r == WAITING_FOR_LOST_NODE)
            })
            .or(quota_kept)
            .and_then(|r| WAITING_REASONS.iter().position(|w| *w == r))
            .map_or(0, |i| u8::try_from(i + 1).unwrap_or(0));
        let phase_label = phase.map_or("Unknown", phase_label);
        let mut flags = 0;
        if matches!(phase, None | Some(Phase::Pending)) {
            flags |= PENDING;
        }
        if deleting {
            flags |= DELETING;
        }
        if stuck.is_some_and(|c| c.status == crate::api::ConditionStatus::True) {
            flags |= CLEANUP;
        }
        Facts {
            uid: crate::hash::fnv1a64(gj.metadata.uid.as_deref().unwrap_or_default().as_bytes()),
            generation: gj.metadata.generation.unwrap_or(0),
            observed_generation: status.and_then(|s| s.observed_generation).unwrap_or(0),
            pending_since: ready
                .map(|c| c.last_transition_time)
                // Waiting in a Kueue queue is deliberate (`Queued`): once admitted, the
                // clock starts again, so a wait after admission (the copy MultiKueue
                // makes, a node) is not taken for as long as the queue's.
                .map(|r| admitted.map_or(r, |a| a.max(r)))
                .or(gj.metadata.creation_timestamp.as_ref().map(|t| t.0))
                .map(Timestamp::as_nanosecond),
            phase: phase_index(phase_label),
            waiting,
            flags,
        }
    }

    /// Whether the operator ever recorded what it observed of the GpuJob
    /// (`status.observedGeneration` set): one it never did is new work.
    pub fn observed(&self) -> bool {
        self.observed_generation > 0
    }

    pub fn to_bytes(&self) -> [u8; Facts::LEN] {
        let mut out = [0; Facts::LEN];
        out[..8].copy_from_slice(&self.uid.to_le_bytes());
        out[8..16].copy_from_slice(&self.generation.to_le_bytes());
        out[16..24].copy_from_slice(&self.observed_generation.to_le_bytes());
        // i128::MIN stands for "not known": no condition or creation time is that old.
        let since = self.pending_since.unwrap_or(i128::MIN);
        out[24..40].copy_from_slice(&since.to_le_bytes());
        out[40] = self.phase;
        out[41] = self.waiting;
        out[42] = self.flags;
        out
    }

    /// The facts at the start of `bytes`, and what follows them.
    pub fn from_bytes(bytes: &[u8]) -> Option<(Facts, &[u8])> {
        let (head, rest) = bytes.split_first_chunk::<{ Facts::LEN }>()?;
        let (uid, head) = head.split_first_chunk::<8>()?;
        let (generation, head) = head.split_first_chunk::<8>()?;
        let (observed, head) = head.split_first_chunk::<8>()?;
        let (since, head) = head.split_first_chunk::<16>()?;
        let &[phase, waiting, flags] = head else {
            return None;
        };
        let since = i128::from_le_bytes(*since);
        let facts = Facts {
            uid: u64::from_le_bytes(*uid),
            generation: i64::from_le_bytes(*generation),
            observed_generation: i64::from_le_bytes(*observed),
            pending_since: (since != i128::MIN).then_some(since),
            phase,
            waiting,
            flags,
        };
        Some((facts, rest))
    }
}

/// `threshold`: how long a GpuJob may stay Pending without a running attempt (and
/// without a deliberate reason) before it counts as unconverged.
pub fn snapshot(
    gpujobs: impl IntoIterator<Item = Facts>,
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
        if gj.flags & CLEANUP != 0 {
            snap.cleanup_stuck += 1;
        }
        let waiting = usize::from(gj.waiting)
            .checked_sub(1)
            .and_then(|i| WAITING_REASONS.get(i).copied());
        if gj.flags & DELETING != 0 {
            // Its deletion waits for a pod on a lost node (its release does).
            if let Some(reason @ WAITING_FOR_LOST_NODE) = waiting {
                *snap.waiting.entry(reason).or_default() += 1;
            }
            continue;
        }
        let phase = PHASES
            .get(usize::from(gj.phase))
            .copied()
            .unwrap_or("Unknown");
        *snap.by_phase.entry(phase).or_default() += 1;
        if let Some(reason) = waiting {
            *snap.waiting.entry(reason).or_default() += 1;
        }

        let mut age = None;
        if gj.observed_generation < gj.generation {
            let since = match first_seen.get(&gj.uid) {
                Some((g, t)) if *g == gj.generation => *t,
                _ => now,
            };
            seen_now.insert(gj.uid, (gj.generation, since));
            age = Some(now.duration_since(since));
        }
        if gj.flags & PENDING != 0 && waiting.is_none() {
            // Pending since its Ready condition last changed (or since it was created).
            let since = gj
                .pending_since
                .and_then(|n| Timestamp::from_nanosecond(n).ok())
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

/// The index of `label` in [`PHASES`], that of `Unknown` for any other.
fn phase_index(label: &str) -> u8 {
    let at = |l: &str| PHASES.iter().position(|p| *p == l);
    at(label)
        .or_else(|| at("Unknown"))
        .and_then(|i| u8::try_from(i).ok())
        .unwrap_or(u8::MAX)
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

    /// The domain snapshot of `all` at `now`, with nothing seen before.
    fn snapshot_at(all: &[GpuJob], now: &str) -> Snapshot {
        snapshot(facts(all), t(now), TEN_MIN, &mut FirstSeen::new())
    }

    /// Each GpuJob's facts, through the bytes the cache keeps.
    fn facts(all: &[GpuJob]) -> Vec<Facts> {
        all.iter()
            .map(|g| {
                let bytes = Facts::of(g).to_bytes();
                let (read, rest) = Facts::from_bytes(&bytes).unwrap();
                assert!(rest.is_empty());
                assert_eq!(read, Facts::of(g));
                read
            })
            .collect()
    }

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
        let snap = snapshot_at(&all, "2026-11-30T06:01:00Z");
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
    fn a_gpujob_being_deleted_counts_only_when_its_cleanup_is_stuck() {
        let mut stuck = status(Phase::Running, 1, "JobRunning", "2026-11-30T06:00:00Z");
        stuck.conditions.push(Condition {
            type_: CLEANUP_STUCK.into(),
            status: ConditionStatus::True,
            observed_generation: Some(1),
            last_transition_time: t("2026-11-30T06:00:00Z"),
            reason: "ReleaseFailing".into(),
            message: String::new(),
        });
        let mut deleting = gj("d", 1, Some(stuck));
        deleting.metadata.deletion_timestamp = Some(Time(t("2026-11-30T06:05:00Z")));
        let snap = snapshot_at(&[deleting], "2026-11-30T06:06:00Z");
        assert_eq!(snap.cleanup_stuck, 1);
        assert_eq!(snap.by_phase["Running"], 0, "not counted by phase");
        assert_eq!(snap.unconverged, 0);
        assert_eq!(Facts::from_bytes(&[0; Facts::LEN - 1]), None, "cut short");
    }

    #[test]
    fn a_gpujob_being_deleted_counts_as_waiting_only_for_a_lost_node() {
        let at = |phase, reason| {
            let mut g = gj(
                "d",
                1,
                Some(status(phase, 1, reason, "2026-11-30T06:00:00Z")),
            );
            g.metadata.deletion_timestamp = Some(Time(t("2026-11-30T06:05:00Z")));
            g
        };
        let snap = snapshot_at(
            &[
                at(Phase::Succeeded, WAITING_FOR_LOST_NODE),
                at(Phase::Running, WAITING_FOR_LOST_NODE),
                at(Phase::Pending, "BackingOff"),
            ],
            "2026-11-30T06:06:00Z",
        );
        assert_eq!(snap.waiting[WAITING_FOR_LOST_NODE], 2);
        assert_eq!(snap.waiting["BackingOff"], 0);
        assert_eq!(snap.by_phase["Succeeded"] + snap.by_phase["Running"], 0);
        // Not being deleted, a finished GpuJob waits on nothing by its Ready.
        let done = gj(
            "f",
            1,
            Some(status(
                Phase::Succeeded,
                1,
                WAITING_FOR_LOST_NODE,
                "2026-11-30T06:00:00Z",
            )),
        );
        let snap = snapshot_at(std::slice::from_ref(&done), "2026-11-30T06:06:00Z");
        assert_eq!(snap.waiting[WAITING_FOR_LOST_NODE], 0);
        // But a pod on a lost node that keeps its reservation counts.
        let mut kept = done;
        if let Some(s) = kept.status.as_mut() {
            s.conditions.push(Condition {
                type_: QUOTA_RESERVED.into(),
                status: ConditionStatus::True,
                observed_generation: Some(1),
                last_transition_time: t("2026-11-30T06:00:00Z"),
                reason: WAITING_FOR_LOST_NODE.into(),
                message: String::new(),
            });
        }
        let snap = snapshot_at(&[kept], "2026-11-30T06:06:00Z");
        assert_eq!(snap.waiting[WAITING_FOR_LOST_NODE], 1);
        assert_eq!(snap.by_phase["Succeeded"], 1);
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
        let early = snapshot_at(&all, "2026-11-30T06:09:00Z");
        assert_eq!(early.unconverged, 0, "within the threshold");
        let late = snapshot_at(&all, "2026-11-30T06:15:00Z");
        assert_eq!(
            late.unconverged, 1,
            "only the one without a deliberate reason or a running attempt"
        );
        assert_eq!(late.oldest_unconverged, Duration::from_secs(900));
        assert_eq!(late.waiting["Queued"], 1);
        assert_eq!(late.waiting["WaitingForLostNode"], 1);
    }

    #[test]
    fn a_wait_after_kueue_admitted_the_attempt_ages_from_the_admission() {
        // Queued an hour (on purpose), admitted at 06:00, its copy on a MultiKueue
        // worker not started yet: Pending since the create, as Ready says, but waiting
        // without a deliberate reason only since the admission.
        let mut dispatching = status(Phase::Pending, 1, "Dispatching", "2026-11-30T05:00:00Z");
        dispatching.conditions.push(Condition {
            type_: ADMITTED.into(),
            status: ConditionStatus::True,
            observed_generation: Some(1),
            last_transition_time: t("2026-11-30T06:00:00Z"),
            reason: "Admitted".into(),
            message: String::new(),
        });
        let all = [gj("m", 1, Some(dispatching))];
        let soon = snapshot_at(&all, "2026-11-30T06:05:00Z");
        assert_eq!(soon.unconverged, 0, "five minutes since the admission");
        let late = snapshot_at(&all, "2026-11-30T06:15:00Z");
        assert_eq!(
            late.unconverged, 1,
            "a copy stuck past the threshold still counts"
        );
        assert_eq!(late.oldest_unconverged, Duration::from_secs(900));
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
        let first = snapshot(
            facts(&changed),
            t("2026-11-30T07:00:00Z"),
            TEN_MIN,
            &mut seen,
        );
        assert_eq!(
            (first.unconverged, first.oldest_unconverged),
            (1, Duration::ZERO)
        );
        let later = snapshot(
            facts(&changed),
            t("2026-11-30T07:20:00Z"),
            TEN_MIN,
            &mut seen,
        );
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
            snapshot(facts(&done), t("2026-11-30T07:21:00Z"), TEN_MIN, &mut seen).unconverged,
            0
        );
        assert!(seen.is_empty());
    }
}
