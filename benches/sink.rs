//! The PostgreSQL sink (`cargo bench --bench sink`, part of `make bench`): prints
//! Markdown, asserts nothing.
//!
//! - **Throughput**: a private outputs topic (4 partitions) is loaded with 200,000 output
//!   records (final windows of 20,000 keys × 10 minutes), then `geostate sink postgres`
//!   of this build writes them into a fresh database of the cluster's PostgreSQL; rows per
//!   second from the first row's commit to the last's.
//! - **Latency at half that rate**: records produced at half the measured maximum for
//!   20 s into a second topic while the sink runs; the time from each record's Kafka
//!   timestamp (its producer's clock) to its row's commit (`written_at - produced_at`),
//!   next to the Kafka floor of the same records: a `read_committed` consumer's receipt
//!   time less the same timestamp.
//!
//! What precedes an output record (a window closing: its end plus the allowed lateness
//! and the watermark's bound) is the window's definition, not the sink's; `make demo`
//! prints both parts for the surge workload.

#[path = "../tests/common/mod.rs"]
mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use common::{Topics, cluster, percentile, produce_all, producer, unique};
use rdkafka::Message;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::producer::FutureRecord;

const PARTITIONS: i32 = 4;
const KEYS: usize = 20_000;
const WINDOWS: u64 = 10;
const LATENCY_SECONDS: u64 = 20;
const MIN: u64 = 60_000;

fn main() -> anyhow::Result<()> {
    common::block_on(run())
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// One output record, as a node produces a final window.
fn output(key: &str, start: u64, value: u64) -> (String, Vec<u8>) {
    let json = format!(
        r#"{{"key":"{key}","start_ms":{start},"end_ms":{},"value":{value},"region":"us-east-1"}}"#,
        start + MIN
    );
    (format!("{key}@{start}"), json.into_bytes())
}

struct Sink(Child);

impl Sink {
    fn start(kafka: &str, topic: &str, url: &str, log: &std::path::Path) -> anyhow::Result<Self> {
        let log = std::fs::File::create(log)?;
        Ok(Sink(
            Command::new(env!("CARGO_BIN_EXE_geostate"))
                .args(["sink", "postgres", "--config"])
                .arg(common::repo_file("regions/us-east-1.toml"))
                .args(["--set", &format!("kafka.bootstrap={kafka:?}")])
                .args(["--set", &format!("kafka.outputs-topic={topic:?}")])
                .args(["--set", "lease="])
                .args(["--postgres", url])
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()?,
        ))
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn database(admin_url: &str, port: u16) -> anyhow::Result<(String, tokio_postgres::Client)> {
    let name = unique("bench_sink")
        .to_lowercase()
        .replace(|c: char| !c.is_ascii_alphanumeric(), "_");
    let admin = geostate::sink::postgres::connect(admin_url, "bench").await?;
    admin
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await?;
    let url = format!("host=127.0.0.1 port={port} user=geostate dbname={name}");
    let client = geostate::sink::postgres::connect(&url, "bench").await?;
    Ok((url, client))
}

/// Rows in the table, 0 before the sink created it.
async fn rows(db: &tokio_postgres::Client) -> i64 {
    db.query_one("SELECT count(*) FROM geostate_outputs", &[])
        .await
        .map_or(0, |r| r.get(0))
}

async fn run() -> anyhow::Result<()> {
    let cluster = cluster()?;
    let pg = cluster
        .postgres
        .clone()
        .context("the cluster runs no PostgreSQL")?;
    let kafka = cluster.regions["us-east-1"].kafka.clone();
    let dir = tempfile::tempdir()?;
    let producer = producer(&kafka)?;

    // throughput: a loaded topic, then the sink from its start
    let topics = Topics::create(&kafka, "bench-sink", PARTITIONS).await?;
    let mut records = Vec::with_capacity(KEYS * WINDOWS as usize);
    for w in 0..WINDOWS {
        for k in 0..KEYS {
            records.push(output(&format!("requests/b{k:05}"), w * MIN, k as u64 + w));
        }
    }
    produce_all(&producer, &topics.outputs, &records).await?;
    let (url, db) = database(&pg.url, pg.port).await?;
    let sink = Sink::start(&kafka, &topics.outputs, &url, &dir.path().join("sink.log"))?;
    let until = Instant::now() + Duration::from_secs(600);
    while rows(&db).await < records.len() as i64 {
        anyhow::ensure!(
            Instant::now() < until,
            "the sink did not write every record in 600 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(sink);
    let span: f64 = db
        .query_one(
            "SELECT extract(epoch FROM max(written_at) - min(written_at))::float8 FROM geostate_outputs",
            &[],
        )
        .await?
        .get(0);
    let max_rate = records.len() as f64 / span.max(1e-3);

    // latency at half the maximum, next to the Kafka floor of the same records
    let rate = (max_rate / 2.0).max(1.0);
    let topics = Topics::create(&kafka, "bench-sink-latency", PARTITIONS).await?;
    let (url, db) = database(&pg.url, pg.port).await?;
    let sink = Sink::start(&kafka, &topics.outputs, &url, &dir.path().join("sink2.log"))?;
    let consumer: StreamConsumer = geostate_jepsen::control::kafka_config(&kafka)
        .set("group.id", unique("bench-sink-floor"))
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed")
        .set("fetch.wait.max.ms", "10")
        .create()?;
    consumer.subscribe(&[topics.outputs.as_str()])?;
    let total = (rate * LATENCY_SECONDS as f64) as usize;
    let floor = tokio::spawn(async move {
        let mut lags = Vec::with_capacity(total);
        while lags.len() < total {
            let Ok(Ok(message)) =
                tokio::time::timeout(Duration::from_secs(60), consumer.recv()).await
            else {
                break;
            };
            if let Some(t) = message.timestamp().to_millis() {
                lags.push(Duration::from_millis((now_ms() - t).max(0) as u64));
            }
        }
        lags
    });
    // wait for the sink's tables before the clock starts
    while db
        .query_one("SELECT to_regclass('geostate_outputs') IS NOT NULL", &[])
        .await?
        .get::<_, bool>(0)
        .eq(&false)
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let started = Instant::now();
    let tick = Duration::from_millis(10);
    let per_tick = rate * tick.as_secs_f64();
    let mut sent = 0usize;
    let mut pending = Vec::with_capacity(total);
    let mut interval = tokio::time::interval(tick);
    while sent < total {
        interval.tick().await;
        let due =
            ((started.elapsed().as_secs_f64() / tick.as_secs_f64() + 1.0) * per_tick) as usize;
        while sent < due.min(total) {
            let (key, payload) = output(&format!("requests/l{sent:07}"), 0, 1);
            let record = FutureRecord::to(&topics.outputs)
                .key(&key)
                .payload(&payload)
                .timestamp(now_ms());
            pending.push(producer.send_result(record).map_err(|(e, _)| e)?);
            sent += 1;
        }
    }
    for delivery in pending {
        delivery.await?.map_err(|(e, _)| e)?;
    }
    let until = Instant::now() + Duration::from_secs(120);
    while rows(&db).await < total as i64 {
        anyhow::ensure!(
            Instant::now() < until,
            "the sink did not keep up within 120 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(sink);
    let sink_lag = db
        .query_one(
            "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY ms), percentile_cont(0.99) WITHIN GROUP (ORDER BY ms)
             FROM (SELECT extract(epoch FROM written_at - produced_at)::float8 * 1000 AS ms FROM geostate_outputs) AS r",
            &[],
        )
        .await?;
    let mut floor = floor.await?;
    floor.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;

    println!("## PostgreSQL sink (`cargo bench --bench sink`)");
    println!();
    println!(
        "`geostate sink postgres` (release build) from a private outputs topic ({PARTITIONS} partitions) into a fresh database of the cluster's PostgreSQL (Debian's, fsync on); each batch of up to 2,000 records is one PostgreSQL transaction with its offsets. Latency: records produced at half the measured maximum for {LATENCY_SECONDS} s, from each record's Kafka timestamp to its row's commit, next to a `read_committed` consumer of the same records."
    );
    println!();
    println!("| figure | value |");
    println!("|---|---:|");
    println!(
        "| outputs per second into PostgreSQL ({} records, first row to last) | {:.0} |",
        records.len(),
        max_rate
    );
    println!("| latency run: rate, records | {rate:.0}/s, {total} |");
    println!(
        "| output record to its row, p50 / p99 | {:.1} ms / {:.1} ms |",
        sink_lag.get::<_, f64>(0),
        sink_lag.get::<_, f64>(1)
    );
    println!(
        "| Kafka floor: output record to a `read_committed` consumer, p50 / p99 ({} records) | {:.1} ms / {:.1} ms |",
        floor.len(),
        ms(percentile(&floor, 0.5)),
        ms(percentile(&floor, 0.99))
    );
    Ok(())
}
