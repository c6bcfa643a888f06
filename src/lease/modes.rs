//! A `--shards 1` replica and sharded replicas of one lease group exclude each other, so
//! a rolling update that changes `--shards` between 1 and N never has two writers.
//!
//! The single Lease and the shard Leases are different objects, so neither side can take
//! "both" in one write. Instead each side writes first and reads the other second:
//!
//! - a sharded replica renews its member Lease, then reads the single Lease, and takes a
//!   shard only if both happened in the same look and the single Lease is not held by a
//!   live replica; while it is, the sharded replica gives up every shard it holds;
//! - a `--shards 1` replica acquires the single Lease, then lists the group's member and
//!   shard Leases, and leads only if none is held by a live replica; otherwise it
//!   releases the single Lease at once, without having written anything.
//!
//! The API server orders the four requests: if the single replica's list did not see the
//! member renewal, the renewal came after the list, so after the single replica's
//! acquire, and the sharded replica's read sees the single Lease held. At least one side
//! backs off. A `--shards 1` replica also looks before it campaigns, so it does not take
//! the Lease over and over while sharded replicas are live; sharded replicas win a tie,
//! since a change of `--shards` is rolled out from 1 to N far more often than back.
//!
//! "Live" follows the usual Lease rule on this replica's own clock: a record held by
//! someone else that changed less than its lease duration ago (a record seen for the
//! first time counts as just changed).

use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::Lease;
use kube::Client;
use kube::api::{Api, ListParams};
use tokio::time::{Duration, Instant, timeout};

use super::decide::{Observed, observed, update};
use super::sharded::{LABEL_GROUP, LABEL_ROLE, LABEL_SHARDS};

/// A live sharded replica, as a `--shards 1` replica sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardedPeer {
    /// Its identity (the holder of its member or shard Lease).
    pub identity: String,
    /// Its `--shards`, when its Lease says (Leases written before the label do not).
    pub shards: Option<u32>,
}

/// What a `--shards 1` replica knows of the sharded replicas in its group.
pub struct ShardedPeers {
    api: Api<Lease>,
    lease_name: String,
    /// Each member and shard Lease as last seen (by name), for its liveness.
    seen: BTreeMap<String, Observed>,
}

impl std::fmt::Debug for ShardedPeers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardedPeers")
            .field("lease_name", &self.lease_name)
            .field("seen", &self.seen.len())
            .finish_non_exhaustive()
    }
}

impl ShardedPeers {
    pub fn new(client: Client, namespace: &str, lease_name: &str) -> ShardedPeers {
        ShardedPeers {
            api: Api::namespaced(client, namespace),
            lease_name: lease_name.to_owned(),
            seen: BTreeMap::new(),
        }
    }

    /// One list of the group's Leases: a live sharded replica other than `me`, if any.
    /// No answer within `within` is an error: the caller must then assume one.
    pub async fn look(
        &mut self,
        me: &str,
        within: Duration,
    ) -> Result<Option<ShardedPeer>, String> {
        let list = ListParams::default().labels(&format!("{LABEL_GROUP}={}", self.lease_name));
        let leases = match timeout(within, self.api.list(&list)).await {
            Ok(Ok(l)) => l.items,
            Ok(Err(e)) => return Err(super::explain(&e, self.api_namespace())),
            Err(_) => return Err(format!("no answer within {within:?}")),
        };
        Ok(live_sharded(&leases, &mut self.seen, me, Instant::now()))
    }

    fn api_namespace(&self) -> &str {
        self.api.namespace().unwrap_or_default()
    }
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
