//! What a batch reads of state ([`StateSource`]): the store, or a map in tests of the pure
//! batch and merge logic (`ingest::batch`, `replication::merger`).

use std::collections::{BTreeMap, VecDeque};

use super::{Store, StoreError};
use crate::crdt::CrdtValue;

/// Where a batch reads the current state of the keys it touches: the store, or a map in
/// tests.
pub trait StateSource {
    type Error;
    fn state(&self, key: &str) -> Result<Option<CrdtValue>, Self::Error>;
    /// The idempotency ids most recently applied to `key`, oldest first.
    fn recent_ids(&self, key: &str) -> Result<VecDeque<String>, Self::Error>;
    /// The fence of an owned shard on an updates partition: the highest lease epoch its
    /// own records there applied (0: none).
    fn fence(&self, _shard: u32, _partition: i32) -> Result<u64, Self::Error> {
        Ok(0)
    }
    /// The event-time watermark of an updates partition's windowed records (`None`: none
    /// yet).
    fn watermark(&self, _partition: i32) -> Result<Option<u64>, Self::Error> {
        Ok(None)
    }
    /// Whether a stored key is a slice past its retention: a delta for it is not merged
    /// (it would bring back part of a deleted slice).
    fn expired(&self, _key: &str) -> bool {
        false
    }
}

/// An in-memory source: the stored states, no id windows (tests of pure batch logic, and
/// the in-memory ceiling of `make bench`).
impl StateSource for BTreeMap<String, CrdtValue> {
    type Error = std::convert::Infallible;
    fn state(&self, key: &str) -> Result<Option<CrdtValue>, Self::Error> {
        Ok(self.get(key).cloned())
    }
    fn recent_ids(&self, _key: &str) -> Result<VecDeque<String>, Self::Error> {
        Ok(VecDeque::new())
    }
}

impl StateSource for Store {
    type Error = StoreError;
    fn state(&self, key: &str) -> Result<Option<CrdtValue>, StoreError> {
        self.get(key)
    }
    fn recent_ids(&self, key: &str) -> Result<VecDeque<String>, StoreError> {
        Store::recent_ids(self, key)
    }
    fn fence(&self, shard: u32, partition: i32) -> Result<u64, StoreError> {
        Store::fence(self, shard, partition)
    }
    fn watermark(&self, partition: i32) -> Result<Option<u64>, StoreError> {
        Store::watermark(self, partition)
    }
    fn expired(&self, key: &str) -> bool {
        Store::expired(self, key)
    }
}
