//! G-Counter and PN-Counter on the `crdts` crate, with per-actor entries visible so a
//! region's own part can be cut out as a replication delta.
//!
//! `crdts` keeps its entries private; each counter here also keeps the set of actors with
//! a non-zero entry, and reads an entry through the crate's own `inc_many(actor, 0)` (the
//! op that would set the actor's entry to its current value).

use std::collections::BTreeSet;

use crdts::{CmRDT, CvRDT, Dot};
use num_traits::ToPrimitive;

use super::{Actor, Crdt, CrdtError, RegionId};

/// Grow-only counter: value = sum of per-actor counts; merge = per-actor max.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GCounter {
    inner: crdts::GCounter<Actor>,
    /// Every actor whose entry is non-zero; derived from `inner`, kept in step with it.
    actors: BTreeSet<Actor>,
}

impl GCounter {
    pub fn new() -> Self {
        Self::default()
    }

    /// Builds a counter from per-actor counts (decoding); zero entries are dropped and a
    /// repeated actor keeps its largest count, as merge would.
    pub fn from_entries(entries: impl IntoIterator<Item = (Actor, u64)>) -> Self {
        let mut counter = Self::new();
        for (actor, count) in entries {
            counter.raise(actor, count);
        }
        counter
    }

    /// Adds `n > 0` to `actor`'s entry. Only the node that is `actor` may call this.
    pub fn increment(&mut self, actor: &Actor, n: u64) -> Result<(), CrdtError> {
        if n == 0 {
            return Err(CrdtError::ZeroIncrement);
        }
        let count = self
            .get(actor)
            .checked_add(n)
            .ok_or_else(|| CrdtError::CounterOverflow {
                actor: actor.clone(),
            })?;
        self.raise(actor.clone(), count);
        Ok(())
    }

    /// `actor`'s entry (0 if it never incremented).
    pub fn get(&self, actor: &Actor) -> u64 {
        self.inner.inc_many(actor.clone(), 0).counter
    }

    /// Non-zero entries in actor order.
    pub fn entries(&self) -> impl Iterator<Item = (&Actor, u64)> + '_ {
        self.actors.iter().map(|actor| (actor, self.get(actor)))
    }

    pub fn value(&self) -> u128 {
        self.inner.read().to_u128().unwrap_or(u128::MAX)
    }

    pub fn is_empty(&self) -> bool {
        self.actors.is_empty()
    }

    /// The entries of every incarnation of `region`: what that region ships as its delta.
    pub fn own_part(&self, region: &RegionId) -> Self {
        Self::from_entries(
            self.entries()
                .filter(|(actor, _)| &actor.region == region)
                .map(|(actor, count)| (actor.clone(), count)),
        )
    }

    /// The value of `region`'s part (`own_part(region).value()`, without building it).
    pub fn own_value(&self, region: &RegionId) -> u128 {
        self.entries()
            .filter(|(actor, _)| &actor.region == region)
            .map(|(_, count)| u128::from(count))
            .sum()
    }

    /// Sets `actor`'s entry to `max(entry, count)`.
    fn raise(&mut self, actor: Actor, count: u64) {
        if count > 0 {
            self.inner.apply(Dot::new(actor.clone(), count));
            self.actors.insert(actor);
        }
    }
}

impl Crdt for GCounter {
    fn merge(&mut self, other: &Self) {
        self.inner.merge(other.inner.clone());
        self.actors.extend(other.actors.iter().cloned());
    }
}

/// Counter that goes both ways: value = P − N, each a G-Counter of per-actor totals.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PnCounter {
    inner: crdts::PNCounter<Actor>,
    /// Every actor with a non-zero P or N entry; derived from `inner`.
    actors: BTreeSet<Actor>,
}

/// One actor's totals in a [`PnCounter`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PnEntry {
    pub increments: u64,
    pub decrements: u64,
}

impl PnCounter {
    pub fn new() -> Self {
        Self::default()
    }

    /// Builds a counter from per-actor totals (decoding); a repeated actor keeps the
    /// larger of each total, as merge would.
    pub fn from_entries(entries: impl IntoIterator<Item = (Actor, PnEntry)>) -> Self {
        let mut counter = Self::new();
        for (actor, entry) in entries {
            counter.raise(actor, entry);
        }
        counter
    }

    /// Adds `n` (either sign) on behalf of `actor`; 0 changes nothing.
    pub fn add(&mut self, actor: &Actor, n: i64) -> Result<(), CrdtError> {
        let mut entry = self.get(actor);
        let side = if n >= 0 {
            &mut entry.increments
        } else {
            &mut entry.decrements
        };
        *side = side
            .checked_add(n.unsigned_abs())
            .ok_or_else(|| CrdtError::CounterOverflow {
                actor: actor.clone(),
            })?;
        self.raise(actor.clone(), entry);
        Ok(())
    }

    pub fn get(&self, actor: &Actor) -> PnEntry {
        PnEntry {
            increments: self.inner.inc_many(actor.clone(), 0).dot.counter,
            decrements: self.inner.dec_many(actor.clone(), 0).dot.counter,
        }
    }

    pub fn entries(&self) -> impl Iterator<Item = (&Actor, PnEntry)> + '_ {
        self.actors.iter().map(|actor| (actor, self.get(actor)))
    }

    pub fn value(&self) -> i128 {
        let value = self.inner.read();
        value
            .to_i128()
            .unwrap_or(if value.sign() == num_bigint::Sign::Minus {
                i128::MIN
            } else {
                i128::MAX
            })
    }

    pub fn is_empty(&self) -> bool {
        self.actors.is_empty()
    }

    /// The entries of every incarnation of `region`: what that region ships as its delta.
    pub fn own_part(&self, region: &RegionId) -> Self {
        Self::from_entries(
            self.entries()
                .filter(|(actor, _)| &actor.region == region)
                .map(|(actor, entry)| (actor.clone(), entry)),
        )
    }

    /// The value of `region`'s part (`own_part(region).value()`, without building it).
    pub fn own_value(&self, region: &RegionId) -> i128 {
        self.entries()
            .filter(|(actor, _)| &actor.region == region)
            .map(|(_, e)| i128::from(e.increments) - i128::from(e.decrements))
            .sum()
    }

    /// Sets `actor`'s totals to the per-side max of the current ones and `entry`.
    fn raise(&mut self, actor: Actor, entry: PnEntry) {
        if entry.increments > 0 {
            let mut op = self.inner.inc_many(actor.clone(), 0);
            op.dot.counter = entry.increments;
            self.inner.apply(op);
        }
        if entry.decrements > 0 {
            let mut op = self.inner.dec_many(actor.clone(), 0);
            op.dot.counter = entry.decrements;
            self.inner.apply(op);
        }
        if entry != PnEntry::default() {
            self.actors.insert(actor);
        }
    }
}

impl Crdt for PnCounter {
    fn merge(&mut self, other: &Self) {
        self.inner.merge(other.inner.clone());
        self.actors.extend(other.actors.iter().cloned());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn actor(region: &str, incarnation: u32) -> Actor {
        Actor::new(RegionId::new(region).unwrap(), incarnation)
    }

    #[test]
    fn g_counter_sums_actors_and_refuses_zero() {
        let mut c = GCounter::new();
        c.increment(&actor("a", 1), 3).unwrap();
        c.increment(&actor("b", 1), 4).unwrap();
        c.increment(&actor("a", 1), 1).unwrap();
        assert_eq!(c.value(), 8);
        assert_eq!(c.get(&actor("a", 1)), 4);
        assert_eq!(
            c.increment(&actor("a", 1), 0),
            Err(CrdtError::ZeroIncrement)
        );
    }

    #[test]
    fn g_counter_overflow_is_an_error_not_a_wrap() {
        let mut c = GCounter::new();
        c.increment(&actor("a", 1), u64::MAX).unwrap();
        assert!(matches!(
            c.increment(&actor("a", 1), 1),
            Err(CrdtError::CounterOverflow { .. })
        ));
        assert_eq!(c.get(&actor("a", 1)), u64::MAX);
        c.increment(&actor("b", 1), u64::MAX).unwrap();
        assert_eq!(c.value(), 2 * u64::MAX as u128);
    }

    #[test]
    fn pn_counter_goes_both_ways() {
        let mut c = PnCounter::new();
        c.add(&actor("a", 1), 5).unwrap();
        c.add(&actor("a", 1), -7).unwrap();
        c.add(&actor("b", 2), 1).unwrap();
        c.add(&actor("c", 1), 0).unwrap();
        assert_eq!(c.value(), -1);
        assert_eq!(
            c.get(&actor("a", 1)),
            PnEntry {
                increments: 5,
                decrements: 7
            }
        );
        assert_eq!(c.entries().count(), 2, "a zero add records no actor");
    }

    #[test]
    fn own_part_keeps_every_incarnation_of_the_region_and_nothing_else() {
        let mut c = GCounter::new();
        c.increment(&actor("a", 1), 10).unwrap();
        c.increment(&actor("a", 2), 3).unwrap();
        c.increment(&actor("b", 1), 5).unwrap();
        let own = c.own_part(&RegionId::new("a").unwrap());
        assert_eq!(own.value(), 13);
        assert_eq!(own.entries().count(), 2);
    }
}
