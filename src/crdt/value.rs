//! A key's state, whichever of the three types its namespace declares.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::{Crdt, CrdtError, GCounter, LwwRegister, PnCounter, RegionId};

/// The type a namespace declares for its keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CrdtType {
    GCounter,
    PnCounter,
    LwwRegister,
}

impl fmt::Display for CrdtType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CrdtType::GCounter => "g_counter",
            CrdtType::PnCounter => "pn_counter",
            CrdtType::LwwRegister => "lww_register",
        })
    }
}

/// One key's CRDT state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CrdtValue {
    GCounter(GCounter),
    PnCounter(PnCounter),
    LwwRegister(LwwRegister),
}

impl CrdtValue {
    /// A counter's value as a number (a register is none).
    pub fn count(&self) -> Option<i128> {
        match self {
            CrdtValue::GCounter(c) => Some(i128::try_from(c.value()).unwrap_or(i128::MAX)),
            CrdtValue::PnCounter(c) => Some(c.value()),
            CrdtValue::LwwRegister(_) => None,
        }
    }

    pub fn crdt_type(&self) -> CrdtType {
        match self {
            CrdtValue::GCounter(_) => CrdtType::GCounter,
            CrdtValue::PnCounter(_) => CrdtType::PnCounter,
            CrdtValue::LwwRegister(_) => CrdtType::LwwRegister,
        }
    }

    /// Joins `other` into `self`. States of different types never merge: that is a
    /// namespace misconfiguration or a corrupt delta, reported, never coerced.
    pub fn merge(&mut self, other: &CrdtValue) -> Result<(), CrdtError> {
        match (self, other) {
            (CrdtValue::GCounter(a), CrdtValue::GCounter(b)) => a.merge(b),
            (CrdtValue::PnCounter(a), CrdtValue::PnCounter(b)) => a.merge(b),
            (CrdtValue::LwwRegister(a), CrdtValue::LwwRegister(b)) => a.merge(b),
            (ours, theirs) => {
                return Err(CrdtError::TypeMismatch {
                    expected: ours.crdt_type(),
                    found: theirs.crdt_type(),
                });
            }
        }
        Ok(())
    }

    /// The fencing epoch of a register's winning write (0 for counters and shared keys).
    pub fn epoch(&self) -> u64 {
        match self {
            CrdtValue::LwwRegister(r) => r.stamp().epoch,
            _ => 0,
        }
    }

    /// Whether all of this state is `region`'s own (what a delta of `region` may carry):
    /// every counter entry one of its actors', the register its write.
    pub fn is_all_from(&self, region: &RegionId) -> bool {
        match self {
            CrdtValue::GCounter(c) => c.entries().all(|(a, _)| &a.region == region),
            CrdtValue::PnCounter(c) => c.entries().all(|(a, _)| &a.region == region),
            CrdtValue::LwwRegister(r) => r.is_from(region),
        }
    }

    /// `region`'s own-origin part of this state — every counter entry of any of the
    /// region's incarnations, or the register if `region` wrote it — or `None` if the
    /// region contributed nothing. This is the replication delta: merging it anywhere is
    /// harmless to repeat, and a later one supersedes an earlier one for the same key, so
    /// the deltas topic can be compacted by key.
    pub fn own_part(&self, region: &RegionId) -> Option<CrdtValue> {
        match self {
            CrdtValue::GCounter(c) => {
                let own = c.own_part(region);
                (!own.is_empty()).then_some(CrdtValue::GCounter(own))
            }
            CrdtValue::PnCounter(c) => {
                let own = c.own_part(region);
                (!own.is_empty()).then_some(CrdtValue::PnCounter(own))
            }
            CrdtValue::LwwRegister(r) => r.is_from(region).then(|| self.clone()),
        }
    }
}
