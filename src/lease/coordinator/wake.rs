//! A look that comes as soon as the group's Leases change in a way a look acts on, not
//! a retry period later: a newer shard map (followed at once), a shard released or
//! taken (a shard freed by a hand-over is taken at once), a shard claiming another
//! range or stating another map version; and, for the keeper of the map only, a shard
//! stating another number of namespaces (what its cut waits for). A renewal alone changes none of
//! these, so a quiet group wakes nobody. Only with the kept map
//! (docs/ha-and-sharding.md, "The kept map"); every look is still one of the lease
//! loop's looks, so the protocol is the same, only sooner.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use gpujob_core::recut::{ANNOTATION_CUTS, ANNOTATION_LOAD, ANNOTATION_RANGE, ANNOTATION_VERSION};
use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::{Notify, watch as channel};
use tracing::{info, warn};

use crate::lease::Ownership;

/// What of a Lease a look acts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Signature {
    holder: Option<String>,
    version: Option<String>,
    cuts: Option<String>,
    range: Option<String>,
    /// How many namespaces its load names (their counts move with every GpuJob; a
    /// namespace swapped for another is seen by the keeper at its next look).
    namespaces: Option<usize>,
}

impl Signature {
    /// All but the namespaces: what is news to every replica.
    fn but_namespaces(
        &self,
    ) -> (
        &Option<String>,
        &Option<String>,
        &Option<String>,
        &Option<String>,
    ) {
        (&self.holder, &self.version, &self.cuts, &self.range)
    }
}

pub(super) fn signature(lease: &Lease) -> Signature {
    let annotation = |key: &str| lease.annotations().get(key).cloned();
    Signature {
        holder: lease
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.clone())
            .filter(|h| !h.is_empty()),
        version: annotation(ANNOTATION_VERSION),
        cuts: annotation(ANNOTATION_CUTS),
        range: annotation(ANNOTATION_RANGE),
        namespaces: lease
            .annotations()
            .get(ANNOTATION_LOAD)
            .map(|l| l.split(',').filter(|e| !e.is_empty()).count()),
    }
}

/// Who a change is news to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum News {
    None,
    /// Only the keeper of the map: a shard states another number of namespaces.
    Keeper,
    Everyone,
}

/// Remembers each Lease's [`Signature`], to tell what changed.
#[derive(Debug, Default)]
pub(super) struct Seen {
    by_name: HashMap<String, Signature>,
    /// While the watch lists again (after it could not resume): the names listed so far.
    relisted: Option<std::collections::HashSet<String>>,
}

impl Seen {
    pub(super) fn changed(&mut self, lease: &Lease) -> News {
        let sig = signature(lease);
        if let Some(listed) = self.relisted.as_mut() {
            listed.insert(lease.name_any());
        }
        match self.by_name.insert(lease.name_any(), sig.clone()) {
            Some(was) if was == sig => News::None,
            Some(was) if was.but_namespaces() == sig.but_namespaces() => News::Keeper,
            _ => News::Everyone,
        }
    }

    pub(super) fn gone(&mut self, lease: &Lease) -> News {
        match self.by_name.remove(&lease.name_any()) {
            Some(_) => News::Everyone,
            None => News::None,
        }
    }

    /// The watch lists every Lease again.
    pub(super) fn relist_begins(&mut self) {
        self.relisted = Some(Default::default());
    }

    /// The list is over: a Lease it did not name went while the watch was down.
    pub(super) fn relist_done(&mut self) -> News {
        let Some(listed) = self.relisted.take() else {
            return News::None;
        };
        let before = self.by_name.len();
        self.by_name.retain(|name, _| listed.contains(name));
        if self.by_name.len() < before {
            News::Everyone
        } else {
            News::None
        }
    }
}

/// Watches the Leases `selector` picks in `api` and tells `wake` of each change a look
/// acts on (news to the keeper only while `own` says this replica holds shard 0). The
/// API server ends each watch within `within` (before the client's read timeout could).
/// A watch that fails (a role without `watch` on Leases, say) is said once and retried
/// with backoff; the looks keep their period meanwhile.
pub(super) async fn watch(
    api: Api<Lease>,
    namespace: String,
    selector: String,
    within: Duration,
    wake: Arc<Notify>,
    own: channel::Receiver<Ownership>,
) {
    let mut seen = Seen::default();
    let mut failing = false;
    let secs = u32::try_from(within.as_secs()).unwrap_or(u32::MAX).max(1);
    let config = watcher::Config::default().labels(&selector).timeout(secs);
    let mut events = watcher(api, config).default_backoff().boxed();
    while let Some(event) = events.next().await {
        let news = match event {
            Ok(watcher::Event::Apply(l) | watcher::Event::InitApply(l)) => seen.changed(&l),
            Ok(watcher::Event::Delete(l)) => seen.gone(&l),
            Ok(watcher::Event::Init) => {
                seen.relist_begins();
                News::None
            }
            Ok(watcher::Event::InitDone) => seen.relist_done(),
            Err(e) => {
                if !failing {
                    warn!(
                        "watching the shard Leases in {namespace}: {}; the lease loop looks every retry period meanwhile",
                        crate::apierror::describe_watch(&e)
                    );
                    failing = true;
                }
                continue;
            }
        };
        if failing {
            info!("watching the shard Leases in {namespace} again");
            failing = false;
        }
        let keeper = || own.borrow().held.contains_key(&0);
        if news == News::Everyone || news == News::Keeper && keeper() {
            wake.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use kube::api::ObjectMeta;

    fn lease(holder: &str, annotations: &[(&str, &str)], renewed: i32) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some("gpujob-operator-shard-3".to_owned()),
                annotations: Some(
                    annotations
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                        .collect(),
                ),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.to_owned()),
                lease_transitions: Some(renewed),
                ..LeaseSpec::default()
            }),
        }
    }

    #[test]
    fn a_renewal_or_a_count_is_news_to_nobody_a_namespace_to_the_keeper_a_holder_or_map_to_all() {
        let mut seen = Seen::default();
        let load = |l: &'static str| [(ANNOTATION_VERSION, "1"), (ANNOTATION_LOAD, l)];
        let mut news = |l: Lease| seen.changed(&l);
        assert_eq!(
            news(lease("a", &load("1:3,ff:4"), 1)),
            News::Everyone,
            "new"
        );
        assert_eq!(
            news(lease("a", &load("1:3,ff:4"), 2)),
            News::None,
            "renewed"
        );
        assert_eq!(
            news(lease("a", &load("1:9,ff:5"), 3)),
            News::None,
            "counts moved"
        );
        let more = load("1:9,ff:5,aa:1");
        assert_eq!(news(lease("a", &more, 3)), News::Keeper, "a namespace more");
        assert_eq!(news(lease("", &more, 3)), News::Everyone, "released");
        assert_eq!(news(lease("b", &more, 4)), News::Everyone, "taken");
        let v2 = [
            (ANNOTATION_VERSION, "2"),
            (ANNOTATION_LOAD, "1:9,ff:5,aa:1"),
        ];
        assert_eq!(
            news(lease("b", &v2, 4)),
            News::Everyone,
            "under a newer map"
        );
        let mut seen = Seen::default();
        let l = lease("b", &v2, 4);
        assert_eq!(seen.gone(&l), News::None, "never seen");
        seen.changed(&l);
        assert_eq!(seen.gone(&l), News::Everyone);
        assert_eq!(seen.gone(&l), News::None, "gone once");
    }

    #[test]
    fn a_lease_missing_from_a_new_list_went_while_the_watch_was_down() {
        let mut seen = Seen::default();
        let named = |name: &str| {
            let mut l = lease("a", &[], 1);
            l.metadata.name = Some(name.to_owned());
            l
        };
        let (a, b) = (named("shard-0"), named("shard-1"));
        seen.relist_begins();
        seen.changed(&a);
        seen.changed(&b);
        assert_eq!(seen.relist_done(), News::None, "the first list");
        seen.relist_begins();
        assert_eq!(seen.changed(&a), News::None, "unchanged");
        assert_eq!(seen.relist_done(), News::Everyone, "shard-1 went");
        assert_eq!(seen.gone(&b), News::None, "forgotten");
        assert_eq!(seen.relist_done(), News::None, "no list under way");
    }
}
