//! One Lease, plain leader election (`--shards 1`, the default): the holder works on
//! everything, the others keep warm caches and campaign.

use std::collections::BTreeMap;
use std::future::Future;

use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{info, warn};

use super::{
    Attempt, Elector, Ownership, Tenure, beat_limit, explain, gained_or_lost, jitter, report,
};
use crate::server::Status;

/// Campaigns for the Lease until `stop`, publishing ownership of shard 0; then a held
/// Lease is released. `stop` must resolve only once the work the Lease protects has
/// drained (the Lease is renewed meanwhile, so draining writes stay fenced correctly and
/// nothing writes after the release).
pub async fn run(
    elector: Elector,
    tx: watch::Sender<Ownership>,
    status: std::sync::Arc<Status>,
    stop: impl Future<Output = ()>,
) {
    let shutdown = stop;
    tokio::pin!(shutdown);
    let timing = elector.timing().clone();
    let metrics = status.metrics.clone();
    report(&metrics, &tx.borrow());
    let beat_limit = beat_limit(&timing);
    // Every line names the Lease it is about.
    let lease = format!("{}/{}", elector.namespace(), elector.name());
    'campaign: loop {
        // Standby: try every retry period (jittered) until the Lease is ours.
        let (mut sent, transitions) = loop {
            status.beat(beat_limit);
            let attempt = tokio::time::timeout(timing.renew_deadline, elector.acquire());
            match attempt.await {
                Ok(Ok(Attempt::Held { sent, transitions })) => break (sent, transitions),
                Ok(Ok(Attempt::Lost)) => {}
                Ok(Err(e)) => warn!(lease = %lease,
                    "lease: acquiring failed: {}; retrying in {:?}",
                    explain(&e, elector.namespace()),
                    timing.retry_period
                ),
                Err(_) => warn!(lease = %lease,
                    "lease: no answer within {:?}; retrying in {:?}",
                    timing.renew_deadline, timing.retry_period
                ),
            }
            tokio::select! {
                _ = tokio::time::sleep(jitter(timing.retry_period)) => {}
                _ = &mut shutdown => break 'campaign,
            }
        };
        let token = format!("{}/{transitions}", elector.name());
        let mut tenure = Tenure::gained(Some(sent + timing.renew_deadline), Some(token));
        info!(
            identity = elector.identity(),
            shard = 0,
            epoch = tenure.epoch,
            token = tenure.token.as_deref().unwrap_or_default(),
            "lease acquired: this replica leads"
        );
        tx.send_replace(Ownership {
            held: BTreeMap::from([(0, tenure.clone())]),
            shards: 1,
        });
        gained_or_lost(&metrics, &tx.borrow());

        // Leader: renew every retry period; step down once the deadline passes without
        // a successful renewal.
        loop {
            tokio::select! {
                _ = tokio::time::sleep(timing.retry_period) => {}
                _ = &mut shutdown => break 'campaign,
            }
            let deadline = sent + timing.renew_deadline;
            let left = deadline.saturating_duration_since(Instant::now());
            status.beat(beat_limit);
            let renewed = tokio::time::timeout(left, elector.renew()).await;
            match renewed {
                Ok(Ok(Attempt::Held { sent: s, .. })) => {
                    sent = s;
                    tenure.deadline = Some(sent + timing.renew_deadline);
                    tx.send_replace(Ownership {
                        held: BTreeMap::from([(0, tenure.clone())]),
                        shards: 1,
                    });
                }
                Ok(Ok(Attempt::Lost)) => {
                    warn!(lease = %lease, "lease: another replica holds it now; stepping down");
                    break;
                }
                Ok(Err(e)) if Instant::now() < deadline => {
                    warn!(lease = %lease,
                        "lease: renewing failed: {}; retrying until the renew deadline",
                        explain(&e, elector.namespace())
                    );
                }
                Ok(Err(e)) => {
                    warn!(lease = %lease,
                        "lease: renewing failed past the renew deadline: {}; stepping down",
                        explain(&e, elector.namespace())
                    );
                    break;
                }
                Err(_) => {
                    warn!(lease = %lease, "lease: no renewal within the renew deadline; stepping down");
                    break;
                }
            }
        }
        tx.send_replace(Ownership::none());
        info!(
            shard = 0,
            epoch = tenure.epoch,
            "lease lost: this replica stops writing"
        );
        gained_or_lost(&metrics, &tx.borrow());
        continue 'campaign;
    }
    // The work has drained: give the Lease up.
    let was_leader = tx.borrow().holds_any();
    tx.send_replace(Ownership::none());
    report(&metrics, &tx.borrow());
    if was_leader {
        match elector.release().await {
            Ok(true) => info!("lease released: a standby can take over at once"),
            Ok(false) => info!("lease was no longer ours; nothing to release"),
            Err(e) => {
                warn!(lease = %lease,
                    "lease: release failed: {}; standbys take over after the lease duration",
                    explain(&e, elector.namespace())
                )
            }
        }
    }
}
