//! Region node benchmark side by side with its peers (`make bench`): prints Markdown,
//! writes `bench/results/node.json`, asserts nothing. Everything is measured in one run, on
//! the same broker and the same pre-loaded topics:
//!
//! 1. ceilings: raw rdkafka produce and consume; the CRDT core applying the events in
//!    memory; consume + apply in memory with nothing made durable;
//! 2. ingest of four datasets (10,000 and 1,000,000 keys, uniform and Zipf 0.99; about
//!    80-byte JSON events) by the geostate node (exactly-once into RocksDB), a Kafka
//!    Streams `groupByKey().count()` at `exactly_once_v2` and at `at_least_once`, and a
//!    consumer applying pipelined `INCRBY`s to Redis with AOF `everysec`: events per second
//!    and per CPU-second, timed from the first progress to the last (start-up excluded);
//! 3. `Update` ack latency, open loop (from each request's scheduled send time), at 25, 50
//!    and 80 % of the node's own maximum, next to Kafka produce → consume at the same rates;
//! 4. `Get` throughput and latency at 1, 10 and 100 streams, without and with ingest load.
//!
//! Where the machine has two cores or more, the system under test (node, Kafka Streams JVM,
//! Redis server and its consumer) runs on core 1 and the brokers and the load generator on
//! core 0 (`taskset`; `scripts/bench.sh` pins the cluster). The peers come from
//! `bench/peers/peers.py install` (`KSTREAMS_CP`, `REDIS_SERVER`); a missing peer is
//! reported as not run.

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use common::{Node, Topics, cluster, create_topic, percentile};
use geostate::config::{Config, RecordFormat};
use geostate::crdt::{Actor, CrdtValue, RegionId};
use geostate::ingest::batch::{BatchContext, Record, apply_batch};
use geostate::ingest::event::{Op, Update};
use geostate::pb;
use geostate::workload::{Rng, Zipf, geohash};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, StreamConsumer};
use rdkafka::message::Message;
use rdkafka::producer::{
    BaseRecord, DefaultProducerContext, FutureRecord, Producer, ThreadedProducer,
};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use serde_json::{Value, json};

const EVENTS: usize = 300_000;
const PARTITIONS: i32 = 4;
const BATCH: usize = 1000;
/// The core the system under test runs on; the rest runs on core 0.
const SUT_CORE: &str = "1";
const LEVELS: [u32; 3] = [25, 50, 80];
const LEVEL_SECONDS: u64 = 5;
const GET_STREAMS: [usize; 3] = [1, 10, 100];
const GET_SECONDS: u64 = 3;

fn main() -> anyhow::Result<()> {
    if let Ok(spec) = std::env::var("GEOSTATE_BENCH_REDIS_CONSUMER") {
        return redis_consumer(&spec);
    }
    common::block_on(run())
}

/// One pre-loaded input topic.
struct Dataset {
    name: String,
    keys: usize,
    topic: Topics,
    /// The records as produced, for the in-memory ceilings.
    records: Vec<(String, Vec<u8>)>,
}

impl Dataset {
    fn generate(keys: usize, zipf: bool, topic: Topics) -> Self {
        let dist = zipf.then(|| Zipf::new(keys, 0.99));
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ keys as u64 ^ zipf as u64);
        let records = (0..EVENTS)
            .map(|i| {
                let k = match &dist {
                    Some(z) => z.sample(rng.unit()),
                    None => rng.below(keys as u64) as usize,
                };
                // requests are rider counts (g_counter), drivers come and go (pn_counter)
                let (ns, add) = if i % 2 == 0 {
                    ("requests", 1)
                } else {
                    ("drivers", rng.below(3) as i64 - 1)
                };
                let key = format!("{ns}/sf/{}/cell-{k:07}", geohash(k % 32_768));
                let payload = format!(
                    r#"{{"key":"{key}","add":{add},"event_time":{}}}"#,
                    1_700_000_000_000u64 + i as u64
                );
                (key, payload.into_bytes())
            })
            .collect();
        let name = format!(
            "{} keys, {}",
            if keys >= 1_000_000 { "1M" } else { "10k" },
            if zipf { "Zipf 0.99" } else { "uniform" }
        );
        Self {
            name,
            keys,
            topic,
            records,
        }
    }

    fn mean_bytes(&self) -> f64 {
        self.records.iter().map(|(_, p)| p.len()).sum::<usize>() as f64 / EVENTS as f64
    }
}

/// A rate measured by following a system's progress: from the first sample that shows
/// progress to the first that shows all of it, so start-up is left out.
#[derive(Clone, Copy, Default)]
struct Rate {
    events_per_second: f64,
    per_cpu_second: f64,
}

impl Rate {
    fn of(events: usize, took: Duration, cpu: f64) -> Self {
        Self {
            events_per_second: events as f64 / took.as_secs_f64().max(1e-9),
            per_cpu_second: events as f64 / cpu.max(1e-9),
        }
    }
    fn json(&self) -> Value {
        json!({
            "events_per_second": self.events_per_second.round(),
            "events_per_cpu_second": self.per_cpu_second.round(),
        })
    }
}

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

/// The machine's online cores (not this process's affinity: `scripts/bench.sh` starts the
/// benchmark on core 0 alone).
fn cores() -> usize {
    std::fs::read_to_string("/proc/cpuinfo")
        .map(|c| c.lines().filter(|l| l.starts_with("processor")).count())
        .unwrap_or(1)
        .max(1)
}

/// (busy, total) jiffies of core `n` so far, from /proc/stat.
fn core_jiffies(n: usize) -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = stat
        .lines()
        .find(|l| l.split_whitespace().next() == Some(&format!("cpu{n}")))
    else {
        return (0, 0);
    };
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    (total - idle, total)
}

/// Whether the system under test gets a core of its own.
fn pinning() -> bool {
    cores() >= 2
        && Command::new("taskset")
            .arg("-V")
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
}

/// Moves every thread of `pid` to `cores` (a `taskset` list).
fn pin(pid: u32, cores: &str) -> anyhow::Result<()> {
    if !pinning() {
        return Ok(());
    }
    let status = Command::new("taskset")
        .args(["-a", "-p", "-c", cores, &pid.to_string()])
        .stdout(Stdio::null())
        .status()?;
    anyhow::ensure!(status.success(), "taskset -p {cores} {pid}: {status}");
    Ok(())
}

/// A command that runs on the system under test's core.
fn on_sut_core(program: &str) -> Command {
    if pinning() {
        let mut c = Command::new("taskset");
        c.args(["-c", SUT_CORE, program]);
        c
    } else {
        Command::new(program)
    }
}

/// How far a system got through a topic of `EVENTS` records.
enum Probe<'a> {
    /// The node's applied offsets (its offsets live in RocksDB, not in Kafka).
    Node(&'a Node),
    /// The offsets a consumer group committed.
    Group(Arc<BaseConsumer>, TopicPartitionList),
}

impl Probe<'_> {
    fn group(kafka: &str, group: &str, topic: &str) -> anyhow::Result<Self> {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", kafka)
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .create()?;
        let mut tpl = TopicPartitionList::new();
        for p in 0..PARTITIONS {
            tpl.add_partition(topic, p);
        }
        Ok(Probe::Group(Arc::new(consumer), tpl))
    }

    async fn progress(&self) -> anyhow::Result<usize> {
        match self {
            Probe::Node(node) => Ok(node
                .status()
                .await?
                .partitions
                .iter()
                .map(|p| (p.applied_offset + 1).max(0) as usize)
                .sum()),
            Probe::Group(consumer, tpl) => {
                let (consumer, tpl) = (consumer.clone(), tpl.clone());
                tokio::task::spawn_blocking(move || {
                    let committed = consumer.committed_offsets(tpl, Duration::from_secs(10))?;
                    Ok(committed
                        .elements()
                        .iter()
                        .map(|e| match e.offset() {
                            Offset::Offset(o) => o.max(0) as usize,
                            _ => 0,
                        })
                        .sum())
                })
                .await?
            }
        }
    }

    /// Follows progress until every record is done; `pids` are the processes whose CPU
    /// time is counted.
    async fn follow(&self, pids: &[u32], deadline: Duration) -> anyhow::Result<Rate> {
        let cpu = || pids.iter().map(|&p| cpu_seconds(p)).sum::<f64>();
        let until = Instant::now() + deadline;
        let mut first: Option<(Instant, usize, f64)> = None;
        loop {
            let done = self.progress().await.unwrap_or(0);
            let now = (Instant::now(), done, cpu());
            if done > 0 && first.is_none() {
                first = Some(now);
            }
            if done >= EVENTS {
                let (t0, done0, cpu0) = first.unwrap_or(now);
                return Ok(Rate::of(done - done0, now.0 - t0, now.2 - cpu0));
            }
            if Instant::now() > until {
                bail!("{done} of {EVENTS} records done within {deadline:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// A child process killed when dropped.
struct Peer(Child);

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The Kafka Streams peer at `guarantee` over `data`'s topic.
async fn kafka_streams(
    kafka: &str,
    data: &Dataset,
    guarantee: &str,
    dir: &Path,
) -> anyhow::Result<Option<Rate>> {
    let Ok(cp) = std::env::var("KSTREAMS_CP") else {
        return Ok(None);
    };
    let app = common::unique(&format!("kstreams-{guarantee}"));
    let output = format!("{app}.counts");
    create_topic(kafka, &output, PARTITIONS).await?;
    let log = std::fs::File::create(dir.join(format!("{app}.log")))?;
    let java = std::env::var("JAVA_HOME").map_or("java".into(), |h| format!("{h}/bin/java"));
    let child = on_sut_core(&java)
        .args(["-Xms512m", "-Xmx1g", "-cp", &cp, "GroupByKeyCount", kafka])
        .args([&data.topic.updates, &output, &app, guarantee])
        .arg(dir.join(&app))
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("starting the Kafka Streams peer")?;
    let peer = Peer(child);
    let probe = Probe::group(kafka, &app, &data.topic.updates)?;
    let rate = probe.follow(&[peer.0.id()], Duration::from_secs(300)).await;
    drop(peer);
    rate.map(Some)
        .with_context(|| format!("Kafka Streams ({guarantee}); see {}", dir.display()))
}

/// The Redis baseline over `data`'s topic: a Redis server with AOF `everysec` and a
/// consumer (this benchmark's binary again) applying pipelined `INCRBY`s, committing the
/// offsets after each pipeline's replies (at least once).
async fn redis(kafka: &str, data: &Dataset, dir: &Path) -> anyhow::Result<Option<Rate>> {
    let Ok(server) = std::env::var("REDIS_SERVER") else {
        return Ok(None);
    };
    let port = common::free_port();
    let log = std::fs::File::create(dir.join("redis.log"))?;
    let redis_dir = dir.join(common::unique("redis"));
    std::fs::create_dir_all(&redis_dir)?;
    let server = Peer(
        on_sut_core(&server)
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args([
                "--appendonly",
                "yes",
                "--appendfsync",
                "everysec",
                "--save",
                "",
            ])
            .arg("--dir")
            .arg(&redis_dir)
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting redis-server")?,
    );
    let addr = format!("127.0.0.1:{port}");
    let until = Instant::now() + Duration::from_secs(10);
    while tokio::net::TcpStream::connect(&addr).await.is_err() {
        if Instant::now() > until {
            bail!("redis-server did not listen on {addr}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let group = common::unique("redis-consumer");
    let spec = format!("{kafka},{},{group},{addr}", data.topic.updates);
    let consumer = Peer(
        on_sut_core(std::env::current_exe()?.to_str().context("exe path")?)
            .env("GEOSTATE_BENCH_REDIS_CONSUMER", spec)
            .stderr(std::fs::File::create(dir.join("redis-consumer.log"))?)
            .spawn()?,
    );
    let probe = Probe::group(kafka, &group, &data.topic.updates)?;
    let rate = probe
        .follow(&[server.0.id(), consumer.0.id()], Duration::from_secs(300))
        .await?;
    // every counter must hold what the events added, or the rate means nothing
    let mut sums: BTreeMap<String, i64> = (data.records.iter().take(2000))
        .map(|(key, _)| (key.clone(), 0))
        .collect();
    for (key, payload) in &data.records {
        if let Some(sum) = sums.get_mut(key)
            && let Ok(Update { op: Op::Add(n), .. }) = Update::decode(RecordFormat::Json, payload)
        {
            *sum += n;
        }
    }
    tokio::task::spawn_blocking(move || check_redis(&addr, &sums)).await??;
    Ok(Some(rate))
}

/// Every counter in `expected` holds its sum in the Redis server at `addr`.
fn check_redis(addr: &str, expected: &BTreeMap<String, i64>) -> anyhow::Result<()> {
    let mut conn = TcpStream::connect(addr)?;
    let mut reader = BufReader::new(conn.try_clone()?);
    for (key, expected) in expected {
        conn.write_all(&resp(&["GET", key]))?;
        let mut header = String::new();
        reader.read_line(&mut header)?;
        let got = if header.starts_with("$-1") {
            0
        } else {
            let mut value = String::new();
            reader.read_line(&mut value)?;
            value.trim().parse::<i64>()?
        };
        anyhow::ensure!(
            got == *expected,
            "redis baseline: {key} is {got}, the events add {expected}"
        );
    }
    Ok(())
}

/// A Redis command in RESP.
fn resp(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
    }
    out
}

/// The Redis baseline's consumer (`GEOSTATE_BENCH_REDIS_CONSUMER=kafka,topic,group,redis`):
/// up to `BATCH` records per pipeline, one `INCRBY` each, offsets committed after the
/// replies. Runs until killed.
fn redis_consumer(spec: &str) -> anyhow::Result<()> {
    let [kafka, topic, group, addr] = spec.split(',').collect::<Vec<_>>()[..] else {
        bail!("GEOSTATE_BENCH_REDIS_CONSUMER={spec}: want kafka,topic,group,redis");
    };
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", kafka)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .create()?;
    consumer.subscribe(&[topic])?;
    let mut conn = TcpStream::connect(addr)?;
    conn.set_nodelay(true)?;
    let mut replies = BufReader::new(conn.try_clone()?);
    let mut line = String::new();
    loop {
        let mut pipeline = Vec::new();
        let mut n = 0;
        while n < BATCH {
            let wait = if n == 0 {
                Duration::from_millis(100)
            } else {
                Duration::ZERO
            };
            let Some(message) = consumer.poll(wait) else {
                break;
            };
            let message = message?;
            let update = Update::decode(RecordFormat::Json, message.payload().unwrap_or(&[]));
            if let Ok(Update {
                key,
                op: Op::Add(add),
                ..
            }) = update
            {
                pipeline.extend(resp(&["INCRBY", &key, &add.to_string()]));
                n += 1;
            }
        }
        if n == 0 {
            continue;
        }
        conn.write_all(&pipeline)?;
        for _ in 0..n {
            line.clear();
            replies.read_line(&mut line)?;
            anyhow::ensure!(line.starts_with(':'), "redis answered {line:?}");
        }
        consumer.commit_consumer_state(CommitMode::Sync)?;
    }
}

/// The geostate node over `data`'s topic, exactly-once into RocksDB.
async fn geostate(kafka: &str, data: &Dataset, dir: &Path) -> anyhow::Result<(Rate, f64)> {
    let mut node = Node::configure(dir, kafka, &data.topic)?;
    let pid = node.start().await?;
    pin(pid, SUT_CORE)?;
    let rate = Probe::Node(&node)
        .follow(&[pid], Duration::from_secs(600))
        .await?;
    let metrics = common::http_get(&node.metrics, "/metrics")?;
    let shipped = metrics
        .lines()
        .find(|l| l.starts_with("geostate_deltas_shipped_total"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0);
    node.kill9();
    Ok((rate, shipped / EVENTS as f64))
}

/// The CRDT core alone: decode, check, apply and delta extraction in batches of `BATCH`,
/// state in a map.
fn apply_in_memory(
    state: &mut BTreeMap<String, CrdtValue>,
    records: Vec<Record>,
    config: &Config,
    actor: &Actor,
) {
    let ctx = BatchContext {
        actor,
        format: RecordFormat::Json,
        namespaces: &config.namespaces,
        limits: &config.ingest,
        origin_time: geostate::clock::HlcTimestamp::new(1, 0),
        lease: None,
        max_clock_offset: config.max_clock_offset,
        grants: None,
    };
    let applied = apply_batch(records, state, &ctx).unwrap_or_else(|e| match e {});
    state.extend(applied.states);
}

fn record(i: usize, payload: &[u8]) -> Record {
    Record {
        partition: (i % PARTITIONS as usize) as i32,
        offset: i as i64,
        timestamp_ms: Some(1_700_000_000_000),
        key: None,
        payload: Some(payload.to_vec()),
    }
}

/// Ceilings on the system under test's core: raw consume, the CRDT core in memory, and
/// consume + apply in memory (nothing durable: the path without exactly-once).
async fn ceilings(kafka: &str, data: &Dataset, config: &Config) -> anyhow::Result<[Rate; 3]> {
    let me = std::process::id();
    pin(me, SUT_CORE)?;
    let actor = Actor::new(RegionId::new("us-east-1")?, 1);
    let result = async {
        let consumer = |label: &str| -> anyhow::Result<StreamConsumer> {
            let consumer: StreamConsumer = ClientConfig::new()
                .set("bootstrap.servers", kafka)
                .set("group.id", common::unique(label))
                .set("enable.auto.commit", "false")
                .set("fetch.wait.max.ms", "10")
                .create()?;
            let mut tpl = TopicPartitionList::new();
            for p in 0..PARTITIONS {
                tpl.add_partition_offset(&data.topic.updates, p, Offset::Beginning)?;
            }
            consumer.assign(&tpl)?;
            Ok(consumer)
        };

        let raw = consumer("bench-raw")?;
        let (started, cpu) = (Instant::now(), cpu_seconds(me));
        for _ in 0..EVENTS {
            raw.recv().await?;
        }
        let raw_rate = Rate::of(EVENTS, started.elapsed(), cpu_seconds(me) - cpu);
        drop(raw);

        let records: Vec<Record> = (data.records.iter().enumerate())
            .map(|(i, (_, p))| record(i, p))
            .collect();
        let mut state = BTreeMap::new();
        let (started, cpu) = (Instant::now(), cpu_seconds(me));
        let mut records = records.into_iter();
        loop {
            let batch: Vec<Record> = records.by_ref().take(BATCH).collect();
            if batch.is_empty() {
                break;
            }
            apply_in_memory(&mut state, batch, config, &actor);
        }
        let core = Rate::of(EVENTS, started.elapsed(), cpu_seconds(me) - cpu);

        let consume = consumer("bench-memory")?;
        let mut state = BTreeMap::new();
        let (started, cpu) = (Instant::now(), cpu_seconds(me));
        let mut done = 0;
        while done < EVENTS {
            let mut batch = Vec::with_capacity(BATCH);
            while batch.len() < BATCH && done + batch.len() < EVENTS {
                batch.push(Record::from_message(&consume.recv().await?));
            }
            done += batch.len();
            apply_in_memory(&mut state, batch, config, &actor);
        }
        let no_durability = Rate::of(EVENTS, started.elapsed(), cpu_seconds(me) - cpu);
        anyhow::Ok([raw_rate, core, no_durability])
    }
    .await;
    pin(me, "0")?;
    result
}

/// Open-loop latencies at `rate`/s for `LEVEL_SECONDS`: geostate `Update` acks.
async fn update_latencies(
    clients: &[pb::state_client::StateClient<tonic::transport::Channel>],
    rate: u64,
) -> anyhow::Result<(Vec<Duration>, usize)> {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..rate * LEVEL_SECONDS {
        let scheduled = schedule(started, rate, i);
        let mut client = clients[i as usize % clients.len()].clone();
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
    Ok((latencies, errors))
}

/// The node's maximum `Update` rate: 64 requests in flight for `LEVEL_SECONDS`.
async fn max_update_rate(
    clients: &[pb::state_client::StateClient<tonic::transport::Channel>],
) -> anyhow::Result<f64> {
    let deadline = Instant::now() + Duration::from_secs(LEVEL_SECONDS);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..64 {
        let mut client = clients[w % clients.len()].clone();
        tasks.push(tokio::spawn(async move {
            let mut acked = 0u64;
            while Instant::now() < deadline {
                let request = pb::UpdateRequest {
                    key: format!("requests/lat{:04}", (w as u64 * 7919 + acked) % 1000),
                    op: Some(pb::update_request::Op::Add(1)),
                    id: String::new(),
                };
                if client.update(request).await.is_ok() {
                    acked += 1;
                }
            }
            acked
        }));
    }
    let mut acked = 0;
    for t in tasks {
        acked += t.await?;
    }
    Ok(acked as f64 / started.elapsed().as_secs_f64())
}

/// When request `i` of an open loop at `rate`/s starting at `started` is due.
fn schedule(started: Instant, rate: u64, i: u64) -> Instant {
    started + Duration::from_micros(i * 1_000_000 / rate)
}

/// Kafka's own floor on the same broker: open-loop produce (idempotent, acks=all) to a
/// fresh topic at `rate`/s, latency to the consumer's receipt.
async fn kafka_latencies(kafka: &str, rate: u64) -> anyhow::Result<Vec<Duration>> {
    let topic = common::unique("bench-floor");
    create_topic(kafka, &topic, 1).await?;
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", kafka)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "0")
        .create()?;
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", kafka)
        .set("group.id", common::unique("bench-floor"))
        .set("enable.auto.commit", "false")
        .set("fetch.wait.max.ms", "10")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&topic, 0, Offset::Beginning)?;
    consumer.assign(&tpl)?;
    // A thread of its own polls the consumer. The clock starts once a warm-up record went
    // through: a new topic's metadata and the first fetch are not part of the floor.
    let total = rate * LEVEL_SECONDS;
    let (warm_tx, warm_rx) = std::sync::mpsc::channel::<()>();
    let (start_tx, start_rx) = std::sync::mpsc::channel::<Instant>();
    let receiver = std::thread::spawn(move || {
        let next = || loop {
            if let Some(message) = consumer.poll(Duration::from_millis(100)) {
                return message.map(|m| m.detach());
            }
        };
        while next()?.payload() != Some(b"warm-up") {}
        let _ = warm_tx.send(());
        let started = start_rx.recv()?;
        let mut latencies = Vec::with_capacity(total as usize);
        while (latencies.len() as u64) < total {
            let message = next()?;
            let i: u64 = std::str::from_utf8(message.payload().unwrap_or(b""))?.parse()?;
            latencies.push(schedule(started, rate, i).elapsed());
        }
        anyhow::Ok(latencies)
    });
    // The producer runs on a thread of its own too, sleeping until each send is due.
    let sender = std::thread::spawn(move || {
        let send = |payload: &str| {
            producer
                .send(BaseRecord::to(&topic).key(payload).payload(payload))
                .map_err(|(e, _)| e)
        };
        send("warm-up")?;
        producer.flush(Duration::from_secs(30))?;
        warm_rx
            .recv_timeout(Duration::from_secs(30))
            .context("the floor's consumer got no warm-up record within 30 s")?;
        let started = Instant::now();
        let _ = start_tx.send(started);
        for i in 0..total {
            let due = schedule(started, rate, i);
            std::thread::sleep(due.saturating_duration_since(Instant::now()));
            send(&i.to_string())?;
        }
        producer.flush(Duration::from_secs(30))?;
        anyhow::Ok(())
    });
    tokio::task::spawn_blocking(move || sender.join())
        .await?
        .map_err(|_| anyhow::anyhow!("the floor's producer thread panicked"))??;
    let mut latencies = tokio::task::spawn_blocking(move || receiver.join())
        .await?
        .map_err(|_| anyhow::anyhow!("the floor's consumer thread panicked"))??;
    latencies.sort();
    Ok(latencies)
}

/// `Get`s of random latency keys on `streams` concurrent streams for `GET_SECONDS`.
async fn gets(node: &Node, streams: usize) -> anyhow::Result<Vec<Duration>> {
    let mut channels = Vec::new();
    for _ in 0..streams.min(10) {
        channels.push(node.state().await?);
    }
    let deadline = Instant::now() + Duration::from_secs(GET_SECONDS);
    let mut tasks = Vec::new();
    for s in 0..streams {
        let mut client = channels[s % channels.len()].clone();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut rng = Rng(0x2545_f491_4f6c_dd1d ^ s as u64);
            while Instant::now() < deadline {
                let key = format!("requests/lat{:04}", rng.below(1000));
                let t = Instant::now();
                if client
                    .get(pb::GetRequest {
                        key,
                        ..Default::default()
                    })
                    .await
                    .is_ok()
                {
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
    Ok(latencies)
}

/// Ingest load for the `Get` runs: `rate` events/s into the node's updates topic until
/// `stop` is set; answers the events produced.
async fn ingest_load(
    kafka: String,
    topic: String,
    rate: u64,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> anyhow::Result<u64> {
    let producer = common::producer(&kafka)?;
    let started = Instant::now();
    let mut rng = Rng(7);
    let mut sent = 0u64;
    let mut deliveries = Vec::new();
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        tokio::time::sleep_until(schedule(started, rate, sent).into()).await;
        let key = format!("requests/load/cell-{:05}", rng.below(10_000));
        let payload = format!(r#"{{"key":"{key}","add":1}}"#);
        deliveries.push(
            producer
                .send_result(FutureRecord::to(&topic).key(&key).payload(&payload))
                .map_err(|(e, _)| e)?,
        );
        sent += 1;
    }
    for d in deliveries {
        d.await?.map_err(|(e, _)| e)?;
    }
    Ok(sent)
}

fn ms_of(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e5).round() / 100.0
}

fn ratio(a: f64, b: f64) -> String {
    format!("{:.2}", a / b.max(1e-9))
}

/// Sections 3 and 4 on a fresh node: `Update` latency at shares of the node's own maximum
/// next to Kafka's floor, then `Get`s without and with `load_rate` events/s of ingest.
async fn latency_and_gets(kafka: &str, work: &Path, load_rate: u64) -> anyhow::Result<Value> {
    // 3. Update latency at shares of the node's own maximum, next to Kafka's floor
    let dir = work.join("latency");
    std::fs::create_dir_all(&dir)?;
    let topics = Topics::create(kafka, "bench-latency", PARTITIONS).await?;
    let mut node = Node::configure(&dir, kafka, &topics)?;
    let pid = node.start().await?;
    pin(pid, SUT_CORE)?;
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(node.state().await?);
    }
    let max = max_update_rate(&clients).await?;
    println!(
        "## Update ack latency, open loop ({LEVEL_SECONDS} s per level; the node's maximum: {max:.0} acknowledged Updates/s with 64 in flight)"
    );
    println!();
    println!(
        "Latency is counted from each request's scheduled send time (no coordinated omission). The Kafka floor: an idempotent acks=all producer (linger 0) to a consumer on the same broker, same rates, same schedule, both clients on the node's core while the node is idle (on core 0 beside the brokers they fell seconds behind)."
    );
    println!();
    println!(
        "| load | rate/s | geostate p50 | p99 | p99.9 | errors | Kafka produce→consume p50 | p99 | p99.9 |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let (mut ours_points, mut floor_points) = (Vec::new(), Vec::new());
    for level in LEVELS {
        let rate = (max * level as f64 / 100.0).max(10.0) as u64;
        let (lat, errors) = update_latencies(&clients, rate).await?;
        // the floor's clients run where the node runs (it is idle meanwhile)
        let me = std::process::id();
        pin(me, SUT_CORE)?;
        let floor = kafka_latencies(kafka, rate).await;
        pin(me, "0")?;
        let floor = floor?;
        let q = |l: &[Duration], p: f64| ms_of(percentile(l, p));
        println!(
            "| {level} % | {rate} | {:.2} ms | {:.2} ms | {:.2} ms | {errors} | {:.2} ms | {:.2} ms | {:.2} ms |",
            q(&lat, 0.5),
            q(&lat, 0.99),
            q(&lat, 0.999),
            q(&floor, 0.5),
            q(&floor, 0.99),
            q(&floor, 0.999)
        );
        ours_points.push(
            json!({"load_percent": level, "rate": rate, "errors": errors,
            "p50_ms": q(&lat, 0.5), "p99_ms": q(&lat, 0.99), "p99_9_ms": q(&lat, 0.999)}),
        );
        floor_points.push(json!({"load_percent": level, "rate": rate,
            "p50_ms": q(&floor, 0.5), "p99_ms": q(&floor, 0.99), "p99_9_ms": q(&floor, 0.999)}));
    }
    println!();

    // 4. Get at 1/10/100 streams, without and with ingest load
    println!(
        "## Get ({GET_SECONDS} s per run; keys written by the latency runs; ingest load: {load_rate} events/s into the node's updates topic, a quarter of its measured ingest rate)"
    );
    println!();
    println!(
        "| streams | ingest load | reads/s | p50 | p99 | node CPU | core 0 busy (brokers, clients, load) |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|");
    let mut get_json = Vec::new();
    for loaded in [false, true] {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let load = loaded.then(|| {
            tokio::spawn(ingest_load(
                kafka.to_owned(),
                topics.updates.clone(),
                load_rate,
                stop.clone(),
            ))
        });
        for streams in GET_STREAMS {
            let (started, cpu, core0) = (Instant::now(), cpu_seconds(pid), core_jiffies(0));
            let lat = gets(&node, streams).await?;
            let busy = (cpu_seconds(pid) - cpu) / started.elapsed().as_secs_f64();
            let core0_after = core_jiffies(0);
            let core0 = (core0_after.0 - core0.0) as f64 / (core0_after.1 - core0.1).max(1) as f64;
            let rate = lat.len() as f64 / GET_SECONDS as f64;
            println!(
                "| {streams} | {} | {rate:.0} | {:.2} ms | {:.2} ms | {:.0} % | {:.0} % |",
                if loaded { "yes" } else { "no" },
                ms_of(percentile(&lat, 0.5)),
                ms_of(percentile(&lat, 0.99)),
                busy * 100.0,
                core0 * 100.0
            );
            get_json.push(
                json!({"streams": streams, "ingest_load": loaded, "reads_per_second": rate.round(),
                "p50_ms": ms_of(percentile(&lat, 0.5)), "p99_ms": ms_of(percentile(&lat, 0.99)),
                "node_cpu_share": (busy * 100.0).round() / 100.0,
                "core0_busy_share": (core0 * 100.0).round() / 100.0}),
            );
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(load) = load {
            load.await??;
        }
    }
    node.kill9();

    Ok(json!({
        "latency": [
            {"name": "geostate Update ack", "max_rate": max.round(), "points": ours_points},
            {"name": "Kafka produce→consume", "points": floor_points},
        ],
        "get": get_json,
    }))
}

async fn run() -> anyhow::Result<()> {
    let cluster = cluster()?;
    let kafka = cluster.regions["us-east-1"].kafka.clone();
    let config = Config::load(
        &Path::new(&std::env::var("CARGO_MANIFEST_DIR")?).join("regions/us-east-1.toml"),
    )?;
    let work = tempfile::tempdir()?;
    let cores = cores();
    let pinned = pinning();

    println!("# geostate node benchmark, side by side with its peers");
    println!();
    println!(
        "machine: {cores} cores. {}",
        if pinned {
            "The system under test (geostate node, Kafka Streams JVM, Redis server and its consumer, and the in-process ceilings) runs on core 1; the Kafka brokers, MirrorMaker 2 and the load generator on core 0 (taskset)."
        } else {
            "Not pinned (one core, or no taskset): everything shares the cores."
        }
    );
    println!();

    if std::env::var("GEOSTATE_BENCH_ONLY").as_deref() == Ok("latency") {
        // sections 3 and 4 alone, for working on them; writes no JSON
        latency_and_gets(&kafka, work.path(), 20_000).await?;
        return Ok(());
    }

    // the datasets, produced once
    let producer = common::producer(&kafka)?;
    let mut datasets = Vec::new();
    let mut produce = Duration::ZERO;
    for (keys, zipf) in [
        (10_000, false),
        (10_000, true),
        (1_000_000, false),
        (1_000_000, true),
    ] {
        let topic = Topics::create(&kafka, "bench", PARTITIONS).await?;
        let data = Dataset::generate(keys, zipf, topic);
        let started = Instant::now();
        common::produce_all(&producer, &data.topic.updates, &data.records).await?;
        produce += started.elapsed();
        datasets.push(data);
    }
    let produce_rate = (EVENTS * datasets.len()) as f64 / produce.as_secs_f64();

    // 1. ceilings, per dataset
    println!(
        "## Ceilings ({EVENTS} events per dataset, {PARTITIONS} partitions, {:.0} bytes per event)",
        datasets.iter().map(Dataset::mean_bytes).sum::<f64>() / datasets.len() as f64
    );
    println!();
    println!(
        "rdkafka produce (idempotent, acks=all, from core 0): {produce_rate:.0} events/s. The rest runs on the system under test's core; events/s (events per CPU-second):"
    );
    println!();
    println!(
        "| dataset | rdkafka consume, raw | CRDT core in memory (decode, check, apply, delta; no Kafka) | consume + apply in memory (nothing durable, no offsets) |"
    );
    println!("|---|---:|---:|---:|");
    let mut ceilings_json = Vec::new();
    let mut in_memory = Vec::new();
    for data in &datasets {
        let [raw, core, no_durability] = ceilings(&kafka, data, &config).await?;
        let cell = |r: Rate| format!("{:.0} ({:.0})", r.events_per_second, r.per_cpu_second);
        println!(
            "| {} | {} | {} | {} |",
            data.name,
            cell(raw),
            cell(core),
            cell(no_durability)
        );
        ceilings_json.push(json!({
            "dataset": data.name,
            "raw_consume": raw.json(),
            "crdt_core_in_memory": core.json(),
            "consume_and_apply_in_memory": no_durability.json(),
        }));
        in_memory.push(no_durability);
    }
    println!();

    // 2. ingest, each system over each dataset
    let mut ingest_json = Vec::new();
    println!("## Ingest of one pre-loaded topic ({EVENTS} events, {PARTITIONS} partitions)");
    println!();
    println!(
        "Timed from the first progress the system shows (applied offsets for geostate, committed offsets for the peers, polled every 50 ms) to the last, so start-up is left out. Kafka Streams: 1 stream thread, `commit.interval.ms` 100 for both guarantees, default RocksDB store and record cache, counts written to an output topic; it counts records without parsing them. Redis 7 baseline: one consumer, pipelines of up to {BATCH} `INCRBY`s, offsets committed after the replies (at least once), AOF `everysec`; every counter is checked afterwards."
    );
    println!();
    println!(
        "| dataset | system | events/s | events per CPU-second | ratio to geostate (events/s) |"
    );
    println!("|---|---|---:|---:|---:|");
    let mut headline = Vec::new();
    for data in &datasets {
        let dir = work.path().join(data.name.replace([' ', ',', '.'], "-"));
        std::fs::create_dir_all(&dir)?;
        let (ours, deltas_per_event) = geostate(&kafka, data, &dir).await?;
        let eos = kafka_streams(&kafka, data, "exactly_once_v2", &dir).await?;
        let alos = kafka_streams(&kafka, data, "at_least_once", &dir).await?;
        let redis = redis(&kafka, data, &dir).await?;
        let mut systems = vec![json!({
            "system": "geostate (exactly-once, RocksDB)",
            "deltas_shipped_per_event": (deltas_per_event * 1000.0).round() / 1000.0,
        })];
        systems[0]
            .as_object_mut()
            .unwrap()
            .extend(ours.json().as_object().unwrap().clone());
        let row = |name: &str, r: Option<Rate>| match r {
            Some(r) => println!(
                "| {} | {name} | {:.0} | {:.0} | {} |",
                data.name,
                r.events_per_second,
                r.per_cpu_second,
                ratio(r.events_per_second, ours.events_per_second)
            ),
            None => println!("| {} | {name} | not run | | |", data.name),
        };
        row("geostate (exactly-once, RocksDB)", Some(ours));
        for (name, r) in [
            ("Kafka Streams exactly_once_v2", eos),
            ("Kafka Streams at_least_once", alos),
            ("Redis INCRBY, AOF everysec", redis),
        ] {
            row(name, r);
            if let Some(r) = r {
                let mut v = r.json();
                v["system"] = json!(name);
                systems.push(v);
            }
        }
        headline.push((data.name.clone(), ours, eos, alos, redis));
        ingest_json.push(json!({
            "name": data.name,
            "keys": data.keys,
            "events": EVENTS,
            "bytes_per_event": data.mean_bytes().round(),
            "systems": systems,
        }));
    }
    println!();
    println!(
        "Ratios and exactly-once taxes (tax = 1 − exactly-once rate ÷ the same work without it):"
    );
    println!();
    println!(
        "| dataset | geostate ÷ Kafka Streams EOS | geostate ÷ Kafka Streams ALOS | geostate ÷ Redis | Kafka Streams EOS tax (vs ALOS) | geostate tax (vs consume + apply in memory) |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    let mut ratios_json = Vec::new();
    for ((name, ours, eos, alos, redis), no_durability) in headline.iter().zip(&in_memory) {
        let over = |r: &Option<Rate>| {
            r.map_or("—".into(), |r| {
                ratio(ours.events_per_second, r.events_per_second)
            })
        };
        let ks_tax = match (eos, alos) {
            (Some(e), Some(a)) => format!(
                "{:.0} %",
                100.0 * (1.0 - e.events_per_second / a.events_per_second)
            ),
            _ => "—".into(),
        };
        let our_tax = 100.0 * (1.0 - ours.events_per_second / no_durability.events_per_second);
        println!(
            "| {name} | {} | {} | {} | {ks_tax} | {our_tax:.0} % |",
            over(eos),
            over(alos),
            over(redis)
        );
        ratios_json.push(json!({
            "dataset": name,
            "geostate_over_kstreams_eos": eos.map(|r| ours.events_per_second / r.events_per_second),
            "geostate_over_kstreams_alos": alos.map(|r| ours.events_per_second / r.events_per_second),
            "geostate_over_redis": redis.map(|r| ours.events_per_second / r.events_per_second),
            "kstreams_eos_tax": match (eos, alos) {
                (Some(e), Some(a)) => Some(1.0 - e.events_per_second / a.events_per_second),
                _ => None,
            },
            "geostate_eos_tax": 1.0 - ours.events_per_second / no_durability.events_per_second,
        }));
    }
    println!();

    // 3 and 4
    let load_rate = (headline[0].1.events_per_second / 4.0).max(1000.0) as u64;
    let served = latency_and_gets(&kafka, work.path(), load_rate).await?;

    let report = json!({
        "machine": {"cores": cores, "pinned": pinned, "sut_core": if pinned { Some(SUT_CORE) } else { None }},
        "produce_events_per_second": produce_rate.round(),
        "ceilings": ceilings_json,
        "ingest": ingest_json,
        "ratios": ratios_json,
        "latency": served["latency"],
        "get": served["get"],
    });
    std::fs::create_dir_all("bench/results")?;
    std::fs::write(
        "bench/results/node.json",
        serde_json::to_string_pretty(&report)?,
    )?;
    Ok(())
}
