//! One partition's RocksDB instance: its column families, and the one-`WriteBatch` commit
//! of what a batch applied to the partition. [`super::Store`] routes to these.

use std::collections::{BTreeMap, VecDeque};
use std::path::Path;
use std::sync::atomic::Ordering;

use rocksdb::{
    ColumnFamily, ColumnFamilyDescriptor, DB, Direction, IteratorMode, Options, ReadOptions,
    WriteBatch,
};

use super::retention::{Expiry, Retention};
use super::{Commit, Entry, OutboxEntry, OutboxSnapshot, StoreError};
use crate::clock::HlcTimestamp;
use crate::crdt::{CrdtValue, Delta, RegionId, decode_value, encode_value};
use crate::window;
use std::sync::Arc;

pub(super) const CF_STATE: &str = "state";
pub(super) const CF_OFFSETS: &str = "offsets";
pub(super) const CF_OUTBOX: &str = "outbox";
pub(super) const CF_META: &str = "meta";
pub(super) const CF_DEDUP: &str = "dedup";
/// Every column family, in the order a savepoint lists them.
pub const COLUMN_FAMILIES: [&str; 5] = [CF_STATE, CF_OFFSETS, CF_OUTBOX, CF_META, CF_DEDUP];
const META_INCARNATION: &[u8] = b"incarnation";
/// Set by a restore: the checkpoint or savepoint the store came from.
const META_RESTORED_FROM: &[u8] = b"restored-from";
/// Offsets id of the own deltas topic position a restored node bootstraps from.
const BOOTSTRAP_OFFSETS: &str = "bootstrap/";
const META_HLC: &[u8] = b"hlc";
/// The incarnation that wrote the outbox entries last (u32 BE): whose increments the copy
/// may hold beyond what was shipped.
const META_OUTBOX_WRITER: &[u8] = b"outbox-writer";
/// `remote/<region>`: the newest origin time merged from that region.
const META_REMOTE: &str = "remote/";
/// `fence/<shard u32 BE><partition i32 BE>` → the highest lease epoch the region's own
/// records on that updates partition applied for an owned shard (u64 BE).
const META_FENCE: &str = "fence/";
/// `remote-watermark/<region><partition i32 BE>` → the newest watermark the region's
/// heartbeats on that partition carried (u64 BE).
const META_REMOTE_WATERMARK: &str = "remote-watermark/";
/// `watermark/<partition i32 BE>` → the event-time watermark of the updates partition's
/// windowed records (milliseconds, u64 BE).
const META_WATERMARK: &str = "watermark/";
/// Per partition, the lowest watermark over the regions through which its final windows
/// went to the outputs topic (u64 BE, milliseconds).
const META_OUTPUTS_THROUGH: &str = "outputs-through/";

/// In-memory mirror of the outbox column family.
#[derive(Default)]
struct Outbox {
    /// State key → (version of the last write, encoded `Delta`).
    entries: BTreeMap<String, (u64, Vec<u8>)>,
    next_version: u64,
}

pub struct PartitionStore {
    db: DB,
    /// The outbox column family's entries, mirrored in memory with a version per write.
    /// Its lock serializes outbox writes (commits) with taking a shipping snapshot and with
    /// the compare-and-delete of shipped entries, so the mirror always matches the column
    /// family, and a shipping round reads no RocksDB at all for the entries.
    outbox: std::sync::Mutex<Outbox>,
    /// The store's incarnation (0: none yet), recorded as the outbox's writer.
    incarnation: std::sync::atomic::AtomicU32,
    /// The watermarks expired slices are judged by, read by the compaction filter.
    retention: Arc<Retention>,
}

impl PartitionStore {
    /// Opens (or creates) the store in `dir`: on disk, or in `env` (RocksDB's in-memory
    /// environment, for simulations).
    pub(super) fn open(dir: &Path, env: Option<&rocksdb::Env>) -> Result<Self, StoreError> {
        let mut opts = Options::default();
        if let Some(env) = env {
            opts.set_env(env);
        }
        opts.create_if_missing(true);
        opts.create_missing_column_families(true);
        opts.set_compression_type(rocksdb::DBCompressionType::Lz4);
        let retention = Arc::new(Retention::default());
        let cfs = COLUMN_FAMILIES.map(|name| {
            let mut cf = opts.clone();
            if name == CF_STATE || name == CF_DEDUP {
                cf.set_compaction_filter("expired-slices", Retention::filter(&retention));
            }
            ColumnFamilyDescriptor::new(name, cf)
        });
        let db = DB::open_cf_descriptors(&opts, dir, cfs)?;
        let mut outbox = Outbox::default();
        if let Some(cf) = db.cf_handle(CF_OUTBOX) {
            for item in db.iterator_cf(cf, IteratorMode::Start) {
                let (k, v) = item?;
                outbox.entries.insert(
                    String::from_utf8_lossy(&k).into_owned(),
                    (outbox.next_version, v.into_vec()),
                );
                outbox.next_version += 1;
            }
        }
        let this = Self {
            db,
            outbox: std::sync::Mutex::new(outbox),
            incarnation: Default::default(),
            retention,
        };
        if let Some(i) = this.incarnation()? {
            this.incarnation.store(i, Ordering::Relaxed);
        }
        for (_, w) in this.watermarks()? {
            this.retention.own(w);
        }
        for (region, w) in this.remote_watermarks()? {
            this.retention.remote(&region, w);
        }
        Ok(this)
    }

    /// Opens a store (a checkpoint copy) to read it; nothing is written.
    pub(super) fn open_read_only(dir: &Path) -> Result<Self, StoreError> {
        let db = DB::open_cf_for_read_only(&Options::default(), dir, COLUMN_FAMILIES, false)?;
        Ok(Self {
            db,
            outbox: std::sync::Mutex::new(Outbox::default()),
            incarnation: Default::default(),
            retention: Arc::default(),
        })
    }

    fn cf(&self, name: &'static str) -> &ColumnFamily {
        // every column family is created at open
        match self.db.cf_handle(name) {
            Some(cf) => cf,
            None => unreachable!("column family {name} is created at open"),
        }
    }

    /// The incarnation this store was created with, if any.
    pub(super) fn incarnation(&self) -> Result<Option<u32>, StoreError> {
        self.meta_u32(META_INCARNATION, "incarnation")
    }

    fn meta_u32(&self, key: &[u8], what: &'static str) -> Result<Option<u32>, StoreError> {
        match self.db.get_cf(self.cf(CF_META), key)? {
            None => Ok(None),
            Some(v) => Ok(Some(u32::from_be_bytes(
                v.as_slice()
                    .try_into()
                    .map_err(|_| StoreError::BadLength { what })?,
            ))),
        }
    }

    pub(super) fn set_incarnation(&self, incarnation: u32) -> Result<(), StoreError> {
        self.db.put_cf(
            self.cf(CF_META),
            META_INCARNATION,
            incarnation.to_be_bytes(),
        )?;
        self.incarnation.store(incarnation, Ordering::Relaxed);
        Ok(())
    }

    /// The incarnation that wrote the outbox entries last, if recorded.
    pub(super) fn outbox_writer(&self) -> Result<Option<u32>, StoreError> {
        self.meta_u32(META_OUTBOX_WRITER, "outbox writer")
    }

    /// Writes a RocksDB checkpoint into the new directory `dir`: the memtables are flushed,
    /// then the live SST files are hard-linked and the small metadata files copied.
    pub(super) fn checkpoint_to(&self, dir: &Path) -> Result<(), StoreError> {
        rocksdb::checkpoint::Checkpoint::new(&self.db)?.create_checkpoint(dir)?;
        Ok(())
    }

    /// Every stored position: offsets id (a topic, or `remote/<region>/<topic>`) →
    /// partition → last applied offset.
    pub(super) fn all_offsets(&self) -> Result<BTreeMap<String, BTreeMap<i32, i64>>, StoreError> {
        let mut out: BTreeMap<String, BTreeMap<i32, i64>> = BTreeMap::new();
        for item in self
            .db
            .iterator_cf(self.cf(CF_OFFSETS), IteratorMode::Start)
        {
            let (k, v) = item?;
            let Some(split) = k.len().checked_sub(5).filter(|&i| k[i] == 0) else {
                return Err(StoreError::BadLength { what: "offset key" });
            };
            let partition = i32::from_be_bytes(
                k[split + 1..]
                    .try_into()
                    .map_err(|_| StoreError::BadLength { what: "offset key" })?,
            );
            let offset = i64::from_be_bytes(
                v[..]
                    .try_into()
                    .map_err(|_| StoreError::BadLength { what: "offset" })?,
            );
            out.entry(String::from_utf8_lossy(&k[..split]).into_owned())
                .or_default()
                .insert(partition, offset);
        }
        Ok(out)
    }

    /// Calls `each(column family, key, value)` for every entry of every column family,
    /// read from one snapshot (a savepoint).
    pub(super) fn for_each_entry<E: From<StoreError>>(
        &self,
        mut each: impl FnMut(&str, &[u8], &[u8]) -> Result<(), E>,
    ) -> Result<u64, E> {
        let snapshot = self.db.snapshot();
        let mut count = 0;
        for name in COLUMN_FAMILIES {
            let mut read = ReadOptions::default();
            read.set_snapshot(&snapshot);
            for item in self
                .db
                .iterator_cf_opt(self.cf(name), read, IteratorMode::Start)
            {
                let (k, v) = item.map_err(StoreError::from)?;
                each(name, &k, &v)?;
                count += 1;
            }
        }
        Ok(count)
    }

    /// Writes entries read by [`PartitionStore::for_each_entry`] (a savepoint restore), in
    /// one batch; an HLC in `meta` only if it is newer than the one stored.
    pub(super) fn load(&self, entries: &[&Entry]) -> Result<(), StoreError> {
        let mut batch = WriteBatch::default();
        for (cf, k, v) in entries.iter().copied() {
            let Some(name) = COLUMN_FAMILIES.iter().find(|n| **n == cf.as_str()) else {
                return Err(StoreError::UnknownColumnFamily(cf.clone()));
            };
            if let Ok(Home::Newest) = home_of(name, k)
                && let Some(stored) = self.db.get_cf(self.cf(CF_META), k)?
                && decode_hlc(&stored)? >= decode_hlc(v)?
            {
                continue;
            }
            batch.put_cf(self.cf(name), k, v);
        }
        self.db.write(batch)?;
        Ok(())
    }

    /// Marks a restored store so that its next start bootstraps: the incarnation is
    /// forgotten (the node takes a new one after merging its own deltas topic, read from
    /// `deltas_next`, the deltas topic's end offsets when the copy was taken). With
    /// `keep_own`, a position the copy holds itself stays (how far a node's copy holds its
    /// own deltas: for a partition another node shipped since, short of the topic's end).
    pub(super) fn prepare_bootstrap(
        &self,
        deltas_topic: &str,
        deltas_next: &BTreeMap<i32, i64>,
        restored_from: &str,
        keep_own: bool,
    ) -> Result<(), StoreError> {
        let offsets = self.cf(CF_OFFSETS);
        let mut batch = WriteBatch::default();
        let prefix = offset_prefix(&format!("{BOOTSTRAP_OFFSETS}{deltas_topic}"));
        let own = self.bootstrap_offsets(deltas_topic)?;
        for item in self
            .db
            .iterator_cf(offsets, IteratorMode::From(&prefix, Direction::Forward))
        {
            let (k, _) = item?;
            if !k.starts_with(&prefix) {
                break;
            }
            if !keep_own {
                batch.delete_cf(offsets, k);
            }
        }
        for (partition, next) in deltas_next {
            if keep_own && own.contains_key(partition) {
                continue;
            }
            let mut k = prefix.clone();
            k.extend_from_slice(&partition.to_be_bytes());
            batch.put_cf(offsets, k, (next - 1).to_be_bytes());
        }
        batch.delete_cf(self.cf(CF_META), META_INCARNATION);
        batch.put_cf(
            self.cf(CF_META),
            META_RESTORED_FROM,
            restored_from.as_bytes(),
        );
        self.db.write(batch)?;
        Ok(())
    }

    /// Where a restored store's own deltas topic is read from (last offset before it).
    pub(super) fn bootstrap_offsets(
        &self,
        deltas_topic: &str,
    ) -> Result<BTreeMap<i32, i64>, StoreError> {
        self.source_offsets(&format!("{BOOTSTRAP_OFFSETS}{deltas_topic}"))
    }

    /// Records that this copy holds every delta of its own deltas topic partition
    /// `partition` up to `offset` (a round it shipped, or a catch-up that merged them).
    pub(super) fn own_deltas_through(
        &self,
        deltas_topic: &str,
        partition: i32,
        offset: i64,
    ) -> Result<(), StoreError> {
        let mut k = offset_prefix(&format!("{BOOTSTRAP_OFFSETS}{deltas_topic}"));
        k.extend_from_slice(&partition.to_be_bytes());
        self.db
            .put_cf(self.cf(CF_OFFSETS), k, offset.to_be_bytes())?;
        Ok(())
    }

    /// Forgets this partition's copy: states, ids, outbox, every position, fences and
    /// remote times. Kept: the node's incarnation and its clock's high-water mark.
    pub(super) fn discard(&self) -> Result<(), StoreError> {
        let mut outbox = self.lock_outbox();
        let mut batch = WriteBatch::default();
        for name in [CF_STATE, CF_OUTBOX, CF_DEDUP, CF_OFFSETS, CF_META] {
            let cf = self.cf(name);
            for item in self.db.iterator_cf(cf, IteratorMode::Start) {
                let (k, _) = item?;
                if name == CF_META && (&*k == META_INCARNATION || &*k == META_HLC) {
                    continue;
                }
                batch.delete_cf(cf, k);
            }
        }
        self.db.write(batch)?;
        outbox.entries.clear();
        self.retention.reset();
        Ok(())
    }

    /// The checkpoint or savepoint this store was restored from, if any.
    pub(super) fn restored_from(&self) -> Result<Option<String>, StoreError> {
        Ok(self
            .db
            .get_cf(self.cf(CF_META), META_RESTORED_FROM)?
            .map(|v| String::from_utf8_lossy(&v).into_owned()))
    }

    /// The highest HLC stamp this region issued before, if any.
    pub(super) fn hlc_high_water(&self) -> Result<Option<HlcTimestamp>, StoreError> {
        self.db
            .get_cf(self.cf(CF_META), META_HLC)?
            .map(|v| decode_hlc(&v))
            .transpose()
    }

    /// Per remote region, the newest origin time merged from it.
    pub(super) fn remote_applied(&self) -> Result<BTreeMap<RegionId, HlcTimestamp>, StoreError> {
        let mut out = BTreeMap::new();
        let iter = self.db.iterator_cf(
            self.cf(CF_META),
            IteratorMode::From(META_REMOTE.as_bytes(), Direction::Forward),
        );
        for item in iter {
            let (k, v) = item?;
            let Some(region) = k.strip_prefix(META_REMOTE.as_bytes()) else {
                break;
            };
            if let Ok(region) = RegionId::new(String::from_utf8_lossy(region).into_owned()) {
                out.insert(region, decode_hlc(&v)?);
            }
        }
        Ok(out)
    }

    pub(super) fn get(&self, key: &str) -> Result<Option<CrdtValue>, StoreError> {
        self.db
            .get_pinned_cf(self.cf(CF_STATE), key.as_bytes())?
            .map(|v| {
                decode_value(&v).map_err(|source| StoreError::Corrupt {
                    what: "state",
                    source,
                })
            })
            .transpose()
    }

    /// The highest lease epoch this region's own records on an updates partition applied
    /// for an owned shard (0: none yet): the fence its next records there are judged by.
    pub(super) fn fence(&self, shard: u32, partition: i32) -> Result<u64, StoreError> {
        match self
            .db
            .get_cf(self.cf(CF_META), fence_key(shard, partition))?
        {
            None => Ok(0),
            Some(v) => Ok(u64::from_be_bytes(
                v.as_slice()
                    .try_into()
                    .map_err(|_| StoreError::BadLength { what: "fence" })?,
            )),
        }
    }

    /// Every fence, by owned shard and updates partition.
    pub(super) fn fences(&self) -> Result<BTreeMap<(u32, i32), u64>, StoreError> {
        self.fences_with(ReadOptions::default())
    }

    fn fences_with(&self, read: ReadOptions) -> Result<BTreeMap<(u32, i32), u64>, StoreError> {
        let mut out = BTreeMap::new();
        let iter = self.db.iterator_cf_opt(
            self.cf(CF_META),
            read,
            IteratorMode::From(META_FENCE.as_bytes(), Direction::Forward),
        );
        for item in iter {
            let (k, v) = item?;
            let Some(id) = k.strip_prefix(META_FENCE.as_bytes()) else {
                break;
            };
            let bad = |_| StoreError::BadLength { what: "fence" };
            let (shard, partition) = id
                .split_at_checked(4)
                .ok_or(StoreError::BadLength { what: "fence" })?;
            let shard = u32::from_be_bytes(shard.try_into().map_err(bad)?);
            let partition = i32::from_be_bytes(partition.try_into().map_err(bad)?);
            out.insert(
                (shard, partition),
                u64::from_be_bytes(v[..].try_into().map_err(bad)?),
            );
        }
        Ok(out)
    }

    /// The event-time watermark of an updates partition's windowed records (`None`: no
    /// windowed record yet).
    pub(super) fn watermark(&self, partition: i32) -> Result<Option<u64>, StoreError> {
        self.db
            .get_cf(self.cf(CF_META), watermark_key(partition))?
            .map(|v| decode_u64(&v, "watermark"))
            .transpose()
    }

    /// How far the final windows of `partition` went to the outputs topic, if ever.
    pub(super) fn outputs_through(&self, partition: i32) -> Result<Option<u64>, StoreError> {
        self.db
            .get_cf(self.cf(CF_META), outputs_through_key(partition))?
            .map(|v| decode_u64(&v, "outputs through"))
            .transpose()
    }

    /// Records that the final windows of `partition` went out through `through`; never
    /// moves back.
    pub(super) fn raise_outputs_through(
        &self,
        partition: i32,
        through: u64,
    ) -> Result<(), StoreError> {
        let stored = self.outputs_through(partition)?;
        if stored.is_none_or(|s| s < through) {
            self.db.put_cf(
                self.cf(CF_META),
                outputs_through_key(partition),
                through.to_be_bytes(),
            )?;
        }
        Ok(())
    }

    /// Per remote region, the newest watermark its heartbeats carried (on this instance's
    /// partition).
    pub(super) fn remote_watermarks(&self) -> Result<BTreeMap<RegionId, u64>, StoreError> {
        let mut out = BTreeMap::new();
        let iter = self.db.iterator_cf(
            self.cf(CF_META),
            IteratorMode::From(META_REMOTE_WATERMARK.as_bytes(), Direction::Forward),
        );
        for item in iter {
            let (k, v) = item?;
            let Some(rest) = k.strip_prefix(META_REMOTE_WATERMARK.as_bytes()) else {
                break;
            };
            let Some((region, _partition)) = rest.split_last_chunk::<4>() else {
                continue;
            };
            if let Ok(region) = RegionId::new(String::from_utf8_lossy(region).into_owned()) {
                out.insert(region, decode_u64(&v, "remote watermark")?);
            }
        }
        Ok(out)
    }

    /// Deletes, from now on, the slices `rule` says expired (by the lowest watermark over
    /// this region and `expected`).
    pub(super) fn expire_with(&self, expected: Vec<RegionId>, rule: Expiry) {
        self.retention.set_rule(expected, rule);
    }

    /// Whether a stored key is a slice past its retention.
    pub(super) fn expired(&self, key: &str) -> bool {
        self.retention.expired(key.as_bytes())
    }

    /// Compacts the state and id column families: expired slices are dropped.
    pub(super) fn compact(&self) {
        for name in [CF_STATE, CF_DEDUP] {
            self.db
                .compact_range_cf(self.cf(name), None::<&[u8]>, None::<&[u8]>);
        }
    }

    /// Bytes the state and id column families hold: live SST files and memtables.
    pub(super) fn state_bytes(&self) -> u64 {
        let property = |cf: &'static str, name: &str| {
            (self.db.property_int_value_cf(self.cf(cf), name))
                .ok()
                .flatten()
                .unwrap_or(0)
        };
        [CF_STATE, CF_DEDUP]
            .map(|cf| {
                property(cf, "rocksdb.live-sst-files-size")
                    + property(cf, "rocksdb.cur-size-all-mem-tables")
            })
            .iter()
            .sum()
    }

    /// Every watermark, by updates partition.
    pub(super) fn watermarks(&self) -> Result<BTreeMap<i32, u64>, StoreError> {
        self.watermarks_with(ReadOptions::default())
    }

    fn watermarks_with(&self, read: ReadOptions) -> Result<BTreeMap<i32, u64>, StoreError> {
        let mut out = BTreeMap::new();
        let iter = self.db.iterator_cf_opt(
            self.cf(CF_META),
            read,
            IteratorMode::From(META_WATERMARK.as_bytes(), Direction::Forward),
        );
        for item in iter {
            let (k, v) = item?;
            let Some(partition) = k.strip_prefix(META_WATERMARK.as_bytes()) else {
                break;
            };
            let partition = partition
                .try_into()
                .map(i32::from_be_bytes)
                .map_err(|_| StoreError::BadLength { what: "watermark" })?;
            out.insert(partition, decode_u64(&v, "watermark")?);
        }
        Ok(out)
    }

    /// Removes the late events and owned outputs read at or below `offset` from the
    /// outbox: a committed shipping round covering that offset shipped them (a crash came
    /// before they were cleared). Answers how many.
    pub(super) fn drop_records_through(&self, offset: i64) -> Result<usize, StoreError> {
        let mut outbox = self.lock_outbox();
        let mut shipped: Vec<String> = Vec::new();
        for prefix in [window::LATE_PREFIX, window::OUTPUT_PREFIX] {
            shipped.extend(
                outbox
                    .entries
                    .range(prefix.to_string()..)
                    .map(|(k, _)| k)
                    .take_while(|k| k.starts_with(prefix))
                    .filter(|k| window::record_position(k).is_some_and(|(_, o)| o <= offset))
                    .cloned(),
            );
        }
        let mut batch = WriteBatch::default();
        for key in &shipped {
            batch.delete_cf(self.cf(CF_OUTBOX), key.as_bytes());
        }
        self.db.write(batch)?;
        for key in &shipped {
            outbox.entries.remove(key);
        }
        Ok(shipped.len())
    }

    /// The idempotency ids most recently applied to `key`, oldest first.
    pub(super) fn recent_ids(&self, key: &str) -> Result<VecDeque<String>, StoreError> {
        let mut ids = VecDeque::new();
        let Some(bytes) = self.db.get_pinned_cf(self.cf(CF_DEDUP), key.as_bytes())? else {
            return Ok(ids);
        };
        let mut rest = &bytes[..];
        while rest.len() >= 2 {
            let len = u16::from_be_bytes([rest[0], rest[1]]) as usize;
            let id = rest
                .get(2..2 + len)
                .ok_or(StoreError::BadLength { what: "dedup ids" })?;
            ids.push_back(String::from_utf8_lossy(id).into_owned());
            rest = &rest[2 + len..];
        }
        Ok(ids)
    }

    /// Up to `limit` keys starting with `prefix`, in key order, strictly after `after`.
    pub(super) fn scan(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, CrdtValue)>, StoreError> {
        let start = after.unwrap_or(prefix);
        let iter = self.db.iterator_cf(
            self.cf(CF_STATE),
            IteratorMode::From(start.as_bytes(), Direction::Forward),
        );
        let mut out = Vec::new();
        for item in iter {
            let (k, v) = item?;
            if !k.starts_with(prefix.as_bytes()) || out.len() >= limit {
                break;
            }
            let key = String::from_utf8_lossy(&k).into_owned();
            if Some(key.as_str()) == after {
                continue;
            }
            let value = decode_value(&v).map_err(|source| StoreError::Corrupt {
                what: "state",
                source,
            })?;
            out.push((key, value));
        }
        Ok(out)
    }

    /// The last applied offset of every partition of `topic`.
    pub(super) fn source_offsets(&self, topic: &str) -> Result<BTreeMap<i32, i64>, StoreError> {
        self.source_offsets_with(topic, ReadOptions::default())
    }

    fn source_offsets_with(
        &self,
        topic: &str,
        read: ReadOptions,
    ) -> Result<BTreeMap<i32, i64>, StoreError> {
        let prefix = offset_prefix(topic);
        let mut out = BTreeMap::new();
        let iter = self.db.iterator_cf_opt(
            self.cf(CF_OFFSETS),
            read,
            IteratorMode::From(&prefix, Direction::Forward),
        );
        for item in iter {
            let (k, v) = item?;
            if !k.starts_with(&prefix) {
                break;
            }
            let partition = k[prefix.len()..]
                .try_into()
                .map(i32::from_be_bytes)
                .map_err(|_| StoreError::BadLength { what: "offset key" })?;
            let offset = v[..]
                .try_into()
                .map(i64::from_be_bytes)
                .map_err(|_| StoreError::BadLength { what: "offset" })?;
            out.insert(partition, offset);
        }
        Ok(out)
    }

    /// Every pending outbox entry together with the source offsets of `topic` and the
    /// clock high-water mark, read from one snapshot: the entries hold every event applied
    /// up to those offsets that was not shipped before (commits write both in one batch).
    pub(super) fn outbox_snapshot(&self, topic: &str) -> Result<OutboxSnapshot, StoreError> {
        let (snapshot, entries) = {
            let outbox = self.lock_outbox();
            let entries = outbox
                .entries
                .iter()
                .map(|(key, (version, bytes))| OutboxEntry {
                    key: key.clone(),
                    bytes: bytes.clone(),
                    version: *version,
                })
                .collect();
            (self.db.snapshot(), entries)
        };
        let mut read = ReadOptions::default();
        read.set_snapshot(&snapshot);
        let hlc_high_water = self
            .db
            .get_cf_opt(self.cf(CF_META), META_HLC, &read)?
            .map(|v| decode_hlc(&v))
            .transpose()?;
        let mut read = ReadOptions::default();
        read.set_snapshot(&snapshot);
        let offsets = self.source_offsets_with(topic, read)?;
        let mut read = ReadOptions::default();
        read.set_snapshot(&snapshot);
        Ok(OutboxSnapshot {
            entries,
            offsets,
            hlc_high_water,
            fences: self.fences_with(read)?,
            watermarks: {
                let mut read = ReadOptions::default();
                read.set_snapshot(&snapshot);
                self.watermarks_with(read)?
            },
        })
    }

    /// How many keys the outbox holds.
    pub(super) fn outbox_len(&self) -> usize {
        self.lock_outbox().entries.len()
    }

    /// Removes shipped outbox entries — each only if it was not rewritten since it was
    /// read: a batch that wrote a newer delta for the key meanwhile keeps its entry, so
    /// the newer state is shipped too, never lost.
    pub(super) fn clear_outbox(&self, shipped: &[&OutboxEntry]) -> Result<usize, StoreError> {
        let mut outbox = self.lock_outbox();
        let cf = self.cf(CF_OUTBOX);
        let mut batch = WriteBatch::default();
        let unchanged: Vec<&OutboxEntry> = shipped
            .iter()
            .copied()
            .filter(|e| outbox.entries.get(&e.key).map(|(v, _)| *v) == Some(e.version))
            .collect();
        for entry in &unchanged {
            batch.delete_cf(cf, entry.key.as_bytes());
        }
        self.db.write(batch)?;
        for entry in &unchanged {
            outbox.entries.remove(&entry.key);
        }
        Ok(unchanged.len())
    }

    fn lock_outbox(&self) -> std::sync::MutexGuard<'_, Outbox> {
        self.outbox.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes this partition's part of one applied batch in one `WriteBatch`.
    pub(super) fn commit(
        &self,
        commit: &Commit<'_>,
        part: &PartCommit<'_>,
    ) -> Result<(), StoreError> {
        let mut batch = WriteBatch::default();
        let state = self.cf(CF_STATE);
        for (key, value) in &part.states {
            batch.put_cf(state, key.as_bytes(), encode_value(value));
        }
        let offsets = self.cf(CF_OFFSETS);
        let prefix = offset_prefix(commit.topic);
        for (partition, offset) in &part.offsets {
            let mut k = prefix.clone();
            k.extend_from_slice(&partition.to_be_bytes());
            batch.put_cf(offsets, k, offset.to_be_bytes());
        }
        let outbox_cf = self.cf(CF_OUTBOX);
        let outbox_entries: Vec<(&str, Vec<u8>)> = part
            .outbox
            .iter()
            .map(|delta| (delta.key.as_str(), delta.encode()))
            .chain(part.late.iter().map(|(k, v)| (*k, v.to_vec())))
            .collect();
        for (key, bytes) in &outbox_entries {
            batch.put_cf(outbox_cf, key.as_bytes(), bytes);
        }
        let writer = self.incarnation.load(Ordering::Relaxed);
        if !outbox_entries.is_empty() && writer != 0 {
            batch.put_cf(self.cf(CF_META), META_OUTBOX_WRITER, writer.to_be_bytes());
        }
        let dedup = self.cf(CF_DEDUP);
        for (key, ids) in &part.recent_ids {
            let mut v = Vec::new();
            for id in ids.iter() {
                // never cut: ingest refuses ids over `ingest.max-id-bytes` (≤ 65535)
                let id = &id.as_bytes()[..id.len().min(u16::MAX as usize)];
                v.extend_from_slice(&(id.len() as u16).to_be_bytes());
                v.extend_from_slice(id);
            }
            batch.put_cf(dedup, key.as_bytes(), v);
        }
        batch.put_cf(
            self.cf(CF_META),
            META_HLC,
            encode_hlc(commit.hlc_high_water),
        );
        for (&(shard, partition), epoch) in &part.fences {
            batch.put_cf(
                self.cf(CF_META),
                fence_key(shard, partition),
                epoch.to_be_bytes(),
            );
        }
        for &(partition, watermark) in &part.watermarks {
            batch.put_cf(
                self.cf(CF_META),
                watermark_key(partition),
                watermark.to_be_bytes(),
            );
        }
        if let Some((region, partition, watermark)) = part.remote_watermark {
            let key = remote_watermark_key(region, partition);
            let stored = self.db.get_cf(self.cf(CF_META), &key)?;
            let stored = stored
                .map(|v| decode_u64(&v, "remote watermark"))
                .transpose()?;
            // a heartbeat delivered again (at least once) never moves it back
            batch.put_cf(
                self.cf(CF_META),
                key,
                watermark.max(stored.unwrap_or(0)).to_be_bytes(),
            );
        }
        if let Some((region, newest)) = part.remote_applied {
            let key = format!("{META_REMOTE}{region}");
            batch.put_cf(self.cf(CF_META), key.as_bytes(), encode_hlc(newest));
        }
        let mut outbox = self.lock_outbox();
        self.db.write(batch)?;
        for &(_, watermark) in &part.watermarks {
            self.retention.own(watermark);
        }
        if let Some((region, _, watermark)) = part.remote_watermark {
            self.retention.remote(region, watermark);
        }
        for (key, bytes) in outbox_entries {
            let version = outbox.next_version;
            outbox.next_version += 1;
            outbox.entries.insert(key.to_owned(), (version, bytes));
        }
        Ok(())
    }
}

/// One partition's part of a [`Commit`], borrowed from it.
#[derive(Default)]
pub(super) struct PartCommit<'a> {
    pub states: Vec<(&'a str, &'a CrdtValue)>,
    pub offsets: Vec<(i32, i64)>,
    pub outbox: Vec<&'a Delta>,
    pub recent_ids: Vec<(&'a str, &'a VecDeque<String>)>,
    pub fences: BTreeMap<(u32, i32), u64>,
    pub watermarks: Vec<(i32, u64)>,
    /// Late events' outbox entries: key, encoded `LateEvent`.
    pub late: Vec<(&'a str, &'a [u8])>,
    pub remote_applied: Option<(&'a RegionId, HlcTimestamp)>,
    pub remote_watermark: Option<(&'a RegionId, i32, u64)>,
}

impl PartCommit<'_> {
    pub(super) fn is_empty(&self) -> bool {
        self.states.is_empty()
            && self.offsets.is_empty()
            && self.outbox.is_empty()
            && self.recent_ids.is_empty()
            && self.fences.is_empty()
            && self.watermarks.is_empty()
            && self.late.is_empty()
            && self.remote_applied.is_none()
            && self.remote_watermark.is_none()
    }
}

/// Where an entry read by [`PartitionStore::for_each_entry`] belongs in a store of several
/// partitions (a savepoint restore).
pub(super) enum Home {
    /// The partition the entry names (an offset, a fence, a watermark).
    Partition(i32),
    /// The partition of the state key.
    Key,
    /// Every partition (the incarnation, where the store was restored from).
    Every,
    /// Every partition, as the newest of the HLCs loaded and stored (the clock's
    /// high-water mark, the newest time merged from a remote).
    Newest,
}

pub(super) fn home_of(cf: &str, key: &[u8]) -> Result<Home, StoreError> {
    let named = |what| {
        key.last_chunk::<4>()
            .map(|p| Home::Partition(i32::from_be_bytes(*p)))
            .ok_or(StoreError::BadLength { what })
    };
    match cf {
        CF_STATE | CF_OUTBOX | CF_DEDUP => Ok(Home::Key),
        CF_OFFSETS => named("offset key"),
        CF_META if key.starts_with(META_FENCE.as_bytes()) => named("fence"),
        CF_META if key.starts_with(META_WATERMARK.as_bytes()) => named("watermark"),
        CF_META if key.starts_with(META_REMOTE_WATERMARK.as_bytes()) => named("remote watermark"),
        CF_META if key == META_HLC || key.starts_with(META_REMOTE.as_bytes()) => Ok(Home::Newest),
        CF_META => Ok(Home::Every),
        other => Err(StoreError::UnknownColumnFamily(other.to_owned())),
    }
}

pub(super) fn fence_key(shard: u32, partition: i32) -> Vec<u8> {
    let mut k = META_FENCE.as_bytes().to_vec();
    k.extend_from_slice(&shard.to_be_bytes());
    k.extend_from_slice(&partition.to_be_bytes());
    k
}

fn remote_watermark_key(region: &RegionId, partition: i32) -> Vec<u8> {
    let mut k = META_REMOTE_WATERMARK.as_bytes().to_vec();
    k.extend_from_slice(region.as_str().as_bytes());
    k.extend_from_slice(&partition.to_be_bytes());
    k
}

fn outputs_through_key(partition: i32) -> Vec<u8> {
    let mut k = META_OUTPUTS_THROUGH.as_bytes().to_vec();
    k.extend_from_slice(&partition.to_be_bytes());
    k
}

fn watermark_key(partition: i32) -> Vec<u8> {
    let mut k = META_WATERMARK.as_bytes().to_vec();
    k.extend_from_slice(&partition.to_be_bytes());
    k
}

fn decode_u64(v: &[u8], what: &'static str) -> Result<u64, StoreError> {
    v.try_into()
        .map(u64::from_be_bytes)
        .map_err(|_| StoreError::BadLength { what })
}

pub(super) fn encode_hlc(ts: HlcTimestamp) -> Vec<u8> {
    let mut v = Vec::with_capacity(12);
    v.extend_from_slice(&ts.wall_nanos.to_be_bytes());
    v.extend_from_slice(&ts.logical.to_be_bytes());
    v
}

pub(super) fn decode_hlc(v: &[u8]) -> Result<HlcTimestamp, StoreError> {
    if v.len() != 12 {
        return Err(StoreError::BadLength { what: "hlc" });
    }
    let wall = u64::from_be_bytes(v[..8].try_into().unwrap_or_default());
    let logical = u32::from_be_bytes(v[8..].try_into().unwrap_or_default());
    Ok(HlcTimestamp::new(wall, logical))
}

fn offset_prefix(topic: &str) -> Vec<u8> {
    let mut k = topic.as_bytes().to_vec();
    k.push(0);
    k
}
