//! The view: what this replica knows of each GpuJob, kept in one place, with no
//! client. It alone holds the caches the watches fill (`cache/`), the memory of what
//! this replica wrote and read that the caches have not shown yet (`memory.rs`) and
//! where each shard's term began (`term_start.rs`). What goes in: watch events
//! ([`View::gpujob_event`], [`View::job_event`], [`View::pod_event`]), the executor's
//! outcomes ([`View::record`]: writes accepted, what its reads found), and the watches'
//! and hand-over's changes of scope ([`View::watching`], [`View::listed`],
//! [`View::drop_part`], [`View::shards_lost`]). What comes out: a reconcile's snapshot
//! ([`View::snapshot`], `observe.rs`, which alone says whether a version is current in a
//! term; a worker's snapshot may also offer its reconcile the read of where the term
//! began, one reconcile of a namespace at a time, until an outcome says it was read or
//! declined: [`View::snapshot_from_caches`] never does), and
//! what the caches hold for the queue, the metrics and readiness.
//!
//! What the GpuJob and Job caches cover (every object, or some shards': `scope.rs`)
//! decides which GpuJobs may be reconciled ([`View::covers`]). The pod cache is not
//! waited for: it only tells a plan that a pod waits at the gate (or finds no node), and
//! the gate lets a pod go only after a read of the API server.

pub mod cache;
mod memory;
mod observe;
pub mod scope;
mod term_start;

use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::Event;

use super::{Fence, Key};
use crate::api::GpuJob;
use crate::controller::domain::Facts;
use crate::controller::seen_job::SeenJob;
use crate::controller::seen_pod::SeenPod;
use cache::{GpuJobCache, JobIndex, PodIndex, owner_of};
use memory::WriteMemory;
pub use observe::Snapshot;

/// GpuJobs to look at, by whether the operator ever observed them. `observed`: it
/// recorded a status of them (an earlier holder of their shard, or this replica in an
/// earlier term); in a gained shard, what became of them since is looked at first (the
/// first-look lane). `new`: never observed, new work like any GpuJob created now (the
/// prompt lane, where each namespace's work under way, such as the pods its Jobs bring
/// to the gate, comes before its new GpuJobs).
#[derive(Debug, Default)]
pub struct ObservedOrNew {
    pub observed: Vec<Key>,
    pub new: Vec<Key>,
}

impl ObservedOrNew {
    fn of(keys: Vec<(Key, bool)>) -> ObservedOrNew {
        let mut sorted = ObservedOrNew::default();
        for (key, observed) in keys {
            if observed {
                sorted.observed.push(key);
            } else {
                sorted.new.push(key);
            }
        }
        sorted
    }

    pub fn all(&self) -> Vec<Key> {
        self.observed.iter().chain(&self.new).cloned().collect()
    }
}
use scope::{Cached, Coverage, Scope};
use term_start::{Offer, TermStarts};

/// What became of a write the executor sent, or what one of its reads found, as the view
/// must remember it.
#[derive(Debug)]
pub enum Outcome {
    /// The API server accepted a write of the GpuJob (status or finalizers) made from
    /// version `replaced`, and answered with `written`.
    GpuJobWritten {
        replaced: String,
        written: Arc<GpuJob>,
    },
    /// A Job was created, or found already created for this GpuJob (adopted).
    JobCreated(Box<Job>),
    /// Job `name`, made suspended by an earlier version, got the scheduling gate from
    /// version `replaced`: handed to Kueue LocalQueue `queue`, or, without one, started.
    JobGated {
        name: String,
        replaced: String,
        queue: Option<String>,
    },
    /// Job `name` (uid `uid`) was deleted; `foreground`: it stays until its pods are gone.
    JobDeleted {
        name: String,
        uid: String,
        foreground: bool,
    },
    /// A write to Job `name` was refused for its resourceVersion: a copy remembered of
    /// it is stale.
    JobConflict { name: String },
    /// The pod with `uid` was let go (its scheduling gate removed).
    PodUngated { uid: String },
    /// A confirming read of the GpuJob, whose snapshot was at version `seen`, found
    /// `read`: at `seen`, current in this term; past it, the snapshot follows it.
    GpuJobRead { seen: String, read: Arc<GpuJob> },
    /// A confirming read found the GpuJob gone, or replaced by a new one of its name.
    GpuJobGone,
    /// A read found a Job of the GpuJob's that the Job cache does not have (yet).
    JobRead(Box<SeenJob>),
    /// Where the term of the reconcile's shard began, as read in its namespace (`None`:
    /// the read failed), and the version each GpuJob of the namespace was at then
    /// (name, resourceVersion): current in the term, as if each had been read alone.
    TermStart {
        start: Option<u64>,
        listed: Vec<(String, String)>,
    },
    /// The snapshot offered the read of the term's start, and the run did not make it
    /// (its plan needed no confirmed view, or the run ended first): the next reconcile
    /// that needs it is offered it.
    TermStartDeclined,
}

/// What reconciles see.
#[derive(Default)]
pub struct View {
    gpujobs: GpuJobCache,
    jobs: JobIndex,
    pods: PodIndex,
    /// The pods on each of MultiKueue's worker clusters, by the worker's name: each fed
    /// by a watch of its own, of everything there (`runner/watches.rs`).
    worker_pods: Vec<(String, PodIndex)>,
    memory: WriteMemory,
    term_starts: TermStarts,
    coverage: Coverage,
}

impl std::fmt::Debug for View {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("View")
            .field("gpujobs", &self.gpujobs.len())
            .field("jobs", &self.jobs.len())
            .field("pods", &self.pods.len())
            .finish_non_exhaustive()
    }
}

impl View {
    /// A view with a pod cache for each of MultiKueue's worker clusters `workers`.
    pub fn with_workers<'w>(workers: impl IntoIterator<Item = &'w str>) -> View {
        View {
            worker_pods: workers
                .into_iter()
                .map(|w| (w.to_owned(), PodIndex::default()))
                .collect(),
            ..View::default()
        }
    }

    /// A GpuJob watch event: into the cache; a GpuJob delivered settles what the memory
    /// kept of the status writes it shows. Returns, at the end of a relist, the GpuJobs
    /// it changed ([`GpuJobCache::apply`]).
    pub fn gpujob_event(&self, event: &Event<GpuJob>, part: &Scope) -> Vec<Key> {
        let changed = self.gpujobs.apply(event, part);
        if let Event::Apply(gj) = event
            && gj.status.is_some()
        {
            self.memory.gpujob_seen(&Key::of(gj), gj);
        }
        changed
    }

    /// A Job watch event: into the index; what the memory kept about that Job goes.
    /// Returns the GpuJobs to look at because of it: the event's (`touched`; at the end
    /// of a relist, those whose Jobs it changed), and at the end of a relist also every
    /// GpuJob of `part` the memory spoke of (`relisted`: a Job may have come and gone
    /// between two lists, unseen).
    pub fn job_event(&self, event: &Event<Job>, part: &Scope) -> JobEventKeys {
        let touched = self.jobs.apply(event, part);
        if let Event::Apply(job) | Event::Delete(job) = event
            && let Some((key, _)) = owner_of(job)
        {
            self.memory
                .job_seen(&key, job, matches!(event, Event::Delete(_)));
        }
        let relisted = if matches!(event, Event::InitDone) {
            self.memory.jobs_relisted(|k| part.contains(&k.namespace))
        } else {
            Vec::new()
        };
        JobEventKeys { touched, relisted }
    }

    /// A pod watch event: into the pod cache. Returns the GpuJobs whose gate has
    /// something to do because of it ([`PodIndex::apply`]: a pod newly waiting at the
    /// gate, one that could run and no longer can, one gone, one the scheduler newly found
    /// no node for; at the end of a relist, those
    /// whose pods it changed so), found through the pods' Jobs in the Job cache.
    pub fn pod_event(&self, event: &Event<Pod>, part: &Scope) -> Vec<Key> {
        self.pods.apply(event, part, &self.jobs)
    }

    /// The cached pods labelled with the GpuJob uid `uid` (with those this replica let
    /// go shown so while the cache lags). Enough to tell that a pod waits at the gate,
    /// never to let it go.
    pub fn pods_of(&self, key: &Key, uid: &str) -> Vec<Arc<SeenPod>> {
        self.memory.pods(key, uid, || {
            let mut pods = self.pods.pods_of(uid);
            for (worker, index) in &self.worker_pods {
                pods.extend(
                    index
                        .pods_of(uid)
                        .into_iter()
                        .map(|p| self.on_worker(worker, p)),
                );
            }
            pods
        })
    }

    /// A pod event of the watch of worker cluster `worker` (MultiKueue): as
    /// [`View::pod_event`], into that worker's pod cache.
    pub fn worker_pod_event(&self, worker: &str, event: &Event<Pod>) -> Vec<Key> {
        self.worker_pods
            .iter()
            .find(|(w, _)| w == worker)
            .map(|(_, index)| index.apply(event, &Scope::All, &self.jobs))
            .unwrap_or_default()
    }

    /// A cached pod of worker cluster `worker`, as the plan sees it: a pod of a Job
    /// named as a dispatched Job here counts as that Job's. By name only: the cache may
    /// lag, and the plan decides nothing from it but that a read is due (or which reads
    /// to make); the gate acts on the read, which tells the live copy's pods from older
    /// ones (`multikueue::as_managed`). A gated pod of an older copy looks like the
    /// current one's here, which costs a pod read, not a wrong start.
    fn on_worker(&self, worker: &str, pod: Arc<SeenPod>) -> Arc<SeenPod> {
        let mut pod = Arc::unwrap_or_clone(pod);
        pod.cluster = Some(worker.to_owned());
        let here = pod
            .job
            .as_deref()
            .and_then(|j| self.jobs.job(&pod.namespace, j));
        if let Some(job) = here.filter(SeenJob::dispatched) {
            pod.job_uid = job.uid;
        }
        Arc::new(pod)
    }

    /// The shards for which `lost` holds changed hands: what this replica knew of their
    /// GpuJobs' writes is dropped (another replica may write them now).
    pub fn shards_lost(&self, lost: impl Fn(&Key) -> bool) {
        self.term_starts.forget_where(|ns| lost(&Key::new(ns, "")));
        self.memory.forget_where(lost);
    }

    /// The watches start again for `next` (this replica's shards changed).
    pub fn watching(&self, next: &Scope) {
        self.coverage.watching(next);
    }

    /// A list of `scope` into `which` cache completed. Returns the shards both caches
    /// cover now and did not before: every GpuJob of them is due a look.
    pub fn listed(&self, which: Cached, scope: &Scope) -> Option<Scope> {
        self.coverage.listed(which, scope)
    }

    /// The watches of `part` stopped (its shard is neither held nor kept warm): what
    /// they filled leaves the caches. Call after [`View::watching`].
    pub fn drop_part(&self, part: &Scope) {
        self.gpujobs.drop_part(part);
        self.jobs.drop_part(part);
        self.pods.drop_part(part);
    }

    /// Nothing to watch (no shard held): the caches are empty (each shard's part left
    /// when its watches stopped) and cover nothing, which counts as listed (a replica
    /// holding nothing is ready).
    pub fn watch_nothing(&self, empty: &Scope) {
        self.gpujobs.apply(&Event::Init, empty);
        self.gpujobs.apply(&Event::InitDone, empty);
        self.jobs.apply(&Event::Init, empty);
        self.jobs.apply(&Event::InitDone, empty);
        self.pods.apply(&Event::Init, empty, &self.jobs);
        self.pods.apply(&Event::InitDone, empty, &self.jobs);
        self.coverage.listed(Cached::GpuJobs, empty);
        self.coverage.listed(Cached::Jobs, empty);
    }

    /// Do both caches hold every GpuJob and Job of `namespace`? A GpuJob is reconciled
    /// only then.
    pub fn covers(&self, namespace: &str) -> bool {
        self.coverage.covers(namespace)
    }

    /// Do both caches hold every GpuJob and Job of shard `shard`?
    pub fn covers_shard(&self, shard: u32) -> bool {
        self.coverage.covers_shard(shard)
    }

    /// Resolves once the GpuJob and Job caches hold a full list (the pod cache is not
    /// waited for: a pod it has not listed yet is queued by its Job's first list, or by
    /// its own, whichever completes last).
    pub async fn wait_ready(&self) {
        self.gpujobs.wait_ready().await;
        self.jobs.wait_ready().await;
    }

    /// How many GpuJobs, Jobs and pods the caches hold.
    pub fn cached(&self) -> (usize, usize, usize) {
        (self.gpujobs.len(), self.jobs.len(), self.pods.len())
    }

    /// Every cached GpuJob's key.
    pub fn keys(&self) -> Vec<Key> {
        self.gpujobs.keys()
    }

    /// The cached GpuJobs of namespaces for which `pick` holds, by whether they were
    /// ever observed.
    pub fn keys_where(&self, pick: impl Fn(&str) -> bool) -> ObservedOrNew {
        ObservedOrNew::of(self.gpujobs.keys_observed_where(pick))
    }

    /// `keys`, by whether their GpuJobs were ever observed.
    pub fn sort_observed(&self, keys: Vec<Key>) -> ObservedOrNew {
        ObservedOrNew::of(self.gpujobs.observed(keys))
    }

    /// Runs `f` over the domain gauges' facts of the cached GpuJobs of the namespaces
    /// for which `pick` holds ([`GpuJobCache::facts_where`]).
    pub fn facts_where<R>(
        &self,
        pick: impl Fn(&str) -> bool,
        f: impl FnOnce(&mut dyn Iterator<Item = (&str, Facts)>) -> R,
    ) -> R {
        self.gpujobs.facts_where(pick, f)
    }

    /// What a reconcile of `key` starts from, in the term `fence`; `None` when the
    /// GpuJob is gone.
    pub fn snapshot(&self, key: &Key, fence: &Fence) -> Option<Snapshot> {
        observe::observe(self, key, fence, Offer::May)
    }

    /// As [`View::snapshot`], for a look that makes no request (a first look from the
    /// caches): never offered the read of where the term began (`term_start_due` false),
    /// which a worker's reconcile of the namespace is offered instead.
    pub fn snapshot_from_caches(&self, key: &Key, fence: &Fence) -> Option<Snapshot> {
        observe::observe(self, key, fence, Offer::Never)
    }

    /// Remembers what the executor's writes did and its reads found, in order, and lets
    /// `snap` follow them: until the caches catch up, reconciles see these. Returns
    /// `false` when the GpuJob is gone.
    pub fn record(
        &self,
        key: &Key,
        fence: &Fence,
        snap: &mut Snapshot,
        outcomes: Vec<Outcome>,
    ) -> bool {
        for outcome in outcomes {
            match outcome {
                Outcome::GpuJobWritten { replaced, written } => {
                    self.remember(key, fence, snap, replaced, written);
                }
                Outcome::JobCreated(job) => match SeenJob::of(&job) {
                    Some(seen) => {
                        self.memory.job_created(key, &snap.gpujob, &seen);
                        snap.jobs.push(Arc::new(seen));
                    }
                    // Every Job this operator creates is controlled by its GpuJob.
                    None => tracing::error!(
                        gpujob = %key,
                        job = job.metadata.name.as_deref().unwrap_or_default(),
                        "a created Job without a GpuJob controller reference cannot be seen; the GpuJob waits for its cache"
                    ),
                },
                Outcome::JobGated {
                    name,
                    replaced,
                    queue,
                } => {
                    self.memory
                        .job_gated(key, &snap.gpujob, name, replaced, queue);
                    self.show_remembered_jobs(key, snap);
                }
                Outcome::JobDeleted {
                    name,
                    uid,
                    foreground,
                } => {
                    self.memory
                        .job_deleted(key, &snap.gpujob, name, uid, foreground);
                    self.show_remembered_jobs(key, snap);
                }
                Outcome::JobConflict { name } => self.memory.job_stale(key, &name),
                Outcome::PodUngated { uid } => {
                    for p in &mut snap.cached_pods {
                        if p.uid.as_deref() == Some(uid.as_str()) {
                            Arc::make_mut(p).gated = false;
                        }
                    }
                    self.memory.pod_ungated(key, &snap.gpujob, uid);
                }
                Outcome::GpuJobRead { seen, read } => {
                    if read.metadata.resource_version.as_deref() == Some(seen.as_str()) {
                        // Current: so is this view for the rest of the term.
                        self.memory.mark_current(key, fence.epoch, &seen);
                        snap.confirmed = true;
                    } else {
                        self.remember(key, fence, snap, seen, read);
                        // The rest of the snapshot (the Jobs above all) came from caches
                        // as far behind as the GpuJob was: observe again, from the
                        // current GpuJob (remembered), so that a running attempt whose
                        // Job the cache has not seen is read rather than taken for lost.
                        match observe::observe(self, key, fence, Offer::May) {
                            Some(again) => *snap = again,
                            None => return false,
                        }
                    }
                }
                Outcome::GpuJobGone => {
                    self.memory.forget(key);
                    return false;
                }
                Outcome::JobRead(job) => {
                    // Remembered until the cache has it: should it go before then, only
                    // the relist ending the lag can say so, and it names GpuJobs by this
                    // memory.
                    self.memory.job_read(key, &snap.gpujob, &job);
                    if !snap.jobs.iter().any(|j| j.name == job.name) {
                        snap.jobs.push(Arc::new(*job));
                    }
                }
                Outcome::TermStartDeclined => {
                    self.term_starts
                        .declined(fence.shard, &key.namespace, fence.epoch);
                    snap.term_start_due = false;
                }
                Outcome::TermStart { start, listed } => {
                    let now = Instant::now();
                    for (name, rv) in listed {
                        // Only GpuJobs still cached: one deleted since the list has been
                        // forgotten already, and its mark would stay.
                        let listed = Key::new(&key.namespace, &name);
                        if self.gpujobs.contains(&listed) {
                            self.memory.mark_current(&listed, fence.epoch, &rv);
                        }
                    }
                    self.term_starts
                        .learned(fence.shard, &key.namespace, fence.epoch, start, now);
                    let rv = snap.gpujob.metadata.resource_version.clone();
                    let covered = observe::currency(
                        self,
                        key,
                        fence,
                        rv.as_deref().unwrap_or_default(),
                        now,
                        Offer::May,
                    );
                    snap.confirmed = covered.past;
                    snap.term_start_due = covered.due;
                }
            }
        }
        true
    }

    /// The snapshot and the memory follow a GpuJob this replica just wrote, or read from
    /// the API server past a lagging cache. Kept without managedFields, as the cache
    /// keeps GpuJobs: nothing reads them.
    fn remember(
        &self,
        key: &Key,
        fence: &Fence,
        snap: &mut Snapshot,
        replaced: String,
        mut written: Arc<GpuJob>,
    ) {
        if written.metadata.managed_fields.is_some() {
            Arc::make_mut(&mut written).metadata.managed_fields = None;
        }
        let rv = written
            .metadata
            .resource_version
            .clone()
            .unwrap_or_default();
        self.memory.mark_current(key, fence.epoch, &rv);
        self.memory.status_written(key, replaced, written.clone());
        snap.gpujob = written;
        snap.confirmed = true;
    }

    /// The snapshot's Jobs as the memory now shows them, after a Job write it recorded.
    fn show_remembered_jobs(&self, key: &Key, snap: &mut Snapshot) {
        let uid = snap.gpujob.metadata.uid.clone().unwrap_or_default();
        let shown = std::mem::take(&mut snap.jobs);
        snap.jobs = self.memory.jobs(key, &uid, || shown);
    }
}

/// The GpuJobs a Job event concerns.
#[derive(Debug, Default)]
pub struct JobEventKeys {
    /// The GpuJobs that had or have the Job (every one with a Job, after a relist).
    pub touched: Vec<Key>,
    /// After a relist: the GpuJobs whose Jobs the memory spoke of.
    pub relisted: Vec<Key>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn gpujob(rv: &str, attempts: i32) -> GpuJob {
        serde_json::from_value(json!({
            "apiVersion": "gpujob.dev/v1", "kind": "GpuJob",
            "metadata": {"name": "a", "namespace": "ns", "uid": "u1", "resourceVersion": rv},
            "spec": {"image": "i", "gpus": 1},
            "status": {"attempts": attempts},
        }))
        .unwrap()
    }

    #[test]
    fn what_the_executors_reads_found_is_what_the_next_snapshot_shows() {
        let view = View::default();
        let key = Key::new("ns", "a");
        let fence = Fence { shard: 0, epoch: 1 };
        view.gpujob_event(&Event::Apply(gpujob("10", 1)), &Scope::All);
        // A look from the caches, which makes no request, is not offered the read; nor
        // does it keep it from the next reconcile (a worker's, meanwhile or after).
        let from_caches = view.snapshot_from_caches(&key, &fence).unwrap();
        assert!(!from_caches.confirmed && !from_caches.term_start_due);
        let mut snap = view.snapshot(&key, &fence).unwrap();
        assert!(!snap.confirmed, "nothing read in this term yet");
        assert!(
            snap.term_start_due,
            "the first reconcile is offered the term's start"
        );
        assert!(
            !view
                .snapshot_from_caches(&key, &fence)
                .unwrap()
                .term_start_due
        );
        assert!(
            !view.snapshot(&key, &fence).unwrap().term_start_due,
            "one at a time"
        );

        // Declined: offered to the next at once.
        assert!(view.record(&key, &fence, &mut snap, vec![Outcome::TermStartDeclined]));
        assert!(view.snapshot(&key, &fence).unwrap().term_start_due);

        // A confirming read at the snapshot's version: current for the rest of the term.
        let read = |rv, attempts| Outcome::GpuJobRead {
            seen: "10".into(),
            read: Arc::new(gpujob(rv, attempts)),
        };
        assert!(view.record(&key, &fence, &mut snap, vec![read("10", 1)]));
        assert!(snap.confirmed);
        assert!(view.snapshot(&key, &fence).unwrap().confirmed);
        let next_term = Fence { shard: 0, epoch: 2 };
        assert!(!view.snapshot(&key, &next_term).unwrap().confirmed);

        // Moved on: the snapshot follows the version read, confirmed, and so does the next.
        let mut snap = view.snapshot(&key, &next_term).unwrap();
        assert!(view.record(&key, &next_term, &mut snap, vec![read("12", 2)]));
        assert_eq!(snap.gpujob.metadata.resource_version.as_deref(), Some("12"));
        assert!(snap.confirmed);
        let again = view.snapshot(&key, &next_term).unwrap();
        assert_eq!(again.gpujob.status.as_ref().unwrap().attempts, 2);

        // A Job read past the cache shows until the cache has it.
        let job: Job = serde_json::from_value(json!({"metadata": {
            "name": "a-2", "namespace": "ns", "uid": "j2", "resourceVersion": "11",
            "labels": {crate::api::LABEL_UID: "u1", "gpujob.dev/attempt": "2"},
            "ownerReferences": [{"apiVersion": "gpujob.dev/v1", "kind": "GpuJob",
                "name": "a", "uid": "u1", "controller": true}],
        }}))
        .unwrap();
        let seen = SeenJob::of(&job).unwrap();
        assert!(view.record(
            &key,
            &next_term,
            &mut snap,
            vec![Outcome::JobRead(Box::new(seen))]
        ));
        assert!(snap.jobs.iter().any(|j| j.name == "a-2"));
        assert!(
            view.snapshot(&key, &next_term)
                .unwrap()
                .jobs
                .iter()
                .any(|j| j.name == "a-2")
        );

        // The term's start, read: versions past it are current, others not.
        let third = Fence { shard: 0, epoch: 3 };
        let mut snap = view.snapshot(&key, &third).unwrap();
        assert!(snap.term_start_due && !snap.confirmed);
        view.record(
            &key,
            &third,
            &mut snap,
            vec![Outcome::TermStart {
                start: Some(11),
                listed: vec![],
            }],
        );
        assert!(snap.confirmed, "12 is past 11");
        let mut snap = view.snapshot(&key, &Fence { shard: 0, epoch: 4 }).unwrap();
        let fourth = Fence { shard: 0, epoch: 4 };
        view.record(
            &key,
            &fourth,
            &mut snap,
            vec![Outcome::TermStart {
                start: Some(12),
                listed: vec![],
            }],
        );
        assert!(
            !snap.confirmed && !snap.term_start_due,
            "12 is not past 12: read it"
        );

        // Gone: the reconcile ends, and the view forgets what it remembered of it.
        assert!(!view.record(&key, &fourth, &mut snap, vec![Outcome::GpuJobGone]));
    }

    #[test]
    fn the_term_starts_list_confirms_the_gpujobs_cached_at_the_versions_it_found() {
        let view = View::default();
        let fence = Fence { shard: 0, epoch: 1 };
        let named = |ns: &str, name: &str, rv| {
            let mut g = gpujob(rv, 1);
            g.metadata.namespace = Some(ns.into());
            g.metadata.name = Some(name.into());
            g.metadata.uid = Some(format!("{ns}-{name}"));
            g
        };
        // `a` is cached as listed; `b` behind what the list found; `c` in another namespace.
        for g in [
            named("ns", "a", "10"),
            named("ns", "b", "8"),
            named("other", "c", "9"),
        ] {
            view.gpujob_event(&Event::Apply(g), &Scope::All);
        }
        let (a, b, c) = (
            Key::new("ns", "a"),
            Key::new("ns", "b"),
            Key::new("other", "c"),
        );
        let mut snap = view.snapshot(&a, &fence).unwrap();
        assert!(snap.term_start_due && !snap.confirmed);
        let listed = vec![
            ("a".into(), "10".into()),
            ("b".into(), "12".into()),
            ("gone".into(), "7".into()),
        ];
        view.record(
            &a,
            &fence,
            &mut snap,
            vec![Outcome::TermStart {
                start: Some(20),
                listed,
            }],
        );
        assert!(snap.confirmed, "cached at the version listed: current");
        assert!(
            !view.memory.is_current(&Key::new("ns", "gone"), 1, "7"),
            "a GpuJob no longer cached is not remembered"
        );
        assert!(view.snapshot(&a, &fence).unwrap().confirmed);
        let b_snap = view.snapshot(&b, &fence).unwrap();
        assert!(
            !b_snap.confirmed && !b_snap.term_start_due,
            "cached behind the list: read it alone"
        );
        // When the cache catches up with the version listed, it is current.
        view.gpujob_event(&Event::Apply(named("ns", "b", "12")), &Scope::All);
        assert!(view.snapshot(&b, &fence).unwrap().confirmed);
        // Another namespace of the shard reads its own start; the next term reads again.
        let c_snap = view.snapshot(&c, &fence).unwrap();
        assert!(!c_snap.confirmed && c_snap.term_start_due);
        let next = Fence { shard: 0, epoch: 2 };
        let again = view.snapshot(&a, &next).unwrap();
        assert!(!again.confirmed && again.term_start_due);
    }

    #[test]
    fn a_pod_at_the_gate_queues_its_gpujob_through_its_job_and_leaves_with_its_part() {
        let view = View::default();
        let job: Job = serde_json::from_value(json!({"metadata": {
            "name": "a-1", "namespace": "ns",
            "ownerReferences": [{"apiVersion": "gpujob.dev/v1", "kind": "GpuJob",
                "name": "a", "uid": "u1", "controller": true}],
        }}))
        .unwrap();
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "a-1-x", "namespace": "ns", "uid": "p1",
                "resourceVersion": "1", "labels": {crate::api::LABEL_UID: "u1"},
                "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job",
                    "name": "a-1", "uid": "j1", "controller": true}]},
            "spec": {"containers": [],
                "schedulingGates": [{"name": crate::api::SCHEDULING_GATE}]},
        }))
        .unwrap();
        assert!(
            view.pod_event(&Event::Apply(pod.clone()), &Scope::All)
                .is_empty(),
            "its Job is not cached yet"
        );
        view.job_event(&Event::Apply(job), &Scope::All);
        let key = Key::new("ns", "a");
        assert_eq!(view.pods_of(&key, "u1").len(), 1);
        assert_eq!(view.cached(), (0, 1, 1));
        let a = vec![Key::new("ns", "a")];
        assert_eq!(view.pod_event(&Event::Delete(pod.clone()), &Scope::All), a);
        assert_eq!(view.pod_event(&Event::Apply(pod), &Scope::All), a);
        view.drop_part(&Scope::All);
        assert_eq!(view.cached(), (0, 0, 0));
        assert!(view.pods_of(&key, "u1").is_empty());
    }
}
