//! Replicas that split namespaces differently never write one namespace both, so a
//! rolling update that changes `--shards` (or the shard map, in a later release) never
//! has two writers. Every replica runs the same lease loop (`coordinator.rs`); what
//! differs is which Leases it reads after writing its own.
//!
//! **Between two counts N, M > 1 (or two maps).** Shard i of N and shard i of M share the
//! Lease name `<lease-name>-shard-<i>` but not its namespaces. Each replica renews its
//! member Lease (labelled with its count and map), then lists the group, and takes a
//! shard only in a look whose heartbeat went through and whose list shows no live member
//! that splits differently; when it sees one, it gives up every shard it holds. If one
//! replica's list missed the other's renewal, that renewal came after the list, so the
//! other's list sees the first replica's member: at least one side holds nothing. Both
//! hold nothing until the replicas of one split are gone.
//!
//! **Between `--shards 1` and N > 1.** The one shard is the Lease `<lease-name>` itself,
//! a different object from every shard Lease of N, and the sharded side wins, since a
//! count is rolled out from 1 to N far more often than back:
//!
//! - a sharded replica renews its member Lease, then reads `<lease-name>`, and takes a
//!   shard only if both happened in the same look and `<lease-name>` is not held by a
//!   live replica; while it is, the sharded replica gives up every shard it holds;
//! - a `--shards 1` replica lists the group before it campaigns and takes nothing while
//!   a member or shard Lease is held by a live replica; right after acquiring
//!   `<lease-name>` it lists again, and hands the Lease back at once, before writing
//!   anything, if one is (or if the list fails).
//!
//! The API server orders the requests: if the single replica's second list did not see
//! the member renewal, the renewal came after that list, so after the acquire, and the
//! sharded replica's read sees `<lease-name>` held. At least one side backs off. A
//! `--shards 1` replica writes no member Lease: the sharded side learns of it from
//! `<lease-name>` alone, sharded replicas of earlier releases would read a member with
//! count 1 as a conflict and hold nothing, and it saves a write per retry period.
//!
//! "Live" follows the usual Lease rule on this replica's own clock: a record held by
//! someone else that changed less than its lease duration ago (a record seen for the
//! first time counts as just changed).

use std::collections::BTreeMap;

use std::time::Instant;

use gpujob_core::lease::{Observed, observed, update};
use k8s_openapi::api::coordination::v1::Lease;

use super::group::{LABEL_ROLE, LABEL_SHARDS};

/// A live sharded replica, as a `--shards 1` replica sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardedPeer {
    /// Its identity (the holder of its member or shard Lease).
    pub identity: String,
    /// Its `--shards`, when its Lease says (Leases written before the label do not).
    pub shards: Option<u32>,
}

/// The first member or shard Lease held by a live replica other than `me`, updating
/// `seen` (the expiry clock of a record restarts only when it changes).
pub fn live_sharded(
    leases: &[Lease],
    seen: &mut BTreeMap<String, Observed>,
    me: &str,
    now: Instant,
) -> Option<ShardedPeer> {
    let mut found = None;
    for lease in leases {
        let labels = lease.metadata.labels.as_ref();
        let role = labels.and_then(|l| l.get(LABEL_ROLE)).map(String::as_str);
        if !matches!(role, Some("member" | "shard")) {
            continue;
        }
        let Some(name) = lease.metadata.name.clone() else {
            continue;
        };
        let record = seen.entry(name).or_insert_with(|| observed(lease, now));
        update(record, lease, now);
        if found.is_none() && record.held_by_other(me, now) {
            found = record.holder().map(|identity| ShardedPeer {
                identity: identity.to_owned(),
                shards: labels
                    .and_then(|l| l.get(LABEL_SHARDS))
                    .and_then(|n| n.parse().ok()),
            });
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use std::time::Duration;

    fn lease(name: &str, role: &str, holder: Option<&str>, rv: &str) -> Lease {
        let mut l = Lease::default();
        l.metadata.name = Some(name.to_owned());
        l.metadata.resource_version = Some(rv.to_owned());
        l.metadata.labels = Some(BTreeMap::from([
            (LABEL_ROLE.to_owned(), role.to_owned()),
            (LABEL_SHARDS.to_owned(), "6".to_owned()),
        ]));
        l.spec = Some(LeaseSpec {
            holder_identity: holder.map(str::to_owned),
            lease_duration_seconds: Some(15),
            ..LeaseSpec::default()
        });
        l
    }

    #[test]
    fn a_live_member_or_shard_holder_is_a_sharded_peer() {
        let t0 = Instant::now();
        let mut seen = BTreeMap::new();
        let member = lease("op-member-b", "member", Some("b"), "1");
        let found = live_sharded(std::slice::from_ref(&member), &mut seen, "a", t0);
        assert_eq!(
            found,
            Some(ShardedPeer {
                identity: "b".to_owned(),
                shards: Some(6)
            })
        );
        // A shard Lease alone (its holder's member heartbeat failing) is enough.
        let mut seen = BTreeMap::new();
        let shard = lease("op-shard-3", "shard", Some("c"), "7");
        let found = live_sharded(&[shard], &mut seen, "a", t0);
        assert_eq!(found.map(|p| p.identity), Some("c".to_owned()));
    }

    #[test]
    fn released_own_and_unchanged_records_are_not_live() {
        let t0 = Instant::now();
        let mut seen = BTreeMap::new();
        let released = lease("op-member-b", "member", None, "1");
        let own = lease("op-member-a", "member", Some("a"), "1");
        let stale = lease("op-shard-0", "shard", Some("c"), "5");
        let other_role = {
            let mut l = lease("op", "member", Some("d"), "1");
            l.metadata.labels = None;
            l
        };
        let all = [released, own, stale.clone(), other_role];
        // First sight counts as a change: the stale shard holder is live for now.
        assert!(live_sharded(&all, &mut seen, "a", t0).is_some());
        // Unchanged for a lease duration: gone. Changed again: live again.
        let later = t0 + Duration::from_secs(15);
        assert_eq!(live_sharded(&all, &mut seen, "a", later), None);
        let renewed = lease("op-shard-0", "shard", Some("c"), "6");
        assert!(live_sharded(&[renewed], &mut seen, "a", later).is_some());
    }
}
