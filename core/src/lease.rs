//! Pure lease decisions, client-go semantics: a Lease held by someone else counts as
//! expired only when its record has not changed for a lease duration, measured on this
//! replica's own monotonic clock from when it last saw the record change. Wall-clock
//! times in the record are for humans and are never compared across machines.
//!
//! Nothing here reads a clock: the caller passes the instant it saw a record at and the
//! instant to judge at (the operator's lease loop takes them from tokio's clock, so its
//! tests can pause it), and the wall-clock time a claim records.

use std::time::{Duration, Instant};

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

/// Timing of one election.
#[derive(Debug, Clone, PartialEq)]
pub struct Timing {
    /// How long a Lease nobody renews stays valid for others.
    pub lease_duration: Duration,
    /// The holder steps down when no renewal succeeded for this long.
    pub renew_deadline: Duration,
    /// Pause between attempts to acquire or renew.
    pub retry_period: Duration,
}

impl Default for Timing {
    fn default() -> Timing {
        // client-go's defaults.
        Timing {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

impl Timing {
    /// duration > renew deadline > 1.2 × retry period (client-go's jitter factor), and
    /// a lease duration of whole seconds (the Lease records seconds).
    pub fn validate(&self) -> Result<(), String> {
        if self.lease_duration <= self.renew_deadline {
            return Err(format!(
                "lease duration ({:?}) must be greater than the renew deadline ({:?})",
                self.lease_duration, self.renew_deadline
            ));
        }
        if self.renew_deadline.as_secs_f64() <= 1.2 * self.retry_period.as_secs_f64() {
            return Err(format!(
                "renew deadline ({:?}) must be greater than 1.2 × the retry period ({:?})",
                self.renew_deadline, self.retry_period
            ));
        }
        if self.retry_period.is_zero() {
            return Err("retry period must be greater than zero".to_owned());
        }
        if self.lease_duration.subsec_nanos() != 0 {
            return Err(format!(
                "lease duration ({:?}) must be whole seconds",
                self.lease_duration
            ));
        }
        Ok(())
    }
}

/// What this replica last saw of the Lease, and when (its own clock).
#[derive(Debug, Clone)]
pub struct Observed {
    pub spec: LeaseSpec,
    pub resource_version: String,
    pub at: Instant,
}

impl Observed {
    pub fn holder(&self) -> Option<&str> {
        self.spec
            .holder_identity
            .as_deref()
            .filter(|h| !h.is_empty())
    }

    /// Held by someone else whose record changed less than its lease duration ago.
    pub fn held_by_other(&self, me: &str, now: Instant) -> bool {
        let Some(holder) = self.holder() else {
            return false; // released, or never held
        };
        if holder == me {
            return false;
        }
        let secs = self.spec.lease_duration_seconds.unwrap_or(0).max(0);
        let valid_for = Duration::from_secs(u64::try_from(secs).unwrap_or(0));
        now < self.at + valid_for
    }

    /// How long the record has been released or expired, on this replica's clock: since
    /// it was seen changing to no holder, or since its lease duration ran out after it
    /// was last seen changing. `None` while it is held by a live replica or names `me`
    /// (a replica never judges its own record gone). No remote timestamp is compared.
    pub fn gone_for(&self, me: &str, now: Instant) -> Option<Duration> {
        let ends = match self.holder() {
            None => self.at,
            Some(holder) if holder == me => return None,
            Some(_) => {
                let secs = self.spec.lease_duration_seconds.unwrap_or(0).max(0);
                self.at + Duration::from_secs(u64::try_from(secs).unwrap_or(0))
            }
        };
        (now >= ends).then(|| now.saturating_duration_since(ends))
    }
}

/// The record this replica writes to take (`new_term`) or renew the Lease. Every new
/// term counts as a transition, also when the record still names this replica (it
/// restarted, or stepped down and came back): `leaseTransitions` then orders the terms
/// of one Lease object (a recreated Lease starts again from 0).
pub fn claim(
    previous: Option<&LeaseSpec>,
    me: &str,
    timing: &Timing,
    wall: Timestamp,
    new_term: bool,
) -> LeaseSpec {
    let transitions = previous.and_then(|p| p.lease_transitions).unwrap_or(0);
    let duration = i32::try_from(timing.lease_duration.as_secs()).unwrap_or(i32::MAX);
    LeaseSpec {
        holder_identity: Some(me.to_owned()),
        lease_duration_seconds: Some(duration),
        acquire_time: if new_term {
            Some(MicroTime(wall))
        } else {
            previous.and_then(|p| p.acquire_time.clone())
        },
        renew_time: Some(MicroTime(wall)),
        lease_transitions: Some(match previous {
            Some(_) if new_term => transitions.saturating_add(1),
            _ => transitions,
        }),
        ..LeaseSpec::default()
    }
}

/// The record that gives the Lease up: no holder, so a standby takes it at once.
pub fn release(previous: &LeaseSpec, wall: Timestamp) -> LeaseSpec {
    LeaseSpec {
        holder_identity: None,
        lease_duration_seconds: Some(1),
        acquire_time: Some(MicroTime(wall)),
        renew_time: Some(MicroTime(wall)),
        lease_transitions: previous.lease_transitions,
        ..LeaseSpec::default()
    }
}

/// A Lease as seen at `at`.
pub fn observed(lease: &Lease, at: Instant) -> Observed {
    Observed {
        spec: lease.spec.clone().unwrap_or_default(),
        resource_version: lease.metadata.resource_version.clone().unwrap_or_default(),
        at,
    }
}

/// The expiry clock restarts only when the record changed.
pub fn update(seen: &mut Observed, lease: &Lease, now: Instant) {
    let rv = lease.metadata.resource_version.clone().unwrap_or_default();
    if seen.resource_version != rv {
        *seen = observed(lease, now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing() -> Timing {
        Timing {
            lease_duration: Duration::from_secs(3),
            renew_deadline: Duration::from_secs(2),
            retry_period: Duration::from_millis(500),
        }
    }

    fn held(holder: &str, at: Instant) -> Observed {
        Observed {
            spec: LeaseSpec {
                holder_identity: Some(holder.into()),
                lease_duration_seconds: Some(3),
                lease_transitions: Some(4),
                acquire_time: Some(MicroTime("2026-11-30T06:00:00Z".parse().unwrap())),
                ..LeaseSpec::default()
            },
            resource_version: "7".into(),
            at,
        }
    }

    #[test]
    fn timings_are_validated() {
        assert!(timing().validate().is_ok());
        assert!(Timing::default().validate().is_ok());
        let mut t = timing();
        t.renew_deadline = Duration::from_secs(3);
        assert!(t.validate().unwrap_err().contains("renew deadline"));
        let mut t = timing();
        t.retry_period = Duration::from_millis(1700);
        assert!(t.validate().unwrap_err().contains("1.2"));
        let mut t = timing();
        t.lease_duration = Duration::from_millis(3500);
        assert!(t.validate().unwrap_err().contains("whole seconds"));
    }

    #[test]
    fn another_holder_expires_by_local_observation_time_only() {
        let seen = Instant::now();
        let o = held("replica-2", seen);
        assert!(o.held_by_other("replica-1", seen));
        assert!(o.held_by_other("replica-1", seen + Duration::from_millis(2999)));
        assert!(
            !o.held_by_other("replica-1", seen + Duration::from_secs(3)),
            "unchanged for a lease duration: expired"
        );
        assert!(
            !o.held_by_other("replica-2", seen),
            "never held against its holder"
        );
        let mut released = o.clone();
        released.spec.holder_identity = Some(String::new());
        assert!(
            !released.held_by_other("replica-1", seen),
            "an empty holder is free at once"
        );
    }

    #[test]
    fn a_record_is_gone_from_its_release_or_expiry_on_the_local_clock() {
        let t0 = Instant::now();
        let o = held("replica-2", t0);
        assert_eq!(o.gone_for("replica-1", t0), None, "live");
        assert_eq!(
            o.gone_for("replica-1", t0 + Duration::from_millis(2999)),
            None
        );
        assert_eq!(
            o.gone_for("replica-1", t0 + Duration::from_secs(3)),
            Some(Duration::ZERO),
            "expired as held_by_other judges it"
        );
        assert_eq!(
            o.gone_for("replica-1", t0 + Duration::from_secs(10)),
            Some(Duration::from_secs(7))
        );
        assert_eq!(
            o.gone_for("replica-2", t0 + Duration::from_secs(100)),
            None,
            "a replica never judges its own record gone"
        );
        // The record's wall-clock times say nothing: a renewTime far in the past or
        // future does not move the judgement.
        let mut skewed = o.clone();
        skewed.spec.renew_time = Some(MicroTime("2001-01-01T00:00:00Z".parse().unwrap()));
        assert_eq!(skewed.gone_for("replica-1", t0), None);
        let mut released = o.clone();
        released.spec.holder_identity = None;
        assert_eq!(released.gone_for("replica-1", t0), Some(Duration::ZERO));
        assert_eq!(
            released.gone_for("replica-1", t0 + Duration::from_secs(5)),
            Some(Duration::from_secs(5)),
            "released: gone from when it was seen released"
        );
    }

    #[test]
    fn the_expiry_clock_restarts_only_when_the_record_changes() {
        let t0 = Instant::now();
        let mut lease = Lease::default();
        lease.metadata.resource_version = Some("7".into());
        lease.spec = Some(held("replica-2", t0).spec);
        let mut seen = observed(&lease, t0);
        let later = t0 + Duration::from_secs(2);
        update(&mut seen, &lease, later);
        assert_eq!(seen.at, t0, "the same resourceVersion: unchanged");
        lease.metadata.resource_version = Some("8".into());
        update(&mut seen, &lease, later);
        assert_eq!(seen.at, later, "a new resourceVersion: seen changing now");
    }

    #[test]
    fn claims_keep_or_start_the_tenure() {
        let wall: Timestamp = "2026-11-30T06:01:00Z".parse().unwrap();
        let prev = held("replica-2", Instant::now()).spec;
        let taken = claim(Some(&prev), "replica-1", &timing(), wall, true);
        assert_eq!(taken.holder_identity.as_deref(), Some("replica-1"));
        assert_eq!(
            taken.lease_transitions,
            Some(5),
            "a new holder is a transition"
        );
        assert_eq!(taken.acquire_time, Some(MicroTime(wall)));
        assert_eq!(taken.lease_duration_seconds, Some(3));

        let later: Timestamp = "2026-11-30T06:01:02Z".parse().unwrap();
        let renewed = claim(Some(&taken), "replica-1", &timing(), later, false);
        assert_eq!(renewed.lease_transitions, Some(5));
        assert_eq!(
            renewed.acquire_time,
            Some(MicroTime(wall)),
            "renewal keeps acquireTime"
        );
        assert_eq!(renewed.renew_time, Some(MicroTime(later)));

        let first = claim(None, "replica-1", &timing(), wall, true);
        assert_eq!(first.lease_transitions, Some(0));

        // The same replica taking it again (restarted, or after stepping down) starts a
        // new term: it must order after the old term.
        let again = claim(Some(&renewed), "replica-1", &timing(), later, true);
        assert_eq!(again.lease_transitions, Some(6));
        assert_eq!(again.acquire_time, Some(MicroTime(later)));

        let gone = release(&renewed, later);
        assert_eq!(gone.holder_identity, None);
        assert_eq!(gone.lease_transitions, Some(5));
    }
}
