//! Kafka, the log: client construction, partition discovery, positioning consumers at the
//! offsets stored in RocksDB, and the dead-letter record format. Knows nothing of state.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::Message;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Header, OwnedHeaders};
use rdkafka::producer::future_producer::Delivery;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::types::RDKafkaErrorCode;

use crate::config::KafkaConfig;

/// Header of a dead-lettered record holding the human-readable reason.
pub const DLQ_REASON_HEADER: &str = "geostate.error";
/// Header holding the reason's stable code (`malformed`, `no_namespace`, …).
pub const DLQ_CODE_HEADER: &str = "geostate.error.code";
/// Header holding where the record came from: `topic/partition/offset`.
pub const DLQ_SOURCE_HEADER: &str = "geostate.source";
/// Header of a late event holding its event time (milliseconds since the epoch).
pub const LATE_EVENT_TIME_HEADER: &str = "geostate.event-time";
/// Header of a late event holding the watermark that refused it (milliseconds).
pub const LATE_WATERMARK_HEADER: &str = "geostate.watermark";

pub mod membership;
pub mod partitioner;
pub mod reach;
mod reader;
mod transactional;

pub use partitioner::{murmur2, partition_of};
pub use reader::{Batch, Batching, ConsumerSpec, PartitionReader, Reader, Split, restarted};
pub use transactional::{Transactional, TransactionalSpec, TxRecord};

/// How long a metadata or group request waits for Kafka's answer.
pub const METADATA_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one ask for a partition's watermarks waits before it is asked again
/// ([`watermarks`]).
const WATERMARK_ASK: Duration = Duration::from_millis(100);

/// One consumed record, copied out of librdkafka's buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub partition: i32,
    pub offset: i64,
    /// The Kafka record timestamp (ms), if the broker gave one.
    pub timestamp_ms: Option<i64>,
    pub key: Option<Vec<u8>>,
    pub payload: Option<Vec<u8>>,
}

impl Record {
    pub fn from_message(message: &BorrowedMessage<'_>) -> Self {
        Self {
            partition: message.partition(),
            offset: message.offset(),
            timestamp_ms: message.timestamp().to_millis(),
            key: message.key().map(<[u8]>::to_vec),
            payload: message.payload().map(<[u8]>::to_vec),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("kafka: {0}")]
    Kafka(#[from] KafkaError),
    #[error("topic {topic} does not exist or has no partitions")]
    NoPartitions { topic: String },
    #[error("kafka metadata task failed: {0}")]
    Join(#[from] tokio::task::JoinError),
    #[error("cannot start a thread: {0}")]
    Thread(String),
    #[error("a record of {topic}/{partition} came on its client's own queue, not its partition's")]
    Unsplit { topic: String, partition: i32 },
}

impl LogError {
    /// A produce error no retry can cure: the record (or its topic) is refused as such.
    pub fn is_refused_record(&self) -> bool {
        use RDKafkaErrorCode as C;
        matches!(
            self,
            LogError::Kafka(KafkaError::MessageProduction(
                C::MessageSizeTooLarge
                    | C::InvalidMessageSize
                    | C::MessageBatchTooLarge
                    | C::InvalidMessage
                    | C::InvalidRecord
                    | C::UnknownTopic
                    | C::TopicAuthorizationFailed
                    | C::InvalidTopic
            ))
        )
    }
}

/// Every producer's settings: the client's, and a key's partition chosen as the Java
/// producer chooses it ([`partition_of`]), so every writer of a topic agrees.
fn producer_config(kafka: &KafkaConfig) -> ClientConfig {
    let mut c = client_config(kafka);
    c.set("partitioner", "murmur2_random");
    c
}

fn client_config(kafka: &KafkaConfig) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", &kafka.bootstrap);
    for (k, v) in &kafka.client {
        c.set(k, v);
    }
    for (k, v) in kafka.security.iter().flat_map(|s| s.properties()) {
        c.set(k, v);
    }
    c
}

/// An idempotent producer with `acks=all` that sends at once and gives up on a record
/// (an error, never a silent drop) after `delivery_timeout`.
fn idempotent_producer(
    kafka: &KafkaConfig,
    delivery_timeout: Duration,
) -> Result<FutureProducer, LogError> {
    Ok(producer_config(kafka)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "0")
        .set(
            "message.timeout.ms",
            delivery_timeout.as_millis().to_string(),
        )
        .create()?)
}

/// An idempotent producer (`acks=all`) that is replaced by a new client after a record times out.
///
/// librdkafka can leave a client unable to reconnect for good after a Metadata answer
/// listing no brokers (see [`ConsumerSpec`]); a producer in that state times out every
/// record. The record that timed out stays the caller's to report (indeterminate: it may
/// have been appended); the next one goes through the new client.
pub struct RenewingProducer {
    kafka: KafkaConfig,
    delivery_timeout: Duration,
    /// The current client and how many clients came before it.
    current: Mutex<(u64, FutureProducer)>,
}

/// One record for [`RenewingProducer::append`].
pub struct Out<'a> {
    pub topic: &'a str,
    pub key: Option<&'a [u8]>,
    pub payload: &'a [u8],
    pub headers: &'a [(&'a str, &'a str)],
    /// The partition to write to (`None`: the key's).
    pub partition: Option<i32>,
}

/// A record [`RenewingProducer::queue_made`] makes under its lock.
pub struct Made {
    pub key: String,
    pub payload: Vec<u8>,
    pub timestamp_ms: i64,
}

impl RenewingProducer {
    pub fn new(kafka: &KafkaConfig, delivery_timeout: Duration) -> Result<Self, LogError> {
        Ok(Self {
            kafka: kafka.clone(),
            delivery_timeout,
            current: Mutex::new((0, idempotent_producer(kafka, delivery_timeout)?)),
        })
    }

    /// Appends one record and waits for its acknowledgement.
    pub async fn append(&self, out: &Out<'_>, queue_timeout: Duration) -> Result<(), LogError> {
        let mut headers = OwnedHeaders::new();
        for &(key, value) in out.headers {
            headers = headers.insert(Header {
                key,
                value: Some(value),
            });
        }
        let mut record = FutureRecord::to(out.topic)
            .payload(out.payload)
            .headers(headers);
        if let Some(key) = out.key {
            record = record.key(key);
        }
        if let Some(p) = out.partition {
            record = record.partition(p);
        }
        let (generation, producer) = self.lock().clone();
        let sent = producer.send(record, queue_timeout).await;
        if let Err((e, _)) = &sent
            && matches!(
                e,
                KafkaError::MessageProduction(RDKafkaErrorCode::MessageTimedOut)
            )
        {
            self.renew(generation, e);
        }
        if self.lock().0 != generation {
            // this may be the replaced client's last handle: dropping it purges and waits
            // for its threads
            tokio::task::spawn_blocking(move || drop(producer));
        }
        sent.map(|_| ()).map_err(|(e, _)| e.into())
    }

    /// Makes a record and queues it under the client's lock, so that records made by
    /// concurrent calls enter each partition in the order they were made (the producer is
    /// idempotent: its retries keep that order). Returns the wait for its
    /// acknowledgement; a full queue is an error at once.
    pub fn queue_made(
        &self,
        topic: &str,
        make: impl FnOnce() -> Made,
    ) -> Result<impl Future<Output = Result<Delivery, KafkaError>> + Send + '_, KafkaError> {
        let current = self.lock();
        let made = make();
        let record = FutureRecord::to(topic)
            .key(&made.key)
            .payload(&made.payload)
            .timestamp(made.timestamp_ms);
        let delivery = current.1.send_result(record).map_err(|(e, _)| e)?;
        let (generation, producer) = current.clone();
        drop(current);
        Ok(async move {
            let sent = match delivery.await {
                Ok(Ok(d)) => Ok(d),
                Ok(Err((e, _))) => Err(e),
                Err(_) => Err(KafkaError::Canceled),
            };
            if let Err(e @ KafkaError::MessageProduction(RDKafkaErrorCode::MessageTimedOut)) = &sent
            {
                self.renew(generation, e);
            }
            if self.lock().0 != generation {
                tokio::task::spawn_blocking(move || drop(producer));
            }
            sent
        })
    }

    /// Replaces client `generation` (once, however many sends saw it fail).
    fn renew(&self, generation: u64, error: &KafkaError) {
        let mut current = self.lock();
        if current.0 != generation {
            return;
        }
        match idempotent_producer(&self.kafka, self.delivery_timeout) {
            Ok(new) => {
                let old = std::mem::replace(&mut *current, (generation + 1, new));
                tracing::warn!(%error, "a record timed out; a new Kafka client sends the next ones");
                // dropping a producer purges and waits for its threads
                tokio::task::spawn_blocking(move || drop(old));
            }
            Err(again) => {
                tracing::warn!(%error, %again, "a record timed out, and starting a new Kafka client failed");
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (u64, FutureProducer)> {
        self.current.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The partitions of `topic` (blocking metadata call, run off the async threads).
pub async fn partitions(kafka: &KafkaConfig, topic: &str) -> Result<Vec<i32>, LogError> {
    let config = client_config(kafka);
    let topic = topic.to_owned();
    tokio::task::spawn_blocking(move || {
        let probe: BaseConsumer = config.create()?;
        let metadata = probe.fetch_metadata(Some(&topic), METADATA_TIMEOUT)?;
        let partitions: Vec<i32> = metadata
            .topics()
            .iter()
            .filter(|t| t.name() == topic && t.error().is_none())
            .flat_map(|t| t.partitions().iter().map(|p| p.id()))
            .collect();
        if partitions.is_empty() {
            return Err(LogError::NoPartitions { topic });
        }
        Ok(partitions)
    })
    .await?
}

/// The end offset (next offset to be written) of every partition.
pub async fn end_offsets(
    kafka: &KafkaConfig,
    topic: &str,
    partitions: Vec<i32>,
) -> Result<BTreeMap<i32, i64>, LogError> {
    let marks = watermarks(kafka, topic, partitions).await?;
    Ok(marks.into_iter().map(|(p, (_, end))| (p, end)).collect())
}

/// The first and the end offset of every partition (the blocking calls run off the async
/// threads). A new client asked for watermarks before any broker is up cannot send its
/// leader query, and asks again only once its growing wait allows
/// (`rd_kafka_topic_partition_list_query_leaders`); asked again, it asks at once. So each
/// ask waits [`WATERMARK_ASK`]. Measured on the local cluster: of 60 reads with one ask
/// of 10 s, 2 took 705–710 ms (the rest 1–8 ms); of 360 asked again after 100 ms, none
/// took over 107 ms (median 2–4 ms). Before any broker is up an ask ends
/// `AllBrokersDown` rather than timing out.
pub async fn watermarks(
    kafka: &KafkaConfig,
    topic: &str,
    partitions: Vec<i32>,
) -> Result<BTreeMap<i32, (i64, i64)>, LogError> {
    let config = client_config(kafka);
    let topic = topic.to_owned();
    tokio::task::spawn_blocking(move || {
        let probe: BaseConsumer = config.create()?;
        let deadline = std::time::Instant::now() + METADATA_TIMEOUT;
        let ask = |p| loop {
            let asked = std::time::Instant::now();
            match probe.fetch_watermarks(&topic, p, WATERMARK_ASK) {
                // no broker up yet within the ask: `AllBrokersDown`
                Err(e)
                    if matches!(
                        e.rdkafka_error_code(),
                        Some(
                            RDKafkaErrorCode::OperationTimedOut | RDKafkaErrorCode::AllBrokersDown
                        )
                    ) && std::time::Instant::now() < deadline =>
                {
                    // one ask per WATERMARK_ASK at most, however fast one fails
                    std::thread::sleep(WATERMARK_ASK.saturating_sub(asked.elapsed()));
                }
                read => return read,
            }
        };
        partitions.into_iter().map(|p| Ok((p, ask(p)?))).collect()
    })
    .await?
}

/// On a dead letter whose key or value was cut: `key=<bytes>,value=<bytes>`, the original
/// lengths.
pub const DLQ_TRUNCATED_HEADER: &str = "geostate.truncated";
