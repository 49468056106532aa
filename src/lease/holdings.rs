//! PURE: what a region believes about its own leases. Times are the region's monotonic
//! clock in milliseconds, passed in; nothing here reads a clock.
//!
//! A holding is valid from the moment the grant arrives until
//! `request_sent + duration − max_clock_offset`: measured from when the request left (so
//! any delay only shortens it) and ending a clock offset before the table's `expires_at`
//! (so another region's grant, judged on a clock up to that offset ahead, comes later).

use std::collections::BTreeMap;

use super::table::{Lease, ShardId};
use crate::crdt::RegionId;

/// One shard this region may write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Holding {
    pub epoch: u64,
    /// Monotonic milliseconds at which the holding ends.
    pub valid_until: u64,
}

/// This region's holdings.
#[derive(Debug)]
pub struct Holdings {
    region: RegionId,
    max_offset_ms: u64,
    shards: BTreeMap<ShardId, Holding>,
    /// When each shard was last relinquished: an answer to a request sent before then
    /// grants nothing (the release or transfer that followed may already be applied).
    relinquished: BTreeMap<ShardId, u64>,
}

impl Holdings {
    pub fn new(region: RegionId, max_offset_ms: u64) -> Self {
        Self {
            region,
            max_offset_ms,
            shards: BTreeMap::new(),
            relinquished: BTreeMap::new(),
        }
    }

    /// Records the answer to a request sent at `sent` (monotonic ms) for `duration_ms`.
    pub fn granted(&mut self, shard: ShardId, lease: &Lease, sent: u64, duration_ms: u64) {
        if self.relinquished.get(&shard).is_some_and(|&at| sent <= at) {
            return;
        }
        if lease.holder != self.region {
            self.shards.remove(&shard);
            return;
        }
        let valid_until = (sent + duration_ms).saturating_sub(self.max_offset_ms);
        let entry = self.shards.entry(shard).or_insert(Holding {
            epoch: lease.epoch,
            valid_until,
        });
        if lease.epoch > entry.epoch {
            *entry = Holding {
                epoch: lease.epoch,
                valid_until,
            };
        } else if lease.epoch == entry.epoch {
            entry.valid_until = entry.valid_until.max(valid_until);
        }
    }

    /// Stops writing `shard` at `now` (before proposing its release or transfer); answers
    /// to requests sent until then are ignored.
    pub fn relinquish(&mut self, shard: ShardId, now: u64) -> Option<Holding> {
        self.relinquished.insert(shard, now);
        self.shards.remove(&shard)
    }

    /// The epoch to stamp an owned write of `shard` with, if the holding is valid at `now`.
    pub fn valid(&self, shard: ShardId, now: u64) -> Option<u64> {
        self.holding(shard)
            .filter(|h| now < h.valid_until)
            .map(|h| h.epoch)
    }

    /// The holding of `shard`, valid or not.
    pub fn holding(&self, shard: ShardId) -> Option<Holding> {
        self.shards.get(&shard).copied()
    }
}
