//! The replication path. Outbound: ship the outbox — each touched key's own-origin delta,
//! written with the state in one `WriteBatch` — to this region's deltas topic, and clear
//! an entry only after Kafka acknowledged it.
//!
//! ```text
//!  store.outbox ──Shipper──► geostate.deltas (record key = state key, compactable)
//!        ▲ cleared after the ack, only if unchanged since it was read
//! ```

pub mod outbound;
