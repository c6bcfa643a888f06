//! The kept shard map in the lease loop (`gpujob_core::recut` has the rules): the map
//! Lease as listed, and what a shard Lease claims. The coordinator follows a newer map
//! (giving up only the shards whose range moved), takes a shard only where no live
//! claim reaches, states each held shard's load, and, holding shard 0, keeps the map.

use std::time::{Duration, Instant};

use gpujob_core::recut::{self, ANNOTATION_CUTS, ANNOTATION_VERSION, Rule};
use gpujob_core::shard::{HashRange, ShardMap};
use k8s_openapi::api::coordination::v1::Lease;

/// What the lease loop keeps of the map.
#[derive(Debug)]
pub(super) struct Kept {
    /// The version acted under (0: equal ranges, before any re-cut).
    pub version: u64,
    /// Since when (this replica's clock) it acts under a map it saw change: the keeper
    /// re-cuts no sooner than `interval` after. `None` until the map changes (the first
    /// re-cut waits only for every shard's load).
    pub since: Option<Instant>,
    /// Since when this replica hurries its looks (`hurrying`): set when it wrote a map,
    /// or followed one after its first look (a replica that starts into a map re-cut
    /// long ago follows it on its first look: nothing is being handed over then, and
    /// its first looks must stay a retry period apart, so that replicas started together
    /// see each other before they take shards).
    pub hurry_from: Option<Instant>,
    pub interval: Duration,
    pub rule: Rule,
    /// The version this replica wrote as keeper and when, until every shard is held
    /// under it (for `gpujob_shard_recut_seconds`).
    pub wrote: Option<(u64, Instant)>,
    /// The GpuJobs all shards stated when the load last moved by more than a tenth, and
    /// since when it has not: the keeper re-cuts only by a load steady for [`STEADY`]
    /// (in a burst, loads stated a few seconds apart by different holders would cut
    /// by a picture of no moment).
    pub steady: Option<(u64, Instant)>,
    /// How many namespaces all shards stated when that last changed, and since when:
    /// the first cut (by namespaces) waits until every namespace of a burst is stated.
    pub namespaces: Option<(usize, Instant)>,
}

/// How long the load must stay within a tenth of itself before a re-cut: longer than
/// the runner's count of it (every half second) and a renewal that states it.
pub const STEADY: Duration = Duration::from_secs(10);

/// How long the namespaces stated must stay the same before the first cut: two of the
/// runner's counts (every half second), each stated by a renewal at once when its
/// namespaces change (a namespace's first GpuJob is stated by then; one that comes
/// later, past jitter, is weighed by the next re-cut). Until the first cut, the
/// namespaces named alike sit in one or two shards and the other replicas wait: every
/// moment of this wait is a moment most replicas idle in a burst.
pub const NAMESPACES_SETTLED: Duration = Duration::from_secs(1);

impl Kept {
    pub fn new(interval: Duration) -> Kept {
        Kept {
            version: 0,
            since: None,
            hurry_from: None,
            interval,
            rule: Rule::default(),
            wrote: None,
            steady: None,
            namespaces: None,
        }
    }

    /// Takes in how many namespaces all shards state at `now`: whether that number has
    /// stayed the same for [`NAMESPACES_SETTLED`].
    pub fn namespaces_settled_at(&mut self, namespaces: usize, now: Instant) -> bool {
        match self.namespaces {
            Some((was, since)) if was == namespaces => {
                now.saturating_duration_since(since) >= NAMESPACES_SETTLED
            }
            _ => {
                self.namespaces = Some((namespaces, now));
                false
            }
        }
    }

    /// Takes in the GpuJobs all shards state at `now`: whether that total has stayed
    /// within a tenth of itself for [`STEADY`].
    pub fn steady_at(&mut self, total: u64, now: Instant) -> bool {
        match self.steady {
            Some((was, since)) if total.abs_diff(was) * 10 <= was.max(1) => {
                now.saturating_duration_since(since) >= STEADY
            }
            _ => {
                self.steady = Some((total, now));
                false
            }
        }
    }

    /// This replica acts under `version` from `now`, a map it followed. It hurries its
    /// looks only when `running` (not on its first look, which finds the map as it is).
    pub fn followed(&mut self, version: u64, now: Instant, running: bool) {
        self.version = version;
        self.since = Some(now);
        if running {
            self.hurry_from = Some(now);
        }
    }

    /// This replica, keeping the map, wrote `version` at `now`: it follows it a
    /// hurried look later.
    pub fn wrote_map(&mut self, version: u64, now: Instant) {
        self.wrote = Some((version, now));
        self.since = Some(now);
        self.hurry_from = Some(now);
    }

    /// Whether the map changed (written or followed here) less than `window` ago: its
    /// hand-over is likely under way, and looks come sooner, so that shards released
    /// under it are taken at once and the keeper follows its own write.
    pub fn hurrying(&self, now: Instant, window: Duration) -> bool {
        self.hurry_from
            .is_some_and(|s| now.saturating_duration_since(s) < window)
    }

    /// How long until the namespaces stated, unchanged, have settled for the first cut
    /// (`None`: none is awaited, or they have).
    pub fn first_cut_in(&self, now: Instant) -> Option<Duration> {
        if self.version > 0 || self.wrote.is_some() {
            return None;
        }
        let (namespaces, since) = self.namespaces?;
        let due = since + NAMESPACES_SETTLED;
        (namespaces > 0 && due > now).then(|| due - now)
    }

    /// May the keeper re-cut at `now`, by the interval?
    pub fn due(&self, now: Instant) -> bool {
        self.since
            .is_none_or(|s| now.saturating_duration_since(s) >= self.interval)
    }
}

/// The Lease named `name` among `leases`.
pub(super) fn by_name<'a>(leases: &'a [Lease], name: &str) -> Option<&'a Lease> {
    leases
        .iter()
        .find(|l| l.metadata.name.as_deref() == Some(name))
}

/// The version a Lease states ([`ANNOTATION_VERSION`]); 0 when none.
pub(super) fn version_of(lease: &Lease) -> u64 {
    annotation(lease, ANNOTATION_VERSION)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

pub(super) fn annotation<'a>(lease: &'a Lease, key: &str) -> Option<&'a str> {
    lease
        .metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// The version and map the map Lease states, if it states cuts for `shards` shards (a
/// map of another count belongs to another split: a rollout of `--shards`).
pub(super) fn stated(lease: &Lease, shards: u32) -> Option<(u64, ShardMap)> {
    let cuts = annotation(lease, ANNOTATION_CUTS)?;
    let map = ShardMap::parse(cuts, shards).ok()?;
    Some((version_of(lease), map))
}

/// The range a live shard Lease claims: everything when it states none that parses
/// (Leases of a kept map state one when taken; safety first otherwise).
pub(super) fn claim_of(lease: &Lease) -> HashRange {
    annotation(lease, recut::ANNOTATION_RANGE)
        .and_then(recut::parse_range)
        .unwrap_or(recut::EVERYTHING)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(name: &str, annotations: &[(&str, &str)]) -> Lease {
        let mut l = Lease::default();
        l.metadata.name = Some(name.to_owned());
        l.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        );
        l
    }

    #[test]
    fn the_map_lease_states_a_map_of_its_count_only() {
        let l = lease(
            "op-shard-map",
            &[(ANNOTATION_CUTS, "0x10,0x20"), (ANNOTATION_VERSION, "7")],
        );
        let leases = [lease("op-shard-0", &[]), l.clone()];
        assert!(by_name(&leases, "op-shard-map").is_some());
        let (v, map) = stated(&l, 3).expect("three shards");
        assert_eq!(
            (v, map.cuts_text()),
            (7, "0x0000000000000010,0x0000000000000020".to_owned())
        );
        assert_eq!(stated(&l, 6), None, "another count: another split's");
        assert_eq!(version_of(&leases[0]), 0);
    }

    #[test]
    fn the_first_re_cut_waits_for_nothing_and_later_ones_for_the_interval() {
        let mut k = Kept::new(Duration::from_secs(60));
        let t0 = Instant::now();
        assert!(k.due(t0));
        k.since = Some(t0);
        assert!(!k.due(t0 + Duration::from_secs(59)));
        assert!(k.due(t0 + Duration::from_secs(60)));
    }

    #[test]
    fn looks_hurry_for_a_while_after_a_change_seen_while_running_and_not_before() {
        let mut k = Kept::new(Duration::from_secs(60));
        let t0 = Instant::now();
        let window = Duration::from_secs(15);
        assert!(!k.hurrying(t0, window), "no change seen yet");
        k.followed(3, t0, false);
        assert!(
            !k.hurrying(t0, window),
            "followed on a first look: no hurry"
        );
        assert_eq!((k.version, k.since), (3, Some(t0)));
        k.followed(4, t0, true);
        assert!(k.hurrying(t0 + Duration::from_secs(14), window));
        assert!(!k.hurrying(t0 + Duration::from_secs(15), window));
        let t1 = t0 + Duration::from_secs(60);
        k.wrote_map(5, t1);
        assert!(k.hurrying(t1, window), "the keeper after its write");
        assert_eq!(k.wrote, Some((5, t1)));
    }

    #[test]
    fn the_load_is_steady_once_it_stays_within_a_tenth_for_ten_seconds() {
        let mut k = Kept::new(Duration::from_secs(60));
        let t0 = Instant::now();
        let at = |s| t0 + Duration::from_secs(s);
        assert!(!k.steady_at(1000, at(0)));
        assert!(
            !k.steady_at(1090, at(5)),
            "within a tenth, not for long enough"
        );
        assert!(k.steady_at(1050, at(10)));
        // A burst: it moves by more than a tenth, and the clock starts again.
        assert!(!k.steady_at(1200, at(11)));
        assert!(!k.steady_at(1200, at(20)));
        assert!(k.steady_at(1200, at(21)));
    }

    #[test]
    fn the_namespaces_are_settled_once_their_number_holds_for_a_second() {
        let mut k = Kept::new(Duration::from_secs(60));
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        assert!(!k.namespaces_settled_at(20, at(0)));
        assert!(!k.namespaces_settled_at(26, at(500)), "one more appeared");
        assert!(!k.namespaces_settled_at(26, at(1499)));
        assert!(k.namespaces_settled_at(26, at(1500)));
    }

    #[test]
    fn the_keeper_looks_when_the_namespaces_will_have_settled_and_not_after_a_cut() {
        let mut k = Kept::new(Duration::from_secs(60));
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        assert_eq!(k.first_cut_in(at(0)), None, "nothing stated yet");
        assert!(!k.namespaces_settled_at(0, at(0)));
        assert_eq!(k.first_cut_in(at(0)), None, "no namespace yet");
        assert!(!k.namespaces_settled_at(26, at(1000)));
        assert_eq!(k.first_cut_in(at(1300)), Some(Duration::from_millis(700)));
        assert_eq!(k.first_cut_in(at(2000)), None, "settled: the look cuts");
        k.wrote_map(1, at(2000));
        assert_eq!(k.first_cut_in(at(1500)), None, "cut");
        let mut later = Kept::new(Duration::from_secs(60));
        assert!(!later.namespaces_settled_at(26, at(0)));
        later.followed(2, at(0), true);
        assert_eq!(later.first_cut_in(at(0)), None, "a map was cut before");
    }

    #[test]
    fn a_shard_lease_claims_its_stated_range_or_everything() {
        let r = ShardMap::parse("0x10", 2).unwrap().range(1);
        let stated = lease("s", &[(recut::ANNOTATION_RANGE, &recut::format_range(&r))]);
        assert_eq!(claim_of(&stated), r);
        assert_eq!(claim_of(&lease("s", &[])), recut::EVERYTHING);
    }
}
