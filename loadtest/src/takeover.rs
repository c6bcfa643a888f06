//! Takeover at scale (`--compare --takeover`): with every GpuJob converged, `kill -9` of
//! the replica doing the work; a survivor takes its Lease (or shards), looks at every
//! GpuJob, and should write nothing. Measures how long that takes, what it wrote, and
//! the survivor's memory.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::time::Duration;

use anyhow::{Context, bail};
use devcluster::ControlPlane;
use devcluster::identity::OPERATOR_USER;
use devcluster::metrics::Metrics;
use kube::Client;
use std::time::Instant;

use crate::measure::identity_of;
use crate::replicas::{Replicas, queue_depth};

const RECONCILES: &str = "controller_runtime_reconcile_total";

#[derive(Debug)]
pub struct Takeover {
    pub gpujobs: usize,
    pub killed: String,
    /// Kill → every Lease (shard) held by a survivor.
    pub held_after: Duration,
    /// Kill → the survivors reconciled at least once per GpuJob and their queues are empty.
    pub looked_after: Duration,
    /// Reconciles the survivors counted meanwhile.
    pub reconciles: f64,
    /// Writes to GpuJobs and Jobs in the load namespaces after the kill, by the survivors.
    pub writes: usize,
    /// Events the survivors wrote after the kill.
    pub events: usize,
    /// Events of the killed replica the audit log recorded after the kill began (its
    /// Events go out on a budget of their own, behind its writes).
    pub events_of_killed: usize,
    /// Each survivor: identity, peak RSS (KiB) before the kill and at the end.
    pub survivors: Vec<(String, u64, u64)>,
    /// The killed replica started again afterwards: start → ready (its caches loaded by
    /// a list of every GpuJob and Job), its peak RSS and its RSS 5 s after ready (KiB).
    pub restarted: (Duration, u64, u64),
}

/// Waits for the working replica's queue to drain, kills it, and measures the takeover.
pub async fn run(
    cluster: &ControlPlane,
    admin: &Client,
    replicas: &mut Replicas,
    gpujobs: usize,
    shards: u32,
    namespaces: &[String],
    deadline: Instant,
) -> anyhow::Result<Takeover> {
    // Quiet first: the echoes of the last writes are looked at before the kill.
    loop {
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
    let killed = if shards == 1 {
        replicas.kill_leader(admin).await?
    } else {
        replicas.kill_busiest(admin, shards).await?.0
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
    let (looked_after, reconciled) = loop {
        let scrapes = replicas.scrape().await;
        let done: f64 = scrapes
            .iter()
            .map(|(who, text)| reconciles(text) - before.get(who).copied().unwrap_or(0.0))
            .sum();
        let depth: f64 = scrapes
            .iter()
            .filter_map(|(_, text)| queue_depth(text).ok())
            .sum();
        if done >= gpujobs as f64 && depth == 0.0 {
            break (killed_at.elapsed(), done);
        }
        if Instant::now() >= deadline {
            bail!(
                "takeover: the survivors reconciled {done} times for {gpujobs} GpuJobs before the deadline"
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // Let the last writes, if any, reach the audit log.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let load: BTreeSet<&str> = namespaces.iter().map(String::as_str).collect();
    let (theirs, ours): (Vec<_>, Vec<_>) = audit
        .since(cursor)?
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
    // Started again, the killed replica loads every converged GpuJob and Job by a list,
    // as any replica (re)started in a running installation does: a standby's memory
    // there, which a replica that grew with the load does not show.
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
        killed,
        held_after,
        looked_after,
        reconciles: reconciled,
        writes,
        events,
        events_of_killed,
        survivors,
        restarted,
    })
}

/// Reconciles a replica counted, whatever their result.
fn reconciles(text: &str) -> f64 {
    Metrics::parse(text).map_or(0.0, |m| m.sum(RECONCILES, &[]))
}

/// The takeover as a Markdown section.
pub fn report(t: &Takeover) -> String {
    let mut r = String::new();
    let _ = writeln!(
        r,
        "\n## Takeover at scale\n\n\
         With all {} GpuJobs converged and the queues empty, `kill -9` of the replica that \
         did the work ({}); a survivor took over and looked at every GpuJob.\n",
        t.gpujobs, t.killed
    );
    let _ = writeln!(r, "| measure | value |\n|---|---|");
    let _ = writeln!(
        r,
        "| kill → every Lease held by a survivor | {:.1} s |",
        t.held_after.as_secs_f64()
    );
    let _ = writeln!(
        r,
        "| kill → every GpuJob looked at, queues empty | {:.1} s ({:.1} s after the takeover; {} reconciles) |",
        t.looked_after.as_secs_f64(),
        (t.looked_after.saturating_sub(t.held_after)).as_secs_f64(),
        t.reconciles
    );
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
            "| {who}: peak RSS as a standby → after the takeover | {} MiB → {} MiB |",
            before / 1024,
            after / 1024
        );
    }
    let (ready, peak, now) = t.restarted;
    let _ = writeln!(
        r,
        "| {} started again, a standby loading every GpuJob and Job by a list: start → ready; peak RSS; RSS 5 s later | {:.1} s; {} MiB; {} MiB |",
        t.killed,
        ready.as_secs_f64(),
        peak / 1024,
        now / 1024
    );
    r
}
