//! Sharded replicas as the API server sees them: shard Lease holders, namespaces that
//! cover every shard, and the audit-log questions sharding tests ask (who held which
//! shard when, how often shards moved, whether anyone wrote outside its tenure).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use devcluster::audit::AuditEvent;
use devcluster::wait;
use gpujob_operator::api::{GpuJob, Phase};
use gpujob_operator::shard::shard_of;
use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Client;
use kube::api::{Api, ListParams};

use super::TestEnv;
use super::replicas::LEASE;

/// Waits until every GpuJob of `namespaces` has succeeded (two minutes at most);
/// returns how many each namespace has.
pub async fn wait_succeeded<'a>(
    env: &TestEnv,
    namespaces: impl IntoIterator<Item = &'a str>,
) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for ns in namespaces {
        let api: Api<GpuJob> = Api::namespaced(env.admin.clone(), ns);
        let n = wait::until(
            &format!("every GpuJob of {ns} succeeded"),
            Duration::from_secs(120),
            Duration::from_millis(250),
            || {
                let api = api.clone();
                async move {
                    let all = api.list(&ListParams::default()).await.ok()?.items;
                    all.iter()
                        .all(|g| super::phase(g) == Some(Phase::Succeeded))
                        .then_some(all.len())
                }
            },
        )
        .await
        .unwrap();
        counts.insert(ns.to_owned(), n);
    }
    counts
}

/// The Lease of shard `i`.
pub fn lease_of(i: u32) -> String {
    format!("{LEASE}-shard-{i}")
}

/// Holder of each shard's Lease (`None`: free or missing).
pub async fn holders(admin: &Client, lease_ns: &str, shards: u32) -> Vec<Option<String>> {
    let api: Api<Lease> = Api::namespaced(admin.clone(), lease_ns);
    let mut out = Vec::new();
    for i in 0..shards {
        let holder = api
            .get_opt(&lease_of(i))
            .await
            .ok()
            .flatten()
            .and_then(|l| l.spec?.holder_identity)
            .filter(|h| !h.is_empty());
        out.push(holder);
    }
    out
}

/// Shards held by each replica.
pub fn counts(holders: &[Option<String>]) -> BTreeMap<String, usize> {
    let mut c = BTreeMap::new();
    for h in holders.iter().flatten() {
        *c.entry(h.clone()).or_insert(0) += 1;
    }
    c
}

/// Waits until every shard is held and each of `replicas` holds exactly `each`.
pub async fn wait_balanced(
    env: &TestEnv,
    shards: u32,
    replicas: &[&str],
    each: usize,
    within: Duration,
) -> Vec<Option<String>> {
    let want: BTreeMap<String, usize> = replicas.iter().map(|r| ((*r).to_owned(), each)).collect();
    let want = &want;
    wait::until(
        &format!("{shards} shards, {each} each for {replicas:?}"),
        within,
        Duration::from_millis(100),
        || async move {
            let h = holders(&env.admin, &env.ns, shards).await;
            (h.iter().all(Option::is_some) && counts(&h) == *want).then_some(h)
        },
    )
    .await
    .unwrap()
}

/// At least `per_shard` fresh namespaces for each of `shards`; returns them with their
/// shard.
pub async fn namespaces(env: &TestEnv, shards: u32, per_shard: usize) -> Vec<(String, u32)> {
    let mut by_shard: BTreeMap<u32, usize> = BTreeMap::new();
    let mut out = Vec::new();
    while (0..shards).any(|s| by_shard.get(&s).copied().unwrap_or(0) < per_shard) {
        let ns = env.cluster.create_namespace("team").await.unwrap();
        let s = shard_of(&ns, shards);
        if by_shard.get(&s).copied().unwrap_or(0) < per_shard {
            *by_shard.entry(s).or_insert(0) += 1;
            out.push((ns, s));
        }
    }
    out
}

/// For every GpuJob the test created, from the audit log: how long after its create a
/// replica first wrote it or its first Job (`None`: never).
pub fn stalls(events: &[AuditEvent]) -> BTreeMap<(String, String), Option<Duration>> {
    let mut created: BTreeMap<(String, String), Timestamp> = BTreeMap::new();
    for e in events {
        if e.resource == "gpujobs"
            && e.subresource.is_empty()
            && e.verb == "create"
            && e.succeeded()
            && !e.user.starts_with("replica-")
        {
            created.insert((e.namespace.clone(), e.name.clone()), ts(&e.received));
        }
    }
    let mut out = BTreeMap::new();
    for ((ns, name), at) in &created {
        let job = format!("{name}-1");
        let first = events
            .iter()
            .filter(|e| {
                e.is_write()
                    && e.succeeded()
                    && e.user.starts_with("replica-")
                    && e.namespace == *ns
                    && ((e.resource == "gpujobs" && e.name == *name)
                        || (e.resource == "jobs" && e.name == job))
            })
            .map(|e| ts(&e.received))
            .min();
        let stall = first.map(|f| Duration::try_from(f.duration_since(*at)).unwrap_or_default());
        out.insert((ns.clone(), name.clone()), stall);
    }
    out
}

pub fn ts(s: &str) -> Timestamp {
    s.parse().unwrap()
}

/// One holder's time with a shard: from the Lease write that made it the holder to the
/// write that made someone else (or nobody: a release) the holder.
#[derive(Debug, Clone)]
pub struct Tenure {
    pub holder: String,
    pub from: Timestamp,
    pub until: Option<Timestamp>,
    /// How the tenure began: the holder before it (`""`: free, released or new) and when
    /// that record was last written.
    pub after: (String, Option<Timestamp>),
}

/// Each shard's tenures, from the successful writes to its Lease (the audit log holds
/// the holder each one wrote), in the order the API server received them.
pub fn tenures(events: &[AuditEvent], shards: u32) -> BTreeMap<u32, Vec<Tenure>> {
    let mut out = BTreeMap::new();
    for i in 0..shards {
        let name = lease_of(i);
        let mut writes: Vec<&AuditEvent> = events
            .iter()
            .filter(|e| e.resource == "leases" && e.name == name && e.is_write() && e.succeeded())
            .collect();
        writes.sort_by_key(|e| ts(&e.received));
        let mut list: Vec<Tenure> = Vec::new();
        let mut current = String::new();
        let mut last_write: Option<Timestamp> = None;
        for w in writes {
            let t = ts(&w.received);
            let holder = w.lease_holder.clone().unwrap_or_else(|| w.user.clone());
            if holder != current {
                if let Some(open) = list.last_mut().filter(|x| x.until.is_none()) {
                    open.until = Some(t);
                }
                if !holder.is_empty() {
                    list.push(Tenure {
                        holder: holder.clone(),
                        from: t,
                        until: None,
                        after: (current.clone(), last_write),
                    });
                }
                current = holder;
            }
            last_write = Some(t);
        }
        out.insert(i, list);
    }
    out
}

/// The shards that went to another holder than their previous one, with the new holder,
/// for tenures that began after `since` (from the whole history, so a predecessor is
/// known).
pub fn moves(events: &[AuditEvent], shards: u32, since: Timestamp) -> Vec<(u32, String)> {
    tenures(events, shards)
        .into_iter()
        .flat_map(|(s, list)| {
            list.windows(2)
                .filter(|w| w[1].from > since && w[0].holder != w[1].holder)
                .map(|w| (s, w[1].holder.clone()))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// No replica took a shard from a holder whose Lease was still valid: every tenure began
/// on a free or released Lease, or one whose holder had not written it for a lease
/// duration.
pub fn assert_no_shard_taken_from_a_live_holder(
    events: &[AuditEvent],
    shards: u32,
    lease: Duration,
) {
    for (s, list) in tenures(events, shards) {
        for t in list {
            let (before, written) = &t.after;
            if before.is_empty() {
                continue;
            }
            let gap = written.map(|w| t.from.duration_since(w));
            assert!(
                gap.is_some_and(|g| g.as_secs_f64() >= lease.as_secs_f64() - 0.05),
                "shard {s}: {} took it from {before} {gap:?} after that holder's last write (lease {lease:?})",
                t.holder
            );
        }
    }
}

/// Writes to GpuJobs, Jobs and Events by replicas, each with the shard of its namespace
/// (`shards` of them), checked against the shard tenures: every one by a replica that
/// held that shard before. A write to a GpuJob or a Job received outside its writer's
/// tenure can only be one that had passed its fence before the tenure ended (at most
/// `workers` per tenure end), and it never lands on an object the next holder had
/// written (each write carries the resourceVersion or uid it was computed from, or a
/// stable name). A Job create is the one write with no precondition but its name: it can
/// land after the next holder created and deleted that Job, as a new object (see
/// [`returned_jobs_by`]), which the next holder must then delete. Events are not fenced:
/// a replica writes those of the changes it recorded in its tenure also after it ended
/// (new objects, or series of its own). Returns how many writes to GpuJobs and Jobs came
/// late.
pub fn assert_writes_within_tenures(events: &[AuditEvent], shards: u32, workers: usize) -> usize {
    assert_writes_within_tenures_by(events, shards, workers, |_| shards)
}

/// [`assert_writes_within_tenures`] where the shard count changed over time:
/// `shards_of(write)` is the count its writer ran with then, at most `max_shards`.
pub fn assert_writes_within_tenures_by(
    events: &[AuditEvent],
    max_shards: u32,
    workers: usize,
    shards_of: impl Fn(&AuditEvent) -> u32,
) -> usize {
    let tenures = tenures(events, max_shards);
    let writes: Vec<&AuditEvent> = events
        .iter()
        .filter(|e| e.is_write() && e.succeeded() && e.user.starts_with("replica-"))
        .filter(|e| matches!(e.resource.as_str(), "gpujobs" | "jobs" | "events"))
        .collect();
    let mut late_per_end: BTreeMap<(u32, String, String), usize> = BTreeMap::new();
    let mut late = 0;
    for w in &writes {
        let shard = shard_of(&w.namespace, shards_of(w));
        let t = ts(&w.received);
        let until = match ended_before(&tenures[&shard], w) {
            Lateness::Within => continue,
            Lateness::Never => panic!(
                "{} wrote to shard {shard} without ever holding it: {w:#?}",
                w.user
            ),
            Lateness::After(until) => until,
        };
        if w.resource == "events" {
            continue;
        }
        late += 1;
        *late_per_end
            .entry((shard, w.user.clone(), until.to_string()))
            .or_insert(0) += 1;
        let others = written_by_others(&writes, w, until);
        if is_returned_job(w, &others) {
            // By a holder (the design's stray delete), or by the garbage collector if
            // the GpuJob itself went meanwhile; not by the test's own clean-up.
            let deleted_after = events.iter().any(|d| {
                d.verb == "delete"
                    && (d.user.starts_with("replica-")
                        || d.user == "system:kube-controller-manager")
                    && d.succeeded()
                    && d.resource == "jobs"
                    && d.namespace == w.namespace
                    && d.name == w.name
                    && ts(&d.received) > t
            });
            assert!(
                deleted_after,
                "a Job {} created late after its successor had deleted it was never deleted again: {w:#?}",
                w.user
            );
            continue;
        }
        let overwritten = others.first();
        assert!(
            overwritten.is_none(),
            "a late write of {} landed on an object its successor had written: {w:#?} after {overwritten:#?}",
            w.user
        );
    }
    for (end, n) in &late_per_end {
        assert!(
            *n <= workers,
            "{n} writes after the tenure {end:?} ended: more than were in flight"
        );
    }
    late
}

/// The writes of others to `w`'s object from `until` (its writer's tenure ended) up to
/// `w`, in the order received.
fn written_by_others<'a>(
    writes: &[&'a AuditEvent],
    w: &AuditEvent,
    until: Timestamp,
) -> Vec<&'a AuditEvent> {
    let t = ts(&w.received);
    writes
        .iter()
        .copied()
        .filter(|o| {
            o.user != w.user
                && o.resource == w.resource
                && o.namespace == w.namespace
                && o.name == w.name
                && ts(&o.received) >= until
                && ts(&o.received) < t
        })
        .collect()
}

/// Where a write falls against its writer's tenures of the shard.
enum Lateness {
    /// Within one of them.
    Within,
    /// After the one that ended last before it, at that moment.
    After(Timestamp),
    /// Outside any, and the writer never held the shard before.
    Never,
}

fn ended_before(list: &[Tenure], w: &AuditEvent) -> Lateness {
    let t = ts(&w.received);
    if list
        .iter()
        .any(|x| x.holder == w.user && x.from <= t && x.until.is_none_or(|u| t < u))
    {
        return Lateness::Within;
    }
    list.iter()
        .filter(|x| x.holder == w.user)
        .filter_map(|x| x.until.filter(|u| *u <= t))
        .max()
        .map_or(Lateness::Never, Lateness::After)
}

/// Whether `w`, a late write, is a Job create that landed after the next holders' last
/// write to that Job (`others`, in the order received) deleted it: a new object by the
/// old name, not a write on theirs. (The late-create test checks that its pods never
/// run.)
fn is_returned_job(w: &AuditEvent, others: &[&AuditEvent]) -> bool {
    w.resource == "jobs"
        && w.verb == "create"
        && others
            .iter()
            .max_by_key(|o| ts(&o.received))
            .is_some_and(|o| o.verb == "delete")
}

/// The Job creates that [`assert_writes_within_tenures_by`] lets through although their
/// name had been created before: late creates (outside their writer's tenure) that
/// landed after the next holders had deleted that Job. As (namespace, name) → how many.
pub fn returned_jobs_by(
    events: &[AuditEvent],
    max_shards: u32,
    shards_of: impl Fn(&AuditEvent) -> u32,
) -> BTreeMap<(String, String), usize> {
    let tenures = tenures(events, max_shards);
    let writes: Vec<&AuditEvent> = events
        .iter()
        .filter(|e| e.is_write() && e.succeeded() && e.user.starts_with("replica-"))
        .filter(|e| e.resource == "jobs")
        .collect();
    let mut out = BTreeMap::new();
    for w in writes.iter().filter(|w| w.verb == "create") {
        let shard = shard_of(&w.namespace, shards_of(w));
        let Lateness::After(until) = ended_before(&tenures[&shard], w) else {
            continue;
        };
        let others = written_by_others(&writes, w, until);
        if is_returned_job(w, &others) {
            *out.entry((w.namespace.clone(), w.name.clone()))
                .or_insert(0) += 1;
        }
    }
    out
}

/// The users that wrote in each namespace (GpuJobs and Jobs).
pub fn writers_by_namespace(events: &[AuditEvent]) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for e in events {
        if e.is_write() && e.succeeded() && matches!(e.resource.as_str(), "gpujobs" | "jobs") {
            out.entry(e.namespace.clone())
                .or_default()
                .insert(e.user.clone());
        }
    }
    out
}

/// No namespace written by two replicas within one lease duration, beyond what one of
/// them had in flight: for each replica's pair of consecutive writes (GpuJobs and Jobs)
/// in one namespace with another replica's write between them, the second is an
/// overlap unless the two are a lease duration apart (the shard moved away and came
/// back). At most `workers` overlaps per (namespace, replica, other writer's run): the
/// requests that had passed the fence when its term ended. Two replicas that both own a
/// namespace write it in turns, and go far past that. Returns what breaks the rule.
pub fn two_writers(events: &[AuditEvent], lease: Duration, workers: usize) -> Vec<String> {
    let mut by_ns: BTreeMap<&str, Vec<&AuditEvent>> = BTreeMap::new();
    for e in events.iter().filter(|e| {
        e.is_write()
            && e.succeeded()
            && e.user.starts_with("replica-")
            && matches!(e.resource.as_str(), "gpujobs" | "jobs")
    }) {
        by_ns.entry(e.namespace.as_str()).or_default().push(e);
    }
    let mut out = Vec::new();
    for (ns, mut writes) in by_ns {
        writes.sort_by_key(|e| ts(&e.received));
        // (writer, the other writer) → overlapping writes of the writer.
        let mut overlaps: BTreeMap<(&str, &str), Vec<&AuditEvent>> = BTreeMap::new();
        let mut last_by: BTreeMap<&str, usize> = BTreeMap::new();
        for (i, w) in writes.iter().enumerate() {
            if let Some(&j) = last_by.get(w.user.as_str()) {
                let between = writes[j + 1..i].iter().find(|o| o.user != w.user);
                let gap = ts(&w.received).duration_since(ts(&writes[j].received));
                if let Some(other) = between
                    && gap.as_secs_f64() < lease.as_secs_f64()
                {
                    overlaps
                        .entry((w.user.as_str(), other.user.as_str()))
                        .or_default()
                        .push(w);
                }
            }
            last_by.insert(w.user.as_str(), i);
        }
        for ((writer, other), ws) in overlaps {
            // One episode per hand-over: overlaps less than a lease duration apart.
            let mut episode: Vec<&AuditEvent> = Vec::new();
            let mut episodes = Vec::new();
            for e in ws {
                let apart = episode.last().map(|p: &&AuditEvent| {
                    ts(&e.received)
                        .duration_since(ts(&p.received))
                        .as_secs_f64()
                });
                if apart.is_some_and(|a| a >= lease.as_secs_f64()) {
                    episodes.push(std::mem::take(&mut episode));
                }
                episode.push(e);
            }
            episodes.push(episode);
            for ep in episodes.into_iter().filter(|ep| ep.len() > workers) {
                let first: Vec<String> = ep
                    .iter()
                    .take(3)
                    .map(|e| format!("{} {} {} {}", e.received, e.verb, e.resource, e.name))
                    .collect();
                out.push(format!(
                    "namespace {ns}: {writer} wrote {} times across {other}'s writes, each within a lease duration of its previous one (at most {workers} can be in flight): {first:?}",
                    ep.len()
                ));
            }
        }
    }
    out
}
