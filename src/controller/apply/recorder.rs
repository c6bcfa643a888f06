//! Events on GpuJobs (`events.k8s.io/v1`), written in the background, as client-go's
//! event broadcaster does: a reconcile only queues its Events, and one task writes them
//! through a client with its own small budget (`--event-qps`), so Events never take
//! requests from the reconciles they describe.
//!
//! Two lanes, and the writer always takes the first before the second:
//! - **State changes** ([`Note::records_state_change`]: an attempt started, failed or
//!   disrupted, evicted, the GpuJob succeeded or failed, …) are never dropped to make
//!   room. Their lane
//!   has no fixed limit; what bounds it is where they come from: one entry per state
//!   change not yet written, each published only after the status write that recorded
//!   it went through (on `--api-qps`; or, for `QuotaReleaseSkipped`, once per deleted
//!   GpuJob), a handful per attempt. The writer takes one off every time, whether its
//!   write succeeds or fails, so the lane holds a burst's state changes beyond what
//!   `--event-qps` has written meanwhile (a few hundred bytes each): late, and written
//!   also after its shard has moved (the new holder sends none for a change already
//!   recorded). One is lost only when its write fails (counted `failed`) or the process
//!   ends before it is written (the lane is in memory). A lane longer than
//!   [`QUEUE_CAPACITY`] is logged, once per episode.
//! - **Other Events** wait in a lane of [`QUEUE_CAPACITY`]. One identical to an Event
//!   still waiting there (same GpuJob, type, reason and note) takes no slot: the waiting
//!   one's count grows and its last time moves (`gpujob_events_total{result="aggregated"}`),
//!   and it is written once, with `series.count` that count. When the lane is full, new
//!   ones are dropped and counted (`gpujob_events_total{result="dropped"}`); the status
//!   says the same facts.
//!
//! Written Events are aggregated only when truly identical, too: the same GpuJob, type,
//! reason and note within six minutes of the last one written add their count to that
//! Event's series (`kubectl describe`: `x2 over 21s`). kube's own recorder aggregates by
//! reason alone, which folded "attempt 2 started" into the series of "attempt 1 started"
//! and kept the first note. Kept small: entries older than six minutes are forgotten.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, Resource};
use prometheus::IntCounterVec;
use serde_json::json;
use tokio::sync::Notify;

use crate::api::GpuJob;
use crate::client::FIELD_MANAGER;
use crate::controller::error::api_code;
use crate::controller::events::{Kind, Note};

/// How long an Event can still be added to (as client-go and kube do).
const SERIES_WINDOW: SignedDuration = SignedDuration::from_mins(6);
/// events.k8s.io refuses longer notes: 1024 bytes (Go's `len`), not characters.
const NOTE_LIMIT: usize = 1024;
/// Events other than state changes waiting to be written; beyond this, new ones are
/// dropped (client-go's broadcaster queues 1000 too).
pub const QUEUE_CAPACITY: usize = 1000;

/// One Event to write: as it was when it first happened, and how many identical ones
/// came while it waited. Kept small (the GpuJob's reference is built when written):
/// the state-change lane has no fixed limit.
#[derive(Debug)]
struct Pending {
    key: SeriesKey,
    namespace: String,
    object: String,
    first: Timestamp,
    last: Timestamp,
    count: i32,
}

impl Pending {
    fn new(gj: &GpuJob, n: &Note, at: Timestamp) -> Pending {
        Pending {
            key: SeriesKey {
                uid: gj.metadata.uid.clone().unwrap_or_default(),
                kind: n.kind,
                reason: n.reason,
                note: cut(&n.note, NOTE_LIMIT).to_owned(),
            },
            namespace: gj.metadata.namespace.clone().unwrap_or_default(),
            object: gj.metadata.name.clone().unwrap_or_default(),
            first: at,
            last: at,
            count: 1,
        }
    }
}

/// The longest start of `s` of at most `limit` bytes that ends between characters.
fn cut(s: &str, limit: usize) -> &str {
    let mut end = s.len().min(limit);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct SeriesKey {
    uid: String,
    kind: Kind,
    reason: &'static str,
    note: String,
}

#[derive(Debug, Clone)]
struct Sent {
    name: String,
    resource_version: String,
    count: i32,
    last: Timestamp,
}

/// What became of a published Event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Queued {
    /// A new entry in its lane.
    New,
    /// Counted into an identical Event still waiting.
    Aggregated,
    /// The other lane is full.
    Full,
    /// The writer is gone (shutdown): nothing is queued any more.
    Closed,
}

/// Both lanes, under one lock (held for a push or a pop only, never across an await).
#[derive(Debug)]
struct Lanes {
    /// State changes, in order; nothing is dropped from it (what bounds it: the module
    /// comment).
    state: VecDeque<Pending>,
    /// Other Events in the order they first happened; at most `capacity`.
    other: VecDeque<Pending>,
    /// Each Event waiting in `other`, by its place in the sequence of Events ever put
    /// there: at `other[seq - taken]`. One entry per key.
    waiting: HashMap<SeriesKey, u64>,
    /// Events taken from the front of `other` so far.
    taken: u64,
    capacity: usize,
    /// The recorder is gone: the writer ends once the lanes are empty.
    recorder_gone: bool,
    /// The writer is gone: nothing is queued any more (it would never be written).
    writer_gone: bool,
}

impl Lanes {
    fn new(capacity: usize) -> Lanes {
        Lanes {
            state: VecDeque::new(),
            other: VecDeque::new(),
            waiting: HashMap::new(),
            taken: 0,
            capacity,
            recorder_gone: false,
            writer_gone: false,
        }
    }

    fn push(&mut self, p: Pending, state: bool) -> Queued {
        if self.writer_gone {
            return Queued::Closed;
        }
        if state {
            self.state.push_back(p);
            return Queued::New;
        }
        let waiting = self
            .waiting
            .get(&p.key)
            .and_then(|seq| usize::try_from(seq.checked_sub(self.taken)?).ok())
            .and_then(|i| self.other.get_mut(i));
        if let Some(w) = waiting {
            w.count = w.count.saturating_add(1);
            w.last = w.last.max(p.last);
            return Queued::Aggregated;
        }
        if self.other.len() >= self.capacity {
            return Queued::Full;
        }
        let seq = self.taken + self.other.len() as u64;
        self.waiting.insert(p.key.clone(), seq);
        self.other.push_back(p);
        Queued::New
    }

    /// The next Event to write: state changes first.
    fn pop(&mut self) -> Option<Pending> {
        if let Some(p) = self.state.pop_front() {
            return Some(p);
        }
        let p = self.other.pop_front()?;
        self.waiting.remove(&p.key);
        self.taken += 1;
        Some(p)
    }
}

/// What the recorder and the writer share.
#[derive(Debug)]
struct Queue {
    lanes: Mutex<Lanes>,
    /// Something was queued (or the recorder went): the writer looks again.
    ready: Notify,
}

impl Queue {
    fn new(capacity: usize) -> Queue {
        Queue {
            lanes: Mutex::new(Lanes::new(capacity)),
            ready: Notify::new(),
        }
    }

    /// A panic elsewhere while the lock was held leaves the lanes consistent (every
    /// change is one push or pop), so a poisoned lock is used as it is.
    fn lanes(&self) -> MutexGuard<'_, Lanes> {
        self.lanes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The next Event to write, waiting for one; `None` once the recorder is gone and
    /// everything queued was taken.
    async fn next(&self) -> Option<Pending> {
        loop {
            {
                let mut lanes = self.lanes();
                if let Some(p) = lanes.pop() {
                    return Some(p);
                }
                if lanes.recorder_gone {
                    return None;
                }
            }
            // `notify_one` keeps a permit when nobody waits, so a push between the look
            // above and this wait is not missed.
            self.ready.notified().await;
        }
    }
}

/// Marks the writer gone however its task ends (shutdown, or a panic), and frees what
/// waits: nothing would write it.
struct WriterGone(Arc<Queue>);

impl Drop for WriterGone {
    fn drop(&mut self) {
        let mut lanes = self.0.lanes();
        lanes.writer_gone = true;
        lanes.state.clear();
        lanes.other.clear();
        lanes.waiting.clear();
    }
}

/// The reconciles' side: queues Events, never waits.
#[derive(Debug)]
pub struct Recorder {
    queue: Arc<Queue>,
    counts: IntCounterVec,
    /// Events are being dropped: warn once per episode, not per Event. The episode ends
    /// once the other lane is back to half empty.
    dropping: AtomicBool,
    /// State changes wait beyond [`QUEUE_CAPACITY`]: said once per episode, which ends
    /// once they are back to half of it.
    behind: AtomicBool,
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.queue.lanes().recorder_gone = true;
        self.queue.ready.notify_one();
    }
}

impl Recorder {
    /// A recorder whose Events `client` writes in a background task (`client` should
    /// have a budget of its own). `counts`: `gpujob_events_total`.
    pub fn spawn(client: Client, identity: &str, counts: IntCounterVec) -> Recorder {
        let recorder = Recorder::new(QUEUE_CAPACITY, counts.clone());
        let sink = Sink {
            client,
            instance: identity.to_owned(),
            sent: HashMap::new(),
            counts,
        };
        tokio::spawn(sink.run(recorder.queue.clone()));
        recorder
    }

    fn new(capacity: usize, counts: IntCounterVec) -> Recorder {
        Recorder {
            queue: Arc::new(Queue::new(capacity)),
            counts,
            dropping: AtomicBool::new(false),
            behind: AtomicBool::new(false),
        }
    }

    /// Queues the Event, or counts it into an identical one still waiting; `false` when
    /// it was dropped (it is not a state change and the lane is full, or the writer is
    /// gone at shutdown).
    /// Events waiting to be written: (state changes, others).
    pub fn queued(&self) -> (usize, usize) {
        let lanes = self.queue.lanes();
        (lanes.state.len(), lanes.other.len())
    }

    pub fn publish(&self, gj: &GpuJob, n: &Note) -> bool {
        self.publish_at(gj, n, Timestamp::now())
    }

    /// [`Recorder::publish`] of an Event that happened `at`.
    fn publish_at(&self, gj: &GpuJob, n: &Note, at: Timestamp) -> bool {
        let p = Pending::new(gj, n, at);
        let (queued, others, states, capacity) = {
            let mut lanes = self.queue.lanes();
            let queued = lanes.push(p, n.records_state_change());
            (queued, lanes.other.len(), lanes.state.len(), lanes.capacity)
        };
        if states > capacity {
            if !self.behind.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    queued = states,
                    "state-change Events come faster than their budget (--event-qps): they are kept and written first, late"
                );
            }
        } else if states * 2 <= capacity {
            self.behind.store(false, Ordering::Relaxed);
        }
        match queued {
            Queued::New => self.queue.ready.notify_one(),
            Queued::Aggregated => self.counts.with_label_values(&["aggregated"]).inc(),
            Queued::Full | Queued::Closed => {
                self.counts.with_label_values(&["dropped"]).inc();
                if queued == Queued::Full && !self.dropping.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        queued = others,
                        "Events come faster than their budget (--event-qps): new Events other than state changes are dropped until the queue drains (gpujob_events_total{{result=\"dropped\"}}); state changes are kept and written first; reconciles and status are not affected"
                    );
                }
                return false;
            }
        }
        if others * 2 <= capacity {
            self.dropping.store(false, Ordering::Relaxed);
        }
        true
    }
}

/// The writing side: one task, one client.
struct Sink {
    client: Client,
    instance: String,
    sent: HashMap<SeriesKey, Sent>,
    counts: IntCounterVec,
}

impl Sink {
    async fn run(mut self, queue: Arc<Queue>) {
        let _gone = WriterGone(queue.clone());
        while let Some(p) = queue.next().await {
            let (reason, uid) = (p.key.reason, p.key.uid.clone());
            match self.write(p).await {
                Ok(result) => self.counts.with_label_values(&[result]).inc(),
                Err(e) => {
                    self.counts.with_label_values(&["failed"]).inc();
                    tracing::warn!(
                        reason,
                        gpujob_uid = uid,
                        "cannot record an Event on the GpuJob: {}; continuing without it",
                        crate::apierror::describe(&e)
                    );
                }
            }
        }
    }

    /// Creates the Event, or adds its count to an identical recent one; returns which.
    async fn write(&mut self, p: Pending) -> Result<&'static str, kube::Error> {
        self.sent.retain(|_, s| s.last + SERIES_WINDOW > p.first);
        let api: Api<Event> = Api::namespaced(self.client.clone(), &p.namespace);
        let again = match self.sent.get(&p.key).cloned() {
            Some(previous) => count_again(&api, &previous, &p).await?,
            None => None,
        };
        let (sent, result) = match again {
            Some(sent) => (sent, "series"),
            None => {
                let created = api
                    .create(&create_params(), &event(&p, &self.instance))
                    .await?;
                let sent = Sent {
                    name: created.metadata.name.unwrap_or_default(),
                    resource_version: created.metadata.resource_version.unwrap_or_default(),
                    count: p.count,
                    last: p.last,
                };
                (sent, "created")
            }
        };
        self.sent.insert(p.key, sent);
        Ok(result)
    }
}

/// The Event to create for `p`: a series from the start when identical ones came while
/// it waited.
fn event(p: &Pending, instance: &str) -> Event {
    // `<object>.<nanoseconds, hex>` as client-go names Events; cut so it stays a valid
    // name whatever the GpuJob's length.
    let prefix: String = p.object.chars().take(200).collect();
    Event {
        metadata: ObjectMeta {
            name: Some(format!("{prefix}.{:x}", p.first.as_nanosecond())),
            namespace: Some(p.namespace.clone()),
            ..ObjectMeta::default()
        },
        action: Some(p.key.reason.to_owned()),
        reason: Some(p.key.reason.to_owned()),
        note: Some(p.key.note.clone()),
        type_: Some(
            match p.key.kind {
                Kind::Normal => "Normal",
                Kind::Warning => "Warning",
            }
            .to_owned(),
        ),
        event_time: Some(MicroTime(p.first)),
        // The API server refuses a series of fewer than 2.
        series: (p.count > 1).then_some(EventSeries {
            count: p.count,
            last_observed_time: MicroTime(p.last),
        }),
        regarding: Some(ObjectReference {
            api_version: Some(GpuJob::api_version(&()).into_owned()),
            kind: Some(GpuJob::kind(&()).into_owned()),
            namespace: Some(p.namespace.clone()),
            name: Some(p.object.clone()),
            uid: Some(p.key.uid.clone()),
            ..ObjectReference::default()
        }),
        reporting_controller: Some(FIELD_MANAGER.to_owned()),
        reporting_instance: Some(instance.to_owned()),
        ..Event::default()
    }
}

/// `p` (one Event, or several identical that waited together) counted into the
/// identical written one: its series count grows by `p.count`. `None` when that Event
/// is gone or was changed by someone else (a new one is created then).
async fn count_again(
    api: &Api<Event>,
    previous: &Sent,
    p: &Pending,
) -> Result<Option<Sent>, kube::Error> {
    let count = previous.count.saturating_add(p.count);
    let patch = json!({
        "metadata": {"resourceVersion": previous.resource_version},
        "series": {"count": count, "lastObservedTime": MicroTime(p.last)},
    });
    let pp = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    };
    match api.patch(&previous.name, &pp, &Patch::Merge(&patch)).await {
        Ok(updated) => Ok(Some(Sent {
            resource_version: updated.metadata.resource_version.unwrap_or_default(),
            count,
            last: p.last,
            ..previous.clone()
        })),
        Err(e) if matches!(api_code(&e), Some(404 | 409)) => Ok(None),
        Err(e) => Err(e),
    }
}

fn create_params() -> PostParams {
    PostParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PostParams::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;

    fn gpujob(name: &str) -> GpuJob {
        let mut g = GpuJob::new(
            name,
            serde_json::from_value(json!({"image": "i", "gpus": 1})).unwrap(),
        );
        g.metadata.namespace = Some("team-a".into());
        g.metadata.uid = Some(format!("uid-{name}"));
        g
    }

    /// An Event that records no state change.
    fn note(text: &str) -> Note {
        Note {
            kind: Kind::Warning,
            reason: "QuotaRefused",
            note: text.into(),
        }
    }

    fn started(attempt: i32) -> Note {
        Note {
            kind: Kind::Normal,
            reason: "AttemptStarted",
            note: format!("attempt {attempt} started"),
        }
    }

    /// Everything waiting, in the order the writer takes it: (note, count).
    fn drain(recorder: &Recorder) -> Vec<(String, i32)> {
        let mut lanes = recorder.queue.lanes();
        std::iter::from_fn(|| lanes.pop())
            .map(|p| (p.key.note, p.count))
            .collect()
    }

    /// `s` seconds into the test.
    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    fn once(notes: &[&str]) -> Vec<(String, i32)> {
        notes.iter().map(|n| ((*n).to_owned(), 1)).collect()
    }

    #[test]
    fn a_flood_drops_other_events_and_counts_them_but_keeps_every_state_change_first() {
        assert!(started(1).records_state_change() && !note("x").records_state_change());
        let counts = Metrics::new().events;
        // Nobody drains the queue: as when the Event budget is spent.
        let recorder = Recorder::new(3, counts.clone());
        let (a, b) = (gpujob("a"), gpujob("b"));
        let mut kept = Vec::new();
        for i in 0..10 {
            kept.push(recorder.publish(&a, &note(&format!("noise {i}"))));
            if i % 3 == 0 {
                assert!(recorder.publish(&b, &started(i)), "a state change is kept");
            }
        }
        // The same state change twice is two transitions: both kept.
        assert!(recorder.publish(&b, &started(9)));
        assert_eq!(kept, [[true; 3].as_slice(), &[false; 7]].concat());
        assert_eq!(counts.with_label_values(&["dropped"]).get(), 7);
        assert_eq!(counts.with_label_values(&["aggregated"]).get(), 0);
        assert_eq!(recorder.queued(), (5, 3), "what the lanes' gauge shows");
        assert!(
            recorder.behind.load(Ordering::Relaxed),
            "five state changes wait, more than the other lane holds: said"
        );
        assert_eq!(
            drain(&recorder),
            once(&[
                "attempt 0 started",
                "attempt 3 started",
                "attempt 6 started",
                "attempt 9 started",
                "attempt 9 started",
                "noise 0",
                "noise 1",
                "noise 2",
            ])
        );
        // Room again: queued again.
        assert!(recorder.publish(&a, &note("noise 10")));
        assert_eq!(counts.with_label_values(&["dropped"]).get(), 7);
        assert!(!recorder.behind.load(Ordering::Relaxed), "caught up");
    }

    #[test]
    fn state_changes_are_taken_first_even_when_they_come_last() {
        let recorder = Recorder::new(10, Metrics::new().events);
        let g = gpujob("a");
        recorder.publish(&g, &note("noise 1"));
        recorder.publish(&g, &note("noise 2"));
        recorder.publish(&g, &started(1));
        let mut lanes = recorder.queue.lanes();
        assert_eq!(
            lanes.pop().map(|p| p.key.note).as_deref(),
            Some("attempt 1 started")
        );
        lanes.push(Pending::new(&g, &started(2), Timestamp::now()), true);
        assert_eq!(
            lanes.pop().map(|p| p.key.note).as_deref(),
            Some("attempt 2 started")
        );
        assert_eq!(lanes.pop().map(|p| p.key.note).as_deref(), Some("noise 1"));
    }

    #[test]
    fn identical_waiting_events_take_one_slot_and_keep_the_order_of_their_first() {
        let counts = Metrics::new().events;
        let recorder = Recorder::new(3, counts.clone());
        let (a, b) = (gpujob("a"), gpujob("b"));
        // As tests/integration/events.rs publishes them, and more.
        let two_free = "InsufficientQuota: 8 GPUs requested, 2 free";
        let none_free = "InsufficientQuota: 8 GPUs requested, 0 free";
        for (n, s) in [(two_free, 0), (two_free, 1), (none_free, 2), (two_free, 3)] {
            assert!(recorder.publish_at(&a, &note(n), at(s)));
        }
        // Not identical: another GpuJob's, and another type.
        assert!(recorder.publish(&b, &note(two_free)));
        let normal = Note {
            kind: Kind::Normal,
            ..note(two_free)
        };
        assert!(!recorder.publish(&a, &normal), "three slots taken");
        // Identical to one waiting: no slot needed although the lane is full.
        assert!(recorder.publish(&a, &note(none_free)));
        assert_eq!(counts.with_label_values(&["aggregated"]).get(), 3);
        assert_eq!(counts.with_label_values(&["dropped"]).get(), 1);
        let mut lanes = recorder.queue.lanes();
        let first = lanes.pop().unwrap();
        assert_eq!((first.key.note.as_str(), first.count), (two_free, 3));
        assert_eq!(first.key.uid, "uid-a");
        assert_eq!((first.first, first.last), (at(0), at(3)), "{first:?}");
        let second = lanes.pop().unwrap();
        assert_eq!((second.key.note.as_str(), second.count), (none_free, 2));
        let third = lanes.pop().unwrap();
        assert_eq!((third.key.uid.as_str(), third.count), ("uid-b", 1));
        assert!(lanes.pop().is_none());
        drop(lanes);
        // Taken by the writer: the next identical one waits anew (and is counted into
        // the written series when it is written).
        assert!(recorder.publish(&a, &note(two_free)));
        assert_eq!(drain(&recorder), once(&[two_free]));
        assert_eq!(counts.with_label_values(&["aggregated"]).get(), 3);
    }

    #[test]
    fn a_waiting_series_is_written_as_one_event_with_its_count() {
        let recorder = Recorder::new(5, Metrics::new().events);
        let g = gpujob("a");
        for s in 0..4 {
            recorder.publish_at(&g, &note("8 GPUs requested, 2 free"), at(10 + s));
        }
        recorder.publish_at(&g, &note("alone"), at(20));
        let mut lanes = recorder.queue.lanes();
        let (series, alone) = (lanes.pop().unwrap(), lanes.pop().unwrap());
        let e = event(&series, "replica-1");
        assert_eq!(
            e.series.as_ref().map(|s| (s.count, s.last_observed_time.0)),
            Some((4, at(13)))
        );
        assert_eq!(e.event_time, Some(MicroTime(at(10))));
        assert_eq!(e.note.as_deref(), Some("8 GPUs requested, 2 free"));
        assert_eq!(
            (e.type_.as_deref(), e.reason.as_deref(), e.action.as_deref()),
            (Some("Warning"), Some("QuotaRefused"), Some("QuotaRefused"))
        );
        assert_eq!(e.reporting_instance.as_deref(), Some("replica-1"));
        assert_eq!(e.metadata.namespace.as_deref(), Some("team-a"));
        let name = e.metadata.name.unwrap_or_default();
        assert_eq!(name, format!("a.{:x}", at(10).as_nanosecond()));
        let regarding = e.regarding.unwrap_or_default();
        assert_eq!(
            (
                regarding.api_version.as_deref(),
                regarding.namespace.as_deref()
            ),
            (Some("gpujob.dev/v1"), Some("team-a"))
        );
        assert_eq!(
            (
                regarding.kind.as_deref(),
                regarding.name.as_deref(),
                regarding.uid.as_deref()
            ),
            (Some("GpuJob"), Some("a"), Some("uid-a"))
        );
        // One of a kind: no series (the API server refuses a count under 2).
        assert!(event(&alone, "replica-1").series.is_none());
    }

    #[test]
    fn one_warning_per_episode_of_drops_until_the_queue_is_half_empty() {
        let recorder = Recorder::new(4, Metrics::new().events);
        let g = gpujob("a");
        for i in 0..5 {
            recorder.publish(&g, &note(&format!("{i}")));
        }
        assert!(
            recorder.dropping.load(Ordering::Relaxed),
            "the fifth was dropped"
        );
        // One slot frees and is taken at once: still the same episode.
        recorder.queue.lanes().pop().unwrap();
        assert!(recorder.publish(&g, &note("5")));
        assert!(recorder.dropping.load(Ordering::Relaxed));
        // Drained: the episode is over.
        drain(&recorder);
        assert!(recorder.publish(&g, &note("6")));
        assert!(!recorder.dropping.load(Ordering::Relaxed));
    }

    #[test]
    fn long_notes_are_cut_to_what_the_api_accepts() {
        let recorder = Recorder::new(1, Metrics::new().events);
        assert!(recorder.publish(&gpujob("a"), &note(&"x".repeat(5000))));
        assert_eq!(drain(&recorder)[0].0.len(), NOTE_LIMIT);
        // The API server counts bytes: a progress bar's "█" is three, and the cut ends
        // between characters.
        assert!(recorder.publish(&gpujob("a"), &note(&"█".repeat(1000))));
        let cut = drain(&recorder)[0].0.clone();
        assert!(
            cut.len() <= NOTE_LIMIT && cut.len() > NOTE_LIMIT - 3,
            "{}",
            cut.len()
        );
        assert!(cut.chars().all(|c| c == '█'));
    }

    #[test]
    fn once_the_writer_is_gone_nothing_is_queued_and_what_waited_is_freed() {
        let counts = Metrics::new().events;
        let recorder = Recorder::new(2, counts.clone());
        let g = gpujob("a");
        assert!(recorder.publish(&g, &started(1)));
        assert!(recorder.publish(&g, &note("x")));
        drop(WriterGone(recorder.queue.clone()));
        assert!(!recorder.publish(&g, &started(2)), "nobody would write it");
        assert_eq!(counts.with_label_values(&["dropped"]).get(), 1);
        assert!(drain(&recorder).is_empty());
    }

    #[tokio::test]
    async fn the_writer_waits_for_events_and_ends_after_the_last_once_the_recorder_is_gone() {
        let recorder = Recorder::new(2, Metrics::new().events);
        let queue = recorder.queue.clone();
        let writer = tokio::spawn(async move {
            let mut seen = Vec::new();
            while let Some(p) = queue.next().await {
                seen.push(p.key.note);
            }
            seen
        });
        tokio::task::yield_now().await;
        let g = gpujob("a");
        recorder.publish(&g, &note("x"));
        recorder.publish(&g, &started(1));
        drop(recorder);
        let seen = tokio::time::timeout(std::time::Duration::from_secs(5), writer)
            .await
            .unwrap()
            .unwrap();
        assert!(
            seen == ["x", "attempt 1 started"] || seen == ["attempt 1 started", "x"],
            "{seen:?}"
        );
    }
}
