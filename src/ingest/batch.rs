//! Applying one batch of update records to state: decide purely, the store writes the
//! outcome in one RocksDB `WriteBatch`.
//!
//! ```text
//!  records ─decode─check─► per key: current state (read once) ─apply ops─► new state
//!     │                                                      └─own_part──► outbox delta
//!     └─ refused ──► dead letters          last offset per partition ──► source offsets
//! ```

use std::collections::BTreeMap;

use super::event::{Op, Rejection, Update};
use crate::clock::HlcTimestamp;
use crate::config::{IngestConfig, Namespaces, RecordFormat};
use crate::crdt::{
    Actor, CrdtError, CrdtType, CrdtValue, Delta, GCounter, LwwRegister, OrderStamp, PnCounter,
};

/// One record of the updates topic, as consumed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub partition: i32,
    pub offset: i64,
    /// The Kafka record timestamp (ms), if the broker gave one.
    pub timestamp_ms: Option<i64>,
    pub key: Option<Vec<u8>>,
    pub payload: Option<Vec<u8>>,
}

/// What a batch changes; written atomically by the store.
#[derive(Debug, Default)]
pub struct Applied {
    /// The new state of every touched key.
    pub states: BTreeMap<String, CrdtValue>,
    /// Per input partition, the last offset this batch consumed.
    pub offsets: BTreeMap<i32, i64>,
    /// One delta per touched key: this region's own part of its new state.
    pub outbox: Vec<Delta>,
    /// Records that were not applied, with the reason.
    pub rejected: Vec<(Record, Rejection)>,
    /// Number of records applied to state.
    pub applied: usize,
}

/// The facts a batch is applied with.
pub struct BatchContext<'a> {
    pub actor: &'a Actor,
    pub format: RecordFormat,
    pub namespaces: &'a Namespaces,
    pub limits: &'a IngestConfig,
    /// This region's HLC when the batch is applied; deltas carry it for lag measurement.
    pub origin_time: HlcTimestamp,
}

/// The order stamp of a register write: fixed by the writer when it entered the log, or,
/// for an external producer, derived from the record itself (Kafka timestamp, then offset
/// within the millisecond, then partition), so that replaying the log reproduces it.
pub fn register_stamp(update: &Update, record: &Record, ctx: &BatchContext<'_>) -> OrderStamp {
    let hlc = update.hlc.unwrap_or_else(|| {
        let ms = u64::try_from(record.timestamp_ms.unwrap_or(0)).unwrap_or(0);
        let within_ms = u64::try_from(record.offset).unwrap_or(0) % 1_000_000;
        HlcTimestamp::new(
            ms.saturating_mul(1_000_000).saturating_add(within_ms),
            u32::try_from(record.partition).unwrap_or(0),
        )
    });
    OrderStamp::shared(hlc, ctx.actor.region.clone())
}

/// Applies `records` on top of the states `read` returns; reads each touched key once.
pub fn apply_batch<E>(
    records: Vec<Record>,
    mut read: impl FnMut(&str) -> Result<Option<CrdtValue>, E>,
    ctx: &BatchContext<'_>,
) -> Result<Applied, E> {
    let mut out = Applied::default();
    for record in records {
        out.offsets
            .entry(record.partition)
            .and_modify(|o| *o = (*o).max(record.offset))
            .or_insert(record.offset);
        let update = match record.payload.as_deref() {
            None => Err(Rejection::Malformed("record has no value".into())),
            Some(bytes) => Update::decode(ctx.format, bytes),
        };
        let checked =
            update.and_then(|u| u.check(ctx.namespaces, ctx.limits).map(|ns| (u, ns.crdt)));
        let (update, crdt) = match checked {
            Ok(ok) => ok,
            Err(why) => {
                out.rejected.push((record, why));
                continue;
            }
        };
        if !out.states.contains_key(&update.key)
            && let Some(current) = read(&update.key)?
        {
            out.states.insert(update.key.clone(), current);
        }
        let stamp = register_stamp(&update, &record, ctx);
        let current = out.states.get(&update.key);
        match apply_op(current, crdt, &update.op, ctx.actor, stamp) {
            Ok(next) => {
                out.states.insert(update.key, next);
                out.applied += 1;
            }
            Err(why) => out.rejected.push((record, why)),
        }
    }
    let region = &ctx.actor.region;
    out.outbox = out
        .states
        .iter()
        .filter_map(|(key, state)| {
            state.own_part(region).map(|own| Delta {
                key: key.clone(),
                origin: region.clone(),
                state: own,
                origin_time: ctx.origin_time,
                epoch: 0,
            })
        })
        .collect();
    // keys only read, never changed, are not part of the batch's outcome
    Ok(out)
}

fn apply_op(
    current: Option<&CrdtValue>,
    crdt: CrdtType,
    op: &Op,
    actor: &Actor,
    stamp: OrderStamp,
) -> Result<CrdtValue, Rejection> {
    let overflow = |e: CrdtError| Rejection::Overflow(e.to_string());
    let mismatch = |found: &CrdtValue| {
        Rejection::Malformed(format!(
            "stored state is a {}, the namespace declares {crdt}",
            found.crdt_type()
        ))
    };
    match (crdt, op) {
        (CrdtType::GCounter, Op::Add(n)) => {
            let mut c = match current {
                None => GCounter::new(),
                Some(CrdtValue::GCounter(c)) => c.clone(),
                Some(other) => return Err(mismatch(other)),
            };
            c.increment(actor, u64::try_from(*n).unwrap_or(0))
                .map_err(overflow)?;
            Ok(CrdtValue::GCounter(c))
        }
        (CrdtType::PnCounter, Op::Add(n)) => {
            let mut c = match current {
                None => PnCounter::new(),
                Some(CrdtValue::PnCounter(c)) => c.clone(),
                Some(other) => return Err(mismatch(other)),
            };
            c.add(actor, *n).map_err(overflow)?;
            Ok(CrdtValue::PnCounter(c))
        }
        (CrdtType::LwwRegister, Op::Set(value)) => {
            let written = LwwRegister::new(value.clone(), stamp);
            match current {
                None => Ok(CrdtValue::LwwRegister(written)),
                Some(CrdtValue::LwwRegister(r)) => {
                    let mut r = r.clone();
                    r.set(written.value().to_vec(), written.stamp().clone());
                    Ok(CrdtValue::LwwRegister(r))
                }
                Some(other) => Err(mismatch(other)),
            }
        }
        // `Update::check` pairs ops with namespace types before this is reached.
        (crdt, op) => Err(Rejection::Malformed(format!(
            "{op:?} does not apply to a {crdt}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use super::*;
    use crate::config::Config;
    use crate::crdt::RegionId;

    fn config() -> Config {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("regions/us-east-1.toml");
        Config::load(&path).unwrap()
    }

    fn record(partition: i32, offset: i64, json: &str) -> Record {
        Record {
            partition,
            offset,
            timestamp_ms: Some(1_700_000_000_000),
            key: None,
            payload: Some(json.as_bytes().to_vec()),
        }
    }

    fn run(records: Vec<Record>, stored: &BTreeMap<String, CrdtValue>) -> Applied {
        let c = config();
        let actor = Actor::new(RegionId::new("us-east-1").unwrap(), 1);
        let ctx = BatchContext {
            actor: &actor,
            format: RecordFormat::Json,
            namespaces: &c.namespaces,
            limits: &c.ingest,
            origin_time: HlcTimestamp::new(5, 0),
        };
        apply_batch(
            records,
            |k| Ok::<_, Infallible>(stored.get(k).cloned()),
            &ctx,
        )
        .unwrap()
    }

    #[test]
    fn a_batch_coalesces_keys_records_offsets_and_rejects_bad_records() {
        let out = run(
            vec![
                record(0, 10, r#"{"key":"drivers/a","add":3}"#),
                record(1, 7, r#"{"key":"drivers/a","add":-1}"#),
                record(0, 11, r#"{"key":"requests/a","add":2}"#),
                record(0, 12, "garbage"),
                record(1, 8, r#"{"key":"zones/a","set":"x"}"#),
            ],
            &BTreeMap::new(),
        );
        assert_eq!(out.applied, 4);
        assert_eq!(out.offsets, BTreeMap::from([(0, 12), (1, 8)]));
        assert_eq!(out.rejected.len(), 1);
        assert_eq!(out.rejected[0].0.offset, 12);
        match &out.states["drivers/a"] {
            CrdtValue::PnCounter(c) => assert_eq!(c.value(), 2),
            other => panic!("{other:?}"),
        }
        assert_eq!(out.outbox.len(), 3, "one delta per touched key");
    }

    #[test]
    fn a_batch_builds_on_stored_state() {
        let first = run(
            vec![record(0, 0, r#"{"key":"requests/a","add":5}"#)],
            &BTreeMap::new(),
        );
        let second = run(
            vec![record(0, 1, r#"{"key":"requests/a","add":2}"#)],
            &first.states,
        );
        match &second.states["requests/a"] {
            CrdtValue::GCounter(c) => assert_eq!(c.value(), 7),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn replaying_a_register_write_reproduces_its_stamp() {
        let r = record(2, 99, r#"{"key":"zones/a","set":"x"}"#);
        let a = run(vec![r.clone()], &BTreeMap::new());
        let b = run(vec![r], &BTreeMap::new());
        assert_eq!(a.states, b.states);
        let stamped = record(
            2,
            100,
            r#"{"key":"zones/a","set":"y","hlc":{"wall_nanos":9,"logical":1}}"#,
        );
        match &run(vec![stamped], &BTreeMap::new()).states["zones/a"] {
            CrdtValue::LwwRegister(reg) => assert_eq!(reg.stamp().hlc, HlcTimestamp::new(9, 1)),
            other => panic!("{other:?}"),
        }
    }
}
