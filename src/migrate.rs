//! `gpujob-operator migrate-storage`: rewrites every stored GpuJob in the CRD's current
//! storage version, then sets the CRD's `status.storedVersions` to just that version
//! (step 2 of "Upgrading the API" in docs/install.md).
//!
//! How, and why it is safe to interrupt and to rerun:
//! - Objects are listed in pages (`limit` + `continue`) in the storage version's own
//!   apiVersion, as untyped objects: nothing is decoded into the operator's structs, so
//!   nothing they do not know is lost, and the tool works whichever version is stored.
//! - Each object is written back as read (a `PUT` carrying its resourceVersion). The API
//!   server encodes it in the storage version; an object already stored so is identical
//!   and the API server skips the write. A 409 means someone wrote it since it was read,
//!   which also stored it in the storage version: migrated. A 404 means it is gone.
//! - `status.storedVersions` is changed only after a complete pass with no failure, and
//!   only while the CRD still names the storage version the pass wrote: a version leaves
//!   the list only once no object can be stored in it any more. An interrupted run
//!   leaves the list as it was; the next run rewrites again (cheap: no etcd write for
//!   objects already migrated) and finishes.

use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, PostParams};
use kube::{Client, ResourceExt};
use tracing::{info, warn};

use crate::apierror::describe;

/// The CRD this tool migrates.
pub const CRD_NAME: &str = "gpujobs.gpujob.dev";
/// Field manager of the rewrites and the storedVersions update.
pub const FIELD_MANAGER: &str = "gpujob-migrate-storage";

/// How a run goes.
#[derive(Debug, Clone)]
pub struct Options {
    /// Objects per list page.
    pub page_size: u32,
    /// Stop after rewriting this many objects (storedVersions untouched): a careful
    /// first run, or a test of an interrupted one.
    pub limit: Option<u64>,
    /// A progress line every this many objects...
    pub progress_every: u64,
    /// ...or after this long, whichever comes first.
    pub progress_interval: Duration,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            page_size: 100,
            limit: None,
            progress_every: 100,
            progress_interval: Duration::from_secs(10),
        }
    }
}

/// How a run ended, when it did not fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// `status.storedVersions` already held only the storage version: nothing to do.
    AlreadyMigrated,
    /// Every object rewritten, `status.storedVersions` set to the storage version.
    Complete,
    /// Stopped at `--limit`; `status.storedVersions` untouched.
    Stopped,
}

/// What a run did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    pub outcome: Outcome,
    /// The storage version the objects were rewritten in.
    pub storage: String,
    /// Objects rewritten (including those already in the storage version).
    pub rewritten: u64,
    /// Objects someone else wrote between our read and our write (so migrated).
    pub conflicts: u64,
    /// Objects deleted between our read and our write.
    pub gone: u64,
    /// `status.storedVersions` when the run ended.
    pub stored_versions: Vec<String>,
}

impl Report {
    /// Objects dealt with: rewritten, written by someone else, or gone.
    pub fn done(&self) -> u64 {
        self.rewritten + self.conflicts + self.gone
    }
}

/// Why a run stopped without finishing. storedVersions is never changed by a failed run.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error(
        "the CRD {CRD_NAME} does not exist: there are no GpuJobs to migrate (install the API first: kubectl apply --server-side -k deploy/crd/)"
    )]
    NoCrd,
    #[error("reading the CRD {CRD_NAME}: {0}")]
    ReadCrd(String),
    #[error("the CRD {CRD_NAME} has no version marked storage: true; fix the CRD first")]
    NoStorageVersion,
    #[error(
        "listing GpuJobs in {api_version}: {error}; status.storedVersions unchanged, rerun to finish (objects stored in another version are converted by the webhook on this read: it must answer)"
    )]
    List { api_version: String, error: String },
    #[error(
        "rewriting GpuJob {namespace}/{name} in {api_version}: {error}; status.storedVersions unchanged, rerun to finish"
    )]
    Rewrite {
        namespace: String,
        name: String,
        api_version: String,
        error: String,
    },
    #[error(
        "the CRD's storage version changed from {from} to {to} during the run: objects may be stored in either, so status.storedVersions is left as it is; rerun to migrate to {to}"
    )]
    StorageChanged { from: String, to: String },
    #[error(
        "updating status.storedVersions of the CRD {CRD_NAME} to [{storage}]: {error}; every object is migrated, rerun to record it"
    )]
    StoredVersions { storage: String, error: String },
}

impl MigrateError {
    /// Stable short label (logs, exit reasons).
    pub fn label(&self) -> &'static str {
        match self {
            MigrateError::NoCrd => "no_crd",
            MigrateError::ReadCrd(_) => "read_crd",
            MigrateError::NoStorageVersion => "no_storage_version",
            MigrateError::List { .. } => "list",
            MigrateError::Rewrite { .. } => "rewrite",
            MigrateError::StorageChanged { .. } => "storage_changed",
            MigrateError::StoredVersions { .. } => "stored_versions",
        }
    }
}

/// The version of `crd` marked `storage: true`.
pub fn storage_version(crd: &CustomResourceDefinition) -> Option<&str> {
    crd.spec
        .versions
        .iter()
        .find(|v| v.storage)
        .map(|v| v.name.as_str())
}

/// `status.storedVersions` of `crd` (empty when it has no status yet).
pub fn stored_versions(crd: &CustomResourceDefinition) -> Vec<String> {
    crd.status
        .as_ref()
        .and_then(|s| s.stored_versions.clone())
        .unwrap_or_default()
}

/// The untyped resource of `crd`'s objects in `version`.
fn resource(crd: &CustomResourceDefinition, version: &str) -> ApiResource {
    let gvk = GroupVersionKind::gvk(&crd.spec.group, version, &crd.spec.names.kind);
    ApiResource::from_gvk_with_plural(&gvk, &crd.spec.names.plural)
}

async fn read_crd(
    crds: &Api<CustomResourceDefinition>,
) -> Result<CustomResourceDefinition, MigrateError> {
    crds.get_opt(CRD_NAME)
        .await
        .map_err(|e| MigrateError::ReadCrd(describe(&e)))?
        .ok_or(MigrateError::NoCrd)
}

/// Runs the migration with `client` (its own rate limit paces every request).
pub async fn run(client: Client, options: &Options) -> Result<Report, MigrateError> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = read_crd(&crds).await?;
    let storage = storage_version(&crd)
        .ok_or(MigrateError::NoStorageVersion)?
        .to_owned();
    let stored = stored_versions(&crd);
    let mut report = Report {
        outcome: Outcome::AlreadyMigrated,
        storage: storage.clone(),
        rewritten: 0,
        conflicts: 0,
        gone: 0,
        stored_versions: stored.clone(),
    };
    if stored == [storage.as_str()] {
        info!(
            storage = %storage,
            "migrate-storage: status.storedVersions of {CRD_NAME} is already [{storage}]: every GpuJob is stored as {storage}; nothing to do"
        );
        return Ok(report);
    }
    let resource = resource(&crd, &storage);
    info!(
        storage = %storage, stored_versions = ?stored,
        "migrate-storage: rewriting every GpuJob in {}, then setting status.storedVersions to [{storage}]",
        resource.api_version
    );

    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    let mut progress = Progress::new(options);
    let mut token: Option<String> = None;
    loop {
        let mut lp = ListParams::default().limit(options.page_size);
        if let Some(t) = &token {
            lp = lp.continue_token(t);
        }
        let page = match api.list(&lp).await {
            Ok(page) => page,
            // The continue token expired (etcd compacted past it, ~5 min): list again
            // from the start; objects already rewritten are rewritten again, harmlessly.
            Err(kube::Error::Api(s)) if s.code == 410 && token.is_some() => {
                warn!(
                    done = report.done(),
                    "migrate-storage: the list's continue token expired; listing again from the start (objects already migrated are not written again)"
                );
                token = None;
                continue;
            }
            Err(error) => {
                return Err(MigrateError::List {
                    api_version: resource.api_version.clone(),
                    error: describe(&error),
                });
            }
        };
        let remaining = page
            .metadata
            .remaining_item_count
            .and_then(|n| u64::try_from(n).ok())
            .unwrap_or(0);
        progress.total = Some(report.done() + page.items.len() as u64 + remaining);
        for object in page.items {
            if options.limit.is_some_and(|limit| report.done() >= limit) {
                report.outcome = Outcome::Stopped;
                info!(
                    done = report.done(), stored_versions = ?report.stored_versions,
                    "migrate-storage: stopped after {} GpuJobs (--limit); status.storedVersions left as it is; run again without --limit to finish",
                    report.done()
                );
                return Ok(report);
            }
            match rewrite(&client, &resource, object).await? {
                Rewritten::Written => report.rewritten += 1,
                Rewritten::Conflict => report.conflicts += 1,
                Rewritten::Gone => report.gone += 1,
            }
            progress.tick(&report);
        }
        token = page.metadata.continue_.filter(|t| !t.is_empty());
        if token.is_none() {
            break;
        }
    }
    progress.line(&report);

    // Every object is now stored as `storage`, unless the CRD switched versions
    // meanwhile: check again right before dropping the other versions.
    report.stored_versions = set_stored_versions(&crds, &storage).await?;
    report.outcome = Outcome::Complete;
    info!(
        rewritten = report.rewritten,
        conflicts = report.conflicts,
        gone = report.gone,
        "migrate-storage: done: every GpuJob is stored as {storage}; status.storedVersions is now [{storage}]"
    );
    Ok(report)
}

enum Rewritten {
    Written,
    Conflict,
    Gone,
}

/// Writes `object` back as read. Transient answers (429, 5xx) are retried by the
/// client's own retry layer; what reaches here is final.
async fn rewrite(
    client: &Client,
    resource: &ApiResource,
    object: DynamicObject,
) -> Result<Rewritten, MigrateError> {
    let namespace = object.namespace().unwrap_or_default();
    let name = object.name_any();
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, resource);
    let pp = PostParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PostParams::default()
    };
    match api.replace(&name, &pp, &object).await {
        Ok(_) => Ok(Rewritten::Written),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(Rewritten::Conflict),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(Rewritten::Gone),
        Err(error) => Err(MigrateError::Rewrite {
            namespace,
            name,
            api_version: resource.api_version.clone(),
            error: describe(&error),
        }),
    }
}

/// Sets `status.storedVersions` to `[storage]`, re-reading on conflicts, and only
/// while `storage` is still the CRD's storage version.
async fn set_stored_versions(
    crds: &Api<CustomResourceDefinition>,
    storage: &str,
) -> Result<Vec<String>, MigrateError> {
    let pp = PostParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PostParams::default()
    };
    let mut conflicts = 0;
    loop {
        let mut crd = read_crd(crds).await?;
        let now = storage_version(&crd).unwrap_or_default().to_owned();
        if now != storage {
            return Err(MigrateError::StorageChanged {
                from: storage.to_owned(),
                to: now,
            });
        }
        let wanted = vec![storage.to_owned()];
        if stored_versions(&crd) == wanted {
            return Ok(wanted);
        }
        crd.status
            .get_or_insert_with(Default::default)
            .stored_versions = Some(wanted.clone());
        match crds.replace_status(CRD_NAME, &pp, &crd).await {
            Ok(done) => return Ok(stored_versions(&done)),
            // Someone changed the CRD since it was read: read it (and its storage
            // version) again.
            Err(kube::Error::Api(s)) if s.code == 409 && conflicts < 5 => conflicts += 1,
            Err(error) => {
                return Err(MigrateError::StoredVersions {
                    storage: storage.to_owned(),
                    error: describe(&error),
                });
            }
        }
    }
}

/// Progress lines: done/total and the rate, every N objects or every interval.
struct Progress {
    every: u64,
    interval: Duration,
    started: Instant,
    last: Instant,
    last_done: u64,
    total: Option<u64>,
}

impl Progress {
    fn new(options: &Options) -> Progress {
        let now = Instant::now();
        Progress {
            every: options.progress_every.max(1),
            interval: options.progress_interval,
            started: now,
            last: now,
            last_done: 0,
            total: None,
        }
    }

    fn tick(&mut self, report: &Report) {
        let done = report.done();
        if done - self.last_done >= self.every || self.last.elapsed() >= self.interval {
            self.line(report);
        }
    }

    fn line(&mut self, report: &Report) {
        let done = report.done();
        let secs = self.started.elapsed().as_secs_f64();
        let rate = if secs > 0.0 { done as f64 / secs } else { 0.0 };
        let total = self
            .total
            .map_or_else(|| "?".to_owned(), |t| t.max(done).to_string());
        info!(
            done, total = %total, rate = format!("{rate:.1}"),
            conflicts = report.conflicts, gone = report.gone,
            "migrate-storage: {done}/{total} GpuJobs, {rate:.1}/s"
        );
        self.last = Instant::now();
        self.last_done = done;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{CrdOptions, StorageVersion, crd};

    #[test]
    fn the_storage_version_and_the_resource_come_from_the_crd() {
        let v1 = crd::crd(&CrdOptions::default()).unwrap();
        assert_eq!(storage_version(&v1), Some("v1"));
        let v2 = crd::crd(&CrdOptions {
            storage: StorageVersion::V2,
            ..CrdOptions::default()
        })
        .unwrap();
        assert_eq!(storage_version(&v2), Some("v2"));
        let r = resource(&v2, "v2");
        assert_eq!(
            (r.api_version.as_str(), r.kind.as_str(), r.plural.as_str()),
            ("gpujob.dev/v2", "GpuJob", "gpujobs")
        );
        assert!(stored_versions(&v2).is_empty(), "no status in a manifest");
    }

    #[test]
    fn errors_say_what_happens_to_stored_versions() {
        let e = MigrateError::StorageChanged {
            from: "v2".into(),
            to: "v1".into(),
        };
        assert!(e.to_string().contains("left as it is"), "{e}");
        assert!(MigrateError::NoCrd.to_string().contains("does not exist"));
    }
}
