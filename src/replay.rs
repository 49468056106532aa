//! `geostate dlq replay`: re-ingests the records of a dead-letter or late topic into the
//! region's updates topic, on purpose — late events of a region that was cut off, say,
//! into the current window. Each record is decoded as the update it was, given the event
//! time the operator names (a window still open) and the idempotency id
//! `replay:<topic>/<partition>/<offset>`, so replaying the same record into the same
//! window again counts it once. A record that does not decode is skipped and counted.
//!
//! ```text
//!  <late or dead-letter topic> ──read committed, to its end──► decode ──► event time, id
//!      ──► updates topic (key = the update's key: its partition)
//! ```

use std::collections::BTreeMap;
use std::time::Duration;

use crate::config::{KafkaConfig, RecordFormat};
use crate::ingest::event::Update;
use crate::log::{self, LogError, Out, RenewingProducer};

const BATCH: usize = 1000;
const APPEND_TIMEOUT: Duration = Duration::from_secs(30);

/// What one replay did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Replayed {
    /// Records appended to the updates topic (or, dry, that would be).
    pub appended: usize,
    /// Records that do not decode as an update: left where they are.
    pub skipped: usize,
}

/// The update a dead letter or late record replays as: its own, at `event_time_ms`, under
/// an id naming where it was read. `None` if it does not decode.
pub fn replayed(
    format: RecordFormat,
    payload: &[u8],
    source: &str,
    event_time_ms: u64,
) -> Option<Update> {
    let mut update = Update::decode(format, payload).ok()?;
    update.event_time_ms = Some(event_time_ms);
    update.id = Some(format!("replay:{source}"));
    // a register's stamp and an owned write's epoch belong to the first attempt
    update.hlc = None;
    Some(update)
}

/// Reads `topic` to its end and appends every record that decodes to the updates topic
/// (unless `dry_run`).
pub async fn replay(
    kafka: &KafkaConfig,
    topic: &str,
    event_time_ms: u64,
    dry_run: bool,
) -> Result<Replayed, LogError> {
    let partitions = log::partitions(kafka, topic).await?;
    let spec = log::ConsumerSpec {
        kafka: kafka.clone(),
        group: "geostate-replay".into(),
        report_end: true,
        topic: topic.to_owned(),
        partitions: partitions.clone(),
        role: "replay",
    };
    let mut reader = log::Reader::start(spec, &BTreeMap::new()).await?;
    let producer = RenewingProducer::new(kafka, APPEND_TIMEOUT)?;
    let batching = log::Batching {
        max: BATCH,
        linger: Duration::ZERO,
        idle: None,
    };
    let (_running, mut never_stopped) = tokio::sync::watch::channel(false);
    let mut at_end = std::collections::BTreeSet::new();
    let mut out = Replayed::default();
    while at_end.len() < partitions.len() {
        let Some(batch) = reader.next_batch(batching, &mut never_stopped).await else {
            break;
        };
        if let Some(e) = batch.failed {
            return Err(e);
        }
        at_end.extend(batch.at_end.iter().map(|(p, _)| *p));
        for record in batch.records {
            let source = format!("{topic}/{}/{}", record.partition, record.offset);
            let payload = record.payload.as_deref().unwrap_or_default();
            let Some(update) = replayed(kafka.format, payload, &source, event_time_ms) else {
                tracing::warn!(%source, "not an update record; skipped");
                out.skipped += 1;
                continue;
            };
            if !dry_run {
                let payload = update.encode(kafka.format);
                let append = Out {
                    topic: &kafka.updates_topic,
                    key: Some(update.key.as_bytes()),
                    payload: &payload,
                    headers: &[],
                    partition: None,
                };
                producer.append(&append, APPEND_TIMEOUT).await?;
            }
            out.appended += 1;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::HlcTimestamp;
    use crate::ingest::event::Op;

    #[test]
    fn a_replayed_record_gets_the_new_event_time_and_an_id_naming_its_source() {
        for format in [RecordFormat::Json, RecordFormat::Protobuf] {
            let late = Update {
                key: "requests/9q8yy".into(),
                op: Op::Add(3),
                id: Some("r-1".into()),
                event_time_ms: Some(600_000),
                hlc: Some(HlcTimestamp::new(5, 0)),
                epoch: None,
            };
            let again = replayed(format, &late.encode(format), "geostate.late/0/7", 720_000)
                .expect("decodes");
            assert_eq!(
                (again.event_time_ms, again.id.as_deref(), again.hlc),
                (Some(720_000), Some("replay:geostate.late/0/7"), None)
            );
            assert_eq!((again.key, again.op), (late.key, late.op));
        }
        assert_eq!(replayed(RecordFormat::Json, b"garbage", "t/0/1", 1), None);
    }
}
