//! Where this replica's term of each shard began, as a resourceVersion `T`: read once
//! per term by a quorum list, after the term was gained. A cached GpuJob whose
//! resourceVersion is past `T` needs no confirming read before its first effect
//! (`Action::Confirm`): that is every GpuJob created or changed after a replica took its
//! shard, so a burst of new GpuJobs costs no read each. Only GpuJobs last changed at or
//! before `T` are read first.
//!
//! Why that is sound. A confirming read exists so that an effect is not decided on a
//! GpuJob that an earlier holder of the shard has changed since. An earlier holder's
//! writes can arrive late (queued, connecting, frozen past its lease), so "they were all
//! committed before the term began" would be false. What holds instead:
//!
//! 1. Every GpuJob write carries the resourceVersion `p` of the version it was computed
//!    from (status and finalizer patches; deletes carry uid and resourceVersion): the
//!    API server applies it only while the GpuJob is still at `p`. `Writer` refuses to
//!    send one without it.
//! 2. The earlier holder read version `p` before its lease deadline, so before this term
//!    began, so before the read of `T`: `p <= T` (etcd revisions grow with time, and a
//!    quorum list's version is at least every revision committed before it).
//! 3. A cached version `v` with `v > T` is newer than `p`. A GpuJob's resourceVersion
//!    only grows, so once it is at `v` it is never at `p` again: no late write of an
//!    earlier holder can ever apply on top of `v`. Whatever of theirs did commit, did so
//!    before `v`, and `v` shows it.
//!
//! Strictly past: `v == T` is read first, so the argument needs no assumption about
//! where the term's own Lease write was stored. Writes the view does not take from
//! GpuJobs are outside this argument: a late Job create is found by the Job watch and
//! undone (`JobDeletion::Stray`), and quota calls are fenced by the provider's token.
//!
//! resourceVersions are compared as numbers, which kube-apiserver's own watch cache does
//! (they are etcd revisions, one sequence for the whole store). One that is not a number
//! is never taken for current: the GpuJob is read first, as before.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use kube::Client;
use kube::api::{Api, ListParams};
use tracing::warn;

use crate::api::GpuJob;

/// After a failed read of a term's start, GpuJobs are confirmed one by one for this long
/// before it is tried again.
const RETRY_AFTER: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Copy)]
enum Start {
    Known(u64),
    /// One reconcile is reading it; the others confirm their GpuJob meanwhile.
    Reading,
    Failed(Instant),
}

/// The start of each shard's current term, by shard: `(epoch, start)`.
pub struct TermStarts {
    client: Client,
    by_shard: Mutex<HashMap<u32, (u64, Start)>>,
}

impl std::fmt::Debug for TermStarts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TermStarts")
            .field("by_shard", &*self.lock())
            .finish_non_exhaustive()
    }
}

impl TermStarts {
    pub fn new(client: Client) -> TermStarts {
        TermStarts {
            client,
            by_shard: Mutex::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<u32, (u64, Start)>> {
        self.by_shard.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether version `rv` of a GpuJob in `namespace` is past the start of term `epoch`
    /// of `shard`. `false` while the start is unknown (being read, or its read failed):
    /// the caller then reads the GpuJob itself.
    pub async fn covers(&self, shard: u32, epoch: u64, namespace: &str, rv: &str) -> bool {
        match self.start(shard, epoch, namespace).await {
            Some(start) => past(rv, start),
            None => false,
        }
    }

    async fn start(&self, shard: u32, epoch: u64, namespace: &str) -> Option<u64> {
        {
            let mut by_shard = self.lock();
            match by_shard.get(&shard) {
                Some((e, Start::Known(start))) if *e == epoch => return Some(*start),
                Some((e, Start::Reading)) if *e == epoch => return None,
                Some((e, Start::Failed(at))) if *e == epoch && at.elapsed() < RETRY_AFTER => {
                    return None;
                }
                _ => {
                    by_shard.insert(shard, (epoch, Start::Reading));
                }
            }
        }
        // A reconcile cancelled mid-read (its term ended) leaves no `Reading` behind.
        let mut reading = Unread {
            starts: self,
            shard,
            epoch,
            ended: false,
        };
        // Any namespace will do (one sequence for the whole store); the GpuJob's own is
        // one this replica may list whatever its install's scope.
        let api: Api<GpuJob> = Api::namespaced(self.client.clone(), namespace);
        // No resourceVersion: a quorum read, whose list version is the store's now.
        let read = api.list_metadata(&ListParams::default().limit(1)).await;
        reading.ended = true;
        let start = match read {
            Ok(list) => list
                .metadata
                .resource_version
                .and_then(|v| v.parse::<u64>().ok()),
            Err(e) => {
                warn!(
                    shard,
                    error = %e,
                    "could not read where this term of the shard began; its GpuJobs are read from the API server before their first Job or quota call until it is known (next try in {}s)",
                    RETRY_AFTER.as_secs()
                );
                None
            }
        };
        let mut by_shard = self.lock();
        // Only this term's entry: a newer term may have begun meanwhile.
        if by_shard.get(&shard).is_some_and(|(e, _)| *e == epoch) {
            let state = start.map_or(Start::Failed(Instant::now()), Start::Known);
            by_shard.insert(shard, (epoch, state));
        }
        start
    }
}

/// Clears a term's `Reading` when the read is dropped before it ends.
struct Unread<'a> {
    starts: &'a TermStarts,
    shard: u32,
    epoch: u64,
    ended: bool,
}

impl Drop for Unread<'_> {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        let mut by_shard = self.starts.lock();
        if matches!(by_shard.get(&self.shard), Some((e, Start::Reading)) if *e == self.epoch) {
            by_shard.remove(&self.shard);
        }
    }
}

/// Whether resourceVersion `rv` is past `start` (never, when `rv` is not a number).
pub fn past(rv: &str, start: u64) -> bool {
    rv.parse::<u64>().is_ok_and(|v| v > start)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use kube::Client;
    use tokio::net::TcpListener;
    use tokio::sync::mpsc;

    use super::{TermStarts, past};

    #[tokio::test]
    async fn a_read_cancelled_with_its_reconcile_is_made_again_by_the_next() {
        // An API server that accepts connections and never answers; each connection is
        // one read of a term's start.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (tx, mut reads) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut open = Vec::new();
            while let Ok((conn, _)) = listener.accept().await {
                open.push(conn);
                let _ = tx.send(());
            }
        });
        let client = Client::try_from(kube::Config::new(url.parse().unwrap())).unwrap();
        let starts = std::sync::Arc::new(TermStarts::new(client));
        {
            let first = starts.covers(0, 1, "ns", "10");
            tokio::pin!(first);
            tokio::select! {
                _ = &mut first => panic!("nothing answers the read"),
                _ = reads.recv() => {}
            }
            // Dropped here, as a reconcile is when its term ends.
        }
        let s = starts.clone();
        let second = tokio::spawn(async move { s.covers(0, 1, "ns", "10").await });
        let again = tokio::time::timeout(Duration::from_secs(30), reads.recv()).await;
        second.abort();
        assert!(
            again.is_ok(),
            "the next reconcile took the cancelled read for one still running"
        );
    }

    #[test]
    fn versions_past_the_start_are_covered() {
        assert!(past("121", 120));
        assert!(!past("119", 120));
        // The start itself may be the very version an earlier holder computed a late
        // write from (module docs): read first.
        assert!(!past("120", 120));
        // Compared as numbers, not as text.
        assert!(past("1000", 999));
        assert!(!past("999", 1000));
    }

    #[test]
    fn a_version_that_is_not_a_number_is_never_covered() {
        assert!(!past("", 0));
        assert!(!past("abc", 0));
        assert!(!past("-1", 0));
    }
}
