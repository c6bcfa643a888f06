//! Events on GpuJobs (`events.k8s.io/v1`), written in the background, as client-go's
//! event broadcaster does: a reconcile only puts its Events on a bounded queue, and one
//! task writes them through a client with its own small budget (`--event-qps`), so
//! Events never take requests from the reconciles they describe. When Events come
//! faster than their budget the queue fills and new ones are dropped (counted:
//! `gpujob_events_total{result="dropped"}`); the status says the same facts.
//!
//! Aggregated only when truly identical: the same GpuJob, type, reason and note within
//! six minutes become one Event whose series count grows (`kubectl describe`: `x2 over
//! 21s`). kube's own recorder aggregates by reason alone, which folded "attempt 2
//! started" into the series of "attempt 1 started" and kept the first note. Kept small:
//! entries older than six minutes are dropped.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, Resource};
use prometheus::IntCounterVec;
use serde_json::json;
use tokio::sync::mpsc;

use crate::api::GpuJob;
use crate::client::FIELD_MANAGER;
use crate::controller::error::api_code;
use crate::controller::events::{Kind, Note};

/// How long an Event can still be added to (as client-go and kube do).
const SERIES_WINDOW: SignedDuration = SignedDuration::from_mins(6);
/// events.k8s.io refuses longer notes.
const NOTE_LIMIT: usize = 1000;
/// Events waiting to be written; beyond this, new ones are dropped (client-go's
/// broadcaster queues 1000 too).
pub const QUEUE_CAPACITY: usize = 1000;

/// One Event to write, as it was when it happened.
#[derive(Debug)]
struct Pending {
    regarding: ObjectReference,
    uid: String,
    namespace: String,
    object: String,
    kind: Kind,
    reason: &'static str,
    note: String,
    at: Timestamp,
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

/// The reconciles' side: puts Events on the queue, never waits.
#[derive(Debug)]
pub struct Recorder {
    tx: mpsc::Sender<Pending>,
    counts: IntCounterVec,
    /// Events are being dropped: warn once per episode, not per Event. The episode ends
    /// once the queue is back to half empty.
    dropping: AtomicBool,
}

impl Recorder {
    /// A recorder whose Events `client` writes in a background task (`client` should
    /// have a budget of its own). `counts`: `gpujob_events_total`.
    pub fn spawn(client: Client, identity: &str, counts: IntCounterVec) -> Recorder {
        let (recorder, rx) = Recorder::new(QUEUE_CAPACITY, counts.clone());
        let sink = Sink {
            client,
            instance: identity.to_owned(),
            sent: HashMap::new(),
            counts,
        };
        tokio::spawn(sink.run(rx));
        recorder
    }

    fn new(capacity: usize, counts: IntCounterVec) -> (Recorder, mpsc::Receiver<Pending>) {
        let (tx, rx) = mpsc::channel(capacity);
        let recorder = Recorder {
            tx,
            counts,
            dropping: AtomicBool::new(false),
        };
        (recorder, rx)
    }

    /// Queues the Event; `false` when it was dropped (the queue is full, or closed at
    /// shutdown).
    pub fn publish(&self, gj: &GpuJob, n: &Note) -> bool {
        let pending = Pending {
            regarding: gj.object_ref(&()),
            uid: gj.metadata.uid.clone().unwrap_or_default(),
            namespace: gj.metadata.namespace.clone().unwrap_or_default(),
            object: gj.metadata.name.clone().unwrap_or_default(),
            kind: n.kind,
            reason: n.reason,
            note: n.note.chars().take(NOTE_LIMIT).collect(),
            at: Timestamp::now(),
        };
        match self.tx.try_send(pending) {
            Ok(()) => {
                if self.tx.capacity() * 2 >= self.tx.max_capacity() {
                    self.dropping.store(false, Ordering::Relaxed);
                }
                true
            }
            Err(e) => {
                self.counts.with_label_values(&["dropped"]).inc();
                let full = matches!(e, mpsc::error::TrySendError::Full(_));
                if full && !self.dropping.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        queued = QUEUE_CAPACITY,
                        "Events come faster than their budget (--event-qps): new Events are dropped until the queue drains (gpujob_events_total{{result=\"dropped\"}}); reconciles and status are not affected"
                    );
                }
                false
            }
        }
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
    async fn run(mut self, mut rx: mpsc::Receiver<Pending>) {
        while let Some(p) = rx.recv().await {
            let (reason, uid) = (p.reason, p.uid.clone());
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

    /// Creates the Event, or counts one more of an identical recent one; returns which.
    async fn write(&mut self, p: Pending) -> Result<&'static str, kube::Error> {
        let key = SeriesKey {
            uid: p.uid.clone(),
            kind: p.kind,
            reason: p.reason,
            note: p.note.clone(),
        };
        let at = p.at;
        self.sent.retain(|_, s| s.last + SERIES_WINDOW > at);
        let api: Api<Event> = Api::namespaced(self.client.clone(), &p.namespace);
        let again = match self.sent.get(&key).cloned() {
            Some(previous) => count_again(&api, &previous, at).await?,
            None => None,
        };
        let (sent, result) = match again {
            Some(sent) => (sent, "series"),
            None => {
                let created = api.create(&create_params(), &self.event(p)).await?;
                let sent = Sent {
                    name: created.metadata.name.unwrap_or_default(),
                    resource_version: created.metadata.resource_version.unwrap_or_default(),
                    count: 1,
                    last: at,
                };
                (sent, "created")
            }
        };
        self.sent.insert(key, sent);
        Ok(result)
    }

    fn event(&self, p: Pending) -> Event {
        // `<object>.<nanoseconds, hex>` as client-go names Events; cut so it stays a
        // valid name whatever the GpuJob's length.
        let prefix: String = p.object.chars().take(200).collect();
        Event {
            metadata: ObjectMeta {
                name: Some(format!("{prefix}.{:x}", p.at.as_nanosecond())),
                namespace: Some(p.namespace),
                ..ObjectMeta::default()
            },
            action: Some(p.reason.to_owned()),
            reason: Some(p.reason.to_owned()),
            note: Some(p.note),
            type_: Some(
                match p.kind {
                    Kind::Normal => "Normal",
                    Kind::Warning => "Warning",
                }
                .to_owned(),
            ),
            event_time: Some(MicroTime(p.at)),
            regarding: Some(p.regarding),
            reporting_controller: Some(FIELD_MANAGER.to_owned()),
            reporting_instance: Some(self.instance.clone()),
            ..Event::default()
        }
    }
}

/// One more of `p`: its series count grows. `None` when that Event is gone or was
/// changed by someone else (a new one is created then).
async fn count_again(
    api: &Api<Event>,
    p: &Sent,
    at: Timestamp,
) -> Result<Option<Sent>, kube::Error> {
    let count = p.count + 1;
    let patch = json!({
        "metadata": {"resourceVersion": p.resource_version},
        "series": {"count": count, "lastObservedTime": MicroTime(at)},
    });
    let pp = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    };
    match api.patch(&p.name, &pp, &Patch::Merge(&patch)).await {
        Ok(updated) => Ok(Some(Sent {
            resource_version: updated.metadata.resource_version.unwrap_or_default(),
            count,
            last: at,
            ..p.clone()
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

    fn note(text: &str) -> Note {
        Note {
            kind: Kind::Normal,
            reason: "AttemptStarted",
            note: text.into(),
        }
    }

    #[test]
    fn a_full_queue_drops_new_events_and_counts_them_without_waiting() {
        let counts = Metrics::new().events;
        // Nobody drains the queue: as when the Event budget is spent.
        let (recorder, mut rx) = Recorder::new(2, counts.clone());
        let g = gpujob("a");
        assert!(recorder.publish(&g, &note("attempt 1 started")));
        assert!(recorder.publish(&g, &note("attempt 2 started")));
        assert!(!recorder.publish(&g, &note("attempt 3 started")));
        assert!(!recorder.publish(&g, &note("attempt 4 started")));
        assert_eq!(counts.with_label_values(&["dropped"]).get(), 2);
        // What was queued is kept, in order, as it was when it happened.
        let first = rx.try_recv().unwrap();
        assert_eq!(
            (
                first.namespace.as_str(),
                first.object.as_str(),
                first.note.as_str()
            ),
            ("team-a", "a", "attempt 1 started")
        );
        assert_eq!(first.regarding.uid.as_deref(), Some("uid-a"));
        assert_eq!(rx.try_recv().unwrap().note, "attempt 2 started");
        // Room again: queued again.
        assert!(recorder.publish(&g, &note("attempt 5 started")));
        assert_eq!(counts.with_label_values(&["dropped"]).get(), 2);
    }

    #[test]
    fn one_warning_per_episode_of_drops_until_the_queue_is_half_empty() {
        let (recorder, mut rx) = Recorder::new(4, Metrics::new().events);
        let g = gpujob("a");
        for i in 0..5 {
            recorder.publish(&g, &note(&format!("{i}")));
        }
        assert!(
            recorder.dropping.load(Ordering::Relaxed),
            "the fifth was dropped"
        );
        // One slot frees and is taken at once: still the same episode.
        rx.try_recv().unwrap();
        assert!(recorder.publish(&g, &note("5")));
        assert!(recorder.dropping.load(Ordering::Relaxed));
        // Drained: the episode is over.
        while rx.try_recv().is_ok() {}
        assert!(recorder.publish(&g, &note("6")));
        assert!(!recorder.dropping.load(Ordering::Relaxed));
    }

    #[test]
    fn long_notes_are_cut_to_what_the_api_accepts() {
        let (recorder, mut rx) = Recorder::new(1, Metrics::new().events);
        assert!(recorder.publish(&gpujob("a"), &note(&"x".repeat(5000))));
        assert_eq!(rx.try_recv().unwrap().note.chars().count(), NOTE_LIMIT);
    }
}
