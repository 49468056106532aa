//! Property tests of the CRDT laws and of what replication relies on: every type is a
//! join-semilattice; any delivery order of deltas, with duplicates, converges; counters
//! count every increment exactly once; a new incarnation never absorbs increments; the
//! wire encoding round-trips.

use proptest::collection::vec;
use proptest::prelude::*;

use super::*;
use crate::clock::HlcTimestamp;

const CASES: u32 = 1000;
const REGIONS: [&str; 3] = ["us-east-1", "eu-west-1", "ap-south-1"];

fn region(i: usize) -> RegionId {
    RegionId::new(REGIONS[i % REGIONS.len()]).unwrap()
}

fn arb_actor() -> impl Strategy<Value = Actor> {
    (0..REGIONS.len(), 1u32..4).prop_map(|(r, inc)| Actor::new(region(r), inc))
}

fn arb_g_counter() -> impl Strategy<Value = GCounter> {
    vec((arb_actor(), 1u64..1_000), 0..8).prop_map(|incs| {
        let mut c = GCounter::new();
        for (actor, n) in incs {
            c.increment(&actor, n).unwrap();
        }
        c
    })
}

fn arb_pn_counter() -> impl Strategy<Value = PnCounter> {
    vec((arb_actor(), -1_000i64..1_000), 0..8).prop_map(|adds| {
        let mut c = PnCounter::new();
        for (actor, n) in adds {
            c.add(&actor, n).unwrap();
        }
        c
    })
}

/// Small domains on purpose, so equal epochs, clocks and origins are common.
fn arb_register() -> impl Strategy<Value = LwwRegister> {
    (
        vec(0u8..3, 0..3),
        0u64..3,
        0u64..3,
        0u32..2,
        0..REGIONS.len(),
    )
        .prop_map(|(value, epoch, wall, logical, origin)| {
            LwwRegister::new(
                value,
                OrderStamp {
                    epoch,
                    hlc: HlcTimestamp::new(wall, logical),
                    origin: region(origin),
                },
            )
        })
}

fn arb_value() -> impl Strategy<Value = CrdtValue> {
    prop_oneof![
        arb_g_counter().prop_map(CrdtValue::GCounter),
        arb_pn_counter().prop_map(CrdtValue::PnCounter),
        arb_register().prop_map(CrdtValue::LwwRegister),
    ]
}

fn merged<T: Crdt>(a: &T, b: &T) -> T {
    let mut out = a.clone();
    out.merge(b);
    out
}

fn check_laws<T: Crdt>(a: T, b: T, c: T) -> Result<(), TestCaseError> {
    prop_assert_eq!(merged(&a, &b), merged(&b, &a), "commutativity");
    prop_assert_eq!(
        merged(&merged(&a, &b), &c),
        merged(&a, &merged(&b, &c)),
        "associativity"
    );
    prop_assert_eq!(merged(&a, &a), a.clone(), "idempotence");
    // and the join is an upper bound: merging either side in again changes nothing
    let ab = merged(&a, &b);
    prop_assert_eq!(merged(&ab, &a), ab.clone(), "upper bound");
    Ok(())
}

/// A deterministic shuffle, seeded by proptest so failures shrink and replay.
fn shuffle<T>(items: &mut [T], mut seed: u64) {
    for i in (1..items.len()).rev() {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        items.swap(i, (seed % (i as u64 + 1)) as usize);
    }
}

/// Every region applies its own updates and emits `own_part` after each one (as the
/// ingest path does per batch). Returns each region's final state and all deltas.
fn run_regions(ops: &[(usize, i64)]) -> (Vec<PnCounter>, Vec<PnCounter>) {
    let mut states = vec![PnCounter::new(); REGIONS.len()];
    let mut deltas = Vec::new();
    for &(r, n) in ops {
        let actor = Actor::new(region(r), 1);
        states[r].add(&actor, n).unwrap();
        deltas.push(states[r].own_part(&region(r)));
    }
    (states, deltas)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    #[test]
    fn g_counter_is_a_semilattice(a in arb_g_counter(), b in arb_g_counter(), c in arb_g_counter()) {
        check_laws(a, b, c)?;
    }

    #[test]
    fn pn_counter_is_a_semilattice(a in arb_pn_counter(), b in arb_pn_counter(), c in arb_pn_counter()) {
        check_laws(a, b, c)?;
    }

    #[test]
    fn lww_register_is_a_semilattice(a in arb_register(), b in arb_register(), c in arb_register()) {
        check_laws(a, b, c)?;
    }

    /// The register's winner is the write with the greatest (stamp, value), whatever order.
    #[test]
    fn lww_register_keeps_the_greatest_write(mut writes in vec(arb_register(), 1..10), seed in any::<u64>()) {
        let best = writes.iter().max_by(|x, y| (x.stamp(), x.value()).cmp(&(y.stamp(), y.value()))).unwrap().clone();
        shuffle(&mut writes, seed | 1);
        let mut r = writes[0].clone();
        for w in &writes[1..] {
            r.merge(w);
        }
        prop_assert_eq!(r, best);
    }

    /// Deltas delivered in any order, each at least once and some many times, leave two
    /// replicas in the same state, equal to the join of every region's final state, and
    /// the counter equals the sum of every increment made anywhere.
    #[test]
    fn any_delivery_order_with_duplicates_converges_to_the_sum(
        ops in vec((0..REGIONS.len(), -100i64..100), 1..40),
        duplicates in vec(any::<prop::sample::Index>(), 0..40),
        seeds in (any::<u64>(), any::<u64>()),
    ) {
        let (states, deltas) = run_regions(&ops);
        let mut replicas = Vec::new();
        for seed in [seeds.0 | 1, seeds.1 | 1] {
            let mut schedule: Vec<&PnCounter> = deltas.iter().collect();
            schedule.extend(duplicates.iter().map(|i| &deltas[i.index(deltas.len())]));
            shuffle(&mut schedule, seed);
            let mut replica = PnCounter::new();
            for d in schedule {
                replica.merge(d);
            }
            replicas.push(replica);
        }
        let mut all = PnCounter::new();
        for s in &states {
            all.merge(s);
        }
        prop_assert_eq!(&replicas[0], &replicas[1]);
        prop_assert_eq!(&replicas[0], &all);
        let sum: i128 = ops.iter().map(|&(_, n)| n as i128).sum();
        prop_assert_eq!(replicas[0].value(), sum);
    }

    /// A region that loses its state several times, each time restarting as the successor
    /// incarnation without its old entries, never loses an increment: the merged counter
    /// counts all of them.
    #[test]
    fn a_new_incarnation_never_absorbs_increments(
        lives in vec(vec(1u64..1_000, 1..10), 1..5),
    ) {
        let mut actor = Actor::new(region(0), 1);
        let mut observer = GCounter::new(); // another region, merging every delta
        for life in &lives {
            let mut local = GCounter::new(); // a fresh disk: none of the old entries
            for &n in life {
                local.increment(&actor, n).unwrap();
                observer.merge(&local.own_part(&actor.region));
            }
            actor = actor.successor();
        }
        let sum: u64 = lives.iter().flatten().sum();
        prop_assert_eq!(observer.value(), sum as u128);
    }

    #[test]
    fn state_encoding_round_trips(value in arb_value()) {
        prop_assert_eq!(decode_value(&encode_value(&value)).unwrap(), value);
    }

    #[test]
    fn delta_encoding_round_trips(
        state in arb_value(), key in "[a-z/0-9]{0,20}", origin in 0..REGIONS.len(),
        wall in any::<u64>(), logical in any::<u32>(), epoch in any::<u64>(),
        recent_ids in proptest::collection::vec(".{0,8}", 0..4),
    ) {
        let delta = Delta {
            key, origin: region(origin), state,
            origin_time: HlcTimestamp::new(wall, logical), epoch, recent_ids,
        };
        prop_assert_eq!(Delta::decode(&delta.encode()).unwrap(), delta);
    }

    /// A region's own value is the value of its own part.
    #[test]
    fn own_value_is_the_value_of_the_own_part(g in arb_g_counter(), pn in arb_pn_counter()) {
        for r in 0..REGIONS.len() {
            prop_assert_eq!(g.own_value(&region(r)), g.own_part(&region(r)).value());
            prop_assert_eq!(pn.own_value(&region(r)), pn.own_part(&region(r)).value());
        }
    }

    /// The own part is the whole of what a region contributed: merging every region's own
    /// part rebuilds the state, and an own part holds nothing of any other region.
    #[test]
    fn own_parts_partition_the_state(value in arb_value()) {
        let mut rebuilt: Option<CrdtValue> = None;
        for r in 0..REGIONS.len() {
            if let Some(part) = value.own_part(&region(r)) {
                for other in (0..REGIONS.len()).filter(|&o| o != r) {
                    prop_assert!(part.own_part(&region(other)).is_none());
                }
                match &mut rebuilt {
                    None => rebuilt = Some(part),
                    Some(acc) => acc.merge(&part).unwrap(),
                }
            }
        }
        let empty = match &value {
            CrdtValue::GCounter(c) => c.is_empty(),
            CrdtValue::PnCounter(c) => c.is_empty(),
            CrdtValue::LwwRegister(_) => false,
        };
        if empty {
            prop_assert!(rebuilt.is_none());
        } else {
            prop_assert_eq!(rebuilt.unwrap(), value);
        }
    }
}

/// Why incarnations exist: had the restarted node reused its old actor, the per-actor max
/// would have swallowed its new increments. This pins down the hazard the property above
/// guards against, so a change that made incarnations irrelevant would be noticed.
#[test]
fn reusing_an_actor_after_state_loss_loses_increments() {
    let actor = Actor::new(region(0), 1);
    let mut observer = GCounter::new();
    let mut before = GCounter::new();
    before.increment(&actor, 10).unwrap();
    observer.merge(&before.own_part(&actor.region));
    let mut after = GCounter::new();
    after.increment(&actor, 3).unwrap();
    observer.merge(&after.own_part(&actor.region));
    assert_eq!(
        observer.value(),
        10,
        "3 increments absorbed by the old entry"
    );

    let mut fixed = GCounter::new();
    fixed.increment(&actor.successor(), 3).unwrap();
    observer.merge(&fixed.own_part(&actor.region));
    assert_eq!(observer.value(), 13);
}

#[test]
fn values_of_different_types_refuse_to_merge() {
    let mut g = CrdtValue::GCounter(GCounter::new());
    let pn = CrdtValue::PnCounter(PnCounter::new());
    assert_eq!(
        g.merge(&pn),
        Err(CrdtError::TypeMismatch {
            expected: CrdtType::GCounter,
            found: CrdtType::PnCounter
        })
    );
}
