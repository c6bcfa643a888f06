//! Which shard a GpuJob belongs to: `fnv1a64(namespace bytes) mod shards` (FNV-1a 64,
//! offset basis 0xcbf29ce484222325, prime 0x100000001b3, unsigned modulo). Namespace,
//! not name: a team's GpuJobs stay together, and the shard never changes for an
//! object's lifetime. Other tools can compute the same function.

use crate::hash::fnv1a64;

/// The name of this map, as every shard and member Lease states it (label
/// `gpujob.dev/shard-map`). Replicas that split namespaces by different maps, like
/// replicas with different counts, never hold shards at the same time, so a later
/// release may change the map safely. Leases written before the label existed used
/// this same map.
pub const SHARD_MAP: &str = "fnv1a64-mod";

/// The shard of GpuJobs in `namespace`, out of `shards` (at least 1).
pub fn shard_of(namespace: &str, shards: u32) -> u32 {
    let n = u64::from(shards.max(1));
    // The remainder is below `shards`, so it fits.
    u32::try_from(fnv1a64(namespace.as_bytes()) % n).unwrap_or(0)
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
    }

    #[test]
    fn reference_vectors() {
        // Computed independently (Python: h = 0xcbf29ce484222325; for b in ns.encode():
        // h = ((h ^ b) * 0x100000001b3) % 2**64; shard = h % n).
        assert_eq!(fnv1a64(b"default"), 0xebad_a516_8620_c5fe);
        assert_eq!(fnv1a64(b"team-a"), 0xde90_a371_7d12_52d6);
        assert_eq!(shard_of("default", 6), 0);
        assert_eq!(shard_of("default", 8), 6);
        assert_eq!(shard_of("team-a", 6), 4);
        assert_eq!(shard_of("team-a", 8), 6);
    }
}
