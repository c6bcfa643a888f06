//! What a load run measured, and its Markdown report.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use devcluster::audit::AuditEvent;
use devcluster::identity::OPERATOR_USER;
use devcluster::metrics::Metrics;
use gpujob_operator::api::GpuJob;

#[derive(Debug)]
pub struct Setup<'a> {
    pub gpujobs: usize,
    pub replicas: u8,
    pub concurrency: usize,
    pub sim_duration_seconds: &'a str,
    pub profile: &'a str,
    pub namespace: &'a str,
}

/// Times since the first create.
#[derive(Debug, Default)]
pub struct Timeline {
    pub created: Duration,
    /// Every GpuJob has started its first attempt.
    pub all_started: Option<Duration>,
    pub all_finished: Duration,
    pub leader_killed: Option<(Duration, String)>,
    pub new_leader: Option<String>,
}

#[derive(Debug)]
pub struct Outcome {
    pub gpujobs: usize,
    pub phases: BTreeMap<String, usize>,
    /// Audit events (writes) since the first create.
    pub audit: Vec<AuditEvent>,
    /// `/metrics` text by replica.
    pub metrics: Vec<(String, String)>,
    /// Replica, peak RSS KiB, current RSS KiB.
    pub memory: Vec<(String, u64, u64)>,
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
    let in_ns: Vec<&AuditEvent> = ours
        .iter()
        .copied()
        .filter(|e| e.namespace == setup.namespace)
        .collect();
    let control: Vec<&AuditEvent> = in_ns
        .iter()
        .copied()
        .filter(|e| e.resource == "gpujobs" || e.resource == "jobs")
        .collect();
    let control_writes = control.len();
    let control_conflicts = control.iter().filter(|e| e.code == 409).count();
    let events = in_ns.iter().filter(|e| e.resource == "events").count();

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
    let mut by_replica: BTreeMap<&str, usize> = BTreeMap::new();
    for e in &ours {
        *by_replica.entry(e.user_agent.as_str()).or_default() += 1;
    }

    let mut r = String::new();
    let _ = writeln!(r, "# Load test report\n");
    let _ = writeln!(
        r,
        "{} GpuJobs (1 GPU, pods simulated to run {} s and succeed), created {} at a time, \
         against {} replicas of the operator ({} build, default flags: API budget 50 qps / 100 burst) \
         on a private devcluster (kube-apiserver 1.20 on this machine).\n",
        setup.gpujobs, setup.sim_duration_seconds, setup.concurrency, setup.replicas, setup.profile
    );
    let _ = writeln!(r, "| measure | value |\n|---|---|");
    let _ = writeln!(r, "| all GpuJobs created | {} |", secs(t.created));
    if let Some(s) = t.all_started {
        let _ = writeln!(r, "| every GpuJob's first attempt started | {} |", secs(s));
    }
    let _ = writeln!(
        r,
        "| every GpuJob finished | {} ({:.1} GpuJobs/s) |",
        secs(t.all_finished),
        n / t.all_finished.as_secs_f64().max(0.001)
    );
    let phases: Vec<String> = o.phases.iter().map(|(p, c)| format!("{p} {c}")).collect();
    let _ = writeln!(r, "| phases at the end | {} |", phases.join(", "));
    if let Some((at, killed)) = &t.leader_killed {
        let _ = writeln!(
            r,
            "| leader killed (kill -9) | {killed} at {}, {} took over |",
            secs(*at),
            t.new_leader.as_deref().unwrap_or("?")
        );
    }
    let _ = writeln!(
        r,
        "| operator writes to GpuJobs and Jobs, per GpuJob | {:.2} ({control_writes}) |",
        control_writes as f64 / n
    );
    let _ = writeln!(r, "| of which conflicts (409) | {control_conflicts} |");
    let _ = writeln!(
        r,
        "| Events written, per GpuJob | {:.2} ({events}) |",
        events as f64 / n
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
    for (who, peak, now) in &o.memory {
        let _ = writeln!(
            r,
            "| {who} resident memory, peak / at the end | {:.0} / {:.0} MiB |",
            *peak as f64 / 1024.0,
            *now as f64 / 1024.0
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
    let _ = writeln!(r, "\n## Writes by replica (User-Agent)\n");
    let _ = writeln!(r, "| replica | writes |\n|---|---|");
    for (agent, count) in &by_replica {
        let _ = writeln!(r, "| {agent} | {count} |");
    }
    r
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
}
