//! Domain ⇄ protobuf conversions for the API.

use crate::clock::HlcTimestamp;
use crate::crdt::{CrdtType, CrdtValue, OrderStamp};
use crate::pb;

use super::error::ApiError;

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

/// The API view of a key's state; `None` state reads as a zero counter or, for a
/// register, NOT_FOUND.
pub fn value(key: &str, crdt: CrdtType, state: Option<&CrdtValue>) -> Result<pb::Value, ApiError> {
    let counter = |v: i128| {
        i64::try_from(v).map_err(|_| ApiError::OutOfRange {
            value: v.to_string(),
        })
    };
    let (value, stamp_pb) = match (crdt, state) {
        (CrdtType::GCounter | CrdtType::PnCounter, None) => (pb::value::Value::Counter(0), None),
        (_, Some(CrdtValue::GCounter(c))) => (
            pb::value::Value::Counter(counter(i128::try_from(c.value()).unwrap_or(i128::MAX))?),
            None,
        ),
        (_, Some(CrdtValue::PnCounter(c))) => {
            (pb::value::Value::Counter(counter(c.value())?), None)
        }
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
        }),
        stamp: stamp_pb,
    })
}
