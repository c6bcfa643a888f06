//! Replicas that split namespaces differently never write one namespace both, and a
//! rolling update that changes `--shards`, `--shard-cuts` or a setting that changes what
//! a replica does to a GpuJob (the quota provider: [`Split`]) keeps the established
//! replicas working. Every replica runs the same lease loop (`coordinator/`); what
//! differs is which Leases it reads.
//!
//! **Between two splits of N, M > 1 shards.** Shard i of one split and shard i of
//! another share the Lease name `<lease-name>-shard-<i>` but not their namespaces. Each
//! shard Lease is labelled with the split of the replica that holds it, so a list of the
//! group says which splits hold shards. The established split keeps working, the other
//! waits:
//!
//! - a replica takes no shard while a live replica of another split holds one (its
//!   replicas are the established split); it balances its shards only with the live
//!   members of its own split, so the remaining replicas of the established split take
//!   the shards of those that leave;
//! - while no replica of any split holds a shard, the split whose name sorts first
//!   takes, and the others wait while a live member of it is seen;
//! - right after acquiring shard Leases and before writing anything in their terms, a
//!   replica lists the group again and hands them back at once if a live replica of
//!   another split holds a shard Lease (or if the list fails).
//!
//! The API server orders the requests: of two replicas of different splits that each
//! acquire a shard Lease, the one whose second list missed the other's acquisition
//! listed before it, so the other's second list, after its own acquisition, sees the
//! first one's: at least one side hands back before writing. A replica that holds shards
//! keeps them while another split's Lease is held beside it only for the moment that
//! hand-back takes; past a lease duration it gives up every shard.
//!
//! When the last replica of the old split stops it releases its shards (or they expire a
//! lease duration after its last renewal), and the new split takes them in its next look:
//! no GpuJob waits longer than one lease duration plus a drain.
//!
//! **Between `--shards 1` and N > 1.** The one shard is the Lease `<lease-name>` itself,
//! a different object from every shard Lease of N, and the sharded side wins, since a
//! count is rolled out from 1 to N far more often than back:
//!
//! - a sharded replica takes a shard only in a look that starts with its member
//!   heartbeat through (renewed within the renew deadline, by its own task:
//!   `heartbeat.rs`), whose read of `<lease-name>` comes after that renewal and shows it
//!   not held by a live replica; while it is, the sharded replica gives up every shard
//!   it holds;
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
//!
//! The two sides' decisions are [`Single`] and [`Sharded`] here: pure, fed with what a
//! look read and the instant it read it; the lease loop (`coordinator/`) does the
//! reads and writes around them.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use gpujob_core::lease::{Observed, observed, update};
use k8s_openapi::api::coordination::v1::Lease;

use super::group::{LABEL_ROLE, LABEL_SHARDS, OtherSplit, Split, other_split_of, splits_held};

/// Whether a look may take shards, and why not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gate {
    /// No live replica splits namespaces differently: take what the balance says.
    Open,
    /// With one shard: a sharded replica is live, so take nothing (`say`: the first look
    /// of this wait).
    ShardedLive { peer: ShardedPeer, say: bool },
    /// Sharded: a `--shards 1` replica holds the single Lease and works on every GpuJob:
    /// give up every shard held.
    SingleLeads { holder: String, say: bool },
    /// Sharded: whether a `--shards 1` replica leads is unknown (the read failed): take
    /// nothing; shards already held stay (a `--shards 1` replica that acquires the single
    /// Lease sees them and steps back before it writes).
    SingleUnknown(String),
    /// Sharded: another split holds shards (`holds`: a live replica of it holds a shard
    /// Lease), or nobody holds any and another split's live member comes first: take
    /// nothing (`say`: the wait was not reported before).
    OtherSplit {
        other: OtherSplit,
        holds: bool,
        say: bool,
    },
    /// Sharded: a live replica of another split holds a shard Lease while this replica
    /// holds shards, as for the moment before one of them hands its Lease back: keep
    /// what is held, take nothing more.
    Contested(OtherSplit),
    /// Sharded: that has lasted longer than a lease duration, longer than the hand-back
    /// takes: give up every shard held.
    BothHold(OtherSplit),
}

impl Gate {
    /// The value for `gpujob_shard_count_conflict` (`None`: unchanged).
    pub fn conflict(&self) -> Option<bool> {
        match self {
            Gate::Open => Some(false),
            Gate::SingleUnknown(_) | Gate::Contested(_) => None,
            Gate::ShardedLive { .. }
            | Gate::SingleLeads { .. }
            | Gate::OtherSplit { .. }
            | Gate::BothHold(_) => Some(true),
        }
    }

    /// Whether every held shard is to be given up (another writer may be live beside
    /// this replica).
    pub fn gives_up_all(&self) -> bool {
        matches!(self, Gate::SingleLeads { .. } | Gate::BothHold(_))
    }
}

/// The conflict gauge as last set, and whether the current wait has been said.
#[derive(Debug, Default)]
struct Conflict {
    on: bool,
    said: bool,
}

impl Conflict {
    /// Records the gauge value `gate` sets, and passes it on.
    fn set(&mut self, gate: Gate) -> Gate {
        if let Some(on) = gate.conflict() {
            self.on = on;
        }
        gate
    }
}

/// What a `--shards 1` replica remembers between looks, and decides. It writes no member
/// Lease, counts itself the only member, and keeps nothing warm.
#[derive(Debug)]
pub struct Single {
    me: String,
    /// The group's member and shard Leases as last seen, for whether a sharded replica is
    /// live.
    sharded_seen: BTreeMap<String, Observed>,
    /// The holder this standby last said it waits on.
    standing_by: Option<String>,
    conflict: Conflict,
}

impl Single {
    pub fn new(me: &str) -> Single {
        Single {
            me: me.to_owned(),
            sharded_seen: BTreeMap::new(),
            standing_by: None,
            conflict: Conflict::default(),
        }
    }

    /// The live members as this replica counts them: itself alone.
    pub fn members(&self) -> BTreeSet<String> {
        BTreeSet::from([self.me.clone()])
    }

    /// Before campaigning, from the group's Leases as listed at `now`: open while no
    /// sharded replica is live.
    pub fn gate(&mut self, leases: &[Lease], now: Instant) -> Gate {
        let gate = match live_sharded(leases, &mut self.sharded_seen, &self.me, now) {
            None => {
                self.conflict.said = false;
                Gate::Open
            }
            Some(peer) => Gate::ShardedLive {
                peer,
                say: !std::mem::replace(&mut self.conflict.said, true),
            },
        };
        self.conflict.set(gate)
    }

    /// Member Leases of the group gone for longer than `after` by this replica's
    /// observation (call after [`Single::gate`] in the same look, which takes the list in).
    pub fn gone_members(&self, leases: &[Lease], after: Duration, now: Instant) -> Vec<Gone> {
        gone_members(leases, &self.sharded_seen, &self.me, None, after, now)
    }

    /// Right after taking the Lease and before any write, from a second list (`None`: it
    /// failed, which counts as a live sharded replica): whether to keep it.
    pub fn still_alone(&mut self, leases: Option<&[Lease]>, now: Instant) -> bool {
        leases.is_some_and(|l| live_sharded(l, &mut self.sharded_seen, &self.me, now).is_none())
    }

    /// At the end of a look that holds nothing: the holder of the Lease (as its elector
    /// last saw it) to say this standby waits on, once per holder.
    pub fn standing_by(
        &mut self,
        holds_any: bool,
        lease: Option<&Observed>,
        now: Instant,
    ) -> Option<String> {
        if holds_any {
            self.standing_by = None;
            return None;
        }
        let holder = lease
            .filter(|o| o.held_by_other(&self.me, now))
            .and_then(|o| o.holder().map(str::to_owned));
        if holder.is_some() && holder != self.standing_by {
            self.standing_by.clone_from(&holder);
            return holder;
        }
        None
    }
}

/// The single Lease `<lease-name>`, as a sharded replica's read of it ended.
#[derive(Debug, Clone)]
pub enum SingleLease {
    Found(Box<Lease>),
    Missing,
    /// The read failed (why).
    Failed(String),
}

/// What a replica of `--shards N > 1` remembers between looks, and decides.
#[derive(Debug)]
pub struct Sharded {
    me: String,
    /// `<lease-name>-member-`: the names of member Leases.
    member_prefix: String,
    /// How this replica splits namespaces.
    split: Split,
    /// Member Leases as last seen (by Lease name), for their holders' liveness.
    members_seen: BTreeMap<String, Observed>,
    /// Live members of other splits, as the last [`Sharded::members`] found them.
    others: Vec<OtherSplit>,
    /// Shard Leases as last seen (by Lease name), for whether a live holder splits
    /// differently.
    shards_seen: BTreeMap<String, Observed>,
    /// Since when another split has held a shard Lease while this replica held shards.
    contested_since: Option<Instant>,
    /// How long a contest may last before this replica gives everything up.
    lease_duration: Duration,
    /// The single Lease of `--shards 1`, as last seen.
    single_seen: Option<Observed>,
    conflict: Conflict,
    /// Looks that got as far as deciding with the heartbeat through: the first only
    /// registers this replica, so that replicas starting together see each other before
    /// anyone takes a shard.
    looks: u64,
}

impl Sharded {
    pub fn new(me: &str, lease_name: &str, split: Split, lease_duration: Duration) -> Sharded {
        Sharded {
            me: me.to_owned(),
            member_prefix: format!("{lease_name}-member-"),
            split,
            members_seen: BTreeMap::new(),
            others: Vec::new(),
            shards_seen: BTreeMap::new(),
            contested_since: None,
            lease_duration,
            single_seen: None,
            conflict: Conflict::default(),
            looks: 0,
        }
    }

    /// Replicas of this split whose member heartbeat changed within its lease duration
    /// before `now` (on this replica's clock), and this one. Live members of other
    /// splits are kept for [`Sharded::gate`].
    pub fn members(&mut self, leases: &[Lease], now: Instant) -> BTreeSet<String> {
        let mut live = BTreeSet::from([self.me.clone()]);
        self.others.clear();
        forget_unlisted(&mut self.members_seen, leases);
        for lease in leases {
            let name = lease.metadata.name.clone().unwrap_or_default();
            if !name.starts_with(&self.member_prefix) {
                continue;
            }
            let seen = self
                .members_seen
                .entry(name)
                .or_insert_with(|| observed(lease, now));
            update(seen, lease, now);
            let Some(holder) = seen.holder() else {
                continue;
            };
            if holder != self.me && !seen.held_by_other(&self.me, now) {
                continue;
            }
            match other_split_of(lease, "member", &self.split) {
                Some((shards, map)) if holder != self.me => self.others.push(OtherSplit {
                    replica: holder.to_owned(),
                    shards,
                    map,
                }),
                _ => {
                    live.insert(holder.to_owned());
                }
            }
        }
        live
    }

    /// Member Leases of other replicas gone for longer than `after` by this replica's
    /// observation (call after [`Sharded::members`] in the same look, which takes the
    /// list in). Its own member Lease is never among them.
    pub fn gone_members(&self, leases: &[Lease], after: Duration, now: Instant) -> Vec<Gone> {
        let own = format!("{}{}", self.member_prefix, self.me);
        gone_members(leases, &self.members_seen, &self.me, Some(&own), after, now)
    }

    /// After this look's list (and [`Sharded::members`] on it), from the single Lease as
    /// read at `now` and whether this replica `holding` shards: open while no
    /// `--shards 1` replica leads and no other split holds shards or comes first.
    pub fn gate(
        &mut self,
        single: SingleLease,
        leases: &[Lease],
        holding: bool,
        now: Instant,
    ) -> Gate {
        let leads = match single {
            SingleLease::Missing => None,
            SingleLease::Failed(why) => return Gate::SingleUnknown(why),
            SingleLease::Found(lease) => {
                let seen = self
                    .single_seen
                    .get_or_insert_with(|| observed(&lease, now));
                update(seen, &lease, now);
                seen.holder()
                    .filter(|_| seen.held_by_other(&self.me, now))
                    .map(str::to_owned)
            }
        };
        if let Some(holder) = leads {
            self.contested_since = None;
            let gate = Gate::SingleLeads {
                holder,
                say: !std::mem::replace(&mut self.conflict.said, true),
            };
            return self.conflict.set(gate);
        }
        self.conflict.said = false;
        let held = splits_held(leases, &self.split, &mut self.shards_seen, &self.me, now);
        if !holding {
            self.contested_since = None;
        }
        let gate = match held.other {
            Some(other) if holding => {
                let since = *self.contested_since.get_or_insert(now);
                if now.saturating_duration_since(since) > self.lease_duration {
                    Gate::BothHold(other)
                } else {
                    Gate::Contested(other)
                }
            }
            Some(other) => Gate::OtherSplit {
                other,
                holds: true,
                say: !self.conflict.on,
            },
            None => {
                self.contested_since = None;
                match self.first_split(holding || held.alike) {
                    Some(other) => Gate::OtherSplit {
                        other,
                        holds: false,
                        say: !self.conflict.on,
                    },
                    None => Gate::Open,
                }
            }
        };
        self.conflict.set(gate)
    }

    /// While no split holds a shard (`established`: this one does), the live member of
    /// another split that comes first, if any: its split takes, this one waits.
    fn first_split(&self, established: bool) -> Option<OtherSplit> {
        if established {
            return None;
        }
        let name = self.split.name();
        let mine = (name.as_str(), self.split.shards);
        self.others
            .iter()
            .filter(|o| (o.map.as_str(), o.shards) < mine)
            .min_by(|a, b| (a.map.as_str(), a.shards).cmp(&(b.map.as_str(), b.shards)))
            .cloned()
    }

    /// Right after acquiring shard Leases and before any write in their terms, from a
    /// second list (`None`: it failed, which counts as another split holding): whether
    /// to keep them.
    pub fn still_alone(&mut self, leases: Option<&[Lease]>, now: Instant) -> bool {
        leases.is_some_and(|l| {
            splits_held(l, &self.split, &mut self.shards_seen, &self.me, now)
                .other
                .is_none()
        })
    }

    /// After releasing what the balance says: whether this look may take shards. Not
    /// before a look whose heartbeat was through has passed (it registers this replica),
    /// and not one whose heartbeat is not through.
    pub fn ready(&mut self, registered: bool) -> bool {
        if !registered {
            return false;
        }
        self.looks += 1;
        self.looks > 1
    }
}

/// A live sharded replica, as a `--shards 1` replica sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardedPeer {
    /// Its identity (the holder of its member or shard Lease).
    pub identity: String,
    /// Its `--shards`, when its Lease says (Leases written before the label do not).
    pub shards: Option<u32>,
}

/// A member Lease to delete: released or expired for longer than the threshold on this
/// replica's clock, with the uid and resourceVersion it was judged by (the delete's
/// preconditions: a Lease renewed or created again since is not deleted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gone {
    pub name: String,
    pub uid: String,
    pub resource_version: String,
    /// How long it has been released or expired.
    pub for_: Duration,
}

/// How many lease durations a member Lease stays after its replica released it or
/// stopped renewing it, before a live replica deletes it.
pub const MEMBER_GONE_LEASE_DURATIONS: u32 = 10;

/// The member Leases in `leases` whose record, as `seen` holds it (updated from this
/// very list), has been released or expired for longer than `after`: judged by when this
/// replica saw it change, never by the record's timestamps. Not `own` (this replica's
/// member Lease), nor one naming `me`; only records whose resourceVersion is the one
/// listed.
pub fn gone_members(
    leases: &[Lease],
    seen: &BTreeMap<String, Observed>,
    me: &str,
    own: Option<&str>,
    after: Duration,
    now: Instant,
) -> Vec<Gone> {
    leases
        .iter()
        .filter_map(|lease| {
            let labels = lease.metadata.labels.as_ref()?;
            if labels.get(LABEL_ROLE).map(String::as_str) != Some("member") {
                return None;
            }
            let name = lease.metadata.name.as_deref()?;
            if Some(name) == own {
                return None;
            }
            let record = seen.get(name)?;
            let rv = lease.metadata.resource_version.as_deref()?;
            if record.resource_version != rv {
                return None;
            }
            let for_ = record.gone_for(me, now).filter(|d| *d > after)?;
            Some(Gone {
                name: name.to_owned(),
                uid: lease.metadata.uid.clone()?,
                resource_version: rv.to_owned(),
                for_,
            })
        })
        .collect()
}

/// Forgets the records of Leases no longer listed (deleted), so that what a replica
/// remembers is bounded by the Leases there are.
fn forget_unlisted(seen: &mut BTreeMap<String, Observed>, leases: &[Lease]) {
    let listed: BTreeSet<&str> = leases
        .iter()
        .filter_map(|l| l.metadata.name.as_deref())
        .collect();
    seen.retain(|name, _| listed.contains(name.as_str()));
}

/// The first member or shard Lease held by a live replica other than `me`, updating
/// `seen` (the expiry clock of a record restarts only when it changes).
pub fn live_sharded(
    leases: &[Lease],
    seen: &mut BTreeMap<String, Observed>,
    me: &str,
    now: Instant,
) -> Option<ShardedPeer> {
    forget_unlisted(seen, leases);
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
pub(super) mod tests {
    use super::*;
    use crate::lease::group::LABEL_SHARD_MAP;
    use crate::shard::ShardMap;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use std::time::Duration;

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    /// A Lease seen at `at`, held by `holder` for 15 s.
    pub(in crate::lease) fn held_by(holder: &str, at: Instant) -> Observed {
        Observed {
            spec: LeaseSpec {
                holder_identity: Some(holder.to_owned()),
                lease_duration_seconds: Some(15),
                ..LeaseSpec::default()
            },
            resource_version: "1".to_owned(),
            at,
        }
    }

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

    /// The member Lease of `holder`, written by a replica splitting by `map`.
    fn member(holder: &str, rv: &str, map: &ShardMap) -> Lease {
        let mut l = lease(&format!("op-member-{holder}"), "member", Some(holder), rv);
        let labels = l.metadata.labels.get_or_insert_with(BTreeMap::new);
        labels.insert(LABEL_SHARDS.to_owned(), map.shards().to_string());
        labels.insert(LABEL_SHARD_MAP.to_owned(), map.name());
        l
    }

    /// The single Lease `op` of `--shards 1`.
    fn single_lease(holder: Option<&str>, rv: &str) -> SingleLease {
        SingleLease::Found(Box::new(lease("op", "single", holder, rv)))
    }

    fn names(of: &[&str]) -> BTreeSet<String> {
        of.iter().map(|s| (*s).to_owned()).collect()
    }

    fn split(map: &ShardMap) -> Split {
        Split::new(map, &[])
    }

    #[test]
    fn one_shard_takes_nothing_while_a_sharded_replica_is_live_and_says_so_once_per_wait() {
        let t0 = Instant::now();
        let mut single = Single::new("a");
        assert_eq!(single.gate(&[], t0), Gate::Open);
        let b = lease("op-member-b", "member", Some("b"), "1");
        let first = single.gate(std::slice::from_ref(&b), t0);
        assert!(
            matches!(&first, Gate::ShardedLive { peer, say: true } if peer.identity == "b"),
            "{first:?}"
        );
        assert_eq!(first.conflict(), Some(true));
        assert!(!first.gives_up_all(), "it holds nothing to give up");
        let again = single.gate(std::slice::from_ref(&b), t0 + secs(2));
        assert!(
            matches!(again, Gate::ShardedLive { say: false, .. }),
            "the same wait is said once: {again:?}"
        );
        // Unchanged for a lease duration: gone, and the conflict with it.
        let gone = single.gate(std::slice::from_ref(&b), t0 + secs(15));
        assert_eq!(gone, Gate::Open);
        assert_eq!(gone.conflict(), Some(false));
        // Back again: a new wait, said again.
        let back = lease("op-member-b", "member", Some("b"), "2");
        assert!(matches!(
            single.gate(&[back], t0 + secs(16)),
            Gate::ShardedLive { say: true, .. }
        ));
    }

    #[test]
    fn one_shard_keeps_a_lease_it_took_only_if_a_second_list_shows_no_sharded_replica() {
        let t0 = Instant::now();
        let mut single = Single::new("a");
        assert!(single.still_alone(Some(&[]), t0));
        assert!(
            !single.still_alone(None, t0),
            "a failed list counts as a live sharded replica"
        );
        let shard = lease("op-shard-2", "shard", Some("c"), "1");
        assert!(!single.still_alone(Some(std::slice::from_ref(&shard)), t0));
        assert!(
            single.still_alone(Some(&[shard]), t0 + secs(15)),
            "unchanged for a lease duration: its holder is gone"
        );
        assert_eq!(single.members(), names(&["a"]));
    }

    #[test]
    fn a_standby_says_once_per_holder_whom_it_waits_on() {
        let t0 = Instant::now();
        let mut single = Single::new("a");
        let b = held_by("b", t0);
        assert_eq!(
            single.standing_by(false, Some(&b), t0),
            Some("b".to_owned())
        );
        assert_eq!(single.standing_by(false, Some(&b), t0 + secs(2)), None);
        assert_eq!(single.standing_by(false, None, t0 + secs(2)), None);
        let c = held_by("c", t0 + secs(3));
        assert_eq!(
            single.standing_by(false, Some(&c), t0 + secs(3)),
            Some("c".to_owned())
        );
        // Holding, nothing is said; after it, the holder is said again.
        assert_eq!(single.standing_by(true, Some(&c), t0 + secs(4)), None);
        assert_eq!(
            single.standing_by(false, Some(&c), t0 + secs(4)),
            Some("c".to_owned())
        );
        assert_eq!(
            single.standing_by(false, Some(&b), t0 + secs(15)),
            None,
            "an expired holder is nobody to wait on"
        );
        assert_eq!(
            single.standing_by(false, Some(&held_by("a", t0)), t0),
            None,
            "nor is this replica itself"
        );
    }

    #[test]
    fn the_first_sharded_look_only_registers_and_one_whose_heartbeat_failed_takes_nothing() {
        let mut sharded = Sharded::new("a", "op", split(&ShardMap::even(6)), secs(15));
        assert!(
            !sharded.ready(true),
            "the first look registers this replica"
        );
        assert!(sharded.ready(true));
        assert!(!sharded.ready(false), "its heartbeat did not go through");
        assert!(sharded.ready(true));
    }

    #[test]
    fn members_are_live_while_their_heartbeat_changes_on_this_replicas_clock() {
        let t0 = Instant::now();
        let six = ShardMap::even(6);
        let mut sharded = Sharded::new("a", "op", split(&six), secs(15));
        let shard = lease("op-shard-0", "shard", Some("d"), "1");
        let released = lease("op-member-e", "member", None, "1");
        let list = [
            member("b", "1", &six),
            member("c", "1", &six),
            shard,
            released,
        ];
        assert_eq!(sharded.members(&list, t0), names(&["a", "b", "c"]));
        // b renews at 10 s, c does not: c is gone a lease duration after it was seen.
        let list = [member("b", "2", &six), member("c", "1", &six)];
        assert_eq!(
            sharded.members(&list, t0 + secs(10)),
            names(&["a", "b", "c"])
        );
        assert_eq!(sharded.members(&list, t0 + secs(15)), names(&["a", "b"]));
        assert_eq!(sharded.members(&list, t0 + secs(25)), names(&["a"]));
    }

    #[test]
    fn a_one_shard_leader_makes_a_sharded_replica_give_up_everything_until_its_lease_expires() {
        let t0 = Instant::now();
        let mut sharded = Sharded::new("a", "op", split(&ShardMap::even(6)), secs(15));
        assert_eq!(
            sharded.gate(SingleLease::Missing, &[], false, t0),
            Gate::Open
        );
        let leads = sharded.gate(single_lease(Some("x"), "5"), &[], false, t0);
        assert_eq!(
            leads,
            Gate::SingleLeads {
                holder: "x".to_owned(),
                say: true
            }
        );
        assert!(leads.gives_up_all());
        assert_eq!(leads.conflict(), Some(true));
        assert_eq!(
            sharded.gate(single_lease(Some("x"), "5"), &[], false, t0 + secs(14)),
            Gate::SingleLeads {
                holder: "x".to_owned(),
                say: false
            }
        );
        // A failed read: take nothing, give nothing up, leave the gauge as it is.
        let unknown = sharded.gate(SingleLease::Failed("timeout".to_owned()), &[], false, t0);
        assert_eq!(unknown, Gate::SingleUnknown("timeout".to_owned()));
        assert!(!unknown.gives_up_all());
        assert_eq!(unknown.conflict(), None);
        // Unchanged for its lease duration: expired.
        assert_eq!(
            sharded.gate(single_lease(Some("x"), "5"), &[], false, t0 + secs(15)),
            Gate::Open
        );
        // Renewed: leads again, a new wait; released (no holder): free at once.
        assert!(matches!(
            sharded.gate(single_lease(Some("x"), "6"), &[], false, t0 + secs(16)),
            Gate::SingleLeads { say: true, .. }
        ));
        assert_eq!(
            sharded.gate(single_lease(None, "7"), &[], false, t0 + secs(17)),
            Gate::Open
        );
        assert_eq!(
            sharded.gate(single_lease(Some("a"), "8"), &[], false, t0 + secs(18)),
            Gate::Open,
            "a single Lease naming this replica (an earlier run of it) is no other leader"
        );
    }

    #[test]
    fn while_no_split_holds_a_shard_the_split_that_sorts_first_takes_and_the_other_waits() {
        let t0 = Instant::now();
        let six = ShardMap::even(6);
        let three = ShardMap::even(3);
        let mut sharded = Sharded::new("a", "op", split(&six), secs(15));
        let alike = [member("b", "1", &six)];
        sharded.members(&alike, t0);
        assert_eq!(
            sharded.gate(SingleLease::Missing, &alike, false, t0),
            Gate::Open
        );
        // A live member of 3 shards, nobody holding: (map, 3) sorts before (map, 6).
        let mixed = [member("b", "1", &six), member("c", "1", &three)];
        assert_eq!(
            sharded.members(&mixed, t0),
            names(&["a", "b"]),
            "a member of another split is no member to balance with"
        );
        let waits = sharded.gate(SingleLease::Missing, &mixed, false, t0);
        assert!(
            matches!(&waits, Gate::OtherSplit { other, holds: false, say: true } if other.replica == "c" && other.shards == 3),
            "{waits:?}"
        );
        assert!(!waits.gives_up_all());
        assert_eq!(waits.conflict(), Some(true));
        assert!(
            matches!(
                sharded.gate(SingleLease::Missing, &mixed, false, t0 + secs(2)),
                Gate::OtherSplit { say: false, .. }
            ),
            "said once while the wait lasts"
        );
        // The split that sorts first sees the other's member and takes.
        let mut first = Sharded::new("c", "op", split(&three), secs(15));
        first.members(&mixed, t0);
        assert_eq!(
            first.gate(SingleLease::Missing, &mixed, false, t0),
            Gate::Open
        );
        // Once this replica's split holds a shard (here or by b), it keeps working
        // beside the other's live member: the established split.
        assert_eq!(
            sharded.gate(SingleLease::Missing, &mixed, true, t0 + secs(3)),
            Gate::Open
        );
        let b_holds = [
            member("b", "1", &six),
            member("c", "1", &three),
            shard_of(4, "b", "1", &six),
        ];
        sharded.members(&b_holds, t0 + secs(3));
        assert_eq!(
            sharded.gate(SingleLease::Missing, &b_holds, false, t0 + secs(3)),
            Gate::Open
        );
        // c's heartbeat stops: a lease duration later it is not live, and nobody waits.
        sharded.members(&mixed, t0 + secs(15));
        assert_eq!(
            sharded.gate(SingleLease::Missing, &mixed, false, t0 + secs(15)),
            Gate::Open
        );
    }

    /// `l` with a uid, as the API server lists it.
    fn with_uid(mut l: Lease, uid: &str) -> Lease {
        l.metadata.uid = Some(uid.to_owned());
        l
    }

    #[test]
    fn a_member_lease_released_or_expired_for_ten_lease_durations_is_gone_by_the_local_clock() {
        let t0 = Instant::now();
        let six = ShardMap::even(6);
        let mut sharded = Sharded::new("a", "op", split(&six), secs(15));
        let after = secs(15) * MEMBER_GONE_LEASE_DURATIONS;
        let own = with_uid(member("a", "1", &six), "ua");
        let dead = with_uid(member("b", "4", &six), "ub");
        let released = with_uid(lease("op-member-c", "member", None, "5"), "uc");
        let shard = with_uid(lease("op-shard-0", "shard", Some("e"), "7"), "ue");
        let list = |d: &str| {
            vec![
                own.clone(),
                dead.clone(),
                released.clone(),
                with_uid(member("d", d, &six), "ud"),
                shard.clone(),
            ]
        };
        sharded.members(&list("6"), t0);
        assert!(sharded.gone_members(&list("6"), after, t0).is_empty());
        // d renews every look; b never does, c stays released. b expires 15 s after it
        // was first seen; c has been released since it was first seen.
        let mut rv = 6;
        let mut look = |at: Duration, sharded: &mut Sharded| {
            rv += 1;
            let l = list(&rv.to_string());
            sharded.members(&l, t0 + at);
            (sharded.gone_members(&l, after, t0 + at), l)
        };
        let (gone, _) = look(secs(150), &mut sharded);
        assert!(
            gone.is_empty(),
            "released exactly 10 lease durations: not yet"
        );
        let (gone, _) = look(secs(151), &mut sharded);
        assert_eq!(
            gone,
            [Gone {
                name: "op-member-c".to_owned(),
                uid: "uc".to_owned(),
                resource_version: "5".to_owned(),
                for_: secs(151),
            }],
            "released for over 10 lease durations; b expired only at 15 s"
        );
        let (gone, _) = look(secs(166), &mut sharded);
        let names: Vec<&str> = gone.iter().map(|g| g.name.as_str()).collect();
        assert_eq!(names, ["op-member-b", "op-member-c"]);
        assert_eq!(gone[0].for_, secs(151));
        assert_eq!(gone[0].resource_version, "4", "the version judged");
        assert_eq!(gone[0].uid, "ub");

        // Own member Lease: never, even unchanged for ever (its heartbeat failing).
        assert!(
            !sharded
                .gone_members(&list("99"), after, t0 + secs(10_000))
                .iter()
                .any(|g| g.name == "op-member-a")
        );
        // Nor when its record says released (written so by an earlier run of this
        // replica): this replica renews it in its next heartbeat.
        let own_released = vec![with_uid(lease("op-member-a", "member", None, "2"), "ua")];
        sharded.members(&own_released, t0 + secs(166));
        assert!(
            sharded
                .gone_members(&own_released, after, t0 + secs(10_000))
                .is_empty()
        );
        // b comes back (a new record): live again, its clock restarts.
        let back = vec![with_uid(member("b", "50", &six), "ub")];
        sharded.members(&back, t0 + secs(170));
        assert!(
            sharded
                .gone_members(&back, after, t0 + secs(170))
                .is_empty()
        );
        assert!(
            sharded
                .gone_members(&back, after, t0 + secs(170) + secs(15) + after)
                .is_empty(),
            "gone only from when it expires (15 s after its change) plus the threshold"
        );
        assert_eq!(
            sharded
                .gone_members(&back, after, t0 + secs(171) + secs(15) + after)
                .len(),
            1
        );
        // A list showing another version than the one judged deletes nothing: it is
        // judged again first.
        let newer = vec![with_uid(member("b", "51", &six), "ub")];
        assert!(
            sharded
                .gone_members(&newer, after, t0 + secs(10_000))
                .is_empty()
        );
    }

    #[test]
    fn a_one_shard_standby_judges_member_leases_gone_too_and_never_shard_leases() {
        let t0 = Instant::now();
        let mut single = Single::new("a");
        let after = secs(15) * MEMBER_GONE_LEASE_DURATIONS;
        let list = [
            with_uid(lease("op-member-b", "member", Some("b"), "1"), "ub"),
            with_uid(lease("op-shard-0", "shard", Some("c"), "2"), "uc"),
        ];
        single.gate(&list, t0);
        assert!(single.gone_members(&list, after, t0 + after).is_empty());
        single.gate(&list, t0 + after + secs(16));
        let gone = single.gone_members(&list, after, t0 + after + secs(16));
        assert_eq!(
            gone.iter().map(|g| g.name.as_str()).collect::<Vec<_>>(),
            ["op-member-b"]
        );
    }

    #[test]
    fn records_of_leases_no_longer_listed_are_forgotten() {
        let t0 = Instant::now();
        let six = ShardMap::even(6);
        let mut sharded = Sharded::new("a", "op", split(&six), secs(15));
        let b = member("b", "1", &six);
        sharded.members(std::slice::from_ref(&b), t0);
        // Deleted: forgotten. Created again later: first sight, live for a lease
        // duration from then.
        sharded.members(&[], t0 + secs(100));
        assert_eq!(
            sharded.members(&[member("b", "9", &six)], t0 + secs(200)),
            names(&["a", "b"])
        );
        let mut seen = BTreeMap::new();
        live_sharded(std::slice::from_ref(&b), &mut seen, "a", t0);
        assert_eq!(seen.len(), 1);
        live_sharded(&[], &mut seen, "a", t0);
        assert!(seen.is_empty());
    }

    /// Shard Lease `i` held by `holder`, written by a replica splitting by `map`.
    fn shard_of(i: u32, holder: &str, rv: &str, map: &ShardMap) -> Lease {
        let mut l = lease(&format!("op-shard-{i}"), "shard", Some(holder), rv);
        let labels = l.metadata.labels.get_or_insert_with(BTreeMap::new);
        labels.insert(LABEL_SHARDS.to_owned(), map.shards().to_string());
        labels.insert(LABEL_SHARD_MAP.to_owned(), map.name());
        l
    }

    #[test]
    fn a_live_shard_holder_of_another_split_keeps_a_new_split_waiting_without_a_live_member() {
        let t0 = Instant::now();
        let six = ShardMap::even(6);
        let three = ShardMap::even(3);
        let mut sharded = Sharded::new("a", "op", split(&six), secs(15));
        // c's member heartbeat is stale (or gone), but it renews shard 1 at its count, 3.
        let list = |rv: &str| [member("b", "1", &six), shard_of(1, "c", rv, &three)];
        let members = sharded.members(&list("1"), t0);
        assert_eq!(members, names(&["a", "b"]), "c is no live member");
        let gate = sharded.gate(SingleLease::Missing, &list("1"), false, t0);
        assert!(
            matches!(&gate, Gate::OtherSplit { other, holds: true, say: true } if other.replica == "c" && other.shards == 3),
            "{gate:?}"
        );
        assert!(!gate.gives_up_all(), "it holds nothing");
        // Renewed: still live, still waiting (said once).
        let gate = sharded.gate(SingleLease::Missing, &list("2"), false, t0 + secs(14));
        assert!(
            matches!(gate, Gate::OtherSplit { say: false, .. }),
            "{gate:?}"
        );
        // Not renewed for a lease duration (15 s after it last changed): expired, open.
        assert_eq!(
            sharded.gate(SingleLease::Missing, &list("2"), false, t0 + secs(29)),
            Gate::Open
        );
        // Another map at the same count is another split too.
        let cut = ShardMap::parse("0x1,0x2,0x3,0x4,0x5", 6).unwrap();
        let list = [shard_of(2, "d", "5", &cut)];
        let gate = sharded.gate(SingleLease::Missing, &list, false, t0 + secs(30));
        assert!(
            matches!(&gate, Gate::OtherSplit { other, .. } if other.replica == "d" && other.map == cut.name()),
            "{gate:?}"
        );
    }

    #[test]
    fn a_holder_keeps_its_shards_while_another_split_hands_back_and_gives_all_up_if_it_does_not() {
        let t0 = Instant::now();
        let six = ShardMap::even(6);
        let three = ShardMap::even(3);
        let mut sharded = Sharded::new("a", "op", split(&six), secs(15));
        let list = |rv: &str| [shard_of(0, "a", "1", &six), shard_of(1, "c", rv, &three)];
        let gate = sharded.gate(SingleLease::Missing, &list("1"), true, t0);
        assert!(
            matches!(&gate, Gate::Contested(o) if o.replica == "c"),
            "{gate:?}"
        );
        assert!(
            !gate.gives_up_all(),
            "c hands its Lease back before writing"
        );
        assert_eq!(gate.conflict(), None);
        // Handed back (released): nothing contested.
        let mut released = shard_of(1, "c", "2", &three);
        released.spec.as_mut().unwrap().holder_identity = None;
        assert_eq!(
            sharded.gate(
                SingleLease::Missing,
                &[shard_of(0, "a", "1", &six), released],
                true,
                t0 + secs(1)
            ),
            Gate::Open
        );
        // Kept and renewed beside this replica's for over a lease duration: both hold,
        // which the second list after an acquire is there to prevent: give everything up.
        let t1 = t0 + secs(2);
        assert!(matches!(
            sharded.gate(SingleLease::Missing, &list("3"), true, t1),
            Gate::Contested(_)
        ));
        assert!(matches!(
            sharded.gate(SingleLease::Missing, &list("4"), true, t1 + secs(15)),
            Gate::Contested(_)
        ));
        let gate = sharded.gate(SingleLease::Missing, &list("5"), true, t1 + secs(16));
        assert!(
            matches!(&gate, Gate::BothHold(o) if o.replica == "c"),
            "{gate:?}"
        );
        assert!(gate.gives_up_all());
        assert_eq!(gate.conflict(), Some(true));
    }

    #[test]
    fn a_sharded_replica_keeps_shards_it_took_only_if_a_second_list_shows_no_other_split_holding() {
        let t0 = Instant::now();
        let six = ShardMap::even(6);
        let three = ShardMap::even(3);
        let mut sharded = Sharded::new("a", "op", split(&six), secs(15));
        assert!(sharded.still_alone(Some(&[]), t0));
        assert!(
            !sharded.still_alone(None, t0),
            "a failed list counts as another split holding"
        );
        let alike = [shard_of(0, "a", "1", &six), shard_of(1, "b", "1", &six)];
        assert!(sharded.still_alone(Some(&alike), t0));
        // A live member of another split is no reason: only a held shard Lease is.
        assert!(sharded.still_alone(Some(&[member("c", "1", &three)]), t0));
        let other = shard_of(2, "c", "1", &three);
        assert!(!sharded.still_alone(Some(std::slice::from_ref(&other)), t0));
        assert!(
            sharded.still_alone(Some(&[other]), t0 + secs(15)),
            "unchanged for a lease duration: its holder is gone"
        );
    }

    #[test]
    fn shard_leases_that_split_alike_released_or_naming_this_replica_are_no_conflict() {
        let t0 = Instant::now();
        let six = ShardMap::even(6);
        let three = ShardMap::even(3);
        let mut sharded = Sharded::new("a", "op", split(&six), secs(15));
        let mut released = shard_of(0, "c", "1", &three);
        released.spec.as_mut().unwrap().holder_identity = None;
        let list = [
            shard_of(1, "b", "1", &six),
            released,
            // This replica's own, from a run with another count (restarted under its
            // name): it is no other writer.
            shard_of(2, "a", "1", &three),
        ];
        assert_eq!(
            sharded.gate(SingleLease::Missing, &list, false, t0),
            Gate::Open
        );
        // Written before the count label: says nothing.
        let mut unlabelled = lease("op-shard-3", "shard", Some("d"), "1");
        unlabelled
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .remove(LABEL_SHARDS);
        assert_eq!(
            sharded.gate(SingleLease::Missing, &[unlabelled], false, t0),
            Gate::Open
        );
        // The single Lease (role `single`) is judged as the single Lease, not here.
        let single = shard_of(0, "x", "1", &ShardMap::even(1));
        let mut single = single;
        single
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(LABEL_ROLE.to_owned(), "single".to_owned());
        assert_eq!(
            sharded.gate(SingleLease::Missing, &[single], false, t0),
            Gate::Open
        );
    }
}
