//! The outbound shipper: one task per partition, each with its own transactional producer
//! (`geostate.<region>.<deltas topic>.p<partition>`), so a node that starts shipping a
//! partition fences whoever shipped it before, that partition only.
//!
//! Guarantee: every outbox entry reaches the deltas topic, and what a region shipped is
//! always a prefix of what it applied. Each round reads the partition's whole outbox and
//! its source offset from one store snapshot and ships them in ONE Kafka transaction
//! (bounded: ingest waits while the outbox holds `replication.max-outbox-keys` keys): the
//! entries (on the same partition of the deltas topic: same key, same count), then a
//! [`ResumePoint`] on that partition saying which offset they cover, then commit. Readers use
//! `read_committed`, so a round is seen whole or not at all — a node that lost its disk
//! merges its committed deltas and resumes ingest after the last resume point without
//! applying any event twice. An entry is deleted only after the commit and only if it
//! was not rewritten since it was read (a newer delta written meanwhile ships next round);
//! a crash anywhere re-ships, which merge makes harmless. Record key = state key, so a key's
//! deltas stay in order on one partition and the topic can be compacted.
//!
//! Every round also ends with a [`Heartbeat`] on its partition, and a round runs at least
//! every [`HEARTBEAT_EVERY`] even with nothing to ship: its physical time is read before
//! the outbox, so a region that merged a partition's heartbeat has every delta of that
//! partition the origin applied before it. A new lease holder waits for that before it
//! serves linearizable reads (`api`). A shipper sends no heartbeat before ingest has
//! replayed every record its partition held when this node took it: what an earlier owner
//! applied (and acknowledged) but never shipped, its disk lost, is applied and shipped
//! again first. Given up (`hand_off`), it ships what the outbox holds and ends; after
//! each round with entries it records how far its copy holds the partition's deltas
//! (`Store::own_deltas_through`), where the next catch-up reads from.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{Notify, watch};

use super::bootstrap;
use super::outputs::{FinalWindow, Outputs, RegisterChange};
use super::{HEARTBEAT_KEY, Heartbeat};
use crate::clock::Clock;
use crate::config::KafkaConfig;
use crate::crdt::{Actor, RESUME_KEY, ResumePoint};
use crate::log::{
    DLQ_CODE_HEADER, DLQ_REASON_HEADER, DLQ_SOURCE_HEADER, LATE_EVENT_TIME_HEADER,
    LATE_WATERMARK_HEADER, LogError, Transactional, TxRecord,
};
use crate::metrics as m;
use crate::partition::PartitionHandle;
use crate::pb;
use crate::shutdown::stopped;
use crate::store::{OutboxEntry, OutboxSnapshot, Store, StoreError};
use crate::window::{self, LATE_PREFIX};
use prost::Message;

/// Longest the shipper goes without a round, heartbeats included. Longer than a consumer's
/// longest fetch wait (librdkafka's `fetch.wait.max.ms`, 500 ms): a reader of an idle
/// region's topic still sees its partitions' ends between two heartbeats.
pub const HEARTBEAT_EVERY: Duration = Duration::from_millis(1000);
const RETRY_PAUSE: Duration = Duration::from_millis(200);

#[derive(Debug, thiserror::Error)]
pub enum ShipError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(
        "shipping deltas stopped for good: {0} (did another node of this region start with the same transactional id?)"
    )]
    Fatal(String),
    #[error("the shipper panicked")]
    Panicked,
}

pub struct Shipper {
    pub store: Arc<Store>,
    /// The partition this shipper ships: of the updates topic read, of the deltas topic
    /// written.
    pub partition: i32,
    /// Initialised; replaced by a new client after a failed round.
    pub producer: Transactional,
    /// The deltas topic written, the updates topic whose offsets the resume points carry,
    /// and the late topic late events go to.
    pub kafka: KafkaConfig,
    pub actor: Actor,
    /// Changes after every committed part of the partition with outbox entries.
    pub wake: watch::Receiver<u64>,
    /// Notified after every shipped round whose entries were cleared.
    pub shipped: Arc<Notify>,
    /// The physical clock heartbeats carry.
    pub clock: Arc<dyn Clock>,
    /// `None` once ingest replayed the partition up to where it was when this node took
    /// it; no heartbeat before.
    pub replayed: watch::Receiver<Option<i64>>,
    /// Turns true when the node gives the partition up: one last round ships what the
    /// outbox holds, then the shipper ends.
    pub hand_off: watch::Receiver<bool>,
    /// The partition's handle: a shipper whose partition was let go starts a new client
    /// only for the hand-off (another node owning it, the new client's
    /// `init_transactions` would fence that node).
    pub handle: Arc<PartitionHandle>,
    /// The namespaces whose final windows this shipper produces to the outputs topic, if
    /// any ([`super::outputs`]).
    pub outputs: Option<Arc<Outputs>>,
    /// Shortest time between two rounds that ship deltas (`replication.ship-every`).
    pub ship_every: Duration,
}

/// The final windows one round produces, and how far the partition's outputs reach then.
struct RoundOutputs {
    windows: Vec<FinalWindow>,
    through: Option<u64>,
}

impl Shipper {
    pub async fn run(mut self, mut stop: watch::Receiver<bool>) -> Result<(), ShipError> {
        let mut last_beat: Option<Instant> = None;
        let mut last_shipped: Option<Instant> = None;
        // a round failed: it may have committed all the same, and the late events it
        // held must not ship twice
        let mut uncertain = false;
        let partition = self.partition;
        loop {
            if *stop.borrow() {
                return Ok(());
            }
            // updates of a key until the next round coalesce in the outbox meanwhile
            if let Some(at) = last_shipped
                && !self.ship_every.is_zero()
            {
                let mut hand_off = self.hand_off.clone();
                tokio::select! {
                    () = stopped(&mut stop) => return Ok(()),
                    () = tokio::time::sleep_until((at + self.ship_every).into()) => {}
                    _ = hand_off.wait_for(|&h| h) => {}
                }
            }
            let handing_off = *self.hand_off.borrow();
            // before the outbox is read: whatever was applied by then ships this round (and
            // only once every record an earlier node may have acknowledged is applied)
            // (and none once the partition was let go: its next owner's come)
            let replayed = self.replayed.borrow().is_none() && !self.handle.is_let_go();
            let beat = (replayed && !handing_off).then(|| self.clock.now_nanos());
            self.wake.borrow_and_update();
            let (snapshot, round_outputs) = self.read_round().await?;
            // nothing to ship and no heartbeat due (or none allowed yet): wait for a batch,
            // the next heartbeat or the end of the replay
            let due = match (beat, last_beat) {
                (None, _) => None,
                (Some(_), None) => Some(Instant::now()),
                (Some(_), Some(at)) => Some(at + HEARTBEAT_EVERY),
            };
            if snapshot.entries.is_empty() && handing_off {
                tracing::info!(partition, "handed off: the outbox is shipped");
                return Ok(());
            }
            if snapshot.entries.is_empty()
                && round_outputs.windows.is_empty()
                && due.is_none_or(|due| Instant::now() < due)
            {
                let mut replayed = self.replayed.clone();
                let mut hand_off = self.hand_off.clone();
                tokio::select! {
                    () = stopped(&mut stop) => return Ok(()),
                    _ = self.wake.changed() => {}
                    () = sleep_until(due) => {}
                    _ = replayed.wait_for(Option::is_none), if beat.is_none() => {}
                    _ = hand_off.wait_for(|&h| h) => {}
                }
                continue;
            }
            // what a failed round committed all the same must not go out twice: its late
            // events, owned outputs and final windows
            if uncertain
                && (self.outputs.is_some()
                    || snapshot
                        .entries
                        .iter()
                        .any(|e| window::record_position(&e.key).is_some()))
            {
                if self.settle_uncertain().await? {
                    uncertain = false;
                } else {
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
                continue;
            }
            uncertain = false;
            let through = match self.ship(&snapshot, &round_outputs, beat).await {
                Ok(through) => through,
                Err(e) => {
                    uncertain = true;
                    if !self.recover(&e, &mut stop).await? {
                        return Ok(());
                    }
                    continue;
                }
            };
            if beat.is_some() {
                last_beat = Some(Instant::now());
            }
            let Some(through) = through else {
                continue;
            };
            last_shipped = Some(Instant::now());
            self.shipped_round(snapshot, round_outputs.through, through)
                .await?;
        }
    }

    /// After a failed round, a new client, unless the failure was fatal; false: asked to
    /// stop, or the partition handed on, meanwhile.
    async fn recover(
        &mut self,
        e: &LogError,
        stop: &mut watch::Receiver<bool>,
    ) -> Result<bool, ShipError> {
        if let Some(fatal) = self.producer.fatal_error() {
            return Err(ShipError::Fatal(fatal));
        }
        tokio::time::sleep(RETRY_PAUSE).await;
        // let go (not owned) and not handed off (yet): the keeper hands it off (no next
        // owner yet: a new client fences nobody), or aborts this shipper because another
        // node owns it (a new client would fence it)
        if self.handle.is_let_go() {
            let mut hand_off = self.hand_off.clone();
            tokio::select! {
                () = stopped(stop) => return Ok(false),
                handed = hand_off.wait_for(|&h| h) => if handed.is_err() {
                    return Ok(false);
                },
            }
        }
        self.producer.restart(e).await;
        Ok(true)
    }

    /// Reads the round: the partition's outbox and, if it outputs, the windows final
    /// since its last round.
    async fn read_round(&self) -> Result<(OutboxSnapshot, RoundOutputs), StoreError> {
        let (store, topic, partition) = (
            self.store.clone(),
            self.kafka.updates_topic.clone(),
            self.partition,
        );
        let outputs = self.outputs.clone();
        tokio::task::spawn_blocking(move || {
            let snapshot = store.outbox_snapshot(partition, &topic)?;
            let outputs = match outputs {
                Some(outputs) => {
                    let own = snapshot.watermarks.get(&partition).copied();
                    final_since(&store, &outputs, partition, own)?
                }
                None => RoundOutputs {
                    windows: Vec::new(),
                    through: None,
                },
            };
            Ok::<_, StoreError>((snapshot, outputs))
        })
        .await
        .unwrap_or_else(|e| Err(StoreError::Task(e.to_string())))
    }

    /// After a failed round, learns from the deltas topic whether it committed all the
    /// same, and drops what it shipped then (late events, owned outputs) and raises the
    /// outputs' reach to it; false: the topic could not be read (retried).
    async fn settle_uncertain(&self) -> Result<bool, StoreError> {
        let partition = self.partition;
        let committed =
            bootstrap::committed_resume(&self.kafka, &self.actor.region, &self.store, partition)
                .await;
        match committed {
            Ok(resume) => {
                let through = resume
                    .as_ref()
                    .and_then(|r| r.updates_offsets.get(&partition).copied());
                let outputs = resume.and_then(|r| r.outputs_through.get(&partition).copied());
                let (store, writer) = (self.store.clone(), self.store.writer(partition).await);
                tokio::task::spawn_blocking(move || {
                    let _writer = writer;
                    if let Some(through) = through {
                        store.drop_records_through(partition, through)?;
                    }
                    if let Some(outputs) = outputs {
                        store.raise_outputs_through(partition, outputs)?;
                    }
                    Ok::<_, StoreError>(())
                })
                .await
                .unwrap_or_else(|e| Err(StoreError::Task(e.to_string())))?;
                Ok(true)
            }
            Err(e) => {
                tracing::warn!(partition, error = %e, "reading which rounds committed failed; retrying");
                Ok(false)
            }
        }
    }

    /// After a committed round: clears what it shipped from the outbox, raises the
    /// outputs' reach, and notes that this copy holds every delta of the partition up to
    /// the round (`through`, its resume point's offset).
    async fn shipped_round(
        &self,
        snapshot: OutboxSnapshot,
        outputs_through: Option<u64>,
        through: i64,
    ) -> Result<(), StoreError> {
        let (store, deltas) = (self.store.clone(), self.kafka.deltas_topic.clone());
        let partition = self.partition;
        // an aborted shipper's last writes finish before a later catch-up of the copy
        let writer = self.store.writer(partition).await;
        tokio::task::spawn_blocking(move || {
            let _writer = writer;
            store.clear_outbox(&snapshot.entries)?;
            if let Some(outputs) = outputs_through {
                store.raise_outputs_through(partition, outputs)?;
            }
            // this copy holds every delta of its partition up to its own last round
            store.own_deltas_through(&deltas, partition, through)
        })
        .await
        .unwrap_or_else(|e| Err(StoreError::Task(e.to_string())))?;
        metrics::gauge!(m::COPY_THROUGH, "partition" => partition.to_string()).set(through as f64);
        metrics::gauge!(m::OUTBOX_KEYS).set(self.store.outbox_len() as f64);
        self.shipped.notify_waiters();
        Ok(())
    }

    /// One transaction: every delta, then the resume point (if there were entries), then a
    /// heartbeat (if `beat`), all on the shipper's partition, and the late events to the
    /// late topic. Answers the resume point's offset, if there was one.
    async fn ship(
        &self,
        snapshot: &OutboxSnapshot,
        outputs: &RoundOutputs,
        beat: Option<u64>,
    ) -> Result<Option<i64>, LogError> {
        let resume = (!snapshot.entries.is_empty() || !outputs.windows.is_empty()).then(|| {
            ResumePoint {
                origin: self.actor.region.clone(),
                incarnation: self.actor.incarnation,
                updates_topic: self.kafka.updates_topic.clone(),
                updates_offsets: snapshot.offsets.clone(),
                hlc_high_water: snapshot.hlc_high_water.unwrap_or_default(),
                fences: snapshot.fences.clone(),
                watermarks: snapshot.watermarks.clone(),
                outputs_through: outputs
                    .through
                    .map(|w| (self.partition, w))
                    .into_iter()
                    .collect(),
            }
            .encode()
        });
        let heartbeat = beat.map(|wall_nanos| {
            Heartbeat {
                origin: self.actor.region.to_string(),
                wall_nanos,
                watermark_ms: snapshot.watermarks.get(&self.partition).copied(),
            }
            .encode()
        });
        let on_partition = |key, payload| TxRecord {
            key,
            payload,
            partition: Some(self.partition),
            topic: None,
            headers: Vec::new(),
        };
        let (records_out, deltas): (Vec<&OutboxEntry>, Vec<&OutboxEntry>) = snapshot
            .entries
            .iter()
            .partition(|e| window::record_position(&e.key).is_some());
        let (late, owned): (Vec<&OutboxEntry>, Vec<&OutboxEntry>) = records_out
            .into_iter()
            .partition(|e| e.key.starts_with(LATE_PREFIX));
        let late: Vec<LateOut> = late.into_iter().filter_map(|e| self.late_out(e)).collect();
        let owned: Vec<(Vec<u8>, &[u8])> = owned
            .into_iter()
            .filter_map(|e| owned_out(e).map(|key| (key, e.bytes.as_slice())))
            .collect();
        let mut records: Vec<TxRecord<'_>> = deltas
            .iter()
            .map(|entry| on_partition(entry.key.as_bytes(), &entry.bytes))
            .collect();
        records.extend(resume.as_deref().map(|r| on_partition(RESUME_KEY, r)));
        records.extend(heartbeat.as_deref().map(|h| on_partition(HEARTBEAT_KEY, h)));
        // the resume point follows the deltas
        let resume_at = deltas.len();
        records.extend(late.iter().map(|l| l.record(&self.kafka.late_topic)));
        let windows: Vec<(Vec<u8>, Vec<u8>)> = outputs
            .windows
            .iter()
            .map(|w| (w.record_key(), w.payload()))
            .collect();
        let produced = windows
            .iter()
            .map(|(key, payload)| (key.as_slice(), payload.as_slice()))
            .chain(
                owned
                    .iter()
                    .map(|(key, payload)| (key.as_slice(), *payload)),
            );
        records.extend(produced.map(|(key, payload)| TxRecord {
            key,
            payload,
            partition: None,
            topic: Some(&self.kafka.outputs_topic),
            headers: Vec::new(),
        }));
        let offsets = self
            .producer
            .commit_all(&self.kafka.deltas_topic, records)
            .await?;
        let bytes: usize = deltas.iter().map(|e| e.bytes.len()).sum();
        metrics::counter!(m::DELTAS_SHIPPED).increment(deltas.len() as u64);
        metrics::counter!(m::DELTA_BYTES_SHIPPED).increment(bytes as u64);
        metrics::counter!(m::LATE_SHIPPED).increment(late.len() as u64);
        metrics::counter!(m::OUTPUTS_PRODUCED).increment((windows.len() + owned.len()) as u64);
        Ok(resume.and(offsets.get(resume_at).copied()))
    }

    /// A late event's record for the late topic, or `None` (logged) if its outbox entry
    /// does not decode.
    fn late_out(&self, entry: &OutboxEntry) -> Option<LateOut> {
        match pb::LateEvent::decode(entry.bytes.as_slice()) {
            Ok(event) => Some(LateOut {
                source: format!(
                    "{}/{}/{}",
                    self.kafka.updates_topic, event.partition, event.offset
                ),
                event_time: event.event_time_ms.to_string(),
                watermark: event.watermark_ms.to_string(),
                event,
            }),
            Err(e) => {
                tracing::error!(key = %entry.key.escape_debug(), error = %e, "a late event's outbox entry does not decode; dropped");
                None
            }
        }
    }
}

/// A late event as it goes to the late topic: the original record's key and value, with
/// the reason, its source position, event time and the watermark that refused it as
/// headers (those of a dead letter, and two more).
struct LateOut {
    event: pb::LateEvent,
    source: String,
    event_time: String,
    watermark: String,
}

impl LateOut {
    fn record<'a>(&'a self, topic: &'a str) -> TxRecord<'a> {
        TxRecord {
            key: self.event.key.as_deref().unwrap_or_default(),
            payload: &self.event.payload,
            partition: None,
            topic: Some(topic),
            headers: vec![
                (DLQ_REASON_HEADER, self.event.reason.as_bytes()),
                (DLQ_CODE_HEADER, b"late"),
                (DLQ_SOURCE_HEADER, self.source.as_bytes()),
                (LATE_EVENT_TIME_HEADER, self.event_time.as_bytes()),
                (LATE_WATERMARK_HEADER, self.watermark.as_bytes()),
            ],
        }
    }
}

/// Sleeps until `due`, or for ever.
async fn sleep_until(due: Option<Instant>) {
    match due {
        Some(due) => tokio::time::sleep_until(due.into()).await,
        None => std::future::pending().await,
    }
}

/// The outputs-topic record key of an owned output's outbox entry (its payload is the
/// record), or `None` (logged) if the entry does not decode.
fn owned_out(entry: &OutboxEntry) -> Option<Vec<u8>> {
    match serde_json::from_slice::<RegisterChange>(&entry.bytes) {
        Ok(change) => Some(change.record_key()),
        Err(e) => {
            tracing::error!(key = %entry.key.escape_debug(), error = %e, "an owned output's outbox entry does not decode; dropped");
            None
        }
    }
}

/// The final windows of `partition` not produced yet (`Store::outputs_through`), as the
/// lowest watermark over the regions stands with this region's at `own`. If none closed
/// meanwhile, the position moves on at once: a final window's slices never change, so
/// none can turn up later in the range passed.
fn final_since(
    store: &Store,
    outputs: &Outputs,
    partition: i32,
    own: Option<u64>,
) -> Result<RoundOutputs, StoreError> {
    let through = store.outputs_through(partition)?;
    let Some(lowest) = outputs
        .lowest(store, partition, own)?
        .filter(|&lowest| through.is_none_or(|t| t < lowest))
    else {
        return Ok(RoundOutputs {
            windows: Vec::new(),
            through,
        });
    };
    let windows = outputs.final_windows(store, partition, through, lowest)?;
    if windows.is_empty() {
        store.raise_outputs_through(partition, lowest)?;
    }
    Ok(RoundOutputs {
        windows,
        through: Some(lowest),
    })
}
