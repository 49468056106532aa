//! The replication path. Inbound: merge every remote region's deltas (see `inbound.rs`).
//! Outbound: ship the outbox — each touched key's own-origin delta,
//! written with the state in one `WriteBatch` — to this region's deltas topic, and clear
//! an entry only after Kafka acknowledged it.
//!
//! ```text
//!  store.outbox ──Shipper──► geostate.deltas (record key = state key, compactable)
//!        ▲ cleared after the ack, only if unchanged since it was read
//! ```

pub mod inbound;
pub mod outbound;

use std::collections::BTreeMap;
use std::sync::RwLock;
use std::time::Duration;

use crate::clock::HlcTimestamp;
use crate::crdt::RegionId;

/// How current this region is with each remote region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteFreshness {
    /// The newest origin time of the remote's deltas merged here.
    pub applied: HlcTimestamp,
    /// How long that delta took from the remote's apply to ours.
    pub lag: Duration,
}

/// Per remote region, the newest delta merged and its lag; shared with the API.
#[derive(Debug, Default)]
pub struct Freshness {
    remotes: RwLock<BTreeMap<RegionId, RemoteFreshness>>,
}

impl Freshness {
    /// Starts from what the store remembers (lag unknown until the next merge).
    pub fn new(applied: BTreeMap<RegionId, HlcTimestamp>) -> Self {
        let remotes = applied
            .into_iter()
            .map(|(r, applied)| {
                (
                    r,
                    RemoteFreshness {
                        applied,
                        lag: Duration::ZERO,
                    },
                )
            })
            .collect();
        Self {
            remotes: RwLock::new(remotes),
        }
    }

    /// Records a merge of deltas up to `newest` at local time `now_nanos`; returns the lag.
    pub fn record(&self, remote: &RegionId, newest: HlcTimestamp, now_nanos: u64) -> Duration {
        let lag = Duration::from_nanos(now_nanos.saturating_sub(newest.wall_nanos));
        let mut remotes = self.remotes.write().unwrap_or_else(|p| p.into_inner());
        let entry = remotes.entry(remote.clone()).or_insert(RemoteFreshness {
            applied: newest,
            lag,
        });
        if newest >= entry.applied {
            *entry = RemoteFreshness {
                applied: newest,
                lag,
            };
        }
        lag
    }

    pub fn snapshot(&self) -> BTreeMap<RegionId, RemoteFreshness> {
        self.remotes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}
