//! Where this replica's term of each shard began, as a resourceVersion `T`: read once
//! per term and namespace by a quorum list of the namespace's GpuJobs (their metadata,
//! paged), after the term was gained, by the executor when a plan asks
//! (`Action::ReadTermStart`, which the view offers one reconcile of the namespace at a
//! time, never a first look from the caches, which makes no request:
//! [`TermStarts::covers`]). A cached GpuJob whose resourceVersion is past `T`
//! needs no confirming read before its first effect (`Action::Confirm`): that is every
//! GpuJob created or changed after a replica took its shard, so a burst of new GpuJobs
//! costs no read each. The same list says which version each older GpuJob of the
//! namespace is at: a cached GpuJob at that version is current, as if it had been read
//! alone (the view marks it so: `View::record`). Only a GpuJob the cache shows behind
//! the list is read first; so a hand-over costs one list per namespace, not a read per
//! GpuJob.
//!
//! Why that is sound. A confirming read exists so that an effect is not decided on a
//! GpuJob that an earlier holder of the shard has changed since. An earlier holder's
//! writes can arrive late (queued, connecting, frozen past its lease), so "they were all
//! committed before the term began" would be false. What holds instead:
//!
//! 1. Every GpuJob write carries the resourceVersion `p` of the version it was computed
//!    from (status and finalizer patches; deletes carry uid and resourceVersion): the
//!    API server applies it only while the GpuJob is still at `p`. `Writer` refuses to
//!    send one without it.
//! 2. The earlier holder read version `p` before its lease deadline, so before this term
//!    began, so before the read of `T`: `p <= T` (etcd revisions grow with time, and a
//!    quorum list's version is at least every revision committed before it).
//! 3. A cached version `v` with `v > T` is newer than `p`. A GpuJob's resourceVersion
//!    only grows, so once it is at `v` it is never at `p` again: no late write of an
//!    earlier holder can ever apply on top of `v`. Whatever of theirs did commit, did so
//!    before `v`, and `v` shows it.
//!
//! Strictly past: a version `v == T` is not covered by `T` alone, so the argument needs
//! no assumption about where the term's own Lease write was stored (a GpuJob at `T` is
//! in the list that read `T`, and is current by that read, as by any other). Writes the view does not take from
//! GpuJobs are outside this argument: a late Job create is found by the Job watch and
//! undone (`JobDeletion::Stray`), and quota calls are fenced by the provider's token.
//!
//! resourceVersions are compared as numbers, which kube-apiserver's own watch cache does
//! (they are etcd revisions, one sequence for the whole store). One that is not a number
//! is never taken for current: the GpuJob is read first, as before.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// A read offered and not answered (its reconcile needed no confirmed view, failed, or
/// was cancelled), or failed, is offered again after this long; meanwhile GpuJobs are
/// confirmed one by one.
const RETRY_AFTER: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Copy)]
enum Start {
    Known(u64),
    /// Unknown, and offered to no one: the next caller is.
    Open,
    /// Offered to one reconcile at this instant; the others confirm their GpuJob.
    Offered(Instant),
    Failed(Instant),
}

/// Whether a caller of [`TermStarts::covers`] may be offered the read of where the term
/// began.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offer {
    /// It can make the read (a worker's reconcile).
    May,
    /// It makes no request (a first look from the caches): holding the offer, it would
    /// make a worker's reconcile of the namespace meanwhile read its GpuJob alone.
    Never,
}

/// What [`TermStarts::covers`] says of a GpuJob version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Covered {
    /// The version is past the term's start: current in the term.
    pub past: bool,
    /// The start is not known and the caller is the one to read it.
    pub due: bool,
}

/// Where the current term of a shard began, as read in one of its namespaces.
type Part = (u32, String);

/// The start of each shard's current term as read in each namespace, by (shard,
/// namespace): `(epoch, start)`. A namespace's entry (a few dozen bytes) stays until its
/// shard is lost ([`TermStarts::forget_where`]) or a later term's read replaces it.
#[derive(Debug, Default)]
pub struct TermStarts {
    by_part: Mutex<HashMap<Part, (u64, Start)>>,
}

impl TermStarts {
    fn lock(&self) -> MutexGuard<'_, HashMap<Part, (u64, Start)>> {
        self.by_part.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether version `rv` of a GpuJob in namespace `ns` is past the start of term
    /// `epoch` of `shard` (never while the start is unknown), and whether the caller
    /// should read the start (`due`: unknown, and not offered to another caller in the
    /// last [`RETRY_AFTER`]); never with [`Offer::Never`].
    pub fn covers(
        &self,
        shard: u32,
        ns: &str,
        epoch: u64,
        rv: &str,
        now: Instant,
        offer: Offer,
    ) -> Covered {
        let mut by_part = self.lock();
        let part = (shard, ns.to_owned());
        let offered = match by_part.get(&part) {
            // A caller still in an ended term reads nothing for it.
            Some((e, _)) if *e > epoch => false,
            Some((e, Start::Known(start))) if *e == epoch => {
                return Covered {
                    past: past(rv, *start),
                    due: false,
                };
            }
            Some((e, Start::Offered(at) | Start::Failed(at)))
                if *e == epoch && now.saturating_duration_since(*at) < RETRY_AFTER =>
            {
                false
            }
            _ => offer == Offer::May,
        };
        if offered {
            by_part.insert(part, (epoch, Start::Offered(now)));
        }
        Covered {
            past: false,
            due: offered,
        }
    }

    /// The caller offered the read of term `epoch` of `shard`'s start in `ns` will not
    /// make it (its GpuJob needed no confirmed view): the next caller is offered it.
    pub fn declined(&self, shard: u32, ns: &str, epoch: u64) {
        let mut by_part = self.lock();
        let part = (shard, ns.to_owned());
        if matches!(by_part.get(&part), Some((e, Start::Offered(_))) if *e == epoch) {
            by_part.insert(part, (epoch, Start::Open));
        }
    }

    /// Drops the entries of the namespaces `lost` says this replica no longer holds.
    pub fn forget_where(&self, lost: impl Fn(&str) -> bool) {
        self.lock().retain(|(_, ns), _| !lost(ns));
    }

    /// A read of where term `epoch` of `shard` began, in `ns`, found `start` (`None`: it
    /// failed).
    pub fn learned(&self, shard: u32, ns: &str, epoch: u64, start: Option<u64>, now: Instant) {
        let mut by_part = self.lock();
        let part = (shard, ns.to_owned());
        // Only this term's entry: a newer term may have begun meanwhile.
        if by_part.get(&part).is_none_or(|(e, _)| *e == epoch) {
            let state = start.map_or(Start::Failed(now), Start::Known);
            by_part.insert(part, (epoch, state));
        }
    }
}

/// Whether resourceVersion `rv` is past `start` (never, when `rv` is not a number).
pub fn past(rv: &str, start: u64) -> bool {
    rv.parse::<u64>().is_ok_and(|v| v > start)
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::{Covered, Offer, TermStarts, past};

    #[test]
    fn one_reconcile_at_a_time_is_offered_the_read_and_an_unanswered_offer_comes_back() {
        let starts = TermStarts::default();
        let t0 = Instant::now();
        let unknown = |due| Covered { past: false, due };
        // A caller that may not read is not offered it, and takes no turn.
        assert_eq!(
            starts.covers(0, "ns", 1, "10", t0, Offer::Never),
            unknown(false)
        );
        assert_eq!(
            starts.covers(0, "ns", 1, "10", t0, Offer::May),
            unknown(true)
        );
        // Offered: the others confirm their GpuJob meanwhile.
        assert_eq!(
            starts.covers(0, "ns", 1, "10", t0 + Duration::from_secs(1), Offer::May),
            unknown(false)
        );
        // Never answered (its reconcile ended first): offered again.
        let later = t0 + Duration::from_secs(6);
        assert_eq!(
            starts.covers(0, "ns", 1, "10", later, Offer::May),
            unknown(true)
        );
        // Declined (its GpuJob needed no confirmed view): offered to the next at once.
        starts.declined(0, "ns", 1);
        assert_eq!(
            starts.covers(0, "ns", 1, "10", later, Offer::May),
            unknown(true)
        );
        // A failed read waits as long before the next.
        starts.learned(0, "ns", 1, None, later);
        assert_eq!(
            starts.covers(0, "ns", 1, "10", later, Offer::May),
            unknown(false)
        );
        assert_eq!(
            starts.covers(0, "ns", 1, "10", later + Duration::from_secs(6), Offer::May),
            unknown(true)
        );
        starts.learned(0, "ns", 1, Some(10), later);
        assert_eq!(
            starts.covers(0, "ns", 1, "11", later, Offer::May),
            Covered {
                past: true,
                due: false
            }
        );
        assert_eq!(
            starts.covers(0, "ns", 1, "10", later, Offer::May),
            unknown(false)
        );
        // A new term knows nothing of the last one's start; an answer about the old
        // term does not overwrite the new one's.
        assert_eq!(
            starts.covers(0, "ns", 2, "11", later, Offer::May),
            unknown(true)
        );
        starts.learned(0, "ns", 1, Some(5), later);
        assert_eq!(
            starts.covers(0, "ns", 2, "11", later, Offer::May),
            unknown(false)
        );
        // Nor does a caller of the old term take the new term's offer.
        starts.declined(0, "ns", 2);
        assert_eq!(
            starts.covers(0, "ns", 1, "11", later, Offer::May),
            unknown(false)
        );
        assert_eq!(
            starts.covers(0, "ns", 2, "11", later, Offer::May),
            unknown(true)
        );
        // Each namespace of the shard reads its own: known in one, offered in another.
        starts.learned(0, "ns", 2, Some(10), later);
        assert!(starts.covers(0, "ns", 2, "11", later, Offer::May).past);
        assert_eq!(
            starts.covers(0, "other", 2, "11", later, Offer::May),
            unknown(true)
        );
        assert_eq!(
            starts.covers(1, "ns", 2, "11", later, Offer::May),
            unknown(true)
        );
        // A lost shard's namespaces are forgotten; the others' kept.
        starts.learned(0, "other", 2, Some(10), later);
        starts.forget_where(|ns| ns == "ns");
        assert_eq!(
            starts.covers(0, "ns", 2, "11", later, Offer::May),
            unknown(true)
        );
        assert!(starts.covers(0, "other", 2, "11", later, Offer::May).past);
    }

    #[test]
    fn versions_past_the_start_are_covered() {
        assert!(past("121", 120));
        assert!(!past("119", 120));
        // The start itself may be the very version an earlier holder computed a late
        // write from (module docs): read first.
        assert!(!past("120", 120));
        // Compared as numbers, not as text.
        assert!(past("1000", 999));
        assert!(!past("999", 1000));
    }

    #[test]
    fn a_version_that_is_not_a_number_is_never_covered() {
        assert!(!past("", 0));
        assert!(!past("abc", 0));
        assert!(!past("-1", 0));
    }
}
