//! Moving shard cuts online, model-checked with stateright: replicas act under the
//! version of the shard map they last looked at, give up the shards a newer map moves
//! (drain: they stop writing at once; the release of the Lease lands later), and take
//! free shards with the protocol of `gpujob_core::recut`: list the Leases and take a
//! shard only if [`free_to_take`] says no other live Lease claims any of its range, land
//! the acquire as a compare-and-swap that states the claimed range, then list again and
//! hand the Lease back unused if another live claim overlaps. The real
//! [`free_to_take`], [`moved`], [`overlaps`] and [`ShardMap`] decide. Every interleaving
//! up to a bound is explored, from a start where each replica holds one shard and from
//! one where nobody holds anything, and in each state:
//! - no namespace has two writers: at most one replica has a writing shard whose claim
//!   contains it (draining shards and shards not yet confirmed by the second list do
//!   not write);
//! - once faults stop and the keeper stops, a settling run of the same steps
//!   ([`Recut::settle`]) gives every namespace a writer.
//!
//! What is modelled: the map object and its versions (the keeper bumps it, any time);
//! each shard's Lease (holder, claimed range); each replica's version, held shards
//! (unconfirmed, writing, draining) and one acquire in flight; lists that read the
//! Leases as they are (consistent reads); an acquire that lands if the Lease is not
//! live then (looser than a resourceVersion precondition), and a release that does
//! nothing once the Lease has expired (it too is conditional); a replica that freezes,
//! whose Leases then expire one by one (by then it writes nothing: its renew deadline is
//! shorter than the lease duration) while what it sent may still land, and that wakes
//! with what it still holds or comes back holding nothing under any map version up to
//! the current one. A replica takes any free shard (the balance rule is not modelled).
//!
//! What is left out: time, renewals and the renew deadline itself (expiry is a step,
//! and only a frozen replica's Leases expire); loads and the rule for when to re-cut
//! (the cuts of each version are fixed up front); writes in flight past a drain
//! (draining stops writing at once); a look at the map during an acquire (a replica's
//! look, list, acquire and second list are one pass of its loop; other replicas
//! interleave with each step of it); several acquires in one pass; the single Lease and
//! other splits; the GpuJobs themselves (a namespace is one hash). Liveness is one
//! settling run in a fixed order, so two replicas that hand back to each other again
//! and again are not looked for.

use std::collections::BTreeSet;

use gpujob_core::recut::{free_to_take, moved, overlaps};
use gpujob_core::shard::{HashRange, ShardMap};
use stateright::{Checker, HasDiscoveries, Model, Property};

/// How far the checker goes in the test command: stateright counts the first state as
/// depth 1 and does not check the states at the target depth, so 30 checks every state
/// up to 28 steps from a start. That is every state there is with two shards or two
/// replicas (the versions and faults are bounded: the longest paths are 17 to 24 steps).
/// `GPUJOB_MODEL_DEPTH` sets another bound for every model.
const DEPTH: usize = 30;
/// The bound for three shards and three replicas: every state up to 8 steps from a
/// start.
const WIDE_DEPTH: usize = 10;

/// The safety property.
const ONE_WRITER: &str = "no namespace is written by two replicas";
/// Liveness, checked as a safety property of each state ([`Recut::settle`]).
const COVERED: &str = "every namespace has a writer once faults and the keeper stop";

fn depth_or(default: usize) -> usize {
    std::env::var("GPUJOB_MODEL_DEPTH")
        .ok()
        .and_then(|d| d.parse().ok())
        .unwrap_or(default)
}

fn depth() -> usize {
    depth_or(DEPTH)
}

/// Where a held shard is in its term.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
enum Term {
    /// Acquired, the second list not made yet: writes nothing.
    Unconfirmed,
    /// May write the namespaces of its claim.
    Writing,
    /// Given up (a newer map moved it, or the second list handed it back): writes
    /// nothing; its Lease is held with the old claim until the release lands.
    Draining,
}

/// A shard a replica holds: where it is in its term, and the map version whose range
/// its Lease claims (the range is that map's range of the shard).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
struct Held {
    term: Term,
    claim: usize,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct Replica {
    /// The map version it acts under (it learns a newer one only when it looks).
    version: usize,
    /// By shard.
    held: Vec<Option<Held>>,
    /// An acquire decided on and sent, not landed yet: the shard and the version whose
    /// range it claims.
    taking: Option<(u32, usize)>,
    /// Frozen or crashed: takes no step (what it sent may still land).
    frozen: bool,
}

/// A shard Lease, as the API server has it: live while a holder has it (expiry is a
/// step), with the map version whose range of the shard its holder claimed.
type Lease = Option<(usize, usize)>;

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct State {
    /// The map object's current version.
    version: usize,
    /// By shard.
    leases: Vec<Lease>,
    replicas: Vec<Replica>,
    freezes: u8,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
enum Step {
    /// The keeper writes the next version of the map.
    Keeper,
    /// Replica `r` reads the map and adopts a newer version: the shards it moves are
    /// drained at once.
    Look { r: usize },
    /// The release of replica `r`'s draining shard lands.
    Release { r: usize, shard: u32 },
    /// Replica `r` lists the Leases and decides to take `shard` (free, and free to take
    /// under its version).
    Decide { r: usize, shard: u32 },
    /// Replica `r`'s acquire lands: a compare-and-swap on the Lease not being live.
    Land { r: usize },
    /// Replica `r` lists the Leases again for its unconfirmed shard: writes, or hands
    /// the Lease back.
    Confirm { r: usize },
    /// Replica `r` freezes (or crashes).
    Freeze { r: usize },
    /// A frozen replica's Lease of `shard` expires.
    Expire { shard: u32 },
    /// A frozen replica wakes before its renew deadlines pass: it goes on with what it
    /// still holds (the Leases that expired meanwhile it knows it lost).
    Wake { r: usize },
    /// A frozen replica whose Leases all expired comes back, holding nothing, acting
    /// under map `version` (any up to the current one: what its first read saw).
    Restart { r: usize, version: usize },
}

/// A rule of the protocol left out, to show the checker finds what it prevents.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Broken {
    /// The shard writes as soon as its acquire lands (no second list).
    NoSecondList,
    /// The acquire lands whether or not the Lease is live (no compare-and-swap).
    NoCompareAndSwap,
    /// A shard a newer map moves is not drained: its holder restates its Lease's claim
    /// as the new range and keeps writing.
    ClaimInPlace,
    /// The replica's own draining Leases are not claims (in either list).
    OwnDrainsIgnored,
    /// A shard is taken whenever its Lease is not live ([`free_to_take`] not asked; the
    /// second list still is).
    NoFirstCheck,
    /// The replica may look at the map in the middle of an acquire: a moved shard not
    /// yet confirmed drains like a writing one, but the acquire in flight lands with
    /// the range of the version it was decided under.
    LookMidPass,
}

#[derive(Clone)]
struct Recut {
    /// The versions of the map, in order.
    maps: Vec<ShardMap>,
    /// The namespaces, as their hashes.
    namespaces: Vec<u64>,
    replicas: usize,
    max_freezes: u8,
    broken: Option<Broken>,
}

impl Recut {
    /// Two shards over hashes 1..=6, cut at 4, then 2, then 5: the cut moves down, then
    /// up past where it began, so each shard both shrinks and grows.
    fn two_shards(replicas: usize) -> Recut {
        Recut {
            maps: maps(&[&[4], &[2], &[5]]),
            namespaces: (1..=6).collect(),
            replicas,
            max_freezes: 1,
            broken: None,
        }
    }

    /// Three shards over hashes 1..=6: from v0 to v1 shard 2 keeps its range, from v0
    /// to v2 shard 0 does (a replica that skips v1 keeps it), from v1 to v2 every shard
    /// moves.
    fn three_shards(replicas: usize) -> Recut {
        Recut {
            maps: maps(&[&[3, 5], &[2, 5], &[3, 4]]),
            ..Recut::two_shards(replicas)
        }
    }

    fn broken(self, broken: Broken) -> Recut {
        Recut {
            broken: Some(broken),
            ..self
        }
    }

    fn shards(&self) -> u32 {
        self.maps[0].shards()
    }

    fn range(&self, version: usize, shard: u32) -> HashRange {
        self.maps[version].range(shard)
    }

    /// What the live Leases of shards other than `shard` claim, as a list of the Leases
    /// shows them to replica `r`.
    fn claims(&self, s: &State, r: usize, shard: u32) -> Vec<HashRange> {
        let own_drain = |other: u32, holder: usize| {
            holder == r
                && s.replicas[r].held[other as usize].is_some_and(|h| h.term == Term::Draining)
        };
        (0..self.shards())
            .filter(|other| *other != shard)
            .filter_map(|other| {
                let (holder, claim) = s.leases[other as usize]?;
                let ignored =
                    self.broken == Some(Broken::OwnDrainsIgnored) && own_drain(other, holder);
                (!ignored).then(|| self.range(claim, other))
            })
            .collect()
    }

    /// Which replicas write namespace `hash`.
    fn writers(&self, s: &State, hash: u64) -> BTreeSet<usize> {
        s.replicas
            .iter()
            .enumerate()
            .filter(|(_, rep)| {
                rep.held.iter().enumerate().any(|(shard, h)| {
                    h.is_some_and(|h| {
                        h.term == Term::Writing && self.range(h.claim, shard as u32).contains(hash)
                    })
                })
            })
            .map(|(r, _)| r)
            .collect()
    }

    /// The state `step` leads to from `last`, `None` where it cannot be taken.
    fn step(&self, last: &State, step: &Step) -> Option<State> {
        let mut s = last.clone();
        self.apply(&mut s, step)?;
        Some(s)
    }

    /// Takes `step` in `s`; `None`, and `s` as it was, where it cannot be taken.
    fn apply(&self, s: &mut State, step: &Step) -> Option<()> {
        match *step {
            Step::Keeper => {
                if s.version + 1 >= self.maps.len() {
                    return None;
                }
                s.version += 1;
            }
            Step::Look { r } => {
                let rep = &s.replicas[r];
                let mid_pass = busy(rep) && self.broken != Some(Broken::LookMidPass);
                if rep.frozen || rep.version >= s.version || mid_pass {
                    return None;
                }
                let now = s.version;
                let gone = moved(&self.maps[rep.version], &self.maps[now]);
                for shard in gone {
                    let Some(held) = &mut s.replicas[r].held[shard as usize] else {
                        continue;
                    };
                    if held.term == Term::Draining {
                        continue;
                    }
                    if self.broken == Some(Broken::ClaimInPlace) {
                        held.claim = now;
                        let lease = &mut s.leases[shard as usize];
                        if lease.is_some_and(|(holder, _)| holder == r) {
                            *lease = Some((r, now));
                        }
                    } else {
                        held.term = Term::Draining;
                    }
                }
                s.replicas[r].version = now;
            }
            Step::Release { r, shard } => {
                let held = &mut s.replicas[r].held[shard as usize];
                if held.is_none_or(|h| h.term != Term::Draining) {
                    return None;
                }
                *held = None;
                let lease = &mut s.leases[shard as usize];
                if lease.is_some_and(|(holder, _)| holder == r) {
                    *lease = None;
                }
            }
            Step::Decide { r, shard } => {
                let rep = &s.replicas[r];
                if rep.frozen
                    || busy(rep)
                    || rep.held[shard as usize].is_some()
                    || s.leases[shard as usize].is_some()
                {
                    return None;
                }
                let free = self.broken == Some(Broken::NoFirstCheck)
                    || free_to_take(&self.range(rep.version, shard), &self.claims(s, r, shard));
                if !free {
                    return None;
                }
                s.replicas[r].taking = Some((shard, rep.version));
            }
            Step::Land { r } => {
                let (shard, claim) = s.replicas[r].taking.take()?;
                let lease = &mut s.leases[shard as usize];
                if lease.is_none() || self.broken == Some(Broken::NoCompareAndSwap) {
                    *lease = Some((r, claim));
                    let term = if self.broken == Some(Broken::NoSecondList) {
                        Term::Writing
                    } else {
                        Term::Unconfirmed
                    };
                    s.replicas[r].held[shard as usize] = Some(Held { term, claim });
                }
            }
            Step::Confirm { r } => {
                let rep = &s.replicas[r];
                if rep.frozen {
                    return None;
                }
                let (shard, claim) = rep.held.iter().enumerate().find_map(|(shard, h)| {
                    h.filter(|h| h.term == Term::Unconfirmed)
                        .map(|h| (shard as u32, h.claim))
                })?;
                let range = self.range(claim, shard);
                let clash = self.claims(s, r, shard).iter().any(|c| overlaps(&range, c));
                let term = if clash { Term::Draining } else { Term::Writing };
                s.replicas[r].held[shard as usize] = Some(Held { term, claim });
            }
            Step::Freeze { r } => {
                if s.replicas[r].frozen || s.freezes >= self.max_freezes {
                    return None;
                }
                s.replicas[r].frozen = true;
                s.freezes += 1;
            }
            Step::Expire { shard } => {
                let (holder, _) = s.leases[shard as usize]?;
                if !s.replicas[holder].frozen {
                    return None;
                }
                s.leases[shard as usize] = None;
                s.replicas[holder].held[shard as usize] = None;
            }
            Step::Wake { r } => {
                if !s.replicas[r].frozen {
                    return None;
                }
                s.replicas[r].frozen = false;
            }
            Step::Restart { r, version } => {
                let rep = &mut s.replicas[r];
                let idle = rep.taking.is_none() && rep.held.iter().all(Option::is_none);
                if !rep.frozen || !idle || version > s.version {
                    return None;
                }
                rep.frozen = false;
                rep.version = version;
            }
        }
        Some(())
    }

    /// Takes `steps` in `s` in order, each skipped where it cannot be taken.
    fn run(&self, s: &mut State, steps: impl IntoIterator<Item = Step>) {
        for step in steps {
            let _ = self.apply(s, &step);
        }
    }

    /// From `last`, once faults and the keeper stop: what is in flight lands and every
    /// live replica makes its second list, drained Leases are released, frozen
    /// replicas' Leases expire, every live replica looks at the map (and releases what
    /// it moves), then each live replica in turn takes each free shard it may, one whole
    /// acquire at a time (a Lease handed back is released).
    fn settle(&self, last: &State) -> State {
        let replicas = 0..self.replicas;
        let shards = 0..self.shards();
        let releases = |s: &State| {
            let mut steps = Vec::new();
            for (r, rep) in s.replicas.iter().enumerate() {
                for (shard, h) in rep.held.iter().enumerate() {
                    if h.is_some_and(|h| h.term == Term::Draining) {
                        let shard = shard as u32;
                        steps.push(Step::Release { r, shard });
                    }
                }
            }
            steps
        };
        let mut s = last.clone();
        self.run(&mut s, replicas.clone().map(|r| Step::Land { r }));
        self.run(&mut s, replicas.clone().map(|r| Step::Confirm { r }));
        let drained = releases(&s);
        self.run(&mut s, drained);
        self.run(&mut s, shards.clone().map(|shard| Step::Expire { shard }));
        self.run(&mut s, replicas.clone().map(|r| Step::Look { r }));
        let drained = releases(&s);
        self.run(&mut s, drained);
        for r in replicas {
            for shard in shards.clone() {
                let steps = [
                    Step::Decide { r, shard },
                    Step::Land { r },
                    Step::Confirm { r },
                ];
                self.run(&mut s, steps);
                let drained = releases(&s);
                self.run(&mut s, drained);
            }
        }
        s
    }

    fn covered(&self, s: &State) -> bool {
        self.namespaces
            .iter()
            .all(|h| !self.writers(s, *h).is_empty())
    }

    /// The maps have a shard that keeps its range from one version to a later one.
    fn some_shard_kept(&self) -> bool {
        (0..self.maps.len()).any(|v| {
            (v + 1..self.maps.len())
                .any(|w| moved(&self.maps[v], &self.maps[w]).len() < self.shards() as usize)
        })
    }
}

/// A replica with an acquire in flight or a shard its second list has not confirmed:
/// in the middle of a pass of its lease loop.
fn busy(rep: &Replica) -> bool {
    rep.taking.is_some()
        || rep
            .held
            .iter()
            .any(|h| h.is_some_and(|h| h.term == Term::Unconfirmed))
}

fn maps(cuts: &[&[u64]]) -> Vec<ShardMap> {
    cuts.iter()
        .map(|c| ShardMap::with_cuts(c).expect("cuts in order"))
        .collect()
}

impl Model for Recut {
    type State = State;
    type Action = Step;

    /// Version 0, every replica at it: replica i holds shard i and writes; or nobody
    /// holds anything.
    fn init_states(&self) -> Vec<State> {
        let shards = self.shards() as usize;
        let fresh = State {
            version: 0,
            leases: vec![None; shards],
            replicas: vec![
                Replica {
                    version: 0,
                    held: vec![None; shards],
                    taking: None,
                    frozen: false,
                };
                self.replicas
            ],
            freezes: 0,
        };
        let mut steady = fresh.clone();
        for (r, rep) in steady.replicas.iter_mut().enumerate().take(shards) {
            let held = Held {
                term: Term::Writing,
                claim: 0,
            };
            rep.held[r] = Some(held);
            steady.leases[r] = Some((r, 0));
        }
        vec![steady, fresh]
    }

    /// Every step that may be taken; [`Recut::step`] has the last word (what it refuses
    /// leads nowhere), this only leaves out what plainly cannot be taken.
    fn actions(&self, s: &State, steps: &mut Vec<Step>) {
        steps.push(Step::Keeper);
        for (r, rep) in s.replicas.iter().enumerate() {
            if rep.frozen {
                steps.push(Step::Wake { r });
                steps.extend((0..=s.version).map(|version| Step::Restart { r, version }));
            } else {
                steps.push(Step::Look { r });
                steps.push(Step::Confirm { r });
                steps.push(Step::Freeze { r });
            }
            if rep.taking.is_some() {
                steps.push(Step::Land { r });
            }
            for shard in 0..self.shards() {
                match rep.held[shard as usize] {
                    Some(_) => steps.push(Step::Release { r, shard }),
                    None => steps.push(Step::Decide { r, shard }),
                }
            }
        }
        steps.extend((0..self.shards()).map(|shard| Step::Expire { shard }));
    }

    fn next_state(&self, last: &State, step: Step) -> Option<State> {
        self.step(last, &step)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(ONE_WRITER, |m: &Recut, s: &State| {
                m.namespaces.iter().all(|h| m.writers(s, *h).len() <= 1)
            }),
            Property::always(COVERED, |m: &Recut, s: &State| m.covered(&m.settle(s))),
            // A Lease names the replica that holds it as holding it (compare-and-swap).
            Property::always("a Lease's holder holds it", |m: &Recut, s: &State| {
                m.broken == Some(Broken::NoCompareAndSwap)
                    || s.leases.iter().enumerate().all(|(shard, lease)| {
                        lease.is_none_or(|(holder, claim)| {
                            s.replicas[holder].held[shard].is_some_and(|h| h.claim == claim)
                        })
                    })
            }),
            // Not vacuous: a namespace is written under a moved cut by another shard
            // than at the start.
            Property::sometimes(
                "a cut moved and a namespace changed shard",
                |m: &Recut, s: &State| {
                    m.namespaces.iter().any(|h| {
                        let first = m.maps[0].shard_of_hash(*h);
                        s.replicas.iter().any(|rep| {
                            rep.held.iter().enumerate().any(|(shard, held)| {
                                held.is_some_and(|held| {
                                    held.term == Term::Writing
                                        && shard as u32 != first
                                        && m.range(held.claim, shard as u32).contains(*h)
                                })
                            })
                        })
                    })
                },
            ),
            // Not vacuous: a second list hands a Lease back. (A shard drained by a
            // look claims an older version than its holder's; one handed back claims
            // its holder's, the acquire having been decided under it.)
            Property::sometimes(
                "a replica hands a Lease back after its second list",
                |_, s: &State| {
                    s.replicas.iter().any(|rep| {
                        rep.held.iter().any(|h| {
                            h.is_some_and(|h| h.term == Term::Draining && h.claim == rep.version)
                        })
                    })
                },
            ),
            // Not vacuous: the others write every namespace while a replica is frozen
            // (with two replicas from the start where each holds a shard, this takes
            // over the frozen one's shard).
            Property::sometimes(
                "every namespace is written while a frozen replica holds nothing",
                |m: &Recut, s: &State| {
                    let gone = s
                        .replicas
                        .iter()
                        .any(|rep| rep.frozen && rep.held.iter().all(Option::is_none));
                    gone && m.covered(s)
                },
            ),
            // Not vacuous where the maps keep a shard's range: its holder looks at the
            // newer map and goes on writing it.
            Property::sometimes(
                "a shard a new map keeps goes on writing",
                |m: &Recut, s: &State| {
                    !m.some_shard_kept()
                        || s.replicas.iter().any(|rep| {
                            rep.held.iter().any(|h| {
                                h.is_some_and(|h| h.term == Term::Writing && h.claim < rep.version)
                            })
                        })
                },
            ),
        ]
    }
}

fn check(model: Recut, depth: usize) -> impl Checker<Recut> {
    let checker = model.checker().target_max_depth(depth).spawn_bfs().join();
    eprintln!(
        "model: {} states ({} unique), depth {}{}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        if checker.max_depth() < depth {
            ": every state"
        } else {
            ""
        }
    );
    checker
}

/// The shortest counterexample to `property` the checker finds, as its steps; panics
/// when there is none within `depth`. The checker keeps the last counterexample it
/// finds, not the first, so the bound goes up one step at a time.
fn counterexample(model: Recut, property: &'static str, depth: usize) -> Vec<Step> {
    for d in 2..=depth {
        let checker = model
            .clone()
            .checker()
            .target_max_depth(d)
            .finish_when(HasDiscoveries::AnyOf([property].into()))
            .spawn_bfs()
            .join();
        if let Some(path) = checker.discovery(property) {
            let steps = path.into_actions();
            eprintln!("counterexample, {} steps: {steps:?}", steps.len());
            return steps;
        }
    }
    panic!("the checker found no counterexample to {property:?}")
}

#[test]
fn two_shards_two_replicas_never_write_a_namespace_twice_and_settle() {
    check(Recut::two_shards(2), depth()).assert_properties();
}

#[test]
fn two_shards_three_replicas_never_write_a_namespace_twice_and_settle() {
    check(Recut::two_shards(3), depth()).assert_properties();
}

#[test]
fn three_shards_never_write_a_namespace_twice_and_settle() {
    check(Recut::three_shards(2), depth()).assert_properties();
}

/// Three shards, three replicas, two of which may freeze: too many states to explore
/// them all in the test command, so up to [`WIDE_DEPTH`]. `GPUJOB_MODEL_DEPTH=40`
/// explores all 6.1 million (the longest path is 31 steps; under five minutes).
#[test]
fn three_shards_three_replicas_two_faults_never_write_a_namespace_twice_and_settle() {
    let model = Recut {
        max_freezes: 2,
        ..Recut::three_shards(3)
    };
    check(model, depth_or(WIDE_DEPTH)).assert_properties();
}

/// Without the second list, two replicas that decide under different maps at once
/// both write the namespaces their ranges share.
#[test]
fn without_the_second_list_the_checker_finds_two_writers() {
    let model = Recut::two_shards(2).broken(Broken::NoSecondList);
    counterexample(model, ONE_WRITER, depth());
}

/// Without the compare-and-swap, two acquires of one shard both land and both second
/// lists pass (the other holder's Lease is the shard's own, not another's).
#[test]
fn without_the_compare_and_swap_the_checker_finds_two_writers() {
    let model = Recut::two_shards(2).broken(Broken::NoCompareAndSwap);
    counterexample(model, ONE_WRITER, depth());
}

/// A moved shard's claim restated in place instead of drained and taken again: it grows
/// into a range another replica, behind on the map, still writes.
#[test]
fn with_claims_moved_in_place_the_checker_finds_two_writers() {
    let model = Recut::two_shards(2).broken(Broken::ClaimInPlace);
    counterexample(model, ONE_WRITER, depth());
}

/// A look in the middle of an acquire: the shard lands and is confirmed with the range
/// of the map it was decided under, while its holder acts under the newer one and no
/// later look moves it. Nobody writes twice, but the stale claim keeps the shards of
/// the new map that overlap it from being taken: the checker finds a state that does not
/// settle.
#[test]
fn with_a_look_in_the_middle_of_an_acquire_the_checker_finds_namespaces_left_unwritten() {
    let model = Recut::two_shards(2).broken(Broken::LookMidPass);
    counterexample(model, COVERED, depth());
}

/// Rules the no-two-writers property does not rest on: with either left out the checker
/// finds no two writers (and everything settles). The second list alone keeps writers
/// apart; the check before the acquire saves acquires that would be handed back, and a
/// draining Lease writes nothing.
#[test]
fn without_the_first_check_or_own_drains_as_claims_nobody_writes_twice() {
    for broken in [Broken::NoFirstCheck, Broken::OwnDrainsIgnored] {
        for model in [Recut::two_shards(3), Recut::three_shards(2)] {
            check(model.broken(broken), depth()).assert_properties();
        }
    }
}
