//! The replication path. Inbound: merge every remote region's deltas (see `merger.rs`).
//! Outbound: ship the outbox — each touched key's own-origin delta, written with the state
//! in one `WriteBatch` — to this region's deltas topic in one transaction per round, ending
//! with a resume point, and clear an entry only after the commit (see `shipper.rs`).
//! Bootstrap: a node on an empty disk rebuilds its own past from its deltas topic before it
//! takes a new incarnation (see `bootstrap.rs`).
//!
//! ```text
//!  store.outbox ──Shipper──► geostate.deltas (record key = state key, compactable)
//!        ▲ cleared after the ack, only if unchanged since it was read
//! ```

pub mod bootstrap;
pub mod merger;
pub mod outputs;
pub mod shipper;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::AtomicU64;
use std::sync::{Mutex, RwLock};
use std::time::Duration;

use tokio::sync::watch;

use crate::clock::HlcTimestamp;
use crate::config::RemoteConfig;
use crate::crdt::RegionId;

/// The record key of a heartbeat: each partition's shipper writes one to its partition of
/// the deltas topic each round, in the round's transaction, after the round's deltas.
pub const HEARTBEAT_KEY: &[u8] = b"\0geostate.heartbeat";

/// A shipper's heartbeat: its region's physical clock, read before the round read its
/// outbox. Every write the region had applied by then is in that round or an earlier one,
/// so once a partition's heartbeat at `wall_nanos` is merged, so is everything the region
/// applied before `wall_nanos` that travels on that partition.
///
/// It also carries the partition's watermark as of the same read: the region refuses, as
/// late, every later event for a slice closed at or before it, so once the heartbeat is
/// merged, so is every delta the region will ever ship for such a slice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Heartbeat {
    pub origin: String,
    pub wall_nanos: u64,
    pub watermark_ms: Option<u64>,
}

impl Heartbeat {
    /// Eight bytes of big-endian nanoseconds, the origin region, then (if there is one) a
    /// NUL and the watermark's eight big-endian bytes. A region id holds no NUL.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = self.wall_nanos.to_be_bytes().to_vec();
        out.extend_from_slice(self.origin.as_bytes());
        if let Some(w) = self.watermark_ms {
            out.push(0);
            out.extend_from_slice(&w.to_be_bytes());
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Option<Heartbeat> {
        let (nanos, rest) = bytes.split_first_chunk::<8>()?;
        let (origin, watermark_ms) = match rest.iter().position(|&b| b == 0) {
            None => (rest, None),
            Some(at) => {
                let w: [u8; 8] = rest[at + 1..].try_into().ok()?;
                (&rest[..at], Some(u64::from_be_bytes(w)))
            }
        };
        Some(Heartbeat {
            origin: std::str::from_utf8(origin).ok()?.to_string(),
            wall_nanos: u64::from_be_bytes(*nanos),
            watermark_ms,
        })
    }
}

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
    /// Per partition, the newest heartbeat merged since this node started.
    pub heartbeats: Mutex<BTreeMap<i32, u64>>,
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
            heartbeats: Mutex::default(),
        }
    }

    /// The oldest of the newest heartbeats over the remote's partitions (its physical
    /// clock): every partition has been heard from since then (`None` until each has been
    /// once).
    pub fn heard_from_all_since(&self) -> Option<u64> {
        let partitions = self.partitions.borrow();
        let beats = self.heartbeats.lock().unwrap_or_else(|p| p.into_inner());
        if partitions.is_empty() {
            return None;
        }
        partitions
            .iter()
            .map(|p| beats.get(p).copied())
            .try_fold(u64::MAX, |oldest, beat| Some(oldest.min(beat?)))
    }

    /// Whether every partition of the remote's topic has a merged heartbeat at or after
    /// `wall_nanos` (the remote's physical clock).
    pub fn passed(&self, wall_nanos: u64) -> bool {
        self.heard_from_all_since()
            .is_some_and(|since| since >= wall_nanos)
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

/// Per partition and remote region, the newest delta merged and its lag; shared with the
/// API. A partition's entry is loaded from its copy when this node takes it, so a read
/// reports what the key's own partition holds, also right after a move.
#[derive(Debug, Default)]
pub struct Freshness {
    partitions: RwLock<BTreeMap<i32, BTreeMap<RegionId, RemoteFreshness>>>,
}

impl Freshness {
    /// A partition this node takes, whose copy holds each remote's deltas up to `stored`.
    /// Until the next merge its lag is the age of that newest delta (an upper bound).
    pub fn taken(&self, partition: i32, stored: BTreeMap<RegionId, HlcTimestamp>, now_nanos: u64) {
        let remotes = stored
            .into_iter()
            .map(|(r, applied)| {
                let lag = Duration::from_nanos(now_nanos.saturating_sub(applied.wall_nanos));
                (r, RemoteFreshness { applied, lag })
            })
            .collect();
        self.write().insert(partition, remotes);
    }

    /// Records a merge into `partition` of deltas up to `newest` at local time
    /// `now_nanos` (nothing for a partition this node never took); returns the lag.
    pub fn record(
        &self,
        remote: &RegionId,
        partition: i32,
        newest: HlcTimestamp,
        now_nanos: u64,
    ) -> Duration {
        let lag = Duration::from_nanos(now_nanos.saturating_sub(newest.wall_nanos));
        let fresh = RemoteFreshness {
            applied: newest,
            lag,
        };
        if let Some(remotes) = self.write().get_mut(&partition) {
            let entry = remotes.entry(remote.clone()).or_insert(fresh);
            if newest >= entry.applied {
                *entry = fresh;
            }
        }
        lag
    }

    /// What `partition`'s copy holds of each remote region.
    pub fn of(&self, partition: i32) -> BTreeMap<RegionId, RemoteFreshness> {
        self.read().get(&partition).cloned().unwrap_or_default()
    }

    /// Per remote region, the newest delta merged into any of `owned`.
    pub fn newest(&self, owned: &BTreeSet<i32>) -> BTreeMap<RegionId, RemoteFreshness> {
        let mut out: BTreeMap<RegionId, RemoteFreshness> = BTreeMap::new();
        let partitions = self.read();
        let held = partitions.iter().filter(|(p, _)| owned.contains(p));
        for (region, fresh) in held.flat_map(|(_, remotes)| remotes) {
            let kept = out.entry(region.clone()).or_insert(*fresh);
            if fresh.applied > kept.applied {
                *kept = *fresh;
            }
        }
        out
    }

    fn read(
        &self,
    ) -> std::sync::RwLockReadGuard<'_, BTreeMap<i32, BTreeMap<RegionId, RemoteFreshness>>> {
        self.partitions.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(
        &self,
    ) -> std::sync::RwLockWriteGuard<'_, BTreeMap<i32, BTreeMap<RegionId, RemoteFreshness>>> {
        self.partitions.write().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A read reports its own partition: one merged into recently does not make another
    /// look fresh; a partition taken reports its copy, with its age as the lag.
    #[test]
    fn freshness_is_per_partition_and_a_taken_partition_reports_its_copy() {
        let eu = RegionId::new("eu-west-1").unwrap();
        let at = |s: u64| HlcTimestamp::new(s * 1_000_000_000, 0);
        let fresh = Freshness::default();
        fresh.taken(0, BTreeMap::new(), 0);
        fresh.taken(1, BTreeMap::new(), 0);
        fresh.record(&eu, 0, at(10), 10_500_000_000);
        fresh.record(&eu, 1, at(3), 3_100_000_000);
        fresh.record(&eu, 2, at(11), 11_000_000_000);
        assert_eq!(fresh.of(1)[&eu].applied, at(3));
        assert!(fresh.of(2).is_empty(), "not held: nothing recorded");
        assert_eq!(fresh.newest(&BTreeSet::from([0, 1]))[&eu].applied, at(10));
        fresh.taken(2, BTreeMap::from([(eu.clone(), at(4))]), 12_000_000_000);
        let taken = fresh.of(2)[&eu];
        assert_eq!((taken.applied, taken.lag), (at(4), Duration::from_secs(8)));
        assert_eq!(fresh.newest(&BTreeSet::from([1, 2]))[&eu].applied, at(4));
    }

    /// Every partition heard from since the oldest of their newest heartbeats; nothing
    /// until each partition has been heard from once.
    #[test]
    fn a_remote_is_heard_from_all_since_its_oldest_partitions_heartbeat() {
        let remote = RemoteProgress::new(
            RemoteConfig {
                region: RegionId::new("eu-west-1").unwrap(),
                topic: "eu-west-1.geostate.deltas".into(),
                bootstrap: "127.0.0.1:9092".into(),
            },
            BTreeMap::new(),
        );
        assert_eq!(remote.heard_from_all_since(), None);
        remote.partitions.send_replace(vec![0, 1]);
        remote.heartbeats.lock().unwrap().insert(0, 9);
        assert_eq!(remote.heard_from_all_since(), None);
        remote.heartbeats.lock().unwrap().insert(1, 7);
        assert_eq!(remote.heard_from_all_since(), Some(7));
    }
}
