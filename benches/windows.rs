//! Windowed ingest benchmark side by side with Apache Flink (`cargo bench --bench windows`,
//! part of `make bench`): prints Markdown, asserts nothing.
//!
//! One pre-loaded topic holds 1,000,000 events over 10,000 geohashes whose event times
//! span 10 minutes (in order, up to 3 s early: none late). Each system reads all of it from
//! the start:
//!
//! - a geostate node of this build as plain g-counters, as 1-minute tumbling windows
//!   (`requests/` as the region file sets it), and as 5-minute windows every minute; exactly
//!   once into RocksDB, its deltas shipped in Kafka transactions;
//! - Apache Flink (`bench/peers/WindowedCount.java`, from `peers.py install`: `FLINK_CP`)
//!   with the same two windows: a DataStream job on a local MiniCluster, parallelism 1,
//!   RocksDB state backend with incremental exactly-once checkpoints every second, Kafka
//!   source, a transactional Kafka sink for the window counts.
//!
//! Like the node benchmark, the system under test runs on core 1 where there are two cores
//! (`taskset`; `scripts/bench.sh` pins the cluster to core 0), and events per second and per
//! CPU-second are timed from the first progress to the last, start-up left out: the node's
//! applied offsets, Flink's offsets committed on checkpoint completion. The state column is
//! what each keeps on disk at the end (geostate: its data dir after a final flush; Flink:
//! its RocksDB working dir and checkpoints).
//!
//! Then state at steady load: 2,000 events/s over 100,000 geohashes for 10 minutes
//! (`GEOSTATE_BENCH_STEADY_SECONDS`), event time the producer's clock, into 1-minute
//! windows, read by a node keeping them 2 minutes and by a control keeping them an hour;
//! every minute the report shows each one's state (`geostate_state_bytes`: live SST files
//! and memtables) and data dir.

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "shared/cpu.rs"]
mod cpu;

use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use common::{Node, Topics, cluster, create_topic, produce_all, producer};
use cpu::{Peer, Probe, Rate, SUT_CORE, on_sut_core, pin, pinning};
use geostate::workload::{Rng, geohash};

const EVENTS: usize = 1_000_000;
const KEYS: usize = 10_000;
const PARTITIONS: i32 = 4;
const SPAN_MS: u64 = 10 * 60_000;
/// Flink's checkpoint interval: its offsets, state and sink commit this often.
const FLINK_CHECKPOINT_MS: u64 = 1_000;
/// Events per second of the steady-load run, over how many geohashes, and how long its
/// windows are kept.
const STEADY_RATE: usize = 2_000;
const STEADY_KEYS: usize = 100_000;
const STEADY_RETENTION: &str = "2m";

/// A window shape: (size, slide) in seconds, or none for plain counters.
type Shape = Option<(u64, u64)>;

fn main() -> anyhow::Result<()> {
    common::block_on(run())
}

/// The region file's namespaces with `requests/` as `shape`, windows kept for `retention`.
fn namespaces(shape: Shape, retention: &str) -> String {
    let window = match shape {
        None => String::new(),
        Some((size, slide)) => format!(
            ", window = {{ size = \"{size}s\", slide = \"{slide}s\", allowed-lateness = \"10s\", retention = \"{retention}\" }}"
        ),
    };
    format!(
        "[{{ prefix = \"trips/\", type = \"g_counter\", ownership = \"shared\" }}, \
          {{ prefix = \"requests/\", type = \"g_counter\", ownership = \"shared\"{window} }}, \
          {{ prefix = \"drivers/\", type = \"pn_counter\", ownership = \"shared\" }}, \
          {{ prefix = \"zones/\", type = \"lww_register\", ownership = \"shared\" }}, \
          {{ prefix = \"surge/\", type = \"lww_register\", ownership = \"owned\" }}]"
    )
}

/// A ride request in a random one of `keys` geohashes at event time `t`.
fn request(rng: &mut Rng, keys: usize, t: u64) -> (String, Vec<u8>) {
    let key = format!("requests/{}", geohash(rng.below(keys as u64) as usize));
    common::add_one_at(&key, t, geostate::config::RecordFormat::Json)
}

fn events() -> Vec<(String, Vec<u8>)> {
    let mut rng = Rng(0x0057_1d0e_5eed);
    let base = 1_700_000_000_000u64;
    (0..EVENTS)
        .map(|i| {
            let t = base + i as u64 * SPAN_MS / EVENTS as u64;
            let early = rng.below(3_000);
            request(&mut rng, KEYS, t.saturating_sub(early))
        })
        .collect()
}

fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

/// A node of this build of `region` (nodes of one region over one topic share out its
/// partitions) over `updates` with `requests/` as `shape`, kept `retention`, data in `dir`.
/// Its other topics are its own: a node that found an earlier one's deltas would resume
/// where that one stopped.
async fn node_over(
    region: &str,
    kafka: &str,
    updates: &str,
    dir: &Path,
    shape: Shape,
    retention: &str,
) -> anyhow::Result<Node> {
    let topics = Topics {
        updates: updates.to_owned(),
        ..Topics::create(kafka, "win-bench-node", PARTITIONS).await?
    };
    let mut node = Node::configure_region(dir, region, kafka, &topics, &[])?;
    node.set("namespace", &namespaces(shape, retention));
    // no pricer runs here, and the control's `requests/` is not windowed as `[pricing]`
    // needs its demand to be
    node.set("pricing", "");
    Ok(node)
}

/// A geostate node of this build over `updates`, `requests/` as `shape`: its rate and the
/// bytes of its data dir after a final flush.
async fn geostate(kafka: &str, updates: &str, shape: Shape) -> anyhow::Result<(Rate, u64)> {
    let dir = tempfile::tempdir()?;
    let mut node = node_over("us-east-1", kafka, updates, dir.path(), shape, "1h").await?;
    node.set("ingest.batch-max-events", "5000");
    let pid = node.start().await?;
    pin(pid, SUT_CORE)?;
    let rate = Probe::Node(&node)
        .follow(&[pid], EVENTS, Duration::from_secs(900))
        .await?;
    node.terminate(Duration::from_secs(60)).await?;
    Ok((rate, dir_bytes(&dir.path().join("data"))))
}

/// The Flink peer over `updates` with windows of `size` every `slide` seconds, or none
/// where `FLINK_CP` is unset: its rate and the bytes of its state dir at the end.
async fn flink(
    kafka: &str,
    updates: &str,
    (size, slide): (u64, u64),
) -> anyhow::Result<Option<(Rate, u64)>> {
    let Ok(cp) = std::env::var("FLINK_CP") else {
        return Ok(None);
    };
    let app = common::unique("flink-windows");
    let output = format!("{app}.counts");
    create_topic(kafka, &output, PARTITIONS).await?;
    let dir = tempfile::tempdir()?;
    let log = std::fs::File::create(dir.path().join("flink.log"))?;
    let java = std::env::var("JAVA_HOME").map_or("java".into(), |h| format!("{h}/bin/java"));
    let peer = Peer(
        on_sut_core(&java)
            .args(["-Xms512m", "-Xmx1g", "-cp", &cp, "WindowedCount", kafka])
            .args([updates, &output, &app])
            .args([size, slide, FLINK_CHECKPOINT_MS].map(|n| n.to_string()))
            .arg(dir.path())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting the Flink peer")?,
    );
    let probe = Probe::group(kafka, &app, updates, PARTITIONS)?;
    let rate = probe
        .follow(&[peer.0.id()], EVENTS, Duration::from_secs(900))
        .await;
    let bytes = dir_bytes(dir.path());
    drop(peer);
    let rate = rate.with_context(|| {
        let log = std::fs::read_to_string(dir.path().join("flink.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        let tail = lines[lines.len().saturating_sub(20)..].join("\n");
        format!("Flink ({size} s / {slide} s); its log ends:\n{tail}")
    })?;
    Ok(Some((rate, bytes)))
}

fn row(system: &str, ingest: &str, measured: Option<(Rate, u64)>) {
    match measured {
        Some((rate, bytes)) => println!(
            "| {system} | {ingest} | {:.0} | {:.0} | {:.1} MiB |",
            rate.events_per_second,
            rate.per_cpu_second,
            bytes as f64 / (1024.0 * 1024.0),
        ),
        None => println!("| {system} | {ingest} | not run (FLINK_CP unset) | | |"),
    }
}

/// The steady-load run: `STEADY_RATE` events a second over `STEADY_KEYS` geohashes for
/// `seconds`, event time this process's clock, into 1-minute windows, read by two nodes:
/// one keeps the windows `STEADY_RETENTION`, the other (the control) an hour. Prints both
/// nodes' state every minute.
async fn steady(kafka: &str, seconds: u64) -> anyhow::Result<()> {
    let updates = Topics::create(kafka, "win-steady", PARTITIONS)
        .await?
        .updates;
    let (kept, control) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let mut nodes = Vec::new();
    // two regions' nodes: each reads every partition
    for (region, dir, retention) in [
        ("us-east-1", &kept, STEADY_RETENTION),
        ("eu-west-1", &control, "1h"),
    ] {
        let shape = Some((60, 60));
        let mut node = node_over(region, kafka, &updates, dir.path(), shape, retention).await?;
        let pid = node.start().await?;
        pin(pid, SUT_CORE)?;
        nodes.push((node, dir));
    }
    println!(
        "# windowed state at steady load: {STEADY_RATE} events/s, {STEADY_KEYS} geohashes, 1-minute windows kept {STEADY_RETENTION} (and an hour: the control)"
    );
    println!();
    println!(
        "| minute | events sent | state, kept {STEADY_RETENTION} | data dir, kept {STEADY_RETENTION} | state, kept 1 h | data dir, kept 1 h |"
    );
    println!("|---:|---:|---:|---:|---:|---:|");
    let producer = producer(kafka)?;
    let mut rng = Rng(0x57ead);
    let started = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let (mut sent, mut minute) = (0usize, 0u64);
    while started.elapsed() < Duration::from_secs(seconds) {
        tick.tick().await;
        let now_ms = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis() as u64;
        let batch: Vec<_> = (0..STEADY_RATE / 10)
            .map(|_| request(&mut rng, STEADY_KEYS, now_ms))
            .collect();
        produce_all(&producer, &updates, &batch).await?;
        sent += batch.len();
        if started.elapsed() >= Duration::from_secs(60 * (minute + 1)) {
            minute += 1;
            let mut cells = Vec::new();
            for (node, dir) in &nodes {
                let metrics = common::http_get(&node.metrics, "/metrics")?;
                let state = metrics
                    .lines()
                    .find(|l| l.split(' ').next() == Some("geostate_state_bytes"))
                    .and_then(|l| l.rsplit(' ').next())
                    .and_then(|v| v.parse::<f64>().ok())
                    .unwrap_or(0.0);
                let disk = dir_bytes(&dir.path().join("data")) as f64;
                cells.push(format!(
                    "{:.1} MiB | {:.1} MiB",
                    state / (1024.0 * 1024.0),
                    disk / (1024.0 * 1024.0)
                ));
            }
            println!("| {minute} | {sent} | {} |", cells.join(" | "));
        }
    }
    for (node, _) in &mut nodes {
        node.terminate(Duration::from_secs(60)).await?;
    }
    println!();
    println!(
        "Sampled at the end of each minute of load; both nodes on core {SUT_CORE} where there are two. State: `geostate_state_bytes` (live SST files and memtables; each checkpoint, every 15 s, flushes the memtables). A window's slices expire {STEADY_RETENTION} after it became final; RocksDB's compactions drop them."
    );
    Ok(())
}

async fn run() -> anyhow::Result<()> {
    let cluster = cluster()?;
    let kafka = cluster.regions["us-east-1"].kafka.clone();
    let topics = Topics::create(&kafka, "win-bench", PARTITIONS).await?;
    let producer = producer(&kafka)?;
    for chunk in events().chunks(200_000) {
        produce_all(&producer, &topics.updates, chunk).await?;
    }

    let tumbling = (60, 60);
    let hopping = (300, 60);
    let plain = geostate(&kafka, &topics.updates, None).await?;
    let ours_tumbling = geostate(&kafka, &topics.updates, Some(tumbling)).await?;
    let ours_hopping = geostate(&kafka, &topics.updates, Some(hopping)).await?;
    let flink_tumbling = flink(&kafka, &topics.updates, tumbling).await?;
    let flink_hopping = flink(&kafka, &topics.updates, hopping).await?;

    println!(
        "# windowed ingest: {EVENTS} events, {KEYS} geohashes, 10 minutes of event time, {PARTITIONS} partitions"
    );
    println!();
    println!("| system | ingest | events/s | events per CPU-second | state on disk at the end |");
    println!("|---|---|---:|---:|---:|");
    row("geostate", "plain g-counters", Some(plain));
    row("geostate", "1-minute tumbling windows", Some(ours_tumbling));
    row(
        "geostate",
        "5-minute windows every minute",
        Some(ours_hopping),
    );
    row("Apache Flink", "1-minute tumbling windows", flink_tumbling);
    row(
        "Apache Flink",
        "5-minute windows every minute",
        flink_hopping,
    );
    println!();
    let ratio = |ours: (Rate, u64), peer: Option<(Rate, u64)>| {
        peer.map_or("not run".into(), |(p, _)| {
            format!("{:.1}×", ours.0.per_cpu_second / p.per_cpu_second)
        })
    };
    println!(
        "geostate ÷ Flink, events per CPU-second: {} with 1-minute tumbling windows, {} with 5-minute windows every minute.",
        ratio(ours_tumbling, flink_tumbling),
        ratio(ours_hopping, flink_hopping),
    );
    println!();
    println!(
        "{}; timed from the first progress to the last (start-up left out). Flink checkpoints every {FLINK_CHECKPOINT_MS} ms; geostate commits every batch and ships continuously.",
        if pinning() {
            format!(
                "Each system alone on core {SUT_CORE}, the cluster and the load generator on core 0"
            )
        } else {
            "Unpinned (one core)".to_string()
        }
    );
    println!();
    let seconds = std::env::var("GEOSTATE_BENCH_STEADY_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(600);
    steady(&kafka, seconds).await
}
