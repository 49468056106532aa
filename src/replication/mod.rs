//! The replication path. Inbound: merge every remote region's deltas (see `inbound.rs`).
//! Outbound: ship the outbox — each touched key's own-origin delta, written with the state
//! in one `WriteBatch` — to this region's deltas topic in one transaction per round, ending
//! with a resume point, and clear an entry only after the commit (see `outbound.rs`).
//! Bootstrap: a node on an empty disk rebuilds its own past from its deltas topic before it
//! takes a new incarnation (see `bootstrap.rs`).
//!
//! ```text
//!  store.outbox ──Shipper──► geostate.deltas (record key = state key, compactable)
//!        ▲ cleared after the ack, only if unchanged since it was read
//! ```

pub mod bootstrap;
pub mod inbound;
pub mod outbound;

use std::collections::BTreeMap;
use std::sync::RwLock;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use tokio::sync::watch;

use crate::clock::HlcTimestamp;
use crate::config::RemoteConfig;
use crate::crdt::RegionId;

/// How far one remote region's merger has read; shared with `Admin/Status` and with the
/// bootstrap gate of a node that started on an empty disk.
#[derive(Debug)]
pub struct RemoteProgress {
    pub remote: RemoteConfig,
    /// Last merged (or refused) offset per partition.
    pub offsets: watch::Sender<BTreeMap<i32, i64>>,
    /// The partitions of the remote topic, once the merger subscribed.
    pub partitions: watch::Sender<Vec<i32>>,
    /// True once every partition was read to its end since the node started.
    pub caught_up: watch::Sender<bool>,
    pub merged: AtomicU64,
    pub refused: AtomicU64,
}

impl RemoteProgress {
    pub fn new(remote: RemoteConfig, offsets: BTreeMap<i32, i64>) -> Self {
        Self {
            remote,
            offsets: watch::Sender::new(offsets),
            partitions: watch::Sender::new(Vec::new()),
            caught_up: watch::Sender::new(false),
            merged: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        }
    }
}

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
