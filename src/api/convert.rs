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
    let mut saturated = false;
    let mut counter = |v: i128| {
        let clamped = v.clamp(i128::from(i64::MIN), i128::from(i64::MAX));
        saturated = clamped != v;
        pb::value::Value::Counter(clamped as i64)
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
        }),
        stamp: stamp_pb,
        saturated,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crdt::{Actor, GCounter, PnCounter, RegionId};

    fn actor(region: &str) -> Actor {
        Actor::new(RegionId::new(region).unwrap(), 1)
    }

    #[test]
    fn counters_whose_parts_add_up_beyond_int64_read_saturated_and_flagged() {
        let mut pn = PnCounter::new();
        pn.add(&actor("us-east-1"), i64::MAX).unwrap();
        pn.add(&actor("eu-west-1"), i64::MAX).unwrap();
        let v = value(
            "drivers/a",
            CrdtType::PnCounter,
            Some(&CrdtValue::PnCounter(pn)),
        )
        .unwrap();
        assert_eq!(v.value, Some(pb::value::Value::Counter(i64::MAX)));
        assert!(v.saturated);

        let mut low = PnCounter::new();
        low.add(&actor("us-east-1"), i64::MIN).unwrap();
        low.add(&actor("eu-west-1"), -5).unwrap();
        let v = value(
            "drivers/b",
            CrdtType::PnCounter,
            Some(&CrdtValue::PnCounter(low)),
        )
        .unwrap();
        assert_eq!(v.value, Some(pb::value::Value::Counter(i64::MIN)));
        assert!(v.saturated);

        let mut g = GCounter::new();
        g.increment(&actor("us-east-1"), i64::MAX as u64).unwrap();
        g.increment(&actor("eu-west-1"), 1).unwrap();
        let v = value(
            "requests/a",
            CrdtType::GCounter,
            Some(&CrdtValue::GCounter(g)),
        )
        .unwrap();
        assert_eq!(v.value, Some(pb::value::Value::Counter(i64::MAX)));
        assert!(v.saturated);

        let mut fits = PnCounter::new();
        fits.add(&actor("us-east-1"), -3).unwrap();
        let v = value(
            "drivers/c",
            CrdtType::PnCounter,
            Some(&CrdtValue::PnCounter(fits)),
        )
        .unwrap();
        assert_eq!(v.value, Some(pb::value::Value::Counter(-3)));
        assert!(!v.saturated);
    }
}
