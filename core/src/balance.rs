//! Pure: which shards this replica takes and which it gives up, from what it observes
//! (shard holders, live members) — no client, no clock of its own.
//!
//! - Each live replica holds at most its share, `ceil(shards / live replicas)`.
//! - A replica holding more than its share releases the surplus: the shards it ranks
//!   lowest.
//! - Free shards (released, never taken, or expired) go, in shard order, each to the
//!   live replica with room that ranks it highest by rendezvous (highest-random-weight)
//!   hashing of (replica, shard). Every replica computes the same assignment from the
//!   same view, so each takes what the assignment gives it; a membership change moves
//!   only the shards it must (current holders keep what fits their share).
//! - A shard free for a lease duration is taken by anyone (views can disagree for a
//!   while): no shard stays unowned while a replica lives. Two takers race on the
//!   Lease's resourceVersion; one wins, and the surplus is released later.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::hash::fnv1a64;

/// The rendezvous weight of `member` for `shard`: FNV-1a 64 of `member/shard`, mixed
/// (splitmix64's finalizer) so that similar names spread evenly.
pub fn weight(member: &str, shard: u32) -> u64 {
    let mut h = fnv1a64(format!("{member}/{shard}").as_bytes());
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// The most shards one of `live` replicas holds: `ceil(shards / live)`.
pub fn share(shards: usize, live: usize) -> usize {
    shards.div_ceil(live.max(1))
}

/// Who holds a shard, as this replica observes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holder {
    /// Nobody (released, never taken, or expired on this replica's clock), for this long.
    Free(Duration),
    Held(String),
}

/// What one replica sees.
#[derive(Debug, Clone)]
pub struct View<'a> {
    pub me: &'a str,
    /// Live replicas (this one included).
    pub members: &'a BTreeSet<String>,
    /// Holder of each shard, by shard number.
    pub holders: &'a [Holder],
    pub lease_duration: Duration,
}

/// What to do now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Decision {
    pub take: BTreeSet<u32>,
    pub release: BTreeSet<u32>,
}

pub fn decide(v: &View<'_>) -> Decision {
    let mut members: BTreeSet<&str> = v.members.iter().map(String::as_str).collect();
    members.insert(v.me);
    let cap = share(v.holders.len(), members.len());
    let mut load: BTreeMap<&str, usize> = members.iter().map(|m| (*m, 0)).collect();
    for h in v.holders {
        if let Holder::Held(m) = h
            && let Some(l) = load.get_mut(m.as_str())
        {
            *l += 1;
        }
    }
    let mut decision = Decision::default();

    // Surplus: the shards this replica ranks lowest go first.
    let mut mine: Vec<u32> = shards(v.holders)
        .filter(|(_, h)| matches!(h, Holder::Held(m) if m == v.me))
        .map(|(s, _)| s)
        .collect();
    mine.sort_by_key(|s| (weight(v.me, *s), *s));
    let surplus = mine.len().saturating_sub(cap);
    decision.release.extend(mine.into_iter().take(surplus));
    if let Some(l) = load.get_mut(v.me) {
        *l -= surplus;
    }

    for (s, h) in shards(v.holders) {
        let Holder::Free(free_for) = h else {
            continue;
        };
        let candidate = members
            .iter()
            .copied()
            .filter(|m| load.get(m).is_some_and(|l| *l < cap))
            .max_by_key(|m| (weight(m, s), *m));
        if candidate == Some(v.me) || *free_for >= v.lease_duration {
            decision.take.insert(s);
        }
        if let Some(l) = candidate.and_then(|c| load.get_mut(c)) {
            *l += 1;
        }
    }
    decision
}

/// What this replica should keep warm to take over without a relist: the shards it
/// would take if one other live replica were gone (each in turn), and those it takes
/// next anyway (free ones, and those of a replica no longer live, whose Leases will
/// expire). Computed by [`decide`] itself on the view as it would be then, so room and
/// rank count as they will. Without the second kind, a dead replica's shards would leave
/// the warm set when its heartbeat expired or its Leases did, a moment before the
/// takeover, and be listed again.
pub fn successor_of(v: &View<'_>) -> BTreeSet<u32> {
    let dead = |m: &String| m != v.me && !v.members.contains(m);
    // A shard of a replica no longer live is as good as free: it will be.
    let base: Vec<Holder> = v
        .holders
        .iter()
        .map(|h| match h {
            Holder::Held(m) if dead(m) => Holder::Free(Duration::ZERO),
            other => other.clone(),
        })
        .collect();
    // What it takes next: free shards, and those of replicas no longer live.
    let mut warm: BTreeSet<u32> = decide(&View {
        holders: &base,
        ..*v
    })
    .take;
    for gone in v.members.iter().filter(|m| m.as_str() != v.me) {
        let members: BTreeSet<String> = v.members.iter().filter(|m| *m != gone).cloned().collect();
        let holders: Vec<Holder> = base
            .iter()
            .map(|h| match h {
                Holder::Held(m) if m == gone => Holder::Free(Duration::ZERO),
                other => other.clone(),
            })
            .collect();
        let without = View {
            members: &members,
            holders: &holders,
            ..*v
        };
        // Its shards, and free ones (a Lease that expired before its holder's
        // heartbeat did) it would take then.
        warm.extend(decide(&without).take);
    }
    warm
}

fn shards(holders: &[Holder]) -> impl Iterator<Item = (u32, &Holder)> {
    holders
        .iter()
        .enumerate()
        .map(|(s, h)| (u32::try_from(s).unwrap_or(u32::MAX), h))
}

#[cfg(test)]
mod tests;
