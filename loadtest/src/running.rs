//! `--until running`: the writes that bring each GpuJob from its creation to a running
//! attempt, the operator's and kube-controller-manager's, from the audit log.
//!
//! Pods run longer than the test, so no attempt ends during it and nothing is cleaned
//! up. Each write is given to the GpuJob it is for by its object's name (a GpuJob, its
//! Jobs `<gpujob>-<attempt>`, their pods `<job>-<suffix>`, a Service named after either).
//! A GpuJob's attempt ran when kwok, the fake nodes' kubelet, first had a pods/status
//! patch of one of its pods accepted (the patch that makes it Running; kwok writes
//! nothing more to a pod until it ends). A write is "to running" when the API server
//! received it before that patch; a write without a name (a create with generateName,
//! as the Job controller creates pods) cannot be given to a GpuJob and counts as to
//! running unless it came after every pod ran. Times are the API server's
//! (`requestReceivedTimestamp`), so no clock of this process enters the split.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use devcluster::audit::AuditEvent;
use devcluster::identity::OPERATOR_USER;
use futures::StreamExt;
use gpujob_operator::api::{GpuJob, LABEL_NAME, Phase};
use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};

/// The user kube-controller-manager's controllers write as in devcluster (it runs with
/// `--use-service-account-credentials=false`; its clients differ by User-Agent only).
pub const KCM_USER: &str = "system:kube-controller-manager";
/// The user kwok writes pods as in devcluster.
pub const KWOK_USER: &str = "devcluster:kwok";
/// What the operator writes to bring a GpuJob to running (Events aside).
pub const CONTROL: [&str; 4] = ["gpujobs", "jobs", "pods", "services"];

/// What the load generator sees of the load while it waits: which GpuJobs have a pod
/// Running (`namespace/name`), and when anything of the load last changed.
#[derive(Debug)]
pub struct Progress {
    running: Mutex<HashSet<String>>,
    last_change: Mutex<Instant>,
}

impl Default for Progress {
    fn default() -> Progress {
        Progress {
            running: Mutex::default(),
            last_change: Mutex::new(Instant::now()),
        }
    }
}

impl Progress {
    /// Something of the load changed now.
    pub fn touch(&self) {
        *self.last_change.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }

    /// How long nothing of the load has changed.
    pub fn quiet_for(&self) -> Duration {
        self.last_change
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .elapsed()
    }

    /// Is the GpuJob's attempt running: its status says Running (for the generation it
    /// has) and a pod of it is Running?
    pub fn is_running(&self, gj: &GpuJob) -> bool {
        let status_running = gj.status.as_ref().is_some_and(|s| {
            s.attempts >= 1
                && s.phase == Some(Phase::Running)
                && s.observed_generation.is_some()
                && s.observed_generation == gj.metadata.generation
        });
        status_running && {
            let key = format!(
                "{}/{}",
                gj.namespace().unwrap_or_default(),
                gpujob_operator::controller::job::name_label(&gj.name_any())
            );
            self.running
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains(&key)
        }
    }

    /// Watches the GpuJobs' pods (label `gpujob.dev/name`) until aborted.
    pub fn watch_pods(self: &Arc<Self>, admin: &Client) -> tokio::task::JoinHandle<()> {
        let api: Api<Pod> = Api::all(admin.clone());
        let me = self.clone();
        tokio::spawn(async move {
            let mut pods = watcher(api, watcher::Config::default().labels(LABEL_NAME))
                .default_backoff()
                .applied_objects()
                .boxed();
            while let Some(pod) = pods.next().await {
                let Ok(pod) = pod else { continue };
                me.touch();
                let running = pod
                    .status
                    .as_ref()
                    .and_then(|s| s.phase.as_deref())
                    .is_some_and(|p| p == "Running");
                if let (true, Some(owner)) = (running, pod.labels().get(LABEL_NAME)) {
                    let key = format!("{}/{owner}", pod.namespace().unwrap_or_default());
                    me.running
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(key);
                }
            }
        })
    }

    /// Watches every Job's metadata, only to know when they last changed, until aborted.
    pub fn watch_jobs(self: &Arc<Self>, admin: &Client) -> tokio::task::JoinHandle<()> {
        let api: Api<PartialObjectMeta<Job>> = Api::all(admin.clone());
        let me = self.clone();
        tokio::spawn(async move {
            let mut jobs = watcher(api, watcher::Config::default())
                .default_backoff()
                .boxed();
            while jobs.next().await.is_some() {
                me.touch();
            }
        })
    }
}

/// kube-controller-manager's client budget (`--kube-api-qps`, `--kube-api-burst`; each
/// controller's client has a budget of its own of this size).
#[derive(Debug, Clone, PartialEq)]
pub struct Budget {
    pub qps: f64,
    pub burst: u32,
    /// Where it comes from, for the report.
    pub source: String,
}

impl Budget {
    /// kube-controller-manager's defaults when its command line names neither flag.
    pub const DEFAULT_QPS: f64 = 20.0;
    pub const DEFAULT_BURST: u32 = 30;

    /// The budget a kube-controller-manager command line (without the program) asks for.
    pub fn from_args(args: &[String], source: &str) -> anyhow::Result<Budget> {
        let mut qps = Budget::DEFAULT_QPS;
        let mut burst = Budget::DEFAULT_BURST;
        for a in args {
            if let Some(v) = a.strip_prefix("--kube-api-qps=") {
                qps = v.parse()?;
            } else if let Some(v) = a.strip_prefix("--kube-api-burst=") {
                burst = v.parse()?;
            }
        }
        Ok(Budget {
            qps,
            burst,
            source: source.to_owned(),
        })
    }

    /// `QPS/BURST`, as `--kcm-api-budget` takes it.
    pub fn parse(text: &str) -> anyhow::Result<Budget> {
        let (qps, burst) = text
            .split_once('/')
            .ok_or_else(|| anyhow::anyhow!("{text:?}: expected QPS/BURST, e.g. 20/30"))?;
        Ok(Budget {
            qps: qps.trim().parse()?,
            burst: burst.trim().parse()?,
            source: "--kcm-api-budget".to_owned(),
        })
    }

    pub fn is_default(&self) -> bool {
        self.qps == Budget::DEFAULT_QPS && self.burst == Budget::DEFAULT_BURST
    }
}

/// Who wrote.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Writer {
    Operator,
    /// kube-controller-manager, by the controller named at the end of its User-Agent
    /// (`job-controller`, ...).
    Kcm(String),
}

impl Writer {
    fn of(e: &AuditEvent) -> Option<Writer> {
        if e.user == OPERATOR_USER {
            Some(Writer::Operator)
        } else if e.user == KCM_USER {
            let client = e.user_agent.rsplit('/').next().unwrap_or_default();
            Some(Writer::Kcm(client.to_owned()))
        } else {
            None
        }
    }

    fn label(&self) -> String {
        match self {
            Writer::Operator => "operator".to_owned(),
            Writer::Kcm(client) => format!("kube-controller-manager ({client})"),
        }
    }
}

/// Writes of one kind, by when they came.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Row {
    /// Before its GpuJob's pod ran.
    pub to_running: usize,
    /// After its GpuJob's pod ran, before every pod had.
    pub after_its_pod: usize,
    /// After every GpuJob's pod ran (the settle at the end).
    pub after_all: usize,
    /// Of `to_running`, answered ≥ 400.
    pub refused: usize,
}

impl Row {
    /// From the first create until every pod ran.
    pub fn window(&self) -> usize {
        self.to_running + self.after_its_pod
    }
}

/// What [`count`] found.
#[derive(Debug, Default)]
pub struct Writes {
    pub gpujobs: usize,
    /// GpuJobs whose pod ran, per the audit log.
    pub ran: usize,
    /// When the last of them ran (API server time); `None` unless every one did.
    pub all_ran_at: Option<Timestamp>,
    /// By writer, then `verb resource[/subresource]`.
    pub rows: BTreeMap<(Writer, String, String), Row>,
    /// The operator's writes to [`CONTROL`] resources to running: how many GpuJobs had
    /// each count.
    pub operator_per_gpujob: BTreeMap<usize, usize>,
    /// The Job controller's `jobs/status` writes to running: how many GpuJobs had each
    /// count.
    pub job_status_per_gpujob: BTreeMap<usize, usize>,
    /// Writes counted that name no object of a GpuJob of the load (creates with
    /// generateName).
    pub unnamed: usize,
}

impl Writes {
    /// Sum of `field` over the rows `keep` selects.
    pub fn sum(
        &self,
        keep: impl Fn(&Writer, &str, &str) -> bool,
        field: fn(&Row) -> usize,
    ) -> usize {
        self.rows
            .iter()
            .filter(|((w, verb, resource), _)| keep(w, verb, resource))
            .map(|(_, r)| field(r))
            .sum()
    }
}

/// The GpuJobs of the load, by namespace, to give writes to.
#[derive(Debug, Default)]
pub struct Owners(HashMap<String, HashSet<String>>);

impl Owners {
    pub fn new<'a>(gpujobs: impl IntoIterator<Item = (&'a str, String)>) -> Owners {
        let mut by_ns: HashMap<String, HashSet<String>> = HashMap::new();
        for (ns, name) in gpujobs {
            by_ns.entry(ns.to_owned()).or_default().insert(name);
        }
        Owners(by_ns)
    }

    fn len(&self) -> usize {
        self.0.values().map(HashSet::len).sum()
    }

    fn contains(&self, namespace: &str) -> bool {
        self.0.contains_key(namespace)
    }

    /// The GpuJob an object of `namespace` named `name` belongs to: the name itself or
    /// what is left after cutting up to three `-<part>` suffixes (`<gpujob>-<attempt>`,
    /// `<gpujob>-<attempt>-<pod suffix>`, an indexed pod's `-<index>-<suffix>`), the
    /// longest that names a GpuJob.
    pub fn of(&self, namespace: &str, name: &str) -> Option<(String, String)> {
        let names = self.0.get(namespace)?;
        let mut candidate = name;
        for _ in 0..=3 {
            if candidate.is_empty() {
                return None;
            }
            if names.contains(candidate) {
                return Some((namespace.to_owned(), candidate.to_owned()));
            }
            candidate = candidate.rsplit_once('-')?.0;
        }
        None
    }
}

/// When the API server received `e` (or, unreadable, answered it).
pub fn when(e: &AuditEvent) -> Option<Timestamp> {
    e.received.parse().or_else(|_| e.timestamp.parse()).ok()
}

/// Counts the operator's and kube-controller-manager's writes in the load's namespaces
/// (see the module's notes for how each is placed).
pub fn count(audit: &[AuditEvent], owners: &Owners) -> Writes {
    // When each GpuJob's pod ran: kwok's first accepted pods/status patch of it.
    let mut ran: HashMap<(String, String), Timestamp> = HashMap::new();
    for e in audit.iter().filter(|e| {
        e.user == KWOK_USER
            && e.verb == "patch"
            && e.resource == "pods"
            && e.subresource == "status"
            && e.succeeded()
    }) {
        if let (Some(owner), Some(at)) = (owners.of(&e.namespace, &e.name), when(e)) {
            ran.entry(owner)
                .and_modify(|t| *t = (*t).min(at))
                .or_insert(at);
        }
    }
    let gpujobs = owners.len();
    let all_ran_at = (ran.len() == gpujobs)
        .then(|| ran.values().max().copied())
        .flatten();

    let mut w = Writes {
        gpujobs,
        ran: ran.len(),
        all_ran_at,
        ..Writes::default()
    };
    let mut operator: HashMap<(String, String), usize> = HashMap::new();
    let mut job_status: HashMap<(String, String), usize> = HashMap::new();
    for e in audit
        .iter()
        .filter(|e| e.is_write() && owners.contains(&e.namespace))
    {
        let Some(writer) = Writer::of(e) else {
            continue;
        };
        let at = when(e);
        // An Event is named `<object>.<suffix>`.
        let name = match e.name.rsplit_once('.') {
            Some((object, _)) if e.resource == "events" => object,
            _ => e.name.as_str(),
        };
        let owner = owners.of(&e.namespace, name);
        if owner.is_none() {
            w.unnamed += 1;
        }
        let after_all = matches!((at, all_ran_at), (Some(a), Some(all)) if a > all);
        let after_its_pod = match (&owner, at) {
            (Some(o), Some(a)) => ran.get(o).is_some_and(|r| a >= *r),
            _ => false,
        };
        let resource = if e.subresource.is_empty() {
            e.resource.clone()
        } else {
            format!("{}/{}", e.resource, e.subresource)
        };
        let row = w
            .rows
            .entry((writer.clone(), e.verb.clone(), resource.clone()))
            .or_default();
        if after_all {
            row.after_all += 1;
        } else if after_its_pod {
            row.after_its_pod += 1;
        } else {
            row.to_running += 1;
            if e.code >= 400 {
                row.refused += 1;
            }
            if let Some(o) = owner {
                if writer == Writer::Operator && CONTROL.contains(&e.resource.as_str()) {
                    *operator.entry(o).or_default() += 1;
                } else if matches!(&writer, Writer::Kcm(_)) && resource == "jobs/status" {
                    *job_status.entry(o).or_default() += 1;
                }
            }
        }
    }
    for (ns, names) in &owners.0 {
        for name in names {
            let key = (ns.clone(), name.clone());
            *w.operator_per_gpujob
                .entry(operator.get(&key).copied().unwrap_or(0))
                .or_default() += 1;
            *w.job_status_per_gpujob
                .entry(job_status.get(&key).copied().unwrap_or(0))
                .or_default() += 1;
        }
    }
    w
}

/// Which rows to sum: by writer, verb, resource.
type Keep = fn(&Writer, &str, &str) -> bool;

fn is_control(w: &Writer, _verb: &str, resource: &str) -> bool {
    *w == Writer::Operator && CONTROL.contains(&resource.split('/').next().unwrap_or_default())
}

fn is_kcm(w: &Writer) -> bool {
    matches!(w, Writer::Kcm(_))
}

/// `3: 9990; 4: 10` (writes: GpuJobs).
fn spread(by_count: &BTreeMap<usize, usize>) -> String {
    let parts: Vec<String> = by_count
        .iter()
        .map(|(writes, gpujobs)| format!("{writes}: {gpujobs}"))
        .collect();
    parts.join("; ")
}

/// The section `--until running` adds to the report. `quiet`: how long after every
/// attempt ran the GpuJobs, Jobs and pods of the load stopped changing, or `None` if
/// they had not when the wait ended.
pub fn report(w: &Writes, budget: &Budget, quiet: Option<f64>, waited: f64) -> String {
    let n = w.gpujobs.max(1) as f64;
    let mut r = String::new();
    let _ = writeln!(r, "\n## Writes from creation to running\n");
    let _ = writeln!(
        r,
        "Every write to the load's namespaces by the operator (user {OPERATOR_USER}) and by \
         kube-controller-manager (user {KCM_USER}, by the client named in its User-Agent), from \
         the first create on (audit log). Pods run longer than the test: nothing ends or is \
         cleaned up. A GpuJob's attempt ran when kwok (the fake nodes' kubelet) first had a \
         pods/status patch of its pod accepted (Running). Each write is given to its GpuJob by \
         the object's name and counts **to running** when the API server received it before \
         that GpuJob's pod ran; a write that names no GpuJob's object (a create with generateName, \
         as the Job controller creates pods: {} here) counts to running unless it came after every \
         pod ran. \
         Then the settle: {}.\n",
        w.unnamed,
        match quiet {
            Some(q) => format!(
                "the GpuJobs, Jobs and pods of the load stopped changing {q:.1} s after every attempt ran"
            ),
            None => format!(
                "they were still changing {waited:.0} s after every attempt ran, when the wait ended"
            ),
        }
    );
    if w.all_ran_at.is_none() {
        let _ = writeln!(
            r,
            "**Only {} of {} GpuJobs' pods were seen running in the audit log**: writes of the others count as to running.\n",
            w.ran, w.gpujobs
        );
    }
    let operator = w.sum(is_control, |r| r.to_running);
    let _ = writeln!(r, "| measure | value |\n|---|---|");
    let _ = writeln!(
        r,
        "| **operator writes per GpuJob, creation to running** (gpujobs, jobs, pods, services; Events aside) | **{:.2}** ({operator}) |",
        operator as f64 / n
    );
    let _ = writeln!(
        r,
        "| GpuJobs by their count of those writes (writes: GpuJobs) | {} |",
        spread(&w.operator_per_gpujob)
    );
    let _ = writeln!(
        r,
        "| operator writes to those after its GpuJob's pod ran / after every pod ran | {} / {} |",
        w.sum(is_control, |r| r.after_its_pod),
        w.sum(is_control, |r| r.after_all)
    );
    let kcm_rows: [(&str, Keep); 2] = [
        (
            "**kube-controller-manager `jobs/status` writes**",
            |w, _, res| is_kcm(w) && res == "jobs/status",
        ),
        ("**kube-controller-manager pod creates**", |w, verb, res| {
            is_kcm(w) && verb == "create" && res == "pods"
        }),
    ];
    for (what, keep) in kcm_rows {
        let to = w.sum(keep, |r| r.to_running);
        let window = w.sum(keep, Row::window);
        let tail = w.sum(keep, |r| r.after_all);
        let _ = writeln!(
            r,
            "| {what}: to running; until every pod ran; in the settle | {to} (**{:.3}** per GpuJob); {window} ({:.3}); {tail} |",
            to as f64 / n,
            window as f64 / n,
        );
    }
    let _ = writeln!(
        r,
        "| GpuJobs by their count of `jobs/status` writes to running (writes: GpuJobs) | {} |",
        spread(&w.job_status_per_gpujob)
    );
    let all_kcm = w.sum(|w, _, _| is_kcm(w), Row::window);
    let _ = writeln!(
        r,
        "| all kube-controller-manager writes until every pod ran, per GpuJob | {:.2} ({all_kcm}) |",
        all_kcm as f64 / n
    );
    let _ = writeln!(
        r,
        "| kube-controller-manager client budget (each controller's client) | {} qps / {} burst ({}{}) |",
        budget.qps,
        budget.burst,
        if budget.is_default() {
            "its default, "
        } else {
            ""
        },
        budget.source
    );
    let _ = writeln!(
        r,
        "\n| writer | verb | resource | to running | per GpuJob | of which refused (≥ 400) | after its GpuJob's pod ran | after every pod ran |\n|---|---|---|---|---|---|---|---|"
    );
    for ((writer, verb, resource), row) in &w.rows {
        let _ = writeln!(
            r,
            "| {} | {verb} | {resource} | {} | {:.3} | {} | {} | {} |",
            writer.label(),
            row.to_running,
            row.to_running as f64 / n,
            row.refused,
            row.after_its_pod,
            row.after_all
        );
    }
    r
}

/// The GpuJobs of a load as the load test creates them: `load-i` in `namespaces[i % K]`.
pub fn load_owners(namespaces: &[String], gpujobs: usize) -> Owners {
    let k = namespaces.len().max(1);
    Owners::new((0..gpujobs).map(|i| (namespaces[i % k].as_str(), format!("load-{i}"))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(
        user: &str,
        agent: &str,
        verb: &str,
        res: &str,
        ns: &str,
        name: &str,
        at: u32,
    ) -> AuditEvent {
        let (resource, subresource) = res.split_once('/').unwrap_or((res, ""));
        AuditEvent {
            user: user.to_owned(),
            user_agent: agent.to_owned(),
            verb: verb.to_owned(),
            api_group: String::new(),
            resource: resource.to_owned(),
            subresource: subresource.to_owned(),
            namespace: ns.to_owned(),
            name: name.to_owned(),
            code: 200,
            timestamp: format!("2026-12-05T10:00:{at:02}.500000Z"),
            received: format!("2026-12-05T10:00:{at:02}.000000Z"),
            lease_holder: None,
        }
    }

    const JC: &str = "kube-controller-manager/v1.37.2 (linux/amd64) kubernetes/abc/job-controller";

    fn op(verb: &str, res: &str, name: &str, at: u32) -> AuditEvent {
        ev(
            OPERATOR_USER,
            "gpujob-operator/0.1.0 (load-1)",
            verb,
            res,
            "load-0",
            name,
            at,
        )
    }

    fn kcm(verb: &str, res: &str, name: &str, at: u32) -> AuditEvent {
        ev(KCM_USER, JC, verb, res, "load-0", name, at)
    }

    fn kwok(name: &str, at: u32) -> AuditEvent {
        ev(
            KWOK_USER,
            "kwok",
            "patch",
            "pods/status",
            "load-0",
            name,
            at,
        )
    }

    #[test]
    fn objects_are_given_to_the_gpujob_their_name_comes_from() {
        let owners = Owners::new([
            ("load-0", "load-1".to_owned()),
            ("load-0", "load-12".to_owned()),
        ]);
        let of = |name| owners.of("load-0", name).map(|(_, n)| n);
        assert_eq!(of("load-1").as_deref(), Some("load-1"));
        assert_eq!(of("load-1-1").as_deref(), Some("load-1"));
        assert_eq!(of("load-12-1").as_deref(), Some("load-12"));
        assert_eq!(of("load-12-1-x7k2p").as_deref(), Some("load-12"));
        assert_eq!(of("load-1-1-0-x7k2p").as_deref(), Some("load-1"));
        assert_eq!(of(""), None);
        assert_eq!(of("other-1"), None);
        assert_eq!(owners.of("load-9", "load-1"), None);
    }

    #[test]
    fn writes_count_to_running_until_their_gpujobs_pod_runs() {
        let owners = Owners::new([
            ("load-0", "load-0".to_owned()),
            ("load-0", "load-1".to_owned()),
        ]);
        let audit = vec![
            // load-0: create suspended, status, start; its pod runs at 5; then the
            // Job controller's ready count (after its pod ran) and a late status write.
            op("create", "jobs", "load-0-1", 1),
            op("patch", "gpujobs/status", "load-0", 1),
            kcm("update", "jobs/status", "load-0-1", 2),
            op("patch", "jobs", "load-0-1", 3),
            kcm("create", "pods", "", 3),
            kcm("update", "jobs/status", "load-0-1", 3),
            kwok("load-0-1-abcde", 5),
            kcm("update", "jobs/status", "load-0-1", 6),
            // load-1: the same, its pod runs at 8 (a refused kwok patch before does not count).
            op("create", "jobs", "load-1-1", 2),
            op("patch", "gpujobs/status", "load-1", 2),
            ev(
                OPERATOR_USER,
                "gpujob-operator/0.1.0 (load-1)",
                "create",
                "events",
                "load-0",
                "load-1.abc",
                2,
            ),
            op("patch", "jobs", "load-1-1", 4),
            kcm("create", "pods", "", 4),
            AuditEvent {
                code: 422,
                ..kwok("load-1-1-fghij", 7)
            },
            kwok("load-1-1-fghij", 8),
            // After every pod ran: the settle.
            kcm("update", "jobs/status", "load-1-1", 9),
            op("patch", "gpujobs/status", "load-1", 9),
            // Elsewhere, and the scheduler: not counted.
            ev(OPERATOR_USER, "x", "create", "jobs", "other", "load-0-1", 2),
            ev(
                "system:kube-scheduler",
                "s",
                "create",
                "pods/binding",
                "load-0",
                "load-0-1-abcde",
                4,
            ),
        ];
        let w = count(&audit, &owners);
        assert_eq!(w.ran, 2);
        assert_eq!(w.all_ran_at, Some("2026-12-05T10:00:08Z".parse().unwrap()));
        assert_eq!(w.unnamed, 2);
        assert_eq!(w.sum(is_control, |r| r.to_running), 6);
        assert_eq!(w.sum(is_control, |r| r.after_all), 1);
        assert_eq!(w.operator_per_gpujob, BTreeMap::from([(3, 2)]));
        let status = &w.rows[&(
            Writer::Kcm("job-controller".to_owned()),
            "update".to_owned(),
            "jobs/status".to_owned(),
        )];
        assert_eq!(
            status,
            &Row {
                to_running: 2,
                after_its_pod: 1,
                after_all: 1,
                refused: 0
            }
        );
        assert_eq!(w.job_status_per_gpujob, BTreeMap::from([(0, 1), (2, 1)]));
        let events = &w.rows[&(Writer::Operator, "create".to_owned(), "events".to_owned())];
        assert_eq!(events.to_running, 1);

        let budget = Budget::from_args(&[], "devcluster's flags").unwrap();
        let r = report(&w, &budget, Some(3.0), 10.0);
        assert!(r.contains("creation to running** (gpujobs, jobs, pods, services; Events aside) | **3.00** (6) |"), "{r}");
        assert!(r.contains("| 3: 2 |"), "{r}");
        assert!(r.contains("`jobs/status` writes**: to running; until every pod ran; in the settle | 2 (**1.000** per GpuJob); 3 (1.500); 1 |"), "{r}");
        assert!(r.contains("pod creates**: to running; until every pod ran; in the settle | 2 (**1.000** per GpuJob); 2 (1.000); 0 |"), "{r}");
        assert!(
            r.contains("| 20 qps / 30 burst (its default, devcluster's flags) |"),
            "{r}"
        );
        assert!(r.contains("| kube-controller-manager (job-controller) | update | jobs/status | 2 | 1.000 | 0 | 1 | 1 |"), "{r}");
        assert!(r.contains("stopped changing 3.0 s after"), "{r}");
    }

    #[test]
    fn a_gpujob_whose_pod_never_ran_is_said() {
        let owners = Owners::new([("load-0", "load-0".to_owned())]);
        let w = count(&[op("create", "jobs", "load-0-1", 1)], &owners);
        assert_eq!(w.all_ran_at, None);
        let budget = Budget::parse("300/600").unwrap();
        let r = report(&w, &budget, None, 60.0);
        assert!(r.contains("Only 0 of 1 GpuJobs' pods"), "{r}");
        assert!(r.contains("still changing 60 s after"), "{r}");
        assert!(
            r.contains("| 300 qps / 600 burst (--kcm-api-budget) |"),
            "{r}"
        );
    }

    #[test]
    fn the_budget_is_read_from_the_command_line() {
        let args = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let b = Budget::from_args(&args(&["--leader-elect=false"]), "x").unwrap();
        assert_eq!((b.qps, b.burst, b.is_default()), (20.0, 30, true));
        let b =
            Budget::from_args(&args(&["--kube-api-qps=300", "--kube-api-burst=600"]), "x").unwrap();
        assert_eq!((b.qps, b.burst, b.is_default()), (300.0, 600, false));
        assert!(Budget::from_args(&args(&["--kube-api-qps=x"]), "x").is_err());
        assert_eq!(Budget::parse("20/30").unwrap().burst, 30);
        assert!(Budget::parse("20").is_err());
    }
}
