//! `kubectl gpujob logs NAME [--attempt N] [--rank R]`: which pod's log to show.

use k8s_openapi::api::core::v1::Pod;

use crate::error::Error;
use crate::snapshot::{Snapshot, pod_attempt, rank_of};

/// The pod whose log is shown, and where it sits.
#[derive(Debug)]
pub struct Choice<'a> {
    pub attempt: i32,
    pub rank: i32,
    /// Ranks the attempt's pods have (1 for a single-node attempt).
    pub ranks: usize,
    pub pod: &'a Pod,
}

/// The pod of `attempt` (default: the newest attempt that still has pods) with
/// completion index `rank` (default 0; a single-node attempt has only rank 0).
pub fn choose(s: &Snapshot, attempt: Option<i32>, rank: Option<i32>) -> Result<Choice<'_>, Error> {
    let who = format!("GpuJob {}/{}", s.namespace(), s.name());
    let mut with_pods: Vec<i32> = s.pods.iter().filter_map(pod_attempt).collect();
    with_pods.sort_unstable();
    with_pods.dedup();
    let listed = |v: &[i32]| {
        v.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let attempt = match attempt {
        Some(k) if k < 1 => {
            return Err(Error::Input(format!(
                "--attempt {k}: attempts count from 1"
            )));
        }
        Some(k) => k,
        None => *with_pods.last().ok_or_else(|| {
            Error::Input(format!(
                "{who} has no pods (attempts started: {}; the pods of an attempt go with its \
                 Job, and Jobs older than the operator's --keep-jobs are deleted)",
                s.attempts()
            ))
        })?,
    };
    let pods = s.pods_of(attempt);
    if pods.is_empty() {
        return Err(Error::Input(format!(
            "attempt {attempt} of {who} has no pods{}",
            if with_pods.is_empty() {
                " (no attempt has any left)".to_owned()
            } else {
                format!(" (attempts with pods: {})", listed(&with_pods))
            }
        )));
    }
    let mut ranks: Vec<i32> = pods.iter().map(|p| rank_of(p)).collect();
    ranks.dedup();
    let rank = rank.unwrap_or(0);
    // `pods_of` puts the newest pod of each rank first.
    let pod = pods.iter().find(|p| rank_of(p) == rank).ok_or_else(|| {
        Error::Input(format!(
            "attempt {attempt} of {who} has no pod of rank {rank} (ranks: {})",
            listed(&ranks)
        ))
    })?;
    Ok(Choice {
        attempt,
        rank,
        ranks: ranks.len(),
        pod,
    })
}
