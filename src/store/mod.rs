//! RocksDB: the region's state. Owns the column families and the one-`WriteBatch` commit
//! of an applied batch. Knows nothing of Kafka or gRPC: it stores what `ingest` decided.
//!
//! ```text
//!  column family  key                          value
//!  state          state key (UTF-8)            CrdtState protobuf (full state)
//!  offsets        topic \0 partition (i32 BE)  last applied offset (i64 BE)
//!  outbox         state key                    Delta protobuf (own part, to ship)
//!  dedup          state key                    recent idempotency ids (u16 BE length + bytes)…
//!  meta           "incarnation" | "hlc"        u32 BE | wall_nanos u64 BE, logical u32 BE
//!                 "remote/<region>"            newest origin HLC merged from that region
//!                 "restored-from"              the checkpoint or savepoint restored
//!                 "fence/<shard u32 BE><partition i32 BE>"
//!                                              highest lease epoch applied (u64 BE)
//!  offsets ids: the updates topic; "remote/<region>/<topic>" per remote (merged);
//!               "bootstrap/": the own deltas topic position a restored node read to
//! ```
//!
//! Guarantee: a batch's new states, the source offsets it consumed, its outbox entries and
//! the clock high-water mark are written in one `WriteBatch` (one WAL record), so after any
//! crash the store holds all of a batch or none of it, and resuming from the stored
//! offsets applies every record exactly once.

use std::collections::{BTreeMap, VecDeque};
use std::path::Path;

use rocksdb::{
    ColumnFamily, ColumnFamilyDescriptor, DB, Direction, IteratorMode, Options, ReadOptions,
    WriteBatch,
};

use crate::clock::HlcTimestamp;
use crate::crdt::{CrdtValue, DecodeError, Delta, RegionId, decode_value, encode_value};

const CF_STATE: &str = "state";
const CF_OFFSETS: &str = "offsets";
const CF_OUTBOX: &str = "outbox";
const CF_META: &str = "meta";
const CF_DEDUP: &str = "dedup";
/// Every column family, in the order a savepoint lists them.
pub const COLUMN_FAMILIES: [&str; 5] = [CF_STATE, CF_OFFSETS, CF_OUTBOX, CF_META, CF_DEDUP];
const META_INCARNATION: &[u8] = b"incarnation";
/// Set by a restore: the checkpoint or savepoint the store came from.
const META_RESTORED_FROM: &[u8] = b"restored-from";
/// Offsets id of the own deltas topic position a restored node bootstraps from.
const BOOTSTRAP_OFFSETS: &str = "bootstrap/";
const META_HLC: &[u8] = b"hlc";
/// `remote/<region>`: the newest origin time merged from that region.
const META_REMOTE: &str = "remote/";
/// `fence/<shard u32 BE><partition i32 BE>` → the highest lease epoch the region's own
/// records on that updates partition applied for an owned shard (u64 BE).
const META_FENCE: &str = "fence/";

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("rocksdb: {0}")]
    Rocks(#[from] rocksdb::Error),
    #[error("stored {what} is corrupt: {source}")]
    Corrupt {
        what: &'static str,
        source: DecodeError,
    },
    #[error("stored {what} has a bad length")]
    BadLength { what: &'static str },
    #[error("storage task failed: {0}")]
    Task(String),
    #[error("unknown column family {0:?}")]
    UnknownColumnFamily(String),
}

/// What one applied batch writes.
pub struct Commit<'a> {
    pub topic: &'a str,
    pub states: &'a BTreeMap<String, CrdtValue>,
    pub offsets: &'a BTreeMap<i32, i64>,
    pub outbox: &'a [Delta],
    pub recent_ids: &'a BTreeMap<String, VecDeque<String>>,
    pub hlc_high_water: HlcTimestamp,
    /// For a batch of merged remote deltas: the remote region and the newest origin time
    /// applied from it.
    pub remote_applied: Option<(&'a RegionId, HlcTimestamp)>,
    /// Owned shards' fences per updates partition (highest lease epoch applied), written
    /// with the states.
    pub fences: &'a BTreeMap<(u32, i32), u64>,
}

/// In-memory mirror of the outbox column family.
#[derive(Default)]
struct Outbox {
    /// State key → (version of the last write, encoded `Delta`).
    entries: BTreeMap<String, (u64, Vec<u8>)>,
    next_version: u64,
}

/// One pending outbox entry as read by a shipping round.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutboxEntry {
    pub key: String,
    /// An encoded `Delta`.
    pub bytes: Vec<u8>,
    /// Changes whenever the key's entry is rewritten.
    pub version: u64,
}

/// See [`Store::outbox_snapshot`].
pub struct OutboxSnapshot {
    /// In key order.
    pub entries: Vec<OutboxEntry>,
    pub offsets: BTreeMap<i32, i64>,
    pub hlc_high_water: Option<HlcTimestamp>,
    /// Every fence (owned shard, updates partition) as of `offsets`.
    pub fences: BTreeMap<(u32, i32), u64>,
}

pub struct Store {
    db: DB,
    /// The outbox column family's entries, mirrored in memory with a version per write.
    /// Its lock serializes outbox writes (commits) with taking a shipping snapshot and with
    /// the compare-and-delete of shipped entries, so the mirror always matches the column
    /// family, and a shipping round reads no RocksDB at all for the entries.
    outbox: std::sync::Mutex<Outbox>,
}

impl Store {
    /// Opens (or creates) the store in `dir`.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        let mut opts = Options::default();
        opts.create_if_missing(true);
        opts.create_missing_column_families(true);
        opts.set_compression_type(rocksdb::DBCompressionType::Lz4);
        let cfs = COLUMN_FAMILIES.map(|name| ColumnFamilyDescriptor::new(name, opts.clone()));
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
        Ok(Self {
            db,
            outbox: std::sync::Mutex::new(outbox),
        })
    }

    /// Opens a store (a checkpoint copy) to read it; nothing is written.
    pub fn open_read_only(dir: &Path) -> Result<Self, StoreError> {
        let db = DB::open_cf_for_read_only(&Options::default(), dir, COLUMN_FAMILIES, false)?;
        Ok(Self {
            db,
            outbox: std::sync::Mutex::new(Outbox::default()),
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
    pub fn incarnation(&self) -> Result<Option<u32>, StoreError> {
        match self.db.get_cf(self.cf(CF_META), META_INCARNATION)? {
            None => Ok(None),
            Some(v) => Ok(Some(u32::from_be_bytes(v.as_slice().try_into().map_err(
                |_| StoreError::BadLength {
                    what: "incarnation",
                },
            )?))),
        }
    }

    pub fn set_incarnation(&self, incarnation: u32) -> Result<(), StoreError> {
        self.db.put_cf(
            self.cf(CF_META),
            META_INCARNATION,
            incarnation.to_be_bytes(),
        )?;
        Ok(())
    }

    /// Writes a RocksDB checkpoint into the new directory `dir`: the memtables are flushed,
    /// then the live SST files are hard-linked and the small metadata files copied.
    pub fn checkpoint_to(&self, dir: &Path) -> Result<(), StoreError> {
        rocksdb::checkpoint::Checkpoint::new(&self.db)?.create_checkpoint(dir)?;
        Ok(())
    }

    /// Every stored position: offsets id (a topic, or `remote/<region>/<topic>`) →
    /// partition → last applied offset.
    pub fn all_offsets(&self) -> Result<BTreeMap<String, BTreeMap<i32, i64>>, StoreError> {
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
    pub fn for_each_entry<E: From<StoreError>>(
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

    /// Writes entries read by [`Store::for_each_entry`] (a savepoint restore), in one batch.
    pub fn load(&self, entries: &[(String, Vec<u8>, Vec<u8>)]) -> Result<(), StoreError> {
        let mut batch = WriteBatch::default();
        for (cf, k, v) in entries {
            let Some(name) = COLUMN_FAMILIES.iter().find(|n| **n == cf.as_str()) else {
                return Err(StoreError::UnknownColumnFamily(cf.clone()));
            };
            batch.put_cf(self.cf(name), k, v);
        }
        self.db.write(batch)?;
        Ok(())
    }

    /// Marks a restored store so that its next start bootstraps: the incarnation is
    /// forgotten (the node takes a new one after merging its own deltas topic, read from
    /// `deltas_next`, the deltas topic's end offsets when the copy was taken).
    pub fn prepare_bootstrap(
        &self,
        deltas_topic: &str,
        deltas_next: &BTreeMap<i32, i64>,
        restored_from: &str,
    ) -> Result<(), StoreError> {
        let offsets = self.cf(CF_OFFSETS);
        let mut batch = WriteBatch::default();
        let prefix = offset_prefix(&format!("{BOOTSTRAP_OFFSETS}{deltas_topic}"));
        for item in self
            .db
            .iterator_cf(offsets, IteratorMode::From(&prefix, Direction::Forward))
        {
            let (k, _) = item?;
            if !k.starts_with(&prefix) {
                break;
            }
            batch.delete_cf(offsets, k);
        }
        for (partition, next) in deltas_next {
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
    pub fn bootstrap_offsets(&self, deltas_topic: &str) -> Result<BTreeMap<i32, i64>, StoreError> {
        self.source_offsets(&format!("{BOOTSTRAP_OFFSETS}{deltas_topic}"))
    }

    /// The checkpoint or savepoint this store was restored from, if any.
    pub fn restored_from(&self) -> Result<Option<String>, StoreError> {
        Ok(self
            .db
            .get_cf(self.cf(CF_META), META_RESTORED_FROM)?
            .map(|v| String::from_utf8_lossy(&v).into_owned()))
    }

    /// The highest HLC stamp this region issued before, if any.
    pub fn hlc_high_water(&self) -> Result<Option<HlcTimestamp>, StoreError> {
        self.db
            .get_cf(self.cf(CF_META), META_HLC)?
            .map(|v| decode_hlc(&v))
            .transpose()
    }

    /// Per remote region, the newest origin time merged from it.
    pub fn remote_applied(&self) -> Result<BTreeMap<RegionId, HlcTimestamp>, StoreError> {
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

    pub fn get(&self, key: &str) -> Result<Option<CrdtValue>, StoreError> {
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
    pub fn fence(&self, shard: u32, partition: i32) -> Result<u64, StoreError> {
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
    pub fn fences(&self) -> Result<BTreeMap<(u32, i32), u64>, StoreError> {
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

    /// The idempotency ids most recently applied to `key`, oldest first.
    pub fn recent_ids(&self, key: &str) -> Result<VecDeque<String>, StoreError> {
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
    pub fn scan(
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
    pub fn source_offsets(&self, topic: &str) -> Result<BTreeMap<i32, i64>, StoreError> {
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
    pub fn outbox_snapshot(&self, topic: &str) -> Result<OutboxSnapshot, StoreError> {
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
        })
    }

    /// How many keys the outbox holds.
    pub fn outbox_len(&self) -> usize {
        self.lock_outbox().entries.len()
    }

    /// Removes shipped outbox entries — each only if it was not rewritten since it was
    /// read: a batch that wrote a newer delta for the key meanwhile keeps its entry, so
    /// the newer state is shipped too, never lost.
    pub fn clear_outbox(&self, shipped: &[OutboxEntry]) -> Result<usize, StoreError> {
        let mut outbox = self.lock_outbox();
        let cf = self.cf(CF_OUTBOX);
        let mut batch = WriteBatch::default();
        let unchanged: Vec<&OutboxEntry> = shipped
            .iter()
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

    /// Writes one applied batch atomically (see the module guarantee).
    pub fn commit(&self, commit: &Commit<'_>) -> Result<(), StoreError> {
        let mut batch = WriteBatch::default();
        let state = self.cf(CF_STATE);
        for (key, value) in commit.states {
            batch.put_cf(state, key.as_bytes(), encode_value(value));
        }
        let offsets = self.cf(CF_OFFSETS);
        let prefix = offset_prefix(commit.topic);
        for (partition, offset) in commit.offsets {
            let mut k = prefix.clone();
            k.extend_from_slice(&partition.to_be_bytes());
            batch.put_cf(offsets, k, offset.to_be_bytes());
        }
        let outbox_cf = self.cf(CF_OUTBOX);
        let outbox_entries: Vec<(&str, Vec<u8>)> = commit
            .outbox
            .iter()
            .map(|delta| (delta.key.as_str(), delta.encode()))
            .collect();
        for (key, bytes) in &outbox_entries {
            batch.put_cf(outbox_cf, key.as_bytes(), bytes);
        }
        let dedup = self.cf(CF_DEDUP);
        for (key, ids) in commit.recent_ids {
            let mut v = Vec::new();
            for id in ids {
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
        for (&(shard, partition), epoch) in commit.fences {
            batch.put_cf(
                self.cf(CF_META),
                fence_key(shard, partition),
                epoch.to_be_bytes(),
            );
        }
        if let Some((region, newest)) = commit.remote_applied {
            let key = format!("{META_REMOTE}{region}");
            batch.put_cf(self.cf(CF_META), key.as_bytes(), encode_hlc(newest));
        }
        let mut outbox = self.lock_outbox();
        self.db.write(batch)?;
        for (key, bytes) in outbox_entries {
            let version = outbox.next_version;
            outbox.next_version += 1;
            outbox.entries.insert(key.to_owned(), (version, bytes));
        }
        Ok(())
    }
}

fn fence_key(shard: u32, partition: i32) -> Vec<u8> {
    let mut k = META_FENCE.as_bytes().to_vec();
    k.extend_from_slice(&shard.to_be_bytes());
    k.extend_from_slice(&partition.to_be_bytes());
    k
}

fn encode_hlc(ts: HlcTimestamp) -> Vec<u8> {
    let mut v = Vec::with_capacity(12);
    v.extend_from_slice(&ts.wall_nanos.to_be_bytes());
    v.extend_from_slice(&ts.logical.to_be_bytes());
    v
}

fn decode_hlc(v: &[u8]) -> Result<HlcTimestamp, StoreError> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crdt::{Actor, GCounter, RegionId};

    fn counter(n: u64) -> CrdtValue {
        let mut c = GCounter::new();
        c.increment(&Actor::new(RegionId::new("us-east-1").unwrap(), 1), n)
            .unwrap();
        CrdtValue::GCounter(c)
    }

    #[test]
    fn a_commit_survives_reopen_with_its_offsets_outbox_and_clock() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = Store::open(dir.path()).unwrap();
            assert_eq!(store.incarnation().unwrap(), None);
            store.set_incarnation(7).unwrap();
            let states = BTreeMap::from([
                ("requests/a".to_string(), counter(3)),
                ("requests/b".to_string(), counter(1)),
            ]);
            let delta = Delta {
                key: "requests/a".into(),
                origin: RegionId::new("us-east-1").unwrap(),
                state: counter(3),
                origin_time: HlcTimestamp::new(1, 0),
                epoch: 0,
            };
            store
                .commit(&Commit {
                    topic: "geostate.updates",
                    states: &states,
                    offsets: &BTreeMap::from([(0, 41), (3, 7)]),
                    outbox: &[delta],
                    recent_ids: &BTreeMap::from([(
                        "requests/a".to_string(),
                        VecDeque::from(["x".to_string(), "y".to_string()]),
                    )]),
                    hlc_high_water: HlcTimestamp::new(99, 2),
                    remote_applied: Some((
                        &RegionId::new("eu-west-1").unwrap(),
                        HlcTimestamp::new(7, 0),
                    )),
                    fences: &BTreeMap::from([((5, 1), 3)]),
                })
                .unwrap();
        }
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(store.incarnation().unwrap(), Some(7));
        assert_eq!(
            (store.fence(5, 1).unwrap(), store.fence(5, 0).unwrap()),
            (3, 0)
        );
        assert_eq!(store.fences().unwrap(), BTreeMap::from([((5, 1), 3)]));
        assert_eq!(store.get("requests/a").unwrap(), Some(counter(3)));
        assert_eq!(store.get("requests/zzz").unwrap(), None);
        assert_eq!(
            store.source_offsets("geostate.updates").unwrap(),
            BTreeMap::from([(0, 41), (3, 7)])
        );
        assert!(store.source_offsets("other").unwrap().is_empty());
        let snapshot = store.outbox_snapshot("geostate.updates").unwrap();
        assert_eq!(snapshot.offsets, BTreeMap::from([(0, 41), (3, 7)]));
        assert_eq!(snapshot.hlc_high_water, Some(HlcTimestamp::new(99, 2)));
        let outbox = snapshot.entries;
        assert_eq!(outbox.len(), 1);
        assert_eq!(Delta::decode(&outbox[0].bytes).unwrap().key, "requests/a");
        // an entry rewritten since it was read is not cleared
        let stale = vec![OutboxEntry {
            version: outbox[0].version + 1,
            ..outbox[0].clone()
        }];
        assert_eq!(store.clear_outbox(&stale).unwrap(), 0);
        assert_eq!(store.clear_outbox(&outbox).unwrap(), 1);
        assert!(
            store
                .outbox_snapshot("geostate.updates")
                .unwrap()
                .entries
                .is_empty()
        );
        assert_eq!(store.recent_ids("requests/a").unwrap(), ["x", "y"]);
        assert!(store.recent_ids("requests/b").unwrap().is_empty());
        assert_eq!(
            store.hlc_high_water().unwrap(),
            Some(HlcTimestamp::new(99, 2))
        );
        let page = store.scan("requests/", None, 1).unwrap();
        assert_eq!(page.len(), 1);
        assert_eq!(page[0].0, "requests/a");
        let next = store.scan("requests/", Some("requests/a"), 10).unwrap();
        assert_eq!(
            next.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
            ["requests/b"]
        );
    }
}
