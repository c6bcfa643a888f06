//! One contender for one Lease: get, then create or compare-and-swap replace. A 409
//! means another replica won; nothing is ever written without the resourceVersion it
//! was computed from.

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Client;
use kube::api::{Api, DeleteParams, PostParams, Preconditions};
use tokio::sync::Mutex;
use tokio::time::Instant;

use gpujob_core::lease::{self as decide, Observed, Timing, claim, release};

/// Outcome of one attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    /// This replica holds the Lease; the write that said so was sent at `sent`, and the
    /// Lease's `leaseTransitions` is `transitions` (it grows with every gain).
    Held { sent: Instant, transitions: i32 },
    /// Someone else holds it (or won the race).
    Lost,
}

pub struct Elector {
    api: Api<Lease>,
    namespace: String,
    name: String,
    identity: String,
    timing: Timing,
    /// Labels a Lease created by this elector carries (so a group of Leases can be
    /// listed in one call).
    labels: std::collections::BTreeMap<String, String>,
    /// Annotations every acquire and renew writes (the kept shard map's claim, version
    /// and load: `gpujob_core::recut`); changed by the lease loop between writes.
    /// `None`: the annotation is removed.
    annotations: std::sync::Mutex<std::collections::BTreeMap<String, Option<String>>>,
    observed: Mutex<Option<Observed>>,
    /// The last record this elector wrote that the API server confirmed: a renewal
    /// replaces it without reading it first (client-go's fast path: one call, not two,
    /// while nobody else wrote), and a delete of its own Lease requires its uid and
    /// resourceVersion to still be there.
    written: Mutex<Option<Lease>>,
    /// Told when the annotations changed in a way the keeper of the shard map acts on:
    /// the renew loop then renews at once instead of at its next period.
    soon: tokio::sync::Notify,
}

impl std::fmt::Debug for Elector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Elector")
            .field("name", &self.name)
            .field("identity", &self.identity)
            .field("timing", &self.timing)
            .finish_non_exhaustive()
    }
}

impl Elector {
    pub fn new(
        client: Client,
        namespace: &str,
        name: &str,
        identity: &str,
        timing: Timing,
    ) -> Elector {
        Elector {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            identity: identity.to_owned(),
            timing,
            labels: Default::default(),
            annotations: Default::default(),
            observed: Mutex::new(None),
            written: Mutex::new(None),
            soon: tokio::sync::Notify::new(),
        }
    }

    /// Asks the renew loop of the held Lease to renew now (writing the annotations set
    /// since), not at its next period.
    pub fn renew_soon(&self) {
        self.soon.notify_one();
    }

    /// Resolves once [`Elector::renew_soon`] was asked (since it last resolved).
    pub async fn renew_asked(&self) {
        self.soon.notified().await;
    }

    /// The Lease is created with these labels, and every acquire and renew writes them.
    pub fn with_labels(mut self, labels: std::collections::BTreeMap<String, String>) -> Elector {
        self.labels = labels;
        self
    }

    /// Sets `values` among the annotations the next acquire or renew writes (the
    /// others stay).
    pub fn annotate(&self, values: impl IntoIterator<Item = (String, String)>) {
        self.annotations
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(values.into_iter().map(|(k, v)| (k, Some(v))));
    }

    /// Removes `key` from the annotations the next acquire or renew writes, and from the
    /// Lease with them.
    pub fn unannotate(&self, key: &str) {
        self.annotations
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key.to_owned(), None);
    }

    /// Writes this elector's labels and annotations into `lease`'s metadata (removing
    /// those [`Elector::unannotate`] took away).
    fn stamp(&self, lease: &mut Lease) {
        if !self.labels.is_empty() {
            let labels = lease.metadata.labels.get_or_insert_with(Default::default);
            labels.extend(self.labels.clone());
        }
        let annotations = self
            .annotations
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if !annotations.is_empty() {
            let on = lease
                .metadata
                .annotations
                .get_or_insert_with(Default::default);
            for (k, v) in annotations {
                match v {
                    Some(v) => on.insert(k, v),
                    None => on.remove(&k),
                };
            }
        }
    }

    /// The Lease as this elector last saw it, and when its record last changed.
    pub async fn seen(&self) -> Option<Observed> {
        self.observed.lock().await.clone()
    }

    /// Takes in the Lease as seen elsewhere (a list of a group of Leases): the expiry
    /// clock restarts only if its record changed since this elector last saw it.
    pub async fn observe(&self, lease: &Lease) {
        let mut observed = self.observed.lock().await;
        note(&mut observed, lease, Instant::now().into_std());
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    pub fn timing(&self) -> &Timing {
        &self.timing
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Takes the Lease if it is free or expired: a new term, counted in
    /// `leaseTransitions` even when the record still names this replica (a restart, or a
    /// step-down after a missed renew deadline), so every term of this Lease object
    /// counts higher than any term before it.
    pub async fn acquire(&self) -> Result<Attempt, kube::Error> {
        self.try_acquire_or_renew(true).await
    }

    /// Renews the Lease of the current term. `Lost` when the record no longer names
    /// this replica: a later `acquire` starts a new term.
    pub async fn renew(&self) -> Result<Attempt, kube::Error> {
        self.try_acquire_or_renew(false).await
    }

    /// One round of client-go's tryAcquireOrRenew.
    async fn try_acquire_or_renew(&self, new_term: bool) -> Result<Attempt, kube::Error> {
        let mut observed = self.observed.lock().await;
        if !new_term && let Some(attempt) = self.renew_written(&mut observed).await? {
            return Ok(attempt);
        }
        let current = self.api.get_opt(&self.name).await?;
        let now = Instant::now().into_std();
        let Some(mut lease) = current else {
            let mut lease = Lease::default();
            lease.metadata.name = Some(self.name.clone());
            self.stamp(&mut lease);
            if !new_term {
                // Deleted under us: this term is over.
                return Ok(Attempt::Lost);
            }
            lease.spec = Some(claim(
                None,
                &self.identity,
                &self.timing,
                Timestamp::now(),
                true,
            ));
            let sent = Instant::now();
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(created) => {
                    *observed = Some(decide::observed(&created, sent.into_std()));
                    self.wrote(&created).await;
                    Ok(held(sent, &created))
                }
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(Attempt::Lost),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        note(&mut observed, &lease, now);
        if observed
            .as_ref()
            .is_some_and(|o| o.held_by_other(&self.identity, now))
        {
            return Ok(Attempt::Lost);
        }
        if !new_term && spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            // Released or taken meanwhile: renewing would silently start a new term.
            return Ok(Attempt::Lost);
        }
        lease.spec = Some(claim(
            Some(&spec),
            &self.identity,
            &self.timing,
            Timestamp::now(),
            new_term,
        ));
        // The labels say who writes the Lease now (a replica restarted under the same
        // name with another `--shards` must not go on showing the old count); the
        // annotations, what it claims.
        self.stamp(&mut lease);
        Ok(self
            .write(&lease, &mut observed)
            .await?
            .unwrap_or(Attempt::Lost))
    }

    /// Replaces the Lease with `lease`, which carries the resourceVersion it was read or
    /// written at: a compare-and-swap. `None` when someone wrote it since (409) or it was
    /// deleted (404).
    async fn write(
        &self,
        lease: &Lease,
        observed: &mut Option<Observed>,
    ) -> Result<Option<Attempt>, kube::Error> {
        let sent = Instant::now();
        match self
            .api
            .replace(&self.name, &PostParams::default(), lease)
            .await
        {
            Ok(updated) => {
                *observed = Some(decide::observed(&updated, sent.into_std()));
                self.wrote(&updated).await;
                Ok(Some(held(sent, &updated)))
            }
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// A renewal written over the record this elector last wrote, if that names it, with
    /// that record's resourceVersion (a compare-and-swap): `None` when there is no such
    /// record or someone wrote the Lease since (a conflict): then read it and go on.
    async fn renew_written(
        &self,
        observed: &mut Option<Observed>,
    ) -> Result<Option<Attempt>, kube::Error> {
        let Some(mut lease) = self.written.lock().await.clone() else {
            return Ok(None);
        };
        let spec = lease.spec.clone().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return Ok(None);
        }
        lease.spec = Some(claim(
            Some(&spec),
            &self.identity,
            &self.timing,
            Timestamp::now(),
            false,
        ));
        self.stamp(&mut lease);
        self.write(&lease, observed).await
    }

    /// Gives the Lease up if this replica holds it: empty holder, so a standby takes it
    /// at once instead of waiting out the lease duration.
    pub async fn release(&self) -> Result<bool, kube::Error> {
        let mut observed = self.observed.lock().await;
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            return Ok(false);
        };
        let spec = lease.spec.clone().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return Ok(false);
        }
        lease.spec = Some(release(&spec, Timestamp::now()));
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(updated) => {
                *observed = Some(decide::observed(&updated, Instant::now().into_std()));
                self.wrote(&updated).await;
                Ok(true)
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Deletes the Lease if it is still the record this elector last wrote: the delete
    /// carries that record's uid and resourceVersion, so a Lease written since (by a
    /// successor of the same name, say, or a write of this one whose answer was lost) or
    /// created again stays. `false` when it was not deleted for that reason (or nothing
    /// was written yet).
    pub async fn delete_own(&self) -> Result<bool, kube::Error> {
        let Some(preconditions) = self.written.lock().await.as_ref().map(|l| Preconditions {
            uid: l.metadata.uid.clone(),
            resource_version: l.metadata.resource_version.clone(),
        }) else {
            return Ok(false);
        };
        let dp = DeleteParams {
            preconditions: Some(preconditions),
            ..DeleteParams::default()
        };
        match self.api.delete(&self.name, &dp).await {
            Ok(_) => {
                *self.written.lock().await = None;
                *self.observed.lock().await = None;
                Ok(true)
            }
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => Ok(false),
            Err(e) => Err(e),
        }
    }

    async fn wrote(&self, lease: &Lease) {
        *self.written.lock().await = Some(lease.clone());
    }
}

/// The expiry clock restarts whenever the record changes.
fn note(observed: &mut Option<Observed>, lease: &Lease, now: std::time::Instant) {
    let spec = lease.spec.clone().unwrap_or_default();
    let rv = lease.metadata.resource_version.clone().unwrap_or_default();
    let changed = observed
        .as_ref()
        .is_none_or(|o| o.spec != spec || o.resource_version != rv);
    if changed {
        *observed = Some(Observed {
            spec,
            resource_version: rv,
            at: now,
        });
    }
}

fn held(sent: Instant, lease: &Lease) -> Attempt {
    let transitions = lease
        .spec
        .as_ref()
        .and_then(|s| s.lease_transitions)
        .unwrap_or(0);
    Attempt::Held { sent, transitions }
}
