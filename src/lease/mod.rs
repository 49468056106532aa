//! Ownership leases for `owned` namespaces: one writer region per shard at a time.
//!
//! ```text
//!  table.rs       PURE  the lease table (the Raft state machine's data): commands carry
//!                       their proposer's time; grant, renew, release, transfer; epochs
//!  holder.rs      PURE  a region's own holdings: valid until sent + duration − offset
//!  invariants.rs  PURE  exclusivity and epoch monotonicity, named once
//! ```
//!
//! Guarantee (proved by the simulation in `sim.rs` over clocks up to `max_clock_offset`
//! apart and delayed, duplicated commands): at no instant do two regions hold a valid
//! lease on one shard, no epoch is held by two regions, and epochs rise from holder to
//! holder. Not built yet: the openraft group that replicates the table, the witness, and
//! owned writes at the node (they are refused with `FAILED_PRECONDITION` today).

pub mod holder;
pub mod invariants;
pub mod table;

#[cfg(test)]
mod sim;
