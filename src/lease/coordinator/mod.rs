//! The one lease loop, for any `--shards N` (N = 1 included). Shard i is guarded by
//! Lease `<lease-name>-shard-<i>`, and with one shard by `<lease-name>` itself (the
//! Lease users know; replicas of earlier releases share it). A sharded replica's member
//! heartbeat Lease, `<lease-name>-member-<identity>` (none with one shard: `modes.rs`),
//! is renewed by a task of its own (`heartbeat.rs`). Every retry period (with jitter;
//! with the kept map also as soon as a Lease changes in a way a look acts on: `wake.rs`)
//! the coordinator lists the group's Leases (one call), works out the live replicas of
//! its split (a member whose record changed within a lease duration on this replica's
//! own clock, the same rule as for shard Leases) and who holds what, and takes or gives
//! up shards as [`balance::decide`] says, all its takes at once. Each held shard is
//! renewed by a task of its own (`renew.rs`).
//!
//! Replicas with different `--shards`, shard maps or settings never write one namespace
//! both, and while they meet the established ones keep working: `modes.rs` says how.
//!
//! Giving a shard up drains it: it leaves the published ownership (no new keys, its
//! reconciles are cancelled, its writes fenced), and a task of its own waits until none
//! of its reconciles runs, then releases the Lease with an empty holder, so another
//! replica takes it on its next look instead of after a lease duration. The look goes
//! on meanwhile: a slow drain does not hold up the loop, nor /healthz.
//!
//! What differs between one shard and many is [`Mode`], each behaviour once; the
//! decisions themselves are pure (`modes.rs`, [`holders`], [`balance::decide`]) and take
//! the instant of the look, so they are tested without an API server or a running clock.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use gpujob_core::lease::Observed;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Preconditions};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{Instant, timeout};
use tracing::{debug, error, info, warn};

use super::balance::{self, Holder, View};
use super::group::{LABEL_GROUP, LABEL_ROLE, ShardLeases};
use super::heartbeat::Heartbeat;
use super::kept::Kept;
use super::load::Load;
use super::modes::{Gate, Gone, MEMBER_GONE_LEASE_DURATIONS, Sharded, Single, SingleLease};
use super::renew::renew;
use super::{
    Attempt, Elector, InFlight, Ownership, Tenure, Timing, beat_limit, explain, gained_or_lost,
    jitter, report,
};
use crate::health::Status;

mod map;
mod wake;
mod warm;

/// The lease loop's wiring, built once by main.
pub struct Params {
    /// The client for Leases (a budget of its own: reconcile traffic never starves
    /// renewals).
    pub client: Client,
    /// Where the Leases live, and the shards they guard.
    pub leases: ShardLeases,
    /// This replica's name, written as the holder of what it takes.
    pub identity: String,
    pub timing: Timing,
    /// Where the shards held are published.
    pub tx: watch::Sender<Ownership>,
    /// Reconciles running per shard: a shard given up is released once none runs.
    pub in_flight: InFlight,
    /// GpuJobs per namespace held, stated on the held shards' Leases for the kept map.
    pub load: Load,
    /// The least time between two re-cuts of the kept map (`--recut-interval`).
    pub recut_interval: Duration,
    /// How long the API server may keep a watch of the Leases open (`wake.rs`): less
    /// than the client's read timeout.
    pub watch_timeout: Duration,
    /// The lease loop's heartbeat for /healthz, and the metrics.
    pub status: Arc<Status>,
}

impl std::fmt::Debug for Params {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Params")
            .field("leases", &self.leases)
            .field("identity", &self.identity)
            .field("timing", &self.timing)
            .finish_non_exhaustive()
    }
}

/// Holds shards until `stop`, publishing them on `params.tx`; then drains and releases
/// every held shard and the member heartbeat. `stop` must resolve only once the
/// controller has drained (held shards are renewed meanwhile).
pub async fn run(params: Params, stop: impl Future<Output = ()>) {
    let mut c = Coordinator::new(params);
    let watch = c.kept.is_some().then(|| {
        let leases = &c.group.leases;
        tokio::spawn(wake::watch(
            c.group.api.clone(),
            leases.namespace.clone(),
            // Shard Leases and the map: a member's heartbeat is no news (a new member is
            // balanced at the next look, as the new member itself takes a period to).
            format!(
                "{LABEL_GROUP}={},{LABEL_ROLE} in (shard,shard-map)",
                leases.lease_name
            ),
            c.watch_timeout,
            c.wake.clone(),
            c.tx.subscribe(),
        ))
    });
    tokio::pin!(stop);
    loop {
        c.tick().await;
        tokio::select! {
            _ = tokio::time::sleep(jitter(c.next_look_in())) => {}
            _ = c.woken() => {}
            _ = &mut stop => break,
        }
    }
    if let Some(w) = watch {
        w.abort();
    }
    c.shut_down().await;
}

/// The group's Leases: where they live, and how long a call about them may take.
struct Group {
    api: Api<Lease>,
    leases: ShardLeases,
    timing: Timing,
}

impl Group {
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

    /// The single Lease of `--shards 1`, read by a sharded replica. A failed read is no
    /// answer, not "nobody".
    async fn single(&self) -> SingleLease {
        let read = timeout(
            self.timing.renew_deadline,
            self.api.get_opt(&self.leases.lease_name),
        )
        .await;
        match read {
            Ok(Ok(Some(lease))) => SingleLease::Found(Box::new(lease)),
            Ok(Ok(None)) => SingleLease::Missing,
            Ok(Err(e)) => SingleLease::Failed(explain(&e, &self.leases.namespace)),
            Err(_) => {
                SingleLease::Failed(format!("no answer within {:?}", self.timing.renew_deadline))
            }
        }
    }
}

/// What differs between `--shards 1` and `--shards N > 1` (`modes.rs` says why), each
/// behaviour once: the coordinator runs the same look for both and asks its mode at
/// each step where they differ.
#[allow(clippy::large_enum_variant)] // one per process
enum Mode {
    /// Plain leader election on `<lease-name>`: no member heartbeat; the group is read
    /// only for whether a sharded replica is live.
    Single(Single),
    /// A member heartbeat renewed by its own task, and the single Lease of `--shards 1`
    /// read in every look.
    Sharded {
        rules: Sharded,
        /// This replica's member heartbeat, `<lease-name>-member-<identity>`.
        heartbeat: Heartbeat,
    },
}

impl Mode {
    /// The one place that asks how many shards there are.
    fn new(
        client: &Client,
        leases: &ShardLeases,
        identity: &str,
        timing: &Timing,
        tx: &Arc<watch::Sender<Ownership>>,
        status: &Arc<Status>,
    ) -> Mode {
        if leases.single() {
            return Mode::Single(Single::new(identity));
        }
        let member = Elector::new(
            client.clone(),
            &leases.namespace,
            &leases.member(identity),
            identity,
            timing.clone(),
        )
        .with_labels(leases.member_labels());
        Mode::Sharded {
            rules: Sharded::new(
                identity,
                &leases.lease_name,
                leases.split(),
                timing.lease_duration,
            ),
            heartbeat: Heartbeat::start(member, tx.clone(), status.clone()),
        }
    }

    /// Whether this look has nothing to decide: with one shard, while holding it (its
    /// renewer keeps it, and sharded replicas wait for it).
    fn rests(&self, own: &Ownership) -> bool {
        match self {
            Mode::Single(_) => own.holds_any(),
            Mode::Sharded { .. } => false,
        }
    }

    /// Whether this replica's member heartbeat is through at `now` (always, with one
    /// shard: there is none): a look that starts so may take shards.
    fn registered(&self, now: Instant) -> bool {
        match self {
            Mode::Single(_) => true,
            Mode::Sharded { heartbeat, .. } => heartbeat.through(now),
        }
    }

    /// The live replicas of this split, this one included, from the group as listed at
    /// `now`.
    fn members(&mut self, leases: &[Lease], now: std::time::Instant) -> BTreeSet<String> {
        match self {
            Mode::Single(rules) => rules.members(),
            Mode::Sharded { rules, .. } => rules.members(leases, now),
        }
    }

    /// Member Leases released or expired for longer than `after` on this replica's clock
    /// (after [`Mode::gate`] in the same look: both modes have taken the list in).
    fn gone_members(
        &self,
        leases: &[Lease],
        after: Duration,
        now: std::time::Instant,
    ) -> Vec<Gone> {
        match self {
            Mode::Single(rules) => rules.gone_members(leases, after, now),
            Mode::Sharded { rules, .. } => rules.gone_members(leases, after, now),
        }
    }

    /// Whether this look may take shards: no replica of another split holds one or
    /// comes first (a sharded replica reads the single Lease for it). `holding`: this
    /// replica holds shards.
    async fn gate(
        &mut self,
        group: &Group,
        leases: &[Lease],
        holding: bool,
        now: std::time::Instant,
    ) -> Gate {
        match self {
            Mode::Single(rules) => rules.gate(leases, now),
            Mode::Sharded { rules, .. } => {
                let single = group.single().await;
                rules.gate(single, leases, holding, Instant::now().into_std())
            }
        }
    }

    /// The shards to keep warm: those this replica would take if another went (none
    /// with one shard).
    fn warm(&self, view: &View<'_>) -> BTreeSet<u32> {
        match self {
            Mode::Single(_) => BTreeSet::new(),
            Mode::Sharded { .. } => balance::successor_of(view),
        }
    }

    /// After releasing: whether this look may take shards (with one shard there is
    /// nobody to register with first).
    fn ready(&mut self, registered: bool) -> bool {
        match self {
            Mode::Single(_) => registered,
            Mode::Sharded { rules, .. } => rules.ready(registered),
        }
    }

    /// Right after acquiring shard Leases, before anything is written in their terms:
    /// the second list, if it shows no live replica that splits otherwise holding (with
    /// one shard: no live sharded replica), else `None`; a failed list counts as one
    /// (modes.rs).
    async fn keeps(&mut self, group: &Group) -> Option<Vec<Lease>> {
        let leases = group.list().await;
        let now = Instant::now().into_std();
        let alone = match self {
            Mode::Single(rules) => rules.still_alone(leases.as_deref(), now),
            Mode::Sharded { rules, .. } => rules.still_alone(leases.as_deref(), now),
        };
        leases.filter(|_| alone)
    }

    /// At the end of a look: with one shard, says once per holder whom this standby
    /// waits on.
    async fn after_look(&mut self, group: &Group, own: &Ownership, lease: &Elector) {
        let Mode::Single(rules) = self else {
            return;
        };
        let seen = lease.seen().await;
        let now = Instant::now().into_std();
        if let Some(holder) = rules.standing_by(own.holds_any(), seen.as_ref(), now) {
            info!(
                lease = %group.leases.lease_name,
                leader = holder.as_str(),
                "lease held by another replica: this replica stands by"
            );
        }
    }

    /// Stops the member heartbeat, if there is one, and deletes its Lease
    /// (`heartbeat.rs`).
    async fn shut_down(self, group: &Group) {
        if let Mode::Sharded { heartbeat, .. } = self {
            heartbeat.shut_down(&group.leases.namespace).await;
        }
    }
}

/// Who holds each shard, as this replica sees it at `now`: itself for those in `held`;
/// otherwise the holder its shard's Lease names, as last seen (`seen`, by shard), while
/// that record is live; otherwise nobody, for as long as `free_since` (kept up to date
/// here) says.
fn holders(
    me: &str,
    held: &BTreeSet<u32>,
    seen: &[Option<Observed>],
    free_since: &mut BTreeMap<u32, std::time::Instant>,
    now: std::time::Instant,
) -> Vec<Holder> {
    seen.iter()
        .enumerate()
        .map(|(i, lease)| {
            let shard = u32::try_from(i).unwrap_or(u32::MAX);
            if held.contains(&shard) {
                free_since.remove(&shard);
                return Holder::Held(me.to_owned());
            }
            let other = lease
                .as_ref()
                .filter(|o| o.held_by_other(me, now))
                .and_then(|o| o.holder().map(str::to_owned));
            match other {
                Some(holder) => {
                    free_since.remove(&shard);
                    Holder::Held(holder)
                }
                // Free, expired, or still naming this replica from an earlier term.
                None => {
                    let since = *free_since.entry(shard).or_insert(now);
                    Holder::Free(now.saturating_duration_since(since))
                }
            }
        })
        .collect()
}

/// What the progress gauges say after a look in which this replica could take shards
/// (and could since `could_since`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Unheld {
    /// By shard: how long it has been free while this replica could have taken it (zero
    /// while anyone holds it).
    shards: Vec<Duration>,
    /// How long this replica has held no shard while some shard was free (zero while it
    /// holds one, or while none is free).
    idle: Duration,
}

/// The progress gauges from one look's [`holders`] at `now` (`idle_since` is kept up to
/// date here: since when this replica has held nothing while a shard was free).
fn unheld(
    me: &str,
    holders: &[Holder],
    could_since: std::time::Instant,
    idle_since: &mut Option<std::time::Instant>,
    now: std::time::Instant,
) -> Unheld {
    let could = now.saturating_duration_since(could_since);
    let shards = holders
        .iter()
        .map(|h| match h {
            Holder::Free(free) => (*free).min(could),
            Holder::Held(_) => Duration::ZERO,
        })
        .collect();
    let holds_any = holders
        .iter()
        .any(|h| matches!(h, Holder::Held(m) if m == me));
    let free_any = holders.iter().any(|h| matches!(h, Holder::Free(_)));
    let idle = if holds_any || !free_any {
        *idle_since = None;
        Duration::ZERO
    } else {
        now.saturating_duration_since(*idle_since.get_or_insert(now))
    };
    Unheld { shards, idle }
}

/// Waits until none of `shard`'s reconciles runs (at most `deadline`: their writes are
/// fenced anyway), then releases its Lease.
async fn drain_and_release(
    elector: Arc<Elector>,
    shard: u32,
    epoch: u64,
    in_flight: InFlight,
    deadline: Duration,
) {
    if timeout(deadline, in_flight.idle(shard)).await.is_err() {
        warn!(
            shard,
            "reconciles of the shard did not end within the renew deadline; releasing anyway (their writes are fenced)"
        );
    }
    match timeout(deadline, elector.release()).await {
        Ok(Ok(true)) => info!(shard, epoch, "shard released"),
        Ok(Ok(false)) => info!(
            shard,
            epoch, "shard lease was no longer ours; nothing to release"
        ),
        Ok(Err(e)) => warn!(
            shard,
            "releasing the shard failed: {}; it expires after the lease duration",
            explain(&e, elector.namespace())
        ),
        Err(_) => warn!(
            shard,
            "releasing the shard: no answer; it expires after the lease duration"
        ),
    }
}

struct Coordinator {
    group: Group,
    me: String,
    mode: Mode,
    /// One per shard, by shard number.
    electors: Vec<Arc<Elector>>,
    tx: Arc<watch::Sender<Ownership>>,
    renewers: BTreeMap<u32, JoinHandle<()>>,
    /// Shards given up whose drain and release still run: not taken again before.
    releasing: BTreeMap<u32, JoinHandle<()>>,
    /// The range each shard given up was held with (its Lease claims it until released).
    draining: BTreeMap<u32, gpujob_core::shard::HashRange>,
    /// Since when each shard has been seen free.
    free_since: BTreeMap<u32, std::time::Instant>,
    /// Since when every look could take shards (gate open, heartbeat through, not the
    /// first look): the unheld gauges count from then only.
    could_since: Option<std::time::Instant>,
    /// Since when this replica has held nothing while a shard was free.
    idle_since: Option<std::time::Instant>,
    /// Member Leases the last look judged gone, to delete after it.
    gone: Vec<Gone>,
    in_flight: InFlight,
    /// The kept shard map (`None`: fixed cuts, or one shard).
    kept: Option<Kept>,
    /// Whether a look got as far as the list before (a map followed now is a change
    /// seen while running, not the map found at start).
    looked: bool,
    /// How long the API server may keep the watch of the Leases open.
    watch_timeout: Duration,
    /// Whether a look could take shards before (`Mode::ready`): until then no look
    /// comes sooner than its period.
    taking: bool,
    /// Told by the watch of the group's Leases (`wake.rs`) when a look has something
    /// new to act on.
    wake: Arc<tokio::sync::Notify>,
    /// The term and number of namespaces each held shard's Lease was last told to
    /// state (`state_loads`: a change is renewed at once).
    stated: BTreeMap<u32, (u64, usize)>,
    /// The shards published as kept warm, each for a lease duration after the last look
    /// that computed it so (`warm.rs`).
    warm: warm::Warm,
    load: Load,
    status: Arc<Status>,
}

/// How much sooner the next look comes while a re-cut's hand-over is likely under way.
const HURRIED_LOOKS: u32 = 4;

/// A look woken by a change waits this part of a retry period first, so that changes
/// made together (a hand-over's releases, the renewals under a new map) make one look.
const GATHER: u32 = 16;

impl Coordinator {
    /// A retry period; a quarter of it for a lease duration after the kept map changed
    /// while this replica ran (its hand-over: shards released under it are taken a look
    /// later, and the keeper follows its own write a look later).
    /// The keeper waiting for the namespaces to settle before the first cut looks when
    /// they will have.
    fn next_look_in(&self) -> std::time::Duration {
        let period = self.group.timing.retry_period;
        let now = Instant::now().into_std();
        match &self.kept {
            Some(k) if k.hurrying(now, self.group.timing.lease_duration) => period / HURRIED_LOOKS,
            Some(k) if self.tx.borrow().held.contains_key(&0) => {
                k.first_cut_in(now).map_or(period, |d| d.min(period))
            }
            _ => period,
        }
    }

    /// Resolves when a look should come before its period is up: the group's Leases
    /// changed in a way a look acts on (`wake.rs`), or the namespaces this replica
    /// counts did (stated at once). Only with the kept map, and not before a look could
    /// take shards: the looks up to it stay a retry period apart, so that replicas
    /// started together see each other before they take shards.
    async fn woken(&self) {
        if self.kept.is_none() || !self.taking {
            return std::future::pending().await;
        }
        tokio::select! {
            _ = self.wake.notified() => {}
            _ = self.load.changed() => {}
        }
        tokio::time::sleep(self.group.timing.retry_period / GATHER).await;
    }

    fn new(p: Params) -> Coordinator {
        let Params {
            client,
            leases,
            identity,
            timing,
            tx,
            in_flight,
            load,
            recut_interval,
            watch_timeout,
            status,
        } = p;
        let kept = leases.kept.then(|| Kept::new(recut_interval));
        let electors = (0..leases.shards().max(1))
            .map(|i| {
                Arc::new(
                    Elector::new(
                        client.clone(),
                        &leases.namespace,
                        &leases.shard(i),
                        &identity,
                        timing.clone(),
                    )
                    .with_labels(leases.shard_labels()),
                )
            })
            .collect();
        status
            .metrics
            .lease_duration
            .set(timing.lease_duration.as_secs_f64());
        tx.send_replace(Ownership::nothing_in(leases.map.clone()));
        report(&status.metrics, &tx.borrow());
        let tx = Arc::new(tx);
        let mode = Mode::new(&client, &leases, &identity, &timing, &tx, &status);
        Coordinator {
            group: Group {
                api: Api::namespaced(client, &leases.namespace),
                leases,
                timing,
            },
            me: identity,
            mode,
            electors,
            tx,
            renewers: BTreeMap::new(),
            releasing: BTreeMap::new(),
            draining: BTreeMap::new(),
            free_since: BTreeMap::new(),
            could_since: None,
            idle_since: None,
            gone: Vec::new(),
            in_flight,
            kept,
            looked: false,
            taking: false,
            watch_timeout,
            wake: Arc::new(tokio::sync::Notify::new()),
            stated: BTreeMap::new(),
            warm: warm::Warm::default(),
            load,
            status,
        }
    }

    /// One look, then the deletes of member Leases it found gone.
    async fn tick(&mut self) {
        self.look().await;
        self.delete_gone().await;
    }

    /// One look: list, decide, act.
    async fn look(&mut self) {
        self.status.beat(beat_limit(&self.group.timing));
        self.renewers.retain(|_, h| !h.is_finished());
        self.releasing.retain(|_, h| !h.is_finished());
        let releasing = &self.releasing;
        self.draining.retain(|s, _| releasing.contains_key(s));
        if self.mode.rests(&self.tx.borrow()) {
            // Holding the one shard: nothing is unheld, and this replica is not idle.
            self.could_not();
            return;
        }
        // The heartbeat went through before the list and the single Lease's read
        // (modes.rs): a shard is taken only in a look that starts so.
        let registered = self.mode.registered(Instant::now());
        let Some(leases) = self.group.list().await else {
            self.could_not();
            return;
        };
        let now = Instant::now().into_std();
        let members = self.mode.members(&leases, now);
        self.follow_map(&leases, now);
        self.looked = true;
        let holding = self.tx.borrow().holds_any();
        let gate = self.mode.gate(&self.group, &leases, holding, now).await;
        let after = self.group.timing.lease_duration * MEMBER_GONE_LEASE_DURATIONS;
        self.gone = self.mode.gone_members(&leases, after, now);
        self.say(&gate);
        if let Some(on) = gate.conflict() {
            self.status.metrics.shard_count_conflict.set(i64::from(on));
        }
        if gate.gives_up_all() {
            self.give_up_all(members.len());
        }
        if gate != Gate::Open {
            // Shards are left unheld on purpose (gpujob_shard_count_conflict says why).
            self.could_not();
            return;
        }
        let holders = self.holders(&leases, now).await;
        let view = View {
            me: &self.me,
            members: &members,
            holders: &holders,
            lease_duration: self.group.timing.lease_duration,
        };
        let decision = balance::decide(&view);
        // A shard given up in this look lingers as one computed warm: its next keeper is
        // often this replica (with two replicas, always), and the next look would list
        // it again right after its watches stopped.
        let mut computed = self.mode.warm(&view);
        computed.extend(decision.release.iter().copied());
        // From the ownership as it is now, in one change: a renew loop may lose a shard
        // (and show it warm) meanwhile.
        let (warm, grace) = (&mut self.warm, self.group.timing.lease_duration);
        self.tx.send_if_modified(|o| {
            let held: BTreeSet<u32> = o
                .held
                .keys()
                .filter(|s| !decision.release.contains(s))
                .copied()
                .collect();
            let published = warm.publish(&computed, &o.warm, &held, grace, now);
            let changed = o.warm != published;
            o.warm = published;
            changed
        });
        for s in decision.release {
            self.give_up(s, members.len());
        }
        if !self.mode.ready(registered) {
            self.could_not();
            return;
        }
        self.taking = true;
        self.report_unheld(&holders, now);
        let take: Vec<u32> = {
            let own = self.tx.borrow();
            decision
                .take
                .into_iter()
                .filter(|s| !own.held.contains_key(s) && !self.releasing.contains_key(s))
                .collect()
        };
        let take = self.unclaimed(&take, &leases, now).await;
        self.take(&take).await;
        self.state_loads();
        self.keep_map(&leases, now).await;
        let own = self.tx.borrow().clone();
        self.mode
            .after_look(&self.group, &own, &self.electors[0])
            .await;
    }

    /// A look that could take shards: the unheld gauges from its view.
    fn report_unheld(&mut self, holders: &[Holder], now: std::time::Instant) {
        let since = *self.could_since.get_or_insert(now);
        let u = unheld(&self.me, holders, since, &mut self.idle_since, now);
        let m = &self.status.metrics;
        for (s, d) in u.shards.iter().enumerate() {
            m.shard_unheld
                .with_label_values(&[s.to_string().as_str()])
                .set(d.as_secs_f64());
        }
        m.replica_idle.set(u.idle.as_secs_f64());
    }

    /// A look that could not take shards (it holds the one shard, its view failed, or
    /// it may not take any): no shard is counted unheld by it, nor is it idle.
    fn could_not(&mut self) {
        self.could_since = None;
        self.idle_since = None;
        let m = &self.status.metrics;
        for s in 0..self.electors.len() {
            m.shard_unheld
                .with_label_values(&[s.to_string().as_str()])
                .set(0.0);
        }
        m.replica_idle.set(0.0);
    }

    /// Deletes the member Leases the last look judged gone, each with the uid and
    /// resourceVersion it was judged by (a Lease renewed or created again since stays),
    /// a few per look, all within one renew deadline.
    async fn delete_gone(&mut self) {
        const PER_LOOK: usize = 10;
        let gone: Vec<Gone> = std::mem::take(&mut self.gone)
            .into_iter()
            .take(PER_LOOK)
            .collect();
        if gone.is_empty() {
            return;
        }
        let api = &self.group.api;
        let deletes = gone.iter().map(|g| async move {
            let dp = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: Some(g.uid.clone()),
                    resource_version: Some(g.resource_version.clone()),
                }),
                ..DeleteParams::default()
            };
            (g, api.delete(&g.name, &dp).await)
        });
        let Ok(done) = timeout(
            self.group.timing.renew_deadline,
            futures::future::join_all(deletes),
        )
        .await
        else {
            warn!(
                "deleting member Leases of replicas gone: no answer; trying again in a later look"
            );
            return;
        };
        for (g, result) in done {
            match result {
                Ok(_) => info!(
                    lease = %g.name,
                    gone_for = ?g.for_,
                    "member Lease of a replica gone for over {MEMBER_GONE_LEASE_DURATIONS} lease durations deleted"
                ),
                // Renewed, created again or deleted since it was judged: left as it is.
                Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => debug!(
                    lease = %g.name,
                    code = s.code,
                    "member Lease changed or gone since it was judged gone: not deleted"
                ),
                Err(e) => warn!(
                    lease = %g.name,
                    "deleting the member Lease of a replica gone failed: {}",
                    explain(&e, &self.group.leases.namespace)
                ),
            }
        }
    }

    /// Says why a look takes nothing (once per wait, where it can last).
    fn say(&self, gate: &Gate) {
        let lease = &self.group.leases.lease_name;
        match gate {
            Gate::Open => {}
            Gate::ShardedLive { peer, say: true } => warn!(
                lease = %lease,
                replica = %peer.identity,
                its_shards = peer.shards.map(|n| n.to_string()).unwrap_or_else(|| "unknown".to_owned()),
                "a replica running with more than one shard is live; this --shards 1 replica takes no Lease until every sharded replica is gone (docs/ha-and-sharding.md, Sharding)"
            ),
            Gate::SingleLeads { holder, say: true } => warn!(
                lease = %lease,
                holder = %holder,
                "a replica running with --shards 1 holds the single Lease; holding no shard until it is released or expires"
            ),
            Gate::SingleUnknown(why) => warn!(
                lease = %lease,
                "reading the single Lease failed: {why}; taking no shard in this look"
            ),
            Gate::OtherSplit {
                other,
                holds,
                say: true,
            } => warn!(
                replica = %other.replica,
                its_shards = other.shards,
                its_map = %other.map,
                our_shards = self.group.leases.shards(),
                our_map = %self.group.leases.split().name(),
                "another live replica splits namespaces into shards differently (another --shards, --shard-cuts or quota provider: a rollout) and {}; taking none (docs/ha-and-sharding.md, Rollouts)",
                if *holds {
                    "its split holds the shards: waiting until no live replica of it holds one"
                } else {
                    "nobody holds a shard: its split comes first and takes them, this one waits while it is live"
                }
            ),
            Gate::Contested(other) => debug!(
                replica = %other.replica,
                its_map = %other.map,
                "a replica that splits namespaces differently holds a shard Lease beside this replica's: it hands it back before writing; taking nothing meanwhile"
            ),
            Gate::BothHold(other) => error!(
                replica = %other.replica,
                its_shards = other.shards,
                its_map = %other.map,
                "a replica that splits namespaces differently has held shard Leases beside this replica's for over a lease duration: giving up every shard held (docs/ha-and-sharding.md, Rollouts)"
            ),
            Gate::ShardedLive { .. } | Gate::SingleLeads { .. } | Gate::OtherSplit { .. } => {}
        }
    }

    /// Who holds each shard, as this replica sees it: the Leases of shards it does not
    /// hold are taken in by their electors first.
    async fn holders(&mut self, leases: &[Lease], now: std::time::Instant) -> Vec<Holder> {
        let by_name: BTreeMap<String, &Lease> = leases
            .iter()
            .filter_map(|l| Some((l.metadata.name.clone()?, l)))
            .collect();
        let held: BTreeSet<u32> = self.tx.borrow().held.keys().copied().collect();
        let mut seen = Vec::with_capacity(self.electors.len());
        for (i, elector) in self.electors.iter().enumerate() {
            let shard = u32::try_from(i).unwrap_or(u32::MAX);
            if held.contains(&shard) {
                seen.push(None);
                continue;
            }
            if let Some(lease) = by_name.get(elector.name()) {
                elector.observe(lease).await;
            }
            // A Lease the list leaves out (one an older release wrote, without the
            // group's label) counts as its elector last read it: each take reads it.
            seen.push(elector.seen().await);
        }
        holders(&self.me, &held, &seen, &mut self.free_since, now)
    }

    /// Acquires the Leases of `shards` at once; if any is acquired, lists again and
    /// keeps them only if the mode says so (before anything is written in their terms).
    async fn take(&mut self, shards: &[u32]) {
        for &shard in shards {
            self.claim_at_acquire(shard);
        }
        let acquires = shards.iter().map(|&shard| {
            let elector = self.electors[shard as usize].clone();
            let deadline = self.group.timing.renew_deadline;
            async move { (shard, timeout(deadline, elector.acquire()).await) }
        });
        let mut acquired = Vec::new();
        for (shard, attempt) in futures::future::join_all(acquires).await {
            let elector = &self.electors[shard as usize];
            match attempt {
                Ok(Ok(Attempt::Held { sent, transitions })) => {
                    acquired.push((shard, sent, transitions));
                }
                Ok(Ok(Attempt::Lost)) => {}
                Ok(Err(e)) => warn!(
                    shard, lease = %elector.name(),
                    "lease: acquiring failed: {}; looking again in a retry period",
                    explain(&e, elector.namespace())
                ),
                Err(_) => warn!(
                    shard, lease = %elector.name(),
                    "lease: no answer to acquiring it; looking again in a retry period"
                ),
            }
        }
        if acquired.is_empty() {
            return;
        }
        let Some(second) = self.mode.keeps(&self.group).await else {
            let back = acquired
                .iter()
                .map(|(shard, ..)| self.hand_back(&self.electors[*shard as usize]));
            futures::future::join_all(back).await;
            return;
        };
        // A shard whose range another live Lease claims by now (it acquired while this
        // replica did; the API server ordered the two, so at least one of the second
        // lists sees the other) goes back before anything is written in its term.
        let wanted: Vec<u32> = acquired.iter().map(|(s, ..)| *s).collect();
        let now = Instant::now().into_std();
        let clear = self.unclaimed(&wanted, &second, now).await;
        let (acquired, claimed): (Vec<_>, Vec<_>) =
            acquired.into_iter().partition(|(s, ..)| clear.contains(s));
        if !claimed.is_empty() {
            info!(
                shards = ?claimed.iter().map(|(s, ..)| *s).collect::<Vec<_>>(),
                "another live shard Lease claims part of these shards' ranges (a cut is moving): handing them back"
            );
            let back = claimed
                .iter()
                .map(|(shard, ..)| self.hand_back(&self.electors[*shard as usize]));
            futures::future::join_all(back).await;
        }
        let acquired = self.renew_late(acquired).await;
        let mut unkept = Vec::new();
        for (shard, sent, transitions) in acquired {
            if !self.hold(shard, sent, transitions) {
                unkept.push(shard);
            }
        }
        if !unkept.is_empty() {
            warn!(
                shards = ?unkept,
                "the member heartbeat went stale while taking shards: handing them back"
            );
            let back = unkept
                .iter()
                .map(|shard| self.hand_back(&self.electors[*shard as usize]));
            futures::future::join_all(back).await;
        }
    }

    /// Terms that begin with less than half the renew deadline left (a slow acquire and
    /// the second list after it) are renewed first, so their first renewal is not
    /// already late: a write of this replica's own record, a compare-and-swap, safe at
    /// any time before another replica takes the Lease. Those whose renewal does not go
    /// through are dropped (not held; their Leases run out).
    async fn renew_late(&self, acquired: Vec<(u32, Instant, i32)>) -> Vec<(u32, Instant, i32)> {
        let rd = self.group.timing.renew_deadline;
        let renewals = acquired.into_iter().map(|(shard, sent, transitions)| {
            let elector = self.electors[shard as usize].clone();
            async move {
                if Instant::now() < sent + rd / 2 {
                    return Some((shard, sent, transitions));
                }
                match timeout(rd, elector.renew()).await {
                    Ok(Ok(Attempt::Held { sent, transitions })) => Some((shard, sent, transitions)),
                    other => {
                        warn!(
                            shard, lease = %elector.name(),
                            "lease acquired late in its term and not renewed before holding it ({other:?}); not held, looking again in a retry period"
                        );
                        None
                    }
                }
            }
        });
        futures::future::join_all(renewals)
            .await
            .into_iter()
            .flatten()
            .collect()
    }

    /// `shard`'s Lease was acquired (renewal sent at `sent`) and kept: it joins the
    /// ownership, and a task of its own renews it; unless the member heartbeat is stale
    /// by then (checked under the ownership's lock, which the step-down takes too), and
    /// then `false`.
    fn hold(&mut self, shard: u32, sent: Instant, transitions: i32) -> bool {
        let elector = self.electors[shard as usize].clone();
        let token = format!("{}/{transitions}", elector.name());
        let tenure = Tenure::gained(Some(sent + self.group.timing.renew_deadline), Some(token));
        let epoch = tenure.epoch;
        let token = tenure.token.clone();
        let warm = &mut self.warm;
        let held = self.tx.send_if_modified(|o| {
            let through = o.heartbeat_valid_at(Instant::now());
            if through {
                o.held.insert(shard, tenure);
                // Held, not warm: should its renewals fail later, the renew loop shows
                // it warm again, and the next look takes that for a loss.
                o.warm.remove(&shard);
                warm.taken(shard);
            }
            through
        });
        if !held {
            return false;
        }
        info!(
            shard,
            lease = %elector.name(),
            epoch,
            token = token.as_deref().unwrap_or_default(),
            "shard gained: reconciling its GpuJobs"
        );
        self.free_since.remove(&shard);
        gained_or_lost(&self.status.metrics, &self.tx.borrow(), 1);
        let renewer = renew(
            elector,
            shard,
            epoch,
            self.group.timing.clone(),
            self.tx.clone(),
            self.status.clone(),
        );
        self.renewers.insert(shard, tokio::spawn(renewer));
        true
    }

    /// Gives back a Lease taken in this look, before anything was written in its term.
    async fn hand_back(&self, elector: &Elector) {
        let lease = elector.name();
        match timeout(self.group.timing.renew_deadline, elector.release()).await {
            Ok(Ok(true)) => {
                info!(lease = %lease, "lease handed back unused, before anything was written in its term")
            }
            Ok(Ok(false)) => {
                info!(lease = %lease, "lease taken and not kept: no longer this replica's, nothing to hand back")
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

    /// Drains `shard` and releases its Lease, so a replica with room takes it at once:
    /// it leaves the ownership now; the drain and the release run in a task of their own.
    fn give_up(&mut self, shard: u32, live: usize) {
        let Some(epoch) = self.tx.borrow().tenure(shard).map(|t| t.epoch) else {
            return;
        };
        info!(
            shard,
            epoch,
            live_replicas = live,
            "shard over this replica's share: draining it, then releasing its lease"
        );
        self.drain_and_release(shard, epoch);
    }

    fn drain_and_release(&mut self, shard: u32, epoch: u64) {
        let range = self.tx.borrow().map.range(shard);
        self.draining.insert(shard, range);
        self.stop_holding(shard);
        let release = drain_and_release(
            self.electors[shard as usize].clone(),
            shard,
            epoch,
            self.in_flight.clone(),
            self.group.timing.renew_deadline,
        );
        self.releasing.insert(shard, tokio::spawn(release));
    }

    /// Drains and releases every held shard (another writer may be live beside this one).
    fn give_up_all(&mut self, live: usize) {
        let held: Vec<u32> = self.tx.borrow().held.keys().copied().collect();
        for s in held {
            self.give_up(s, live);
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
            gained_or_lost(&self.status.metrics, &self.tx.borrow(), 1);
        }
    }

    /// The controller has drained: give everything up (after the releases under way).
    async fn shut_down(mut self) {
        for (_, h) in std::mem::take(&mut self.releasing) {
            let _ = h.await;
        }
        let held: Vec<u32> = self.tx.borrow().held.keys().copied().collect();
        for shard in &held {
            self.stop_holding(*shard);
        }
        let releases = held.iter().map(|s| {
            let elector = self.electors[*s as usize].clone();
            async move { timeout(self.group.timing.renew_deadline, elector.release()).await }
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
        self.mode.shut_down(&self.group).await;
        report(&self.status.metrics, &self.tx.borrow());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shard::ShardMap;
    use std::time::{Duration, Instant};

    const LEASE: Duration = Duration::from_secs(15);

    fn held_by(holder: &str, at: Instant) -> Option<Observed> {
        Some(super::super::modes::tests::held_by(holder, at))
    }

    fn names(of: &[&str]) -> BTreeSet<String> {
        of.iter().map(|s| (*s).to_owned()).collect()
    }

    /// One look's decision, as `tick` makes it once the gate is open.
    fn decide(
        me: &str,
        members: &BTreeSet<String>,
        held: &BTreeSet<u32>,
        seen: &[Option<Observed>],
        free_since: &mut BTreeMap<u32, Instant>,
        now: Instant,
    ) -> balance::Decision {
        let holders = holders(me, held, seen, free_since, now);
        balance::decide(&View {
            me,
            members,
            holders: &holders,
            lease_duration: LEASE,
        })
    }

    #[test]
    fn a_shard_is_free_from_when_this_replica_first_saw_it_free() {
        let t0 = Instant::now();
        let mut free_since = BTreeMap::new();
        let held = BTreeSet::from([0]);
        // 0 is this replica's, 1 another's, 2 has no Lease, 3's holder is silent.
        let seen = [
            held_by("a", t0),
            held_by("b", t0),
            None,
            held_by("c", t0 - LEASE),
        ];
        assert_eq!(
            holders("a", &held, &seen, &mut free_since, t0),
            [
                Holder::Held("a".to_owned()),
                Holder::Held("b".to_owned()),
                Holder::Free(Duration::ZERO),
                Holder::Free(Duration::ZERO),
            ]
        );
        let later = t0 + Duration::from_secs(9);
        let seen = [None, held_by("b", t0), None, held_by("c", t0 - LEASE)];
        let h = holders("a", &BTreeSet::new(), &seen, &mut free_since, later);
        assert_eq!(
            h[0],
            Holder::Free(Duration::ZERO),
            "no longer held here: free from now"
        );
        assert_eq!(h[1], Holder::Held("b".to_owned()));
        assert_eq!(h[2], Holder::Free(Duration::from_secs(9)));
        assert_eq!(h[3], Holder::Free(Duration::from_secs(9)));
        // Taken meanwhile, then free again: it ages from the second time.
        let seen = [None, None, held_by("d", later), None];
        holders("a", &BTreeSet::new(), &seen, &mut free_since, later);
        let h = holders(
            "a",
            &BTreeSet::new(),
            &[None, None, None, None],
            &mut free_since,
            later + LEASE,
        );
        assert_eq!(h[2], Holder::Free(Duration::ZERO));
        assert_eq!(h[3], Holder::Free(Duration::from_secs(24)));
        // A record still naming this replica from an earlier term is free.
        let h = holders(
            "a",
            &BTreeSet::new(),
            &[held_by("a", later)],
            &mut BTreeMap::new(),
            later,
        );
        assert_eq!(h, [Holder::Free(Duration::ZERO)]);
    }

    #[test]
    fn a_free_shard_goes_at_once_to_the_replica_ranking_it_first_and_to_any_after_a_lease_duration()
    {
        let t0 = Instant::now();
        let members = names(&["a", "b"]);
        // The one that does not rank shard 0 first.
        let (first, other) = if balance::weight("a", 0) > balance::weight("b", 0) {
            ("a", "b")
        } else {
            ("b", "a")
        };
        let none = BTreeSet::new();
        let mut mine = BTreeMap::new();
        let d = decide(first, &members, &none, &[None], &mut mine, t0);
        assert_eq!(d.take, BTreeSet::from([0]), "its own by rank");
        let mut theirs = BTreeMap::new();
        for after in [0, 14] {
            let now = t0 + Duration::from_secs(after);
            let d = decide(other, &members, &none, &[None], &mut theirs, now);
            assert!(d.take.is_empty(), "free for {after} s: left to {first}");
        }
        // Seen held meanwhile: the wait starts again when it is free again.
        let seen = [held_by(first, t0 + Duration::from_secs(14))];
        decide(
            other,
            &members,
            &none,
            &seen,
            &mut theirs,
            t0 + Duration::from_secs(14),
        );
        let d = decide(other, &members, &none, &[None], &mut theirs, t0 + LEASE);
        assert!(d.take.is_empty());
        let d = decide(other, &members, &none, &[None], &mut theirs, t0 + LEASE * 2);
        assert_eq!(
            d.take,
            BTreeSet::from([0]),
            "free for a lease duration: anyone takes it"
        );
    }

    #[test]
    fn a_replica_over_its_share_when_one_joins_releases_what_it_ranks_lowest_and_takes_it_back_when_it_goes()
     {
        let t0 = Instant::now();
        let six = Arc::new(ShardMap::even(6));
        let mut rules = Sharded::new("a", "op", super::super::Split::new(&six, &[]), LEASE);
        let mut free_since = BTreeMap::new();
        let all: BTreeSet<u32> = (0..6).collect();
        let mine = vec![None; 6];
        let alone = rules.members(&[], t0);
        let d = decide("a", &alone, &all, &mine, &mut free_since, t0);
        assert_eq!(d, balance::Decision::default(), "alone, it keeps all six");

        let mut b = Lease::default();
        b.metadata.name = Some("op-member-b".to_owned());
        b.metadata.resource_version = Some("1".to_owned());
        b.spec = held_by("b", t0).map(|o| o.spec);
        let two = rules.members(std::slice::from_ref(&b), t0);
        assert_eq!(two, names(&["a", "b"]));
        let d = decide("a", &two, &all, &mine, &mut free_since, t0);
        let mut ranked: Vec<u32> = (0..6).collect();
        ranked.sort_by_key(|s| balance::weight("a", *s));
        assert_eq!(d.release, ranked[..3].iter().copied().collect());
        assert!(d.take.is_empty());

        // b never renews: a lease duration later it is no member, and what a released
        // (free since then) is a's again at once.
        let kept: BTreeSet<u32> = ranked[3..].iter().copied().collect();
        let seen: Vec<Option<Observed>> = (0..6)
            .map(|s| (!kept.contains(&s)).then(|| held_by("b", t0)).flatten())
            .collect();
        let later = t0 + LEASE;
        let one = rules.members(std::slice::from_ref(&b), later);
        assert_eq!(one, names(&["a"]));
        let d = decide("a", &one, &kept, &seen, &mut free_since, later);
        assert_eq!(d.take, ranked[..3].iter().copied().collect());
        assert!(d.release.is_empty());
    }

    #[test]
    fn with_one_shard_a_look_rests_while_holding_takes_at_once_and_keeps_nothing_warm() {
        let t0 = Instant::now();
        let mut mode = Mode::Single(Single::new("a"));
        let mut own = Ownership::nothing_of(1);
        assert!(!mode.rests(&own));
        own.held.insert(0, Tenure::gained(None, None));
        assert!(mode.rests(&own), "holding the one shard, nothing to decide");
        assert!(mode.ready(true), "nobody to register with first");

        // Another replica holds the Lease: a sharded replica would keep it warm, this
        // one does not (its watches are not sharded).
        let members = mode.members(&[], t0);
        assert_eq!(members, names(&["a"]));
        let holders = [Holder::Held("b".to_owned())];
        let view = View {
            me: "a",
            members: &members,
            holders: &holders,
            lease_duration: LEASE,
        };
        assert_eq!(balance::successor_of(&view), BTreeSet::from([0]));
        assert!(mode.warm(&view).is_empty());
    }

    #[test]
    fn a_shard_counts_unheld_from_when_it_was_seen_free_or_this_replica_could_take_it() {
        let t0 = Instant::now();
        let secs = Duration::from_secs;
        let mut idle_since = None;
        let holders = [
            Holder::Held("a".to_owned()),
            Holder::Held("b".to_owned()),
            Holder::Free(secs(40)),
            Holder::Free(secs(3)),
        ];
        // Could take shards for 10 s only: a shard free for longer counts 10 s.
        let u = unheld("a", &holders, t0, &mut idle_since, t0 + secs(10));
        assert_eq!(
            u.shards,
            [Duration::ZERO, Duration::ZERO, secs(10), secs(3)]
        );
        assert_eq!(u.idle, Duration::ZERO, "a holds shard 0: not idle");
        assert_eq!(idle_since, None);
        let u = unheld("a", &holders, t0 - secs(100), &mut idle_since, t0);
        assert_eq!(u.shards[2], secs(40));
    }

    #[test]
    fn a_replica_is_idle_while_it_holds_nothing_and_a_shard_is_free() {
        let t0 = Instant::now();
        let secs = Duration::from_secs;
        let mut idle_since = None;
        let all_held = [Holder::Held("b".to_owned()), Holder::Held("c".to_owned())];
        let one_free = [Holder::Held("b".to_owned()), Holder::Free(secs(1))];
        let mine = [Holder::Held("a".to_owned()), Holder::Free(secs(1))];
        // Nothing free: holding nothing is no idleness (more replicas than shards).
        let u = unheld("a", &all_held, t0, &mut idle_since, t0);
        assert_eq!(u.idle, Duration::ZERO);
        assert_eq!(
            unheld("a", &one_free, t0, &mut idle_since, t0).idle,
            Duration::ZERO
        );
        assert_eq!(
            unheld("a", &one_free, t0, &mut idle_since, t0 + secs(7)).idle,
            secs(7)
        );
        assert_eq!(
            unheld("a", &one_free, t0, &mut idle_since, t0 + secs(31)).idle,
            secs(31)
        );
        // Takes a shard: not idle; idle again later counts from then.
        assert_eq!(
            unheld("a", &mine, t0, &mut idle_since, t0 + secs(32)).idle,
            Duration::ZERO
        );
        unheld("a", &one_free, t0, &mut idle_since, t0 + secs(40));
        assert_eq!(
            unheld("a", &one_free, t0, &mut idle_since, t0 + secs(42)).idle,
            secs(2)
        );
        // Nothing free any more: not idle.
        assert_eq!(
            unheld("a", &all_held, t0, &mut idle_since, t0 + secs(43)).idle,
            Duration::ZERO
        );
        assert_eq!(idle_since, None);
    }
}
