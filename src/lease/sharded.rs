//! Sharded ownership (`--shards N`, N > 1). Shard i is guarded by Lease
//! `<lease-name>-shard-<i>`; each replica also renews a member heartbeat Lease,
//! `<lease-name>-member-<identity>`. Every retry period a coordinator lists the group's
//! Leases (one call), works out the live replicas (a member whose record changed within a
//! lease duration on this replica's own clock, the same rule as for shard Leases) and who
//! holds what, and takes or gives up shards as [`balance::decide`] says. Each held shard
//! is renewed by a task of its own (its own timer and deadline), so renewing many shards
//! never starves one.
//!
//! While a `--shards 1` replica holds the single Lease, a sharded replica holds no shard;
//! how the two modes exclude each other during a rolling update is in `modes.rs`.
//!
//! Giving a shard up drains it: it leaves the published ownership (no new keys, its
//! reconciles are cancelled, its writes fenced), the coordinator waits until none of its
//! reconciles runs, then releases the Lease with an empty holder, so another replica
//! takes it on its next look instead of after a lease duration.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::Arc;

use k8s_openapi::api::coordination::v1::Lease;
use kube::Client;
use kube::api::{Api, ListParams};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{Instant, timeout};
use tracing::{error, info, warn};

use super::balance::{self, Holder, View};
use super::decide::{observed, update};
use super::{
    Attempt, Elector, InFlight, Observed, Ownership, Tenure, Timing, beat_limit, explain,
    gained_or_lost, jitter, report,
};
use crate::health::Status;
use crate::shard::SHARD_MAP;

/// Label on every Lease of one operator: its `--lease-name`.
pub const LABEL_GROUP: &str = "gpujob.dev/lease-group";
/// Label on every Lease of one operator: `shard` or `member`.
pub const LABEL_ROLE: &str = "gpujob.dev/lease-role";
/// On every shard and member Lease: the `--shards` of the replica that wrote it. Lease
/// names do not carry it, so without it replicas with different counts would split
/// namespaces differently under the same names, and one namespace would have two owners.
pub const LABEL_SHARDS: &str = "gpujob.dev/shards";
/// On every shard and member Lease: how the replica that wrote it maps namespaces to
/// shards ([`SHARD_MAP`]). A Lease with a count and no map was written before the label
/// existed, by a replica with today's map.
pub const LABEL_SHARD_MAP: &str = "gpujob.dev/shard-map";

/// Where the Leases live and how many shards there are.
#[derive(Debug, Clone)]
pub struct ShardLeases {
    pub lease_name: String,
    pub namespace: String,
    pub shards: u32,
}

impl ShardLeases {
    pub fn shard(&self, i: u32) -> String {
        format!("{}-shard-{i}", self.lease_name)
    }

    pub fn member(&self, identity: &str) -> String {
        format!("{}-member-{identity}", self.lease_name)
    }

    fn labels(&self, role: &str) -> BTreeMap<String, String> {
        BTreeMap::from([
            (LABEL_GROUP.to_owned(), self.lease_name.clone()),
            (LABEL_ROLE.to_owned(), role.to_owned()),
            (LABEL_SHARDS.to_owned(), self.shards.to_string()),
            (LABEL_SHARD_MAP.to_owned(), SHARD_MAP.to_owned()),
        ])
    }
}

/// A live replica that splits namespaces differently: by its member Lease, another
/// `--shards` than `ours` or another map than [`SHARD_MAP`].
#[derive(Debug, PartialEq, Eq)]
struct OtherSplit {
    replica: String,
    shards: u32,
    map: String,
}

/// The first live member whose split differs from this replica's. Member Leases written
/// before the count label existed say nothing and are skipped; one with a count and no
/// map used today's map.
fn other_split(leases: &[Lease], ours: u32, live: &BTreeSet<String>) -> Option<OtherSplit> {
    leases.iter().find_map(|lease| {
        let labels = lease.metadata.labels.as_ref()?;
        if labels.get(LABEL_ROLE).map(String::as_str) != Some("member") {
            return None;
        }
        let shards: u32 = labels.get(LABEL_SHARDS)?.parse().ok()?;
        let map = labels
            .get(LABEL_SHARD_MAP)
            .map_or(SHARD_MAP, String::as_str);
        let holder = lease.spec.as_ref()?.holder_identity.as_deref()?;
        ((shards != ours || map != SHARD_MAP) && live.contains(holder)).then(|| OtherSplit {
            replica: holder.to_owned(),
            shards,
            map: map.to_owned(),
        })
    })
}

/// Holds shards until `stop`, publishing them on `tx`; then drains and releases every
/// held shard and the member heartbeat. `stop` must resolve only once the controller
/// has drained (held shards are renewed meanwhile).
#[allow(clippy::too_many_arguments)] // the lease loop's whole wiring, once, from main
pub async fn run(
    client: Client,
    leases: ShardLeases,
    identity: &str,
    timing: Timing,
    tx: watch::Sender<Ownership>,
    in_flight: InFlight,
    status: Arc<Status>,
    stop: impl Future<Output = ()>,
) {
    let mut c = Coordinator::new(client, leases, identity, timing, tx, in_flight, status);
    tokio::pin!(stop);
    loop {
        c.tick().await;
        tokio::select! {
            _ = tokio::time::sleep(jitter(c.timing.retry_period)) => {}
            _ = &mut stop => break,
        }
    }
    c.shut_down().await;
}

/// The single Lease of `--shards 1`, as one look saw it.
enum Legacy {
    /// Free, expired, released or missing.
    None,
    /// Held by this live replica.
    Leads(String),
    /// The read failed.
    Unknown(String),
}

struct Coordinator {
    api: Api<Lease>,
    leases: ShardLeases,
    me: String,
    timing: Timing,
    member: Elector,
    member_held: bool,
    electors: Vec<Arc<Elector>>,
    tx: Arc<watch::Sender<Ownership>>,
    renewers: BTreeMap<u32, JoinHandle<()>>,
    /// Other replicas' member Leases as last seen (by Lease name), for their liveness.
    members_seen: BTreeMap<String, Observed>,
    /// Since when each shard has been seen free.
    free_since: BTreeMap<u32, Instant>,
    /// The single Lease of `--shards 1`, as last seen.
    legacy_seen: Option<Observed>,
    /// Whether the current wait behind a `--shards 1` leader has been logged.
    legacy_logged: bool,
    /// Looks taken so far: the first only registers this replica, so that replicas
    /// starting together see each other before anyone takes a shard.
    looks: u64,
    in_flight: InFlight,
    status: Arc<Status>,
}

impl Coordinator {
    fn new(
        client: Client,
        leases: ShardLeases,
        identity: &str,
        timing: Timing,
        tx: watch::Sender<Ownership>,
        in_flight: InFlight,
        status: Arc<Status>,
    ) -> Coordinator {
        let ns = leases.namespace.clone();
        let electors = (0..leases.shards)
            .map(|i| {
                Arc::new(
                    Elector::new(
                        client.clone(),
                        &ns,
                        &leases.shard(i),
                        identity,
                        timing.clone(),
                    )
                    .with_labels(leases.labels("shard")),
                )
            })
            .collect();
        let member = Elector::new(
            client.clone(),
            &ns,
            &leases.member(identity),
            identity,
            timing.clone(),
        )
        .with_labels(leases.labels("member"));
        tx.send_replace(Ownership::nothing_of(leases.shards));
        report(&status.metrics, &tx.borrow());
        Coordinator {
            api: Api::namespaced(client, &ns),
            leases,
            me: identity.to_owned(),
            timing,
            member,
            member_held: false,
            electors,
            tx: Arc::new(tx),
            renewers: BTreeMap::new(),
            members_seen: BTreeMap::new(),
            free_since: BTreeMap::new(),
            legacy_seen: None,
            legacy_logged: false,
            looks: 0,
            in_flight,
            status,
        }
    }

    /// One look: heartbeat, list, decide, act.
    async fn tick(&mut self) {
        self.status.beat(beat_limit(&self.timing));
        self.renewers.retain(|_, h| !h.is_finished());
        // The heartbeat is written before the single Lease is read (modes.rs): a shard
        // is taken only in a look whose heartbeat went through.
        let registered = self.heartbeat().await;
        let list =
            ListParams::default().labels(&format!("{LABEL_GROUP}={}", self.leases.lease_name));
        let leases = match timeout(self.timing.renew_deadline, self.api.list(&list)).await {
            Ok(Ok(l)) => l.items,
            Ok(Err(e)) => {
                warn!(
                    "shard leases in {}: listing failed: {}; looking again in a retry period",
                    self.leases.namespace,
                    explain(&e, &self.leases.namespace)
                );
                return;
            }
            Err(_) => {
                warn!(
                    "shard leases in {}: no answer to the list; looking again in a retry period",
                    self.leases.namespace
                );
                return;
            }
        };
        let now = Instant::now();
        let members = self.live_members(&leases, now);
        match self.legacy_leader().await {
            Legacy::None => self.legacy_logged = false,
            Legacy::Leads(holder) => {
                // It works on every GpuJob: hold nothing beside it.
                if !self.legacy_logged {
                    warn!(
                        lease = %self.leases.lease_name,
                        holder = %holder,
                        "a replica running with --shards 1 holds the single Lease; holding no shard until it is released or expires"
                    );
                    self.legacy_logged = true;
                }
                self.status.metrics.shard_count_conflict.set(1);
                self.give_up_all(members.len()).await;
                return;
            }
            Legacy::Unknown(why) => {
                // Whether a --shards 1 replica leads is unknown: take nothing. Shards
                // already held stay: a --shards 1 replica that acquires the single
                // Lease sees them and steps back before it writes (modes.rs).
                warn!(
                    lease = %self.leases.lease_name,
                    "reading the single Lease failed: {why}; taking no shard in this look"
                );
                return;
            }
        }
        if let Some(other) = other_split(&leases, self.leases.shards, &members) {
            // Two counts, or two maps, split namespaces differently under the same Lease
            // names: hold nothing until every live replica agrees (the alert says so
            // meanwhile).
            if self.status.metrics.shard_count_conflict.get() == 0 {
                error!(
                    replica = %other.replica,
                    its_shards = other.shards,
                    its_map = %other.map,
                    our_shards = self.leases.shards,
                    our_map = SHARD_MAP,
                    "another live replica splits namespaces into shards differently (another --shards, or another release's shard map); holding no shard until all replicas split alike (docs/ha-and-sharding.md, Sharding)"
                );
            }
            self.status.metrics.shard_count_conflict.set(1);
            self.give_up_all(members.len()).await;
            return;
        }
        self.status.metrics.shard_count_conflict.set(0);
        let holders = self.holders(&leases, now).await;
        let decision = balance::decide(&View {
            me: &self.me,
            members: &members,
            holders: &holders,
            lease_duration: self.timing.lease_duration,
        });
        for s in decision.release {
            self.give_up(s, members.len()).await;
        }
        self.looks += 1;
        if self.looks == 1 || !registered {
            return;
        }
        for s in decision.take {
            if !self.tx.borrow().held.contains_key(&s) {
                self.take(s).await;
            }
        }
    }

    /// Whether a replica running with `--shards 1` holds the single Lease (and so works
    /// on every GpuJob). A failed read is no answer, not "nobody".
    async fn legacy_leader(&mut self) -> Legacy {
        let read = timeout(
            self.timing.renew_deadline,
            self.api.get_opt(&self.leases.lease_name),
        )
        .await;
        let lease = match read {
            Ok(Ok(Some(lease))) => lease,
            Ok(Ok(None)) => return Legacy::None,
            Ok(Err(e)) => return Legacy::Unknown(explain(&e, &self.leases.namespace)),
            Err(_) => {
                return Legacy::Unknown(format!(
                    "no answer within {:?}",
                    self.timing.renew_deadline
                ));
            }
        };
        let now = Instant::now();
        let seen = self
            .legacy_seen
            .get_or_insert_with(|| observed(&lease, now));
        update(seen, &lease, now);
        match seen.holder() {
            Some(holder) if seen.held_by_other(&self.me, now) => Legacy::Leads(holder.to_owned()),
            _ => Legacy::None,
        }
    }

    /// Renews (or first takes) this replica's member Lease; whether that went through.
    async fn heartbeat(&mut self) -> bool {
        let attempt = if self.member_held {
            self.member.renew().await
        } else {
            self.member.acquire().await
        };
        match attempt {
            Ok(Attempt::Held { .. }) => {
                self.member_held = true;
                return true;
            }
            Ok(Attempt::Lost) => {
                self.member_held = false;
                warn!(
                    lease = %self.leases.member(&self.me),
                    "member heartbeat: the Lease is held by another replica with this identity; identities must be unique"
                );
            }
            Err(e) => warn!(
                "member heartbeat {}: {}; taking no shard until it goes through; retrying in a retry period",
                self.leases.member(&self.me),
                explain(&e, &self.leases.namespace)
            ),
        }
        false
    }

    /// Replicas whose member heartbeat changed within a lease duration (on this
    /// replica's clock), and this one.
    fn live_members(&mut self, leases: &[Lease], now: Instant) -> BTreeSet<String> {
        let mut live = BTreeSet::from([self.me.clone()]);
        let prefix = format!("{}-member-", self.leases.lease_name);
        for lease in leases {
            let name = lease.metadata.name.clone().unwrap_or_default();
            if !name.starts_with(&prefix) {
                continue;
            }
            let seen = self
                .members_seen
                .entry(name)
                .or_insert_with(|| observed(lease, now));
            update(seen, lease, now);
            if let Some(holder) = seen.holder()
                && (holder == self.me || seen.held_by_other(&self.me, now))
            {
                live.insert(holder.to_owned());
            }
        }
        live
    }

    /// Who holds each shard, as this replica sees it.
    async fn holders(&mut self, leases: &[Lease], now: Instant) -> Vec<Holder> {
        let by_name: BTreeMap<String, &Lease> = leases
            .iter()
            .filter_map(|l| Some((l.metadata.name.clone()?, l)))
            .collect();
        let held = self.tx.borrow().held.clone();
        let mut holders = Vec::new();
        for (i, elector) in self.electors.iter().enumerate() {
            let shard = u32::try_from(i).unwrap_or(u32::MAX);
            if held.contains_key(&shard) {
                self.free_since.remove(&shard);
                holders.push(Holder::Held(self.me.clone()));
                continue;
            }
            let other = match by_name.get(elector.name()) {
                Some(lease) => {
                    elector.observe(lease).await;
                    elector
                        .seen()
                        .await
                        .filter(|o| o.held_by_other(&self.me, now))
                        .and_then(|o| o.holder().map(str::to_owned))
                }
                None => None,
            };
            holders.push(match other {
                Some(holder) => {
                    self.free_since.remove(&shard);
                    Holder::Held(holder)
                }
                // Free, expired, or still naming this replica from an earlier term.
                None => {
                    let since = *self.free_since.entry(shard).or_insert(now);
                    Holder::Free(now.saturating_duration_since(since))
                }
            });
        }
        holders
    }

    async fn take(&mut self, shard: u32) {
        let elector = self.electors[shard as usize].clone();
        let attempt = timeout(self.timing.renew_deadline, elector.acquire()).await;
        let (sent, transitions) = match attempt {
            Ok(Ok(Attempt::Held { sent, transitions })) => (sent, transitions),
            Ok(Ok(Attempt::Lost)) => return,
            Ok(Err(e)) => {
                warn!(
                    shard,
                    "taking the shard failed: {}; looking again in a retry period",
                    explain(&e, elector.namespace())
                );
                return;
            }
            Err(_) => {
                warn!(
                    shard,
                    "taking the shard: no answer; looking again in a retry period"
                );
                return;
            }
        };
        let token = format!("{}/{transitions}", elector.name());
        let tenure = Tenure::gained(Some(sent + self.timing.renew_deadline), Some(token));
        info!(
            shard,
            epoch = tenure.epoch,
            token = tenure.token.as_deref().unwrap_or_default(),
            "shard gained: reconciling its GpuJobs"
        );
        let epoch = tenure.epoch;
        self.tx.send_modify(|o| {
            o.held.insert(shard, tenure);
        });
        self.free_since.remove(&shard);
        gained_or_lost(&self.status.metrics, &self.tx.borrow());
        let renewer = renew(
            elector,
            shard,
            epoch,
            self.timing.clone(),
            self.tx.clone(),
            self.status.clone(),
        );
        self.renewers.insert(shard, tokio::spawn(renewer));
    }

    /// Drains `shard` and releases its Lease, so a replica with room takes it at once.
    async fn give_up(&mut self, shard: u32, live: usize) {
        let Some(epoch) = self.tx.borrow().tenure(shard).map(|t| t.epoch) else {
            return;
        };
        info!(
            shard,
            epoch,
            live_replicas = live,
            "shard over this replica's share: draining it, then releasing its lease"
        );
        self.stop_holding(shard);
        if timeout(self.timing.renew_deadline, self.in_flight.idle(shard))
            .await
            .is_err()
        {
            warn!(
                shard,
                "reconciles of the shard did not end within the renew deadline; releasing anyway (their writes are fenced)"
            );
        }
        match timeout(
            self.timing.renew_deadline,
            self.electors[shard as usize].release(),
        )
        .await
        {
            Ok(Ok(true)) => info!(shard, epoch, "shard released"),
            Ok(Ok(false)) => info!(
                shard,
                epoch, "shard lease was no longer ours; nothing to release"
            ),
            Ok(Err(e)) => warn!(
                shard,
                "releasing the shard failed: {}; it expires after the lease duration",
                explain(&e, &self.leases.namespace)
            ),
            Err(_) => warn!(
                shard,
                "releasing the shard: no answer; it expires after the lease duration"
            ),
        }
    }

    /// Drains and releases every held shard (another writer may be live beside this one).
    async fn give_up_all(&mut self, live: usize) {
        let held: Vec<u32> = self.tx.borrow().held.keys().copied().collect();
        for s in held {
            self.give_up(s, live).await;
        }
    }

    /// `shard` leaves the ownership (its reconciles stop, its writes are fenced).
    fn stop_holding(&mut self, shard: u32) {
        if let Some(h) = self.renewers.remove(&shard) {
            h.abort();
        }
        let removed = self
            .tx
            .send_if_modified(|o| o.held.remove(&shard).is_some());
        if removed {
            gained_or_lost(&self.status.metrics, &self.tx.borrow());
        }
    }

    /// The controller has drained: give everything up.
    async fn shut_down(mut self) {
        let held: Vec<u32> = self.tx.borrow().held.keys().copied().collect();
        for shard in &held {
            self.stop_holding(*shard);
        }
        let releases = held.iter().map(|s| {
            let elector = self.electors[*s as usize].clone();
            async move { timeout(self.timing.renew_deadline, elector.release()).await }
        });
        let released = futures::future::join_all(releases).await;
        let ok = released
            .iter()
            .filter(|r| matches!(r, Ok(Ok(true))))
            .count();
        info!(
            shards = ok,
            "shard leases released: other replicas take them at once"
        );
        if self.member_held {
            let _ = timeout(self.timing.renew_deadline, self.member.release()).await;
        }
        report(&self.status.metrics, &self.tx.borrow());
    }
}

/// Renews one held shard every retry period until a renewal is refused or the renew
/// deadline passes without one; then the shard leaves the ownership.
async fn renew(
    elector: Arc<Elector>,
    shard: u32,
    epoch: u64,
    timing: Timing,
    tx: Arc<watch::Sender<Ownership>>,
    status: Arc<Status>,
) {
    loop {
        tokio::time::sleep(jitter(timing.retry_period)).await;
        let deadline = tx
            .borrow()
            .tenure(shard)
            .filter(|t| t.epoch == epoch)
            .and_then(|t| t.deadline);
        let Some(deadline) = deadline else {
            return; // given up meanwhile
        };
        let left = deadline.saturating_duration_since(Instant::now());
        match timeout(left, elector.renew()).await {
            Ok(Ok(Attempt::Held { sent, .. })) => {
                tx.send_modify(|o| {
                    if let Some(t) = o.held.get_mut(&shard).filter(|t| t.epoch == epoch) {
                        t.deadline = Some(sent + timing.renew_deadline);
                    }
                });
            }
            Ok(Ok(Attempt::Lost)) => {
                warn!(
                    shard,
                    epoch, "shard lease held by another replica now; letting the shard go"
                );
                break;
            }
            Ok(Err(e)) if Instant::now() < deadline => {
                warn!(
                    shard,
                    "renewing the shard failed: {}; retrying until the renew deadline",
                    explain(&e, elector.namespace())
                );
            }
            Ok(Err(e)) => {
                warn!(
                    shard,
                    "renewing the shard failed past the renew deadline: {}; letting it go",
                    explain(&e, elector.namespace())
                );
                break;
            }
            Err(_) => {
                warn!(
                    shard,
                    "no renewal of the shard within the renew deadline; letting it go"
                );
                break;
            }
        }
    }
    let lost = tx.send_if_modified(|o| {
        o.held.get(&shard).is_some_and(|t| t.epoch == epoch) && o.held.remove(&shard).is_some()
    });
    if lost {
        info!(
            shard,
            epoch, "shard lost: its reconciles stop, its writes are fenced"
        );
        gained_or_lost(&status.metrics, &tx.borrow());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(other_split(&same, 6, &live), None);
        let mixed = [member("a", Some("6")), member("b", Some("3"))];
        assert_eq!(
            other_split(&mixed, 6, &live),
            Some(OtherSplit {
                replica: "b".to_owned(),
                shards: 3,
                map: SHARD_MAP.to_owned()
            })
        );
        // A member that is gone, or that predates the label, says nothing.
        let gone = [member("a", Some("6")), member("c", Some("3"))];
        assert_eq!(other_split(&gone, 6, &live), None);
        let unlabelled = [member("b", None)];
        assert_eq!(other_split(&unlabelled, 6, &live), None);
        // Shard Leases are not members.
        let mut shard = member("b", Some("3"));
        shard
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(LABEL_ROLE.to_owned(), "shard".to_owned());
        assert_eq!(other_split(&[shard], 6, &live), None);
    }

    #[test]
    fn a_live_member_with_another_map_is_a_conflict() {
        let live = BTreeSet::from(["a".to_owned(), "b".to_owned()]);
        // Written before the map label: today's map, no conflict.
        let unlabelled = [member("a", Some("6")), member_mapped("b", Some("6"), None)];
        assert_eq!(other_split(&unlabelled, 6, &live), None);
        // The same count under another map (a later release's, say).
        let other = [
            member("a", Some("6")),
            member_mapped("b", Some("6"), Some("ranges")),
        ];
        assert_eq!(
            other_split(&other, 6, &live),
            Some(OtherSplit {
                replica: "b".to_owned(),
                shards: 6,
                map: "ranges".to_owned()
            })
        );
    }
}
