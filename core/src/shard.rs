//! Which shard a GpuJob belongs to: shard `i` of `N` is the contiguous range
//! `[floor(i·2^64/N), floor((i+1)·2^64/N))` of `fnv1a64(namespace bytes)` (FNV-1a 64,
//! offset basis 0xcbf29ce484222325, prime 0x100000001b3). Namespace, not name: a team's
//! GpuJobs stay together, and the shard never changes for an object's lifetime.
//! Contiguous ranges, not `hash mod N`, because an API server can select them: the
//! sharded list and watch (KEP-5866) sends only objects whose FNV-1a 64 hash of a field
//! lies in `[start, end)` ([`ShardMap::selector`]). Other tools can compute the same function.

use crate::hash::fnv1a64;

/// The name of this map, as every shard and member Lease states it (label
/// `gpujob.dev/shard-map`). Replicas that split namespaces by different maps, like
/// replicas with different counts, never hold shards at the same time, so changing the
/// map is as safe as changing the count.
pub const SHARD_MAP: &str = "fnv1a64-range";

/// The map of Leases that state none: they were written before the label existed, by
/// releases that split by `fnv1a64(namespace) mod N`.
pub const UNLABELLED_MAP: &str = "fnv1a64-mod";

/// The field the ranges hash, in the API server's shard selector syntax.
pub const SELECTOR_FIELD: &str = "object.metadata.namespace";

/// The hashes of one shard: `start` inclusive, `end` exclusive. `end` is a `u128`
/// because the last shard ends at 2^64.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct HashRange {
    pub start: u64,
    pub end: u128,
}

impl HashRange {
    pub fn contains(&self, hash: u64) -> bool {
        hash >= self.start && u128::from(hash) < self.end
    }
}

/// Shard `shard`'s range out of `shards` (at least 1).
pub fn range_of(shard: u32, shards: u32) -> HashRange {
    let n = u128::from(shards.max(1));
    let bound = |i: u128| (i << 64) / n;
    let i = u128::from(shard).min(n - 1);
    HashRange {
        // Below 2^64 for every i < n.
        start: u64::try_from(bound(i)).unwrap_or(u64::MAX),
        end: bound(i + 1),
    }
}

/// The shard of a namespace's hash out of `shards`: the one `i` with
/// `floor(i·2^64/N) <= hash < floor((i+1)·2^64/N)`, that is, the largest `i` with
/// `i·2^64 < (hash+1)·N`.
pub fn shard_of_hash(hash: u64, shards: u32) -> u32 {
    let n = u128::from(shards.max(1));
    let i = ((u128::from(hash) + 1) * n - 1) >> 64;
    // i < n <= u32::MAX.
    u32::try_from(i).unwrap_or(0)
}

/// The shard of GpuJobs in `namespace`, out of `shards` (at least 1).
pub fn shard_of(namespace: &str, shards: u32) -> u32 {
    shard_of_hash(fnv1a64(namespace.as_bytes()), shards)
}

/// Where each shard's range starts. The even map cuts the hash space into equal ranges;
/// other cuts balance namespaces whose hashes crowd together. FNV-1a's high bits change
/// little with a name's last characters (`team-a` … `team-z` all fall in the last sixth),
/// and the API server hashes the raw name, so equal ranges can leave most namespaces in
/// one shard: [`ShardMap::balanced`] cuts at the namespaces actually there.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ShardMap {
    /// `starts[0] == 0`, strictly increasing; shard i is `[starts[i], starts[i+1])`, the
    /// last one ending at 2^64.
    starts: Vec<u64>,
}

/// Cuts that do not make a map.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CutsError {
    #[error("{0:?} is not a 0x-prefixed hexadecimal 64-bit number")]
    NotHex(String),
    #[error("{cuts} cuts make {} shards, not {shards}", cuts + 1)]
    Count { cuts: usize, shards: u32 },
    #[error("cuts must be above 0 and strictly increasing; {0:#018x} is not")]
    Order(u64),
}

impl ShardMap {
    /// `shards` equal ranges (at least 1).
    pub fn even(shards: u32) -> ShardMap {
        let n = shards.max(1);
        ShardMap {
            starts: (0..n).map(|i| range_of(i, n).start).collect(),
        }
    }

    /// The map whose shards 1.. start at `cuts` (strictly increasing, above 0).
    pub fn with_cuts(cuts: &[u64]) -> Result<ShardMap, CutsError> {
        let mut starts = Vec::with_capacity(cuts.len() + 1);
        starts.push(0);
        for c in cuts {
            if starts.last().is_some_and(|last| *c <= *last) {
                return Err(CutsError::Order(*c));
            }
            starts.push(*c);
        }
        Ok(ShardMap { starts })
    }

    /// `0x…,0x…` (what [`ShardMap::cuts_text`] writes) for `shards` shards; empty for the
    /// even map.
    pub fn parse(cuts: &str, shards: u32) -> Result<ShardMap, CutsError> {
        let cuts = cuts.trim();
        if cuts.is_empty() {
            return Ok(ShardMap::even(shards));
        }
        let parsed = cuts
            .split(',')
            .map(|c| {
                let c = c.trim();
                c.strip_prefix("0x")
                    .and_then(|h| u64::from_str_radix(h, 16).ok())
                    .ok_or_else(|| CutsError::NotHex(c.to_owned()))
            })
            .collect::<Result<Vec<u64>, CutsError>>()?;
        if parsed.len() + 1 != shards.max(1) as usize {
            return Err(CutsError::Count {
                cuts: parsed.len(),
                shards,
            });
        }
        ShardMap::with_cuts(&parsed)
    }

    /// Where shards 1.. start, as [`ShardMap::parse`] reads them.
    pub fn cuts_text(&self) -> String {
        let cuts: Vec<String> = self.starts[1..]
            .iter()
            .map(|c| format!("{c:#018x}"))
            .collect();
        cuts.join(",")
    }

    pub fn shards(&self) -> u32 {
        u32::try_from(self.starts.len()).unwrap_or(u32::MAX)
    }

    /// The map's name as Leases state it: [`SHARD_MAP`] for the even map, with a digest
    /// of the cuts otherwise, so replicas with other cuts hold nothing beside each other.
    pub fn name(&self) -> String {
        if *self == ShardMap::even(self.shards()) {
            SHARD_MAP.to_owned()
        } else {
            format!("{SHARD_MAP}-{:016x}", fnv1a64(self.cuts_text().as_bytes()))
        }
    }

    pub fn shard_of_hash(&self, hash: u64) -> u32 {
        let i = self
            .starts
            .partition_point(|s| *s <= hash)
            .saturating_sub(1);
        u32::try_from(i).unwrap_or(0)
    }

    pub fn shard_of(&self, namespace: &str) -> u32 {
        self.shard_of_hash(fnv1a64(namespace.as_bytes()))
    }

    /// Shard `shard`'s range (the last one's for a shard past the end).
    pub fn range(&self, shard: u32) -> HashRange {
        let i = (shard as usize).min(self.starts.len() - 1);
        HashRange {
            start: self.starts[i],
            end: self
                .starts
                .get(i + 1)
                .map_or(1u128 << 64, |s| u128::from(*s)),
        }
    }

    /// The API server's shard selector for the namespaces of `held`: one
    /// `shardRange(object.metadata.namespace, '0x…', '0x…')` per run of adjacent shards,
    /// joined by ` || `, with bounds as 16 lowercase hex digits (17 for 2^64), the form
    /// the server echoes back. `None` when `held` names no shard of this map.
    pub fn selector(&self, held: impl IntoIterator<Item = u32>) -> Option<String> {
        let mut held: Vec<u32> = held.into_iter().filter(|s| *s < self.shards()).collect();
        held.sort_unstable();
        held.dedup();
        let mut runs: Vec<HashRange> = Vec::new();
        for s in held {
            let r = self.range(s);
            match runs.last_mut() {
                Some(last) if last.end == u128::from(r.start) => last.end = r.end,
                _ => runs.push(r),
            }
        }
        let parts: Vec<String> = runs
            .iter()
            .map(|r| {
                format!(
                    "shardRange({SELECTOR_FIELD}, '0x{:016x}', '0x{:016x}')",
                    r.start, r.end
                )
            })
            .collect();
        (!parts.is_empty()).then(|| parts.join(" || "))
    }

    /// Cuts that give each of `shards` about the same weight: `weights` is each
    /// namespace's hash with its weight (its GpuJobs, say). A cut falls halfway between
    /// the last hash of one shard and the first of the next, so a namespace added later
    /// goes to the nearer one. Where too few hashes are known, the remaining space is cut
    /// evenly.
    pub fn balanced(weights: impl IntoIterator<Item = (u64, u64)>, shards: u32) -> ShardMap {
        let n = shards.max(1);
        let mut by_hash: Vec<(u64, u64)> = weights.into_iter().collect();
        by_hash.sort_unstable();
        by_hash.dedup_by(|b, a| {
            if a.0 == b.0 {
                a.1 += b.1;
                true
            } else {
                false
            }
        });
        let weight = |i: usize| u128::from(by_hash[i].1.max(1));
        let total: u128 = (0..by_hash.len()).map(weight).sum();
        // The weight before each namespace, in hash order.
        let mut before = Vec::with_capacity(by_hash.len() + 1);
        let mut sum = 0u128;
        for i in 0..by_hash.len() {
            before.push(sum);
            sum += weight(i);
        }
        before.push(sum);
        let mut cuts: Vec<u64> = Vec::with_capacity(n as usize - 1);
        for k in 1..u128::from(n) {
            // The k-th n-tile, scaled by n to stay whole.
            let target = k * total;
            let Some(i) = (0..by_hash.len()).find(|i| before[i + 1] * u128::from(n) >= target)
            else {
                break;
            };
            // Cut before namespace i or after it, whichever lands nearer the target.
            let after = before[i + 1] * u128::from(n) - target;
            let short = target.saturating_sub(before[i] * u128::from(n));
            let at = if i > 0 && short < after { i } else { i + 1 };
            if at == 0 || at >= by_hash.len() {
                continue;
            }
            let (lo, hi) = (by_hash[at - 1].0, by_hash[at].0);
            let cut = lo + (hi - lo).div_ceil(2);
            if cuts.last().is_none_or(|last| cut > *last) {
                cuts.push(cut);
            }
        }
        // Too few distinct hashes for n shards: split the widest ranges left evenly.
        while cuts.len() + 1 < n as usize {
            let mut starts = vec![0u64];
            starts.extend(&cuts);
            let widest = (0..starts.len())
                .max_by_key(|i| {
                    starts.get(i + 1).map_or(1u128 << 64, |e| u128::from(*e))
                        - u128::from(starts[*i])
                })
                .unwrap_or(0);
            let end = starts
                .get(widest + 1)
                .map_or(1u128 << 64, |e| u128::from(*e));
            let mid = (u128::from(starts[widest]) + end) / 2;
            let Ok(mid) = u64::try_from(mid) else { break };
            if mid == starts[widest] {
                break;
            }
            cuts.push(mid);
            cuts.sort_unstable();
        }
        ShardMap::with_cuts(&cuts).unwrap_or_else(|_| ShardMap::even(n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_shard_holds_everything() {
        for ns in ["", "default", "team-a", "ml-research"] {
            assert_eq!(shard_of(ns, 1), 0);
            assert_eq!(shard_of(ns, 0), 0, "0 shards counts as 1");
        }
        assert_eq!(
            range_of(0, 1),
            HashRange {
                start: 0,
                end: 1 << 64
            }
        );
    }

    #[test]
    fn reference_vectors() {
        // Computed independently (Python: h = 0xcbf29ce484222325; for b in ns.encode():
        // h = ((h ^ b) * 0x100000001b3) % 2**64; then the i with i*2**64//n <= h <
        // (i+1)*2**64//n).
        assert_eq!(fnv1a64(b"default"), 0xebad_a516_8620_c5fe);
        assert_eq!(fnv1a64(b"team-a"), 0xde90_a371_7d12_52d6);
        assert_eq!(shard_of("default", 6), 5);
        assert_eq!(shard_of("default", 8), 7);
        assert_eq!(shard_of("team-a", 6), 5);
        assert_eq!(shard_of("team-a", 8), 6);
        assert_eq!(shard_of("team-a", 10), 8);
        assert_eq!(shard_of("kube-system", 3), 2);
        assert_eq!(fnv1a64(b"kube-system"), 0xdf65_c7bc_1d82_b35e);
        // 6 shards: exact integer bounds (2^64/6 is not whole).
        assert_eq!(range_of(1, 6).start, 0x2aaa_aaaa_aaaa_aaaa);
        assert_eq!(range_of(5, 6).start, 0xd555_5555_5555_5555);
        assert_eq!(range_of(5, 6).end, 1 << 64);
    }

    #[test]
    fn ranges_tile_the_hash_space_and_every_hash_lands_in_its_own() {
        for n in 1..=70u32 {
            let mut next: u128 = 0;
            for i in 0..n {
                let r = range_of(i, n);
                assert_eq!(
                    u128::from(r.start),
                    next,
                    "{i} of {n} starts where {} ended",
                    i.wrapping_sub(1)
                );
                assert!(u128::from(r.start) < r.end);
                next = r.end;
                // The edges, each side.
                for h in [
                    r.start,
                    r.start.saturating_add(1),
                    (r.end - 1) as u64,
                    ((r.end - 1) as u64).saturating_sub(1),
                ] {
                    assert!(r.contains(h));
                    assert_eq!(shard_of_hash(h, n), i, "hash {h:#x}, {n} shards");
                }
            }
            assert_eq!(next, 1 << 64, "{n} shards end at 2^64");
        }
        assert_eq!(shard_of_hash(u64::MAX, u32::MAX), u32::MAX - 1);
        assert_eq!(shard_of_hash(0, u32::MAX), 0);
    }

    #[test]
    fn selectors_join_adjacent_shards_and_name_the_api_servers_bounds() {
        assert_eq!(ShardMap::even(4).selector([]), None);
        assert_eq!(
            ShardMap::even(4).selector([1]).as_deref(),
            Some(
                "shardRange(object.metadata.namespace, '0x4000000000000000', '0x8000000000000000')"
            )
        );
        // As the API server's own documentation writes the 4-shard split's last range.
        assert_eq!(
            ShardMap::even(4).selector([3]).as_deref(),
            Some(
                "shardRange(object.metadata.namespace, '0xc000000000000000', '0x10000000000000000')"
            )
        );
        assert_eq!(
            ShardMap::even(4).selector([3, 0, 1, 1]).as_deref(),
            Some(
                "shardRange(object.metadata.namespace, '0x0000000000000000', '0x8000000000000000') || shardRange(object.metadata.namespace, '0xc000000000000000', '0x10000000000000000')"
            )
        );
        assert_eq!(
            ShardMap::even(4).selector(0..4).as_deref(),
            Some(
                "shardRange(object.metadata.namespace, '0x0000000000000000', '0x10000000000000000')"
            )
        );
        assert_eq!(ShardMap::even(4).selector([9]), None, "no such shard");
    }

    #[test]
    fn the_even_map_is_the_free_functions_and_is_named_plainly() {
        for n in [1u32, 2, 3, 6, 8, 10] {
            let map = ShardMap::even(n);
            assert_eq!(map.shards(), n);
            assert_eq!(map.name(), SHARD_MAP);
            for ns in ["default", "team-a", "kube-system", "ns-17"] {
                assert_eq!(map.shard_of(ns), shard_of(ns, n));
            }
            for i in 0..n {
                assert_eq!(map.range(i), range_of(i, n));
            }
            assert_eq!(ShardMap::parse(&map.cuts_text(), n), Ok(map.clone()));
            assert_eq!(ShardMap::parse("", n), Ok(map));
        }
    }

    #[test]
    fn cuts_are_read_checked_and_named_by_a_digest() {
        let map = ShardMap::parse("0x4000000000000000, 0xf000000000000000", 3).unwrap();
        assert_eq!(map.shard_of_hash(0), 0);
        assert_eq!(map.shard_of_hash(0x3fff_ffff_ffff_ffff), 0);
        assert_eq!(map.shard_of_hash(0x4000_0000_0000_0000), 1);
        assert_eq!(map.shard_of_hash(0xf000_0000_0000_0000), 2);
        assert_eq!(map.shard_of_hash(u64::MAX), 2);
        assert_eq!(map.cuts_text(), "0x4000000000000000,0xf000000000000000");
        assert!(map.name().starts_with("fnv1a64-range-"), "{}", map.name());
        assert!(map.name().len() <= 63, "a label value");
        let other = ShardMap::parse("0x4000000000000000,0xf000000000000001", 3).unwrap();
        assert_ne!(map.name(), other.name());
        assert_eq!(
            map.selector([1, 2]).as_deref(),
            Some(
                "shardRange(object.metadata.namespace, '0x4000000000000000', '0x10000000000000000')"
            )
        );
        assert_eq!(
            ShardMap::parse("0x10", 3),
            Err(CutsError::Count { cuts: 1, shards: 3 })
        );
        assert_eq!(ShardMap::parse("0x20,0x10", 3), Err(CutsError::Order(0x10)));
        assert_eq!(ShardMap::parse("0x0", 2), Err(CutsError::Order(0)));
        assert!(matches!(
            ShardMap::parse("12,0x10", 3),
            Err(CutsError::NotHex(_))
        ));
    }

    #[test]
    fn names_that_differ_at_the_end_crowd_into_one_even_range_and_balanced_cuts_split_them() {
        let names: Vec<String> = (b'a'..=b'z')
            .map(|c| format!("team-{}", char::from(c)))
            .collect();
        let even = ShardMap::even(6);
        let mut per_shard = [0usize; 6];
        for ns in &names {
            per_shard[even.shard_of(ns) as usize] += 1;
        }
        assert_eq!(
            per_shard,
            [0, 0, 0, 0, 0, 26],
            "FNV-1a's high bits barely move"
        );

        let map = ShardMap::balanced(names.iter().map(|ns| (fnv1a64(ns.as_bytes()), 1)), 6);
        assert_eq!(map.shards(), 6);
        let mut per_shard = [0usize; 6];
        for ns in &names {
            per_shard[map.shard_of(ns) as usize] += 1;
        }
        assert!(
            per_shard.iter().all(|n| (4..=5).contains(n)),
            "{per_shard:?}"
        );

        // Weighted: one namespace with as many GpuJobs as the other 25 together. Whatever
        // its place in hash order, neither of two shards gets more than 25 + 12 (a
        // namespace is never split; the cut goes on its nearer side).
        for heavy in [0, 5, 12, 25] {
            let weights: Vec<(u64, u64)> = names
                .iter()
                .enumerate()
                .map(|(i, ns)| (fnv1a64(ns.as_bytes()), if i == heavy { 25 } else { 1 }))
                .collect();
            let map = ShardMap::balanced(weights.iter().copied(), 2);
            let mut load = [0u64; 2];
            for (h, w) in &weights {
                load[map.shard_of_hash(*h) as usize] += w;
            }
            assert!(load.iter().all(|l| *l <= 37), "heavy {heavy}: {load:?}");
        }
    }

    #[test]
    fn balanced_cuts_with_too_few_namespaces_still_make_every_shard() {
        for n in [1u32, 2, 6, 10] {
            let map = ShardMap::balanced([], n);
            assert_eq!(map.shards(), n);
            let map = ShardMap::balanced([(fnv1a64(b"only"), 3)], n);
            assert_eq!(map.shards(), n);
            let map = ShardMap::balanced([(5, 1), (6, 1)], n);
            assert_eq!(map.shards(), n);
            if n > 1 {
                assert_ne!(map.shard_of_hash(5), map.shard_of_hash(6));
            }
        }
    }
}
