//! The Leases of one operator (its `--lease-name`): their names and labels, and what a
//! list of them says about how other live replicas split namespaces into shards.

use std::collections::{BTreeMap, BTreeSet};

use std::sync::Arc;
use std::time::Instant;

use gpujob_core::lease::{Observed, observed, update};
use k8s_openapi::api::coordination::v1::Lease;

use crate::shard::{ShardMap, UNLABELLED_MAP};

/// Label on every Lease of one operator: its `--lease-name`.
pub const LABEL_GROUP: &str = "gpujob.dev/lease-group";
/// Label on every Lease of one operator: `shard` or `member`, or `single` on the one
/// Lease of `--shards 1`.
pub const LABEL_ROLE: &str = "gpujob.dev/lease-role";
/// On every Lease of the group: the `--shards` of the replica that wrote it. Lease names
/// do not carry it, so without it replicas with different counts would split namespaces
/// differently under the same names, and one namespace would have two owners.
pub const LABEL_SHARDS: &str = "gpujob.dev/shards";
/// On every Lease of the group: how the replica that wrote it maps namespaces to shards
/// ([`ShardMap::name`]). A Lease with a count and no map was written before the label
/// existed, by a replica that split by [`UNLABELLED_MAP`].
pub const LABEL_SHARD_MAP: &str = "gpujob.dev/shard-map";

/// Where the Leases live, and the shards they guard.
#[derive(Debug, Clone)]
pub struct ShardLeases {
    pub lease_name: String,
    pub namespace: String,
    pub map: Arc<ShardMap>,
}

impl ShardLeases {
    pub fn shards(&self) -> u32 {
        self.map.shards()
    }

    /// Whether this is `--shards 1`: one shard, guarded by the Lease users know by the
    /// lease name itself, and no member heartbeat (`modes.rs` says why).
    pub fn single(&self) -> bool {
        self.shards() <= 1
    }

    /// The Lease guarding shard `i`: `<lease-name>-shard-<i>`, or `<lease-name>` itself
    /// with one shard (so replicas of a release before one lease loop share it).
    pub fn shard(&self, i: u32) -> String {
        if self.single() {
            self.lease_name.clone()
        } else {
            format!("{}-shard-{i}", self.lease_name)
        }
    }

    pub fn member(&self, identity: &str) -> String {
        format!("{}-member-{identity}", self.lease_name)
    }

    /// The labels of a shard Lease (role `single` with one shard: replicas of earlier
    /// releases take a live `shard` Lease for a sharded replica's).
    pub fn shard_labels(&self) -> BTreeMap<String, String> {
        self.labels(if self.single() { "single" } else { "shard" })
    }

    pub fn member_labels(&self) -> BTreeMap<String, String> {
        self.labels("member")
    }

    fn labels(&self, role: &str) -> BTreeMap<String, String> {
        BTreeMap::from([
            (LABEL_GROUP.to_owned(), self.lease_name.clone()),
            (LABEL_ROLE.to_owned(), role.to_owned()),
            (LABEL_SHARDS.to_owned(), self.shards().to_string()),
            (LABEL_SHARD_MAP.to_owned(), self.map.name()),
        ])
    }
}

/// A live replica that splits namespaces differently: by its member Lease, another
/// `--shards` or another map than `ours`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtherSplit {
    pub replica: String,
    pub shards: u32,
    pub map: String,
}

/// How the writer of a Lease with role `role` splits namespaces, if it splits them
/// otherwise than `ours` does: its count and map. Leases written before the count label
/// existed say nothing; one with a count and no map was written by a release that split
/// by [`UNLABELLED_MAP`].
fn other_split_of<'a>(lease: &'a Lease, role: &str, ours: &ShardMap) -> Option<(u32, &'a str)> {
    let labels = lease.metadata.labels.as_ref()?;
    if labels.get(LABEL_ROLE).map(String::as_str) != Some(role) {
        return None;
    }
    let shards: u32 = labels.get(LABEL_SHARDS)?.parse().ok()?;
    let map = labels
        .get(LABEL_SHARD_MAP)
        .map_or(UNLABELLED_MAP, String::as_str);
    (shards != ours.shards() || map != ours.name()).then_some((shards, map))
}

/// The first live member whose split differs from this replica's. Member Leases written
/// before the count label existed say nothing and are skipped; one with a count and no
/// map was written by a release that split by [`UNLABELLED_MAP`].
pub fn other_split(
    leases: &[Lease],
    ours: &ShardMap,
    live: &BTreeSet<String>,
) -> Option<OtherSplit> {
    leases.iter().find_map(|lease| {
        let (shards, map) = other_split_of(lease, "member", ours)?;
        let holder = lease.spec.as_ref()?.holder_identity.as_deref()?;
        live.contains(holder).then(|| OtherSplit {
            replica: holder.to_owned(),
            shards,
            map: map.to_owned(),
        })
    })
}

/// The first shard Lease held by a live replica other than `me` (its record changed
/// within its lease duration on this replica's clock, `seen` being updated from this
/// list) whose labels say it splits namespaces otherwise than `ours`: a replica whose
/// member heartbeat is stale or missing but which renews shard Leases still writes.
pub fn other_split_held(
    leases: &[Lease],
    ours: &ShardMap,
    seen: &mut BTreeMap<String, Observed>,
    me: &str,
    now: Instant,
) -> Option<OtherSplit> {
    let listed: BTreeSet<&str> = leases
        .iter()
        .filter_map(|l| l.metadata.name.as_deref())
        .collect();
    seen.retain(|name, _| listed.contains(name.as_str()));
    let mut found = None;
    for lease in leases {
        let labels = lease.metadata.labels.as_ref();
        if labels.and_then(|l| l.get(LABEL_ROLE)).map(String::as_str) != Some("shard") {
            continue;
        }
        let Some(name) = lease.metadata.name.clone() else {
            continue;
        };
        // Every shard Lease's expiry clock is kept, also those that split alike: a
        // label can change with a renewal (a replica restarted under its name).
        let record = seen.entry(name).or_insert_with(|| observed(lease, now));
        update(record, lease, now);
        if found.is_some() || !record.held_by_other(me, now) {
            continue;
        }
        if let Some((shards, map)) = other_split_of(lease, "shard", ours) {
            found = record.holder().map(|holder| OtherSplit {
                replica: holder.to_owned(),
                shards,
                map: map.to_owned(),
            });
        }
    }
    found
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::shard::SHARD_MAP;

    fn six() -> ShardMap {
        ShardMap::even(6)
    }

    fn member(holder: &str, shards: Option<&str>) -> Lease {
        member_mapped(holder, shards, Some(SHARD_MAP))
    }

    fn member_mapped(holder: &str, shards: Option<&str>, map: Option<&str>) -> Lease {
        let mut labels = BTreeMap::from([(LABEL_ROLE.to_owned(), "member".to_owned())]);
        if let Some(n) = shards {
            labels.insert(LABEL_SHARDS.to_owned(), n.to_owned());
        }
        if let Some(m) = map {
            labels.insert(LABEL_SHARD_MAP.to_owned(), m.to_owned());
        }
        let mut lease = Lease::default();
        lease.metadata.labels = Some(labels);
        lease.spec = Some(k8s_openapi::api::coordination::v1::LeaseSpec {
            holder_identity: Some(holder.to_owned()),
            ..Default::default()
        });
        lease
    }

    #[test]
    fn a_live_member_with_another_shard_count_is_a_conflict() {
        let live = BTreeSet::from(["a".to_owned(), "b".to_owned()]);
        let same = [member("a", Some("6")), member("b", Some("6"))];
        assert_eq!(other_split(&same, &six(), &live), None);
        let mixed = [member("a", Some("6")), member("b", Some("3"))];
        assert_eq!(
            other_split(&mixed, &six(), &live),
            Some(OtherSplit {
                replica: "b".to_owned(),
                shards: 3,
                map: SHARD_MAP.to_owned()
            })
        );
        // A member that is gone, or that predates the label, says nothing.
        let gone = [member("a", Some("6")), member("c", Some("3"))];
        assert_eq!(other_split(&gone, &six(), &live), None);
        let unlabelled = [member("b", None)];
        assert_eq!(other_split(&unlabelled, &six(), &live), None);
        // Shard Leases are not members.
        let mut shard = member("b", Some("3"));
        shard
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(LABEL_ROLE.to_owned(), "shard".to_owned());
        assert_eq!(other_split(&[shard], &six(), &live), None);
    }

    #[test]
    fn a_live_member_with_another_map_is_a_conflict() {
        let live = BTreeSet::from(["a".to_owned(), "b".to_owned()]);
        // Written before the map label, by a release that split by `mod N`: a conflict
        // with today's ranges, so an upgrade from it goes the way a change of N goes.
        let unlabelled = [member("a", Some("6")), member_mapped("b", Some("6"), None)];
        assert_eq!(
            other_split(&unlabelled, &six(), &live),
            Some(OtherSplit {
                replica: "b".to_owned(),
                shards: 6,
                map: UNLABELLED_MAP.to_owned()
            })
        );
        let previous = [
            member("a", Some("6")),
            member_mapped("b", Some("6"), Some("fnv1a64-mod")),
        ];
        assert!(other_split(&previous, &six(), &live).is_some());
        // The same count, cut elsewhere (`--shard-cuts`): another map.
        let cut = ShardMap::parse("0x1,0x2,0x3,0x4,0x5", 6).unwrap();
        let cuts = [
            member("a", Some("6")),
            member_mapped("b", Some("6"), Some(&cut.name())),
        ];
        assert_eq!(
            other_split(&cuts, &six(), &live).map(|o| o.replica),
            Some("b".to_owned())
        );
        assert_eq!(
            other_split(&cuts, &cut, &live).map(|o| o.replica),
            Some("a".to_owned())
        );
        // The same count under another map (a later release's, say).
        let other = [
            member("a", Some("6")),
            member_mapped("b", Some("6"), Some("ranges")),
        ];
        assert_eq!(
            other_split(&other, &six(), &live),
            Some(OtherSplit {
                replica: "b".to_owned(),
                shards: 6,
                map: "ranges".to_owned()
            })
        );
    }

    #[test]
    fn one_shard_is_the_lease_name_itself_and_says_it_is_single() {
        let leases = |shards| ShardLeases {
            lease_name: "op".to_owned(),
            namespace: "ns".to_owned(),
            map: Arc::new(ShardMap::even(shards)),
        };
        assert_eq!(leases(1).shard(0), "op");
        assert_eq!(leases(6).shard(0), "op-shard-0");
        assert_eq!(leases(6).shard(5), "op-shard-5");
        assert_eq!(leases(1).shard_labels()[LABEL_ROLE], "single");
        assert_eq!(leases(6).shard_labels()[LABEL_ROLE], "shard");
        assert_eq!(leases(1).shard_labels()[LABEL_SHARDS], "1");
        assert_eq!(leases(6).member_labels()[LABEL_ROLE], "member");
    }
}
