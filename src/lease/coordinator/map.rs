//! The kept shard map, in the coordinator's looks (`gpujob_core::recut` has the rules,
//! docs/ha-and-sharding.md "The kept map" the protocol): follow a newer map, take a shard
//! only where no live claim reaches, state each held shard's load, keep the map.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Instant;

use gpujob_core::recut::{self, ANNOTATION_CUTS, ANNOTATION_LOAD, ANNOTATION_VERSION};
use gpujob_core::shard::HashRange;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{ObjectMeta, PostParams};
use tokio::time::timeout;
use tracing::{info, warn};

use super::Coordinator;
use crate::lease::explain;
use crate::lease::kept::{self, annotation};

/// The version of the map the map Lease among `leases` states for `shards` shards (0:
/// none, or another count's).
fn current_version(leases: &[Lease], name: &str, shards: u32) -> u64 {
    kept::by_name(leases, name)
        .and_then(|l| kept::stated(l, shards))
        .map_or(0, |(v, _)| v)
}

impl Coordinator {
    /// A newer map on the map Lease: the held shards whose range it moves are given up
    /// (drained, then released: their Leases claim the old range until then), the others
    /// are kept, and the ownership acts under the new map from now.
    pub(super) fn follow_map(&mut self, leases: &[Lease], now: Instant) {
        let Some(k) = self.kept.as_ref() else {
            return;
        };
        let name = self.group.leases.map_lease();
        let Some((version, map)) =
            kept::by_name(leases, &name).and_then(|l| kept::stated(l, self.group.leases.shards()))
        else {
            return;
        };
        if version <= k.version {
            return;
        }
        let old = self.tx.borrow().map.clone();
        let moved = recut::moved(&old, &map);
        let held: Vec<u32> = self
            .tx
            .borrow()
            .held
            .keys()
            .filter(|s| moved.contains(s))
            .copied()
            .collect();
        info!(
            version,
            cuts = %map.cuts_text(),
            moved = ?moved,
            given_up_here = ?held,
            "shard map changed: draining and releasing the shards held whose range moved; keeping the others"
        );
        let running = self.looked;
        // Every shard's watches start again under the new ranges: none lingers warm.
        self.warm.forget();
        if let Some(k) = self.kept.as_mut() {
            k.followed(version, now, running);
        }
        for s in held {
            let epoch = self.tx.borrow().tenure(s).map(|t| t.epoch);
            if let Some(epoch) = epoch {
                self.drain_and_release(s, epoch);
            }
        }
        let map = Arc::new(map);
        self.tx.send_modify(|o| o.map = map.clone());
        self.status
            .metrics
            .shard_map_version
            .set(i64::try_from(version).unwrap_or(i64::MAX));
        // Held shards keep their range and now state the new version. A claim's range
        // is written only when its shard is taken (`claim_at_acquire`).
        for s in self.tx.borrow().held.keys() {
            self.electors[*s as usize]
                .annotate([(ANNOTATION_VERSION.to_owned(), version.to_string())]);
        }
    }

    /// Right before `shard` is acquired: its Lease will claim its range under the map
    /// acted under, at the map's version, with no load yet (stated once its caches have
    /// counted it, `state_loads`). Fixed for the whole term.
    pub(super) fn claim_at_acquire(&self, shard: u32) {
        let Some(k) = &self.kept else {
            return;
        };
        let range = self.tx.borrow().map.range(shard);
        let e = &self.electors[shard as usize];
        e.unannotate(ANNOTATION_LOAD);
        e.annotate([
            (
                recut::ANNOTATION_RANGE.to_owned(),
                recut::format_range(&range),
            ),
            (ANNOTATION_VERSION.to_owned(), k.version.to_string()),
        ]);
    }

    /// Of `shards`, those whose range (under the map acted under) no live Lease of
    /// another shard claims, by the list `leases`, nor a Lease this replica still drains.
    /// Everything with fixed cuts (every Lease claims its own range of one map).
    pub(super) async fn unclaimed(
        &self,
        shards: &[u32],
        leases: &[Lease],
        now: Instant,
    ) -> Vec<u32> {
        if self.kept.is_none() {
            return shards.to_vec();
        }
        let (map, held) = {
            let own = self.tx.borrow();
            (
                own.map.clone(),
                own.held.keys().copied().collect::<BTreeSet<u32>>(),
            )
        };
        // This replica's own shards still draining claim the range they were held with
        // until their release has run (writes sent before the drain may still land).
        let mut claims: Vec<(u32, HashRange)> = self
            .draining
            .iter()
            .filter(|(s, _)| self.releasing.contains_key(s))
            .map(|(s, r)| (*s, *r))
            .collect();
        for (i, elector) in self.electors.iter().enumerate() {
            let shard = u32::try_from(i).unwrap_or(u32::MAX);
            if held.contains(&shard) || self.releasing.contains_key(&shard) {
                continue;
            }
            let Some(lease) = kept::by_name(leases, elector.name()) else {
                continue;
            };
            elector.observe(lease).await;
            if elector
                .seen()
                .await
                .is_some_and(|o| o.held_by_other(&self.me, now))
            {
                claims.push((shard, kept::claim_of(lease)));
            }
        }
        shards
            .iter()
            .copied()
            .filter(|s| {
                let others: Vec<HashRange> = claims
                    .iter()
                    .filter(|(c, _)| c != s)
                    .map(|(_, r)| *r)
                    .collect();
                recut::free_to_take(&map.range(*s), &others)
            })
            .collect()
    }

    /// Each held shard's Lease states, from its next renewal, the GpuJobs per namespace
    /// of its range, once the runner has counted it from caches that cover it in this
    /// term (before that, no load: the keeper waits rather than take it for empty).
    /// When the number of namespaces a shard holds changed (or it is stated first in a
    /// term), that renewal comes at once: the keeper's first cut waits for them.
    pub(super) fn state_loads(&mut self) {
        if self.kept.is_none() {
            return;
        }
        let own = self.tx.borrow().clone();
        self.stated.retain(|s, _| own.held.contains_key(s));
        for (s, tenure) in &own.held {
            let e = &self.electors[*s as usize];
            match self.load.within(*s, tenure.epoch, &own.map.range(*s)) {
                Some(counts) => {
                    e.annotate([(ANNOTATION_LOAD.to_owned(), recut::format_load(&counts))]);
                    let namespaces = (tenure.epoch, counts.len());
                    if self.stated.insert(*s, namespaces) != Some(namespaces) {
                        e.renew_soon();
                    }
                }
                None => e.unannotate(ANNOTATION_LOAD),
            }
        }
    }

    /// The keeper (the holder of shard 0) re-cuts when every shard is held under the
    /// current map with its load stated, the rule says so, and the last change is at
    /// least the re-cut interval old. One write, with the map Lease's resourceVersion
    /// (two keepers at once: one wins).
    pub(super) async fn keep_map(&mut self, leases: &[Lease], now: Instant) {
        let Some(k) = &self.kept else {
            return;
        };
        let own = self.tx.borrow().clone();
        let shards = own.shards();
        let name = self.group.leases.map_lease();
        if k.version > 0 && own.held.contains_key(&0) && kept::by_name(leases, &name).is_none() {
            // The map Lease is gone (deleted by hand, or with its namespace): written
            // again at once as this replica acts under it, so replicas that start anew
            // (at equal ranges, version 0) follow it instead of claiming across it.
            let again = self.write_map(k.version, &own.map, None);
            match timeout(self.group.timing.renew_deadline, again).await {
                Ok(Ok(_)) => {
                    warn!(lease = %name, version = k.version, "the shard map Lease was missing: written again as this replica acts under it")
                }
                Ok(Err(e)) => {
                    warn!(lease = %name, "writing the missing shard map Lease again failed: {}; trying again next look", explain(&e, &self.group.leases.namespace))
                }
                Err(_) => {
                    warn!(lease = %name, "writing the missing shard map Lease again: no answer; trying again next look")
                }
            }
            return;
        }
        // Every shard Lease held (by a live replica or this one) under `version`:
        // their loads, or `None`.
        let mut loads = Vec::new();
        let mut every = true;
        for i in 0..shards {
            let lease = kept::by_name(leases, self.electors[i as usize].name());
            let held_here = own.held.contains_key(&i);
            let live = match lease {
                Some(_) if held_here => true,
                Some(_) => self.electors[i as usize]
                    .seen()
                    .await
                    .is_some_and(|o| o.held_by_other(&self.me, now)),
                None => false,
            };
            let under = lease.filter(|l| live && kept::version_of(l) == k.version);
            match under.and_then(|l| recut::parse_load(annotation(l, ANNOTATION_LOAD)?)) {
                Some(l) => loads.extend(l),
                None => every = false,
            }
        }
        if let Some((version, at)) = k.wrote
            && every
            && k.version >= version
        {
            self.status
                .metrics
                .shard_recut
                .observe(now.saturating_duration_since(at).as_secs_f64());
            info!(
                version,
                seconds = now.saturating_duration_since(at).as_secs_f64(),
                "re-cut done: every shard held under the new map"
            );
            if let Some(k) = self.kept.as_mut() {
                k.wrote = None;
            }
        }
        let Some(k) = &self.kept else {
            return;
        };
        // `--recut-interval 0`: this replica never re-cuts.
        if !every
            || k.interval.is_zero()
            || !own.held.contains_key(&0)
            || !k.due(now)
            || k.wrote.is_some()
        {
            return;
        }
        let total = loads.iter().map(|(_, n)| n).sum();
        let namespaces = loads.iter().filter(|(_, n)| *n > 0).count();
        let (steady, settled) = self.kept.as_mut().map_or((false, false), |k| {
            (
                k.steady_at(total, now),
                k.namespaces_settled_at(namespaces, now),
            )
        });
        let Some(k) = &self.kept else {
            return;
        };
        // Steady: by GpuJobs. In a burst, only the first cut of equal ranges, by
        // namespaces (a cut made early moves few GpuJobs).
        let next = if steady {
            recut::recut(&own.map, &loads, &k.rule)
        } else if settled
            && k.version == 0
            && current_version(leases, &self.group.leases.map_lease(), shards) == 0
        {
            recut::first_cut(&own.map, &loads, &k.rule)
        } else {
            None
        };
        let Some(next) = next else {
            return;
        };
        let current = kept::by_name(leases, &name);
        let version = current.map_or(0, kept::version_of).max(k.version) + 1;
        let write = self.write_map(version, &next, current);
        let before = recut::skew(&recut::per_shard(&own.map, &loads));
        let after = recut::skew(&recut::per_shard(&next, &loads));
        match timeout(self.group.timing.renew_deadline, write).await {
            Ok(Ok(_)) => {
                info!(
                    version,
                    cuts = %next.cuts_text(),
                    busiest_over_mean_before = before,
                    busiest_over_mean_after = after,
                    "shard map re-cut: the busiest shard held too many GpuJobs; the shards whose range moves are handed over"
                );
                self.status.metrics.shard_recuts.inc();
                if let Some(k) = self.kept.as_mut() {
                    k.wrote_map(version, now);
                }
            }
            // Another keeper wrote since the list: its map is followed next look.
            Ok(Err(kube::Error::Api(s))) if s.code == 409 => {}
            Ok(Err(e)) => warn!(
                lease = %name,
                "writing the re-cut shard map failed: {}; trying again next look",
                explain(&e, &self.group.leases.namespace)
            ),
            Err(_) => {
                warn!(lease = %name, "writing the re-cut shard map: no answer; trying again next look")
            }
        }
    }
}

impl Coordinator {
    /// The write of the map Lease stating `map` at `version`: a replace of `current`
    /// with its resourceVersion (a compare-and-swap), or a create.
    fn write_map(
        &self,
        version: u64,
        map: &gpujob_core::shard::ShardMap,
        current: Option<&Lease>,
    ) -> impl std::future::Future<Output = kube::Result<Lease>> + use<> {
        let name = self.group.leases.map_lease();
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some(self.group.leases.map_labels()),
                annotations: Some(
                    [
                        (ANNOTATION_VERSION.to_owned(), version.to_string()),
                        (ANNOTATION_CUTS.to_owned(), map.cuts_text()),
                    ]
                    .into(),
                ),
                resource_version: current.and_then(|l| l.metadata.resource_version.clone()),
                ..ObjectMeta::default()
            },
            spec: None,
        };
        let api = self.group.api.clone();
        let replace = current.is_some();
        async move {
            let pp = PostParams::default();
            if replace {
                api.replace(&name, &pp, &lease).await
            } else {
                api.create(&pp, &lease).await
            }
        }
    }
}
