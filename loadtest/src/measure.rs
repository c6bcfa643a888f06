//! What a load run measured, and its Markdown report.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use devcluster::audit::AuditEvent;
use devcluster::identity::OPERATOR_USER;
use devcluster::metrics::Metrics;
use gpujob_operator::api::GpuJob;

use crate::replicas::{Holders, Memory, Takeover, held_by};

#[derive(Debug)]
pub struct Setup<'a> {
    pub gpujobs: usize,
    pub replicas: u8,
    pub shards: u32,
    /// Did kube-apiserver select objects by shard (`--sharded-watch`)?
    pub sharded_watch: bool,
    pub concurrency: usize,
    pub sim_duration_seconds: &'a str,
    pub profile: &'a str,
    /// The namespaces GpuJobs were spread over, round-robin (GpuJob i in `namespaces[i % K]`).
    pub namespaces: &'a [String],
    /// Cores of this machine, shared by the control plane, kwok and the replicas.
    pub cores: usize,
    /// `GPUJOB_*` variables the replicas inherited (flags other than the defaults).
    pub operator_env: Vec<(String, String)>,
}

/// The trickle: GpuJobs created one by one during the burst.
#[derive(Debug)]
pub struct TrickleFigures {
    pub created: usize,
    /// Seconds between two.
    pub every: f64,
    /// Create → first Job, sorted, for those whose Job was seen.
    pub latencies: Vec<Duration>,
}

/// Times since the first create.
#[derive(Debug, Default)]
pub struct Timeline {
    pub created: Duration,
    /// Every GpuJob has started its first attempt.
    pub all_started: Option<Duration>,
    pub all_finished: Option<Duration>,
    /// `--until running`: every GpuJob's attempt running (pod and status).
    pub all_running: Option<Duration>,
    /// `--until running`: from every attempt running until the load stopped changing
    /// (`None`: it had not when the wait ended).
    pub quiet: Option<Duration>,
    /// `--until running`: how long the settle was waited for.
    pub settle_waited: Duration,
    pub leader_killed: Option<(Duration, String)>,
    /// `--shards 1`: who held the Lease after the kill.
    pub new_leader: Option<String>,
    /// Sharded: the shards the killed replica held.
    pub killed_shards: Vec<u32>,
    /// Sharded: how the killed replica's shards were taken over.
    pub takeover: Option<Takeover>,
    /// Sharded: the shard holders once the replicas were up (before the first create).
    pub holders_at_start: Option<Vec<String>>,
    /// Sharded: the shard holders at the end.
    pub holders_at_end: Option<Holders>,
    pub trickle: Option<TrickleFigures>,
}

#[derive(Debug)]
pub struct Outcome {
    pub gpujobs: usize,
    pub phases: BTreeMap<String, usize>,
    /// Audit events (writes) since the first create.
    pub audit: Vec<AuditEvent>,
    /// `/metrics` text by replica.
    pub metrics: Vec<(String, String)>,
    /// Resident memory by replica (a killed one as of its kill).
    pub memory: Vec<Memory>,
}

pub fn phases(gpujobs: &[Arc<GpuJob>]) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for g in gpujobs {
        let phase = g
            .status
            .as_ref()
            .and_then(|s| s.phase)
            .map_or_else(|| "(none)".to_owned(), |p| format!("{p:?}"));
        *out.entry(phase).or_default() += 1;
    }
    out
}

/// `rest_client_requests_total` summed over the scrapes, by method.
pub fn requests_by_method(scrapes: &[(String, String)]) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for (who, text) in scrapes {
        let metrics = match Metrics::parse(text) {
            Ok(m) => m,
            Err(e) => {
                eprintln!("the /metrics of {who} do not parse: {e}");
                continue;
            }
        };
        for s in metrics
            .samples
            .iter()
            .filter(|s| s.name == "rest_client_requests_total")
        {
            let method = s.labels.get("method").cloned().unwrap_or_default();
            *out.entry(method).or_default() += s.value;
        }
    }
    out
}

/// The `gpujob_shards_held` gauge of each scrape, by replica.
pub fn shards_held(scrapes: &[(String, String)]) -> BTreeMap<String, f64> {
    per_replica(scrapes, "gpujob_shards_held", &[])
}

/// `name{labels}` summed, per replica that exports it.
pub fn per_replica(
    scrapes: &[(String, String)],
    name: &str,
    labels: &[(&str, &str)],
) -> BTreeMap<String, f64> {
    scrapes
        .iter()
        .filter_map(|(who, text)| {
            let m = Metrics::parse(text).ok()?;
            m.samples
                .iter()
                .any(|s| s.name == name)
                .then(|| (who.clone(), m.sum(name, labels)))
        })
        .collect()
}

/// The identity in a replica's User-Agent, `gpujob-operator/<version> (<identity>)`.
pub fn identity_of(user_agent: &str) -> &str {
    user_agent
        .rsplit_once('(')
        .and_then(|(_, rest)| rest.strip_suffix(')'))
        .unwrap_or(user_agent)
}

fn shard_list(shards: &[u32]) -> String {
    let list: Vec<String> = shards.iter().map(u32::to_string).collect();
    list.join(", ")
}

/// `load-1: 0, 3; load-2: 1, 4` (unheld shards under `(none)`).
fn holders_line<S: AsRef<str>>(holders: &[S]) -> String {
    let parts: Vec<String> = held_by(holders)
        .iter()
        .map(|(who, shards)| {
            let who = if who.is_empty() { "(none)" } else { who };
            format!("{who}: {}", shard_list(shards))
        })
        .collect();
    parts.join("; ")
}

/// The replicas' flags as the report states them.
pub fn flags(env: &[(String, String)]) -> String {
    if env.is_empty() {
        return "otherwise default flags: API budget 50 qps / 100 burst per replica".to_owned();
    }
    let set: Vec<String> = env.iter().map(|(k, v)| format!("`{k}={v}`")).collect();
    format!("otherwise default flags except {}", set.join(", "))
}

fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

pub fn report(setup: &Setup, t: &Timeline, o: &Outcome) -> String {
    let n = o.gpujobs as f64;
    let ours: Vec<&AuditEvent> = o
        .audit
        .iter()
        .filter(|e| e.user == OPERATOR_USER && e.is_write())
        .collect();
    let load_namespaces: BTreeSet<&str> = setup.namespaces.iter().map(String::as_str).collect();
    let in_ns: Vec<&AuditEvent> = ours
        .iter()
        .copied()
        .filter(|e| load_namespaces.contains(e.namespace.as_str()))
        .collect();
    let control: Vec<&AuditEvent> = in_ns
        .iter()
        .copied()
        .filter(|e| e.resource == "gpujobs" || e.resource == "jobs")
        .collect();
    let control_writes = control.len();
    let control_conflicts = control.iter().filter(|e| e.code == 409).count();
    let events = in_ns.iter().filter(|e| e.resource == "events").count();
    let events_failed = in_ns
        .iter()
        .filter(|e| e.resource == "events" && !e.succeeded())
        .count();

    let mut by_kind: BTreeMap<(String, String, u16), usize> = BTreeMap::new();
    for e in &ours {
        let resource = if e.subresource.is_empty() {
            e.resource.clone()
        } else {
            format!("{}/{}", e.resource, e.subresource)
        };
        *by_kind
            .entry((resource, e.verb.clone(), e.code))
            .or_default() += 1;
    }
    // Replica -> (writes, of which to GpuJobs and Jobs, of which refused or failed);
    // every replica gets a row.
    let mut by_replica: BTreeMap<String, (usize, usize, usize)> = o
        .memory
        .iter()
        .map(|m| (m.identity.clone(), (0, 0, 0)))
        .collect();
    for e in &ours {
        let row = by_replica
            .entry(identity_of(&e.user_agent).to_owned())
            .or_default();
        row.0 += 1;
        if e.code >= 400 {
            row.2 += 1;
        }
    }
    for e in &control {
        let row = by_replica
            .entry(identity_of(&e.user_agent).to_owned())
            .or_default();
        row.1 += 1;
    }
    let held_at_end = shards_held(&o.metrics);
    let killed = t.leader_killed.as_ref().map(|(_, who)| who.as_str());
    let k = setup.namespaces.len();
    let first_ns = setup.namespaces.first().map_or("", String::as_str);
    let last_ns = setup.namespaces.last().map_or("", String::as_str);

    let mut r = String::new();
    let _ = writeln!(r, "# Load test report\n");
    let sharding = if setup.shards == 1 {
        "`--shards 1`: one Lease, one leader".to_owned()
    } else {
        format!(
            "`--shards {}`: GpuJobs split by namespace hash (cuts balanced over the namespaces), one Lease per shard, shared out over the live replicas; {}",
            setup.shards,
            if setup.sharded_watch {
                "kube-apiserver selects objects by shard (`ShardedListAndWatch` on), so each replica lists and watches only its shards"
            } else {
                "kube-apiserver without `ShardedListAndWatch`, so every replica lists, watches and caches everything"
            }
        )
    };
    let namespaces = if k == 1 {
        format!("in 1 namespace ({first_ns})")
    } else {
        format!("spread round-robin over {k} namespaces ({first_ns} … {last_ns})")
    };
    let _ = writeln!(
        r,
        "{} GpuJobs (1 GPU, pods simulated to run {} s and succeed) {namespaces}, created {} at a time, \
         against {} of the operator ({} build; {sharding}; {}) on a private devcluster (Kubernetes v1.37, fake GPU nodes with room for every GpuJob, \
         on this machine). What bounds the result on one machine: kube-apiserver, etcd, \
         kube-controller-manager, kube-scheduler, kwok and every replica share this machine's {} cores.\n",
        setup.gpujobs,
        setup.sim_duration_seconds,
        setup.concurrency,
        if setup.replicas == 1 {
            "1 replica".to_owned()
        } else {
            format!("{} replicas", setup.replicas)
        },
        setup.profile,
        flags(&setup.operator_env),
        setup.cores
    );
    let _ = writeln!(r, "| measure | value |\n|---|---|");
    if let Some(start) = &t.holders_at_start {
        let _ = writeln!(
            r,
            "| shard holders before the first create | {} |",
            holders_line(start)
        );
    }
    let _ = writeln!(r, "| all GpuJobs created | {} |", secs(t.created));
    if let Some(s) = t.all_started {
        let _ = writeln!(r, "| every GpuJob's first attempt started | {} |", secs(s));
    }
    for (what, at) in [
        ("every GpuJob finished", t.all_finished),
        (
            "every GpuJob's attempt running (its pod Running, its status Running)",
            t.all_running,
        ),
    ] {
        if let Some(at) = at {
            let _ = writeln!(
                r,
                "| {what} | {} ({:.1} GpuJobs/s) |",
                secs(at),
                n / at.as_secs_f64().max(0.001)
            );
        }
    }
    if let Some(tr) = &t.trickle {
        let q = |x: f64| crate::trickle::quantile(&tr.latencies, x).map_or("–".to_owned(), secs);
        let _ = writeln!(
            r,
            "| trickle: create → first Job, p50 / p99 / max ({} GpuJobs created one every {} s in namespace {} during the burst; {} Jobs seen) | {} / {} / {} |",
            tr.created,
            tr.every,
            crate::trickle::NAMESPACE,
            tr.latencies.len(),
            q(0.5),
            q(0.99),
            q(1.0)
        );
    }
    let phases: Vec<String> = o.phases.iter().map(|(p, c)| format!("{p} {c}")).collect();
    let _ = writeln!(r, "| phases at the end | {} |", phases.join(", "));
    if let Some((at, killed)) = &t.leader_killed {
        if setup.shards == 1 {
            let _ = writeln!(
                r,
                "| leader killed (kill -9) | {killed} at {}, {} took over |",
                secs(*at),
                t.new_leader.as_deref().unwrap_or("?")
            );
        } else {
            let _ = writeln!(
                r,
                "| replica killed (kill -9), the one holding the most shards | {killed} at {}, holding shards {} |",
                secs(*at),
                shard_list(&t.killed_shards)
            );
            match &t.takeover {
                Some(tk) => {
                    let taken: Vec<String> = tk
                        .taken
                        .iter()
                        .map(|(shard, (who, after))| {
                            format!("shard {shard} → {who} after {}", secs(*after))
                        })
                        .collect();
                    let _ = writeln!(
                        r,
                        "| its shards unowned (kill until every shard held by a live replica) | {} ({}) |",
                        secs(tk.unowned),
                        taken.join(", ")
                    );
                    let _ = writeln!(
                        r,
                        "| shard holders once all were owned again | {} |",
                        holders_line(
                            &tk.holders
                                .iter()
                                .map(|h| h.clone().unwrap_or_default())
                                .collect::<Vec<_>>()
                        )
                    );
                }
                None => {
                    let _ = writeln!(r, "| its shards unowned | not measured |");
                }
            }
        }
    }
    let _ = writeln!(
        r,
        "| operator writes to GpuJobs and Jobs, per GpuJob | {:.2} ({control_writes}) |",
        control_writes as f64 / n
    );
    let _ = writeln!(r, "| of which conflicts (409) | {control_conflicts} |");
    let _ = writeln!(
        r,
        "| Events written, per GpuJob | {:.2} ({events}{}) |",
        events as f64 / n,
        if events_failed > 0 {
            format!(", of which {events_failed} not accepted")
        } else {
            String::new()
        }
    );
    let requests = requests_by_method(&o.metrics);
    if !requests.is_empty() {
        let total: f64 = requests.values().sum();
        let split: Vec<String> = requests
            .iter()
            .map(|(m, v)| format!("{m} {v:.0}"))
            .collect();
        let _ = writeln!(
            r,
            "| operator API requests of live replicas, per GpuJob | {:.2} ({}; leases included) |",
            total / n,
            split.join(", ")
        );
    }
    for m in &o.memory {
        let _ = writeln!(
            r,
            "| {} resident memory, peak / at the {} | {} / {} |",
            m.identity,
            if m.killed { "kill" } else { "end" },
            mib(m.peak_kib),
            mib(m.now_kib)
        );
    }

    let _ = writeln!(
        r,
        "\n## Operator writes (audit log, user {OPERATOR_USER})\n"
    );
    let _ = writeln!(r, "| resource | verb | code | count |\n|---|---|---|---|");
    for ((resource, verb, code), count) in &by_kind {
        let _ = writeln!(r, "| {resource} | {verb} | {code} | {count} |");
    }
    let _ = writeln!(r, "\n## Writes by replica (audit log, by User-Agent)\n");
    let _ = writeln!(
        r,
        "| replica | writes | to GpuJobs and Jobs | answered ≥ 400 | shards held at the end (`gpujob_shards_held`) | objects its watches received, GpuJobs / Jobs (`gpujob_watch_objects_total`) | cached at the end, GpuJobs / Jobs | peak RSS |\n|---|---|---|---|---|---|---|---|"
    );
    let figure = |name: &str, resource: &str| {
        let values = per_replica(&o.metrics, name, &[("resource", resource)]);
        move |who: &str| {
            values
                .get(who)
                .map_or_else(|| "?".to_owned(), |v| format!("{v:.0}"))
        }
    };
    let (received_g, received_j) = (
        figure("gpujob_watch_objects_total", "gpujobs"),
        figure("gpujob_watch_objects_total", "jobs"),
    );
    let (cached_g, cached_j) = (
        figure("gpujob_cached_objects", "gpujobs"),
        figure("gpujob_cached_objects", "jobs"),
    );
    for (who, (writes, control, failed)) in &by_replica {
        let held = match held_at_end.get(who) {
            Some(v) => format!("{v:.0}"),
            None if Some(who.as_str()) == killed => "— (killed)".to_owned(),
            None => "?".to_owned(),
        };
        let peak = o.memory.iter().find(|m| &m.identity == who).map_or_else(
            || "?".to_owned(),
            |m| {
                let at = if m.killed { " (at the kill)" } else { "" };
                format!("{}{at}", mib(m.peak_kib))
            },
        );
        let _ = writeln!(
            r,
            "| {who} | {writes} | {control} | {failed} | {held} | {} / {} | {} / {} | {peak} |",
            received_g(who),
            received_j(who),
            cached_g(who),
            cached_j(who),
        );
    }

    if setup.shards > 1 {
        let map = crate::replicas::shard_map(setup.namespaces, setup.shards);
        let mut per_shard: BTreeMap<u32, (usize, usize)> =
            (0..setup.shards).map(|s| (s, (0, 0))).collect();
        for (i, ns) in setup.namespaces.iter().enumerate() {
            // GpuJob j is in namespace j % k: namespace i holds ceil((gpujobs - i) / k).
            let gpujobs = setup.gpujobs.saturating_sub(i).div_ceil(k);
            let row = per_shard.entry(map.shard_of(ns)).or_default();
            row.0 += 1;
            row.1 += gpujobs;
        }
        let _ = writeln!(r, "\n## Shards at the end (shard Leases)\n");
        let _ = writeln!(
            r,
            "| shard | namespaces | GpuJobs | holder |\n|---|---|---|---|"
        );
        for (shard, (namespaces, gpujobs)) in &per_shard {
            let holder = t
                .holders_at_end
                .as_ref()
                .and_then(|h| h.get(usize::try_from(*shard).ok()?).cloned().flatten())
                .unwrap_or_else(|| "(none)".to_owned());
            let _ = writeln!(r, "| {shard} | {namespaces} | {gpujobs} | {holder} |");
        }
    }
    r
}

fn mib(kib: u64) -> String {
    format!("{:.0} MiB", kib as f64 / 1024.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_summed_per_method_across_replicas() {
        let text = "# TYPE rest_client_requests_total counter\n\
            rest_client_requests_total{code=\"200\",method=\"GET\"} 3\n\
            rest_client_requests_total{code=\"409\",method=\"PATCH\"} 1\n\
            rest_client_requests_total{code=\"200\",method=\"PATCH\"} 2\n\
            rest_client_requests_total_other{method=\"GET\"} 100\n";
        let other = "rest_client_requests_total{code=\"200\",method=\"GET\"} 2\n";
        let by = requests_by_method(&[("a".into(), text.into()), ("b".into(), other.into())]);
        assert_eq!(by.get("GET"), Some(&5.0));
        assert_eq!(by.get("PATCH"), Some(&3.0));
        assert_eq!(by.len(), 2);
    }

    #[test]
    fn replicas_are_named_by_the_identity_in_their_user_agent() {
        assert_eq!(identity_of("gpujob-operator/0.1.0 (load-2)"), "load-2");
        assert_eq!(identity_of("kubectl/v1.20"), "kubectl/v1.20");
    }

    #[test]
    fn shards_held_is_read_per_replica() {
        let a = "gpujob_shards_held 3\ngpujob_shards 6\n";
        let b = "gpujob_shards 6\n";
        let held = shards_held(&[("load-1".into(), a.into()), ("load-2".into(), b.into())]);
        assert_eq!(held.get("load-1"), Some(&3.0));
        assert_eq!(held.get("load-2"), None);
    }

    fn write(agent: &str, resource: &str, subresource: &str, ns: &str, code: u16) -> AuditEvent {
        AuditEvent {
            user: OPERATOR_USER.to_owned(),
            user_agent: format!("gpujob-operator/0.1.0 ({agent})"),
            verb: if subresource.is_empty() {
                "create"
            } else {
                "patch"
            }
            .to_owned(),
            api_group: String::new(),
            resource: resource.to_owned(),
            subresource: subresource.to_owned(),
            namespace: ns.to_owned(),
            name: "x".to_owned(),
            code,
            timestamp: String::new(),
            received: String::new(),
            lease_holder: None,
        }
    }

    #[test]
    fn a_sharded_report_counts_every_load_namespace_and_every_replica() {
        let namespaces: Vec<String> = (0..3).map(|i| format!("load-{i}")).collect();
        let setup = Setup {
            gpujobs: 2,
            replicas: 3,
            shards: 2,
            sharded_watch: true,
            concurrency: 1,
            sim_duration_seconds: "1",
            profile: "dev",
            namespaces: &namespaces,
            cores: 2,
            operator_env: vec![("GPUJOB_API_QPS".to_owned(), "2000".to_owned())],
        };
        let t = Timeline {
            leader_killed: Some((Duration::from_secs(1), "load-1".to_owned())),
            killed_shards: vec![0],
            takeover: Some(Takeover {
                unowned: Duration::from_millis(16_400),
                taken: BTreeMap::from([(0, ("load-2".to_owned(), Duration::from_secs(16)))]),
                holders: vec![Some("load-2".to_owned()), Some("load-3".to_owned())],
            }),
            holders_at_end: Some(vec![Some("load-2".to_owned()), Some("load-3".to_owned())]),
            ..Timeline::default()
        };
        let memory = |who: &str, killed| Memory {
            identity: who.to_owned(),
            peak_kib: 40 * 1024,
            now_kib: 30 * 1024,
            killed,
        };
        let o = Outcome {
            gpujobs: 2,
            phases: BTreeMap::from([("Succeeded".to_owned(), 2)]),
            audit: vec![
                write("load-2", "jobs", "", "load-0", 201),
                write("load-3", "jobs", "", "load-2", 201),
                write("load-3", "gpujobs", "status", "load-2", 200),
                write("load-1", "events", "", "load-1", 500),
                // Not a load namespace: no GpuJob's write.
                write("load-3", "jobs", "", "elsewhere", 201),
            ],
            metrics: vec![
                ("load-2".to_owned(), "gpujob_shards_held 1\n".to_owned()),
                (
                    "load-3".to_owned(),
                    "gpujob_shards_held 1\ngpujob_watch_objects_total{resource=\"gpujobs\"} 5\ngpujob_watch_objects_total{resource=\"jobs\"} 7\ngpujob_cached_objects{resource=\"gpujobs\"} 2\ngpujob_cached_objects{resource=\"jobs\"} 3\n".to_owned(),
                ),
            ],
            memory: vec![
                memory("load-1", true),
                memory("load-2", false),
                memory("load-3", false),
            ],
        };
        let r = report(&setup, &t, &o);
        assert!(r.contains("share this machine's 2 cores"), "{r}");
        assert!(r.contains("over 3 namespaces (load-0 … load-2)"), "{r}");
        assert!(r.contains("`--shards 2`"), "{r}");
        assert!(
            r.contains("default flags except `GPUJOB_API_QPS=2000`"),
            "{r}"
        );
        assert!(r.contains("per GpuJob | 1.50 (3) |"), "{r}");
        assert!(r.contains("(1, of which 1 not accepted)"), "{r}");
        assert!(
            r.contains("| 16.4 s (shard 0 → load-2 after 16.0 s) |"),
            "{r}"
        );
        assert!(
            r.contains(
                "| load-1 | 1 | 0 | 1 | — (killed) | ? / ? | ? / ? | 40 MiB (at the kill) |"
            ),
            "{r}"
        );
        assert!(
            r.contains("| load-3 | 3 | 2 | 0 | 1 | 5 / 7 | 2 / 3 | 40 MiB |"),
            "{r}"
        );
        assert!(r.contains("## Shards at the end"), "{r}");
    }

    #[test]
    fn holders_are_listed_by_replica() {
        let h = ["load-1", "load-2", "", "load-1"];
        assert_eq!(holders_line(&h), "(none): 2; load-1: 0, 3; load-2: 1");
    }
}
