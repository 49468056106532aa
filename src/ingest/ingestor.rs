//! The ingest task: consume `geostate.updates` from the stored offsets, gather a batch,
//! apply it ([`apply_batch`]), dead-letter what was refused, commit the batch to RocksDB,
//! then tell waiters (gRPC `Update`, `Watch`) what was applied.
//!
//! ```text
//!  Kafka ──recv──► batch (≤ batch-max-events, ≤ batch-max-wait)
//!        ──apply_batch (blocking pool)──► refused ──► geostate.dlq (acked first)
//!        ──Store::commit (one WriteBatch)──► applied positions ──► waiters, watchers
//! ```
//!
//! Dead letters are produced and acknowledged before the batch commits: a crash between
//! the two may dead-letter a record twice, never lose it. Late events (their window had
//! closed) are not dead letters: the batch writes them to the partition's outbox, and its
//! shipper sends them to the late topic once, in its transaction. A record's fate depends only on
//! its bytes and the state before it, so a replay after a crash decides exactly the same.
//!
//! One exception, for records that did not come through a holder's API: an owned record
//! whose lease epoch is above every epoch the lease group granted for its shard is
//! refused (`epoch_not_granted`). Where the epoch is above what this region knows, the
//! batch stops before the record and the lease group is read through its log
//! ([`Leases::read_epoch`]); the partition waits for the answer and never guesses. A
//! replay long after may find that epoch granted since and apply such a record: only a
//! writer to the updates topic can forge one, which authenticating writers prevents.
//!
//! It feeds the partitions this node owns ([`Partitions`]): it reads them with a new client
//! after each change (what was read and not applied is read again from the stored
//! offsets), tells each partition's handle whether it is read (a partition given up is
//! handed on only once ingest no longer reads it), and gives each partition a task
//! ([`feeds`]) that reads the partition's own queue of the client and applies what it
//! reads in order under the partition's writer, committing only in the term of the handle
//! it was read in; partitions read and apply in parallel. Per partition it says when it has
//! replayed what the topic held when this node took it ([`PartitionHandle::replayed`]):
//! the records an earlier owner may have applied and acknowledged. The partition's shipper
//! sends no heartbeat before that.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;

mod feeds;

use feeds::{Drained, Ended, Feeds};

use super::batch::{Applied, BatchContext, Grants, Pending, Record, apply_batch};
use super::event::Rejection;
use crate::clock::{Hlc, HlcTimestamp};
use crate::config::Config;
use crate::crdt::Actor;
use crate::lease::leases::Leases;
use crate::lease::table::ShardId;
use crate::log::{
    ConsumerSpec, DLQ_CODE_HEADER, DLQ_REASON_HEADER, DLQ_SOURCE_HEADER, DLQ_TRUNCATED_HEADER,
    LogError, Out, PartitionReader, RenewingProducer, Split, restarted,
};
use crate::metrics as m;
use crate::partition::{Change, Owned, PartitionHandle, Partitions, applied_in};
use crate::shutdown::stopped;
use crate::store::{Commit, Store, StoreError};
use crate::{pb, window};
use prost::Message;

const RETRY_PAUSE: Duration = Duration::from_millis(200);
/// How often a replaying ingest task with nothing to read checks whether it is done.
pub(super) const REPLAY_POLL: Duration = Duration::from_millis(100);
/// How often ingest looks at a full outbox again (it is also woken by every shipped round).
const OUTBOX_POLL: Duration = Duration::from_millis(100);
/// How long an owned record's epoch may wait for this member's table to apply its grant
/// before the ingest reads the lease group's table through its log, and how often it looks.
const GRANT_WAIT: Duration = Duration::from_millis(500);
const GRANT_POLL: Duration = Duration::from_millis(20);

#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("ingest worker failed: {0}")]
    Join(#[from] tokio::task::JoinError),
    #[error(transparent)]
    Log(#[from] LogError),
}

/// How applying a batch ended.
enum Applying {
    Done,
    /// Asked to stop meanwhile.
    Stopped,
    /// A partition of the batch was given up meanwhile: a part was not committed.
    Cut,
}

/// How applying a part of a batch ended.
enum Part {
    /// Committed; the records left for after the lease group answered, if any.
    Committed(Option<Pending>),
    /// Not committed: the partition's term ended ([`PartitionHandle::cut`]).
    Cut,
}

pub struct Ingestor {
    pub config: Arc<Config>,
    pub actor: Actor,
    pub hlc: Arc<Hlc>,
    pub store: Arc<Store>,
    /// How to read the updates topic; its partitions are the owned ones, each positioned
    /// after its applied offset.
    pub source: ConsumerSpec,
    pub dlq: RenewingProducer,
    /// The node's partitions: ingest reads the owned ones and commits each one's parts
    /// in its term.
    pub owned: Arc<Partitions>,
    /// This region's leases, where a lease group grants them: owned records' epochs are
    /// checked against it.
    pub leases: Option<Arc<Leases>>,
    /// Per shard, an epoch known granted, as any partition's task learned it (kept: an
    /// epoch once granted stays granted).
    pub granted: Mutex<BTreeMap<ShardId, u64>>,
    /// The updates topic's partition count.
    pub partition_count: i32,
}

impl Ingestor {
    /// Runs until `shutdown` turns true; returns early only on a storage failure, or on a
    /// record on the client's own queue ([`LogError::Unsplit`]: a partition's position
    /// moved past a record its task never saw).
    ///
    /// Each partition's task reads the partition's own queue of one client and applies
    /// what it reads ([`Feeds`]): partitions read and apply in parallel. Before a new
    /// client reads (a change of partitions, a failed read), every task finishes the
    /// part it applies, so the new client starts after what is applied. On return, every
    /// task has finished.
    pub async fn run(self, shutdown: watch::Receiver<bool>) -> Result<(), IngestError> {
        let mut feeds = Feeds::default();
        let read = Arc::new(self).read(&mut feeds, shutdown).await;
        let drained = feeds.drain().await;
        read.and(drained.map(drop))
    }

    /// Reads the owned partitions with a task each ([`Feeds`]) until `shutdown` turns
    /// true, with a new client after each change of partitions or failed read.
    async fn read(
        self: Arc<Self>,
        feeds: &mut Feeds,
        mut shutdown: watch::Receiver<bool>,
    ) -> Result<(), IngestError> {
        let mut owned = self.owned.subscribe();
        let mut client: Option<Split> = None;
        // the handles of the partitions the client reads (their terms when it started)
        let mut read = Owned::new();
        // why the last client was replaced, if it failed
        let mut failed: Option<LogError> = None;
        loop {
            if client.is_none() || owned.has_changed().unwrap_or(false) {
                match feeds.drain().await? {
                    Drained::Stopped => return Ok(()),
                    Drained::Done(read_failed) => failed = failed.or(read_failed),
                }
                if failed.is_some() {
                    tokio::select! {
                        () = stopped(&mut shutdown) => return Ok(()),
                        () = tokio::time::sleep(RETRY_PAUSE) => {}
                    }
                }
                match self.follow(&mut owned, &mut read).await {
                    Ok(Some((split, sources))) => {
                        *feeds = Feeds::start(&self, &read, sources, &shutdown);
                        client = Some(split);
                        if let Some(error) = failed.take() {
                            restarted(&self.source, &error, None);
                        }
                    }
                    Ok(None) => client = None,
                    // tried again after the pause
                    Err(again) => {
                        restarted(
                            &self.source,
                            failed.as_ref().unwrap_or(&again),
                            Some(&again),
                        );
                        failed = failed.or(Some(again));
                        continue;
                    }
                }
            }
            let Some(reading) = client.as_ref() else {
                // owns nothing: waits for the group
                tokio::select! {
                    () = stopped(&mut shutdown) => return Ok(()),
                    _ = owned.changed() => continue,
                }
            };
            tokio::select! {
                () = stopped(&mut shutdown) => return Ok(()),
                // read again, from the applied offsets, without those given up
                _ = owned.changed() => client = None,
                error = reading.failed() => {
                    if matches!(error, LogError::Unsplit { .. }) {
                        return Err(error.into());
                    }
                    failed = Some(error);
                    client = None;
                }
                Some(ended) = feeds.next_ended() => match ended? {
                    Ended::Stopped => return Ok(()),
                    Ended::Cut | Ended::Drained => client = None,
                    Ended::Failed(error) => {
                        failed = Some(error);
                        client = None;
                    }
                },
            }
        }
    }

    /// A client of the partitions owned now, each after its applied offset and on its
    /// own queue (`None`: none owned); `read` becomes their handles, each told it is
    /// read, and a handle no longer read is told so.
    async fn follow(
        &self,
        owned: &mut watch::Receiver<Owned>,
        read: &mut Owned,
    ) -> Result<Option<(Split, BTreeMap<i32, PartitionReader>)>, LogError> {
        let now: Owned = owned.borrow_and_update().clone();
        for (p, handle) in read.iter() {
            if now.get(p).is_none_or(|h| !Arc::ptr_eq(h, handle)) {
                handle.set_reading(false);
            }
        }
        for handle in now.values() {
            handle.set_reading(true);
        }
        *read = now;
        let partitions: Vec<i32> = read.keys().copied().collect();
        let client = if partitions.is_empty() {
            None
        } else {
            let spec = ConsumerSpec {
                partitions: partitions.clone(),
                ..self.source.clone()
            };
            Some(Split::start(&spec, &applied_in(read)).await?)
        };
        tracing::info!(?partitions, "ingest reads the partitions this node owns");
        Ok(client)
    }

    /// Waits while the outbox holds `replication.max-outbox-keys` keys or more, so that a
    /// shipping round stays bounded (false: asked to stop meanwhile).
    async fn outbox_room(&self, shutdown: &mut watch::Receiver<bool>) -> bool {
        let max = self.config.replication.max_outbox_keys;
        let mut waited = false;
        loop {
            let shipped = self.owned.shipped.notified();
            // a copy of a partition given up may keep entries nobody ships: not counted
            let keys = self.store.outbox_len_in(&self.owned.owned());
            metrics::gauge!(m::OUTBOX_KEYS).set(keys as f64);
            if keys < max {
                if waited {
                    tracing::info!(keys, max, "outbox below its bound again; ingest goes on");
                }
                return true;
            }
            if !waited {
                tracing::warn!(
                    keys,
                    max,
                    "outbox full (replication.max-outbox-keys): ingest waits for shipping"
                );
                waited = true;
            }
            tokio::select! {
                () = stopped(shutdown) => return false,
                () = shipped => {}
                () = tokio::time::sleep(OUTBOX_POLL) => {}
            }
        }
    }

    /// Applies `records` of `handle`'s partition (the first received at `received`), and
    /// again from a record that names a lease epoch to ask the lease group about, once
    /// the group answered.
    async fn apply(
        &self,
        handle: &Arc<PartitionHandle>,
        mut records: Vec<Record>,
        received: Instant,
        grants: &mut Grants,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Result<Applying, IngestError> {
        if !self.outbox_room(shutdown).await {
            return Ok(Applying::Stopped);
        }
        let applying = loop {
            match self.apply_part(handle, records, received, grants).await? {
                Part::Committed(None) => break Applying::Done,
                Part::Committed(Some(rest)) => {
                    if !self
                        .learn_grant(rest.shard, rest.epoch, grants, shutdown)
                        .await
                    {
                        return Ok(Applying::Stopped);
                    }
                    records = rest.records;
                }
                Part::Cut => break Applying::Cut,
            }
        };
        // an answer holds for the records read before it, and no later ones
        grants.read.clear();
        Ok(applying)
    }

    /// Learns whether the lease group granted `epoch` of `shard`: from this region's
    /// leases, waiting a moment for its member's table to apply a grant, else by reading
    /// the table through the group's log, retried until it answers (false: asked to stop
    /// meanwhile).
    async fn learn_grant(
        &self,
        shard: ShardId,
        epoch: u64,
        grants: &mut Grants,
        shutdown: &mut watch::Receiver<bool>,
    ) -> bool {
        let Some(leases) = self.leases.clone() else {
            return true;
        };
        let waited = Instant::now();
        loop {
            let learned = self.granted_of(shard);
            let known = grants.known.entry(shard).or_default();
            *known = leases.known_epoch(shard).max(learned).max(*known);
            if *known >= epoch {
                return true;
            }
            if waited.elapsed() >= GRANT_WAIT {
                break;
            }
            tokio::select! {
                () = stopped(shutdown) => return false,
                () = tokio::time::sleep(GRANT_POLL) => {}
            }
        }
        loop {
            match leases.read_epoch(shard).await {
                Ok(read) => {
                    tracing::info!(
                        shard,
                        epoch,
                        granted = read,
                        "read a shard's epoch from the lease group for an owned record above the epochs known here"
                    );
                    grants.read.insert(shard, read);
                    // granted once, granted for good, for every partition's task
                    let known = grants.known.entry(shard).or_default();
                    *known = read.max(*known);
                    let mut granted = self.granted.lock().unwrap_or_else(|e| e.into_inner());
                    let learned = granted.entry(shard).or_default();
                    *learned = read.max(*learned);
                    return true;
                }
                Err(e) => {
                    tracing::warn!(shard, epoch, error = %e, "reading a shard's epoch from the lease group failed; the partition waits");
                    tokio::select! {
                        () = stopped(shutdown) => return false,
                        () = tokio::time::sleep(RETRY_PAUSE) => {}
                    }
                }
            }
        }
    }

    /// The epoch of `shard` a partition's task learned granted (0: none).
    fn granted_of(&self, shard: ShardId) -> u64 {
        let granted = self.granted.lock().unwrap_or_else(|e| e.into_inner());
        granted.get(&shard).copied().unwrap_or(0)
    }

    /// The `fetch` stage of a batch's first record: from its timestamp (taken by whoever
    /// produced it) to now, on this node's clock.
    pub(super) fn observe_fetch(&self, first: &Record) {
        let Some(made) = first.timestamp_ms else {
            return;
        };
        let now = (self.hlc.physical().now_nanos() / 1_000_000) as i64;
        if now >= made {
            m::write_stage("fetch", Duration::from_millis((now - made) as u64));
        }
    }

    /// Applies and commits what it can of `records`, all of `handle`'s partition (the
    /// first received at `received`); returns the part left for after the lease group
    /// answered. Commits nothing if the partition's term ended meanwhile
    /// ([`PartitionHandle::cut`]).
    async fn apply_part(
        &self,
        handle: &Arc<PartitionHandle>,
        records: Vec<Record>,
        received: Instant,
        grants: &Grants,
    ) -> Result<Part, IngestError> {
        let partition = handle.partition;
        // read-modify-write of the partition's state: no merge or catch-up of it may
        // interleave (reading alone needs no guard; the commit's task takes it)
        let writer = self.store.writer(partition).await;
        let started = Instant::now();
        m::write_stage("batch", started.saturating_duration_since(received));
        let events = records.len();
        let origin_time = self.hlc.now();
        let (store, config, actor) = (self.store.clone(), self.config.clone(), self.actor.clone());
        let grants = self.leases.as_ref().map(|_| grants.clone());
        let partitions = self.partition_count;
        let mut applied: Applied = tokio::task::spawn_blocking(move || {
            let ctx = BatchContext {
                actor: &actor,
                format: config.kafka.format,
                namespaces: &config.namespaces,
                limits: &config.ingest,
                origin_time,
                lease: config.lease.as_ref(),
                max_clock_offset: config.max_clock_offset,
                grants: grants.as_ref(),
                partitions: Some(partitions),
                out_of_orderness_ms: config.watermark.out_of_orderness.as_millis() as u64,
            };
            apply_batch(records, store.as_ref(), &ctx)
        })
        .await??;
        let pending = applied.pending.take();
        let events = events - pending.as_ref().map_or(0, |p| p.records.len());
        let apply_done = Instant::now();
        m::write_stage("apply", apply_done - started);

        self.dead_letter(&applied.rejected).await;

        let (store, term) = (self.store.clone(), handle.clone());
        let topic = self.config.kafka.updates_topic.clone();
        let committed = tokio::task::spawn_blocking(move || {
            let _writer = writer;
            let committed = commit_part(&store, &term, &topic, &applied, origin_time)?;
            Ok::<_, StoreError>(committed.map(|()| applied))
        })
        .await??;
        let Some(applied) = committed else {
            tracing::info!(
                records = events,
                "a batch read before its partitions were given up is not committed; ingest reads again"
            );
            return Ok(Part::Cut);
        };
        m::write_stage("commit", apply_done.elapsed());

        self.report(handle, applied, events, started);
        Ok(Part::Committed(pending))
    }

    /// Tells the shippers, the metrics and the watchers what a committed part applied.
    fn report(&self, handle: &PartitionHandle, applied: Applied, events: usize, started: Instant) {
        if !applied.outbox.is_empty() || !applied.late.is_empty() {
            handle.note_committed();
        }
        if !applied.late.is_empty() {
            metrics::counter!(m::EVENTS_LATE).increment(applied.late.len() as u64);
        }
        metrics::counter!(m::EVENTS_APPLIED).increment(applied.applied as u64);
        metrics::counter!(m::EVENTS_DUPLICATE).increment(applied.duplicates as u64);
        if let Some((key, on, home)) = &applied.first_misrouted {
            metrics::counter!(m::EVENTS_MISROUTED).increment(applied.misrouted as u64);
            tracing::warn!(
                records = applied.misrouted,
                key,
                on,
                home,
                "records off their key's partition, dead-lettered: their producer does not partition keys like the Java client (set librdkafka's partitioner to murmur2_random and the record key to the state key); a key's state lives in its own partition"
            );
        }
        metrics::histogram!(m::BATCH_APPLY_SECONDS).record(started.elapsed().as_secs_f64());
        metrics::histogram!(m::BATCH_EVENTS).record(events as f64);
        (self.owned.events_applied).fetch_add(applied.applied as u64, Ordering::Relaxed);
        if self.owned.changes.receiver_count() > 0 && !applied.states.is_empty() {
            let changes: Vec<Change> = applied.states.into_iter().collect();
            let _ = self.owned.changes.send(Arc::new(changes));
        }
    }

    /// Produces every refused record to the dead-letter topic with its reason (cut to what
    /// the producer takes, [`DeadLetter`]), retrying until Kafka acknowledges each, except
    /// one the topic refuses as such: that one is parked (logged and counted).
    async fn dead_letter(&self, rejected: &[(Record, Rejection)]) {
        let topic = &self.config.kafka.dlq_topic;
        for (record, why) in rejected {
            // a failed comparison is the caller's answer, not bad input
            if matches!(why, Rejection::CompareFailed { .. }) {
                metrics::counter!(m::CAS_FAILED).increment(1);
                continue;
            }
            let source = format!(
                "{}/{}/{}",
                self.config.kafka.updates_topic, record.partition, record.offset
            );
            let reason = why.to_string();
            let letter = DeadLetter::of(record, &reason);
            let mut headers = vec![
                (DLQ_REASON_HEADER, letter.reason),
                (DLQ_CODE_HEADER, why.code()),
                (DLQ_SOURCE_HEADER, source.as_str()),
            ];
            if let Some(cut) = &letter.truncated {
                headers.push((DLQ_TRUNCATED_HEADER, cut));
            }
            let out = Out {
                topic,
                key: letter.key,
                payload: letter.payload,
                headers: &headers,
                partition: None,
            };
            loop {
                match self.dlq.append(&out, Duration::from_secs(30)).await {
                    Ok(()) => break,
                    Err(e) if e.is_refused_record() => {
                        // retrying cannot help, and the partition must move on: the record
                        // stays in the updates topic at `source`
                        tracing::error!(error = %e, %source, reason = %why, "the dead-letter topic refuses this record; parked (logged and counted, not dead-lettered)");
                        metrics::counter!(m::DEAD_LETTERS_PARKED, "reason" => why.code())
                            .increment(1);
                        break;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, %source, "dead-lettering failed; retrying");
                        tokio::time::sleep(RETRY_PAUSE).await;
                    }
                }
            }
            metrics::counter!(m::EVENTS_DEAD_LETTERED, "reason" => why.code()).increment(1);
            if matches!(why, Rejection::Fenced { .. }) {
                metrics::counter!(m::FENCED, "path" => "ingest").increment(1);
            }
            (self.owned.events_dead_lettered).fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Commits what `applied` holds of `term`'s partition (its part of a batch of `topic`,
/// applied at `origin_time`) in one `WriteBatch`, and tells the term's waiters, unless the
/// term was cut (`None`): a cut waits for this commit, or this commit sees it. The caller
/// holds the partition's writer from before `apply_batch` read the state.
pub fn commit_part(
    store: &Store,
    term: &PartitionHandle,
    topic: &str,
    applied: &Applied,
    origin_time: HlcTimestamp,
) -> Result<Option<()>, StoreError> {
    term.commit_in_term(|| {
        let mut late: Vec<(String, Vec<u8>)> = applied.late.iter().map(late_event).collect();
        late.extend(
            (applied.outputs.iter())
                .map(|((p, o), change)| (window::output_key(*p, *o), change.payload())),
        );
        store.commit(&Commit {
            topic,
            states: &applied.states,
            offsets: &applied.offsets,
            outbox: &applied.outbox,
            recent_ids: &applied.recent_ids,
            hlc_high_water: origin_time,
            remote_applied: None,
            fences: &applied.fences.0,
            watermarks: &applied.watermarks,
            late: &late,
        })?;
        let refused = applied.late.iter().chain(&applied.rejected);
        term.publish(
            refused.map(|(record, why)| (record.offset, why)),
            applied.offsets.get(&term.partition).copied(),
        );
        Ok(())
    })
}

/// The most of a refused record a dead letter carries: its key and value are cut to these
/// (the producer refuses records over `message.max.bytes`, 1,000,000 by default, and the
/// reason and source ride along as headers), the original lengths noted in
/// `geostate.truncated`.
pub const DLQ_MAX_VALUE: usize = 512 * 1024;
pub const DLQ_MAX_KEY: usize = 4 * 1024;
const DLQ_MAX_REASON: usize = 4 * 1024;

/// What goes to the dead-letter topic for one refused record.
#[derive(Debug, PartialEq)]
struct DeadLetter<'a> {
    key: Option<&'a [u8]>,
    payload: &'a [u8],
    reason: &'a str,
    /// `key=<bytes>,value=<bytes>`: the original lengths, if anything was cut.
    truncated: Option<String>,
}

impl<'a> DeadLetter<'a> {
    fn of(record: &'a Record, reason: &'a str) -> Self {
        let key = record.key.as_deref();
        let payload = record.payload.as_deref().unwrap_or_default();
        let key_len = key.map_or(0, <[u8]>::len);
        let mut reason_end = reason.len().min(DLQ_MAX_REASON);
        while !reason.is_char_boundary(reason_end) {
            reason_end -= 1;
        }
        Self {
            key: key.map(|k| &k[..k.len().min(DLQ_MAX_KEY)]),
            payload: &payload[..payload.len().min(DLQ_MAX_VALUE)],
            reason: &reason[..reason_end],
            truncated: (key_len > DLQ_MAX_KEY || payload.len() > DLQ_MAX_VALUE)
                .then(|| format!("key={key_len},value={}", payload.len())),
        }
    }
}

/// A late event's outbox entry: its key ([`window::late_key`]) and the `LateEvent` the
/// shipper sends to the late topic (cut, as a dead letter is, to what the producer takes).
fn late_event((record, why): &(Record, Rejection)) -> (String, Vec<u8>) {
    let (event_time_ms, watermark_ms, closed_at_ms) = match why {
        Rejection::Late {
            event_time_ms,
            watermark_ms,
            closed_at_ms,
            ..
        } => (*event_time_ms, *watermark_ms, *closed_at_ms),
        _ => (0, 0, 0),
    };
    let reason = why.to_string();
    let cut = DeadLetter::of(record, &reason);
    let event = pb::LateEvent {
        key: cut.key.map(<[u8]>::to_vec),
        payload: cut.payload.to_vec(),
        partition: record.partition,
        offset: record.offset,
        event_time_ms,
        watermark_ms,
        closed_at_ms,
        reason: cut.reason.to_string(),
    };
    (
        window::late_key(record.partition, record.offset),
        event.encode_to_vec(),
    )
}

#[cfg(test)]
mod tests;
