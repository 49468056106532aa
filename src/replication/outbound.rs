//! The outbound shipper task.
//!
//! Guarantee: every outbox entry reaches the deltas topic at least once. An entry is
//! deleted only after Kafka acknowledged it and only if the store still holds the same
//! bytes (a newer delta written meanwhile stays and ships next round); a crash anywhere
//! re-ships, which merge makes harmless. One record per key per round, keyed by the state
//! key, so the idempotent producer keeps a key's deltas in order on one partition.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::producer::{FutureProducer, FutureRecord};
use tokio::sync::{Notify, watch};

use crate::metrics as m;
use crate::shutdown::stopped;
use crate::store::{Store, StoreError};

/// Most outbox entries shipped per round.
const ROUND: usize = 1000;
/// Longest the shipper sleeps without being woken (catches entries left by a crash).
const IDLE: Duration = Duration::from_millis(500);
const RETRY_PAUSE: Duration = Duration::from_millis(200);

pub struct Shipper {
    pub store: Arc<Store>,
    pub producer: FutureProducer,
    pub topic: String,
    /// Notified after every committed batch.
    pub wake: Arc<Notify>,
}

impl Shipper {
    pub async fn run(self, mut stop: watch::Receiver<bool>) -> Result<(), StoreError> {
        loop {
            if *stop.borrow() {
                return Ok(());
            }
            let store = self.store.clone();
            let entries = tokio::task::spawn_blocking(move || store.outbox(ROUND))
                .await
                .unwrap_or_else(|e| Err(StoreError::Task(e.to_string())))?;
            if entries.is_empty() {
                tokio::select! {
                    () = stopped(&mut stop) => return Ok(()),
                    () = self.wake.notified() => {}
                    () = tokio::time::sleep(IDLE) => {}
                }
                continue;
            }
            if !self.ship(&entries).await {
                tokio::time::sleep(RETRY_PAUSE).await;
                continue;
            }
            let store = self.store.clone();
            tokio::task::spawn_blocking(move || store.clear_outbox(&entries))
                .await
                .unwrap_or_else(|e| Err(StoreError::Task(e.to_string())))?;
        }
    }

    /// Produces every entry; true once Kafka acknowledged all of them.
    async fn ship(&self, entries: &[(String, Vec<u8>)]) -> bool {
        let mut pending = Vec::with_capacity(entries.len());
        for (key, bytes) in entries {
            let record = FutureRecord::to(&self.topic).key(key).payload(bytes);
            match self.producer.send_result(record) {
                Ok(delivery) => pending.push(delivery),
                Err((e, _)) => {
                    tracing::warn!(error = %e, "shipping deltas failed; retrying");
                    return false;
                }
            }
        }
        let mut bytes = 0;
        for (delivery, (_, payload)) in pending.into_iter().zip(entries) {
            match delivery.await {
                Ok(Ok(_)) => bytes += payload.len(),
                Ok(Err((e, _))) => {
                    tracing::warn!(error = %e, "a delta was not acknowledged; retrying");
                    return false;
                }
                Err(_) => return false,
            }
        }
        metrics::counter!(m::DELTAS_SHIPPED).increment(entries.len() as u64);
        metrics::counter!(m::DELTA_BYTES_SHIPPED).increment(bytes as u64);
        true
    }
}
