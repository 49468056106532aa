//! Ownership leases for `owned` namespaces: one writer region per shard at a time.
//!
//! ```text
//!  table.rs       PURE  the lease table (the Raft state machine's data): commands carry
//!                       their proposer's time; grant, renew, release, transfer, read;
//!                       epochs
//!  holdings.rs    PURE  a region's own holdings: valid until sent + duration − offset
//!  invariants.rs  PURE  exclusivity and epoch monotonicity, named once
//!  plan.rs        PURE  a region's round policy: renew, take, ask back, hand home
//!  sim.rs         test  the protocol simulated over skewed clocks and delayed commands
//!  raft_store.rs        openraft 0.9 log + state machine storage in RocksDB (synced),
//!                       and a read-only view of the applied table
//!  network.rs           Raft traffic, `Propose`, `Clock`, `Stand` over tonic gRPC (`LeaseRaft`
//!                       service, JSON bodies); the proposer that forwards to the leader
//!  election.rs          pre-vote around openraft 0.9's elections
//!  placement.rs         where the leader should be (the regions' renewal paths; pure),
//!                       the voters' round trips, the leader's handover
//!  runtime.rs           openraft's tokio runtime with a floor under its RPC timeouts
//!  member.rs            one member as a running part: storage, service, group start
//!  witness.rs           the member with no region (`geostate run --role witness`)
//!  leases.rs            a region's leases: runs the rounds `plan.rs` decides, transfer,
//!                       release on stop; the epoch for an owned write; epochs known or read
//!  clock_check.rs       the members' clock offsets; a region too far off takes nothing
//! ```
//!
//! Guarantee (proved by the simulation in `sim.rs` over clocks up to `max_clock_offset`
//! apart and delayed, duplicated commands): at no instant do two regions hold a valid
//! lease on one shard, no epoch is held by two regions, and epochs rise from holder to
//! holder. The table's Raft storage passes openraft's conformance suite, and a three-member
//! group over gRPC keeps granting after its leader stops (`tests/lease_group.rs`).

pub mod clock_check;
pub mod election;
pub mod holdings;
pub mod invariants;
pub mod leases;
pub mod member;
pub mod network;
pub mod placement;
pub mod plan;
pub mod raft_store;
pub mod runtime;
pub mod table;
pub mod witness;

#[cfg(test)]
mod sim;
