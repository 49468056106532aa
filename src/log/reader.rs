//! Reading a topic in batches from positions stored with the state: the one consumer loop
//! behind ingest, the mergers and bootstrap.
//!
//! ```text
//!  Reader::start(spec, applied) ─► assign every partition after its applied offset
//!  Split::start(spec, applied)  ─► the same, each partition on its own queue: a
//!              PartitionReader per partition (ingest's tasks), errors on Split::failed
//!  next_batch: wait for the first record (or stop, or `idle`) ─► take what follows until
//!              `max` records or `linger` ─► Batch { records, at_end, failed }
//!  failed ─► the caller applies the records, then Reader::restart(error, applied): a new
//!            client from the positions the store holds now
//! ```
//!
//! A consumer never commits offsets to Kafka: the positions live in RocksDB with the state
//! they produced, so a new client (after an error, a restart, a restore) resumes exactly
//! after what was applied.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::stream_consumer::StreamPartitionQueue;
use rdkafka::consumer::{Consumer, DefaultConsumerContext, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::watch;

use super::{LogError, Record, client_config};
use crate::config::KafkaConfig;
use crate::metrics as m;
use crate::shutdown::stopped;

/// How to make a positioned consumer of a topic, and make it again.
///
/// A consumer that saw an error is replaced by a new client rather than nursed: librdkafka
/// can leave a client unable to fetch for good and says so only once, as that error.
/// Seen here: a Metadata answer listing no brokers (a broker its controller fenced
/// after a freeze) makes the client drop every broker it knew and never reconnect
/// (librdkafka #5301); and under `auto.offset.reset = error`, a partition it could not
/// position (a ListOffsets answer it takes as permanent, a fetch out of range) is never
/// fetched again. The new client resumes at the positions stored with the state, so
/// nothing is skipped and nothing applied twice.
#[derive(Clone, Debug)]
pub struct ConsumerSpec {
    pub kafka: KafkaConfig,
    pub group: String,
    /// Report each partition's end when reached: how a reader of a transactional topic
    /// (whose last offset is a commit marker, never delivered) knows it has read
    /// everything.
    pub report_end: bool,
    pub topic: String,
    pub partitions: Vec<i32>,
    /// Who reads (`ingest`, `merge`, `bootstrap`): the label of its restarts' metric.
    pub role: &'static str,
}

/// How [`Reader::next_batch`] gathers a batch.
#[derive(Clone, Copy, Debug)]
pub struct Batching {
    /// At most this many records.
    pub max: usize,
    /// After the first record, how long to wait for more.
    pub linger: Duration,
    /// With nothing to read for this long, answer an empty batch.
    pub idle: Option<Duration>,
}

/// What one [`Reader::next_batch`] read.
#[derive(Debug, Default)]
pub struct Batch {
    pub records: Vec<Record>,
    /// Partitions whose end was reached (`report_end`), each with the offset after the
    /// last one consumed (past a commit marker), if the client knows it.
    pub at_end: Vec<(i32, Option<i64>)>,
    /// The read stopped on this error: apply `records`, then [`Reader::restart`].
    pub failed: Option<LogError>,
    /// When the first record arrived.
    pub first_at: Option<std::time::Instant>,
}

/// A positioned consumer of one topic.
pub struct Reader {
    spec: ConsumerSpec,
    consumer: OffThread<StreamConsumer>,
}

/// A part of a Kafka client dropped off the async threads: closing a consumer polls until
/// it is closed, in 100 ms steps (rdkafka's `BaseConsumer::drop`), then waits for
/// librdkafka's threads. Measured on the local cluster: 100 ms for most readers, which
/// every take's catch-up and every change of ingest's partitions waited for, with an
/// async thread blocked. A partition's queue holds its client: whichever of them is
/// dropped last closes it.
struct OffThread<T: Send + 'static>(Option<T>);

impl<T: Send + 'static> std::ops::Deref for OffThread<T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.0.as_ref().expect("taken only when it is dropped")
    }
}

impl<T: Send + 'static> Drop for OffThread<T> {
    fn drop(&mut self) {
        let Some(part) = self.0.take() else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn_blocking(move || drop(part))),
            Err(_) => drop(part),
        }
    }
}

/// One item the client delivers.
enum Next {
    Record(Record),
    End(i32),
    Failed(KafkaError),
}

impl Next {
    fn of(delivered: Result<BorrowedMessage<'_>, KafkaError>) -> Self {
        match delivered {
            Ok(message) => Next::Record(Record::from_message(&message)),
            Err(KafkaError::PartitionEOF(p)) => Next::End(p),
            Err(e) => Next::Failed(e),
        }
    }
}

impl Reader {
    /// A new client, assigned every partition after its last applied offset (from the
    /// beginning where nothing was applied).
    pub async fn start(spec: ConsumerSpec, applied: &BTreeMap<i32, i64>) -> Result<Self, LogError> {
        let consumer = positioned(&spec, applied).await?;
        Ok(Self { spec, consumer })
    }

    pub fn partitions(&self) -> &[i32] {
        &self.spec.partitions
    }

    /// The next batch, or `None` once `stop` turns true while waiting for its first
    /// record. Records already gathered are never dropped: after the first, the batch
    /// ends at `max`, at `linger`, at a partition's end or at an error.
    pub async fn next_batch(
        &mut self,
        batching: Batching,
        stop: &mut watch::Receiver<bool>,
    ) -> Option<Batch> {
        let consumer: &StreamConsumer = &self.consumer;
        let recv = || async move { Next::of(consumer.recv().await) };
        gather(batching, stop, recv, |p| self.position(p)).await
    }

    /// The offset the client reads next in `partition`, if it has one.
    pub fn position(&self, partition: i32) -> Option<i64> {
        position_in(&self.consumer, &self.spec.topic, partition)
    }

    /// Puts a new client in place of this one, positioned after `applied` (the old one is
    /// closed off the async threads). On an error the old one stays.
    pub async fn reposition(&mut self, applied: &BTreeMap<i32, i64>) -> Result<(), LogError> {
        self.consumer = positioned(&self.spec, applied).await?;
        Ok(())
    }

    /// After `error`, a new client reads on after `applied` ([`ConsumerSpec`] says why);
    /// logged and counted. If it cannot be made, the old one stays and the caller tries
    /// again after its next batch.
    pub async fn restart(&mut self, error: &LogError, applied: &BTreeMap<i32, i64>) {
        let again = self.reposition(applied).await.err();
        restarted(&self.spec, error, again.as_ref());
    }
}

/// Logs and counts a client of `spec` replaced after `error` (`again`: making the new
/// one failed too).
pub fn restarted(spec: &ConsumerSpec, error: &LogError, again: Option<&LogError>) {
    let (topic, role) = (&spec.topic, spec.role);
    match again {
        None => {
            tracing::warn!(%topic, %role, %error, "consuming failed; a new Kafka client reads on after the applied offsets");
        }
        Some(again) => {
            tracing::warn!(%topic, %role, %error, %again, "consuming failed, and so did starting a new Kafka client; retrying");
        }
    }
    metrics::counter!(m::CONSUMER_RESTARTS, "consumer" => role).increment(1);
}

/// One client reading several partitions of a topic, each on a queue of its own
/// ([`PartitionReader`]): a partition's records never wait behind another's, as they do
/// in the client's one queue, where librdkafka delivers a fetch's worth of one partition
/// at a time. The client's own queue then carries only what concerns the client as a
/// whole, such as a broker it cannot reach: [`Split::failed`], which must be awaited.
pub struct Split {
    consumer: OffThread<Arc<StreamConsumer>>,
}

/// The queue of one partition of a [`Split`] client.
pub struct PartitionReader {
    partition: i32,
    topic: String,
    /// The queue, and the client it holds (for positions).
    queue: OffThread<(
        StreamPartitionQueue<DefaultConsumerContext>,
        Arc<StreamConsumer>,
    )>,
}

impl Split {
    /// A new client of `spec`, each partition on its own queue, positioned after its
    /// applied offset (from the beginning where nothing was applied).
    pub async fn start(
        spec: &ConsumerSpec,
        applied: &BTreeMap<i32, i64>,
    ) -> Result<(Self, BTreeMap<i32, PartitionReader>), LogError> {
        let consumer = OffThread(Some(Arc::new(fresh(spec, applied).await?)));
        // split before the partitions are assigned: librdkafka never forwards to the
        // client's queue a partition queue the application forwarded
        // (`rd_kafka_toppar_op_fetch_start`), so no record of a partition can reach
        // the client's queue, fetched before its own queue was split off
        let mut readers = BTreeMap::new();
        for &partition in &spec.partitions {
            let queue =
                (consumer.split_partition_queue(&spec.topic, partition)).ok_or_else(|| {
                    LogError::NoPartitions {
                        topic: spec.topic.clone(),
                    }
                })?;
            let reader = PartitionReader {
                partition,
                topic: spec.topic.clone(),
                queue: OffThread(Some((queue, Arc::clone(&consumer)))),
            };
            readers.insert(partition, reader);
        }
        assign_after(&consumer, &spec.topic, &spec.partitions, applied)?;
        Ok((Self { consumer }, readers))
    }

    /// The next error the client reports for itself (pending until there is one): a
    /// new client must read on after the applied offsets ([`ConsumerSpec`] says why).
    /// [`LogError::Unsplit`] is not such an error: a partition's position moved past a
    /// record its reader never saw, so its reader's positions cannot be trusted.
    pub async fn failed(&self) -> LogError {
        match self.consumer.recv().await {
            Err(e) => e.into(),
            // never: every partition has its own queue, split before it was assigned
            Ok(message) => LogError::Unsplit {
                topic: message.topic().to_string(),
                partition: message.partition(),
            },
        }
    }
}

impl PartitionReader {
    pub fn partition(&self) -> i32 {
        self.partition
    }

    /// The partition's next batch, as [`Reader::next_batch`] reads one. A reader with
    /// nothing to read answers an empty batch at least every `IDLE_AT_MOST`, whatever
    /// `batching.idle` says: a caller that loops on it then never waits on a wake-up
    /// the queue could miss.
    pub async fn next_batch(
        &mut self,
        batching: Batching,
        stop: &mut watch::Receiver<bool>,
    ) -> Option<Batch> {
        let (queue, consumer) = &*self.queue;
        let recv = || async move { Next::of(queue.recv().await) };
        let batching = Batching {
            idle: Some(batching.idle.map_or(IDLE_AT_MOST, |i| i.min(IDLE_AT_MOST))),
            ..batching
        };
        gather(batching, stop, recv, |p| {
            position_in(consumer, &self.topic, p)
        })
        .await
    }

    /// The offset the client reads next in the partition, if it has one.
    pub fn position(&self) -> Option<i64> {
        position_in(&self.queue.1, &self.topic, self.partition)
    }
}

/// The longest a [`PartitionReader`] waits before it answers an empty batch.
const IDLE_AT_MOST: Duration = Duration::from_secs(1);

/// A batch of what `recv` delivers, or `None` once `stop` turns true while waiting for
/// its first record; `position` says where a partition whose end was reached is. After
/// the first record, the batch ends at `max`, at `linger`, at a partition's end or at an
/// error.
async fn gather<R, F>(
    batching: Batching,
    stop: &mut watch::Receiver<bool>,
    mut recv: R,
    position: impl Fn(i32) -> Option<i64>,
) -> Option<Batch>
where
    R: FnMut() -> F,
    F: Future<Output = Next>,
{
    let mut batch = Batch::default();
    let first = tokio::select! {
        () = stopped(stop) => return None,
        next = recv() => next,
        () = sleep_or_never(batching.idle) => return Some(batch),
    };
    batch.first_at = Some(std::time::Instant::now());
    if !take(&mut batch, first, &position) {
        return Some(batch);
    }
    let deadline = tokio::time::Instant::now() + batching.linger;
    while batch.records.len() < batching.max {
        let Ok(next) = tokio::time::timeout_at(deadline, recv()).await else {
            break;
        };
        if !take(&mut batch, next, &position) {
            break;
        }
    }
    Some(batch)
}

/// Adds `next` to `batch`; false if the batch ends here.
fn take(batch: &mut Batch, next: Next, position: impl Fn(i32) -> Option<i64>) -> bool {
    match next {
        Next::Record(record) => {
            batch.records.push(record);
            true
        }
        Next::End(partition) => {
            batch.at_end.push((partition, position(partition)));
            false
        }
        Next::Failed(e) => {
            batch.failed = Some(e.into());
            false
        }
    }
}

/// The offset `consumer` reads next in `partition` of `topic`, if it has one.
fn position_in(consumer: &StreamConsumer, topic: &str, partition: i32) -> Option<i64> {
    let positions = consumer.position().ok()?;
    match positions.find_partition(topic, partition)?.offset() {
        Offset::Offset(next) => Some(next),
        _ => None,
    }
}

async fn sleep_or_never(wait: Option<Duration>) {
    match wait {
        Some(wait) => tokio::time::sleep(wait).await,
        None => std::future::pending().await,
    }
}

/// How long a new client waits for the leaders of partitions it reads from their start.
const LEADERS_WAIT: Duration = Duration::from_secs(2);

/// A new client of `spec`, assigned its partitions after `applied`. A partition read from
/// its start is positioned by a ListOffsets request, which librdkafka, if it knows no
/// leader for the partition yet, puts off by 500 ms (`rd_kafka_toppar_offset_request`);
/// and a new client knows no leader before its first metadata. So it asks for the
/// topic's metadata first (off the async threads; a failure only costs the 500 ms).
/// Measured on the local cluster: the first record of a partition read from its start
/// after 504–508 ms, and after 4–12 ms from a stored offset.
async fn positioned(
    spec: &ConsumerSpec,
    applied: &BTreeMap<i32, i64>,
) -> Result<OffThread<StreamConsumer>, LogError> {
    let consumer = OffThread(Some(fresh(spec, applied).await?));
    assign_after(&consumer, &spec.topic, &spec.partitions, applied)?;
    Ok(consumer)
}

/// A new client of `spec`, not assigned yet, that knows the topic's leaders if a
/// partition is to be read from its start ([`positioned`] says why).
async fn fresh(
    spec: &ConsumerSpec,
    applied: &BTreeMap<i32, i64>,
) -> Result<StreamConsumer, LogError> {
    let mut fresh = consumer(spec)?;
    if spec.partitions.iter().any(|p| !applied.contains_key(p)) {
        let topic = spec.topic.clone();
        fresh = tokio::task::spawn_blocking(move || {
            let _ = fresh.fetch_metadata(Some(&topic), LEADERS_WAIT);
            fresh
        })
        .await?;
    }
    Ok(fresh)
}

/// A consumer that is positioned by hand (never commits offsets to Kafka: the positions
/// live in RocksDB with the state) and answers fetches quickly.
fn consumer(spec: &ConsumerSpec) -> Result<StreamConsumer, LogError> {
    let mut config = client_config(&spec.kafka);
    // a broker answers a fetch as soon as there is something to read: the wait bounds
    // only the empty answers, i.e. how often an idle reader asks (a client setting wins)
    if !spec.kafka.client.contains_key("fetch.wait.max.ms") {
        config.set("fetch.wait.max.ms", "10");
    }
    Ok(config
        .set("group.id", &spec.group)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        // a stored position beyond the log (a recreated topic) is an error to look at,
        // never a silent re-read from the start
        .set("auto.offset.reset", "error")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", spec.report_end.to_string())
        .create()?)
}

/// Assigns every partition of `topic` to `consumer`, resuming each after its stored last
/// applied offset, or from the beginning if nothing of it was applied yet.
fn assign_after(
    consumer: &StreamConsumer,
    topic: &str,
    partitions: &[i32],
    applied: &BTreeMap<i32, i64>,
) -> Result<(), LogError> {
    let mut tpl = TopicPartitionList::new();
    for &p in partitions {
        let offset = match applied.get(&p) {
            Some(&last) => Offset::Offset(last + 1),
            None => Offset::Beginning,
        };
        tpl.add_partition_offset(topic, p, offset)?;
    }
    consumer.assign(&tpl)?;
    Ok(())
}
