//! Windowed ingest benchmark (`cargo bench --bench windows`, part of `make bench`): prints
//! figures, asserts nothing.
//!
//! A node of this build ingests 300,000 pre-loaded events over 10,000 geohashes whose
//! event times span 10 minutes (in order, up to 3 s early: none late), three ways: plain
//! g-counters (`requests/`), 1-minute tumbling windows (`demand/` as the region file sets
//! it), and 5-minute windows every minute (`demand/` with `slide = "1m"`). Each run has its
//! own topics and data dir; it reports events per CPU-second of the node process, wall
//! time, and the data dir's size after a final flush (the stored slices).

#[path = "../tests/common/mod.rs"]
mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{Node, Topics, cluster, cpu_seconds, produce_all, producer};
use geostate::ingest::event::{Op, Update};
use geostate::workload::{Rng, geohash};

const EVENTS: usize = 300_000;
const KEYS: usize = 10_000;
const SPAN_MS: u64 = 10 * 60_000;

fn main() -> anyhow::Result<()> {
    common::block_on(run())
}

/// The region file's namespaces with `demand/` windowed as `window`.
fn namespaces(window: &str) -> String {
    format!(
        "[{{ prefix = \"requests/\", type = \"g_counter\", ownership = \"shared\" }}, \
          {{ prefix = \"demand/\", type = \"g_counter\", ownership = \"shared\", window = {window} }}, \
          {{ prefix = \"drivers/\", type = \"pn_counter\", ownership = \"shared\" }}, \
          {{ prefix = \"zones/\", type = \"lww_register\", ownership = \"shared\" }}, \
          {{ prefix = \"surge/\", type = \"lww_register\", ownership = \"owned\" }}]"
    )
}

fn events(prefix: &str) -> Vec<(String, Vec<u8>)> {
    let mut rng = Rng(0x0057_1d0e_5eed);
    let base = 1_700_000_000_000u64;
    (0..EVENTS)
        .map(|i| {
            let key = format!("{prefix}{}", geohash(rng.below(KEYS as u64) as usize));
            let t = base + i as u64 * SPAN_MS / EVENTS as u64;
            let update = Update {
                key: key.clone(),
                op: Op::Add(1),
                id: None,
                event_time_ms: Some(t.saturating_sub(rng.below(3_000))),
                hlc: None,
                epoch: None,
            };
            (key, update.encode(geostate::config::RecordFormat::Json))
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

async fn run() -> anyhow::Result<()> {
    let cluster = cluster()?;
    let kafka = cluster.regions["us-east-1"].kafka.clone();
    let window = |size: &str, slide: &str| {
        format!(
            "{{ size = \"{size}\", slide = \"{slide}\", allowed-lateness = \"10s\", retention = \"1h\" }}"
        )
    };
    let runs = [
        ("plain g-counters", "requests/", None),
        (
            "1-minute tumbling windows",
            "demand/",
            Some(window("1m", "1m")),
        ),
        (
            "5-minute windows every minute",
            "demand/",
            Some(window("5m", "1m")),
        ),
    ];
    println!("# windowed ingest: {EVENTS} events, {KEYS} geohashes, 10 minutes of event time");
    println!();
    println!("| ingest | events/s | events per CPU-second | wall | data dir after |");
    println!("|---|---:|---:|---:|---:|");
    let producer = producer(&kafka)?;
    for (name, prefix, window) in runs {
        let topics = Topics::create(&kafka, "win-bench", 4).await?;
        produce_all(&producer, &topics.updates, &events(prefix)).await?;
        let dir = tempfile::tempdir()?;
        let mut node = Node::configure(dir.path(), &kafka, &topics)?;
        if let Some(window) = window {
            node.set("namespace", &namespaces(&window));
        }
        node.set("ingest.batch-max-events", "5000");
        let started = Instant::now();
        let pid = node.start().await?;
        let deadline = Instant::now() + Duration::from_secs(900);
        loop {
            let status = node.status().await?;
            if status.events_applied as usize >= EVENTS {
                break;
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "{name}: not ingested: {status:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let wall = started.elapsed();
        let cpu = cpu_seconds(pid);
        node.terminate(Duration::from_secs(60)).await?;
        let bytes = dir_bytes(&dir.path().join("data"));
        println!(
            "| {name} | {:.0} | {:.0} | {:.1} s | {:.1} MiB |",
            EVENTS as f64 / wall.as_secs_f64(),
            EVENTS as f64 / cpu,
            wall.as_secs_f64(),
            bytes as f64 / (1024.0 * 1024.0),
        );
    }
    println!();
    println!(
        "Wall time and CPU from the node's start (opening its store, joining its group) to the last event applied; CPU of the node process only (Kafka runs beside it)."
    );
    Ok(())
}
