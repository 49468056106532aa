//! The write path: consume the region's updates topic, apply records in batches, and
//! commit each batch's states, source offsets and outbox in one RocksDB write.

pub mod batch;
pub mod event;
pub mod idle;
pub mod ingestor;
