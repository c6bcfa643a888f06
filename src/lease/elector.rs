//! One contender for one Lease: get, then create or compare-and-swap replace. A 409
//! means another replica won; nothing is ever written without the resourceVersion it
//! was computed from.

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Client;
use kube::api::{Api, PostParams};
use tokio::sync::Mutex;
use tokio::time::Instant;

use super::decide::{Observed, Timing, claim, release};

/// Outcome of one attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    /// This replica holds the Lease; the write that said so was sent at this instant.
    Held { sent: Instant },
    /// Someone else holds it (or won the race).
    Lost,
}

pub struct Elector {
    api: Api<Lease>,
    name: String,
    identity: String,
    timing: Timing,
    observed: Mutex<Option<Observed>>,
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
            name: name.to_owned(),
            identity: identity.to_owned(),
            timing,
            observed: Mutex::new(None),
        }
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    pub fn timing(&self) -> &Timing {
        &self.timing
    }

    /// One round of client-go's tryAcquireOrRenew.
    pub async fn try_acquire_or_renew(&self) -> Result<Attempt, kube::Error> {
        let mut observed = self.observed.lock().await;
        let current = self.api.get_opt(&self.name).await?;
        let now = Instant::now();
        let Some(mut lease) = current else {
            let mut lease = Lease::default();
            lease.metadata.name = Some(self.name.clone());
            lease.spec = Some(claim(None, &self.identity, &self.timing, Timestamp::now()));
            let sent = Instant::now();
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(created) => {
                    *observed = Some(observe(&created, sent));
                    Ok(Attempt::Held { sent })
                }
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(Attempt::Lost),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let rv = lease.metadata.resource_version.clone().unwrap_or_default();
        // The expiry clock restarts whenever the record changes.
        let changed = observed
            .as_ref()
            .is_none_or(|o| o.spec != spec || o.resource_version != rv);
        if changed {
            *observed = Some(Observed {
                spec: spec.clone(),
                resource_version: rv,
                at: now,
            });
        }
        if observed
            .as_ref()
            .is_some_and(|o| o.held_by_other(&self.identity, now))
        {
            return Ok(Attempt::Lost);
        }
        lease.spec = Some(claim(
            Some(&spec),
            &self.identity,
            &self.timing,
            Timestamp::now(),
        ));
        let sent = Instant::now();
        // A replace carries the resourceVersion it read: a compare-and-swap.
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(updated) => {
                *observed = Some(observe(&updated, sent));
                Ok(Attempt::Held { sent })
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(Attempt::Lost),
            Err(e) => Err(e),
        }
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
                *observed = Some(observe(&updated, Instant::now()));
                Ok(true)
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }
}

fn observe(lease: &Lease, at: Instant) -> Observed {
    Observed {
        spec: lease.spec.clone().unwrap_or_default(),
        resource_version: lease.metadata.resource_version.clone().unwrap_or_default(),
        at,
    }
}
