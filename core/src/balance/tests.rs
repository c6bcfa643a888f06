use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::*;

const LEASE: Duration = Duration::from_secs(3);

fn members(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|n| (*n).to_owned()).collect()
}

fn held(by: &str) -> Holder {
    Holder::Held(by.to_owned())
}

fn decide_for(me: &str, members: &BTreeSet<String>, holders: &[Holder]) -> Decision {
    decide(&View {
        me,
        members,
        holders,
        lease_duration: LEASE,
    })
}

/// Applies every member's decision to `holders` as one round of Lease writes would:
/// releases first, then takes, each of which succeeds only on a free shard.
fn round(members: &BTreeSet<String>, holders: &mut [Holder]) -> usize {
    let decisions: Vec<(String, Decision)> = members
        .iter()
        .map(|m| (m.clone(), decide_for(m, members, holders)))
        .collect();
    let mut moves = 0;
    for (_, d) in &decisions {
        for s in &d.release {
            holders[*s as usize] = Holder::Free(Duration::ZERO);
        }
    }
    for (m, d) in &decisions {
        for s in &d.take {
            if matches!(holders[*s as usize], Holder::Free(_)) {
                holders[*s as usize] = held(m);
                moves += 1;
            }
        }
    }
    moves
}

fn loads(holders: &[Holder]) -> BTreeMap<String, usize> {
    let mut l = BTreeMap::new();
    for h in holders {
        if let Holder::Held(m) = h {
            *l.entry(m.clone()).or_insert(0) += 1;
        }
    }
    l
}

#[test]
fn the_share_is_the_ceiling() {
    assert_eq!(share(6, 3), 2);
    assert_eq!(share(8, 3), 3);
    assert_eq!(share(8, 4), 2);
    assert_eq!(share(1, 3), 1);
    assert_eq!(share(4, 0), 4, "alone counts as one");
}

#[test]
fn weights_are_stable_and_spread() {
    assert_eq!(weight("replica-1", 0), weight("replica-1", 0));
    assert_ne!(weight("replica-1", 0), weight("replica-1", 1));
    assert_ne!(weight("replica-1", 0), weight("replica-2", 0));
    // Over many shards each of three replicas is top-ranked for about a third.
    let m = ["replica-1", "replica-2", "replica-3"];
    let mut top = BTreeMap::new();
    for s in 0..3000 {
        let best = m.iter().max_by_key(|r| weight(r, s)).unwrap();
        *top.entry(*best).or_insert(0) += 1;
    }
    assert!(top.values().all(|n| (800..1200).contains(n)), "{top:?}");
}

#[test]
fn three_replicas_split_six_free_shards_two_each_in_one_round() {
    let m = members(&["a", "b", "c"]);
    let mut holders = vec![Holder::Free(Duration::ZERO); 6];
    let taken: Vec<Decision> = m.iter().map(|me| decide_for(me, &m, &holders)).collect();
    let all: BTreeSet<u32> = taken.iter().flat_map(|d| d.take.clone()).collect();
    assert_eq!(all.len(), 6);
    assert!(taken.iter().all(|d| d.take.len() == 2), "{taken:?}");
    round(&m, &mut holders);
    assert!(loads(&holders).values().all(|l| *l == 2));
    assert_eq!(round(&m, &mut holders), 0, "balanced: nothing moves");
}

#[test]
fn a_replica_over_its_share_releases_the_shards_it_ranks_lowest() {
    let m = members(&["a", "b", "c"]);
    let holders = vec![
        held("a"),
        held("a"),
        held("a"),
        held("a"),
        held("b"),
        held("c"),
    ];
    let d = decide_for("a", &m, &holders);
    assert_eq!(d.release.len(), 2);
    let mut mine = [0u32, 1, 2, 3];
    mine.sort_by_key(|s| weight("a", *s));
    assert_eq!(d.release, mine[..2].iter().copied().collect());
    assert!(d.take.is_empty());
}

#[test]
fn a_fourth_replica_moves_only_what_balance_requires() {
    // 8 shards over 3 replicas (3, 3, 2), then a fourth joins: two moves, 2 each.
    let three = members(&["a", "b", "c"]);
    let mut holders = vec![Holder::Free(Duration::ZERO); 8];
    while round(&three, &mut holders) > 0 {}
    let mut before = loads(&holders).into_values().collect::<Vec<_>>();
    before.sort();
    assert_eq!(before, vec![2, 3, 3]);
    let four = members(&["a", "b", "c", "d"]);
    let mut moves = 0;
    for _ in 0..4 {
        moves += round(&four, &mut holders);
    }
    assert!(loads(&holders).values().all(|l| *l == 2), "{holders:?}");
    assert_eq!(moves, 2, "only the two surplus shards move");
}

#[test]
fn a_dead_replicas_shards_are_split_among_the_survivors_at_once() {
    let three = members(&["a", "b", "c"]);
    let mut holders = vec![Holder::Free(Duration::ZERO); 6];
    round(&three, &mut holders);
    // c is gone and its leases expired.
    let two = members(&["a", "b"]);
    for h in holders.iter_mut() {
        if *h == held("c") {
            *h = Holder::Free(Duration::ZERO);
        }
    }
    let moves = round(&two, &mut holders);
    assert_eq!(moves, 2, "both taken in the same round");
    assert!(loads(&holders).values().all(|l| *l == 3));
    // c comes back: one shard from each survivor, no more.
    let mut moves = 0;
    for _ in 0..4 {
        moves += round(&three, &mut holders);
    }
    assert!(loads(&holders).values().all(|l| *l == 2), "{holders:?}");
    assert_eq!(moves, 2);
}

#[test]
fn a_shard_free_for_a_lease_duration_is_taken_by_anyone() {
    // b is at its share (1 of 2 shards, 2 replicas): shard 0 is a's to take. If a does
    // not (its view may differ, or it is gone without its membership having expired),
    // b takes it once it has been free for a lease duration.
    let m = members(&["a", "b"]);
    let holders = vec![Holder::Free(Duration::ZERO), held("b")];
    assert!(decide_for("a", &m, &holders).take.contains(&0));
    assert!(decide_for("b", &m, &holders).take.is_empty());
    let holders = vec![Holder::Free(LEASE), held("b")];
    assert!(decide_for("b", &m, &holders).take.contains(&0));
}

mod properties {
    //! Any sequence of joins, graceful leaves and kills, simulated with Lease semantics
    //! (a take succeeds only on a free shard; a killed replica's shards and membership
    //! expire after a lease duration): once membership stops changing, every shard has
    //! exactly one live holder and none holds more than its share.

    use super::*;
    use proptest::prelude::*;

    const LEASE_TICKS: u64 = 3;

    #[derive(Debug, Clone)]
    enum Op {
        Join(u8),
        Leave(u8),
        Kill(u8),
        Wait(u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u8..6).prop_map(Op::Join),
            (0u8..6).prop_map(Op::Leave),
            (0u8..6).prop_map(Op::Kill),
            (1u8..5).prop_map(Op::Wait),
        ]
    }

    #[derive(Default)]
    struct Sim {
        tick: u64,
        alive: BTreeSet<String>,
        /// Killed replicas, and when: still live to others for a lease duration.
        killed: BTreeMap<String, u64>,
        /// Holder and its last renewal, per shard; `None`: free since the tick given.
        shards: Vec<Result<(String, u64), u64>>,
    }

    impl Sim {
        fn new(n: usize) -> Sim {
            Sim {
                shards: vec![Err(0); n],
                ..Sim::default()
            }
        }

        fn view_members(&self) -> BTreeSet<String> {
            let mut m = self.alive.clone();
            for (k, at) in &self.killed {
                if self.tick < at + LEASE_TICKS {
                    m.insert(k.clone());
                }
            }
            m
        }

        fn holders(&self) -> Vec<Holder> {
            let lease = |t: u64| Duration::from_secs(t);
            self.shards
                .iter()
                .map(|s| match s {
                    Ok((m, renewed)) if self.tick < renewed + LEASE_TICKS => {
                        Holder::Held(m.clone())
                    }
                    Ok((_, renewed)) => Holder::Free(lease(self.tick - (renewed + LEASE_TICKS))),
                    Err(since) => Holder::Free(lease(self.tick - since)),
                })
                .collect()
        }

        fn step(&mut self) {
            self.tick += 1;
            let members = self.view_members();
            for shard in self.shards.iter_mut() {
                if let Ok((m, renewed)) = shard
                    && self.alive.contains(m.as_str())
                {
                    *renewed = self.tick;
                }
            }
            let order: Vec<String> = self.alive.iter().cloned().collect();
            for me in order {
                let holders = self.holders();
                let d = decide(&View {
                    me: &me,
                    members: &members,
                    holders: &holders,
                    lease_duration: Duration::from_secs(LEASE_TICKS),
                });
                for s in d.release {
                    self.shards[s as usize] = Err(self.tick);
                }
                let holders = self.holders();
                for s in d.take {
                    if matches!(holders[s as usize], Holder::Free(_)) {
                        self.shards[s as usize] = Ok((me.clone(), self.tick));
                    }
                }
            }
        }

        fn apply(&mut self, op: &Op) {
            match op {
                Op::Join(n) => {
                    let m = format!("replica-{n}");
                    self.killed.remove(&m);
                    self.alive.insert(m);
                }
                Op::Leave(n) => {
                    let m = format!("replica-{n}");
                    if self.alive.remove(&m) {
                        for s in self.shards.iter_mut() {
                            if matches!(s, Ok((h, _)) if *h == m) {
                                *s = Err(self.tick);
                            }
                        }
                    }
                }
                Op::Kill(n) => {
                    let m = format!("replica-{n}");
                    if self.alive.remove(&m) {
                        self.killed.insert(m, self.tick);
                    }
                }
                Op::Wait(t) => {
                    for _ in 0..*t {
                        self.step();
                    }
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        #[test]
        fn every_shard_ends_with_one_live_holder_within_its_share(
            shards in 1usize..12,
            ops in proptest::collection::vec(op(), 0..40),
        ) {
            let mut sim = Sim::new(shards);
            sim.apply(&Op::Join(0));
            for op in &ops {
                sim.apply(op);
            }
            if sim.alive.is_empty() {
                sim.apply(&Op::Join(0));
            }
            for _ in 0..(4 * LEASE_TICKS + 4) {
                sim.step();
            }
            let cap = share(shards, sim.alive.len());
            let holders = sim.holders();
            for (s, h) in holders.iter().enumerate() {
                match h {
                    Holder::Held(m) => prop_assert!(sim.alive.contains(m), "shard {s} held by {m}, not alive"),
                    Holder::Free(_) => prop_assert!(false, "shard {s} unowned: {holders:?}"),
                }
            }
            for (m, l) in loads(&holders) {
                prop_assert!(l <= cap, "{m} holds {l} > share {cap}: {holders:?}");
            }
        }
    }
}

fn successor_for(me: &str, members: &BTreeSet<String>, holders: &[Holder]) -> BTreeSet<u32> {
    successor_of(&View {
        me,
        members,
        holders,
        lease_duration: LEASE,
    })
}

#[test]
fn each_held_shard_has_one_warm_successor_and_it_takes_the_shard_when_its_holder_goes() {
    for (names, shards) in [
        (&["a", "b", "c"][..], 6usize),
        (&["a", "b", "c", "d", "e"][..], 10),
        (&["a", "b"][..], 4),
        (&["a", "b", "c"][..], 8),
    ] {
        let all = members(names);
        let mut holders = vec![Holder::Free(Duration::ZERO); shards];
        while round(&all, &mut holders) > 0 {}
        let warm: BTreeMap<&str, BTreeSet<u32>> = names
            .iter()
            .map(|m| (*m, successor_for(m, &all, &holders)))
            .collect();
        for (s, h) in holders.iter().enumerate() {
            let s = u32::try_from(s).unwrap();
            let Holder::Held(holder) = h else {
                panic!("shard {s} not held")
            };
            // Nobody keeps its own shard warm, and exactly one other replica does.
            assert!(!warm[holder.as_str()].contains(&s));
            let keepers: Vec<&str> = names
                .iter()
                .copied()
                .filter(|m| warm[m].contains(&s))
                .collect();
            assert_eq!(
                keepers.len(),
                1,
                "shard {s} of {shards}, {names:?}: {keepers:?}"
            );
        }
        // Each holder gone in turn: the survivors take its shards, each exactly by the
        // replica that kept it warm.
        for gone in names {
            let left: BTreeSet<String> = all.iter().filter(|m| m != gone).cloned().collect();
            let mut after: Vec<Holder> = holders
                .iter()
                .map(|h| match h {
                    Holder::Held(m) if m == gone => Holder::Free(Duration::ZERO),
                    other => other.clone(),
                })
                .collect();
            while round(&left, &mut after) > 0 {}
            for (s, h) in holders.iter().enumerate() {
                if matches!(h, Holder::Held(m) if m == gone) {
                    let Holder::Held(taker) = &after[s] else {
                        panic!("shard {s} left free")
                    };
                    assert!(
                        warm[taker.as_str()].contains(&u32::try_from(s).unwrap()),
                        "{gone} gone: shard {s} went to {taker}, who did not keep it warm"
                    );
                }
            }
        }
    }
}

#[test]
fn the_shards_of_a_replica_no_longer_live_stay_warm_with_the_replica_that_will_take_them() {
    // c has gone (its heartbeat expired, or its Leases, or both) while its shards are
    // not yet taken: the warm sets must keep them with their taker all along, or the
    // takeover would list them again.
    let all = members(&["a", "b", "c"]);
    let mut holders = vec![Holder::Free(Duration::ZERO); 6];
    while round(&all, &mut holders) > 0 {}
    let left = members(&["a", "b"]);
    let of_c: Vec<usize> = (0..6)
        .filter(|s| holders[*s] == Holder::Held("c".to_owned()))
        .collect();
    assert_eq!(of_c.len(), 2);
    let mut after = holders.clone();
    for s in &of_c {
        after[*s] = Holder::Free(Duration::ZERO);
    }
    while round(&left, &mut after) > 0 {}
    let mut expired = holders.clone();
    for s in &of_c {
        expired[*s] = Holder::Free(Duration::from_secs(1));
    }
    for s in of_c {
        let Holder::Held(taker) = &after[s] else {
            panic!("shard {s} left free")
        };
        let shard = u32::try_from(s).unwrap();
        for (members, holders, when) in [
            (&all, &holders, "while c lived"),
            (&left, &holders, "c's heartbeat expired"),
            (&left, &expired, "c's heartbeat and Leases expired"),
            (&all, &expired, "c's Leases expired before its heartbeat"),
        ] {
            assert!(
                successor_for(taker, members, holders).contains(&shard),
                "shard {s}, taken by {taker}, not warm there when {when}"
            );
        }
    }
}
