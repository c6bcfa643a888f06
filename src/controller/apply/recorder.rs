//! Events on GpuJobs (`events.k8s.io/v1`), aggregated only when truly identical: the
//! same GpuJob, type, reason and note within six minutes become one Event whose series
//! count grows (`kubectl describe`: `x2 over 21s`). kube's own recorder aggregates by
//! reason alone, which folded "attempt 2 started" into the series of "attempt 1 started"
//! and kept the first note. Kept small: entries older than six minutes are dropped.

use std::collections::HashMap;
use std::sync::Mutex;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, Resource};
use serde_json::json;

use crate::api::GpuJob;
use crate::client::FIELD_MANAGER;
use crate::controller::error::api_code;
use crate::controller::events::{Kind, Note};

/// How long an Event can still be added to (as client-go and kube do).
const SERIES_WINDOW: SignedDuration = SignedDuration::from_mins(6);
/// events.k8s.io refuses longer notes.
const NOTE_LIMIT: usize = 1000;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
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

pub struct Recorder {
    client: Client,
    instance: String,
    sent: Mutex<HashMap<Key, Sent>>,
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder")
            .field("instance", &self.instance)
            .finish_non_exhaustive()
    }
}

impl Recorder {
    pub fn new(client: Client, identity: &str) -> Recorder {
        Recorder {
            client,
            instance: identity.to_owned(),
            sent: Mutex::new(HashMap::new()),
        }
    }

    /// Creates the Event, or counts one more of an identical recent one.
    pub async fn publish(&self, gj: &GpuJob, n: &Note) -> Result<(), kube::Error> {
        let now = Timestamp::now();
        let note: String = n.note.chars().take(NOTE_LIMIT).collect();
        let key = Key {
            uid: gj.metadata.uid.clone().unwrap_or_default(),
            kind: n.kind,
            reason: n.reason,
            note: note.clone(),
        };
        let previous = {
            let mut sent = self.sent.lock().unwrap_or_else(|p| p.into_inner());
            sent.retain(|_, s| s.last + SERIES_WINDOW > now);
            sent.get(&key).cloned()
        };
        let ns = gj.metadata.namespace.clone().unwrap_or_default();
        let api: Api<Event> = Api::namespaced(self.client.clone(), &ns);
        let again = match previous {
            Some(p) => self.count_again(&api, &p, now).await?,
            None => None,
        };
        let sent = match again {
            Some(sent) => sent,
            None => {
                let event = self.event(gj, n, note, now);
                let created = api.create(&create_params(), &event).await?;
                Sent {
                    name: created.metadata.name.unwrap_or_default(),
                    resource_version: created.metadata.resource_version.unwrap_or_default(),
                    count: 1,
                    last: now,
                }
            }
        };
        self.sent
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, sent);
        Ok(())
    }

    /// One more of `p`: its series count grows. `None` when that Event is gone or was
    /// changed by someone else (a new one is created then).
    async fn count_again(
        &self,
        api: &Api<Event>,
        p: &Sent,
        now: Timestamp,
    ) -> Result<Option<Sent>, kube::Error> {
        let count = p.count + 1;
        let patch = json!({
            "metadata": {"resourceVersion": p.resource_version},
            "series": {"count": count, "lastObservedTime": MicroTime(now)},
        });
        let pp = PatchParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PatchParams::default()
        };
        match api.patch(&p.name, &pp, &Patch::Merge(&patch)).await {
            Ok(updated) => Ok(Some(Sent {
                resource_version: updated.metadata.resource_version.unwrap_or_default(),
                count,
                last: now,
                ..p.clone()
            })),
            Err(e) if matches!(api_code(&e), Some(404 | 409)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn event(&self, gj: &GpuJob, n: &Note, note: String, now: Timestamp) -> Event {
        let object = gj.metadata.name.clone().unwrap_or_default();
        // `<object>.<nanoseconds, hex>` as client-go names Events; cut so it stays a
        // valid name whatever the GpuJob's length.
        let prefix: String = object.chars().take(200).collect();
        Event {
            metadata: ObjectMeta {
                name: Some(format!("{prefix}.{:x}", now.as_nanosecond())),
                namespace: gj.metadata.namespace.clone(),
                ..ObjectMeta::default()
            },
            action: Some(n.reason.to_owned()),
            reason: Some(n.reason.to_owned()),
            note: Some(note),
            type_: Some(
                match n.kind {
                    Kind::Normal => "Normal",
                    Kind::Warning => "Warning",
                }
                .to_owned(),
            ),
            event_time: Some(MicroTime(now)),
            regarding: Some(gj.object_ref(&())),
            reporting_controller: Some(FIELD_MANAGER.to_owned()),
            reporting_instance: Some(self.instance.clone()),
            ..Event::default()
        }
    }
}

fn create_params() -> PostParams {
    PostParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PostParams::default()
    }
}
