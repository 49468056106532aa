//! geostate: geo-replicated, active-active state. Each region ingests events from its own
//! Kafka cluster into CRDT state, replicates deltas to the other regions over Kafka topics
//! mirrored by MirrorMaker 2, and hands keys that must not be merged to one owner at a
//! time under Raft-granted leases with fencing epochs. See ARCHITECTURE.md.
//!
//! Dependencies point down; nothing below imports anything above it.
//!
//! ```text
//!  producers ─► Kafka geostate.updates ─► ingest ─► store (RocksDB: state+offsets+outbox)
//!                                                        │ outbox
//!  <remote>.geostate.deltas ─► replication (merge) ◄──┐  ▼
//!                                                     └─ replication (ship) ─► geostate.deltas
//!
//!  crdt   pure CRDTs: counters, LWW register, order stamps, deltas and their encoding
//!  clock  pure: injected physical clock, hybrid logical clock with max-offset guard
//!  pb     generated protobuf code (proto/)
//! ```

pub mod api;
pub mod clock;
pub mod config;
pub mod crdt;
pub mod ingest;
pub mod log;
pub mod metrics;
pub mod node;
pub mod pb;
pub mod replication;
pub mod store;
