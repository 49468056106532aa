//! Kafka, the log: client construction, partition discovery, positioning consumers at the
//! offsets stored in RocksDB, and the dead-letter record format. Knows nothing of state.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::Message;
use rdkafka::consumer::{BaseConsumer, Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Header, OwnedHeaders};
use rdkafka::producer::FutureProducer;
use rdkafka::{Offset, TopicPartitionList};

use crate::config::KafkaConfig;

/// Header of a dead-lettered record holding the human-readable reason.
pub const DLQ_REASON_HEADER: &str = "geostate.error";
/// Header holding the reason's stable code (`malformed`, `no_namespace`, …).
pub const DLQ_CODE_HEADER: &str = "geostate.error.code";
/// Header holding where the record came from: `topic/partition/offset`.
pub const DLQ_SOURCE_HEADER: &str = "geostate.source";

const METADATA_TIMEOUT: Duration = Duration::from_secs(10);

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
}

fn client_config(kafka: &KafkaConfig) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", &kafka.bootstrap);
    for (k, v) in &kafka.client {
        c.set(k, v);
    }
    c
}

/// An idempotent producer with `acks=all` that sends at once and gives up on a record
/// (an error, never a silent drop) after `delivery_timeout`.
pub fn idempotent_producer(
    kafka: &KafkaConfig,
    delivery_timeout: Duration,
) -> Result<FutureProducer, LogError> {
    Ok(client_config(kafka)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "0")
        .set(
            "message.timeout.ms",
            delivery_timeout.as_millis().to_string(),
        )
        .create()?)
}

/// A consumer that is positioned by hand (never commits offsets to Kafka: the positions
/// live in RocksDB with the state) and answers fetches quickly.
pub fn positioned_consumer(kafka: &KafkaConfig, group: &str) -> Result<StreamConsumer, LogError> {
    consumer(kafka, group, false)
}

/// A [`positioned_consumer`] that also reports `KafkaError::PartitionEOF` each time it
/// reaches a partition's end: how a reader of a transactional topic (whose last offset
/// is a commit marker, never delivered) knows it has read everything.
pub fn end_reporting_consumer(
    kafka: &KafkaConfig,
    group: &str,
) -> Result<StreamConsumer, LogError> {
    consumer(kafka, group, true)
}

fn consumer(
    kafka: &KafkaConfig,
    group: &str,
    report_end: bool,
) -> Result<StreamConsumer, LogError> {
    Ok(client_config(kafka)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        // a stored position beyond the log (a recreated topic) is an error to look at,
        // never a silent re-read from the start
        .set("auto.offset.reset", "error")
        .set("isolation.level", "read_committed")
        .set("fetch.wait.max.ms", "10")
        .set("enable.partition.eof", report_end.to_string())
        .create()?)
}

/// A transactional producer (`acks=all`, idempotent) for `transactional_id`; its
/// `init_transactions` fences every earlier producer of the same id and aborts its open
/// transaction. Transaction calls block: run them off the async threads.
pub fn transactional_producer(
    kafka: &KafkaConfig,
    transactional_id: &str,
    transaction_timeout: Duration,
) -> Result<FutureProducer, LogError> {
    Ok(client_config(kafka)
        .set("transactional.id", transactional_id)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "0")
        .set(
            "transaction.timeout.ms",
            transaction_timeout.as_millis().to_string(),
        )
        .set(
            "message.timeout.ms",
            transaction_timeout.as_millis().to_string(),
        )
        .create()?)
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

/// Assigns every partition of `topic` to `consumer`, resuming each after its stored last
/// applied offset, or from the beginning if nothing of it was applied yet.
pub fn assign_after(
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

/// The end offset (next offset to be written) of every partition (blocking, run off the
/// async threads).
pub async fn end_offsets(
    kafka: &KafkaConfig,
    topic: &str,
    partitions: Vec<i32>,
) -> Result<BTreeMap<i32, i64>, LogError> {
    let config = client_config(kafka);
    let topic = topic.to_owned();
    tokio::task::spawn_blocking(move || {
        let probe: BaseConsumer = config.create()?;
        partitions
            .into_iter()
            .map(|p| {
                let (_, high) = probe.fetch_watermarks(&topic, p, METADATA_TIMEOUT)?;
                Ok((p, high))
            })
            .collect()
    })
    .await?
}

/// Headers of a dead-lettered record.
pub fn dlq_headers(code: &str, reason: &str, source: &str) -> OwnedHeaders {
    OwnedHeaders::new()
        .insert(Header {
            key: DLQ_REASON_HEADER,
            value: Some(reason),
        })
        .insert(Header {
            key: DLQ_CODE_HEADER,
            value: Some(code),
        })
        .insert(Header {
            key: DLQ_SOURCE_HEADER,
            value: Some(source),
        })
}
