//! A transactional producer: a whole batch of records committed at once, or none of them
//! (readers use `read_committed`). The shipping rounds use it.
//!
//! ```text
//!  TransactionalSpec::start ─► init_transactions (fences every earlier client of the id,
//!                              aborts its open transaction)
//!  commit_all(records) ─► begin ─► queue each (waits while the queue is full)
//!                      ─► await every delivery ─► commit
//!  failed ─► restart: a new client from the spec (its init aborts the open transaction)
//! ```

use std::time::Duration;

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord, Producer};

use super::{LogError, producer_config};
use crate::config::KafkaConfig;

/// How long to wait when the producer's queue is full.
const QUEUE_FULL_PAUSE: Duration = Duration::from_millis(2);
/// Longest a transaction call (init, begin, commit) may block.
const TXN_CALL: Duration = Duration::from_secs(30);
/// How long one `init_transactions` call waits before it is called again. Kafka refuses
/// an InitProducerId while the id's previous transaction is still being ended
/// (CONCURRENT_TRANSACTIONS: the previous owner died in a round, or its commit's markers
/// are still being written), and librdkafka asks again on its own only after a fixed
/// 500 ms (`rdkafka_idempotence.c`); a call asks again at once (`rd_kafka_idemp_start`,
/// immediate), or, while a request is out, waits for its answer. A new client would also
/// ask at once, but pays for its connections first: measured on the local cluster under
/// the scale bench's load, new clients after 100, 200 and 400 ms made fencing take
/// 250–1,522 ms where one client answered in 55–90 ms.
const INIT_POLL: Duration = Duration::from_millis(25);

/// How to make a transactional producer (`acks=all`, idempotent), and make it again.
#[derive(Clone, Debug)]
pub struct TransactionalSpec {
    pub kafka: KafkaConfig,
    pub transactional_id: String,
    pub transaction_timeout: Duration,
    /// librdkafka's `compression.type` of the records it produces.
    pub compression: &'static str,
}

impl TransactionalSpec {
    /// A new client, initialised: its `init_transactions` fenced every earlier producer
    /// of the same id and aborted its open transaction.
    pub async fn start(&self) -> Result<Transactional, LogError> {
        Ok(Transactional {
            producer: self.client().await?,
            spec: self.clone(),
        })
    }

    async fn client(&self) -> Result<FutureProducer, LogError> {
        let timeout_ms = self.transaction_timeout.as_millis().to_string();
        let deadline = std::time::Instant::now() + TXN_CALL;
        let producer: FutureProducer = producer_config(&self.kafka)
            .set("transactional.id", &self.transactional_id)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", "0")
            .set("compression.type", self.compression)
            .set("transaction.timeout.ms", &timeout_ms)
            .set("message.timeout.ms", &timeout_ms)
            .create()?;
        let (init, topic) = (producer.clone(), self.kafka.deltas_topic.clone());
        let connected_then_init = move || {
            // connected first: a client asks for its producer id when it is made, and if
            // no broker is up yet it asks again only on librdkafka's 500 ms coordinator
            // timer (measured: a third of new clients on the local cluster)
            init.client().fetch_metadata(Some(&topic), TXN_CALL)?;
            loop {
                match init.init_transactions(INIT_POLL) {
                    Err(KafkaError::Transaction(e))
                        if e.is_retriable() && std::time::Instant::now() < deadline => {}
                    done => return done,
                }
            }
        };
        match tokio::task::spawn_blocking(connected_then_init).await? {
            Ok(()) => Ok(producer),
            Err(e) => {
                // dropping a producer purges and waits for its threads
                tokio::task::spawn_blocking(move || drop(producer)).await?;
                Err(e.into())
            }
        }
    }
}

/// One record of a transaction: to `partition`, or by key; to the transaction's topic
/// unless it names another.
pub struct TxRecord<'a> {
    pub key: &'a [u8],
    pub payload: &'a [u8],
    pub partition: Option<i32>,
    pub topic: Option<&'a str>,
    pub headers: Vec<(&'a str, &'a [u8])>,
}

impl<'a> TxRecord<'a> {
    /// A record whose partition its key decides.
    pub fn by_key(key: &'a [u8], payload: &'a [u8]) -> Self {
        Self {
            key,
            payload,
            partition: None,
            topic: None,
            headers: Vec::new(),
        }
    }
}

/// A transactional producer, initialised.
pub struct Transactional {
    spec: TransactionalSpec,
    producer: FutureProducer,
}

impl Transactional {
    /// One transaction: begin, queue every record, wait for every delivery, commit;
    /// answers each record's offset, in order.
    /// Every delivery is awaited before the commit: leaving the flush to
    /// `commit_transaction` costs about 130 ms of replication lag per round (measured:
    /// p50 160 ms instead of 16 ms through MirrorMaker 2), for a few percent of CPU saved.
    pub async fn commit_all(
        &self,
        topic: &str,
        records: impl IntoIterator<Item = TxRecord<'_>>,
    ) -> Result<Vec<i64>, LogError> {
        self.blocking(|p| p.begin_transaction()).await?;
        let mut deliveries = Vec::new();
        for record in records {
            deliveries.push(self.queue(topic, &record).await?);
        }
        let mut offsets = Vec::with_capacity(deliveries.len());
        for delivery in deliveries {
            let delivered = delivery
                .await
                .map_err(|_| KafkaError::Canceled)?
                .map_err(|(e, _)| e)?;
            offsets.push(delivered.offset);
        }
        self.blocking(|p| p.commit_transaction(TXN_CALL)).await?;
        Ok(offsets)
    }

    /// A fatal error of this client (another client of the same id fenced it): no new
    /// client of this spec will do better.
    pub fn fatal_error(&self) -> Option<String> {
        self.producer
            .client()
            .fatal_error()
            .map(|(code, reason)| format!("{code:?}: {reason}"))
    }

    /// After a failed transaction, a new client: its `init_transactions` aborts the
    /// transaction left open, and the old client may never reach a broker again
    /// ([`super::ConsumerSpec`] says why). Logged; if the new client cannot be made, the
    /// old one stays.
    pub async fn restart(&mut self, error: &LogError) {
        match self.spec.client().await {
            Ok(new) => {
                let old = std::mem::replace(&mut self.producer, new);
                tracing::warn!(%error, id = %self.spec.transactional_id, "a transaction failed; a new Kafka client runs the next");
                // dropping a producer purges and waits for its threads
                tokio::task::spawn_blocking(move || drop(old));
            }
            Err(again) => {
                tracing::warn!(%error, %again, id = %self.spec.transactional_id, "a transaction failed, and so did starting a new Kafka client; retrying");
            }
        }
    }

    /// Queues one record, waiting while the producer's queue is full.
    async fn queue(&self, topic: &str, out: &TxRecord<'_>) -> Result<DeliveryFuture, LogError> {
        loop {
            let mut record = FutureRecord::to(out.topic.unwrap_or(topic))
                .key(out.key)
                .payload(out.payload);
            if let Some(p) = out.partition {
                record = record.partition(p);
            }
            if !out.headers.is_empty() {
                let headers = out
                    .headers
                    .iter()
                    .fold(OwnedHeaders::new(), |h, &(key, value)| {
                        h.insert(Header {
                            key,
                            value: Some(value),
                        })
                    });
                record = record.headers(headers);
            }
            match self.producer.send_result(record) {
                Ok(delivery) => return Ok(delivery),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                    tokio::time::sleep(QUEUE_FULL_PAUSE).await;
                }
                Err((e, _)) => return Err(e.into()),
            }
        }
    }

    /// Runs a blocking transaction call off the async threads.
    async fn blocking(
        &self,
        call: impl FnOnce(&FutureProducer) -> Result<(), KafkaError> + Send + 'static,
    ) -> Result<(), LogError> {
        let producer = self.producer.clone();
        Ok(tokio::task::spawn_blocking(move || call(&producer))
            .await
            .unwrap_or(Err(KafkaError::Canceled))?)
    }
}
