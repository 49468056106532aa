//! Update records: decoding (JSON or protobuf), checking against the namespaces, and the
//! reasons a record is refused. Pure.

use prost::Message;
use serde::{Deserialize, Serialize};

use crate::clock::HlcTimestamp;
use crate::config::{IngestConfig, Namespace, Namespaces, Ownership, RecordFormat};
use crate::crdt::CrdtType;
use crate::pb;

/// One write, as it travels through `geostate.updates`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Update {
    pub key: String,
    pub op: Op,
    /// Optional idempotency id.
    pub id: Option<String>,
    /// Optional event time, milliseconds since the Unix epoch.
    pub event_time_ms: Option<u64>,
    /// The register write's clock when the write entered the log (gRPC path); `None` for
    /// external producers, whose stamp derives from the Kafka record.
    pub hlc: Option<HlcTimestamp>,
    /// Owned namespaces: the fencing epoch of the writer's lease on the key's shard.
    pub epoch: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    Add(i64),
    Set(Vec<u8>),
    /// Owned registers: write `value` if the current value is `expected` (`None`: never
    /// set), decided when the record is applied.
    Cas {
        expected: Option<Vec<u8>>,
        value: Vec<u8>,
    },
}

impl Op {
    fn name(&self) -> &'static str {
        match self {
            Op::Add(_) => "add",
            Op::Set(_) => "set",
            Op::Cas { .. } => "cas",
        }
    }
}

/// Why a record is not applied. Its [`Rejection::code`] labels the dead-letter header and
/// the metric; its `Display` is the human-readable reason.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    #[error("malformed record: {0}")]
    Malformed(String),
    #[error("key {key:?} is in no namespace")]
    NoNamespace { key: String },
    #[error("`{op}` does not apply to {key:?}, a {crdt}")]
    WrongOp {
        key: String,
        op: &'static str,
        crdt: CrdtType,
    },
    #[error("a g_counter increment must be greater than zero, got {n}")]
    NonPositiveIncrement { n: i64 },
    #[error("key is {len} bytes, more than the {max} allowed")]
    KeyTooLong { len: usize, max: usize },
    #[error("value is {len} bytes, more than the {max} allowed")]
    ValueTooLarge { len: usize, max: usize },
    #[error("idempotency id is {len} bytes, more than the {max} allowed")]
    IdTooLong { len: usize, max: usize },
    #[error(
        "{key:?} is in an owned namespace: owned writes carry their lease epoch, so they go through the gRPC API of the region holding the key's lease"
    )]
    OwnedWithoutLease { key: String },
    #[error(
        "{key:?} was written at epoch {epoch}, below epoch {highest} already applied for its shard: a newer lease holder owns it"
    )]
    Fenced {
        key: String,
        epoch: u64,
        highest: u64,
    },
    #[error(
        "{key:?} names lease epoch {epoch} of shard {shard}, and the lease group has granted that shard up to epoch {granted} only: an epoch comes from a lease, never from the writer"
    )]
    EpochNotGranted {
        key: String,
        shard: u32,
        epoch: u64,
        granted: u64,
    },
    #[error(
        "stamp {stamp} is more than max-clock-offset ({max:?}) ahead of the record's Kafka timestamp ({written_ms} ms): a writer may not choose a stamp beyond that"
    )]
    StampAhead {
        stamp: HlcTimestamp,
        written_ms: i64,
        max: std::time::Duration,
    },
    #[error(
        "{key:?} is on partition {partition}, and its key hashes to partition {home}: its producer does not partition keys like the Java client (set librdkafka's partitioner to murmur2_random, and the record's key to the state key); the key's state is kept in its own partition"
    )]
    Misrouted {
        key: String,
        partition: i32,
        home: i32,
    },
    #[error(
        "{key:?} has event time {event_time_ms} ms, more than max-clock-offset ({max:?}) ahead of its record's Kafka timestamp ({written_ms} ms): a clock ahead, or a time in the wrong unit, would close its partition's windows early; refused, so the watermark stays"
    )]
    EventTimeAhead {
        key: String,
        event_time_ms: u64,
        written_ms: i64,
        max: std::time::Duration,
    },
    #[error("counter would overflow: {0}")]
    Overflow(String),
    #[error("{key:?} is in a windowed namespace, whose keys may not contain NUL")]
    NulInWindowedKey { key: String },
    #[error(
        "{key:?} is in a windowed namespace and the write has an idempotency id but no event time: a retry would take its time from a new Kafka timestamp, count in another window and apply twice; set event_time"
    )]
    IdWithoutEventTime { key: String },
    #[error(
        "{key:?} is in a windowed namespace and the record has neither an event time nor a Kafka timestamp"
    )]
    NoEventTime { key: String },
    /// Not bad input: an event whose window this region closed. Kept in the late topic,
    /// never applied.
    #[error(
        "{key:?} at event time {event_time_ms} ms is late: the partition's watermark is {watermark_ms} ms, and its window closed at {closed_at_ms} ms"
    )]
    Late {
        key: String,
        event_time_ms: u64,
        watermark_ms: u64,
        closed_at_ms: u64,
    },
    #[error(
        "compare-and-set needs an owned namespace: {key:?} is shared, where two regions could both succeed"
    )]
    CasOnShared { key: String },
    #[error(
        "{key:?} outputs its changes, so its value must be a window result, JSON {{\"start_ms\": .., \"end_ms\": .., \"value\": <number>}}: {why}"
    )]
    NotAWindowResult { key: String, why: String },
    /// Not bad input: the outcome of a compare-and-set whose comparison failed. Answered to
    /// the caller, never dead-lettered.
    #[error("compare failed: {key:?} is {}", current.as_deref().map_or("not set".to_string(), |v| format!("{v:?}")))]
    CompareFailed {
        key: String,
        current: Option<String>,
    },
}

impl Rejection {
    /// Every [`Self::code`] a record can be dead-lettered with (all but `compare_failed`).
    pub const DEAD_LETTER_CODES: [&'static str; 20] = [
        "malformed",
        "no_namespace",
        "wrong_op",
        "non_positive_increment",
        "key_too_long",
        "value_too_large",
        "id_too_long",
        "owned_without_lease",
        "fenced",
        "epoch_not_granted",
        "misrouted",
        "overflow",
        "nul_in_windowed_key",
        "id_without_event_time",
        "no_event_time",
        "late",
        "cas_on_shared",
        "not_a_window_result",
        "stamp_ahead",
        "event_time_ahead",
    ];

    pub fn code(&self) -> &'static str {
        match self {
            Rejection::Malformed(_) => "malformed",
            Rejection::NoNamespace { .. } => "no_namespace",
            Rejection::WrongOp { .. } => "wrong_op",
            Rejection::NonPositiveIncrement { .. } => "non_positive_increment",
            Rejection::KeyTooLong { .. } => "key_too_long",
            Rejection::ValueTooLarge { .. } => "value_too_large",
            Rejection::IdTooLong { .. } => "id_too_long",
            Rejection::OwnedWithoutLease { .. } => "owned_without_lease",
            Rejection::Fenced { .. } => "fenced",
            Rejection::EpochNotGranted { .. } => "epoch_not_granted",
            Rejection::Misrouted { .. } => "misrouted",
            Rejection::Overflow(_) => "overflow",
            Rejection::NulInWindowedKey { .. } => "nul_in_windowed_key",
            Rejection::IdWithoutEventTime { .. } => "id_without_event_time",
            Rejection::NoEventTime { .. } => "no_event_time",
            Rejection::Late { .. } => "late",
            Rejection::CasOnShared { .. } => "cas_on_shared",
            Rejection::NotAWindowResult { .. } => "not_a_window_result",
            Rejection::StampAhead { .. } => "stamp_ahead",
            Rejection::EventTimeAhead { .. } => "event_time_ahead",
            Rejection::CompareFailed { .. } => "compare_failed",
        }
    }
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonUpdate {
    key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    add: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    set: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cas: Option<JsonCas>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    event_time: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    hlc: Option<HlcTimestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    epoch: Option<u64>,
}

/// `{"expected": "old" | null, "value": "new"}`: `null` expects a register never set.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonCas {
    expected: Option<String>,
    value: String,
}

impl Update {
    pub fn decode(format: RecordFormat, bytes: &[u8]) -> Result<Update, Rejection> {
        match format {
            RecordFormat::Json => Self::decode_json(bytes),
            RecordFormat::Protobuf => Self::decode_protobuf(bytes),
        }
    }

    pub fn encode(&self, format: RecordFormat) -> Vec<u8> {
        match format {
            RecordFormat::Json => self.encode_json(),
            RecordFormat::Protobuf => self.encode_protobuf(),
        }
    }

    fn decode_json(bytes: &[u8]) -> Result<Update, Rejection> {
        let raw: JsonUpdate =
            serde_json::from_slice(bytes).map_err(|e| Rejection::Malformed(e.to_string()))?;
        let op = match (raw.add, raw.set, raw.cas) {
            (Some(n), None, None) => Op::Add(n),
            (None, Some(v), None) => Op::Set(v.into_bytes()),
            (None, None, Some(c)) => Op::Cas {
                expected: c.expected.map(String::into_bytes),
                value: c.value.into_bytes(),
            },
            _ => {
                return Err(Rejection::Malformed(
                    "exactly one of `add`, `set` or `cas` is required".into(),
                ));
            }
        };
        Ok(Update {
            key: raw.key,
            op,
            id: raw.id,
            // 0 is no event time, as in the protobuf format and the gRPC API (where it
            // cannot be told from unset): the record's Kafka timestamp counts instead
            event_time_ms: raw.event_time.filter(|&t| t != 0),
            hlc: raw.hlc,
            epoch: raw.epoch,
        })
    }

    fn encode_json(&self) -> Vec<u8> {
        // JSON records carry register values as text; binary values use protobuf.
        let text = |v: &[u8]| String::from_utf8_lossy(v).into_owned();
        let (add, set, cas) = match &self.op {
            Op::Add(n) => (Some(*n), None, None),
            Op::Set(v) => (None, Some(text(v)), None),
            Op::Cas { expected, value } => (
                None,
                None,
                Some(JsonCas {
                    expected: expected.as_deref().map(text),
                    value: text(value),
                }),
            ),
        };
        let raw = JsonUpdate {
            key: self.key.clone(),
            add,
            set,
            cas,
            id: self.id.clone(),
            event_time: self.event_time_ms,
            hlc: self.hlc,
            epoch: self.epoch,
        };
        serde_json::to_vec(&raw).unwrap_or_default()
    }

    fn decode_protobuf(bytes: &[u8]) -> Result<Update, Rejection> {
        let raw = pb::Update::decode(bytes).map_err(|e| Rejection::Malformed(e.to_string()))?;
        let op = match raw.op {
            Some(pb::update::Op::Add(n)) => Op::Add(n),
            Some(pb::update::Op::Set(v)) => Op::Set(v),
            Some(pb::update::Op::Cas(c)) => Op::Cas {
                expected: c.expected,
                value: c.value,
            },
            None => {
                return Err(Rejection::Malformed(
                    "exactly one of `add`, `set` or `cas` is required".into(),
                ));
            }
        };
        Ok(Update {
            key: raw.key,
            op,
            id: (!raw.id.is_empty()).then_some(raw.id),
            event_time_ms: (raw.event_time_ms != 0).then_some(raw.event_time_ms),
            hlc: raw.hlc.map(|h| HlcTimestamp::new(h.wall_nanos, h.logical)),
            epoch: (raw.epoch != 0).then_some(raw.epoch),
        })
    }

    fn encode_protobuf(&self) -> Vec<u8> {
        pb::Update {
            key: self.key.clone(),
            op: Some(match &self.op {
                Op::Add(n) => pb::update::Op::Add(*n),
                Op::Set(v) => pb::update::Op::Set(v.clone()),
                Op::Cas { expected, value } => pb::update::Op::Cas(pb::CompareAndSet {
                    expected: expected.clone(),
                    value: value.clone(),
                }),
            }),
            id: self.id.clone().unwrap_or_default(),
            event_time_ms: self.event_time_ms.unwrap_or_default(),
            hlc: self.hlc.map(|h| pb::HlcTimestamp {
                wall_nanos: h.wall_nanos,
                logical: h.logical,
            }),
            epoch: self.epoch.unwrap_or_default(),
        }
        .encode_to_vec()
    }

    /// Checks the update against the namespaces and limits: the namespace it belongs to,
    /// or why it cannot be applied.
    pub fn check<'a>(
        &self,
        namespaces: &'a Namespaces,
        limits: &IngestConfig,
    ) -> Result<&'a Namespace, Rejection> {
        if self.key.len() > limits.max_key_bytes {
            return Err(Rejection::KeyTooLong {
                len: self.key.len(),
                max: limits.max_key_bytes,
            });
        }
        // a longer id would be cut when stored, and a retry carrying it applied twice
        if let Some(id) = self.id.as_ref().filter(|id| id.len() > limits.max_id_bytes) {
            return Err(Rejection::IdTooLong {
                len: id.len(),
                max: limits.max_id_bytes,
            });
        }
        let ns = namespaces
            .lookup(&self.key)
            .ok_or_else(|| Rejection::NoNamespace {
                key: self.key.clone(),
            })?;
        match (&self.op, ns.crdt) {
            (Op::Add(n), CrdtType::GCounter) if *n <= 0 => {
                return Err(Rejection::NonPositiveIncrement { n: *n });
            }
            (Op::Add(_), CrdtType::GCounter | CrdtType::PnCounter) => {}
            (Op::Cas { .. }, CrdtType::LwwRegister) if ns.ownership != Ownership::Owned => {
                return Err(Rejection::CasOnShared {
                    key: self.key.clone(),
                });
            }
            (Op::Set(v) | Op::Cas { value: v, .. }, CrdtType::LwwRegister) => {
                if v.len() > limits.max_value_bytes {
                    return Err(Rejection::ValueTooLarge {
                        len: v.len(),
                        max: limits.max_value_bytes,
                    });
                }
                if ns.outputs_register_changes
                    && let Err(why) = geostate_proto::outputs::WindowResult::parse(v)
                {
                    let key = self.key.clone();
                    return Err(Rejection::NotAWindowResult { key, why });
                }
            }
            (op, crdt) => {
                return Err(Rejection::WrongOp {
                    key: self.key.clone(),
                    op: op.name(),
                    crdt,
                });
            }
        }
        if ns.ownership == Ownership::Owned && self.epoch.is_none() {
            return Err(Rejection::OwnedWithoutLease {
                key: self.key.clone(),
            });
        }
        if ns.window.is_some() {
            let key = self.key.clone();
            if self.key.contains(crate::window::SLICE_SEP) {
                return Err(Rejection::NulInWindowedKey { key });
            }
            if self.id.is_some() && self.event_time_ms.is_none() {
                return Err(Rejection::IdWithoutEventTime { key });
            }
        }
        Ok(ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn config() -> Config {
        let path = crate::repo_file("regions/us-east-1.toml");
        Config::load(&path).unwrap()
    }

    fn check(json: &str) -> Result<CrdtType, Rejection> {
        let c = config();
        let u = Update::decode(RecordFormat::Json, json.as_bytes())?;
        u.check(&c.namespaces, &c.ingest).map(|ns| ns.crdt)
    }

    #[test]
    fn good_records_find_their_namespace() {
        assert_eq!(
            check(r#"{"key":"drivers/9q8yy","add":-3}"#),
            Ok(CrdtType::PnCounter)
        );
        assert_eq!(
            check(r#"{"key":"trips/9q8yy","add":1,"id":"r-1","event_time":17}"#),
            Ok(CrdtType::GCounter)
        );
        assert_eq!(
            check(r#"{"key":"zones/9q8yy","set":"downtown"}"#),
            Ok(CrdtType::LwwRegister)
        );
    }

    #[test]
    fn bad_records_say_why() {
        let code = |json: &str| check(json).unwrap_err().code();
        assert_eq!(code("{not json"), "malformed");
        assert_eq!(code(r#"{"key":"drivers/x"}"#), "malformed");
        assert_eq!(
            code(r#"{"key":"drivers/x","add":1,"set":"y"}"#),
            "malformed"
        );
        assert_eq!(code(r#"{"key":"drivers/x","ad":1}"#), "malformed");
        assert_eq!(code(r#"{"key":"nowhere/x","add":1}"#), "no_namespace");
        assert_eq!(code(r#"{"key":"trips/x","set":"1"}"#), "wrong_op");
        assert_eq!(code(r#"{"key":"zones/x","add":1}"#), "wrong_op");
        assert_eq!(
            code(r#"{"key":"trips/x","add":0}"#),
            "non_positive_increment"
        );
        assert_eq!(
            code(r#"{"key":"surge/x","set":"1.8"}"#),
            "owned_without_lease"
        );
        assert_eq!(
            code(r#"{"key":"zones/x","cas":{"expected":null,"value":"y"}}"#),
            "cas_on_shared"
        );
        assert_eq!(
            code(r#"{"key":"zones/x","set":"y","cas":{"expected":null,"value":"y"}}"#),
            "malformed"
        );
        let big = format!(r#"{{"key":"zones/x","set":"{}"}}"#, "x".repeat(70_000));
        assert_eq!(code(&big), "value_too_large");
        let long = format!(r#"{{"key":"zones/{}","set":"x"}}"#, "k".repeat(2_000));
        assert_eq!(code(&long), "key_too_long");
        // an id longer than any stored one (a retry of it would apply twice) is refused;
        // one at the limit passes
        let id = |len: usize| {
            format!(
                r#"{{"key":"drivers/x","add":1,"id":"{}"}}"#,
                "i".repeat(len)
            )
        };
        assert_eq!(code(&id(70_000)), "id_too_long");
        assert_eq!(code(&id(257)), "id_too_long");
        assert_eq!(check(&id(256)), Ok(CrdtType::PnCounter));
    }

    #[test]
    fn both_formats_round_trip() {
        let u = Update {
            key: "zones/9q8yy".into(),
            op: Op::Set(b"downtown".to_vec()),
            id: Some("w-1".into()),
            event_time_ms: Some(42),
            hlc: Some(HlcTimestamp::new(7, 1)),
            epoch: Some(3),
        };
        let cas = |expected: Option<&[u8]>| Update {
            key: "surge/9q8yy".into(),
            op: Op::Cas {
                expected: expected.map(<[u8]>::to_vec),
                value: b"1.8".to_vec(),
            },
            ..u.clone()
        };
        for format in [RecordFormat::Json, RecordFormat::Protobuf] {
            for u in [u.clone(), cas(None), cas(Some(b"")), cas(Some(b"1.2"))] {
                assert_eq!(Update::decode(format, &u.encode(format)).unwrap(), u);
            }
        }
        assert!(Update::decode(RecordFormat::Protobuf, b"\xff\xff").is_err());
    }
}
