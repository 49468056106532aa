//! RocksDB: the region's state, one RocksDB instance per partition of the updates topic
//! (`<data-dir>/p<partition>/`), each with the column families below. A key's state, ids
//! and outbox entry live in its partition's instance (`log::partition_of`), beside that
//! partition's source offsets and fences, so a partition's state stands alone: it can be
//! copied, restored and (scale-out) moved without the others. Knows nothing of Kafka or
//! gRPC: it stores what `ingest` decided.
//!
//! ```text
//!  column family  key                          value
//!  state          state key (UTF-8)            CrdtState protobuf (full state)
//!  offsets        topic \0 partition (i32 BE)  last applied offset (i64 BE)
//!  outbox         state key                    Delta protobuf (own part, to ship)
//!                 "\0late/<partition>/<offset>" LateEvent protobuf (a late event, to ship)
//!  dedup          state key                    recent idempotency ids (u16 BE length + bytes)…
//!  meta           "incarnation" | "hlc"        u32 BE | wall_nanos u64 BE, logical u32 BE
//!                 "remote/<region>"            newest origin HLC merged from that region
//!                 "restored-from"              the checkpoint or savepoint restored
//!                 "fence/<shard u32 BE><partition i32 BE>"
//!                                              highest lease epoch applied (u64 BE)
//!                 "watermark/<partition i32 BE>" event-time watermark (ms, u64 BE)
//!  offsets ids: the updates topic; "remote/<region>/<topic>" per remote (merged);
//!               "bootstrap/": the own deltas topic position a restored node read to
//! ```
//!
//! Guarantee: a batch's part in one partition — the new states of its keys, the source
//! offsets it consumed on that partition, its outbox entries, fences, watermark and the clock
//! high-water mark — is written in one `WriteBatch` (one WAL record), so after any crash a
//! partition holds all of a batch's part or none of it, and resuming from its stored
//! offsets applies every record exactly once. (A record is applied only on its key's own
//! partition — ingest dead-letters one off it — so its state and its offset are in one
//! instance.)

mod partition;
mod retention;
mod source;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::clock::HlcTimestamp;
use crate::crdt::{CrdtValue, DecodeError, Delta, RegionId};
use crate::log::partitioner::partition_of;
use crate::window;
pub use partition::COLUMN_FAMILIES;
use partition::{Home, PartCommit, PartitionStore};
pub use retention::Expiry;
pub use source::StateSource;

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
    #[error(
        "{0} holds one RocksDB for every partition (a geostate before per-partition stores): take a savepoint with that version and restore it with this one"
    )]
    OneInstance(String),
    #[error(
        "{dir} holds {found} partitions, the updates topic has {expected}: a key's partition depends on the count, so a store is opened only with the count it was written with"
    )]
    PartitionCount {
        dir: String,
        found: usize,
        expected: usize,
    },
    #[error(
        "{dir} has no instance of partitions {missing:?} of the updates topic's {expected}: restore each from a checkpoint (`geostate restore --partition P`) before the node starts (unless the topic's partition count changed since the store was written: a store opens only with its own count)"
    )]
    Missing {
        dir: String,
        missing: Vec<usize>,
        expected: usize,
    },
    #[error("partition {partition} is not in this store of {partitions} partitions")]
    NoPartition { partition: i32, partitions: usize },
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
}

/// What one applied batch writes; [`Store::commit`] splits it by partition.
pub struct Commit<'a> {
    pub topic: &'a str,
    pub states: &'a BTreeMap<String, CrdtValue>,
    pub offsets: &'a BTreeMap<i32, i64>,
    pub outbox: &'a [Delta],
    pub recent_ids: &'a BTreeMap<String, VecDeque<String>>,
    pub hlc_high_water: HlcTimestamp,
    /// For a batch of merged remote deltas: what it applied of the remote region.
    pub remote_applied: Option<RemoteApplied<'a>>,
    /// Owned shards' fences per updates partition (highest lease epoch applied), written
    /// with the states.
    pub fences: &'a BTreeMap<(u32, i32), u64>,
    /// Per updates partition, the event-time watermark after the batch.
    pub watermarks: &'a BTreeMap<i32, u64>,
    /// Records for other topics to ship, one per source record: late events (outbox key
    /// [`crate::window::late_key`], an encoded `LateEvent`) and owned outputs
    /// ([`crate::window::output_key`], a JSON `RegisterChange`).
    pub late: &'a [(String, Vec<u8>)],
}

/// What a batch of merged deltas applied of one remote region, per partition.
#[derive(Clone, Copy)]
pub struct RemoteApplied<'a> {
    pub region: &'a RegionId,
    /// The newest origin time applied from it there.
    pub newest: &'a BTreeMap<i32, HlcTimestamp>,
    /// The newest watermark its heartbeats there carried: every delta it will ever ship
    /// for a slice closed at or before it is applied (kept, never moving back).
    pub watermarks: &'a BTreeMap<i32, u64>,
}

/// An entry as [`Store::for_each_entry`] reads it and [`Store::load`] writes it: column
/// family, key, value.
pub type Entry = (String, Vec<u8>, Vec<u8>);

/// One pending outbox entry as read by a shipping round.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutboxEntry {
    pub key: String,
    /// An encoded `Delta`.
    pub bytes: Vec<u8>,
    /// Changes whenever the key's entry is rewritten (versions count per partition).
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
    /// The partition's event-time watermark as of `offsets`.
    pub watermarks: BTreeMap<i32, u64>,
}

/// The region's state: one [`PartitionStore`] per partition, `parts[p]` in `<dir>/p<p>`.
pub struct Store {
    parts: Vec<PartitionStore>,
    /// `writers[p]`: the right to read-modify-write partition `p`'s state.
    writers: Vec<Arc<tokio::sync::Mutex<()>>>,
}

/// The right to read-modify-write one partition's state ([`Store::writer`]). It is owned:
/// work that needs it takes it into the blocking task that does the work, so that a future
/// dropped while it awaits that task (by a `select!` or a timeout) cannot free it while the
/// task runs on.
pub type StateWriter = tokio::sync::OwnedMutexGuard<()>;

/// The writers of several partitions ([`Store::writers`]), taken in ascending partition
/// order, so two tasks taking overlapping sets never wait on each other in a circle.
pub type StateWriters = Vec<StateWriter>;

/// The directory of partition `p`'s instance inside a data dir.
pub fn partition_dir(dir: &Path, partition: usize) -> PathBuf {
    dir.join(format!("p{partition}"))
}

/// `<data-dir>/partitions`: the partition count, written once every instance exists.
const COUNT_FILE: &str = "partitions";

/// The partition count a data dir was created with (`None`: a new dir, a restored copy, or
/// one whose creation was cut short), refusing one written as a single instance.
fn written_count(dir: &Path) -> Result<Option<usize>, StoreError> {
    if dir.join("CURRENT").exists() {
        return Err(StoreError::OneInstance(dir.display().to_string()));
    }
    let path = dir.join(COUNT_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => text
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| StoreError::BadLength {
                what: "partition count file",
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(StoreError::Io {
            what: format!("reading {}", path.display()),
            source,
        }),
    }
}

/// The partitions a data dir holds an instance of (`p<p>/CURRENT`).
fn instances_in(dir: &Path) -> BTreeSet<usize> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return BTreeSet::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name();
            let p = name.to_str()?.strip_prefix('p')?.parse::<usize>().ok()?;
            entry.path().join("CURRENT").exists().then_some(p)
        })
        .collect()
}

/// Writes the count file: to a temporary name, synced, then renamed.
fn write_count(dir: &Path, partitions: usize) -> Result<(), StoreError> {
    let io = |source| StoreError::Io {
        what: format!("writing {}", dir.join(COUNT_FILE).display()),
        source,
    };
    let tmp = dir.join(format!("{COUNT_FILE}.tmp"));
    let mut file = std::fs::File::create(&tmp).map_err(io)?;
    std::io::Write::write_all(&mut file, format!("{partitions}\n").as_bytes()).map_err(io)?;
    file.sync_all().map_err(io)?;
    std::fs::rename(&tmp, dir.join(COUNT_FILE)).map_err(io)
}

impl Store {
    /// Opens (or creates) the store of `partitions` partitions in `dir`. A dir created
    /// with another count is refused (keys would be looked up in the wrong partition), and
    /// so is one that lost a partition's instance (never recreated empty).
    pub fn open(dir: &Path, partitions: usize) -> Result<Self, StoreError> {
        let partitions = partitions.max(1);
        let written = written_count(dir)?;
        if let Some(found) = written {
            let dir = dir.display().to_string();
            let expected = partitions;
            if found != partitions {
                return Err(StoreError::PartitionCount {
                    dir,
                    found,
                    expected,
                });
            }
            let present = instances_in(Path::new(&dir));
            let missing: Vec<usize> = (0..partitions).filter(|p| !present.contains(p)).collect();
            if !missing.is_empty() {
                return Err(StoreError::Missing {
                    dir,
                    missing,
                    expected,
                });
            }
        }
        let parts = (0..partitions)
            .map(|p| PartitionStore::open(&partition_dir(dir, p), None))
            .collect::<Result<_, _>>()?;
        if written.is_none() {
            write_count(dir, partitions)?;
        }
        Ok(Self::of_parts(parts))
    }

    /// Opens (or creates) a store of `partitions` partitions held in `env`, RocksDB's
    /// in-memory environment, under `dir` there: for deterministic simulations, which
    /// crash a store by dropping it and open it again from what `env` kept. Nothing is
    /// written to disk, and no partition count is checked.
    pub fn open_in(env: &rocksdb::Env, dir: &Path, partitions: usize) -> Result<Self, StoreError> {
        let parts = (0..partitions.max(1))
            .map(|p| PartitionStore::open(&partition_dir(dir, p), Some(env)))
            .collect::<Result<_, _>>()?;
        Ok(Self::of_parts(parts))
    }

    /// Opens the partitions `dir` holds (a restored copy, which knows its count).
    pub fn open_existing(dir: &Path) -> Result<Self, StoreError> {
        let count = match written_count(dir)? {
            Some(count) => count,
            None => instances_in(dir).last().map_or(0, |last| last + 1),
        };
        Self::open(dir, count)
    }

    /// Opens a store (a checkpoint copy) to read it; nothing is written.
    pub fn open_read_only(dir: &Path) -> Result<Self, StoreError> {
        let parts = instances_in(dir)
            .into_iter()
            .map(|p| PartitionStore::open_read_only(&partition_dir(dir, p)))
            .collect::<Result<_, _>>()?;
        Ok(Self::of_parts(parts))
    }

    fn of_parts(parts: Vec<PartitionStore>) -> Self {
        let writers = (0..parts.len().max(1)).map(|_| Arc::default()).collect();
        Self { parts, writers }
    }

    pub fn partitions(&self) -> usize {
        self.parts.len()
    }

    /// Waits for the right to read-modify-write `partition`'s state, held by one writer at
    /// a time (the partition's ingest, a merge of remote deltas, a catch-up): two writers
    /// reading the same key and each writing back their result would lose one's update.
    /// Partitions have a writer each, so they apply in parallel. [`Store::commit`] itself
    /// takes no lock; every writer that reads state first holds this while it reads and
    /// until its commit returned. A partition this store does not hold shares partition
    /// 0's writer (its commit is refused anyway).
    pub async fn writer(&self, partition: i32) -> StateWriter {
        self.writers[self.writer_of(partition)]
            .clone()
            .lock_owned()
            .await
    }

    fn writer_of(&self, partition: i32) -> usize {
        (usize::try_from(partition).ok())
            .filter(|&p| p < self.writers.len())
            .unwrap_or(0)
    }

    /// The writers of `partitions`, each once (a partition this store does not hold
    /// counts as 0), taken in ascending order.
    pub async fn writers(&self, partitions: BTreeSet<i32>) -> StateWriters {
        let writers: BTreeSet<usize> = partitions.into_iter().map(|p| self.writer_of(p)).collect();
        let mut held = Vec::with_capacity(writers.len());
        for at in writers {
            held.push(self.writers[at].clone().lock_owned().await);
        }
        held
    }

    /// The partition whose instance holds `key` (a state key, or a late event's or output's
    /// outbox key).
    pub fn partition_of_key(&self, key: &str) -> i32 {
        self.index_of(key) as i32
    }

    fn of(&self, key: &str) -> &PartitionStore {
        &self.parts[self.index_of(key)]
    }

    /// The instance of a state key (a window's slice: its windowed key's) or of a late
    /// event's outbox entry (the partition it was read on).
    fn index_of(&self, key: &str) -> usize {
        match window::record_position(key) {
            Some((p, _)) => usize::try_from(p).unwrap_or(0) % self.parts.len(),
            None => {
                partition_of(window::home_key(key).as_bytes(), self.parts.len() as i32) as usize
            }
        }
    }

    fn part(&self, partition: i32) -> Result<&PartitionStore, StoreError> {
        usize::try_from(partition)
            .ok()
            .and_then(|p| self.parts.get(p))
            .ok_or(StoreError::NoPartition {
                partition,
                partitions: self.parts.len(),
            })
    }

    /// The incarnation this store was created with: `None` unless every partition has the
    /// same one (a crash while it was being set leaves the store to bootstrap again).
    pub fn incarnation(&self) -> Result<Option<u32>, StoreError> {
        let mut found = None;
        for part in &self.parts {
            match (part.incarnation()?, found) {
                (None, _) => return Ok(None),
                (Some(i), Some(f)) if i != f => return Ok(None),
                (Some(i), _) => found = Some(i),
            }
        }
        Ok(found)
    }

    pub fn set_incarnation(&self, incarnation: u32) -> Result<(), StoreError> {
        self.parts
            .iter()
            .try_for_each(|part| part.set_incarnation(incarnation))
    }

    /// Writes a RocksDB checkpoint of every partition into the new directory `dir`
    /// (`dir/p<p>`): the memtables are flushed, then the live SST files are hard-linked
    /// and the small metadata files copied.
    pub fn checkpoint_to(&self, dir: &Path) -> Result<(), StoreError> {
        std::fs::create_dir_all(dir).map_err(|source| StoreError::Io {
            what: format!("creating {}", dir.display()),
            source,
        })?;
        for (p, part) in self.parts.iter().enumerate() {
            part.checkpoint_to(&partition_dir(dir, p))?;
        }
        Ok(())
    }

    /// Every stored position: offsets id (a topic, or `remote/<region>/<topic>`) →
    /// partition → last applied offset.
    pub fn all_offsets(&self) -> Result<BTreeMap<String, BTreeMap<i32, i64>>, StoreError> {
        let mut out: BTreeMap<String, BTreeMap<i32, i64>> = BTreeMap::new();
        for part in &self.parts {
            for (id, offsets) in part.all_offsets()? {
                out.entry(id).or_default().extend(offsets);
            }
        }
        Ok(out)
    }

    /// Calls `each(column family, key, value)` for every entry of every column family of
    /// every partition, each partition read from one snapshot (a savepoint). Entries of
    /// `meta` that every partition keeps (incarnation, clock) come once per partition.
    pub fn for_each_entry<E: From<StoreError>>(
        &self,
        mut each: impl FnMut(&str, &[u8], &[u8]) -> Result<(), E>,
    ) -> Result<u64, E> {
        let mut count = 0;
        for part in &self.parts {
            count += part.for_each_entry(&mut each)?;
        }
        Ok(count)
    }

    /// Writes entries read by [`Store::for_each_entry`] (a savepoint restore), each into
    /// its partition's instance: a state key's by its hash, an offset or a fence into the
    /// partition it names, the clock and remote times as the newest of those loaded. So a
    /// savepoint of one instance (an older geostate) loads too, and its state alone
    /// (`--seed`) into any partition count; an offset or fence of a partition this store
    /// lacks is refused.
    pub fn load(&self, entries: &[Entry]) -> Result<(), StoreError> {
        let mut split: Vec<Vec<&Entry>> = vec![Vec::new(); self.parts.len()];
        let mut newest: BTreeMap<(&str, &[u8]), &Entry> = BTreeMap::new();
        for entry in entries {
            let (cf, k, v) = entry;
            match partition::home_of(cf, k)? {
                Home::Key => {
                    let key = String::from_utf8_lossy(k);
                    split[self.index_of(&key)].push(entry);
                }
                Home::Partition(p) => {
                    self.part(p)?;
                    split[p as usize].push(entry);
                }
                Home::Every => split.iter_mut().for_each(|s| s.push(entry)),
                Home::Newest => {
                    let kept = newest.entry((cf.as_str(), k.as_slice())).or_insert(entry);
                    if partition::decode_hlc(v)? > partition::decode_hlc(&kept.2)? {
                        *kept = entry;
                    }
                }
            }
        }
        for (part, mut entries) in self.parts.iter().zip(split) {
            entries.extend(newest.values().copied());
            part.load(&entries)?;
        }
        Ok(())
    }

    /// Marks a restored store so that its next start bootstraps: the incarnation is
    /// forgotten (the node takes a new one after merging its own deltas topic, read from
    /// `deltas_next`, the deltas topic's end offsets when the copy was taken; partition
    /// `p`'s position is kept in partition `p`). With `keep_own` (a checkpoint of this
    /// region's own store), a partition whose copy records how far it holds its own deltas
    /// is read from there instead (see [`PartitionStore::prepare_bootstrap`]).
    pub fn prepare_bootstrap(
        &self,
        deltas_topic: &str,
        deltas_next: &BTreeMap<i32, i64>,
        restored_from: &str,
        keep_own: bool,
    ) -> Result<(), StoreError> {
        for (p, part) in self.parts.iter().enumerate() {
            let own: BTreeMap<i32, i64> = deltas_next
                .iter()
                .filter(|(partition, _)| usize::try_from(**partition) == Ok(p))
                .map(|(p, next)| (*p, *next))
                .collect();
            part.prepare_bootstrap(deltas_topic, &own, restored_from, keep_own)?;
        }
        Ok(())
    }

    /// Where a restored store's own deltas topic is read from (last offset before it).
    pub fn bootstrap_offsets(&self, deltas_topic: &str) -> Result<BTreeMap<i32, i64>, StoreError> {
        self.union(|part| part.bootstrap_offsets(deltas_topic))
    }

    /// The checkpoint or savepoint this store was restored from, if any.
    pub fn restored_from(&self) -> Result<Option<String>, StoreError> {
        match self.parts.first() {
            Some(part) => part.restored_from(),
            None => Ok(None),
        }
    }

    /// The highest HLC stamp this region issued before, if any.
    pub fn hlc_high_water(&self) -> Result<Option<HlcTimestamp>, StoreError> {
        let mut newest = None;
        for part in &self.parts {
            newest = newest.max(part.hlc_high_water()?);
        }
        Ok(newest)
    }

    /// Per remote region, the newest origin time merged from it into `partition`.
    pub fn remote_applied(
        &self,
        partition: i32,
    ) -> Result<BTreeMap<RegionId, HlcTimestamp>, StoreError> {
        self.part(partition)?.remote_applied()
    }

    pub fn get(&self, key: &str) -> Result<Option<CrdtValue>, StoreError> {
        self.of(key).get(key)
    }

    /// The highest lease epoch this region's own records on an updates partition applied
    /// for an owned shard (0: none yet): the fence its next records there are judged by.
    pub fn fence(&self, shard: u32, partition: i32) -> Result<u64, StoreError> {
        self.part(partition)?.fence(shard, partition)
    }

    /// Every fence, by owned shard and updates partition.
    pub fn fences(&self) -> Result<BTreeMap<(u32, i32), u64>, StoreError> {
        self.union(PartitionStore::fences)
    }

    /// The event-time watermark of an updates partition's windowed records (`None`: none
    /// yet): the one its next records' lateness is judged by.
    pub fn watermark(&self, partition: i32) -> Result<Option<u64>, StoreError> {
        self.part(partition)?.watermark(partition)
    }

    /// How far the final windows of `partition` went to the outputs topic, if ever.
    pub fn outputs_through(&self, partition: i32) -> Result<Option<u64>, StoreError> {
        self.part(partition)?.outputs_through(partition)
    }

    /// Records that the final windows of `partition` went out through `through` (never
    /// moves back).
    pub fn raise_outputs_through(&self, partition: i32, through: u64) -> Result<(), StoreError> {
        self.part(partition)?
            .raise_outputs_through(partition, through)
    }

    /// Per remote region, the newest watermark its heartbeats on `partition` carried.
    pub fn remote_watermarks(&self, partition: i32) -> Result<BTreeMap<RegionId, u64>, StoreError> {
        self.part(partition)?.remote_watermarks()
    }

    /// Deletes, from now on, the stored slices `rule` says expired, judged by the lowest
    /// watermark over this region and `expected` on their partition (RocksDB's
    /// compactions drop them).
    pub fn expire_with(&self, expected: Vec<RegionId>, rule: Expiry) {
        for part in &self.parts {
            part.expire_with(expected.clone(), rule.clone());
        }
    }

    /// Whether a stored key is a slice past its retention (deleted, or soon).
    pub fn expired(&self, key: &str) -> bool {
        self.of(key).expired(key)
    }

    /// Compacts every partition's state: expired slices are dropped now.
    pub fn compact(&self) {
        self.parts.iter().for_each(PartitionStore::compact);
    }

    /// Bytes the state (values and idempotency ids) holds over every partition instance:
    /// live SST files and memtables.
    pub fn state_bytes(&self) -> u64 {
        self.parts.iter().map(PartitionStore::state_bytes).sum()
    }

    /// Every watermark, by updates partition.
    pub fn watermarks(&self) -> Result<BTreeMap<i32, u64>, StoreError> {
        self.union(PartitionStore::watermarks)
    }

    /// Removes partition `partition`'s late events and owned outputs read at or below
    /// `offset` from its outbox: a committed shipping round covering the offset shipped
    /// them.
    pub fn drop_records_through(&self, partition: i32, offset: i64) -> Result<usize, StoreError> {
        self.part(partition)?.drop_records_through(offset)
    }

    /// The idempotency ids most recently applied to `key`, oldest first.
    pub fn recent_ids(&self, key: &str) -> Result<VecDeque<String>, StoreError> {
        self.of(key).recent_ids(key)
    }

    /// Up to `limit` keys starting with `prefix`, in key order, strictly after `after`
    /// (every partition's first `limit`, merged).
    pub fn scan(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, CrdtValue)>, StoreError> {
        let every: BTreeSet<i32> = (0..self.parts.len())
            .filter_map(|p| i32::try_from(p).ok())
            .collect();
        self.scan_in(&every, prefix, after, limit)
    }

    /// [`Store::scan`] over `partitions` only.
    pub fn scan_in(
        &self,
        partitions: &BTreeSet<i32>,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, CrdtValue)>, StoreError> {
        let mut out = Vec::new();
        for &p in partitions {
            out.extend(self.part(p)?.scan(prefix, after, limit)?);
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out.truncate(limit);
        Ok(out)
    }

    /// The last applied offset of every partition of `topic`.
    pub fn source_offsets(&self, topic: &str) -> Result<BTreeMap<i32, i64>, StoreError> {
        self.union(|part| part.source_offsets(topic))
    }

    fn union<K: Ord, V>(
        &self,
        read: impl Fn(&PartitionStore) -> Result<BTreeMap<K, V>, StoreError>,
    ) -> Result<BTreeMap<K, V>, StoreError> {
        let mut out = BTreeMap::new();
        for part in &self.parts {
            out.extend(read(part)?);
        }
        Ok(out)
    }

    /// Partition `partition`'s pending outbox entries together with its source offset of
    /// `topic`, its fences and the clock high-water mark, read from one snapshot: the
    /// entries hold every event applied up to that offset that was not shipped before
    /// (commits write both in one batch).
    pub fn outbox_snapshot(
        &self,
        partition: i32,
        topic: &str,
    ) -> Result<OutboxSnapshot, StoreError> {
        self.part(partition)?.outbox_snapshot(topic)
    }

    /// How many keys the outbox holds.
    pub fn outbox_len(&self) -> usize {
        self.parts.iter().map(PartitionStore::outbox_len).sum()
    }

    /// How many keys the outbox of these partitions holds.
    pub fn outbox_len_in(&self, partitions: &BTreeSet<i32>) -> usize {
        partitions
            .iter()
            .filter_map(|&p| self.part(p).ok())
            .map(PartitionStore::outbox_len)
            .sum()
    }

    /// Records that partition `partition`'s copy holds every delta of its own deltas
    /// topic partition up to `offset` (a round it shipped, or a catch-up that merged
    /// them): where the next catch-up reads from.
    pub fn own_deltas_through(
        &self,
        deltas_topic: &str,
        partition: i32,
        offset: i64,
    ) -> Result<(), StoreError> {
        self.part(partition)?
            .own_deltas_through(deltas_topic, partition, offset)
    }

    /// The incarnation that wrote partition `partition`'s outbox entries last, if recorded:
    /// whose increments its copy may hold beyond what was shipped.
    pub fn outbox_writer(&self, partition: i32) -> Result<Option<u32>, StoreError> {
        self.part(partition)?.outbox_writer()
    }

    /// Forgets partition `partition`'s copy (see [`PartitionStore::discard`]): it held
    /// increments no one shipped, and another node applied those records since.
    pub fn discard(&self, partition: i32) -> Result<(), StoreError> {
        self.part(partition)?.discard()
    }

    /// Removes shipped outbox entries — each only if it was not rewritten since it was
    /// read: a batch that wrote a newer delta for the key meanwhile keeps its entry, so
    /// the newer state is shipped too, never lost.
    pub fn clear_outbox(&self, shipped: &[OutboxEntry]) -> Result<usize, StoreError> {
        let mut split: Vec<Vec<&OutboxEntry>> = vec![Vec::new(); self.parts.len()];
        for entry in shipped {
            split[self.index_of(&entry.key)].push(entry);
        }
        let mut cleared = 0;
        for (part, entries) in self.parts.iter().zip(split) {
            if !entries.is_empty() {
                cleared += part.clear_outbox(&entries)?;
            }
        }
        Ok(cleared)
    }

    /// Writes one applied batch, each partition's part atomically (see the module
    /// guarantee): states, ids and outbox entries by their key's partition, offsets,
    /// fences and the remote's newest time by the partition they name; every written
    /// partition gets the clock's high-water mark.
    pub fn commit(&self, commit: &Commit<'_>) -> Result<(), StoreError> {
        let mut split: Vec<PartCommit<'_>> = (0..self.parts.len())
            .map(|_| PartCommit::default())
            .collect();
        for (key, value) in commit.states {
            split[self.index_of(key)].states.push((key, value));
        }
        for delta in commit.outbox {
            split[self.index_of(&delta.key)].outbox.push(delta);
        }
        for (key, ids) in commit.recent_ids {
            split[self.index_of(key)].recent_ids.push((key, ids));
        }
        for (key, late) in commit.late {
            split[self.index_of(key)].late.push((key, late));
        }
        for (&partition, &offset) in commit.offsets {
            self.part(partition)?;
            split[partition as usize].offsets.push((partition, offset));
        }
        for (&partition, &watermark) in commit.watermarks {
            self.part(partition)?;
            split[partition as usize]
                .watermarks
                .push((partition, watermark));
        }
        for (&(shard, partition), &epoch) in commit.fences {
            self.part(partition)?;
            split[partition as usize]
                .fences
                .insert((shard, partition), epoch);
        }
        if let Some(remote) = commit.remote_applied {
            for (&partition, &at) in remote.newest {
                self.part(partition)?;
                split[partition as usize].remote_applied = Some((remote.region, at));
            }
            for (&partition, &watermark) in remote.watermarks {
                self.part(partition)?;
                split[partition as usize].remote_watermark =
                    Some((remote.region, partition, watermark));
            }
        }
        for (part, split) in self.parts.iter().zip(&split) {
            if !split.is_empty() {
                part.commit(commit, split)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
