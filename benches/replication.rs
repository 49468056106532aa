//! Replication benchmark (`make bench`): prints figures, asserts nothing.
//!
//! 1. Replication lag at a fixed open-loop rate: from a write's `Update` ack in one region
//!    (it is applied there) to the moment a `Watch` on the other region delivers it, once
//!    through the direct switch (the remote reads the origin's deltas topic) and once
//!    through MirrorMaker 2 (the nodes of the cluster the bench runs against).
//! 2. Coalescing under Zipf 0.99 keys: deltas shipped per event and bytes shipped per byte
//!    ingested, for a pre-loaded backlog (large batches), and for a live stream once per
//!    shipping setting (`replication.ship-every`, `replication.compression`) with the
//!    bytes stored in the deltas topic and the shipping lag of every delta: the trade
//!    between bytes and lag.

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "shared/flow.rs"]
mod flow;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use common::{Node, Topics, cluster, http_get, ms, percentile, produce_all, producer, unique};
use geostate::pb::state_client::StateClient;
use geostate::workload::{Rng, Zipf};
use tonic::transport::Channel;

const LAG_RATE: u64 = 100;
const LAG_SECONDS: u64 = 15;
const KEYS: usize = 10_000;
const BACKLOG_EVENTS: usize = 200_000;
const LIVE_RATE: u64 = 2_000;
const LIVE_SECONDS: u64 = 10;

fn main() -> anyhow::Result<()> {
    common::block_on(run())
}

async fn run() -> anyhow::Result<()> {
    let cluster = cluster()?;
    let kafka = cluster.regions["us-east-1"].kafka.clone();
    println!("# geostate replication benchmark");
    println!();
    println!(
        "machine: {} cores; brokers, MirrorMaker 2, nodes and load generator share them",
        std::thread::available_parallelism()?.get()
    );
    println!();

    // 1. lag, direct switch: two nodes of this build on private topics
    let (ta, tb) = (
        Topics::create(&kafka, "lag-a", 4).await?,
        Topics::create(&kafka, "lag-b", 4).await?,
    );
    let (dir_a, dir_b) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let (mut a, mut b) = Node::pair(&kafka, (&ta, &tb), (dir_a.path(), dir_b.path()))?;
    a.start().await?;
    b.start().await?;
    let direct = lag(a.state().await?, b.state().await?).await?;
    a.kill9();
    b.kill9();

    // through MirrorMaker 2: the cluster's own nodes, one per Kafka cluster
    let grpc = |region: &str| -> anyhow::Result<String> {
        Ok(format!(
            "http://{}",
            cluster.regions[region]
                .grpc
                .clone()
                .context("the cluster runs no node")?
        ))
    };
    let mirrored = lag(
        StateClient::connect(grpc("us-east-1")?).await?,
        StateClient::connect(grpc("eu-west-1")?).await?,
    )
    .await?;
    println!(
        "## Replication lag ({LAG_RATE} writes/s for {LAG_SECONDS} s, open loop; one new key per write)"
    );
    println!();
    println!(
        "Measured from the `Update` ack in us-east-1 (applied there) to the `Watch` event in eu-west-1."
    );
    println!();
    println!("| path | writes | p50 | p99 | max |");
    println!("|---|---:|---:|---:|---:|");
    for (name, l) in [
        (
            "direct switch (remote reads the origin's deltas topic)",
            &direct,
        ),
        (
            "MirrorMaker 2 (geostate.deltas → us-east-1.geostate.deltas)",
            &mirrored,
        ),
    ] {
        println!("| {name} | {} |", flow::figures(l));
    }
    println!();

    // 2. coalescing under Zipf keys
    println!("## Coalescing (Zipf 0.99 over {KEYS} keys, `g_counter` and `pn_counter`)");
    println!();
    println!(
        "| load | events | deltas shipped | deltas per event | bytes shipped ÷ bytes ingested |"
    );
    println!("|---|---:|---:|---:|---:|");
    let zipf = Zipf::new(KEYS, 0.99);
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let mut events = |n: usize| -> Vec<(String, Vec<u8>)> {
        (0..n)
            .map(|i| {
                let k = zipf.sample(rng.unit());
                let (key, add) = if i % 2 == 0 {
                    (format!("trips/z{k:05}"), 1)
                } else {
                    (format!("drivers/z{k:05}"), (rng.next_u64() % 3) as i64 - 1)
                };
                let payload = format!(r#"{{"key":"{key}","add":{add}}}"#).into_bytes();
                (key, payload)
            })
            .collect()
    };

    // a backlog ingested at full speed
    let backlog = events(BACKLOG_EVENTS);
    let topics = Topics::create(&kafka, "coalesce-backlog", 4).await?;
    let producer = producer(&kafka)?;
    produce_all(&producer, &topics.updates, &backlog).await?;
    let (shipped, bytes) = ship_counts(&kafka, &topics).await?;
    let ingested: usize = backlog.iter().map(|(_, p)| p.len()).sum();
    println!(
        "| backlog ingested at full speed | {} | {shipped} | {:.3} | {:.3} |",
        backlog.len(),
        shipped as f64 / backlog.len() as f64,
        bytes as f64 / ingested as f64
    );

    println!();

    // a live stream at a fixed rate, once per shipping setting: the curve
    println!(
        "### Live stream, {LIVE_RATE} events/s for {LIVE_SECONDS} s, by shipping setting (`replication.ship-every`, `replication.compression`)"
    );
    println!();
    println!(
        "Shipping lag: from the origin's apply (the delta's HLC) to the delta read committed from the deltas topic, every delta. Bytes stored: the deltas topic's log segments (deltas, resume points, heartbeats, transaction markers, as the producer compressed them: what a remote region fetches) ÷ the updates topic's."
    );
    println!();
    println!(
        "| ship-every | compression | deltas per event | payload bytes ÷ ingested | bytes stored ÷ updates stored | shipping lag p50 | p99 | max |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    let live = events((LIVE_RATE * LIVE_SECONDS) as usize);
    let ingested: usize = live.iter().map(|(_, p)| p.len()).sum();
    let log_dir = common::run_dir()?.join("kafka/us-east-1/data");
    for (every, compression) in SHIPPING {
        let topics = Topics::create(&kafka, "coalesce-live", 4).await?;
        let dir = tempfile::tempdir()?;
        let mut node = Node::configure(dir.path(), &kafka, &topics)?;
        node.set("replication.ship-every", &format!("{every:?}"));
        node.set("replication.compression", &format!("{compression:?}"));
        node.start().await?;
        let lags = shipping_lags(&kafka, &topics.deltas);
        let started = Instant::now();
        for (i, chunk) in live.chunks((LIVE_RATE / 100) as usize).enumerate() {
            tokio::time::sleep_until((started + Duration::from_millis(10 * i as u64)).into()).await;
            produce_all(&producer, &topics.updates, chunk).await?;
        }
        node.caught_up(Duration::from_secs(120)).await?;
        let (shipped, bytes) = settled_counts(&node).await?;
        node.kill9();
        let lags = lags.finish(shipped as usize).await?;
        let stored = |topic: &str| topic_bytes(&log_dir, topic);
        let (deltas_stored, updates_stored) = (stored(&topics.deltas)?, stored(&topics.updates)?);
        println!(
            "| {every} | {compression} | {:.3} | {:.3} | {:.3} | {} | {} | {} |",
            shipped as f64 / live.len() as f64,
            bytes as f64 / ingested as f64,
            deltas_stored as f64 / updates_stored.max(1) as f64,
            ms(percentile(&lags, 0.5)),
            ms(percentile(&lags, 0.99)),
            ms(lags.last().copied().unwrap_or_default())
        );
    }
    Ok(())
}

/// The live stream's shipping settings: (`replication.ship-every`, `replication.compression`).
const SHIPPING: [(&str, &str); 6] = [
    ("0ms", "none"),
    ("0ms", "zstd"),
    ("50ms", "zstd"),
    ("100ms", "zstd"),
    ("250ms", "zstd"),
    ("1s", "zstd"),
];

/// Bytes of `topic`'s log segments in the broker's log dir `log_dir`.
fn topic_bytes(log_dir: &std::path::Path, topic: &str) -> anyhow::Result<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(log_dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().to_string();
        let partition = name.strip_prefix(topic).and_then(|r| r.strip_prefix('-'));
        if partition.is_none_or(|p| p.parse::<i32>().is_err()) {
            continue;
        }
        for file in std::fs::read_dir(entry.path())? {
            let file = file?;
            if file.path().extension().is_some_and(|e| e == "log") {
                total += file.metadata()?.len();
            }
        }
    }
    Ok(total)
}

/// A reader of a deltas topic (read committed) on a thread of its own, noting for every
/// delta the time from its origin's apply to its arrival.
struct ShippingLags {
    /// How many deltas to read before the thread ends (none asked yet: `usize::MAX`).
    want: Arc<AtomicUsize>,
    thread: std::thread::JoinHandle<anyhow::Result<Vec<Duration>>>,
}

fn shipping_lags(kafka: &str, topic: &str) -> ShippingLags {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::message::Message;
    let want = Arc::new(AtomicUsize::new(usize::MAX));
    let (kafka, topic, wanted) = (kafka.to_owned(), topic.to_owned(), want.clone());
    let thread = std::thread::spawn(move || {
        let consumer: BaseConsumer = geostate_jepsen::control::kafka_config(&kafka)
            .set("group.id", unique("bench-shipping"))
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "earliest")
            .set("isolation.level", "read_committed")
            .set("fetch.wait.max.ms", "10")
            .create()?;
        consumer.subscribe(&[&topic])?;
        let mut lags = Vec::new();
        while lags.len() < wanted.load(Ordering::Relaxed) {
            let Some(message) = consumer.poll(Duration::from_millis(100)) else {
                continue;
            };
            let message = message?;
            let arrived = SystemTime::now().duration_since(UNIX_EPOCH)?;
            if message.key().unwrap_or_default().starts_with(b"\0") {
                continue; // a resume point or a heartbeat
            }
            let delta = geostate::crdt::Delta::decode(message.payload().unwrap_or_default())?;
            let applied = Duration::from_nanos(delta.origin_time.wall_nanos);
            lags.push(arrived.saturating_sub(applied));
        }
        Ok(lags)
    });
    ShippingLags { want, thread }
}

impl ShippingLags {
    /// Every lag noted, sorted, once `shipped` deltas arrived (fewer if a round was
    /// aborted: then what arrived within 30 s).
    async fn finish(self, shipped: usize) -> anyhow::Result<Vec<Duration>> {
        self.want.store(shipped, Ordering::Relaxed);
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline && !self.thread.is_finished() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // it stops at its next record or poll
        self.want.store(0, Ordering::Relaxed);
        let thread = self.thread;
        let mut lags = tokio::task::spawn_blocking(move || thread.join())
            .await?
            .map_err(|_| anyhow::anyhow!("the shipping-lag reader panicked"))??;
        lags.sort();
        Ok(lags)
    }
}

/// Writes one new key per write in `origin` at `LAG_RATE`; returns, per write, the time
/// from its ack to its arrival in `remote`'s watch stream, sorted.
async fn lag(
    origin: StateClient<Channel>,
    mut remote: StateClient<Channel>,
) -> anyhow::Result<Vec<Duration>> {
    let prefix = format!("trips/{}/", unique("lag"));
    let writes = (LAG_RATE * LAG_SECONDS) as usize;
    let watcher = flow::first_seen(&mut remote, &prefix, writes).await?;
    let acked = flow::add_new_keys(&origin, &prefix, LAG_RATE, writes).await?;
    let seen = watcher.await?;
    if seen.len() < writes {
        bail!(
            "only {} of {writes} writes reached the other region",
            seen.len()
        );
    }
    let mut lags: Vec<Duration> = acked
        .iter()
        .map(|(key, at)| seen[key].saturating_duration_since(*at))
        .collect();
    lags.sort();
    Ok(lags)
}

/// Runs a node over the pre-loaded `topics` until it applied everything and shipped it.
async fn ship_counts(kafka: &str, topics: &Topics) -> anyhow::Result<(u64, u64)> {
    let dir = tempfile::tempdir()?;
    let mut node = Node::configure(dir.path(), kafka, topics)?;
    node.start().await?;
    node.caught_up(Duration::from_secs(300)).await?;
    let counts = settled_counts(&node).await?;
    node.kill9();
    Ok(counts)
}

/// (deltas shipped, bytes shipped) once they stop changing.
async fn settled_counts(node: &Node) -> anyhow::Result<(u64, u64)> {
    let read = || -> anyhow::Result<(u64, u64)> {
        let text = http_get(&node.metrics, "/metrics")?;
        let value = |name: &str| {
            text.lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.rsplit(' ').next())
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0) as u64
        };
        Ok((
            value("geostate_deltas_shipped_total"),
            value("geostate_delta_bytes_shipped_total"),
        ))
    };
    let mut last = read()?;
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = read()?;
        if now == last && now.0 > 0 {
            return Ok(now);
        }
        last = now;
    }
}
