//! Conflict-free replicated data types: the pure core every region applies and merges.
//! Owns the counters, the register and its order stamps, delta extraction and the wire
//! encoding of state. Must not touch storage, Kafka, the network or the wall clock:
//! stamps arrive as arguments (see `clock`).
//!
//! ```text
//!   local update ──► state ──own_part(region)──► Delta ──encode──► geostate.deltas
//!   remote Delta ──decode──► merge into state (join: per-actor max / greatest stamp)
//! ```
//!
//! | type          | update              | value                  | merge                    |
//! |---------------|---------------------|------------------------|--------------------------|
//! | [`GCounter`]  | increment by n > 0  | sum of actor entries   | per-actor max            |
//! | [`PnCounter`] | add n (either sign) | P − N                  | per-actor max of P and N |
//! | [`LwwRegister`] | set bytes         | the newest write       | max of (epoch, hlc, origin), then value |

mod actor;
mod codec;
mod counter;
mod register;
mod value;

#[cfg(test)]
mod laws;

pub use actor::{Actor, RegionId};
pub use codec::{DecodeError, Delta, RESUME_KEY, ResumePoint, decode_value, encode_value};
pub use counter::{GCounter, PnCounter, PnEntry};
pub use register::{LwwRegister, OrderStamp};
pub use value::{CrdtType, CrdtValue};

/// A state-based CRDT: a join-semilattice under [`Crdt::merge`].
///
/// Laws, for all states `a`, `b`, `c` of one type (checked by property tests for every
/// implementation, see `laws.rs`):
/// - commutativity: `merge(a, b) == merge(b, a)`
/// - associativity: `merge(merge(a, b), c) == merge(a, merge(b, c))`
/// - idempotence: `merge(a, a) == a`
///
/// Together they make replication safe over at-least-once, reordering transport: any
/// delivery order of any multiset of states, duplicates included, ends in the same state.
pub trait Crdt: Clone + PartialEq + std::fmt::Debug {
    /// Joins `other` into `self`.
    fn merge(&mut self, other: &Self);
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CrdtError {
    #[error("invalid region name {name:?}: use lowercase letters, digits and '-'")]
    InvalidRegion { name: String },
    #[error("a g_counter increment must be greater than zero")]
    ZeroIncrement,
    #[error("counter entry of {actor} would overflow 64 bits")]
    CounterOverflow { actor: Actor },
    #[error("cannot merge a {found} into a {expected}")]
    TypeMismatch { expected: CrdtType, found: CrdtType },
}
