//! Last-writer-wins register on `crdts::LWWReg`, ordered by [`OrderStamp`]
//! `(epoch, hlc, origin)` — never by a bare wall clock.
//!
//! `crdts::LWWReg::update` keeps the value it already has when two markers are equal, so
//! replicas receiving equal-marker writes in different orders would diverge (rust-crdt
//! #95). Equal stamps cannot arise from one region's monotone HLC, but merge here does not
//! rely on that: it compares `(stamp, value)`, a total order, so the outcome never
//! depends on delivery order.

use std::fmt;

use crdts::LWWReg;
use serde::{Deserialize, Serialize};

use super::{Crdt, RegionId};
use crate::clock::HlcTimestamp;

/// The order of register writes. `epoch` is 0 in shared namespaces and the lease's
/// fencing epoch in owned ones, so a new owner supersedes an old one whatever the clocks
/// say; `hlc` orders writes within an epoch; `origin` breaks the remaining ties.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct OrderStamp {
    pub epoch: u64,
    pub hlc: HlcTimestamp,
    pub origin: RegionId,
}

impl OrderStamp {
    /// The stamp of a write in a shared namespace.
    pub fn shared(hlc: HlcTimestamp, origin: RegionId) -> Self {
        Self {
            epoch: 0,
            hlc,
            origin,
        }
    }
}

impl fmt::Display for OrderStamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.epoch, self.hlc, self.origin)
    }
}

/// A register holding the bytes of the write with the greatest stamp.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LwwRegister {
    inner: LWWReg<Vec<u8>, OrderStamp>,
}

impl LwwRegister {
    pub fn new(value: Vec<u8>, stamp: OrderStamp) -> Self {
        Self {
            inner: LWWReg {
                val: value,
                marker: stamp,
            },
        }
    }

    pub fn value(&self) -> &[u8] {
        &self.inner.val
    }

    pub fn stamp(&self) -> &OrderStamp {
        &self.inner.marker
    }

    /// Applies a write; it wins only if it is newer than what the register holds.
    pub fn set(&mut self, value: Vec<u8>, stamp: OrderStamp) {
        self.merge(&Self::new(value, stamp));
    }

    /// Whether this register is `region`'s own write (what that region ships).
    pub fn is_from(&self, region: &RegionId) -> bool {
        &self.inner.marker.origin == region
    }
}

impl Crdt for LwwRegister {
    fn merge(&mut self, other: &Self) {
        let ours = (&self.inner.marker, &self.inner.val);
        let theirs = (&other.inner.marker, &other.inner.val);
        if theirs > ours {
            self.inner = other.inner.clone();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp(epoch: u64, wall: u64, origin: &str) -> OrderStamp {
        OrderStamp {
            epoch,
            hlc: HlcTimestamp::new(wall, 0),
            origin: RegionId::new(origin).unwrap(),
        }
    }

    #[test]
    fn a_higher_epoch_wins_whatever_the_clock() {
        let mut r = LwwRegister::new(b"old-owner".to_vec(), stamp(1, 9_000, "a"));
        r.set(b"new-owner".to_vec(), stamp(2, 1, "b"));
        assert_eq!(r.value(), b"new-owner");
        r.set(b"stale".to_vec(), stamp(1, 99_999, "a"));
        assert_eq!(r.value(), b"new-owner");
    }

    #[test]
    fn within_an_epoch_the_later_hlc_then_the_origin_wins() {
        let mut r = LwwRegister::new(b"1".to_vec(), stamp(0, 10, "a"));
        r.set(b"2".to_vec(), stamp(0, 11, "a"));
        assert_eq!(r.value(), b"2");
        r.set(b"3".to_vec(), stamp(0, 11, "b"));
        assert_eq!(r.value(), b"3");
    }

    #[test]
    fn equal_stamps_resolve_the_same_way_in_either_order() {
        let x = LwwRegister::new(b"x".to_vec(), stamp(0, 5, "a"));
        let y = LwwRegister::new(b"y".to_vec(), stamp(0, 5, "a"));
        let mut xy = x.clone();
        xy.merge(&y);
        let mut yx = y.clone();
        yx.merge(&x);
        assert_eq!(xy, yx);
    }
}
