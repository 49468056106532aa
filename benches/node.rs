//! Region node benchmark on the local cluster (`make bench`): prints figures, asserts
//! nothing. Measured in one run on the same broker and topic:
//!
//! 1. raw rdkafka produce and consume rates of a pre-loaded topic (the ceiling);
//! 2. the node's exactly-once ingest of the same topic: events per second and per
//!    CPU-second of the node process;
//! 3. `Update` ack latency at a fixed open-loop rate (latency counted from each request's
//!    scheduled send time, so a slow answer cannot hide the requests queued behind it);
//! 4. `Get` throughput and latency with 10 concurrent streams.

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::{Node, Topics, cluster, ms, percentile};
use geostate::pb;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

const EVENTS: usize = 500_000;
const KEYS: u64 = 10_000;
const PARTITIONS: i32 = 4;
const UPDATE_RATE: u64 = 200;
const UPDATE_SECONDS: u64 = 10;
const GET_STREAMS: usize = 10;
const GET_SECONDS: u64 = 5;

/// CPU seconds (user + system) a process has used, from /proc.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0 // utime, stime; USER_HZ is 100 on Linux
}

fn main() -> anyhow::Result<()> {
    common::block_on(run())
}

async fn run() -> anyhow::Result<()> {
    let cluster = cluster()?;
    let kafka = cluster.regions["us-east-1"].kafka.clone();
    let topics = Topics::create(&kafka, "bench", PARTITIONS).await?;
    println!("# geostate node benchmark");
    println!();
    println!(
        "machine: {} cores; {EVENTS} JSON events over {KEYS} keys, {PARTITIONS} partitions",
        std::thread::available_parallelism()?.get()
    );
    println!();

    // 1. pre-load the topic: the raw produce rate
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &kafka)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "10")
        .set("batch.size", "1000000")
        .set("queue.buffering.max.messages", "2000000")
        .create()?;
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let started = Instant::now();
    let mut pending = Vec::with_capacity(EVENTS);
    let mut bytes = 0usize;
    for i in 0..EVENTS {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let key = if i % 2 == 0 {
            format!("requests/g{:05}", x % KEYS)
        } else {
            format!("drivers/g{:05}", x % KEYS)
        };
        let add = if i % 2 == 0 { 1 } else { (x % 3) as i64 - 1 };
        let payload = format!(
            r#"{{"key":"{key}","add":{add},"event_time":{}}}"#,
            1_700_000_000_000u64 + i as u64
        );
        bytes += payload.len();
        pending.push(
            producer
                .send_result(
                    FutureRecord::to(&topics.updates)
                        .key(&key)
                        .payload(&payload),
                )
                .map_err(|(e, _)| e)?,
        );
    }
    for p in pending {
        p.await?.map_err(|(e, _)| e)?;
    }
    let produce = started.elapsed();

    // 2. raw consume of the same topic
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", &kafka)
        .set("group.id", common::unique("bench-raw"))
        .set("enable.auto.commit", "false")
        .set("fetch.wait.max.ms", "10")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition_offset(&topics.updates, p, Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;
    let started = Instant::now();
    let mut consumed = 0;
    while consumed < EVENTS {
        consumer.recv().await?;
        consumed += 1;
    }
    let raw_consume = started.elapsed();
    drop(consumer);

    // 3. the node ingesting the same topic, exactly once, into RocksDB
    let dir = tempfile::tempdir()?;
    let mut node = Node::configure(dir.path(), &kafka, &topics)?;
    let started = Instant::now();
    let pid = node.start().await?;
    node.caught_up(Duration::from_secs(600)).await?;
    let ingest = started.elapsed();
    let ingest_cpu = cpu_seconds(pid);
    let metrics = common::http_get(&node.metrics, "/metrics")?;
    let shipped = metrics
        .lines()
        .find(|l| l.starts_with("geostate_deltas_shipped_total"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0);

    let rate = |d: Duration| EVENTS as f64 / d.as_secs_f64();
    println!(
        "## Ingest ({:.0} bytes per event)",
        bytes as f64 / EVENTS as f64
    );
    println!();
    println!("| path | events/s | events per CPU-second | ratio to raw consume |");
    println!("|---|---:|---:|---:|");
    println!(
        "| rdkafka produce (idempotent, acks=all) | {:.0} | | |",
        rate(produce)
    );
    println!(
        "| rdkafka consume (raw, no processing) | {:.0} | | 1.00 |",
        rate(raw_consume)
    );
    println!(
        "| geostate node ingest (exactly-once, RocksDB) | {:.0} | {:.0} | {:.2} |",
        rate(ingest),
        EVENTS as f64 / ingest_cpu.max(1e-9),
        rate(ingest) / rate(raw_consume)
    );
    println!();
    println!(
        "During the ingest the node shipped {shipped:.0} deltas ({:.3} per event) in its replication transactions.",
        shipped / EVENTS as f64
    );
    println!();

    // 4. Update ack latency, open loop
    let state = node.state().await?;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..UPDATE_RATE * UPDATE_SECONDS {
        let scheduled = started + Duration::from_micros(i * 1_000_000 / UPDATE_RATE);
        let mut client = state.clone();
        tokio::time::sleep_until(scheduled.into()).await;
        tasks.push(tokio::spawn(async move {
            let request = pb::UpdateRequest {
                key: format!("requests/lat{:04}", i % 1000),
                op: Some(pb::update_request::Op::Add(1)),
                id: String::new(),
            };
            client.update(request).await.map(|_| scheduled.elapsed())
        }));
    }
    let mut latencies = Vec::new();
    let mut errors = 0;
    for t in tasks {
        match t.await? {
            Ok(d) => latencies.push(d),
            Err(_) => errors += 1,
        }
    }
    latencies.sort();
    println!("## Update ack latency (open loop, {UPDATE_RATE}/s for {UPDATE_SECONDS} s)");
    println!();
    println!("| p50 | p99 | max | errors |");
    println!("|---:|---:|---:|---:|");
    println!(
        "| {} | {} | {} | {errors} |",
        ms(percentile(&latencies, 0.5)),
        ms(percentile(&latencies, 0.99)),
        ms(latencies.last().copied().unwrap_or_default())
    );
    println!();

    // 5. Get throughput with concurrent streams
    let deadline = Instant::now() + Duration::from_secs(GET_SECONDS);
    let mut tasks = Vec::new();
    for s in 0..GET_STREAMS {
        let mut client = node.state().await?;
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut i = s as u64;
            while Instant::now() < deadline {
                i = i
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let key = format!("requests/g{:05}", (i >> 33) % KEYS);
                let t = Instant::now();
                if client.get(pb::GetRequest { key }).await.is_ok() {
                    latencies.push(t.elapsed());
                }
            }
            latencies
        }));
    }
    let mut latencies = Vec::new();
    for t in tasks {
        latencies.extend(t.await?);
    }
    latencies.sort();
    println!("## Get ({GET_STREAMS} concurrent streams, {GET_SECONDS} s, no ingest load)");
    println!();
    println!("| reads/s | p50 | p99 |");
    println!("|---:|---:|---:|");
    println!(
        "| {:.0} | {} | {} |",
        latencies.len() as f64 / GET_SECONDS as f64,
        ms(percentile(&latencies, 0.5)),
        ms(percentile(&latencies, 0.99))
    );
    node.kill9();
    Ok(())
}
