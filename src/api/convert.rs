//! Domain ⇄ protobuf conversions for the API.

use crate::clock::HlcTimestamp;
use crate::crdt::{CrdtType, CrdtValue, OrderStamp};
use crate::ingest::event::{Op, Update};
use crate::pb;

use super::error::ApiError;

/// A client's write as the log's record (not stamped yet: no clock, no epoch).
pub fn update_from_pb(req: pb::UpdateRequest) -> Result<Update, ApiError> {
    let op = match req.op {
        Some(pb::update_request::Op::Add(n)) => Op::Add(n),
        Some(pb::update_request::Op::Set(v)) => Op::Set(v),
        Some(pb::update_request::Op::Cas(c)) => Op::Cas {
            expected: c.expected,
            value: c.value,
        },
        None => {
            return Err(ApiError::InvalidArgument(
                "one of `add`, `set` or `cas` is required".into(),
            ));
        }
    };
    Ok(Update {
        key: req.key,
        op,
        id: (!req.id.is_empty()).then_some(req.id),
        event_time_ms: (req.event_time_ms != 0).then_some(req.event_time_ms),
        hlc: None,
        epoch: None,
    })
}

/// The client's request an unstamped write came from (to forward it).
pub fn update_to_pb(update: Update) -> pb::UpdateRequest {
    pb::UpdateRequest {
        key: update.key,
        op: Some(match update.op {
            Op::Add(n) => pb::update_request::Op::Add(n),
            Op::Set(v) => pb::update_request::Op::Set(v),
            Op::Cas { expected, value } => {
                pb::update_request::Op::Cas(pb::CompareAndSet { expected, value })
            }
        }),
        id: update.id.unwrap_or_default(),
        event_time_ms: update.event_time_ms.unwrap_or_default(),
    }
}

pub fn stamp(s: &OrderStamp) -> pb::OrderStamp {
    pb::OrderStamp {
        epoch: s.epoch,
        hlc: Some(hlc(s.hlc)),
        origin: s.origin.to_string(),
    }
}

pub fn hlc(ts: HlcTimestamp) -> pb::HlcTimestamp {
    pb::HlcTimestamp {
        wall_nanos: ts.wall_nanos,
        logical: ts.logical,
    }
}

pub fn kind(t: CrdtType) -> pb::CrdtKind {
    match t {
        CrdtType::GCounter => pb::CrdtKind::GCounter,
        CrdtType::PnCounter => pb::CrdtKind::PnCounter,
        CrdtType::LwwRegister => pb::CrdtKind::LwwRegister,
    }
}

/// A counter's value in int64, and whether it was cut to an int64 bound.
fn counter_of(v: i128) -> (pb::value::Value, bool) {
    let clamped = v.clamp(i128::from(i64::MIN), i128::from(i64::MAX));
    (pb::value::Value::Counter(clamped as i64), clamped != v)
}

/// The API view of a windowed counter's window: the sum of its slices, `total`.
pub fn window_value(key: &str, crdt: CrdtType, total: i128, window: pb::WindowInfo) -> pb::Value {
    let (value, saturated) = counter_of(total);
    pb::Value {
        key: key.to_owned(),
        kind: kind(crdt) as i32,
        value: Some(value),
        freshness: Some(pb::Freshness::default()),
        stamp: None,
        saturated,
        window: Some(window),
    }
}

/// The API view of a key's state; `None` state reads as a zero counter or, for a
/// register, NOT_FOUND.
pub fn value(key: &str, crdt: CrdtType, state: Option<&CrdtValue>) -> Result<pb::Value, ApiError> {
    let mut saturated = false;
    let mut counter = |v: i128| {
        let (value, cut) = counter_of(v);
        saturated = cut;
        value
    };
    let (value, stamp_pb) = match (crdt, state) {
        (CrdtType::GCounter | CrdtType::PnCounter, None) => (pb::value::Value::Counter(0), None),
        (_, Some(CrdtValue::GCounter(c))) => (
            counter(i128::try_from(c.value()).unwrap_or(i128::MAX)),
            None,
        ),
        (_, Some(CrdtValue::PnCounter(c))) => (counter(c.value()), None),
        (_, Some(CrdtValue::LwwRegister(r))) => (
            pb::value::Value::Register(r.value().to_vec()),
            Some(stamp(r.stamp())),
        ),
        (CrdtType::LwwRegister, None) => {
            return Err(ApiError::NotFound {
                key: key.to_owned(),
            });
        }
    };
    let crdt = state.map(CrdtValue::crdt_type).unwrap_or(crdt);
    Ok(pb::Value {
        key: key.to_owned(),
        kind: kind(crdt) as i32,
        value: Some(value),
        freshness: Some(pb::Freshness {
            remotes: Vec::new(),
            epoch: stamp_pb.as_ref().map(|s| s.epoch).unwrap_or(0),
            copy: None,
        }),
        stamp: stamp_pb,
        saturated,
        window: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RecordFormat;
    use crate::crdt::{Actor, GCounter, PnCounter, RegionId};

    fn actor(region: &str) -> Actor {
        Actor::new(RegionId::new(region).unwrap(), 1)
    }

    /// A client's event time goes into the log record (both formats), and a forwarded
    /// write keeps it; 0 is none.
    #[test]
    fn an_update_requests_event_time_is_carried_into_the_log_record() {
        let request = |event_time_ms| pb::UpdateRequest {
            key: "trips/9q8yy".into(),
            op: Some(pb::update_request::Op::Add(1)),
            id: "r-1".into(),
            event_time_ms,
        };
        let update = update_from_pb(request(1_700_000_000_123)).unwrap();
        assert_eq!(update.event_time_ms, Some(1_700_000_000_123));
        for format in [RecordFormat::Json, RecordFormat::Protobuf] {
            let logged = Update::decode(format, &update.encode(format)).unwrap();
            assert_eq!(logged.event_time_ms, Some(1_700_000_000_123), "{format:?}");
        }
        assert_eq!(update_to_pb(update), request(1_700_000_000_123));
        assert_eq!(update_from_pb(request(0)).unwrap().event_time_ms, None);
    }

    #[test]
    fn counters_whose_parts_add_up_beyond_int64_read_saturated_and_flagged() {
        let pn = |parts: [(&str, i64); 2]| {
            let mut c = PnCounter::new();
            for (region, n) in parts {
                c.add(&actor(region), n).unwrap();
            }
            CrdtValue::PnCounter(c)
        };
        let mut g = GCounter::new();
        g.increment(&actor("us-east-1"), i64::MAX as u64).unwrap();
        g.increment(&actor("eu-west-1"), 1).unwrap();
        let cases = [
            (
                pn([("us-east-1", i64::MAX), ("eu-west-1", i64::MAX)]),
                i64::MAX,
                true,
            ),
            (
                pn([("us-east-1", i64::MIN), ("eu-west-1", -5)]),
                i64::MIN,
                true,
            ),
            (CrdtValue::GCounter(g), i64::MAX, true),
            (pn([("us-east-1", -3), ("eu-west-1", 0)]), -3, false),
        ];
        for (state, reads, saturated) in cases {
            let v = value("drivers/a", state.crdt_type(), Some(&state)).unwrap();
            assert_eq!(v.value, Some(pb::value::Value::Counter(reads)), "{state:?}");
            assert_eq!(v.saturated, saturated, "{state:?}");
        }
    }
}
