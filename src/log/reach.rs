//! Whether this node reaches its region's Kafka: the updates topic's metadata asked twice
//! a second, answered only if every partition has a leader. Unreachable once no ask was
//! answered for a while (`lease.kafka-down-after`), reachable again at the first answer.
//! A region that cannot reach its Kafka cannot write, so it must not keep keys no other
//! region may write: the lease manager lets its leases go meanwhile (`lease::leases`).
//!
//! ```text
//!  every 500 ms: metadata(updates topic, wait 500 ms) ── every partition led ──► answered
//!  answered within down-after? ──► reachable: watch<bool> ──► lease manager, gauge
//! ```
//!
//! The client is kept while it answers (a new one first connects, with TLS and SASL where
//! configured, which can take longer than one ask); one that has not answered for
//! `down-after` is replaced: a broker that was frozen can first answer metadata listing no
//! brokers, which can leave a librdkafka client unable to reconnect for good (see
//! `tests/kafka_down.rs`).

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use tokio::sync::watch;

use super::client_config;
use crate::config::KafkaConfig;
use crate::metrics as m;

/// How often the metadata is asked, and how long each ask waits.
const ASK_EVERY: Duration = Duration::from_millis(500);

/// Follows whether `kafka` answers for `topic` until `stop`, on a thread of its own (the
/// asks block): `reachable` turns false once none was answered for `down_after`, and true
/// again at the next answer.
pub async fn follow(
    kafka: KafkaConfig,
    topic: String,
    down_after: Duration,
    reachable: watch::Sender<bool>,
    stop: watch::Receiver<bool>,
) {
    metrics::gauge!(m::KAFKA_REACHABLE).set(1.0);
    let asking = tokio::task::spawn_blocking(move || {
        let mut answered = Instant::now();
        // the client, and when it was made
        let mut client: Option<(BaseConsumer, Instant)> = None;
        while !*stop.borrow() {
            let asked = Instant::now();
            if client.as_ref().is_some_and(|(_, made)| {
                made.elapsed() >= down_after && answered.elapsed() >= down_after
            }) {
                client = None;
            }
            if client.is_none() {
                client = client_config(&kafka).create().ok().map(|c| (c, asked));
            }
            if client.as_ref().is_some_and(|(c, _)| answers(c, &topic)) {
                answered = Instant::now();
            }
            let up = answered.elapsed() < down_after;
            if reachable.send_if_modified(|was| std::mem::replace(was, up) != up) {
                metrics::gauge!(m::KAFKA_REACHABLE).set(f64::from(u8::from(up)));
                if up {
                    tracing::info!(%topic, "this region's Kafka answers again");
                } else {
                    tracing::error!(%topic, unanswered_ms = answered.elapsed().as_millis() as u64, "this region's Kafka does not answer: its leases are let go until it does");
                }
            }
            std::thread::sleep(ASK_EVERY.saturating_sub(asked.elapsed()));
        }
    });
    let _ = asking.await;
}

/// Whether Kafka named a leader for every partition of `topic` to `client` within
/// [`ASK_EVERY`].
fn answers(client: &BaseConsumer, topic: &str) -> bool {
    client
        .fetch_metadata(Some(topic), ASK_EVERY)
        .is_ok_and(|metadata| {
            let topics = metadata.topics().iter().filter(|t| t.name() == topic);
            let partitions: Vec<_> = topics.flat_map(|t| t.partitions()).collect();
            !partitions.is_empty() && partitions.iter().all(|p| p.leader() >= 0)
        })
}
