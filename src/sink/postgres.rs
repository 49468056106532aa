//! `geostate sink postgres`: the outputs topic of one region into a PostgreSQL table,
//! each output once.
//!
//! ```text
//!  start ──► connect, create the schema, take the source's advisory lock
//!        ──► offsets of (region, topic) from geostate_sink_offsets ──► read after them
//!  batch ──► BEGIN; upsert geostate_outputs (guard: higher (epoch, version) wins);
//!            records that are no output ──► geostate_sink_rejects; offsets ──► COMMIT
//!  any PostgreSQL error (the server restarted, the commit's outcome unknown) ──► a new
//!        connection, the offsets PostgreSQL holds now, and the reader put back there
//! ```
//!
//! A row and the offset that consumed it commit together, so after a crash of the sink,
//! of PostgreSQL or between the two, the sink resumes exactly after what the table holds:
//! no output is lost and none applied twice. The upsert is keyed by (key, window start)
//! and only a higher (epoch, version) replaces a row, so two regions' sinks writing the
//! same final window into one table leave one row, and a stale lease holder's result
//! never overwrites its successor's. The advisory lock keeps a second sink of the same
//! region waiting until the first one's connection ends.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::sync::watch;
use tokio_postgres::{Client, NoTls};

use super::{OutputRecord, parse};
use crate::config::KafkaConfig;
use crate::log::{self, Batching, Reader, Record};

/// The tables, created by the sink if they do not exist (quietly: no notice per table
/// that exists already).
pub const SCHEMA: &str = "
SET client_min_messages = warning;
CREATE TABLE IF NOT EXISTS geostate_outputs (
    key              text        NOT NULL,
    window_start_ms  bigint      NOT NULL,
    window_end_ms    bigint      NOT NULL,
    value            numeric     NOT NULL,
    epoch            bigint      NOT NULL,
    version          bigint      NOT NULL,
    region           text        NOT NULL,
    produced_at      timestamptz NOT NULL,
    written_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    source_partition integer     NOT NULL,
    source_offset    bigint      NOT NULL,
    PRIMARY KEY (key, window_start_ms)
);
CREATE TABLE IF NOT EXISTS geostate_sink_offsets (
    source      text        NOT NULL,
    topic       text        NOT NULL,
    partition   integer     NOT NULL,
    next_offset bigint      NOT NULL,
    updated_at  timestamptz NOT NULL,
    PRIMARY KEY (source, topic, partition)
);
CREATE TABLE IF NOT EXISTS geostate_sink_rejects (
    source    text    NOT NULL,
    topic     text    NOT NULL,
    partition integer NOT NULL,
    \"offset\"  bigint  NOT NULL,
    reason    text    NOT NULL,
    payload   bytea,
    PRIMARY KEY (source, topic, partition, \"offset\")
);
";

const UPSERT: &str = "
INSERT INTO geostate_outputs AS o (key, window_start_ms, window_end_ms, value, epoch, version,
    region, produced_at, source_partition, source_offset)
SELECT k, s, e, v::numeric, ep, ver, r, to_timestamp(t / 1000.0), p, off
FROM UNNEST($1::text[], $2::int8[], $3::int8[], $4::text[], $5::int8[], $6::int8[],
            $7::text[], $8::int8[], $9::int4[], $10::int8[]) AS u(k, s, e, v, ep, ver, r, t, p, off)
ON CONFLICT (key, window_start_ms) DO UPDATE SET
    window_end_ms = excluded.window_end_ms, value = excluded.value, epoch = excluded.epoch,
    version = excluded.version, region = excluded.region, produced_at = excluded.produced_at,
    source_partition = excluded.source_partition, source_offset = excluded.source_offset,
    written_at = clock_timestamp()
WHERE (excluded.epoch, excluded.version) > (o.epoch, o.version)";

const REJECT: &str = "
INSERT INTO geostate_sink_rejects (source, topic, partition, \"offset\", reason, payload)
VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING";

const OFFSETS: &str = "
INSERT INTO geostate_sink_offsets (source, topic, partition, next_offset, updated_at)
SELECT $1, $2, p, n, clock_timestamp() FROM UNNEST($3::int4[], $4::int8[]) AS u(p, n)
ON CONFLICT (source, topic, partition) DO UPDATE SET
    next_offset = excluded.next_offset, updated_at = excluded.updated_at
WHERE excluded.next_offset > geostate_sink_offsets.next_offset";

/// Records per PostgreSQL transaction, at most.
const BATCH: usize = 2000;
/// After a batch's first record, how long to wait for more.
const LINGER: Duration = Duration::from_millis(20);
/// How long the broker holds an empty fetch of the sink's reader (librdkafka
/// `fetch.wait.max.ms`).
const IDLE_FETCH_WAIT_MS: &str = "500";
/// Between two attempts to reach PostgreSQL.
const RETRY: Duration = Duration::from_secs(1);

/// What a sink reads and where it writes.
#[derive(Clone, Debug)]
pub struct SinkConfig {
    /// The region whose outputs topic this is: the offsets' `source`.
    pub region: String,
    pub kafka: KafkaConfig,
    /// A libpq connection string or URL.
    pub postgres: String,
}

/// What one sink run wrote, until it stopped.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    pub transactions: u64,
    pub records: u64,
    pub rejected: u64,
}

/// A connection to PostgreSQL under the name `application` (as `pg_stat_activity` shows
/// it), its connection task spawned.
pub async fn connect(url: &str, application: &str) -> Result<Client, tokio_postgres::Error> {
    let mut config: tokio_postgres::Config = url.parse()?;
    config.application_name(application);
    config.connect_timeout(Duration::from_secs(5));
    let (client, connection) = config.connect(NoTls).await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::warn!(error = %e, "the PostgreSQL connection ended");
        }
    });
    Ok(client)
}

/// The offsets stored for `(region, topic)`: each partition's last consumed offset.
pub async fn stored_offsets(
    client: &Client,
    region: &str,
    topic: &str,
) -> Result<BTreeMap<i32, i64>, tokio_postgres::Error> {
    let rows = client
        .query(
            "SELECT partition, next_offset FROM geostate_sink_offsets WHERE source = $1 AND topic = $2",
            &[&region, &topic],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| (r.get::<_, i32>(0), r.get::<_, i64>(1) - 1))
        .collect())
}

/// Runs the sink until `stop` turns true: every record of the region's outputs topic
/// once into `geostate_outputs`. Kafka and PostgreSQL errors are retried, never fatal;
/// the topic's partitions are fixed at start.
pub async fn run(config: SinkConfig, mut stop: watch::Receiver<bool>) -> anyhow::Result<Written> {
    let topic = config.kafka.outputs_topic.clone();
    let partitions = log::partitions(&config.kafka, &topic).await?;
    let mut kafka = config.kafka.clone();
    // outputs come a few per window close: an idle sink asks its broker twice a second,
    // not a hundred times (a fetch is answered as soon as a record is there)
    kafka
        .client
        .entry("fetch.wait.max.ms".into())
        .or_insert_with(|| IDLE_FETCH_WAIT_MS.into());
    let spec = log::ConsumerSpec {
        kafka,
        group: format!("geostate-sink-postgres-{}", config.region),
        report_end: false,
        topic: topic.clone(),
        partitions,
        role: "sink",
    };
    let mut written = Written::default();
    let mut reader: Option<Reader> = None;
    while !*stop.borrow() {
        match session(&config, &spec, &mut reader, &mut stop, &mut written).await {
            Ok(()) => break,
            Err(e) => {
                tracing::warn!(error = %e, "writing to PostgreSQL failed; reconnecting and reading on after the offsets PostgreSQL holds");
                tokio::select! {
                    () = tokio::time::sleep(RETRY) => {}
                    _ = stop.changed() => break,
                }
            }
        }
    }
    Ok(written)
}

/// One connection's work: the schema and the region's advisory lock, the offsets
/// PostgreSQL holds, the reader put there, then batches until `stop` (Ok) or an error.
async fn session(
    config: &SinkConfig,
    spec: &log::ConsumerSpec,
    reader: &mut Option<Reader>,
    stop: &mut watch::Receiver<bool>,
    written: &mut Written,
) -> anyhow::Result<()> {
    let mut client = connected(config, &spec.topic).await?;
    let mut applied = stored_offsets(&client, &config.region, &spec.topic).await?;
    tracing::info!(region = %config.region, topic = %spec.topic, ?applied, "writing to PostgreSQL after the offsets it holds");
    match reader {
        Some(r) => r.reposition(&applied).await?,
        None => *reader = Some(Reader::start(spec.clone(), &applied).await?),
    }
    let Some(reader) = reader.as_mut() else {
        return Ok(());
    };
    write_batches(&mut client, config, reader, &mut applied, stop, written).await?;
    Ok(())
}

/// A connection with the schema in place and the region's advisory lock held.
async fn connected(config: &SinkConfig, topic: &str) -> Result<Client, tokio_postgres::Error> {
    let client = connect(
        &config.postgres,
        &format!("geostate-sink {}", config.region),
    )
    .await?;
    client.batch_execute(SCHEMA).await?;
    let lock = format!("geostate-sink/{}/{topic}", config.region);
    client
        .execute("SELECT pg_advisory_lock(hashtext($1))", &[&lock])
        .await?;
    Ok(client)
}

/// Batches into PostgreSQL until `stop` (Ok) or a PostgreSQL error (Err); Kafka errors
/// restart the reader after what was written.
async fn write_batches(
    client: &mut Client,
    config: &SinkConfig,
    reader: &mut Reader,
    applied: &mut BTreeMap<i32, i64>,
    stop: &mut watch::Receiver<bool>,
    written: &mut Written,
) -> Result<(), tokio_postgres::Error> {
    let batching = Batching {
        max: BATCH,
        linger: LINGER,
        idle: None,
    };
    loop {
        let Some(batch) = reader.next_batch(batching, stop).await else {
            return Ok(());
        };
        if !batch.records.is_empty() {
            let rejected = transaction(client, config, &batch.records).await?;
            for record in &batch.records {
                let last = applied.entry(record.partition).or_insert(-1);
                *last = (*last).max(record.offset);
            }
            written.transactions += 1;
            written.records += batch.records.len() as u64;
            written.rejected += rejected;
        }
        if let Some(error) = batch.failed {
            reader.restart(&error, applied).await;
        }
    }
}

/// One PostgreSQL transaction: the rows of `records` (the highest (epoch, version) of
/// each (key, window) among them), the records that are no output, and the offsets
/// after them. The number rejected.
async fn transaction(
    client: &mut Client,
    config: &SinkConfig,
    records: &[Record],
) -> Result<u64, tokio_postgres::Error> {
    let topic = &config.kafka.outputs_topic;
    let mut outputs: BTreeMap<(String, u64), (OutputRecord, &Record)> = BTreeMap::new();
    let mut rejects = Vec::new();
    let mut next: BTreeMap<i32, i64> = BTreeMap::new();
    for record in records {
        let at = next.entry(record.partition).or_insert(0);
        *at = (*at).max(record.offset + 1);
        match parse(record.payload.as_deref()) {
            Ok(output) => {
                let id = output.id();
                if let Some((before, at)) = outputs.get(&id) {
                    tracing::warn!(key = %id.0, window_start_ms = id.1, first = %format!("{}/{}", at.partition, at.offset), again = %format!("{}/{}", record.partition, record.offset), "one window twice in the outputs topic");
                    if before.rank() >= output.rank() {
                        continue;
                    }
                }
                outputs.insert(id, (output, record));
            }
            Err(reason) => {
                tracing::warn!(partition = record.partition, offset = record.offset, %reason, "a record of the outputs topic that is no output; kept in geostate_sink_rejects");
                rejects.push((record, reason));
            }
        }
    }
    let mut columns = Columns::default();
    for (output, record) in outputs.values() {
        columns.push(output, record);
    }
    let tx = client.build_transaction().start().await?;
    tx.execute(
        UPSERT,
        &[
            &columns.key,
            &columns.start,
            &columns.end,
            &columns.value,
            &columns.epoch,
            &columns.version,
            &columns.region,
            &columns.produced_ms,
            &columns.partition,
            &columns.offset,
        ],
    )
    .await?;
    for (record, reason) in &rejects {
        tx.execute(
            REJECT,
            &[
                &config.region,
                topic,
                &record.partition,
                &record.offset,
                reason,
                &record.payload,
            ],
        )
        .await?;
    }
    let (partitions, offsets): (Vec<i32>, Vec<i64>) = next.into_iter().unzip();
    tx.execute(OFFSETS, &[&config.region, topic, &partitions, &offsets])
        .await?;
    tx.commit().await?;
    Ok(rejects.len() as u64)
}

/// The upsert's parameters, one array per column.
#[derive(Default)]
struct Columns {
    key: Vec<String>,
    start: Vec<i64>,
    end: Vec<i64>,
    value: Vec<String>,
    epoch: Vec<i64>,
    version: Vec<i64>,
    region: Vec<String>,
    produced_ms: Vec<i64>,
    partition: Vec<i32>,
    offset: Vec<i64>,
}

impl Columns {
    /// `parse` checked that the times, epoch and version fit int64.
    fn push(&mut self, output: &OutputRecord, record: &Record) {
        self.key.push(output.key.clone());
        self.start.push(output.start_ms as i64);
        self.end.push(output.end_ms as i64);
        self.value.push(output.value_text());
        self.epoch.push(output.epoch as i64);
        self.version.push(output.version as i64);
        self.region.push(output.region.clone());
        self.produced_ms.push(record.timestamp_ms.unwrap_or(0));
        self.partition.push(record.partition);
        self.offset.push(record.offset);
    }
}
