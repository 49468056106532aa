//! The clock offset check (CockroachDB's rule). A lease is exclusive only while the
//! members' wall clocks are within `max-clock-offset` of each other: a region whose clock
//! runs ahead would judge another region's lease ended early and take the shard while the
//! holder still writes. So every region reads the other members' clocks (`LeaseRaft/Clock`)
//! and, while its own clock is off from most of those it reached by more than
//! [`SHARE`] of the bound, proposes no lease command and writes no owned key.
//!
//! A reading is Cristian's: the peer's clock against the middle of the local request's
//! round trip, give or take half the round trip; a peer counts as off only if the offset
//! is beyond the threshold by more than that uncertainty.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tonic::Request;

use super::network::Channels;
use crate::clock::Clock;
use crate::pb;
use crate::pb::lease_raft_client::LeaseRaftClient;

/// The share of `max-clock-offset` a member's clock may be off before it stops (as
/// CockroachDB's 80 %).
pub const SHARE: f64 = 0.8;
/// A reading older than this is not used.
const FRESH: Duration = Duration::from_secs(3);
/// Longest a reading's round trip may take.
const TIMEOUT: Duration = Duration::from_millis(500);

/// One peer's clock as read from here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reading {
    /// Peer minus local, nanoseconds.
    pub offset: i64,
    /// Half the round trip, nanoseconds.
    pub uncertainty: u64,
}

impl Reading {
    fn off(&self, threshold: u64) -> bool {
        self.offset.unsigned_abs().saturating_sub(self.uncertainty) > threshold
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// No fresh reading of any peer: not known to be safe.
    Unknown,
    Within,
    /// Off from more than half of the peers read; the readings, peer id → offset (ns).
    Off(BTreeMap<u64, i64>),
}

/// Judges the fresh readings: off when more than half of them are off.
pub fn judge(readings: &BTreeMap<u64, Reading>, threshold: u64) -> Verdict {
    if readings.is_empty() {
        return Verdict::Unknown;
    }
    let off = readings.values().filter(|r| r.off(threshold)).count();
    if 2 * off > readings.len() {
        Verdict::Off(readings.iter().map(|(id, r)| (*id, r.offset)).collect())
    } else {
        Verdict::Within
    }
}

/// Reads the other members' clocks and keeps the latest reading of each.
pub struct ClockCheck {
    /// Member id → its Raft address.
    peers: BTreeMap<u64, String>,
    threshold: u64,
    channels: Channels,
    readings: Mutex<BTreeMap<u64, (Reading, Instant)>>,
    /// This member's wall clock.
    wall: Arc<dyn Clock>,
}

impl ClockCheck {
    pub fn new(
        peers: BTreeMap<u64, String>,
        max_clock_offset: Duration,
        wall: Arc<dyn Clock>,
        channels: Channels,
    ) -> Self {
        Self {
            wall,
            peers,
            threshold: (max_clock_offset.as_nanos() as f64 * SHARE) as u64,
            channels,
            readings: Mutex::default(),
        }
    }

    /// Reads every peer's clock once; an unreachable peer keeps its older reading until
    /// that goes stale.
    pub async fn probe(&self) {
        for (&id, addr) in &self.peers {
            if let Some(r) = self.read(addr).await {
                metrics::gauge!(crate::metrics::CLOCK_OFFSET, "member" => id.to_string())
                    .set(r.offset as f64 / 1e9);
                let mut readings = self.readings.lock().unwrap_or_else(|p| p.into_inner());
                readings.insert(id, (r, Instant::now()));
            }
        }
    }

    async fn read(&self, addr: &str) -> Option<Reading> {
        let mut client = LeaseRaftClient::new(self.channels.get(addr).ok()?);
        let mut request = Request::new(pb::ClockReading::default());
        request.set_timeout(TIMEOUT);
        let (sent, started) = (self.wall.now_nanos(), Instant::now());
        let peer = client.clock(request).await.ok()?.into_inner().wall_nanos;
        let round_trip = started.elapsed().as_nanos() as u64;
        let middle = sent.saturating_add(round_trip / 2);
        Some(Reading {
            // whatever a peer answers: no overflow
            offset: i64::try_from(i128::from(peer) - i128::from(middle))
                .unwrap_or(if peer > middle { i64::MAX } else { i64::MIN }),
            uncertainty: round_trip / 2,
        })
    }

    /// The verdict on the fresh readings.
    pub fn verdict(&self) -> Verdict {
        judge(&self.fresh(), self.threshold)
    }

    /// The latest reading of each peer, if it is fresh: member id → reading.
    pub fn fresh(&self) -> BTreeMap<u64, Reading> {
        let readings = self.readings.lock().unwrap_or_else(|p| p.into_inner());
        readings
            .iter()
            .filter(|(_, (_, at))| at.elapsed() < FRESH)
            .map(|(id, (r, _))| (*id, *r))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: i64 = 1_000_000;

    fn readings(offsets: &[(u64, i64, u64)]) -> BTreeMap<u64, Reading> {
        offsets
            .iter()
            .map(|&(id, offset, uncertainty)| {
                (
                    id,
                    Reading {
                        offset,
                        uncertainty,
                    },
                )
            })
            .collect()
    }

    #[test]
    fn a_member_off_from_most_peers_is_off_and_one_off_peer_does_not_condemn_the_others() {
        let threshold = 400 * MS as u64;
        assert_eq!(judge(&BTreeMap::new(), threshold), Verdict::Unknown);
        // both peers see this member 2 s ahead (their clocks 2 s behind)
        let skewed = readings(&[(2, -2000 * MS, MS as u64), (3, -2000 * MS, MS as u64)]);
        assert!(matches!(judge(&skewed, threshold), Verdict::Off(_)));
        // a healthy member: one peer (the skewed one) off, the witness fine
        let healthy = readings(&[(1, 2000 * MS, MS as u64), (3, 5 * MS, MS as u64)]);
        assert_eq!(judge(&healthy, threshold), Verdict::Within);
        // within the bound, or beyond it only by less than the round trip's uncertainty
        let within = readings(&[(2, 300 * MS, MS as u64), (3, -390 * MS, 0)]);
        assert_eq!(judge(&within, threshold), Verdict::Within);
        let unsure = readings(&[(2, 450 * MS, 60 * MS as u64)]);
        assert_eq!(judge(&unsure, threshold), Verdict::Within);
        // the only peer it can reach is off: off (safety before availability)
        let alone = readings(&[(2, 900 * MS, MS as u64)]);
        assert!(matches!(judge(&alone, threshold), Verdict::Off(_)));
    }
}
