//! Who writes: regions and their incarnations.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::CrdtError;

/// A region's name, e.g. `us-east-1`: lowercase ASCII letters, digits and `-`, so it is
/// safe in topic names (`<region>.geostate.deltas`), file names and metric labels.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct RegionId(String);

impl RegionId {
    pub fn new(name: impl Into<String>) -> Result<Self, CrdtError> {
        let name = name.into();
        let valid = !name.is_empty()
            && name.len() <= 64
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !name.starts_with('-');
        if valid {
            Ok(Self(name))
        } else {
            Err(CrdtError::InvalidRegion { name })
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for RegionId {
    type Error = CrdtError;
    fn try_from(name: String) -> Result<Self, CrdtError> {
        Self::new(name)
    }
}

impl From<RegionId> for String {
    fn from(region: RegionId) -> String {
        region.0
    }
}

impl fmt::Display for RegionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A counter writer: (region, incarnation). Each actor has exactly one writer, the node of
/// that region in that incarnation. A node that starts without its own latest state takes
/// the next incarnation ([`Actor::successor`]): were it to reuse the old actor, its new
/// increments would be absorbed by the per-actor max of the old entry and lost.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Actor {
    pub region: RegionId,
    pub incarnation: u32,
}

impl Actor {
    pub fn new(region: RegionId, incarnation: u32) -> Self {
        Self {
            region,
            incarnation,
        }
    }

    /// The actor a node of this region takes after losing its state.
    pub fn successor(&self) -> Actor {
        Actor::new(self.region.clone(), self.incarnation.saturating_add(1))
    }
}

impl fmt::Display for Actor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}#{}", self.region, self.incarnation)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn region_names_are_checked() {
        assert!(RegionId::new("us-east-1").is_ok());
        for bad in ["", "US-EAST", "eu west", "-x", "a.b", &"x".repeat(65)] {
            assert!(RegionId::new(bad).is_err(), "{bad:?} must be refused");
        }
    }
}
