//! Protobuf encodings (`proto/geostate/v1/crdt.proto`) of CRDT state and of replication
//! deltas. Decoding validates everything it reads: a malformed record is an error that
//! names what is wrong, never a panic and never a silently defaulted field.

use prost::Message;

use super::{Actor, CrdtValue, GCounter, LwwRegister, OrderStamp, PnCounter, PnEntry, RegionId};
use crate::clock::HlcTimestamp;
use crate::pb;

/// One replication record: the origin region's own part of a key's state after a batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delta {
    pub key: String,
    pub origin: RegionId,
    pub state: CrdtValue,
    /// The origin's HLC when it applied the batch; replication lag is measured from here.
    pub origin_time: HlcTimestamp,
    /// The origin's lease epoch for an owned key; 0 for a shared key.
    pub epoch: u64,
    /// The key's idempotency window at the origin after the batch, oldest first (kept by
    /// a copy of the origin's own partition only).
    pub recent_ids: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("not a valid protobuf {message}: {source}")]
    Protobuf {
        message: &'static str,
        source: prost::DecodeError,
    },
    #[error("field `{field}` is missing")]
    Missing { field: &'static str },
    #[error("field `{field}` is invalid: {reason}")]
    Invalid { field: &'static str, reason: String },
}

impl Delta {
    pub fn encode(&self) -> Vec<u8> {
        pb::Delta {
            key: self.key.clone(),
            origin: self.origin.to_string(),
            state: Some(encode_state(&self.state)),
            origin_time: Some(hlc_to_pb(self.origin_time)),
            epoch: self.epoch,
            recent_ids: self.recent_ids.clone(),
        }
        .encode_to_vec()
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let raw = pb::Delta::decode(bytes).map_err(|source| DecodeError::Protobuf {
            message: "Delta",
            source,
        })?;
        Ok(Delta {
            origin: region(raw.origin, "origin")?,
            state: state_from_pb(raw.state.ok_or(DecodeError::Missing { field: "state" })?)?,
            origin_time: hlc_from_pb(raw.origin_time.ok_or(DecodeError::Missing {
                field: "origin_time",
            })?),
            epoch: raw.epoch,
            key: raw.key,
            recent_ids: raw.recent_ids,
        })
    }
}

/// What a region's shipped deltas cover (`proto/geostate/v1/crdt.proto`, `ResumePoint`):
/// written as the last record of every shipping transaction under [`RESUME_KEY`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResumePoint {
    pub origin: RegionId,
    pub incarnation: u32,
    pub updates_topic: String,
    /// Last applied offset per partition of `updates_topic`.
    pub updates_offsets: std::collections::BTreeMap<i32, i64>,
    pub hlc_high_water: HlcTimestamp,
    /// Per owned shard and updates partition, the highest lease epoch the region's own
    /// records on that partition applied up to `updates_offsets` (the fence its later
    /// records there are judged by).
    pub fences: std::collections::BTreeMap<(u32, i32), u64>,
    /// Per updates partition, the event-time watermark of its windowed records up to
    /// `updates_offsets` (the one its later records' lateness is judged by).
    pub watermarks: std::collections::BTreeMap<i32, u64>,
    /// Per updates partition, the lowest watermark over the regions through which its
    /// final windows went to the outputs topic (the next round produces those after it).
    pub outputs_through: std::collections::BTreeMap<i32, u64>,
}

/// The record key of resume points on a deltas topic; no state key starts with NUL.
pub const RESUME_KEY: &[u8] = b"\0geostate.resume";

impl ResumePoint {
    pub fn encode(&self) -> Vec<u8> {
        pb::ResumePoint {
            origin: self.origin.to_string(),
            incarnation: self.incarnation,
            updates_topic: self.updates_topic.clone(),
            updates_offsets: self.updates_offsets.iter().map(|(&p, &o)| (p, o)).collect(),
            hlc_high_water: Some(hlc_to_pb(self.hlc_high_water)),
            fences: self
                .fences
                .iter()
                .map(|(&(shard, partition), &epoch)| pb::Fence {
                    shard,
                    partition,
                    epoch,
                })
                .collect(),
            watermarks: self.watermarks.iter().map(|(&p, &w)| (p, w)).collect(),
            outputs_through: self.outputs_through.iter().map(|(&p, &w)| (p, w)).collect(),
        }
        .encode_to_vec()
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let raw = pb::ResumePoint::decode(bytes).map_err(|source| DecodeError::Protobuf {
            message: "ResumePoint",
            source,
        })?;
        Ok(ResumePoint {
            origin: region(raw.origin, "origin")?,
            incarnation: raw.incarnation,
            updates_topic: raw.updates_topic,
            updates_offsets: raw.updates_offsets.into_iter().collect(),
            hlc_high_water: hlc_from_pb(raw.hlc_high_water.ok_or(DecodeError::Missing {
                field: "hlc_high_water",
            })?),
            fences: raw
                .fences
                .into_iter()
                .map(|f| ((f.shard, f.partition), f.epoch))
                .collect(),
            watermarks: raw.watermarks.into_iter().collect(),
            outputs_through: raw.outputs_through.into_iter().collect(),
        })
    }

    /// Takes in a resume point read after this one: per partition the later offset, per
    /// fence and watermark the higher one, the newer clock (each only rises in a partition's history),
    /// the later one's origin, incarnation and topic. Each deltas partition carries the
    /// resume points of its own updates partition, so the newest of a region is the
    /// last of every partition, absorbed.
    pub fn absorb(&mut self, later: ResumePoint) {
        for (p, o) in later.updates_offsets {
            let kept = self.updates_offsets.entry(p).or_insert(o);
            *kept = (*kept).max(o);
        }
        for (id, epoch) in later.fences {
            let kept = self.fences.entry(id).or_insert(epoch);
            *kept = (*kept).max(epoch);
        }
        for (p, w) in later.watermarks {
            let kept = self.watermarks.entry(p).or_insert(w);
            *kept = (*kept).max(w);
        }
        for (p, w) in later.outputs_through {
            let kept = self.outputs_through.entry(p).or_insert(w);
            *kept = (*kept).max(w);
        }
        self.hlc_high_water = self.hlc_high_water.max(later.hlc_high_water);
        self.origin = later.origin;
        self.incarnation = later.incarnation;
        self.updates_topic = later.updates_topic;
    }

    /// `later` absorbed into what `kept` holds so far (or kept as the first).
    pub fn absorb_into(kept: &mut Option<ResumePoint>, later: ResumePoint) {
        match kept {
            Some(kept) => kept.absorb(later),
            None => *kept = Some(later),
        }
    }
}

/// Encodes a key's full state (the RocksDB value format).
pub fn encode_value(value: &CrdtValue) -> Vec<u8> {
    encode_state(value).encode_to_vec()
}

pub fn decode_value(bytes: &[u8]) -> Result<CrdtValue, DecodeError> {
    let raw = pb::CrdtState::decode(bytes).map_err(|source| DecodeError::Protobuf {
        message: "CrdtState",
        source,
    })?;
    state_from_pb(raw)
}

fn encode_state(value: &CrdtValue) -> pb::CrdtState {
    use pb::crdt_state::Kind;
    let kind = match value {
        CrdtValue::GCounter(c) => Kind::GCounter(pb::GCounterState {
            entries: c.entries().map(|(a, n)| entry(a, n)).collect(),
        }),
        CrdtValue::PnCounter(c) => Kind::PnCounter(pb::PnCounterState {
            increments: c
                .entries()
                .filter(|(_, e)| e.increments > 0)
                .map(|(a, e)| entry(a, e.increments))
                .collect(),
            decrements: c
                .entries()
                .filter(|(_, e)| e.decrements > 0)
                .map(|(a, e)| entry(a, e.decrements))
                .collect(),
        }),
        CrdtValue::LwwRegister(r) => Kind::LwwRegister(pb::LwwRegisterState {
            value: r.value().to_vec(),
            stamp: Some(pb::OrderStamp {
                epoch: r.stamp().epoch,
                hlc: Some(hlc_to_pb(r.stamp().hlc)),
                origin: r.stamp().origin.to_string(),
            }),
        }),
    };
    pb::CrdtState { kind: Some(kind) }
}

fn state_from_pb(raw: pb::CrdtState) -> Result<CrdtValue, DecodeError> {
    use pb::crdt_state::Kind;
    match raw.kind.ok_or(DecodeError::Missing { field: "kind" })? {
        Kind::GCounter(g) => Ok(CrdtValue::GCounter(GCounter::from_entries(
            g.entries
                .into_iter()
                .map(entry_from_pb)
                .collect::<Result<Vec<_>, _>>()?,
        ))),
        Kind::PnCounter(pn) => {
            let increments = pn.increments.into_iter().map(|e| {
                entry_from_pb(e).map(|(a, n)| {
                    (
                        a,
                        PnEntry {
                            increments: n,
                            decrements: 0,
                        },
                    )
                })
            });
            let decrements = pn.decrements.into_iter().map(|e| {
                entry_from_pb(e).map(|(a, n)| {
                    (
                        a,
                        PnEntry {
                            increments: 0,
                            decrements: n,
                        },
                    )
                })
            });
            Ok(CrdtValue::PnCounter(PnCounter::from_entries(
                increments
                    .chain(decrements)
                    .collect::<Result<Vec<_>, _>>()?,
            )))
        }
        Kind::LwwRegister(r) => {
            let stamp = r.stamp.ok_or(DecodeError::Missing { field: "stamp" })?;
            let stamp = OrderStamp {
                epoch: stamp.epoch,
                hlc: hlc_from_pb(stamp.hlc.ok_or(DecodeError::Missing { field: "hlc" })?),
                origin: region(stamp.origin, "stamp.origin")?,
            };
            Ok(CrdtValue::LwwRegister(LwwRegister::new(r.value, stamp)))
        }
    }
}

fn entry(actor: &Actor, count: u64) -> pb::CounterEntry {
    pb::CounterEntry {
        actor: Some(pb::Actor {
            region: actor.region.to_string(),
            incarnation: actor.incarnation,
        }),
        count,
    }
}

fn entry_from_pb(e: pb::CounterEntry) -> Result<(Actor, u64), DecodeError> {
    let actor = e.actor.ok_or(DecodeError::Missing { field: "actor" })?;
    Ok((
        Actor::new(region(actor.region, "actor.region")?, actor.incarnation),
        e.count,
    ))
}

fn region(name: String, field: &'static str) -> Result<RegionId, DecodeError> {
    RegionId::new(name).map_err(|e| DecodeError::Invalid {
        field,
        reason: e.to_string(),
    })
}

fn hlc_to_pb(ts: HlcTimestamp) -> pb::HlcTimestamp {
    pb::HlcTimestamp {
        wall_nanos: ts.wall_nanos,
        logical: ts.logical,
    }
}

fn hlc_from_pb(ts: pb::HlcTimestamp) -> HlcTimestamp {
    HlcTimestamp::new(ts.wall_nanos, ts.logical)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(matches!(
            Delta::decode(b"\xff\xff\xff"),
            Err(DecodeError::Protobuf { .. })
        ));
        let no_state = pb::Delta {
            key: "k".into(),
            origin: "us-east-1".into(),
            state: None,
            origin_time: None,
            epoch: 0,
            recent_ids: Vec::new(),
        }
        .encode_to_vec();
        assert_eq!(
            Delta::decode(&no_state),
            Err(DecodeError::Missing { field: "state" })
        );
        let bad_region = pb::Delta {
            key: "k".into(),
            origin: "NOT A REGION".into(),
            state: None,
            origin_time: None,
            epoch: 0,
            recent_ids: Vec::new(),
        }
        .encode_to_vec();
        assert!(matches!(
            Delta::decode(&bad_region),
            Err(DecodeError::Invalid {
                field: "origin",
                ..
            })
        ));
    }

    /// A region's newest resume point is every partition's last, absorbed: an older point
    /// (one region-wide point of an earlier version, or another partition's) never moves
    /// a partition's offset, fence or watermark back.
    #[test]
    fn absorbing_keeps_every_partitions_newest_position() {
        let point =
            |incarnation, offsets: &[(i32, i64)], fences: &[((u32, i32), u64)], wall| ResumePoint {
                origin: RegionId::new("us-east-1").unwrap(),
                incarnation,
                updates_topic: "geostate.updates".into(),
                updates_offsets: offsets.iter().copied().collect(),
                hlc_high_water: HlcTimestamp::new(wall, 0),
                fences: fences.iter().copied().collect(),
                // the watermark rises with the offset in a partition's history
                watermarks: offsets
                    .iter()
                    .map(|&(p, o)| (p, o as u64 * 1_000))
                    .collect(),
                // and what went out behind it
                outputs_through: offsets
                    .iter()
                    .map(|&(p, o)| (p, o as u64 * 1_000 - 500))
                    .collect(),
            };
        let mut newest = point(1, &[(0, 10), (1, 20)], &[((5, 0), 3), ((5, 1), 4)], 9);
        newest.absorb(point(2, &[(1, 15)], &[((5, 1), 2)], 7));
        newest.absorb(point(2, &[(0, 12)], &[((5, 0), 6)], 8));
        assert_eq!(
            newest,
            point(2, &[(0, 12), (1, 20)], &[((5, 0), 6), ((5, 1), 4)], 9)
        );
    }
}
