//! Takeover at scale (`--compare --takeover`): with every GpuJob converged, `kill -9` of
//! the replica doing the work; survivors take its Lease (or shards), look at every GpuJob
//! of them, and should write nothing. With `--takeover-at N` the kill comes once N have
//! converged, under load (maybe while the rest are still being created): the survivors'
//! writes then include converging the rest. Measures how long that takes, shard by shard (each
//! new holder's `gpujob_shard_first_look_seconds{shard}`: from its gain to every GpuJob
//! of the shard looked at; and `gpujob_shard_first_look_observed_seconds{shard}`: to
//! every one observed before the gain, the work under way, apart from the new work that
//! costs its writes; and `gpujob_shard_first_plan_seconds{shard}`: to every one planned
//! once from the caches, ended there or queued for a worker), what they wrote, and their
//! memory. And what else the machine did meanwhile: each gained shard's look is set
//! against every client's writes in the same seconds (the audit log), and the cores busy
//! from every Lease held to every shard looked at whole are given, so a look bound by
//! the machine shows as one.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::time::Duration;

use anyhow::{Context, bail};
use devcluster::ControlPlane;
use devcluster::audit::AuditEvent;
use devcluster::identity::OPERATOR_USER;
use devcluster::metrics::Metrics;
use gpujob_operator::shard::ShardMap;
use kube::Client;
use std::time::Instant;

use crate::measure::identity_of;
use crate::replicas::{Replicas, queue_depth, shard_lease};

const RECONCILES: &str = "controller_runtime_reconcile_total";
const FIRST_LOOK: &str = "gpujob_shard_first_look_seconds";
const FIRST_LOOK_OBSERVED: &str = "gpujob_shard_first_look_observed_seconds";
const FIRST_PLAN: &str = "gpujob_shard_first_plan_seconds";
const FROM_CACHES: &str = "gpujob_first_looks_from_caches_total";

/// One shard of the killed replica, taken over.
#[derive(Debug)]
pub struct ShardLook {
    pub shard: u32,
    /// The survivor that reported its first look.
    pub holder: String,
    /// Its GpuJobs (the holder's `gpujob_gpujobs_per_shard`).
    pub gpujobs: f64,
    /// Gain → every GpuJob it had looked at, as the holder measured it.
    pub first_look: f64,
    /// Gain → every GpuJob it had that was observed before the gain looked at.
    pub first_look_observed: Option<f64>,
    /// Gain → every GpuJob it had planned once from the caches.
    pub first_plan: Option<f64>,
    /// Did the holder cache the shard before the kill (kept it warm)?
    pub warm: bool,
    /// Looks the holder reported since the kill: more than one when the shard moved
    /// again, and `first_look` is then their mean.
    pub looks: f64,
    /// The writes of the look's seconds, from the holder's claim of the shard's Lease.
    pub window: Option<Window>,
}

/// Every write the audit log recorded in one gained shard's look, from its holder's
/// claim of the shard's Lease to every GpuJob looked at.
#[derive(Debug, Default, Clone, Copy)]
pub struct Window {
    pub seconds: f64,
    /// By every client: the load generator, kube-controller-manager, every replica.
    pub all: usize,
    /// By the holder, in the shard's namespaces (GpuJobs, Jobs, pods, Events; not its
    /// Leases).
    pub holder_in_shard: usize,
    /// GpuJobs created (the load generator's).
    pub gpujob_creates: usize,
}

#[derive(Debug)]
pub struct Takeover {
    pub gpujobs: usize,
    /// Under load: how many GpuJobs had converged at the kill (the rest converging).
    pub under_load: Option<usize>,
    /// How many creates had been answered at the kill, when the creates were still going
    /// (up to `--concurrency` more may have been stored by then).
    pub created_at_kill: Option<usize>,
    /// When the replica was killed.
    pub killed_at: Instant,
    pub killed: String,
    /// Kill → every Lease (shard) held by a survivor.
    pub held_after: Duration,
    /// Kill → each of the killed replica's shards reported by its new holder as looked at
    /// whole (the queues may still hold other work: resyncs, echoes).
    pub looked_after: Duration,
    /// Each of the killed replica's shards.
    pub shards: Vec<ShardLook>,
    /// Reconciles the survivors counted meanwhile.
    pub reconciles: f64,
    /// The machine's cores busy from every Lease held to every shard looked at whole.
    pub cores_busy: Option<f64>,
    /// First looks the survivors ended from the caches alone meanwhile (no worker, no
    /// request).
    pub from_caches: f64,
    /// Writes to GpuJobs and Jobs in the load namespaces after the kill, by the survivors.
    pub writes: usize,
    /// Events the survivors wrote after the kill.
    pub events: usize,
    /// Events of the killed replica the audit log recorded after the kill began (its
    /// Events go out on a budget of their own, behind its writes).
    pub events_of_killed: usize,
    /// Each survivor: identity, peak RSS (KiB) before the kill and at the end.
    pub survivors: Vec<(String, u64, u64)>,
    /// The killed replica started again afterwards: start → ready (unsharded, its caches
    /// loaded by a list of every GpuJob and Job; with sharded watches it is ready holding
    /// nothing), its peak RSS and its RSS 5 s after ready (KiB).
    pub restarted: (Duration, u64, u64),
}

/// Waits for the working replica's queue to drain (unless `under_load`), kills it, and
/// measures the takeover.
#[allow(clippy::too_many_arguments)]
pub async fn run(
    cluster: &ControlPlane,
    admin: &Client,
    replicas: &mut Replicas,
    gpujobs: usize,
    shards: u32,
    namespaces: &[String],
    under_load: Option<usize>,
    deadline: Instant,
) -> anyhow::Result<Takeover> {
    // Quiet first (unless under load): the echoes of the last writes are looked at
    // before the kill.
    while under_load.is_none() {
        let depth: f64 = replicas
            .scrape()
            .await
            .iter()
            .filter_map(|(_, text)| queue_depth(text).ok())
            .sum();
        if depth == 0.0 {
            break;
        }
        if Instant::now() >= deadline {
            bail!("takeover: the work queues did not drain before the deadline");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let audit = cluster.audit();
    let cursor = audit.cursor()?;
    // The survivors' first looks so far, and which shards each caches (warm).
    let ahead: Vec<(String, Metrics)> = replicas
        .scrape()
        .await
        .into_iter()
        .filter_map(|(who, text)| Some((who, Metrics::parse(&text).ok()?)))
        .collect();
    let (killed, held) = if shards == 1 {
        (replicas.kill_leader(admin).await?, vec![0])
    } else {
        replicas.kill_busiest(admin, shards).await?
    };
    let killed_at = Instant::now();
    let before: BTreeMap<String, f64> = replicas
        .scrape()
        .await
        .into_iter()
        .map(|(who, text)| (who, reconciles(&text)))
        .collect();
    let peaks_before = replicas.peaks();
    if shards == 1 {
        replicas
            .wait_leader(admin, Some(killed.as_str()), deadline)
            .await?;
    } else {
        replicas
            .wait_shards(admin, shards, Duration::ZERO, deadline)
            .await?;
    }
    let held_after = killed_at.elapsed();
    let cpu_at_held = cpu_jiffies();
    let (looked_after, reconciled, from_caches, mut looks) = loop {
        let scrapes = replicas.scrape().await;
        let done: f64 = scrapes
            .iter()
            .map(|(who, text)| reconciles(text) - before.get(who).copied().unwrap_or(0.0))
            .sum();
        let looks = first_looks(&ahead, &scrapes, &held);
        if looks.len() == held.len() {
            let from_caches: f64 = scrapes
                .iter()
                .filter_map(|(who, text)| {
                    let now = Metrics::parse(text).ok()?.sum(FROM_CACHES, &[]);
                    let was = ahead
                        .iter()
                        .find(|(w, _)| w == who)
                        .map_or(0.0, |(_, m)| m.sum(FROM_CACHES, &[]));
                    Some(now - was)
                })
                .sum();
            break (killed_at.elapsed(), done, from_caches, looks);
        }
        if Instant::now() >= deadline {
            bail!(
                "takeover: {} of shards {held:?} reported their first look before the deadline ({done} reconciles)",
                looks.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let cores_busy = cores_busy(cpu_at_held, cpu_jiffies());
    // Let the last writes, if any, reach the audit log.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let load: BTreeSet<&str> = namespaces.iter().map(String::as_str).collect();
    let since_kill = audit.since(cursor)?;
    // With a kept map the replicas may re-cut it: which shard a namespace is in is then
    // theirs to say, and the writes are not split by shard.
    if let Some(map) = replicas.shard_map() {
        for look in &mut looks {
            let lease = shard_lease(look.shard, shards);
            look.window = window(&since_kill, look, &lease, map);
        }
    }
    let (theirs, ours): (Vec<_>, Vec<_>) = since_kill
        .into_iter()
        .filter(|e| e.user == OPERATOR_USER && e.is_write() && load.contains(e.namespace.as_str()))
        .partition(|e| identity_of(&e.user_agent) == killed);
    let writes = ours
        .iter()
        .filter(|e| e.resource == "gpujobs" || e.resource == "jobs")
        .count();
    let events = ours.iter().filter(|e| e.resource == "events").count();
    let events_of_killed = theirs.iter().filter(|e| e.resource == "events").count();
    let after = replicas.peaks();
    let survivors = after
        .into_iter()
        .map(|(who, peak)| {
            let was = peaks_before.get(&who).copied().unwrap_or(0);
            (who, was, peak)
        })
        .collect();
    // Started again, the killed replica loads converged GpuJobs and Jobs by a list (all of
    // them unsharded; with sharded watches, those of the shards it then takes or keeps
    // warm), as any replica (re)started in a running installation does: a standby's
    // memory there, which a replica that grew with the load does not show.
    let ready_after = replicas.restart(&killed, deadline).await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let restarted = replicas
        .memory()
        .into_iter()
        .find(|m| m.identity == killed && !m.killed)
        .map(|m| (ready_after, m.peak_kib, m.now_kib))
        .context("the restarted replica's memory")?;
    Ok(Takeover {
        gpujobs,
        under_load,
        created_at_kill: None,
        killed_at,
        killed,
        held_after,
        looked_after,
        shards: looks,
        reconciles: reconciled,
        cores_busy,
        from_caches,
        writes,
        events,
        events_of_killed,
        survivors,
        restarted,
    })
}

/// The shards of `held` whose first look a survivor reported since `ahead` (each one's
/// scrape before the kill), with what that survivor's metrics say of it now.
fn first_looks(
    ahead: &[(String, Metrics)],
    scrapes: &[(String, String)],
    held: &[u32],
) -> Vec<ShardLook> {
    let mut looks = Vec::new();
    for (who, text) in scrapes {
        let Ok(now) = Metrics::parse(text) else {
            continue;
        };
        let was = ahead.iter().find(|(w, _)| w == who).map(|(_, m)| m);
        for shard in held {
            let label = shard.to_string();
            // The latest look's seconds: the sum's growth over as many looks (one, unless
            // the shard moved again).
            let of = |m: &Metrics, name: &str, suffix: &str| {
                m.sum(&format!("{name}_{suffix}"), &[("shard", label.as_str())])
            };
            let count =
                |name: &str| of(&now, name, "count") - was.map_or(0.0, |m| of(m, name, "count"));
            let latest = |name: &str| {
                let n = count(name);
                (n >= 1.0)
                    .then(|| (of(&now, name, "sum") - was.map_or(0.0, |m| of(m, name, "sum"))) / n)
            };
            let Some(seconds) = latest(FIRST_LOOK) else {
                continue;
            };
            looks.push(ShardLook {
                shard: *shard,
                holder: who.clone(),
                gpujobs: now.sum("gpujob_gpujobs_per_shard", &[("shard", label.as_str())]),
                first_look: seconds,
                first_look_observed: latest(FIRST_LOOK_OBSERVED),
                first_plan: latest(FIRST_PLAN),
                warm: was.is_some_and(|m| caches_shard(m, *shard)),
                looks: count(FIRST_LOOK),
                window: None,
            });
        }
    }
    looks.sort_by_key(|l| l.shard);
    looks
}

/// The writes of `look`'s seconds in `events` (the audit log since the kill): from its
/// holder's claim of the shard's Lease `lease` (the first write after the kill naming it
/// the holder) to every GpuJob looked at. `None` when the claim is not in the log, or
/// the shard moved again (its look's seconds are then a mean of several).
fn window(events: &[AuditEvent], look: &ShardLook, lease: &str, map: &ShardMap) -> Option<Window> {
    if look.looks > 1.0 {
        return None;
    }
    let at = crate::running::when;
    let gained = events
        .iter()
        .filter(|e| e.succeeded() && e.resource == "leases" && e.name == lease)
        .filter(|e| e.lease_holder.as_deref() == Some(look.holder.as_str()))
        .filter_map(at)
        .min()?;
    let end = gained
        .checked_add(jiff::SignedDuration::try_from_secs_f64(look.first_look).ok()?)
        .ok()?;
    let inside: Vec<&AuditEvent> = events
        .iter()
        .filter(|e| e.succeeded() && e.is_write())
        .filter(|e| at(e).is_some_and(|t| t >= gained && t <= end))
        .collect();
    Some(Window {
        seconds: look.first_look,
        all: inside.len(),
        holder_in_shard: inside
            .iter()
            .filter(|e| e.user == OPERATOR_USER && identity_of(&e.user_agent) == look.holder)
            // Its Leases live in a namespace of their own, which the map may place anywhere.
            .filter(|e| e.resource != "leases" && !e.namespace.is_empty())
            .filter(|e| map.shard_of(&e.namespace) == look.shard)
            .count(),
        gpujob_creates: inside
            .iter()
            .filter(|e| e.resource == "gpujobs" && e.verb == "create")
            .count(),
    })
}

/// The machine's CPU time so far from `/proc/stat`: (busy, all) in clock ticks, over
/// every core, and how many cores.
fn cpu_jiffies() -> Option<(u64, u64, usize)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let cores = stat
        .lines()
        .filter(|l| l.starts_with("cpu") && !l.starts_with("cpu "))
        .count();
    let fields: Vec<u64> = stat
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is within user).
    let all: u64 = fields.iter().take(8).sum();
    let idle = fields.get(3)? + fields.get(4).copied().unwrap_or(0);
    Some((all - idle, all, cores))
}

/// Cores busy between two [`cpu_jiffies`] readings.
fn cores_busy(from: Option<(u64, u64, usize)>, to: Option<(u64, u64, usize)>) -> Option<f64> {
    let ((b0, a0, cores), (b1, a1, _)) = (from?, to?);
    let all = a1.checked_sub(a0).filter(|a| *a > 0)?;
    let busy = b1.saturating_sub(b0);
    // Ticks are counted over every core: the busy share of all times the cores.
    Some(busy as f64 / all as f64 * cores as f64)
}

/// Did a replica whose metrics are `m` have `shard` in both caches?
fn caches_shard(m: &Metrics, shard: u32) -> bool {
    m.sum(
        "gpujob_shard_cached",
        &[("shard", shard.to_string().as_str())],
    ) > 0.0
}

/// Reconciles a replica counted, whatever their result.
fn reconciles(text: &str) -> f64 {
    Metrics::parse(text).map_or(0.0, |m| m.sum(RECONCILES, &[]))
}

/// The takeover as a Markdown section.
pub fn report(t: &Takeover) -> String {
    let mut r = String::new();
    let _ = match t.under_load {
        None => writeln!(
            r,
            "\n## Takeover at scale\n\n\
             With all {} GpuJobs converged and the queues empty, `kill -9` of the replica that \
             did the work ({}); a survivor took over and looked at every GpuJob.\n",
            t.gpujobs, t.killed
        ),
        Some(n) => writeln!(
            r,
            "\n## Takeover under load\n\n\
             With {n} of {} GpuJobs converged{} and the rest converging, `kill -9` of the \
             replica holding the most shards ({}); survivors took its shards over. Their \
             reconciles, writes and Events after the kill include converging the rest.\n",
            t.gpujobs,
            t.created_at_kill.map_or(String::new(), |c| format!(
                " ({c} creates answered: the rest were answered after the kill)"
            )),
            t.killed
        ),
    };
    let _ = writeln!(r, "| measure | value |\n|---|---|");
    let _ = writeln!(
        r,
        "| kill → every Lease held by a survivor | {:.1} s |",
        t.held_after.as_secs_f64()
    );
    let _ = writeln!(
        r,
        "| kill → each of its shards looked at whole by its new holder | {:.1} s ({:.1} s after every Lease was held; {} reconciles meanwhile) |",
        t.looked_after.as_secs_f64(),
        (t.looked_after.saturating_sub(t.held_after)).as_secs_f64(),
        t.reconciles
    );
    let _ = writeln!(
        r,
        "| of those, first looks that ended from the caches alone (no worker, no request) | {} |",
        t.from_caches
    );
    for l in &t.shards {
        let _ = writeln!(
            r,
            "| shard {} → {} ({} before the kill): {} GpuJobs, gain → every one looked at | {:.3} s |",
            l.shard,
            l.holder,
            if l.warm { "cached" } else { "not cached" },
            l.gpujobs,
            l.first_look
        );
        if let Some(planned) = l.first_plan {
            let _ = writeln!(
                r,
                "| shard {}: gain → every one planned once from the caches (ended there, or queued for a worker) | {planned:.3} s |",
                l.shard,
            );
        }
        if let Some(observed) = l.first_look_observed {
            let _ = writeln!(
                r,
                "| shard {}: gain → every one observed before the gain (work under way, not new work) looked at | {observed:.3} s |",
                l.shard,
            );
        }
        if let Some(w) = l.window {
            let rate = |n: usize| n as f64 / w.seconds.max(f64::EPSILON);
            let _ = writeln!(
                r,
                "| shard {}: writes in those {:.1} s (from the claim of its Lease), a second: every client's; its holder's to the shard's namespaces; GpuJob creates | {:.0}; {:.0}; {:.0} |",
                l.shard,
                w.seconds,
                rate(w.all),
                rate(w.holder_in_shard),
                rate(w.gpujob_creates),
            );
        }
    }
    if let Some(busy) = t.cores_busy {
        let _ = writeln!(
            r,
            "| cores busy, every Lease held → every shard looked at whole | {busy:.2} |"
        );
    }
    let _ = writeln!(
        r,
        "| writes to GpuJobs and Jobs by the survivors after the kill | {} |",
        t.writes
    );
    let _ = writeln!(
        r,
        "| Events written by the survivors after the kill | {} |",
        t.events
    );
    let _ = writeln!(
        r,
        "| Events of the killed replica recorded after the kill began (its Events queue, behind its writes) | {} |",
        t.events_of_killed
    );
    for (who, before, after) in &t.survivors {
        let _ = writeln!(
            r,
            "| {who}: peak RSS before the kill → after the takeover | {} MiB → {} MiB |",
            before / 1024,
            after / 1024
        );
    }
    let (ready, peak, now) = t.restarted;
    let _ = writeln!(
        r,
        "| {} started again; it rejoins and, when sharded, takes its share of shards back (unsharded, it lists every GpuJob and Job before it is ready; with sharded watches, only the shards it takes or keeps warm, after it is ready): start → ready; peak RSS; RSS 5 s later | {:.1} s; {} MiB; {} MiB |",
        t.killed,
        ready.as_secs_f64(),
        peak / 1024,
        now / 1024
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(user: &str, agent: &str, verb: &str, res: &str, ns: &str, at: u32) -> AuditEvent {
        AuditEvent {
            user: user.to_owned(),
            user_agent: agent.to_owned(),
            verb: verb.to_owned(),
            api_group: String::new(),
            resource: res.to_owned(),
            subresource: String::new(),
            namespace: ns.to_owned(),
            name: String::new(),
            code: 200,
            timestamp: format!("2026-12-07T10:00:{at:02}.500000Z"),
            received: format!("2026-12-07T10:00:{at:02}.000000Z"),
            lease_holder: None,
        }
    }

    fn claim(holder: &str, shard: u32, at: u32) -> AuditEvent {
        let mut e = ev(
            OPERATOR_USER,
            &format!("gpujob-operator/0.1.0 ({holder})"),
            "update",
            "leases",
            "gpujob-system",
            at,
        );
        e.name = shard_lease(shard, 2);
        e.lease_holder = Some(holder.to_owned());
        e
    }

    /// The window runs from the holder's first claim for the shard's look seconds; the
    /// holder's writes count only in the shard's namespaces, every client's all.
    #[test]
    fn a_window_counts_the_writes_from_the_claim_for_the_look() {
        let namespaces: Vec<String> = (0..6).map(|i| format!("load-{i}")).collect();
        let map = crate::replicas::shard_map(&namespaces, 2);
        let (mine, other) = namespaces
            .iter()
            .partition::<Vec<&String>, _>(|ns| map.shard_of(ns) == 1);
        let (mine, other) = (mine[0].as_str(), other[0].as_str());
        let holder = "gpujob-operator/0.1.0 (load-2)";
        let look = ShardLook {
            shard: 1,
            holder: "load-2".into(),
            gpujobs: 10.0,
            first_look: 4.0,
            first_look_observed: None,
            first_plan: None,
            warm: true,
            looks: 1.0,
            window: None,
        };
        let mut failed = ev(OPERATOR_USER, holder, "patch", "pods", mine, 12);
        failed.code = 409;
        let events = vec![
            ev(OPERATOR_USER, holder, "create", "jobs", mine, 9), // before the claim
            claim("load-3", 1, 9),                                // another's claim
            claim("load-2", 0, 9),                                // another shard's
            claim("load-2", 1, 10),
            claim("load-2", 1, 12), // a renewal
            ev(OPERATOR_USER, holder, "create", "jobs", mine, 11),
            ev(OPERATOR_USER, holder, "patch", "gpujobs", other, 11), // another shard
            ev("admin", "loadtest", "create", "gpujobs", other, 13),
            failed,
            ev(OPERATOR_USER, holder, "create", "events", mine, 14),
            ev(OPERATOR_USER, holder, "create", "jobs", mine, 15), // after the look
        ];
        let lease = shard_lease(1, 2);
        let w = window(&events, &look, &lease, &map).unwrap();
        // Claims at 10 and 12 (the others' at 9: outside), the writes at 11, 11, 13, 14.
        assert_eq!((w.all, w.holder_in_shard, w.gpujob_creates), (6, 2, 1));
        assert!(
            window(&events[..3], &look, &lease, &map).is_none(),
            "no claim"
        );
        let moved = ShardLook { looks: 2.0, ..look };
        assert!(
            window(&events, &moved, &lease, &map).is_none(),
            "a mean of two looks"
        );
    }

    #[test]
    fn cores_busy_is_the_busy_share_of_the_ticks_times_the_cores() {
        assert_eq!(
            cores_busy(Some((100, 400, 2)), Some((250, 600, 2))),
            Some(1.5)
        );
        assert_eq!(cores_busy(Some((100, 400, 2)), Some((100, 400, 2))), None);
        assert_eq!(cores_busy(None, Some((1, 2, 2))), None);
    }
}
