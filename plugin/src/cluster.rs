//! The one place that talks to the API server: the kubeconfig read as kubectl reads it,
//! the GpuJob in the version the server prefers (decoded to v2 through the core's
//! conversion), its Jobs, pods and Events, patches and pod logs.

use std::path::Path;

use gpujob_core::api::convert::to_v2;
use gpujob_core::api::v2::GpuJob;
use gpujob_core::api::{GpuJob as GpuJobV1, LABEL_UID};
use gpujob_core::job::is_controlled_by;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{Api, ApiResource, DynamicObject, ListParams, LogParams, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use serde_json::Value;

use crate::error::Error;
use crate::snapshot::{SeenEvent, Snapshot};

/// The field manager of the plugin's patches (what `kubectl get -o yaml
/// --show-managed-fields` shows as having set them).
pub const FIELD_MANAGER: &str = "kubectl-gpujob";
const GROUP: &str = "gpujob.dev";

pub struct Cluster {
    pub client: Client,
    pub namespace: String,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

/// A GpuJob as read, and the resource (version) it was read through.
#[derive(Debug)]
pub struct Found {
    pub gpujob: GpuJob,
    pub resource: ApiResource,
}

impl Cluster {
    /// A client as kubectl would make it: `--kubeconfig`, else `$KUBECONFIG`, else
    /// `~/.kube/config`; `--context`, else the current context; `-n`, else the context's
    /// namespace, else `default`.
    pub async fn connect(
        kubeconfig: Option<&Path>,
        context: Option<&str>,
        namespace: Option<&str>,
    ) -> Result<Cluster, Error> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let options = KubeConfigOptions {
            context: context.map(str::to_owned),
            ..KubeConfigOptions::default()
        };
        let config = match kubeconfig {
            Some(path) => {
                let named = || Some(path.display().to_string());
                let file = Kubeconfig::read_from(path).map_err(|source| Error::Kubeconfig {
                    path: named(),
                    source,
                })?;
                Config::from_custom_kubeconfig(file, &options)
                    .await
                    .map_err(|source| Error::Kubeconfig {
                        path: named(),
                        source,
                    })?
            }
            None => Config::from_kubeconfig(&options)
                .await
                .map_err(|source| Error::Kubeconfig { path: None, source })?,
        };
        let namespace = namespace.map_or_else(|| config.default_namespace.clone(), str::to_owned);
        let client = Client::try_from(config).map_err(Error::Client)?;
        Ok(Cluster { client, namespace })
    }

    fn who(&self, name: &str) -> String {
        format!("GpuJob {}/{name}", self.namespace)
    }

    /// The GpuJob resource in the version the API server prefers (v2 where served).
    async fn resource(&self) -> Result<ApiResource, Error> {
        let group = kube::discovery::group(&self.client, GROUP)
            .await
            .map_err(|e| Error::NoCrd(e.to_string()))?;
        group
            .recommended_kind("GpuJob")
            .map(|(resource, _)| resource)
            .ok_or_else(|| Error::NoCrd(format!("group {GROUP} has no kind GpuJob")))
    }

    /// GpuJob `name` of the namespace, as v2.
    pub async fn gpujob(&self, name: &str) -> Result<Found, Error> {
        let resource = self.resource().await?;
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &self.namespace, &resource);
        let object = api
            .get_opt(name)
            .await
            .map_err(Error::api(format!("reading {}", self.who(name))))?
            .ok_or_else(|| Error::NotFound {
                namespace: self.namespace.clone(),
                name: name.to_owned(),
            })?;
        let value = serde_json::to_value(&object).map_err(|source| self.decode(name, source))?;
        let gpujob = decode(value).map_err(|source| self.decode(name, source))?;
        Ok(Found { gpujob, resource })
    }

    fn decode(&self, name: &str, source: serde_json::Error) -> Error {
        Error::Decode {
            namespace: self.namespace.clone(),
            name: name.to_owned(),
            source,
        }
    }

    /// The GpuJob with its Jobs, pods and Events.
    pub async fn snapshot(&self, name: &str) -> Result<Snapshot, Error> {
        let found = self.gpujob(name).await?;
        let uid = found.gpujob.metadata.uid.clone().unwrap_or_default();
        let by_uid = ListParams::default().labels(&format!("{LABEL_UID}={uid}"));
        let jobs: Api<Job> = Api::namespaced(self.client.clone(), &self.namespace);
        let jobs = jobs
            .list(&by_uid)
            .await
            .map_err(Error::api(format!(
                "listing the Jobs of {}",
                self.who(name)
            )))?
            .items
            .into_iter()
            .filter(|j| is_controlled_by(j, &uid))
            .collect();
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.namespace);
        let pods = pods
            .list(&by_uid)
            .await
            .map_err(Error::api(format!(
                "listing the pods of {}",
                self.who(name)
            )))?
            .items;
        let events: Api<Event> = Api::namespaced(self.client.clone(), &self.namespace);
        let mut events: Vec<SeenEvent> = events
            .list(&ListParams::default().fields(&format!("involvedObject.uid={uid}")))
            .await
            .map_err(Error::api(format!(
                "listing the Events of {}",
                self.who(name)
            )))?
            .items
            .into_iter()
            .map(seen_event)
            .collect();
        events.sort_by_key(|e| e.time);
        Ok(Snapshot {
            gpujob: found.gpujob,
            jobs,
            pods,
            events,
        })
    }

    /// A merge patch of GpuJob `name` (read through `resource`); the GpuJob as written.
    pub async fn patch(
        &self,
        resource: &ApiResource,
        name: &str,
        body: &Value,
        what: &str,
    ) -> Result<GpuJob, Error> {
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &self.namespace, resource);
        let object = api
            .patch(
                name,
                &PatchParams {
                    field_manager: Some(FIELD_MANAGER.to_owned()),
                    ..PatchParams::default()
                },
                &Patch::Merge(body),
            )
            .await
            .map_err(Error::api(format!("{what} {}", self.who(name))))?;
        let value = serde_json::to_value(&object).map_err(|source| self.decode(name, source))?;
        decode(value).map_err(|source| self.decode(name, source))
    }

    /// Pod `pod`'s log of container `main`, written to stdout as it comes (with
    /// `follow`, until the pod ends).
    pub async fn logs(&self, pod: &str, follow: bool, tail: Option<i64>) -> Result<(), Error> {
        use futures::{AsyncBufReadExt, TryStreamExt};
        use std::io::Write;
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &self.namespace);
        let params = LogParams {
            container: Some(gpujob_core::api::CONTAINER_NAME.to_owned()),
            follow,
            tail_lines: tail,
            ..LogParams::default()
        };
        let what = format!(
            "reading the log of container {} of pod {}/{pod}",
            gpujob_core::api::CONTAINER_NAME,
            self.namespace
        );
        let stream = api
            .log_stream(pod, &params)
            .await
            .map_err(Error::api(what.clone()))?;
        let mut lines = stream.lines();
        let mut out = std::io::stdout().lock();
        while let Some(line) = lines.try_next().await.map_err(|source| Error::Stream {
            what: what.clone(),
            source,
        })? {
            writeln!(out, "{line}").map_err(Error::Output)?;
        }
        Ok(())
    }
}

/// A GpuJob of either served version, as v2 (v1 through the core's lossless conversion).
pub fn decode(value: Value) -> Result<GpuJob, serde_json::Error> {
    if value.get("apiVersion").and_then(Value::as_str) == Some("gpujob.dev/v1") {
        let v1: GpuJobV1 = serde_json::from_value(value)?;
        Ok(to_v2(&v1))
    } else {
        serde_json::from_value(value)
    }
}

fn seen_event(e: Event) -> SeenEvent {
    let time = e
        .series
        .as_ref()
        .and_then(|s| s.last_observed_time.as_ref().map(|t| t.0))
        .or(e.last_timestamp.as_ref().map(|t| t.0))
        .or(e.event_time.as_ref().map(|t| t.0))
        .or(e.metadata.creation_timestamp.as_ref().map(|t| t.0));
    SeenEvent {
        type_: e.type_.unwrap_or_default(),
        reason: e.reason.unwrap_or_default(),
        note: e.message.unwrap_or_default(),
        time,
        count: e
            .series
            .as_ref()
            .and_then(|s| s.count)
            .or(e.count)
            .unwrap_or(1),
    }
}
