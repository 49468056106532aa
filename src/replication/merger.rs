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
use crate::ingest::batch::StateSource;
use crate::ingest::ingestor::{Change, IngestShared, Terms};
use crate::log::{self, Batching, Reader, Record};
use crate::metrics as m;
use crate::shutdown::stopped;
use crate::store::{Commit, RemoteApplied, Store, StoreError};

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
/// with them, under that offsets id. With `owned` (the merger's: its partitions' terms
/// when it started reading them), the records of a partition let go or taken again since
/// are left out: a catch-up of the copy may have rebuilt it meanwhile.
pub async fn merge_and_commit(
    store: Arc<Store>,
    config: Arc<Config>,
    hlc: Arc<Hlc>,
    mut records: Vec<Record>,
    origin: RegionId,
    positions: Option<String>,
    owned: Option<(Arc<IngestShared>, Terms)>,
) -> Result<Merged, StoreError> {
    let writer = store.writer().await;
    tokio::task::spawn_blocking(move || {
        let _writer = writer;
        // a catch-up that follows a cut or a take waits for this writer
        if let Some((shared, terms)) = &owned {
            records.retain(|r| shared.same_terms(terms, [r.partition]));
        }
        let merged = merge_batch(
            &records,
            store.as_ref(),
            &origin,
            &config.namespaces,
            &config.ingest,
            &hlc,
        )?;
        let no_offsets = BTreeMap::new();
        let no_ids = BTreeMap::new();
        store.commit(&Commit {
            topic: positions.as_deref().unwrap_or_default(),
            states: &merged.states,
            offsets: if positions.is_some() {
                &merged.offsets
            } else {
                &no_offsets
            },
            outbox: &[],
            // the origin's windows are this region's only for a copy of its own deltas
            recent_ids: if origin == config.region {
                &merged.recent_ids
            } else {
                &no_ids
            },
            hlc_high_water: hlc.now(),
            remote_applied: positions.is_some().then_some(RemoteApplied {
                region: &origin,
                newest: &merged.newest,
                watermarks: &merged.watermarks,
            }),
            fences: &BTreeMap::new(),
            watermarks: &BTreeMap::new(),
            late: &[],
        })?;
        Ok(merged)
    })
    .await
    .unwrap_or_else(|e| Err(StoreError::Task(e.to_string())))
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
    pub shared: Arc<IngestShared>,
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
        let mut owned = self.shared.owned.subscribe();
        loop {
            // before reading `owned`: a change after this is seen at the commit
            let terms = self.shared.terms();
            let partitions: Vec<i32> = owned.borrow_and_update().iter().copied().collect();
            let reader = tokio::select! {
                reader = self.subscribe(&partitions, &mut stop) => reader?,
                _ = owned.changed() => continue,
            };
            let Some(reader) = reader else {
                return Ok(());
            };
            if !self
                .merge_from(reader, &terms, &mut stop, &mut owned)
                .await?
            {
                return Ok(());
            }
        }
    }

    /// Merges what `reader` reads (its partitions in `terms`) until asked to stop (false)
    /// or until the partitions this node owns change (true), between batches.
    async fn merge_from(
        &self,
        mut reader: Reader,
        terms: &Terms,
        stop: &mut watch::Receiver<bool>,
        owned: &mut watch::Receiver<BTreeSet<i32>>,
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
                && let Some((held, wait)) = self.merge(batch.records, terms).await?
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
        terms: &Terms,
    ) -> Result<Option<(Vec<i32>, Duration)>, StoreError> {
        let merged = merge_and_commit(
            self.store.clone(),
            self.config.clone(),
            self.hlc.clone(),
            records,
            self.remote().region.clone(),
            Some(Merger::offsets_id(self.remote())),
            Some((self.shared.clone(), terms.clone())),
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
        if self.shared.changes.receiver_count() > 0 && !merged.states.is_empty() {
            let changes: Vec<Change> = merged.states.into_iter().collect();
            let _ = self.shared.changes.send(Arc::new(changes));
        }
        Ok(held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::crdt::{Actor, GCounter};
    use futures_util::FutureExt;

    /// `d` as the record at offset `at` of partition 0.
    fn record(d: &Delta, at: u64) -> Record {
        Record {
            partition: 0,
            offset: at as i64,
            timestamp_ms: None,
            key: Some(d.key.as_bytes().to_vec()),
            payload: Some(d.encode()),
        }
    }

    fn delta(origin: &str, key: &str, count: u64, at: u64) -> Record {
        let mut c = GCounter::new();
        c.increment(&Actor::new(RegionId::new(origin).unwrap(), 1), count)
            .unwrap();
        let d = Delta {
            key: key.into(),
            origin: RegionId::new(origin).unwrap(),
            state: CrdtValue::GCounter(c),
            origin_time: HlcTimestamp::new(at, 0),
            epoch: 0,
            recent_ids: Vec::new(),
        };
        record(&d, at)
    }

    /// `merge_batch` with the example region's namespaces and limits.
    fn merge<S: StateSource>(
        records: &[Record],
        stored: &S,
        remote: &RegionId,
        hlc: &Hlc,
    ) -> Result<Merged, S::Error> {
        let path = crate::repo_file("regions/us-east-1.toml");
        let config = Config::load(&path).unwrap();
        merge_batch(
            records,
            stored,
            remote,
            &config.namespaces,
            &config.ingest,
            hlc,
        )
    }

    const SEC: u64 = 1_000_000_000;

    /// `Merger::run` drops its merge future whenever the node's owned partitions change.
    /// The merge goes on in the blocking pool: until it has committed, no other writer may
    /// read-modify-write state, or the merge's commit rolls that writer's update back (an
    /// acknowledged increment lost in every region).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cancelled_merge_keeps_other_writers_out_until_it_committed() {
        let config = Arc::new(Config::load(&crate::repo_file("regions/us-east-1.toml")).unwrap());
        let remote = config.replication.remotes[0].clone();
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path(), 1).unwrap());
        let shared = Arc::new(IngestShared::default());
        let clock = Arc::new(ManualClock::new(100 * SEC));
        let hlc = Arc::new(Hlc::new(clock, Duration::from_millis(500)));
        let merger = Merger {
            partitions: 1,
            config: config.clone(),
            hlc,
            store: store.clone(),
            shared: shared.clone(),
            freshness: Arc::new(Freshness::default()),
            progress: Arc::new(RemoteProgress::new(remote.clone(), BTreeMap::new())),
        };
        // long enough to be cancelled inside its blocking part; trips/k1 is read first
        let origin = remote.region.as_str();
        let records: Vec<Record> = (1..=20_000u64)
            .map(|i| delta(origin, &format!("trips/k{}", i % 1000), i, i))
            .collect();
        let offsets_id = Merger::offsets_id(&remote);
        let committed = || store.source_offsets(&offsets_id).unwrap().get(&0) == Some(&20_000);

        let terms = shared.terms();
        let mut merging = Box::pin(merger.merge(records, &terms));
        assert!(
            merging.as_mut().now_or_never().is_none(),
            "the merge runs on"
        );
        drop(merging); // what Merger::run's select! does when `owned` changes
        if let Some(free) = store.writer().now_or_never() {
            assert!(
                committed(),
                "the state lock is free while the cancelled merge has not committed"
            );
            drop(free);
        }

        // an ingest-style read-modify-write under the lock: one local increment
        let local = Actor::new(config.region.clone(), 7);
        let writer = store.writer().await;
        // were the merge still running, it read trips/k1 (its first key) by now
        tokio::time::sleep(Duration::from_millis(20)).await;
        let mut counter = match store.get("trips/k1").unwrap() {
            Some(CrdtValue::GCounter(c)) => c,
            None => GCounter::new(),
            other => panic!("{other:?}"),
        };
        counter.increment(&local, 1).unwrap();
        let states = BTreeMap::from([("trips/k1".to_string(), CrdtValue::GCounter(counter))]);
        store
            .commit(&Commit {
                topic: "",
                states: &states,
                offsets: &BTreeMap::new(),
                outbox: &[],
                recent_ids: &BTreeMap::new(),
                hlc_high_water: HlcTimestamp::new(0, 0),
                remote_applied: None,
                fences: &BTreeMap::new(),
                watermarks: &BTreeMap::new(),
                late: &[],
            })
            .unwrap();
        drop(writer);

        let waited = std::time::Instant::now();
        while !committed() {
            assert!(
                waited.elapsed() < Duration::from_secs(60),
                "the merge never committed"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let Some(CrdtValue::GCounter(k1)) = store.get("trips/k1").unwrap() else {
            panic!("trips/k1 is a counter");
        };
        assert_eq!(
            (k1.get(&local), k1.value()),
            (1, 19_002),
            "the local increment survives the merge (remote 19,001 + local 1)"
        );
    }

    #[test]
    fn duplicates_and_reordering_merge_to_the_same_state() {
        let hlc = Hlc::new(
            Arc::new(ManualClock::new(100 * SEC)),
            Duration::from_millis(500),
        );
        let remote = RegionId::new("eu-west-1").unwrap();
        let mut local = GCounter::new();
        local
            .increment(&Actor::new(RegionId::new("us-east-1").unwrap(), 1), 4)
            .unwrap();
        let stored = BTreeMap::from([("trips/a".to_string(), CrdtValue::GCounter(local))]);
        let in_order = [
            delta("eu-west-1", "trips/a", 2, 1),
            delta("eu-west-1", "trips/a", 5, 2),
        ];
        let shuffled = [
            in_order[1].clone(),
            in_order[0].clone(),
            in_order[1].clone(),
        ];
        let a = merge(&in_order, &stored, &remote, &hlc).unwrap();
        let b = merge(&shuffled, &stored, &remote, &hlc).unwrap();
        assert_eq!(a.states, b.states);
        match &a.states["trips/a"] {
            CrdtValue::GCounter(c) => assert_eq!(c.value(), 9, "local 4 + remote 5"),
            other => panic!("{other:?}"),
        }
        assert_eq!(a.newest, BTreeMap::from([(0, HlcTimestamp::new(2, 0))]));
    }

    /// The id window a delta carries: the last merged one per key wins, cut to the newest
    /// `dedup-window` ids; a delta with an id over `max-id-bytes` is refused whole.
    #[test]
    fn the_last_merged_window_of_a_key_is_kept_cut_to_the_dedup_window() {
        let hlc = Hlc::new(
            Arc::new(ManualClock::new(100 * SEC)),
            Duration::from_millis(500),
        );
        let origin = RegionId::new("us-east-1").unwrap();
        let with_ids = |count, at, ids: Vec<String>| {
            let mut d = Delta::decode(
                delta("us-east-1", "trips/a", count, at)
                    .payload
                    .as_deref()
                    .unwrap(),
            )
            .unwrap();
            d.recent_ids = ids;
            record(&d, at)
        };
        let path = crate::repo_file("regions/us-east-1.toml");
        let config = Config::load(&path).unwrap();
        let window = config.ingest.dedup_window;
        let many: Vec<String> = (0..window + 3).map(|i| i.to_string()).collect();
        let records = [
            with_ids(1, 1, vec!["a".into()]),
            with_ids(2, 2, many.clone()),
            with_ids(3, 3, vec!["x".repeat(config.ingest.max_id_bytes + 1)]),
        ];
        let out = merge(&records, &BTreeMap::new(), &origin, &hlc).unwrap();
        assert_eq!(out.merged, 2);
        assert_eq!(out.recent_ids["trips/a"], &many[3..]);
        let refused: Vec<_> = out.refused.iter().map(|r| (r.1, r.2.code())).collect();
        assert_eq!(refused, [(3, "too_large")]);
    }

    /// A delta the key's stored state cannot take (its namespace changed type) is refused
    /// and leaves the key as it was: a later delta of the batch must not replace the
    /// stored state with its own part alone.
    #[test]
    fn a_refused_merge_leaves_the_key_as_stored_for_the_rest_of_the_batch() {
        let hlc = Hlc::new(
            Arc::new(ManualClock::new(100 * SEC)),
            Duration::from_millis(500),
        );
        let remote = RegionId::new("eu-west-1").unwrap();
        let mut other = crate::crdt::PnCounter::new();
        other
            .add(&Actor::new(RegionId::new("us-east-1").unwrap(), 1), 7)
            .unwrap();
        let stored = BTreeMap::from([("trips/a".to_string(), CrdtValue::PnCounter(other))]);
        let records = [
            delta("eu-west-1", "trips/a", 2, 1),
            delta("eu-west-1", "trips/a", 5, 2),
        ];
        let out = merge(&records, &stored, &remote, &hlc).unwrap();
        assert!(out.states.is_empty(), "{:?}", out.states);
        let refused: Vec<_> = out.refused.iter().map(|r| (r.1, r.2.code())).collect();
        assert_eq!(refused, [(1, "type_mismatch"), (2, "type_mismatch")]);
    }

    /// A store whose slices of minute 0 are past their retention.
    struct Expired;
    impl StateSource for Expired {
        type Error = std::convert::Infallible;
        fn state(&self, _key: &str) -> Result<Option<CrdtValue>, Self::Error> {
            Ok(None)
        }
        fn recent_ids(&self, _key: &str) -> Result<VecDeque<String>, Self::Error> {
            Ok(VecDeque::new())
        }
        fn expired(&self, key: &str) -> bool {
            crate::window::split_slice_key(key).1 == Some(0)
        }
    }

    /// A re-shipped delta of a deleted slice would bring part of it back: not merged.
    #[test]
    fn a_delta_of_an_expired_slice_is_not_merged() {
        let hlc = Hlc::new(
            Arc::new(ManualClock::new(100 * SEC)),
            Duration::from_millis(500),
        );
        let remote = RegionId::new("eu-west-1").unwrap();
        let (old, new) = (
            crate::window::slice_key("requests/a", 0),
            crate::window::slice_key("requests/a", 60_000),
        );
        let records = [
            delta("eu-west-1", &old, 2, 1),
            delta("eu-west-1", &new, 3, 2),
        ];
        let out = merge(&records, &Expired, &remote, &hlc).unwrap();
        assert_eq!((out.merged, out.expired), (1, 1));
        assert!(out.states.contains_key(&new) && !out.states.contains_key(&old));
    }

    #[test]
    fn heartbeats_are_recorded_per_partition_and_never_merged() {
        let hlc = Hlc::new(
            Arc::new(ManualClock::new(100 * SEC)),
            Duration::from_millis(500),
        );
        let remote = RegionId::new("eu-west-1").unwrap();
        let beat = |origin: &str, partition: i32, offset: i64, wall_nanos: u64| Record {
            partition,
            offset,
            timestamp_ms: None,
            key: Some(crate::replication::HEARTBEAT_KEY.to_vec()),
            payload: Some(
                crate::replication::Heartbeat {
                    origin: origin.into(),
                    wall_nanos,
                    // a partition without windowed records has no watermark
                    watermark_ms: (partition == 0).then_some(wall_nanos / 1_000_000),
                }
                .encode(),
            ),
        };
        let records = [
            delta("eu-west-1", "trips/a", 2, 1),
            beat("eu-west-1", 0, 2, 7 * SEC),
            beat("eu-west-1", 1, 0, 9 * SEC),
            beat("eu-west-1", 0, 3, 8 * SEC),
            beat("us-east-1", 2, 0, 9 * SEC),
        ];
        let stored: BTreeMap<String, CrdtValue> = BTreeMap::new();
        let out = merge(&records, &stored, &remote, &hlc).unwrap();
        assert_eq!(out.heartbeats, BTreeMap::from([(0, 8 * SEC), (1, 9 * SEC)]));
        assert_eq!(out.watermarks, BTreeMap::from([(0, 8_000)]));
        assert_eq!(out.merged, 1);
        assert_eq!(out.states.len(), 1);
        let refused: Vec<_> = out.refused.iter().map(|r| (r.0, r.2.code())).collect();
        assert_eq!(refused, [(2, "malformed")], "another region's heartbeat");
        for watermark_ms in [None, Some(0), Some(u64::MAX)] {
            let round_trip = crate::replication::Heartbeat {
                origin: "eu-west-1".into(),
                wall_nanos: 42,
                watermark_ms,
            };
            assert_eq!(
                crate::replication::Heartbeat::decode(&round_trip.encode()),
                Some(round_trip)
            );
        }
        assert_eq!(crate::replication::Heartbeat::decode(b"short"), None);
    }

    fn owned(epoch: u64, value: &str, at: u64) -> Record {
        let origin = RegionId::new("eu-west-1").unwrap();
        let reg = crate::crdt::LwwRegister::new(
            value.as_bytes().to_vec(),
            crate::crdt::OrderStamp {
                epoch,
                hlc: HlcTimestamp::new(at, 0),
                origin: origin.clone(),
            },
        );
        let d = Delta {
            key: "surge/9q8yy".into(),
            origin,
            state: CrdtValue::LwwRegister(reg),
            origin_time: HlcTimestamp::new(at, 0),
            epoch,
            recent_ids: Vec::new(),
        };
        record(&d, at)
    }

    #[test]
    fn an_owned_delta_below_its_keys_epoch_is_refused_and_a_late_one_for_another_key_merges() {
        let hlc = Hlc::new(
            Arc::new(ManualClock::new(100 * SEC)),
            Duration::from_millis(500),
        );
        let remote = RegionId::new("eu-west-1").unwrap();
        // epoch 3 applied, then a replay of epoch 2 (a later clock does not help it),
        // then epoch 3 again (equal is fine); an epoch-1 write to another key of the shard,
        // accepted by its holder before it was cut off, arrives late: it merges
        let mut late = owned(1, "1.1", 40);
        let mut d = Delta::decode(late.payload.as_deref().unwrap_or_default()).unwrap();
        d.key = "surge/9q8yz".into();
        late.payload = Some(d.encode());
        late.key = Some(d.key.as_bytes().to_vec());
        let records = [
            owned(3, "1.5", 10),
            owned(2, "9.9", 20),
            owned(3, "1.6", 30),
            late,
        ];
        let out = merge(&records, &BTreeMap::new(), &remote, &hlc).unwrap();
        let refused: Vec<_> = out
            .refused
            .iter()
            .map(|(_, o, why)| (*o, why.code()))
            .collect();
        assert_eq!(refused, [(20, "fenced")]);
        let CrdtValue::LwwRegister(reg) = &out.states["surge/9q8yy"] else {
            panic!("a register")
        };
        assert_eq!(reg.value(), b"1.6");
        assert!(
            out.states.contains_key("surge/9q8yz"),
            "the late write merges"
        );
    }

    #[test]
    fn bad_deltas_are_refused_with_a_reason() {
        let hlc = Hlc::new(
            Arc::new(ManualClock::new(100 * SEC)),
            Duration::from_millis(500),
        );
        let remote = RegionId::new("eu-west-1").unwrap();
        let mut garbage = delta("eu-west-1", "trips/a", 1, 1);
        garbage.payload = Some(b"\xff\xff".to_vec());
        // a counter delta that also carries another region's entry (it would inflate it)
        let mut c = GCounter::new();
        for region in ["eu-west-1", "us-east-1"] {
            c.increment(&Actor::new(RegionId::new(region).unwrap(), 1), 7)
                .unwrap();
        }
        let foreign = record(
            &Delta {
                key: "trips/b".into(),
                origin: remote.clone(),
                state: CrdtValue::GCounter(c),
                origin_time: HlcTimestamp::new(5, 0),
                epoch: 0,
                recent_ids: Vec::new(),
            },
            5,
        );
        let mut rekeyed = delta("eu-west-1", "trips/a", 1, 6);
        rekeyed.key = Some(b"trips/other".to_vec());
        let long_key = format!("trips/{}", "k".repeat(2000));
        let records = [
            garbage,
            delta("ap-south-1", "trips/a", 1, 2),
            delta("eu-west-1", "nowhere/a", 1, 3),
            delta("eu-west-1", "zones/a", 1, 4),
            foreign,
            rekeyed,
            delta("eu-west-1", &long_key, 1, 7),
            delta("eu-west-1", "trips/a", 1, 100 * SEC + 400_000_000),
        ];
        let out = merge(&records, &BTreeMap::new(), &remote, &hlc).unwrap();
        let codes: Vec<&str> = out.refused.iter().map(|(_, _, why)| why.code()).collect();
        assert_eq!(
            codes,
            [
                "malformed",
                "wrong_origin",
                "no_namespace",
                "type_mismatch",
                "not_own_part",
                "malformed",
                "too_large"
            ]
        );
        assert_eq!(out.merged, 1, "the delta within max-clock-offset merges");
        assert!(out.held.is_empty());
        assert_eq!(
            out.offsets[&0],
            100 * SEC as i64 + 400_000_000,
            "refused deltas are consumed"
        );
    }

    /// A delta stamped beyond `max-clock-offset` holds its partition (nothing after it
    /// there merges, the offsets stop before it); other partitions go on; once the clock
    /// allows, it and what followed merge. A register's own stamp is bounded the same way.
    #[test]
    fn a_delta_ahead_of_the_clock_is_held_not_dropped() {
        let clock = Arc::new(ManualClock::new(100 * SEC));
        let hlc = Hlc::new(clock.clone(), Duration::from_millis(500));
        let remote = RegionId::new("eu-west-1").unwrap();
        let on = |partition, mut r: Record, offset| {
            r.partition = partition;
            r.offset = offset;
            r
        };
        // a register whose envelope is fine but whose own stamp is 2 s ahead
        let mut register = owned(1, "2.0", 100 * SEC);
        let mut d = Delta::decode(register.payload.as_deref().unwrap_or_default()).unwrap();
        if let CrdtValue::LwwRegister(r) = &mut d.state {
            *r = crate::crdt::LwwRegister::new(
                b"2.0".to_vec(),
                crate::crdt::OrderStamp {
                    epoch: 1,
                    hlc: HlcTimestamp::new(102 * SEC, 0),
                    origin: remote.clone(),
                },
            );
        }
        register.payload = Some(d.encode());
        let records = vec![
            on(0, delta("eu-west-1", "trips/a", 1, 99 * SEC), 10),
            on(0, delta("eu-west-1", "trips/b", 1, 102 * SEC), 11),
            on(0, delta("eu-west-1", "trips/c", 1, 99 * SEC), 12),
            on(1, delta("eu-west-1", "trips/d", 1, 99 * SEC), 40),
            on(2, register, 7),
        ];
        let out = merge(&records, &BTreeMap::new(), &remote, &hlc).unwrap();
        assert!(out.refused.is_empty(), "{:?}", out.refused);
        let merged: Vec<&str> = out.states.keys().map(String::as_str).collect();
        assert_eq!(merged, ["trips/a", "trips/d"]);
        assert_eq!(out.offsets, BTreeMap::from([(0, 10), (1, 40), (2, 6)]));
        let held: Vec<(i32, i64, &str)> = out
            .held
            .iter()
            .map(|(p, (o, why))| (*p, *o, why.code()))
            .collect();
        assert_eq!(held, [(0, 11, "clock_ahead"), (2, 7, "clock_ahead")]);
        assert_eq!(out.hold_for(), Some(Duration::from_millis(1500)));

        // read again from the held offsets once the clock allows: everything merges
        clock.advance(Duration::from_millis(1500));
        let again: Vec<Record> = records
            .into_iter()
            .filter(|r| r.offset > out.offsets[&r.partition])
            .collect();
        let out = merge(&again, &BTreeMap::new(), &remote, &hlc).unwrap();
        assert!(out.held.is_empty() && out.refused.is_empty());
        let merged: Vec<&str> = out.states.keys().map(String::as_str).collect();
        assert_eq!(merged, ["surge/9q8yy", "trips/b", "trips/c"]);
    }
}
