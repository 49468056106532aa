//! Applying one batch of update records to state: decide purely, the store writes the
//! outcome in one RocksDB `WriteBatch`.
//!
//! ```text
//!  records ─decode─check─(windowed: slice key, or late)─► per key: current state (read
//!     │   once) ─apply ops─► new state ─own_part──► outbox delta
//!     ├─ refused ──► dead letters          last offset per partition ──► source offsets
//!     └─ late ──► late outbox entries      watermark per partition ──► stored with them
//! ```

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use super::event::{Op, Rejection, Update};
use crate::clock::HlcTimestamp;
use crate::config::{IngestConfig, LeaseConfig, Namespaces, Ownership, RecordFormat};
use crate::crdt::{
    Actor, CrdtError, CrdtType, CrdtValue, Delta, GCounter, LwwRegister, OrderStamp, PnCounter,
};
use crate::lease::table::ShardId;
pub use crate::log::Record;
use crate::log::partition_of;
use crate::store::StateSource;
use crate::window::{self, WindowSpec};
use geostate_proto::outputs::{RegisterChange, WindowResult};

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
    /// Windowed records whose window this region had closed ([`Rejection::Late`]): kept
    /// in the late topic, never applied.
    pub late: Vec<(Record, Rejection)>,
    /// Per updates partition whose windowed records moved it, the watermark after the
    /// batch.
    pub watermarks: BTreeMap<i32, u64>,
    /// Accepted writes of owned registers that output their changes, each with the
    /// position of its record: shipped to the outputs topic once, with the state.
    pub outputs: Vec<((i32, i64), RegisterChange)>,
    /// Per key whose window changed: the idempotency ids most recently applied.
    pub recent_ids: BTreeMap<String, VecDeque<String>>,
    /// Number of records applied to state.
    pub applied: usize,
    /// Records skipped because their idempotency id was already applied to the key.
    pub duplicates: usize,
    /// The owned shards' fences after the batch.
    pub fences: Fences,
    /// Records whose key hashes ([`partition_of`]) to another partition than the one they
    /// are on (their producer does not partition like the Java client), and the first of
    /// them: (key, the partition it was on, the key's partition). Each is also in
    /// `rejected`: a key's state lives in its own partition's store.
    pub misrouted: usize,
    pub first_misrouted: Option<(String, i32, i32)>,
    /// The batch stopped at a record whose epoch [`Grants`] can neither admit nor refuse:
    /// that record and every one after it, not applied, to apply once the lease group
    /// was asked.
    pub pending: Option<Pending>,
}

/// Records a batch left for later, from the first whose epoch needs the lease group's
/// answer.
#[derive(Debug)]
pub struct Pending {
    pub shard: ShardId,
    pub epoch: u64,
    pub records: Vec<Record>,
}

/// What the ingest knows of the lease epochs the lease group granted. An owned record
/// names the epoch of the lease it was written under; one above every epoch granted for
/// its shard did not come through a holder's API, and applying it would fence the
/// shard's later writes up to that epoch (for ever, at `u64::MAX`).
#[derive(Debug, Default, Clone)]
pub struct Grants {
    /// Per shard, an epoch known granted (every lower one was too).
    pub known: BTreeMap<ShardId, u64>,
    /// Per shard, the lease group's epoch read through its log after the batch's records
    /// were read: an epoch above it was never granted when the record was written.
    pub read: BTreeMap<ShardId, u64>,
}

/// How [`Grants`] judges an owned record's epoch.
#[derive(Debug, PartialEq, Eq)]
enum Grant {
    Granted,
    /// Above the epoch the lease group answered.
    Never {
        granted: u64,
    },
    /// Above what is known: ask the lease group.
    Ask,
}

impl Grants {
    fn judge(&self, shard: ShardId, epoch: u64) -> Grant {
        let known = self.known.get(&shard).copied().unwrap_or(0);
        match self.read.get(&shard) {
            _ if epoch <= known => Grant::Granted,
            Some(&read) if epoch <= read => Grant::Granted,
            Some(&read) => Grant::Never { granted: read },
            None => Grant::Ask,
        }
    }
}

/// The facts a batch is applied with.
pub struct BatchContext<'a> {
    pub actor: &'a Actor,
    pub format: RecordFormat,
    pub namespaces: &'a Namespaces,
    pub limits: &'a IngestConfig,
    /// This region's HLC when the batch is applied; deltas carry it for lag measurement.
    pub origin_time: HlcTimestamp,
    /// How owned keys map to lease shards (`None`: one shard).
    pub lease: Option<&'a LeaseConfig>,
    /// How far a record's own stamp may be ahead of its Kafka timestamp.
    pub max_clock_offset: Duration,
    /// The epochs granted, where a lease group grants them (`None`: not checked).
    pub grants: Option<&'a Grants>,
    /// The updates topic's partition count, to find records off their key's partition
    /// (`None`: not checked).
    pub partitions: Option<i32>,
    /// `watermark.out-of-orderness`: a partition's watermark is the largest event time of
    /// its windowed records less this.
    pub out_of_orderness_ms: u64,
}

/// A record that brings its own order stamp (the gRPC API stamps registers before it
/// appends them) may not place it more than `max` ahead of the record's Kafka timestamp,
/// which the writer sets from the same clock and the broker bounds
/// (`message.timestamp.after.max.ms`): a stamp far in the future would win every merge of
/// its register, in every region, for ever. A function of the record alone, so a replay
/// decides the same.
pub fn stamp_within(stamp: HlcTimestamp, record: &Record, max: Duration) -> Result<(), Rejection> {
    let written_ms = record.timestamp_ms.unwrap_or(0);
    // one more millisecond: the timestamp is the writer's clock cut to milliseconds
    let bound = u64::try_from(written_ms)
        .unwrap_or(0)
        .saturating_add(1)
        .saturating_mul(1_000_000)
        .saturating_add(u64::try_from(max.as_nanos()).unwrap_or(u64::MAX));
    if stamp.wall_nanos > bound {
        return Err(Rejection::StampAhead {
            stamp,
            written_ms,
            max,
        });
    }
    Ok(())
}

/// A windowed update's own event time may lead its record's Kafka timestamp by `max`
/// (`max-clock-offset`), like a stamp, and no more: it would raise its partition's
/// watermark, and every later event of the partition would be refused as late for as long
/// as that time was ahead. A function of the record alone, so a replay decides the same.
pub fn event_time_within(
    key: &str,
    event_time_ms: u64,
    written_ms: i64,
    max: Duration,
) -> Result<(), Rejection> {
    let bound = u64::try_from(written_ms)
        .unwrap_or(0)
        .saturating_add(u64::try_from(max.as_millis()).unwrap_or(u64::MAX));
    if event_time_ms > bound {
        return Err(Rejection::EventTimeAhead {
            key: key.to_owned(),
            event_time_ms,
            written_ms,
            max,
        });
    }
    Ok(())
}

/// The ownership shard of an owned key.
pub fn owned_shard(lease: Option<&LeaseConfig>, key: &str) -> ShardId {
    lease.map_or(0, |l| l.shard_of_key(key))
}

/// The fence of owned keys: per shard and partition of the updates topic, the highest lease
/// epoch this region's own records on that partition applied, read from the source on
/// first use and raised by every admitted record. An owned record below its partition's
/// fence is refused: its region had moved on to a later lease.
///
/// Merged deltas never raise it, and no partition's records raise another's. The fence a
/// record is judged by is then a function of its partition's log alone (and of the stored
/// fence it was replayed from: a checkpoint copy or a resume point, each taken at the
/// offsets it resumes from), whatever order the partitions' records interleave in, so a
/// node that lost its disk and replays the log decides every record as the lost node did:
/// none it acknowledged is refused, none it refused is applied. A key's owned records come
/// through a holder's API, which puts them all on the key's one partition, so they fence
/// each other as with one fence per shard. A record of a lease that ended is still refused
/// its acknowledgement (`api`: the holder checks its lease after the apply), and its value
/// loses, key by key, to any write of a later epoch.
#[derive(Debug, Default)]
pub struct Fences(pub BTreeMap<(ShardId, i32), u64>);

impl Fences {
    /// The highest epoch applied for `shard` on `partition`, read from `source` on first
    /// use.
    fn highest<S: StateSource>(
        &mut self,
        source: &S,
        shard: ShardId,
        partition: i32,
    ) -> Result<u64, S::Error> {
        if let Some(&h) = self.0.get(&(shard, partition)) {
            return Ok(h);
        }
        let h = source.fence(shard, partition)?;
        self.0.insert((shard, partition), h);
        Ok(h)
    }

    /// Admits a record of `shard` on `partition` at `epoch` (raising the fence), or answers
    /// the higher epoch already applied there.
    pub fn admit<S: StateSource>(
        &mut self,
        source: &S,
        shard: ShardId,
        partition: i32,
        epoch: u64,
    ) -> Result<Result<(), u64>, S::Error> {
        let highest = self.highest(source, shard, partition)?;
        if epoch < highest {
            return Ok(Err(highest));
        }
        self.0.insert((shard, partition), epoch);
        Ok(Ok(()))
    }
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
    OrderStamp {
        epoch: update.epoch.unwrap_or(0),
        hlc,
        origin: ctx.actor.region.clone(),
    }
}

impl Applied {
    /// Puts a windowed update on its slice's key and raises its partition's watermark, or
    /// refuses it as late: judged by the watermark the records before it left, so a
    /// replay from any stored offset (with the watermark stored there) judges the same.
    /// Event time: the record's own, else its Kafka timestamp; never this node's clock.
    fn slice<S: StateSource>(
        &mut self,
        source: &S,
        record: &Record,
        update: &mut Update,
        spec: &WindowSpec,
        ctx: &BatchContext<'_>,
    ) -> Result<Result<(), Rejection>, S::Error> {
        let Some(t) = event_time(record, update) else {
            let key = update.key.clone();
            return Ok(Err(Rejection::NoEventTime { key }));
        };
        if let (Some(own), Some(written)) = (update.event_time_ms, record.timestamp_ms)
            && let Err(why) = event_time_within(&update.key, own, written, ctx.max_clock_offset)
        {
            return Ok(Err(why));
        }
        let watermark = self.watermark(source, record.partition)?;
        let slice = spec.slice_of(t);
        if spec.is_late(t, watermark) {
            return Ok(Err(Rejection::Late {
                key: update.key.clone(),
                event_time_ms: t,
                watermark_ms: watermark.unwrap_or_default(),
                closed_at_ms: spec.slice_closes_at(slice),
            }));
        }
        if let Some(w) = window::advanced(watermark, t, ctx.out_of_orderness_ms) {
            self.watermarks.insert(record.partition, w);
        }
        update.key = window::slice_key(&update.key, slice);
        Ok(Ok(()))
    }

    /// A partition's watermark as the batch's records so far left it.
    fn watermark<S: StateSource>(
        &self,
        source: &S,
        partition: i32,
    ) -> Result<Option<u64>, S::Error> {
        match self.watermarks.get(&partition) {
            Some(&w) => Ok(Some(w)),
            None => source.watermark(partition),
        }
    }

    /// A watermark record ([`window::WATERMARK_KEY`]) raises its partition's watermark to
    /// its value (never lowers it).
    fn raise<S: StateSource>(&mut self, source: &S, record: Record) -> Result<(), S::Error> {
        let Some(w) = record.payload.as_deref().and_then(window::decode_watermark) else {
            let why = Rejection::Malformed("a watermark record's value is 8 bytes".into());
            self.rejected.push((record, why));
            return Ok(());
        };
        if self
            .watermark(source, record.partition)?
            .is_none_or(|current| w > current)
        {
            self.watermarks.insert(record.partition, w);
        }
        Ok(())
    }

    /// Stops the batch before `records` (the first names `epoch` of `shard`, which the
    /// lease group is to be asked about): neither it nor its offset is consumed.
    fn ask(
        &mut self,
        before: Option<i64>,
        shard: ShardId,
        epoch: u64,
        records: impl Iterator<Item = Record>,
    ) {
        let records: Vec<Record> = records.collect();
        if let Some(first) = records.first() {
            match before {
                Some(o) => self.offsets.insert(first.partition, o),
                None => self.offsets.remove(&first.partition),
            };
        }
        self.pending = Some(Pending {
            shard,
            epoch,
            records,
        });
    }
}

/// A windowed update's event time: its own, else its record's Kafka timestamp.
fn event_time(record: &Record, update: &Update) -> Option<u64> {
    let written = record.timestamp_ms.and_then(|ms| u64::try_from(ms).ok());
    update.event_time_ms.or(written)
}

/// The key of the slice a windowed `update` writes (`None` without an event time).
fn slice_key_of(record: &Record, update: &Update, spec: &WindowSpec) -> Option<String> {
    let t = event_time(record, update)?;
    Some(window::slice_key(&update.key, spec.slice_of(t)))
}

/// A touched key's working copy within a batch.
#[derive(Default)]
struct Working {
    state: Option<CrdtValue>,
    /// Loaded on first use: most records carry no id.
    recent_ids: Option<VecDeque<String>>,
    state_changed: bool,
    ids_changed: bool,
}

impl Working {
    /// Whether a write with idempotency id `id` was applied to `key` (this copy's).
    fn applied<S: StateSource>(
        &mut self,
        source: &S,
        key: &str,
        id: &str,
    ) -> Result<bool, S::Error> {
        if self.recent_ids.is_none() {
            self.recent_ids = Some(source.recent_ids(key)?);
        }
        Ok(self
            .recent_ids
            .as_ref()
            .is_some_and(|ids| ids.iter().any(|i| i == id)))
    }
}

/// `key`'s working copy, read from `source` on first use.
fn working<'w, S: StateSource>(
    work: &'w mut BTreeMap<String, Working>,
    source: &S,
    key: &str,
) -> Result<&'w mut Working, S::Error> {
    // a key of its own only for a key not touched yet (no allocation per record)
    if !work.contains_key(key) {
        let state = source.state(key)?;
        let entry = Working {
            state,
            ..Working::default()
        };
        work.insert(key.to_owned(), entry);
    }
    Ok(work.get_mut(key).expect("inserted above if absent"))
}

/// Applies `records` on top of what `source` holds; reads each touched key once. Per
/// record, in log order: a watermark record raises its partition's watermark
/// ([`Applied::raise`]); otherwise decode and check ([`checked`]), the key's partition and
/// the lease epoch granted ([`Applied::admit`]; an epoch to ask about stops the batch), a
/// windowed record's slice or lateness ([`Applied::slice`]), the fence, the idempotency
/// id, the compare-and-set, the operation ([`Applied::write`]); then every changed key's
/// state, own-part delta and ids ([`finish`]).
pub fn apply_batch<S: StateSource>(
    records: Vec<Record>,
    source: &S,
    ctx: &BatchContext<'_>,
) -> Result<Applied, S::Error> {
    let mut out = Applied::default();
    let mut work: BTreeMap<String, Working> = BTreeMap::new();
    let mut records = records.into_iter();
    while let Some(record) = records.next() {
        let before = out.offsets.get(&record.partition).copied();
        out.offsets.insert(
            record.partition,
            before.map_or(record.offset, |o| o.max(record.offset)),
        );
        if record.key.as_deref() == Some(window::WATERMARK_KEY) {
            out.raise(source, record)?;
            continue;
        }
        let mut checked = match checked(&record, ctx) {
            Ok(ok) => ok,
            Err(why) => {
                out.rejected.push((record, why));
                continue;
            }
        };
        let owned = match out.admit(&record, &mut checked, ctx) {
            Admission::Admitted(owned) => owned,
            Admission::Refused(why) => {
                out.rejected.push((record, why));
                continue;
            }
            Admission::Ask { shard, epoch } => {
                out.ask(before, shard, epoch, std::iter::once(record).chain(records));
                break;
            }
        };
        out.write(&mut work, source, ctx, record, checked, owned)?;
    }
    finish(work, source, ctx, &mut out)?;
    Ok(out)
}

/// What [`Applied::admit`] decided of a checked record, before its key is read.
enum Admission {
    /// On to its window, fence and id; an owned record with its shard and epoch.
    Admitted(Option<(ShardId, u64)>),
    Refused(Rejection),
    /// The batch stops before the record: the lease group is to be asked about `epoch`.
    Ask {
        shard: ShardId,
        epoch: u64,
    },
}

impl Applied {
    /// Admits a checked record on its key's partition (one off it is refused, and counted)
    /// and, where grants are checked, an owned record at an epoch [`Grants`] knows granted.
    /// Reads no state.
    fn admit(
        &mut self,
        record: &Record,
        checked: &mut Checked,
        ctx: &BatchContext<'_>,
    ) -> Admission {
        let update = &mut checked.update;
        if let Some(n) = ctx.partitions {
            let home = partition_of(update.key.as_bytes(), n);
            if home != record.partition {
                self.misrouted += 1;
                self.first_misrouted
                    .get_or_insert_with(|| (update.key.clone(), record.partition, home));
                // the update goes no further: its key moves into the refusal, uncloned
                let (key, partition) = (std::mem::take(&mut update.key), record.partition);
                return Admission::Refused(Rejection::Misrouted {
                    key,
                    partition,
                    home,
                });
            }
        }
        let owned = match (checked.ownership, update.epoch) {
            (Ownership::Owned, Some(epoch)) => Some((owned_shard(ctx.lease, &update.key), epoch)),
            _ => None,
        };
        if let (Some((shard, epoch)), Some(grants)) = (owned, ctx.grants) {
            match grants.judge(shard, epoch) {
                Grant::Granted => {}
                Grant::Never { granted } => {
                    let key = update.key.clone();
                    return Admission::Refused(Rejection::EpochNotGranted {
                        key,
                        shard,
                        epoch,
                        granted,
                    });
                }
                Grant::Ask => return Admission::Ask { shard, epoch },
            }
        }
        Admission::Admitted(owned)
    }

    /// Applies an admitted record (`owned`: its shard and epoch) to its key's working copy
    /// in `work`, unless its window, the fence or its idempotency id decides otherwise;
    /// an accepted write that outputs its changes joins [`Applied::outputs`].
    fn write<S: StateSource>(
        &mut self,
        work: &mut BTreeMap<String, Working>,
        source: &S,
        ctx: &BatchContext<'_>,
        record: Record,
        checked: Checked,
        owned: Option<(ShardId, u64)>,
    ) -> Result<(), S::Error> {
        let Checked {
            mut update,
            crdt,
            window,
            outputs_changes,
            ..
        } = checked;
        // a retry of a write its id says was applied is a duplicate, even where the write
        // would be refused now (its window closed since, its shard's fence moved past its
        // epoch): a refusal would tell the client it was not applied
        if let Some(spec) = &window
            && let Err(why) = self.slice(source, &record, &mut update, spec, ctx)?
        {
            return self.unsliced(work, source, record, &update, spec, why);
        }
        let entry = working(work, source, &update.key)?;
        if let Some((shard, epoch)) = owned
            && let Err(highest) = self.fences.admit(source, shard, record.partition, epoch)?
        {
            if let Some(id) = &update.id
                && entry.applied(source, &update.key, id)?
            {
                self.duplicates += 1;
                return Ok(());
            }
            let key = update.key.clone();
            let why = Rejection::Fenced {
                key,
                epoch,
                highest,
            };
            self.rejected.push((record, why));
            return Ok(());
        }
        if let Some(id) = &update.id
            && entry.applied(source, &update.key, id)?
        {
            self.duplicates += 1;
            return Ok(());
        }
        let output = match owned {
            Some((_, epoch)) if outputs_changes => register_change(&update, &record, ctx, epoch),
            _ => None,
        };
        match apply_one(entry, update, crdt, &record, ctx) {
            Ok(()) => {
                self.applied += 1;
                if let Some(change) = output {
                    self.outputs
                        .push(((record.partition, record.offset), change));
                }
            }
            Err(why) => self.rejected.push((record, why)),
        }
        Ok(())
    }

    /// A windowed record [`Applied::slice`] refused: a late one goes to the late topic,
    /// unless its id says it was applied to its slice (a duplicate); any other is rejected.
    fn unsliced<S: StateSource>(
        &mut self,
        work: &mut BTreeMap<String, Working>,
        source: &S,
        record: Record,
        update: &Update,
        spec: &WindowSpec,
        why: Rejection,
    ) -> Result<(), S::Error> {
        match why {
            Rejection::Late { .. } => {
                let key = slice_key_of(&record, update, spec);
                if let (Some(id), Some(key)) = (&update.id, key)
                    && working(work, source, &key)?.applied(source, &key, id)?
                {
                    self.duplicates += 1;
                } else {
                    self.late.push((record, why));
                }
            }
            why => self.rejected.push((record, why)),
        }
        Ok(())
    }
}

/// The output of an owned write to a `register-changes` namespace: the window result it
/// sets (checked with the update), the epoch it is written under and its stamp.
fn register_change(
    update: &Update,
    record: &Record,
    ctx: &BatchContext<'_>,
    epoch: u64,
) -> Option<RegisterChange> {
    let (Op::Set(value) | Op::Cas { value, .. }) = &update.op else {
        return None;
    };
    let result = WindowResult::parse(value).ok()?;
    Some(RegisterChange {
        key: update.key.clone(),
        start_ms: result.start_ms,
        end_ms: result.end_ms,
        value: result.value,
        region: ctx.actor.region.to_string(),
        epoch,
        version: register_stamp(update, record, ctx).hlc.wall_nanos,
    })
}

/// A record's update as [`checked`], with what its namespace says of it.
struct Checked {
    update: Update,
    crdt: CrdtType,
    ownership: Ownership,
    window: Option<WindowSpec>,
    /// Its accepted writes are outputs (`register-changes`).
    outputs_changes: bool,
}

/// A record decoded and checked: its update, the key's type, ownership and windows, and
/// whether its accepted writes are outputs. A register stamp further ahead of the
/// record's own timestamp than the clock bound is refused.
fn checked(record: &Record, ctx: &BatchContext<'_>) -> Result<Checked, Rejection> {
    let update = match record.payload.as_deref() {
        None => return Err(Rejection::Malformed("record has no value".into())),
        Some(bytes) => Update::decode(ctx.format, bytes)?,
    };
    let ns = update.check(ctx.namespaces, ctx.limits)?;
    let (crdt, ownership, window) = (ns.crdt, ns.ownership, ns.window);
    if let Some(stamp) = update.hlc {
        stamp_within(stamp, record, ctx.max_clock_offset)?;
    }
    Ok(Checked {
        update,
        crdt,
        ownership,
        window,
        outputs_changes: ns.outputs_register_changes,
    })
}

/// Applies one admitted update to its key's working copy: a compare-and-set is decided
/// here, in log order, on the state this record sees (a replay decides the same way); a
/// no-op (adding 0) neither creates nor rewrites the key (regions would then disagree on
/// which keys exist); the id joins the key's recent ids.
fn apply_one(
    entry: &mut Working,
    update: Update,
    crdt: CrdtType,
    record: &Record,
    ctx: &BatchContext<'_>,
) -> Result<(), Rejection> {
    let stamp = register_stamp(&update, record, ctx);
    let op = match update.op {
        Op::Cas { expected, value } => {
            let current = match &entry.state {
                Some(CrdtValue::LwwRegister(r)) => Some(r.value()),
                _ => None,
            };
            if current != expected.as_deref() {
                let current = current.map(|v| String::from_utf8_lossy(v).into_owned());
                let key = update.key;
                return Err(Rejection::CompareFailed { key, current });
            }
            Op::Set(value)
        }
        op => op,
    };
    let next = apply_op(entry.state.as_ref(), crdt, &op, ctx.actor, stamp)?;
    let no_op = match (&entry.state, &next) {
        (None, CrdtValue::PnCounter(c)) => c.is_empty(),
        (Some(current), next) => current == next,
        (None, _) => false,
    };
    if !no_op {
        entry.state = Some(next);
        entry.state_changed = true;
    }
    if let (Some(id), Some(ids)) = (update.id, entry.recent_ids.as_mut()) {
        ids.push_back(id);
        while ids.len() > ctx.limits.dedup_window {
            ids.pop_front();
        }
        entry.ids_changed = true;
    }
    Ok(())
}

/// Every changed key's new state and own-part delta, and every changed id window. The
/// delta carries the key's whole window (read for a key no record of the batch had an id
/// for), so a copy of the partition rebuilt from the deltas topic skips the same retries.
fn finish<S: StateSource>(
    work: BTreeMap<String, Working>,
    source: &S,
    ctx: &BatchContext<'_>,
    out: &mut Applied,
) -> Result<(), S::Error> {
    let region = &ctx.actor.region;
    for (key, entry) in work {
        let (true, Some(state)) = (entry.state_changed, entry.state) else {
            if entry.ids_changed
                && let Some(ids) = entry.recent_ids
            {
                out.recent_ids.insert(key, ids);
            }
            continue;
        };
        if let Some(own) = state.own_part(region) {
            let recent_ids = match &entry.recent_ids {
                Some(ids) => ids.iter().cloned().collect(),
                None => source.recent_ids(&key)?.into(),
            };
            out.outbox.push(Delta {
                key: key.clone(),
                origin: region.clone(),
                origin_time: ctx.origin_time,
                epoch: own.epoch(),
                state: own,
                recent_ids,
            });
        }
        if entry.ids_changed
            && let Some(ids) = entry.recent_ids
        {
            out.recent_ids.insert(key.clone(), ids);
        }
        out.states.insert(key, state);
    }
    Ok(())
}

/// A counter's value domain: every region keeps its own part (the sum of its writes)
/// within int64, so a write that would take it out is refused and nothing applied. Its
/// own part depends on its own records alone, so a replay decides the same. Parts of
/// several regions can still add up beyond int64: reads then saturate, flagged.
fn within_int64(own: i128) -> Result<(), Rejection> {
    if i64::try_from(own).is_err() {
        return Err(Rejection::Overflow(format!(
            "this region's part of the counter would be {own}, outside int64"
        )));
    }
    Ok(())
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
            within_int64(i128::try_from(c.own_value(&actor.region)).unwrap_or(i128::MAX))?;
            Ok(CrdtValue::GCounter(c))
        }
        (CrdtType::PnCounter, Op::Add(n)) => {
            let mut c = match current {
                None => PnCounter::new(),
                Some(CrdtValue::PnCounter(c)) => c.clone(),
                Some(other) => return Err(mismatch(other)),
            };
            c.add(actor, *n).map_err(overflow)?;
            within_int64(c.own_value(&actor.region))?;
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
mod tests;
