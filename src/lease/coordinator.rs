//! The one lease loop, for any `--shards N` (N = 1 included). Shard i is guarded by
//! Lease `<lease-name>-shard-<i>`, and with one shard by `<lease-name>` itself (the
//! Lease users know; replicas of earlier releases share it). Every retry period (with
//! jitter) a coordinator renews its member heartbeat Lease,
//! `<lease-name>-member-<identity>` (not with one shard: `modes.rs`), lists the group's
//! Leases (one call), works out the live replicas (a member whose record changed within
//! a lease duration on this replica's own clock, the same rule as for shard Leases) and
//! who holds what, and takes or gives up shards as [`balance::decide`] says. Each held
//! shard is renewed by a task of its own (`renew.rs`).
//!
//! Replicas with different `--shards`, or different shard maps, never write one
//! namespace both: `modes.rs` says how.
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
use super::group::{LABEL_GROUP, ShardLeases, other_split};
use super::modes::live_sharded;
use super::renew::renew;
use super::{
    Attempt, Elector, InFlight, Observed, Ownership, Tenure, Timing, beat_limit, explain,
    gained_or_lost, jitter, report,
};
use crate::health::Status;
use gpujob_core::lease::{observed, update};

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
    /// The member heartbeat; none with one shard (`modes.rs`).
    member: Option<Elector>,
    member_held: bool,
    electors: Vec<Arc<Elector>>,
    tx: Arc<watch::Sender<Ownership>>,
    renewers: BTreeMap<u32, JoinHandle<()>>,
    /// Other replicas' member Leases as last seen (by Lease name), for their liveness.
    members_seen: BTreeMap<String, Observed>,
    /// With one shard: the group's member and shard Leases as last seen, for whether a
    /// sharded replica is live.
    sharded_seen: BTreeMap<String, Observed>,
    /// Since when each shard has been seen free.
    free_since: BTreeMap<u32, Instant>,
    /// With more than one shard: the single Lease of `--shards 1`, as last seen.
    legacy_seen: Option<Observed>,
    /// Whether the current wait behind replicas with another count has been logged.
    conflict_logged: bool,
    /// With one shard: the holder this standby last said it waits on.
    standing_by: Option<String>,
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
        let electors = (0..leases.shards().max(1))
            .map(|i| {
                Arc::new(
                    Elector::new(
                        client.clone(),
                        &ns,
                        &leases.shard(i),
                        identity,
                        timing.clone(),
                    )
                    .with_labels(leases.shard_labels()),
                )
            })
            .collect();
        let member = (!leases.single()).then(|| {
            Elector::new(
                client.clone(),
                &ns,
                &leases.member(identity),
                identity,
                timing.clone(),
            )
            .with_labels(leases.member_labels())
        });
        tx.send_replace(Ownership::nothing_in(leases.map.clone()));
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
            sharded_seen: BTreeMap::new(),
            free_since: BTreeMap::new(),
            legacy_seen: None,
            conflict_logged: false,
            standing_by: None,
            looks: 0,
            in_flight,
            status,
        }
    }

    /// One look: heartbeat, list, decide, act.
    async fn tick(&mut self) {
        self.status.beat(beat_limit(&self.timing));
        self.renewers.retain(|_, h| !h.is_finished());
        let single = self.leases.single();
        if single && self.tx.borrow().holds_any() {
            // Nothing to decide while holding the one shard: its renewer keeps it, and
            // sharded replicas wait for it (modes.rs).
            return;
        }
        // The heartbeat is written before the single Lease is read (modes.rs): a shard
        // is taken only in a look whose heartbeat went through.
        let registered = self.heartbeat().await;
        let Some(leases) = self.list().await else {
            return;
        };
        let now = Instant::now();
        let members = if single {
            BTreeSet::from([self.me.clone()])
        } else {
            self.live_members(&leases, now.into_std())
        };
        if !self.may_take(&leases, &members).await {
            return;
        }
        let holders = self.holders(&leases, now).await;
        let view = View {
            me: &self.me,
            members: &members,
            holders: &holders,
            lease_duration: self.timing.lease_duration,
        };
        let decision = balance::decide(&view);
        let warm = if single {
            BTreeSet::new()
        } else {
            balance::successor_of(&view)
        };
        self.tx.send_if_modified(|o| {
            let changed = o.warm != warm;
            o.warm = warm;
            changed
        });
        for s in decision.release {
            self.give_up(s, members.len()).await;
        }
        self.looks += 1;
        // With one shard there is nobody to register with first.
        if (self.looks == 1 && !single) || !registered {
            return;
        }
        for s in decision.take {
            if !self.tx.borrow().held.contains_key(&s) {
                self.take(s).await;
            }
        }
        if single {
            self.say_standing_by().await;
        }
    }

    /// One list of the group's Leases; `None` (logged) when it failed.
    async fn list(&self) -> Option<Vec<Lease>> {
        let list =
            ListParams::default().labels(&format!("{LABEL_GROUP}={}", self.leases.lease_name));
        match timeout(self.timing.renew_deadline, self.api.list(&list)).await {
            Ok(Ok(l)) => Some(l.items),
            Ok(Err(e)) => {
                warn!(
                    "shard leases in {}: listing failed: {}; looking again in a retry period",
                    self.leases.namespace,
                    explain(&e, &self.leases.namespace)
                );
                None
            }
            Err(_) => {
                warn!(
                    "shard leases in {}: no answer to the list; looking again in a retry period",
                    self.leases.namespace
                );
                None
            }
        }
    }

    /// Whether no live replica splits namespaces differently (modes.rs), so this look
    /// may take shards. With more than one shard, a replica that does gives up what it
    /// holds; with one, a live sharded replica only keeps this one from taking the Lease.
    async fn may_take(&mut self, leases: &[Lease], members: &BTreeSet<String>) -> bool {
        let status = self.status.clone();
        let conflict = &status.metrics.shard_count_conflict;
        if self.leases.single() {
            let Some(peer) = live_sharded(
                leases,
                &mut self.sharded_seen,
                &self.me,
                Instant::now().into_std(),
            ) else {
                conflict.set(0);
                self.conflict_logged = false;
                return true;
            };
            if !self.conflict_logged {
                warn!(
                    lease = %self.leases.lease_name,
                    replica = %peer.identity,
                    its_shards = peer.shards.map(|n| n.to_string()).unwrap_or_else(|| "unknown".to_owned()),
                    "a replica running with more than one shard is live; this --shards 1 replica takes no Lease until every sharded replica is gone (docs/ha-and-sharding.md, Sharding)"
                );
                self.conflict_logged = true;
            }
            conflict.set(1);
            return false;
        }
        match self.legacy_leader().await {
            Legacy::None => self.conflict_logged = false,
            Legacy::Leads(holder) => {
                // It works on every GpuJob: hold nothing beside it.
                if !self.conflict_logged {
                    warn!(
                        lease = %self.leases.lease_name,
                        holder = %holder,
                        "a replica running with --shards 1 holds the single Lease; holding no shard until it is released or expires"
                    );
                    self.conflict_logged = true;
                }
                conflict.set(1);
                self.give_up_all(members.len()).await;
                return false;
            }
            Legacy::Unknown(why) => {
                // Whether a --shards 1 replica leads is unknown: take nothing. Shards
                // already held stay: a --shards 1 replica that acquires the single
                // Lease sees them and steps back before it writes (modes.rs).
                warn!(
                    lease = %self.leases.lease_name,
                    "reading the single Lease failed: {why}; taking no shard in this look"
                );
                return false;
            }
        }
        if let Some(other) = other_split(leases, &self.leases.map, members) {
            // Two counts, or two maps, split namespaces differently under the same Lease
            // names: hold nothing until every live replica agrees (the alert says so
            // meanwhile).
            if conflict.get() == 0 {
                error!(
                    replica = %other.replica,
                    its_shards = other.shards,
                    its_map = %other.map,
                    our_shards = self.leases.shards(),
                    our_map = %self.leases.map.name(),
                    "another live replica splits namespaces into shards differently (another --shards, or another release's shard map); holding no shard until all replicas split alike (docs/ha-and-sharding.md, Sharding)"
                );
            }
            conflict.set(1);
            self.give_up_all(members.len()).await;
            return false;
        }
        conflict.set(0);
        true
    }

    /// With one shard: says once per holder whom this standby waits on.
    async fn say_standing_by(&mut self) {
        if self.tx.borrow().holds_any() {
            self.standing_by = None;
            return;
        }
        let now = Instant::now().into_std();
        let holder = self.electors[0]
            .seen()
            .await
            .filter(|o| o.held_by_other(&self.me, now))
            .and_then(|o| o.holder().map(str::to_owned));
        if holder.is_some() && holder != self.standing_by {
            info!(
                lease = %self.leases.lease_name,
                leader = holder.as_deref().unwrap_or_default(),
                "lease held by another replica: this replica stands by"
            );
            self.standing_by = holder;
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
        let now = Instant::now().into_std();
        let seen = self
            .legacy_seen
            .get_or_insert_with(|| observed(&lease, now));
        update(seen, &lease, now);
        match seen.holder() {
            Some(holder) if seen.held_by_other(&self.me, now) => Legacy::Leads(holder.to_owned()),
            _ => Legacy::None,
        }
    }

    /// Renews (or first takes) this replica's member Lease; whether that went through
    /// (always, with one shard: there is none).
    async fn heartbeat(&mut self) -> bool {
        let Some(member) = &self.member else {
            return true;
        };
        let attempt = timeout(self.timing.renew_deadline, async {
            if self.member_held {
                member.renew().await
            } else {
                member.acquire().await
            }
        })
        .await;
        match attempt {
            Ok(Ok(Attempt::Held { .. })) => {
                self.member_held = true;
                return true;
            }
            Ok(Ok(Attempt::Lost)) => {
                self.member_held = false;
                warn!(
                    lease = %self.leases.member(&self.me),
                    "member heartbeat: the Lease is held by another replica with this identity; identities must be unique"
                );
            }
            Ok(Err(e)) => warn!(
                "member heartbeat failed: {}: {}; taking no shard until it goes through; retrying in a retry period",
                self.leases.member(&self.me),
                explain(&e, &self.leases.namespace)
            ),
            Err(_) => warn!(
                "member heartbeat failed: {}: no answer within {:?}; taking no shard until it goes through",
                self.leases.member(&self.me),
                self.timing.renew_deadline
            ),
        }
        false
    }

    /// Replicas whose member heartbeat changed within a lease duration (on this
    /// replica's clock), and this one.
    fn live_members(&mut self, leases: &[Lease], now: std::time::Instant) -> BTreeSet<String> {
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
                        .filter(|o| o.held_by_other(&self.me, now.into_std()))
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
                    shard, lease = %elector.name(),
                    "lease: acquiring failed: {}; looking again in a retry period",
                    explain(&e, elector.namespace())
                );
                return;
            }
            Err(_) => {
                warn!(
                    shard, lease = %elector.name(),
                    "lease: no answer to acquiring it; looking again in a retry period"
                );
                return;
            }
        };
        if self.leases.single() && !self.still_alone().await {
            self.hand_back(&elector).await;
            return;
        }
        let token = format!("{}/{transitions}", elector.name());
        let tenure = Tenure::gained(Some(sent + self.timing.renew_deadline), Some(token));
        info!(
            shard,
            lease = %elector.name(),
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

    /// With one shard, right after taking the Lease and before any write: whether no
    /// sharded replica is live (modes.rs). A failed list counts as one.
    async fn still_alone(&mut self) -> bool {
        let Some(leases) = self.list().await else {
            return false;
        };
        live_sharded(
            &leases,
            &mut self.sharded_seen,
            &self.me,
            Instant::now().into_std(),
        )
        .is_none()
    }

    /// Gives back a Lease taken in this look, before anything was written in its term.
    async fn hand_back(&self, elector: &Elector) {
        let lease = elector.name();
        match timeout(self.timing.renew_deadline, elector.release()).await {
            Ok(Ok(_)) => {
                info!(lease = %lease, "lease handed back unused: a sharded replica is live, or the list that would say failed")
            }
            Ok(Err(e)) => warn!(lease = %lease,
                "lease: handing it back failed: {}; it expires after the lease duration (this replica does not lead)",
                explain(&e, elector.namespace())
            ),
            Err(_) => warn!(lease = %lease,
                "lease: no answer to handing it back; it expires after the lease duration (this replica does not lead)"
            ),
        }
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
        if !held.is_empty() {
            info!(
                shards = ok,
                of = held.len(),
                "lease released for the shards held: other replicas take them at once"
            );
        }
        if let Some(member) = self.member.as_ref().filter(|_| self.member_held) {
            let _ = timeout(self.timing.renew_deadline, member.release()).await;
        }
        report(&self.status.metrics, &self.tx.borrow());
    }
}
