//! Lease exclusivity and epoch monotonicity, named once: the lease simulation (`sim.rs`)
//! judges its histories with these functions. (The Jepsen fencing checker states the
//! same rules over its own history format, in `jepsen-tests/src/fencing.rs`.)

use super::table::ShardId;
use crate::crdt::RegionId;

/// A span of real time during which `region` believed it held `shard` at `epoch`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Validity {
    pub shard: ShardId,
    pub region: RegionId,
    pub epoch: u64,
    /// Start (inclusive) and end (exclusive), in one reference time.
    pub from: u64,
    pub until: u64,
}

/// Why a set of validities breaks the lease guarantees.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Violation {
    /// Two regions believed they held the shard at the same instant.
    TwoHolders(Validity, Validity),
    /// Two regions held the shard under the same epoch.
    SharedEpoch(Validity, Validity),
    /// A later holding of another region carries a lower epoch.
    EpochWentBack(Validity, Validity),
}

/// Checks that no two regions ever held a shard at once, never under one epoch, and that
/// a shard's epochs increase from holder to holder.
pub fn check(validities: &[Validity]) -> Result<(), Violation> {
    let mut sorted: Vec<&Validity> = validities.iter().filter(|v| v.from < v.until).collect();
    sorted.sort_by_key(|v| (v.shard, v.from));
    for (i, a) in sorted.iter().enumerate() {
        for b in &sorted[i + 1..] {
            if b.shard != a.shard {
                break;
            }
            if a.region == b.region {
                continue;
            }
            if a.epoch == b.epoch {
                return Err(Violation::SharedEpoch((*a).clone(), (*b).clone()));
            }
            if b.from < a.until {
                return Err(Violation::TwoHolders((*a).clone(), (*b).clone()));
            }
            if b.epoch < a.epoch {
                return Err(Violation::EpochWentBack((*a).clone(), (*b).clone()));
            }
        }
    }
    Ok(())
}
