//! One Lease, plain leader election (`--shards 1`, the default): the holder works on
//! everything, the others keep warm caches and campaign.

use std::collections::BTreeMap;
use std::future::Future;

use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{info, warn};

use super::{
    Attempt, Elector, Ownership, ShardedPeers, Tenure, beat_limit, explain, gained_or_lost, jitter,
    report,
};
use crate::health::Status;

/// Campaigns for the Lease until `stop`, publishing ownership of shard 0; then a held
/// Lease is released. `stop` must resolve only once the work the Lease protects has
/// drained (the Lease is renewed meanwhile, so draining writes stay fenced correctly and
/// nothing writes after the release).
pub async fn run(
    elector: Elector,
    mut peers: ShardedPeers,
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
    // Whether the current wait behind sharded replicas has been logged.
    let mut logged = false;
    // The leader this standby last said it waits on.
    let mut standing_by: Option<String> = None;
    'campaign: loop {
        // Standby: try every retry period (jittered) until the Lease is ours.
        let (mut sent, transitions) = loop {
            status.beat(beat_limit);
            // Sharded replicas of this group (a rolling update changing --shards) win:
            // look before campaigning (unless the last look at the Lease saw a live
            // leader: then the acquire cannot succeed anyway, and one GET is cheaper than
            // a list), and again after acquiring, before any write.
            let leader_live = elector
                .seen()
                .await
                .is_some_and(|o| o.held_by_other(elector.identity(), Instant::now()));
            if !leader_live
                && sharded_live(&mut peers, &elector, &lease, &status, &mut logged).await
            {
                tokio::select! {
                    _ = tokio::time::sleep(jitter(timing.retry_period)) => continue,
                    _ = &mut shutdown => break 'campaign,
                }
            }
            let attempt = tokio::time::timeout(timing.renew_deadline, elector.acquire());
            match attempt.await {
                Ok(Ok(Attempt::Held { sent, transitions })) => {
                    if !sharded_live(&mut peers, &elector, &lease, &status, &mut logged).await {
                        break (sent, transitions);
                    }
                    // Nothing was written in this term: hand the Lease straight back.
                    match tokio::time::timeout(timing.renew_deadline, elector.release()).await {
                        Ok(Ok(_)) => {
                            info!(lease = %lease, "lease handed back unused: sharded replicas are live")
                        }
                        Ok(Err(e)) => warn!(lease = %lease,
                            "lease: handing it back failed: {}; it expires after the lease duration (this replica does not lead)",
                            explain(&e, elector.namespace())
                        ),
                        Err(_) => warn!(lease = %lease,
                            "lease: no answer to handing it back; it expires after the lease duration (this replica does not lead)"
                        ),
                    }
                }
                Ok(Ok(Attempt::Lost)) => {
                    // Said once per leader, so the log shows who this standby waits on.
                    let holder = elector
                        .seen()
                        .await
                        .and_then(|o| o.holder().map(str::to_owned));
                    if holder.is_some() && holder != standing_by {
                        info!(lease = %lease, leader = holder.as_deref().unwrap_or_default(),
                            "lease held by another replica: this replica stands by");
                        standing_by = holder;
                    }
                }
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

/// Whether a sharded replica of this lease group is live, or whether that is unknown (the
/// list failed): either way this replica must not lead. The wait is logged once and
/// shown as `gpujob_shard_count_conflict` (its alert fires if it lasts).
async fn sharded_live(
    peers: &mut ShardedPeers,
    elector: &Elector,
    lease: &str,
    status: &Status,
    logged: &mut bool,
) -> bool {
    let conflict = &status.metrics.shard_count_conflict;
    match peers
        .look(elector.identity(), elector.timing().renew_deadline)
        .await
    {
        Ok(None) => {
            conflict.set(0);
            *logged = false;
            false
        }
        Ok(Some(peer)) => {
            if !*logged {
                warn!(
                    lease = %lease,
                    replica = %peer.identity,
                    its_shards = peer.shards.map(|n| n.to_string()).unwrap_or_else(|| "unknown".to_owned()),
                    "a replica running with more than one shard is live; this --shards 1 replica takes no Lease until every sharded replica is gone (docs/ha-and-sharding.md, Sharding)"
                );
                *logged = true;
            }
            conflict.set(1);
            true
        }
        Err(why) => {
            warn!(
                lease = %lease,
                "lease: listing the group's shard Leases failed: {why}; not leading in this look"
            );
            true
        }
    }
}
