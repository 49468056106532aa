//! Reading a topic in batches from positions stored with the state: the one consumer loop
//! behind ingest, the mergers and bootstrap.
//!
//! ```text
//!  Reader::start(spec, applied) ─► assign every partition after its applied offset
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
use std::time::Duration;

use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
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
    consumer: Closing,
}

/// A consumer closed off the async threads when it is dropped: closing one polls until
/// it is closed, in 100 ms steps (rdkafka's `BaseConsumer::drop`), then waits for
/// librdkafka's threads. Measured on the local cluster: 100 ms for most readers, which
/// every take's catch-up and every change of ingest's partitions waited for, with an
/// async thread blocked.
struct Closing(Option<StreamConsumer>);

impl std::ops::Deref for Closing {
    type Target = StreamConsumer;
    fn deref(&self) -> &StreamConsumer {
        self.0
            .as_ref()
            .expect("a consumer is taken only when it is dropped")
    }
}

impl Drop for Closing {
    fn drop(&mut self) {
        let Some(consumer) = self.0.take() else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn_blocking(move || drop(consumer))),
            Err(_) => drop(consumer),
        }
    }
}

/// One item the client delivers.
enum Next {
    Record(Record),
    End(i32),
    Failed(KafkaError),
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
        let mut batch = Batch::default();
        let first = tokio::select! {
            () = stopped(stop) => return None,
            next = self.recv() => next,
            () = sleep_or_never(batching.idle) => return Some(batch),
        };
        batch.first_at = Some(std::time::Instant::now());
        if !self.take(&mut batch, first) {
            return Some(batch);
        }
        let deadline = tokio::time::Instant::now() + batching.linger;
        while batch.records.len() < batching.max {
            let Ok(next) = tokio::time::timeout_at(deadline, self.recv()).await else {
                break;
            };
            if !self.take(&mut batch, next) {
                break;
            }
        }
        Some(batch)
    }

    /// Adds `next` to `batch`; false if the batch ends here.
    fn take(&self, batch: &mut Batch, next: Next) -> bool {
        match next {
            Next::Record(record) => {
                batch.records.push(record);
                true
            }
            Next::End(partition) => {
                batch.at_end.push((partition, self.position(partition)));
                false
            }
            Next::Failed(e) => {
                batch.failed = Some(e.into());
                false
            }
        }
    }

    async fn recv(&self) -> Next {
        match self.consumer.recv().await {
            Ok(message) => Next::Record(Record::from_message(&message)),
            Err(KafkaError::PartitionEOF(p)) => Next::End(p),
            Err(e) => Next::Failed(e),
        }
    }

    /// The offset the client reads next in `partition`, if it has one.
    pub fn position(&self, partition: i32) -> Option<i64> {
        let positions = self.consumer.position().ok()?;
        match positions
            .find_partition(&self.spec.topic, partition)?
            .offset()
        {
            Offset::Offset(next) => Some(next),
            _ => None,
        }
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
        let (topic, role) = (self.spec.topic.clone(), self.spec.role);
        match self.reposition(applied).await {
            Ok(()) => {
                tracing::warn!(%topic, %role, %error, "consuming failed; a new Kafka client reads on after the applied offsets");
            }
            Err(again) => {
                tracing::warn!(%topic, %role, %error, %again, "consuming failed, and so did starting a new Kafka client; retrying");
            }
        }
        metrics::counter!(m::CONSUMER_RESTARTS, "consumer" => role).increment(1);
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
) -> Result<Closing, LogError> {
    let mut fresh = consumer(spec)?;
    if spec.partitions.iter().any(|p| !applied.contains_key(p)) {
        let topic = spec.topic.clone();
        fresh = tokio::task::spawn_blocking(move || {
            let _ = fresh.fetch_metadata(Some(&topic), LEADERS_WAIT);
            fresh
        })
        .await?;
    }
    assign_after(&fresh, &spec.topic, &spec.partitions, applied)?;
    Ok(Closing(Some(fresh)))
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
