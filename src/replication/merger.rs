//! Inbound: merge a remote region's deltas into local state.
//!
//! ```text
//!  <remote>.geostate.deltas ──recv──► batch ──merge_batch (pure)──► states
//!        ──Store::commit: ONE WriteBatch = merged states + remote offsets + newest origin
//!        ──► freshness (per remote: newest origin time, lag), watchers
//! ```
//!
//! Guarantees: merging is idempotent and commutative, so duplicated or reordered
//! deliveries (at-least-once MirrorMaker 2, replays after a crash) leave the same state;
//! the remote offsets are committed with the merged states, so a restart resumes exactly
//! after the last merged delta; a merge never writes the outbox (deltas do not echo back).
//! An owned key's delta below the epoch of the key's value is refused (fenced); a merge never
//! raises the fence local records are judged by (see `ingest::batch::Fences`).
//!
//! A delta stamped (its origin time, or a register's own stamp) further ahead of the local
//! clock than `max-clock-offset` is not refused but held: its partition is not merged past
//! it, and it is read again once the clock allows (a refused delta would be lost: its
//! origin never ships that content again unless it writes the key again). A delta may only
//! carry its origin's own part (counter entries of its origin's actors, a register its
//! origin wrote), under its own key, within the ingest size limits: anything else is
//! refused and counted, never merged.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::watch;

use super::{Freshness, RemoteProgress};
use crate::clock::{ClockError, Hlc, HlcTimestamp};
use crate::config::{Config, IngestConfig, Namespaces, Ownership, RemoteConfig};
use crate::crdt::{CrdtError, CrdtValue, DecodeError, Delta, RESUME_KEY, RegionId, ResumePoint};
use crate::log::{self, Batching, Reader, Record};
use crate::metrics as m;
use crate::partition::{Change, Owned, Partitions};
use crate::shutdown::stopped;
use crate::store::{Commit, RemoteApplied, StateSource, Store, StoreError};

const RETRY_PAUSE: Duration = Duration::from_millis(500);
const MAX_BATCH: usize = 1000;
/// A held partition is read again after its delta's excess over `max-clock-offset`, within
/// these bounds (the others are not read meanwhile).
const HOLD_MIN: Duration = Duration::from_millis(50);
const HOLD_MAX: Duration = Duration::from_secs(1);

/// Why a remote delta was not merged.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Refusal {
    #[error("malformed delta: {0}")]
    Malformed(DecodeError),
    #[error("delta from {found} on {expected}'s topic")]
    WrongOrigin { expected: RegionId, found: RegionId },
    #[error(transparent)]
    Clock(ClockError),
    #[error("key {key:?} is in no namespace here")]
    NoNamespace { key: String },
    #[error("key {key:?}: {source}")]
    Type { key: String, source: CrdtError },
    #[error("delta of {origin} for key {key:?} carries state that is not {origin}'s own")]
    NotOwnPart { key: String, origin: RegionId },
    #[error("key {key:?}: {what} of {bytes} bytes is over the limit of {limit}")]
    TooLarge {
        key: String,
        what: &'static str,
        bytes: usize,
        limit: usize,
    },
    #[error("owned key {key:?} at epoch {epoch}, below epoch {highest} of its current value")]
    Fenced {
        key: String,
        epoch: u64,
        highest: u64,
    },
}

impl Refusal {
    pub fn code(&self) -> &'static str {
        match self {
            Refusal::Malformed(_) => "malformed",
            Refusal::WrongOrigin { .. } => "wrong_origin",
            Refusal::Clock(e) => e.code(),
            Refusal::NoNamespace { .. } => "no_namespace",
            Refusal::Type { .. } => "type_mismatch",
            Refusal::NotOwnPart { .. } => "not_own_part",
            Refusal::TooLarge { .. } => "too_large",
            Refusal::Fenced { .. } => "fenced",
        }
    }

    /// Whether the delta is held and read again later instead (its stamp is ahead of the
    /// local clock now, but the clock will get there).
    pub fn holds(&self) -> Option<Duration> {
        match self {
            Refusal::Clock(ClockError::AheadOfLocal { ahead, max, .. }) => {
                Some(ahead.saturating_sub(*max))
            }
            _ => None,
        }
    }
}

/// What a batch of remote deltas changes.
#[derive(Debug, Default)]
pub struct Merged {
    pub states: BTreeMap<String, CrdtValue>,
    pub offsets: BTreeMap<i32, i64>,
    pub refused: Vec<(i32, i64, Refusal)>,
    /// Per partition, the newest origin time among the merged deltas.
    pub newest: BTreeMap<i32, HlcTimestamp>,
    pub merged: usize,
    /// Deltas of slices past their retention, not merged.
    pub expired: usize,
    /// Per partition, the newest heartbeat among the records (not a delta: never merged).
    pub heartbeats: BTreeMap<i32, u64>,
    /// Per partition, the highest watermark those heartbeats carried.
    pub watermarks: BTreeMap<i32, u64>,
    /// The resume points among the records (not deltas: never merged), absorbed
    /// ([`ResumePoint::absorb`]): every partition's newest position.
    pub resume: Option<ResumePoint>,
    /// The incarnations that wrote the resume points among the records.
    pub writers: BTreeSet<u32>,
    /// Per partition, the delta it is held at and why: neither it nor anything after it
    /// in its partition is merged, and `offsets` stops just before it.
    pub held: BTreeMap<i32, (i64, Refusal)>,
    /// Per key, the id window of the last delta merged that carried one (at most
    /// `ingest.dedup-window` ids, the newest): kept only by a copy of the node's own
    /// region (`merge_and_commit`).
    pub recent_ids: BTreeMap<String, VecDeque<String>>,
}

impl Merged {
    /// How long until the clock has passed every held delta's bound (`None`: none held).
    pub fn hold_for(&self) -> Option<Duration> {
        self.held.values().filter_map(|(_, why)| why.holds()).max()
    }
}

/// Merges `records` (deltas of `remote`) on top of what `source` holds. Per record:
/// a heartbeat or resume point is noted ([`control_record`]); a delta is checked (one
/// held for the clock stops its partition here), then merged into its key's state
/// ([`merge_one`]).
pub fn merge_batch<S: StateSource>(
    records: &[Record],
    source: &S,
    remote: &RegionId,
    namespaces: &Namespaces,
    limits: &IngestConfig,
    hlc: &Hlc,
) -> Result<Merged, S::Error> {
    let mut out = Merged::default();
    let mut loaded: BTreeMap<String, Option<CrdtValue>> = BTreeMap::new();
    for record in records {
        if out.held.contains_key(&record.partition) {
            continue;
        }
        out.offsets
            .entry(record.partition)
            .and_modify(|o| *o = (*o).max(record.offset))
            .or_insert(record.offset);
        if control_record(record, remote, &mut out) {
            continue;
        }
        let (mut delta, ownership) = match check(record, remote, namespaces, limits, hlc) {
            Ok(checked) => checked,
            Err(why) if why.holds().is_some() => {
                // read again from here: everything before it in the partition is done
                out.offsets.insert(record.partition, record.offset - 1);
                out.held.insert(record.partition, (record.offset, why));
                continue;
            }
            Err(why) => {
                out.refused.push((record.partition, record.offset, why));
                continue;
            }
        };
        if source.expired(&delta.key) {
            out.expired += 1;
            continue;
        }
        if !loaded.contains_key(&delta.key) {
            let current = source.state(&delta.key)?;
            loaded.insert(delta.key.clone(), current);
        }
        let Some(slot) = loaded.get_mut(&delta.key) else {
            continue;
        };
        match merge_one(slot.as_ref(), &delta, ownership) {
            Ok(state) => {
                out.states.insert(delta.key.clone(), state.clone());
                *slot = Some(state);
                let newest = out.newest.entry(record.partition).or_default();
                *newest = (*newest).max(delta.origin_time);
                out.merged += 1;
                if !delta.recent_ids.is_empty() {
                    let skip = delta.recent_ids.len().saturating_sub(limits.dedup_window);
                    let ids = delta.recent_ids.drain(skip..).collect();
                    out.recent_ids.insert(delta.key, ids);
                }
            }
            // the key stays as it was
            Err(why) => out.refused.push((record.partition, record.offset, why)),
        }
    }
    Ok(out)
}

/// Notes a heartbeat or a resume point (true), refusing one that does not decode or is
/// another region's; false for a delta.
fn control_record(record: &Record, remote: &RegionId, out: &mut Merged) -> bool {
    let refuse = |out: &mut Merged, why| out.refused.push((record.partition, record.offset, why));
    match record.key.as_deref() {
        Some(super::HEARTBEAT_KEY) => {
            let beat = record.payload.as_deref().and_then(super::Heartbeat::decode);
            match beat {
                Some(beat) if beat.origin == remote.as_str() => {
                    let at = out.heartbeats.entry(record.partition).or_default();
                    *at = (*at).max(beat.wall_nanos);
                    if let Some(w) = beat.watermark_ms {
                        let at = out.watermarks.entry(record.partition).or_default();
                        *at = (*at).max(w);
                    }
                }
                _ => refuse(
                    out,
                    Refusal::Malformed(DecodeError::Invalid {
                        field: "heartbeat",
                        reason: format!("not a heartbeat of {remote}"),
                    }),
                ),
            }
            true
        }
        Some(RESUME_KEY) => {
            match ResumePoint::decode(record.payload.as_deref().unwrap_or_default()) {
                Ok(resume) => {
                    out.writers.insert(resume.incarnation);
                    ResumePoint::absorb_into(&mut out.resume, resume);
                }
                Err(why) => refuse(out, Refusal::Malformed(why)),
            }
            true
        }
        _ => false,
    }
}

/// The key's state with `delta` merged in, or why not (the state is left as it was).
fn merge_one(
    current: Option<&CrdtValue>,
    delta: &Delta,
    ownership: Ownership,
) -> Result<CrdtValue, Refusal> {
    if ownership == Ownership::Owned {
        // The register's own stamp, not the envelope, is what would win the merge. A
        // delta below the key's epoch is a stale holder's value: refused and counted.
        // One below the shard's highest epoch but not the key's is a write its holder
        // accepted under a valid lease that arrives late (the holder was cut off after
        // accepting it): it merges, as it does in every other region, so all converge.
        let epoch = delta.state.epoch();
        let key_epoch = current.map_or(0, CrdtValue::epoch);
        if epoch < key_epoch {
            return Err(Refusal::Fenced {
                key: delta.key.clone(),
                epoch,
                highest: key_epoch,
            });
        }
    }
    let Some(current) = current else {
        return Ok(delta.state.clone());
    };
    let mut next = current.clone();
    match next.merge(&delta.state) {
        Ok(()) => Ok(next),
        Err(source) => Err(Refusal::Type {
            key: delta.key.clone(),
            source,
        }),
    }
}

fn check(
    record: &Record,
    remote: &RegionId,
    namespaces: &Namespaces,
    limits: &IngestConfig,
    hlc: &Hlc,
) -> Result<(Delta, Ownership), Refusal> {
    let delta =
        Delta::decode(record.payload.as_deref().unwrap_or_default()).map_err(Refusal::Malformed)?;
    if &delta.origin != remote {
        return Err(Refusal::WrongOrigin {
            expected: remote.clone(),
            found: delta.origin,
        });
    }
    if record.key.as_deref() != Some(delta.key.as_bytes()) {
        return Err(Refusal::Malformed(DecodeError::Invalid {
            field: "key",
            reason: "the record's key is not the delta's key".into(),
        }));
    }
    let too_large = |what, bytes, limit| Refusal::TooLarge {
        key: delta.key.clone(),
        what,
        bytes,
        limit,
    };
    if delta.key.len() > limits.max_key_bytes {
        return Err(too_large("key", delta.key.len(), limits.max_key_bytes));
    }
    if let CrdtValue::LwwRegister(r) = &delta.state
        && r.value().len() > limits.max_value_bytes
    {
        return Err(too_large("value", r.value().len(), limits.max_value_bytes));
    }
    if let Some(id) = delta
        .recent_ids
        .iter()
        .find(|id| id.len() > limits.max_id_bytes)
    {
        return Err(too_large("idempotency id", id.len(), limits.max_id_bytes));
    }
    if !delta.state.is_all_from(remote) {
        return Err(Refusal::NotOwnPart {
            key: delta.key.clone(),
            origin: remote.clone(),
        });
    }
    let ns = namespaces
        .lookup(&delta.key)
        .ok_or_else(|| Refusal::NoNamespace {
            key: delta.key.clone(),
        })?;
    if ns.crdt != delta.state.crdt_type() {
        return Err(Refusal::Type {
            key: delta.key.clone(),
            source: CrdtError::TypeMismatch {
                expected: ns.crdt,
                found: delta.state.crdt_type(),
            },
        });
    }
    hlc.observe(delta.origin_time).map_err(Refusal::Clock)?;
    // the stamp that decides a register's winner is bounded too
    if let CrdtValue::LwwRegister(r) = &delta.state {
        hlc.observe(r.stamp().hlc).map_err(Refusal::Clock)?;
    }
    Ok((delta, ns.ownership))
}

/// Merges `records` (deltas of `origin`) into `store` and commits the merged states in
/// one `WriteBatch` with no outbox entry (a merge never ships), off the async threads,
/// holding the store's writer from the first read to the commit (the blocking task holds
/// it: dropping this future does not free it while the merge runs on).
/// With `positions`, the consumed offsets and the newest origin time merged are committed
/// with them, under that offsets id. With `owned` (the merger's: the handles of its partitions
/// when it started reading them), the records of a partition let go or taken again since
/// are left out (its handle then is cut): a catch-up of the copy may have rebuilt it
/// meanwhile.
pub async fn merge_and_commit(
    store: Arc<Store>,
    config: Arc<Config>,
    hlc: Arc<Hlc>,
    mut records: Vec<Record>,
    origin: RegionId,
    positions: Option<String>,
    owned: Option<Owned>,
) -> Result<Merged, StoreError> {
    // the partitions the records are on, and those of the deltas' keys (a delta off its
    // key's partition, which no shipper writes, is merged into its key's); heartbeats and
    // resume points (keys starting with a NUL) write only their record's partition
    let touched = (records.iter()).flat_map(|r| {
        let key = (r.key.as_deref())
            .filter(|k| !k.starts_with(b"\0"))
            .and_then(|k| std::str::from_utf8(k).ok());
        [Some(r.partition), key.map(|k| store.partition_of_key(k))]
    });
    let touched = touched.flatten().collect();
    let writer = store.writers(touched).await;
    tokio::task::spawn_blocking(move || {
        let _writer = writer;
        // a catch-up that follows a cut or a take waits for this writer
        if let Some(owned) = &owned {
            keep_in_term(&mut records, owned);
        }
        let merged = merge_batch(
            &records,
            store.as_ref(),
            &origin,
            &config.namespaces,
            &config.ingest,
            &hlc,
        )?;
        commit_merged(
            &store,
            &config,
            &hlc,
            &merged,
            &origin,
            positions.as_deref(),
        )?;
        Ok(merged)
    })
    .await
    .unwrap_or_else(|e| Err(StoreError::Task(e.to_string())))
}

/// Leaves out of `records` those of a partition whose term in `owned` (the handles the
/// merger read them in) was cut since.
pub fn keep_in_term(records: &mut Vec<Record>, owned: &Owned) {
    records.retain(|r| owned.get(&r.partition).is_some_and(|h| !h.is_cut()));
}

/// Commits what [`merge_batch`] merged of `origin`'s deltas in one `WriteBatch` with no
/// outbox entry (a merge never ships); with `positions`, the consumed offsets and the
/// newest origin time merged with them, under that offsets id. The caller holds the
/// writers of the partitions merged from before `merge_batch` read the state.
pub fn commit_merged(
    store: &Store,
    config: &Config,
    hlc: &Hlc,
    merged: &Merged,
    origin: &RegionId,
    positions: Option<&str>,
) -> Result<(), StoreError> {
    let no_offsets = BTreeMap::new();
    let no_ids = BTreeMap::new();
    store.commit(&Commit {
        topic: positions.unwrap_or_default(),
        states: &merged.states,
        offsets: if positions.is_some() {
            &merged.offsets
        } else {
            &no_offsets
        },
        outbox: &[],
        // the origin's windows are this region's only for a copy of its own deltas
        recent_ids: if *origin == config.region {
            &merged.recent_ids
        } else {
            &no_ids
        },
        hlc_high_water: hlc.now(),
        remote_applied: positions.is_some().then_some(RemoteApplied {
            region: origin,
            newest: &merged.newest,
            watermarks: &merged.watermarks,
        }),
        fences: &BTreeMap::new(),
        watermarks: &BTreeMap::new(),
        late: &[],
    })
}

/// Why a merger stopped.
#[derive(Debug, thiserror::Error)]
pub enum MergeError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(
        "{topic} has {found} partitions, this region's topics {expected}: every mirrored deltas topic needs the partition count of the region's own topics"
    )]
    PartitionCounts {
        topic: String,
        found: usize,
        expected: usize,
    },
}

/// The task merging one remote region's deltas.
pub struct Merger {
    /// The partition count of this region's topics: the remote topic must have it too.
    pub partitions: usize,
    pub config: Arc<Config>,
    pub hlc: Arc<Hlc>,
    pub store: Arc<Store>,
    /// The node's partitions: the merger merges the owned ones.
    pub owned: Arc<Partitions>,
    pub freshness: Arc<Freshness>,
    pub progress: Arc<RemoteProgress>,
}

impl Merger {
    /// The key under which this remote's consumed offsets are stored.
    pub fn offsets_id(remote: &RemoteConfig) -> String {
        format!("remote/{}/{}", remote.region, remote.topic)
    }

    fn remote(&self) -> &RemoteConfig {
        &self.progress.remote
    }

    /// Merges the remote's deltas of the partitions this node owns, following them as they
    /// change (a new reader after each change, from the stored offsets; a batch being
    /// merged is merged and committed first).
    pub async fn run(self, mut stop: watch::Receiver<bool>) -> Result<(), MergeError> {
        let mut owned = self.owned.subscribe();
        loop {
            // the handles of the partitions read: one let go since is cut at the commit
            let read: Owned = owned.borrow_and_update().clone();
            let partitions: Vec<i32> = read.keys().copied().collect();
            let reader = tokio::select! {
                reader = self.subscribe(&partitions, &mut stop) => reader?,
                _ = owned.changed() => continue,
            };
            let Some(reader) = reader else {
                return Ok(());
            };
            if !self
                .merge_from(reader, &read, &mut stop, &mut owned)
                .await?
            {
                return Ok(());
            }
        }
    }

    /// Merges what `reader` reads (the partitions of `read`) until asked to stop (false)
    /// or until the partitions this node owns change (true), between batches.
    async fn merge_from(
        &self,
        mut reader: Reader,
        read: &Owned,
        stop: &mut watch::Receiver<bool>,
        owned: &mut watch::Receiver<Owned>,
    ) -> Result<bool, MergeError> {
        let partitions = reader.partitions().len();
        let batching = Batching {
            max: MAX_BATCH,
            linger: Duration::ZERO,
            idle: None,
        };
        let mut at_end = BTreeSet::new();
        self.note_caught_up(&at_end, partitions);
        loop {
            let batch = tokio::select! {
                batch = reader.next_batch(batching, stop) => batch,
                _ = owned.changed() => return Ok(true),
            };
            let Some(batch) = batch else {
                return Ok(false);
            };
            for (partition, next) in batch.at_end {
                self.at_end_of(partition, next);
                at_end.insert(partition);
            }
            if !batch.records.is_empty()
                && let Some((held, wait)) = self.merge(batch.records, read).await?
            {
                // not at their end until the held deltas are merged; what the client
                // fetched after them is read again with them
                for p in held {
                    at_end.remove(&p);
                }
                tokio::select! {
                    () = stopped(stop) => return Ok(false),
                    _ = owned.changed() => return Ok(true),
                    () = tokio::time::sleep(wait.clamp(HOLD_MIN, HOLD_MAX)) => {}
                }
                if let Err(e) = reader.reposition(&self.merged()?).await {
                    tracing::warn!(remote = %self.remote().region, error = %e, "reading held deltas again failed; retrying");
                }
                continue;
            }
            self.note_caught_up(&at_end, partitions);
            if let Some(e) = batch.failed {
                tokio::time::sleep(RETRY_PAUSE).await;
                reader.restart(&e, &self.merged()?).await;
            }
        }
    }

    /// Says once that every partition read was read to its end.
    fn note_caught_up(&self, at_end: &BTreeSet<i32>, partitions: usize) {
        if at_end.len() == partitions && !*self.progress.caught_up.borrow() {
            self.progress.caught_up.send_replace(true);
            tracing::info!(remote = %self.remote().region, "read every remote partition this node owns to its end");
        }
    }

    /// The offsets merged and stored, per partition.
    fn merged(&self) -> Result<BTreeMap<i32, i64>, StoreError> {
        self.store.source_offsets(&Self::offsets_id(self.remote()))
    }

    /// At a partition's end, the position can be past the last merged record (a commit
    /// marker of a transactional topic is never delivered): count it as read, for status.
    fn at_end_of(&self, partition: i32, next: Option<i64>) {
        if let Some(next) = next {
            self.progress.offsets.send_modify(|offsets| {
                let last = offsets.entry(partition).or_insert(-1);
                *last = (*last).max(next - 1);
            });
        }
    }

    /// Waits for the remote topic to exist (with this region's partition count), then
    /// positions a consumer of `owned` after the stored offsets. `None` if asked to stop
    /// first.
    async fn subscribe(
        &self,
        owned: &[i32],
        stop: &mut watch::Receiver<bool>,
    ) -> Result<Option<Reader>, MergeError> {
        let remote = self.remote();
        let kafka = remote.kafka(&self.config.kafka);
        // the stored offsets are read once no writer of these partitions is in flight: a
        // merge whose future was dropped (a stop, an abort) finishes its commit first, or
        // this reader would merge its records again and store offsets below its own
        drop(self.store.writers(owned.iter().copied().collect()).await);
        let applied = self.store.source_offsets(&Self::offsets_id(remote))?;
        loop {
            if *stop.borrow() {
                return Ok(None);
            }
            let attempt = async {
                let partitions = log::partitions(&kafka, &remote.topic).await?;
                if partitions.len() != self.partitions {
                    return Ok(Err(MergeError::PartitionCounts {
                        topic: remote.topic.clone(),
                        found: partitions.len(),
                        expected: self.partitions,
                    }));
                }
                let source = log::ConsumerSpec {
                    partitions: owned.to_vec(),
                    kafka: kafka.clone(),
                    group: format!("geostate-merge-{}", self.config.region),
                    report_end: true,
                    topic: remote.topic.clone(),
                    role: "merge",
                };
                Reader::start(source, &applied).await.map(Ok)
            };
            match attempt.await {
                Ok(Err(counts)) => return Err(counts),
                Ok(Ok(reader)) => {
                    self.progress
                        .partitions
                        .send_replace(reader.partitions().to_vec());
                    return Ok(Some(reader));
                }
                Err(e) => {
                    tracing::warn!(remote = %remote.region, topic = %remote.topic, error = %e, "waiting for the remote deltas topic");
                    tokio::select! {
                        () = stopped(stop) => return Ok(None),
                        () = tokio::time::sleep(Duration::from_secs(1)) => {}
                    }
                }
            }
        }
    }

    /// Merges one batch; answers the partitions held, and how long until the local clock
    /// allows what they are held at.
    async fn merge(
        &self,
        records: Vec<Record>,
        read: &Owned,
    ) -> Result<Option<(Vec<i32>, Duration)>, StoreError> {
        let merged = merge_and_commit(
            self.store.clone(),
            self.config.clone(),
            self.hlc.clone(),
            records,
            self.remote().region.clone(),
            Some(Merger::offsets_id(self.remote())),
            Some(read.clone()),
        )
        .await?;
        self.progress.offsets.send_modify(|offsets| {
            for (&p, &o) in &merged.offsets {
                offsets.insert(p, o);
            }
        });
        // after the commit: what came before each heartbeat is in the store
        let mut beats = self
            .progress
            .heartbeats
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        for (&p, &at) in &merged.heartbeats {
            let entry = beats.entry(p).or_default();
            *entry = (*entry).max(at);
        }
        drop(beats);
        self.progress
            .merged
            .fetch_add(merged.merged as u64, Ordering::Relaxed);
        self.progress
            .refused
            .fetch_add(merged.refused.len() as u64, Ordering::Relaxed);
        let region = self.remote().region.to_string();
        if merged.expired > 0 {
            metrics::counter!(m::DELTAS_EXPIRED, "region" => region.clone())
                .increment(merged.expired as u64);
        }
        metrics::counter!(m::DELTAS_MERGED, "region" => region.clone())
            .increment(merged.merged as u64);
        for (partition, offset, why) in &merged.refused {
            metrics::counter!(m::DELTAS_REFUSED, "region" => region.clone(), "reason" => why.code())
                .increment(1);
            tracing::warn!(remote = %region, partition, offset, reason = %why, "delta refused");
            if matches!(why, Refusal::Fenced { .. }) {
                metrics::counter!(m::FENCED, "path" => "merge").increment(1);
            }
        }
        for (partition, (offset, why)) in &merged.held {
            metrics::counter!(m::DELTAS_HELD, "region" => region.clone(), "reason" => why.code())
                .increment(1);
            tracing::warn!(remote = %region, partition, offset, reason = %why, "delta held until the local clock allows it");
        }
        let held = merged
            .hold_for()
            .map(|wait| (merged.held.keys().copied().collect(), wait));
        let now = self.hlc.physical().now_nanos();
        for (&partition, &newest) in &merged.newest {
            let lag = self
                .freshness
                .record(&self.remote().region, partition, newest, now);
            metrics::histogram!(m::REPLICATION_LAG_SECONDS, "region" => region.clone())
                .record(lag.as_secs_f64());
        }
        if self.owned.changes.receiver_count() > 0 && !merged.states.is_empty() {
            let changes: Vec<Change> = merged.states.into_iter().collect();
            let _ = self.owned.changes.send(Arc::new(changes));
        }
        Ok(held)
    }
}

#[cfg(test)]
mod tests;
