//! The shard map kept by the replicas: where the cuts go as GpuJobs arrive, and the rule
//! that keeps a namespace from having two writers while a cut moves.
//!
//! Each shard Lease states the hash range its holder writes in (its claim) and, while
//! held, how many GpuJobs each namespace of that range has (its load). The holder of
//! shard 0 reads every shard's load from one list of the Leases and, when the busiest
//! shard holds more than [`Rule::skew`] times the mean, writes new cuts under the next
//! version of the map. A replica that sees a newer map gives up the shards whose range
//! changed (drain, then release) and keeps the others; a shard is taken under the new map
//! only while no live Lease of another shard claims any of its range
//! ([`free_to_take`]), checked before the acquire and again right after it, before
//! anything is written in its term. The model in `core/tests/recut` checks that no
//! namespace ever has two writers and that every namespace has a holder once faults stop.

use std::collections::{BTreeMap, BTreeSet};

use crate::shard::{HashRange, ShardMap};

/// Shard Lease annotation: the range its holder writes in, `0x<start>-0x<end>` (end
/// exclusive, `0x10000000000000000` for the last).
pub const ANNOTATION_RANGE: &str = "gpujob.dev/shard-range";
/// Shard Lease annotation: the map version its holder acts under.
pub const ANNOTATION_VERSION: &str = "gpujob.dev/shard-map-version";
/// Shard Lease annotation: GpuJobs per namespace of its range, `<hash hex>:<count>`
/// comma-separated, sorted by hash.
pub const ANNOTATION_LOAD: &str = "gpujob.dev/shard-load";
/// Map Lease annotation: the cuts, as `--shard-cuts` takes them.
pub const ANNOTATION_CUTS: &str = "gpujob.dev/shard-cuts";

/// At most this many namespaces are listed in one shard's load; past it, neighbouring
/// namespaces are summed into one entry (a cut then falls between entries only). Keeps
/// a Lease well under the API server's size limits (about 23 bytes per entry).
pub const MAX_LOAD_ENTRIES: usize = 500;

/// Do two ranges share a hash?
pub fn overlaps(a: &HashRange, b: &HashRange) -> bool {
    u128::from(a.start) < b.end && u128::from(b.start) < a.end
}

/// As [`ANNOTATION_RANGE`] states a range.
pub fn format_range(r: &HashRange) -> String {
    format!("0x{:016x}-0x{:016x}", r.start, r.end)
}

/// A range as [`ANNOTATION_RANGE`] states it; `None` if it does not parse (a live
/// Lease's claim that does not parse is taken to cover everything: [`EVERYTHING`]).
pub fn parse_range(text: &str) -> Option<HashRange> {
    let (start, end) = text.trim().split_once('-')?;
    let start = u64::from_str_radix(start.strip_prefix("0x")?, 16).ok()?;
    let end = u128::from_str_radix(end.strip_prefix("0x")?, 16).ok()?;
    (end <= 1u128 << 64 && u128::from(start) <= end).then_some(HashRange { start, end })
}

/// Everything: the claim of a live Lease whose range cannot be read.
pub const EVERYTHING: HashRange = HashRange {
    start: 0,
    end: 1u128 << 64,
};

/// May a shard whose range is `range` be taken, given the ranges live Leases of other
/// shards claim (this replica's own included, those it still drains too)?
pub fn free_to_take(range: &HashRange, claims: &[HashRange]) -> bool {
    !claims.iter().any(|c| overlaps(range, c))
}

/// The shards whose range differs between `old` and `new`: their holders give them up
/// (drain, then release) before acting under `new`; the others keep working.
pub fn moved(old: &ShardMap, new: &ShardMap) -> BTreeSet<u32> {
    if old.shards() != new.shards() {
        return (0..old.shards().max(new.shards())).collect();
    }
    (0..new.shards())
        .filter(|s| old.range(*s) != new.range(*s))
        .collect()
}

/// A shard's load as [`ANNOTATION_LOAD`] states it: namespaces are summed from the
/// lowest hash up into at most [`MAX_LOAD_ENTRIES`] entries.
pub fn format_load(per_namespace: &BTreeMap<u64, u64>) -> String {
    let per_entry = per_namespace.len().div_ceil(MAX_LOAD_ENTRIES).max(1);
    let entries: Vec<(u64, u64)> = per_namespace
        .iter()
        .collect::<Vec<_>>()
        .chunks(per_entry)
        .map(|chunk| (*chunk[0].0, chunk.iter().map(|(_, n)| **n).sum()))
        .collect();
    entries
        .iter()
        .map(|(h, n)| format!("{h:x}:{n}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// A load as [`ANNOTATION_LOAD`] states it; `None` if any entry does not parse.
pub fn parse_load(text: &str) -> Option<Vec<(u64, u64)>> {
    if text.trim().is_empty() {
        return Some(Vec::new());
    }
    text.split(',')
        .map(|e| {
            let (h, n) = e.trim().split_once(':')?;
            Some((u64::from_str_radix(h, 16).ok()?, n.parse().ok()?))
        })
        .collect()
}

/// When the keeper re-cuts.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    /// Re-cut when the busiest shard holds more than this times the mean.
    pub skew: f64,
    /// ... and the new cuts bring the busiest shard below this share of what it holds now
    /// (hysteresis: a cut that barely helps is not worth a hand-over).
    pub gain: f64,
    /// No re-cut below this many GpuJobs in all (too few to say where the load is).
    pub min_gpujobs: u64,
}

impl Default for Rule {
    fn default() -> Rule {
        Rule {
            skew: 1.25,
            gain: 0.9,
            min_gpujobs: 20,
        }
    }
}

/// The GpuJobs each shard of `map` holds, by `loads` (namespace hash, GpuJobs).
pub fn per_shard(map: &ShardMap, loads: &[(u64, u64)]) -> Vec<u64> {
    let mut per = vec![0u64; map.shards() as usize];
    for (h, n) in loads {
        per[map.shard_of_hash(*h) as usize] += n;
    }
    per
}

/// The busiest shard's GpuJobs over the mean (1 when there are none).
pub fn skew(per_shard: &[u64]) -> f64 {
    let total: u64 = per_shard.iter().sum();
    if total == 0 || per_shard.is_empty() {
        return 1.0;
    }
    let max = per_shard.iter().copied().max().unwrap_or(0);
    max as f64 * per_shard.len() as f64 / total as f64
}

/// New cuts for `map` by `loads`, if [`Rule`] says re-cut: namespaces are never split
/// (a cut falls halfway between two, [`ShardMap::balanced`]).
pub fn recut(map: &ShardMap, loads: &[(u64, u64)], rule: &Rule) -> Option<ShardMap> {
    let now = per_shard(map, loads);
    let total: u64 = now.iter().sum();
    if map.shards() < 2 || total < rule.min_gpujobs || skew(&now) <= rule.skew {
        return None;
    }
    let next = ShardMap::balanced(loads.iter().copied(), map.shards());
    let busiest = |per: &[u64]| per.iter().copied().max().unwrap_or(0) as f64;
    (next != *map && busiest(&per_shard(&next, loads)) < busiest(&now) * rule.gain).then_some(next)
}

/// The first cut of a map still at equal ranges, made at once in a burst (when
/// GpuJob counts stated a few seconds apart by different holders are no picture of one
/// moment, but which namespaces have GpuJobs is): by [`recut`] with every namespace
/// that has a GpuJob weighing one. Cutting early moves few GpuJobs; a later re-cut by
/// GpuJobs, once the load is steady, moves only what that cut got wrong.
pub fn first_cut(map: &ShardMap, loads: &[(u64, u64)], rule: &Rule) -> Option<ShardMap> {
    let total: u64 = loads.iter().map(|(_, n)| n).sum();
    if total < rule.min_gpujobs {
        return None;
    }
    let namespaces: Vec<(u64, u64)> = loads
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(h, _)| (*h, 1))
        .collect();
    recut(
        map,
        &namespaces,
        &Rule {
            min_gpujobs: 0,
            ..rule.clone()
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::fnv1a64;

    fn loads_of(names: impl IntoIterator<Item = String>, each: u64) -> Vec<(u64, u64)> {
        names
            .into_iter()
            .map(|n| (fnv1a64(n.as_bytes()), each))
            .collect()
    }

    fn teams() -> Vec<(u64, u64)> {
        loads_of((b'a'..=b'z').map(|c| format!("team-{}", c as char)), 5)
    }

    #[test]
    fn namespaces_named_alike_are_re_cut_to_within_the_skew_and_not_again() {
        let even = ShardMap::even(6);
        let loads = teams();
        let before = per_shard(&even, &loads);
        assert_eq!(before.iter().filter(|n| **n > 0).count(), 1, "{before:?}");
        let next = recut(&even, &loads, &Rule::default()).expect("one shard holds all");
        let after = per_shard(&next, &loads);
        assert!(skew(&after) <= 1.25, "{after:?}");
        assert_eq!(after.iter().sum::<u64>(), 130);
        // Balanced: the same loads never move it again (no flapping).
        assert_eq!(recut(&next, &loads, &Rule::default()), None);
    }

    #[test]
    fn no_re_cut_below_the_skew_or_the_gain_or_with_too_few_gpujobs() {
        let even = ShardMap::even(6);
        assert_eq!(
            recut(&even, &teams()[..3], &Rule::default()),
            None,
            "15 GpuJobs"
        );
        // Random-looking names spread evenly: under the skew.
        let spread = loads_of(
            (0..600).map(|i| format!("ns-{:x}", fnv1a64(&[i as u8, (i >> 8) as u8]))),
            1,
        );
        assert!(skew(&per_shard(&even, &spread)) <= 1.25);
        assert_eq!(recut(&even, &spread, &Rule::default()), None);
        // One namespace with everything: no cut can help, so none is made.
        let one = vec![(fnv1a64(b"team-a"), 500)];
        assert_eq!(recut(&even, &one, &Rule::default()), None);
        assert_eq!(recut(&ShardMap::even(1), &teams(), &Rule::default()), None);
    }

    #[test]
    fn a_first_cut_in_a_burst_balances_the_namespaces_whatever_their_counts_say() {
        let even = ShardMap::even(6);
        // Counts stated at different moments: uneven, though the namespaces fill alike.
        let mut loads = teams();
        for (i, l) in loads.iter_mut().enumerate() {
            l.1 = 1 + i as u64 % 3;
        }
        let cut = first_cut(&even, &loads, &Rule::default()).expect("one shard holds all");
        let ones: Vec<(u64, u64)> = loads.iter().map(|(h, _)| (*h, 1)).collect();
        assert!(skew(&per_shard(&cut, &ones)) <= 1.25);
        assert_eq!(
            first_cut(&even, &loads[..5], &Rule::default()),
            None,
            "too few"
        );
    }

    #[test]
    fn only_the_shards_whose_range_changed_move() {
        let a = ShardMap::parse("0x10,0x20,0x30", 4).unwrap();
        let b = ShardMap::parse("0x10,0x28,0x30", 4).unwrap();
        assert_eq!(moved(&a, &b), BTreeSet::from([1, 2]));
        assert_eq!(moved(&a, &a), BTreeSet::new());
        assert_eq!(moved(&a, &ShardMap::even(3)), BTreeSet::from([0, 1, 2, 3]));
    }

    #[test]
    fn a_shard_is_free_to_take_only_where_no_live_claim_reaches() {
        let a = ShardMap::parse("0x10,0x20,0x30", 4).unwrap();
        let b = ShardMap::parse("0x10,0x28,0x30", 4).unwrap();
        // Shard 1 under b reaches into shard 2's old range: not while 2 is claimed as before.
        let old_two = a.range(2);
        assert!(!free_to_take(&b.range(1), &[old_two]));
        assert!(free_to_take(&b.range(1), &[b.range(2), a.range(0)]));
        // Touching ends do not overlap (end is exclusive).
        assert!(!overlaps(&a.range(0), &a.range(1)));
        assert!(overlaps(&a.range(3), &EVERYTHING));
        assert_eq!(
            parse_range("0x0000000000000010-0x0000000000000020"),
            Some(a.range(1))
        );
        assert_eq!(parse_range("junk"), None);
    }

    #[test]
    fn ranges_and_loads_read_back_as_written() {
        let map = ShardMap::parse("0x10,0x20", 3).unwrap();
        for s in 0..3 {
            let r = map.range(s);
            assert_eq!(parse_range(&format_range(&r)), Some(r));
        }
        assert_eq!(parse_range("0x20-0x10"), None);
        assert_eq!(parse_range("0x0-0x10000000000000001"), None);
        let counts = BTreeMap::from([(1u64, 3u64), (0xffu64, 4)]);
        assert_eq!(format_load(&counts), "1:3,ff:4");
        assert_eq!(parse_load("1:3,ff:4"), Some(vec![(1, 3), (0xff, 4)]));
        assert_eq!(parse_load(""), Some(vec![]));
        assert_eq!(parse_load("1:x"), None);
        // Past the cap, neighbours are summed and nothing is lost.
        let many: BTreeMap<u64, u64> = (0..5000u64).map(|i| (i * 7, 1)).collect();
        let text = format_load(&many);
        let back = parse_load(&text).unwrap();
        assert!(back.len() <= MAX_LOAD_ENTRIES, "{}", back.len());
        assert_eq!(back.iter().map(|(_, n)| n).sum::<u64>(), 5000);
        assert_eq!(back[0].0, 0);
    }
}
