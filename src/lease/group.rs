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
/// On every Lease of the group: the settings of the replica that wrote it that change
/// what it does to a GpuJob ([`Split`]), `none` without any. A label of its own, not a
/// part of the map's: Leases written before it existed say nothing about settings, so
/// upgrading to this release is no change of split.
pub const LABEL_SETTINGS: &str = "gpujob.dev/settings";

/// The map name Leases state when the replicas keep the cuts (no `--shard-cuts`, more
/// than one shard): replicas of the same count keep one map between them, so moving a
/// cut is no change of split.
pub const KEPT_MAP: &str = "fnv1a64-range-kept";

/// How a replica splits namespaces and treats their GpuJobs: its count, its map, and
/// the settings that change what it does to a GpuJob, joined by `.` (`quota-http`: it
/// reserves GPU quota and keeps the quota finalizer; a replica without a provider would
/// strip it). Replicas of two splits never write one namespace both (`modes.rs`; checked by `tests/integration/rollout.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Split {
    pub shards: u32,
    /// The map's name, as [`LABEL_SHARD_MAP`] states it.
    pub map: String,
    /// As [`LABEL_SETTINGS`] states it.
    pub settings: String,
}

impl Split {
    /// The split of `map` with `settings` (none: `none`).
    pub fn new(map: &ShardMap, settings: &[String]) -> Split {
        Split {
            shards: map.shards(),
            map: map.name(),
            settings: if settings.is_empty() {
                "none".to_owned()
            } else {
                settings.join(".")
            },
        }
    }

    /// The map's name, followed by `+<settings>` unless there are none: how logs and the
    /// order of splits (`modes.rs`) name it.
    pub fn name(&self) -> String {
        name_of(&self.map, Some(&self.settings))
    }
}

/// A split's name from its map and settings (`None`: a Lease that states none).
fn name_of(map: &str, settings: Option<&str>) -> String {
    match settings {
        None | Some("none") => map.to_owned(),
        Some(s) => format!("{map}+{s}"),
    }
}

/// Where the Leases live, and the shards they guard.
#[derive(Debug, Clone)]
pub struct ShardLeases {
    pub lease_name: String,
    pub namespace: String,
    pub map: Arc<ShardMap>,
    /// What this replica does to a GpuJob beyond the map, as [`Split`] names it.
    pub settings: Vec<String>,
    /// The replicas keep the map (`gpujob_core::recut`): `map` is where it starts, and
    /// the map Lease ([`ShardLeases::map_lease`]) says where it is now. `false` with
    /// `--shard-cuts` (fixed) and with one shard.
    pub kept: bool,
}

impl ShardLeases {
    pub fn shards(&self) -> u32 {
        self.map.shards()
    }

    /// This replica's split, as its Leases state it: a kept map is named
    /// [`KEPT_MAP`] whatever its cuts (they move without a rollout).
    pub fn split(&self) -> Split {
        let mut split = Split::new(&self.map, &self.settings);
        if self.kept {
            KEPT_MAP.clone_into(&mut split.map);
        }
        split
    }

    /// The Lease that holds the kept map's cuts and version (never held by anyone).
    pub fn map_lease(&self) -> String {
        format!("{}-shard-map", self.lease_name)
    }

    /// The map Lease's labels: in the group (one list reads it with the others), role
    /// `shard-map` (not a member or a shard to any release).
    pub fn map_labels(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (LABEL_GROUP.to_owned(), self.lease_name.clone()),
            (LABEL_ROLE.to_owned(), "shard-map".to_owned()),
            (LABEL_SHARDS.to_owned(), self.shards().to_string()),
        ])
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
            (LABEL_SHARD_MAP.to_owned(), self.split().map),
            (LABEL_SETTINGS.to_owned(), self.split().settings),
        ])
    }
}

/// A live replica that splits namespaces differently: by its member Lease, another
/// `--shards` or another map than `ours`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtherSplit {
    pub replica: String,
    pub shards: u32,
    /// Its split's name ([`Split::name`]): the map, and the settings if any.
    pub map: String,
}

/// How the writer of a Lease with role `role` splits namespaces, if it splits them
/// otherwise than `ours` does: its count and its split's name ([`Split::name`]). Leases
/// written before the count label existed say nothing; one with a count and no map was
/// written by a release that split by [`UNLABELLED_MAP`]; one without settings says
/// nothing about them.
pub(super) fn other_split_of(lease: &Lease, role: &str, ours: &Split) -> Option<(u32, String)> {
    let labels = lease.metadata.labels.as_ref()?;
    if labels.get(LABEL_ROLE).map(String::as_str) != Some(role) {
        return None;
    }
    let shards: u32 = labels.get(LABEL_SHARDS)?.parse().ok()?;
    let map = labels
        .get(LABEL_SHARD_MAP)
        .map_or(UNLABELLED_MAP, String::as_str);
    let settings = labels.get(LABEL_SETTINGS).map(String::as_str);
    let differs =
        shards != ours.shards || map != ours.map || settings.is_some_and(|s| s != ours.settings);
    differs.then(|| (shards, name_of(map, settings)))
}

/// Who holds shard Leases, by split, as one list shows them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SplitsHeld {
    /// The first shard Lease held by a live replica other than `me` that splits
    /// namespaces otherwise than `ours`.
    pub other: Option<OtherSplit>,
    /// Whether a shard Lease is held by another live replica that splits alike.
    pub alike: bool,
}

/// Who holds the group's shard Leases (a live holder: its record changed within its
/// lease duration on this replica's clock, `seen` being updated from this list), by
/// whether they split namespaces like `ours`. Shard Leases are judged on their own, not
/// by their holders' heartbeats: a replica steps down when its heartbeat goes stale, but
/// one of a release before that did not, and a holder's shard Lease is live a little
/// longer than its heartbeat. Leases written before the count label say nothing.
pub fn splits_held(
    leases: &[Lease],
    ours: &Split,
    seen: &mut BTreeMap<String, Observed>,
    me: &str,
    now: Instant,
) -> SplitsHeld {
    let listed: BTreeSet<&str> = leases
        .iter()
        .filter_map(|l| l.metadata.name.as_deref())
        .collect();
    seen.retain(|name, _| listed.contains(name.as_str()));
    let mut held = SplitsHeld::default();
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
        // Records naming this replica (what it holds now, or held in a run with another
        // split under its name) are no other writer: the caller knows what it holds.
        if !record.held_by_other(me, now) {
            continue;
        }
        match other_split_of(lease, "shard", ours) {
            Some((shards, map)) => {
                if held.other.is_none() {
                    held.other = record.holder().map(|holder| OtherSplit {
                        replica: holder.to_owned(),
                        shards,
                        map,
                    });
                }
            }
            None => held.alike |= labels.is_some_and(|l| l.contains_key(LABEL_SHARDS)),
        }
    }
    held
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shard::SHARD_MAP;

    fn six() -> Split {
        Split::new(&ShardMap::even(6), &[])
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

    /// The split `lease`'s writer states, if it is not `ours`.
    fn differs(lease: &Lease, ours: &Split) -> Option<(u32, String)> {
        other_split_of(lease, "member", ours)
    }

    #[test]
    fn a_member_with_another_shard_count_splits_otherwise() {
        assert_eq!(differs(&member("b", Some("6")), &six()), None);
        assert_eq!(
            differs(&member("b", Some("3")), &six()),
            Some((3, SHARD_MAP.to_owned()))
        );
        // A member that predates the label says nothing.
        assert_eq!(differs(&member("b", None), &six()), None);
        // Shard Leases are not members.
        let mut shard = member("b", Some("3"));
        shard
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(LABEL_ROLE.to_owned(), "shard".to_owned());
        assert_eq!(differs(&shard, &six()), None);
    }

    #[test]
    fn a_member_with_another_map_splits_otherwise() {
        // Written before the map label, by a release that split by `mod N`: another
        // split than today's ranges, so an upgrade from it goes the way a change of N goes.
        assert_eq!(
            differs(&member_mapped("b", Some("6"), None), &six()),
            Some((6, UNLABELLED_MAP.to_owned()))
        );
        assert!(differs(&member_mapped("b", Some("6"), Some("fnv1a64-mod")), &six()).is_some());
        // The same count, cut elsewhere (`--shard-cuts`): another map, both ways.
        let cut = ShardMap::parse("0x1,0x2,0x3,0x4,0x5", 6).unwrap();
        let cuts = member_mapped("b", Some("6"), Some(&cut.name()));
        assert_eq!(differs(&cuts, &six()), Some((6, cut.name())));
        assert_eq!(
            differs(&member("a", Some("6")), &Split::new(&cut, &[])),
            Some((6, SHARD_MAP.to_owned()))
        );
        // The same count under another map (a later release's, say).
        assert_eq!(
            differs(&member_mapped("b", Some("6"), Some("ranges")), &six()),
            Some((6, "ranges".to_owned()))
        );
    }

    #[test]
    fn one_shard_is_the_lease_name_itself_and_says_it_is_single() {
        let leases = |shards| ShardLeases {
            lease_name: "op".to_owned(),
            namespace: "ns".to_owned(),
            map: Arc::new(ShardMap::even(shards)),
            settings: Vec::new(),
            kept: false,
        };
        assert_eq!(leases(1).shard(0), "op");
        assert_eq!(leases(6).shard(0), "op-shard-0");
        assert_eq!(leases(6).shard(5), "op-shard-5");
        assert_eq!(leases(1).shard_labels()[LABEL_ROLE], "single");
        assert_eq!(leases(6).shard_labels()[LABEL_ROLE], "shard");
        assert_eq!(leases(1).shard_labels()[LABEL_SHARDS], "1");
        assert_eq!(leases(6).member_labels()[LABEL_ROLE], "member");
    }

    #[test]
    fn a_setting_that_changes_what_a_replica_does_is_part_of_its_split() {
        let map = Arc::new(ShardMap::even(6));
        let leases = |settings: &[&str]| ShardLeases {
            kept: false,
            lease_name: "op".to_owned(),
            namespace: "ns".to_owned(),
            map: map.clone(),
            settings: settings.iter().map(|s| (*s).to_owned()).collect(),
        };
        let plain = leases(&[]);
        let quota = leases(&["quota-http"]);
        assert_eq!(plain.split().name(), SHARD_MAP);
        assert_eq!(quota.split().name(), format!("{SHARD_MAP}+quota-http"));
        assert_eq!(quota.member_labels()[LABEL_SHARD_MAP], SHARD_MAP);
        assert_eq!(quota.member_labels()[LABEL_SETTINGS], "quota-http");
        assert_eq!(plain.member_labels()[LABEL_SETTINGS], "none");
        let with = |settings: &str| {
            let mut l = member_mapped("b", Some("6"), Some(SHARD_MAP));
            l.metadata
                .labels
                .as_mut()
                .unwrap()
                .insert(LABEL_SETTINGS.to_owned(), settings.to_owned());
            l
        };
        // A member without the quota provider splits otherwise than one with it, both ways.
        assert_eq!(
            differs(&with("none"), &quota.split()),
            Some((6, SHARD_MAP.to_owned()))
        );
        assert_eq!(
            differs(&with("quota-http"), &plain.split()),
            Some((6, format!("{SHARD_MAP}+quota-http")))
        );
        assert_eq!(differs(&with("none"), &plain.split()), None);
        assert_eq!(differs(&with("quota-http"), &quota.split()), None);
        // Written before the settings label (an earlier release): says nothing about
        // settings, so an upgrade with a quota provider is no change of split.
        let earlier = member_mapped("b", Some("6"), Some(SHARD_MAP));
        assert_eq!(differs(&earlier, &quota.split()), None);
        assert_eq!(differs(&earlier, &plain.split()), None);
    }
}
