//! Checkpoint benchmark (`make bench`): prints figures, asserts nothing.
//!
//! A node of this build holding 1,000,000 keys checkpoints to the local S3 server (s3s-fs,
//! on the same disk): a full checkpoint (time, size), an incremental one after 1 % of the
//! keys changed (time, bytes uploaded), then five restores from the newest checkpoint onto
//! an empty data dir, each timed from the process start to the first answered read, with
//! the node's own split (download, merge of its deltas topic since the copy).

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::{Node, Topics, cluster, produce_all, producer, unique};
use geostate::pb;
use geostate::pb::admin_client::AdminClient;

const KEYS: usize = 1_000_000;
const CHANGED: usize = KEYS / 100;
const RESTORES: usize = 5;

fn main() -> anyhow::Result<()> {
    common::block_on(run())
}

/// The `took_ms` of the last log line containing `what`.
fn took_ms(log: &str, what: &str) -> Option<u64> {
    log.lines()
        .rev()
        .find(|l| l.contains(what))
        .and_then(|l| l.split("took_ms=").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

async fn run() -> anyhow::Result<()> {
    let cluster = cluster()?;
    let kafka = cluster.regions["us-east-1"].kafka.clone();
    let topics = Topics::create(&kafka, "ckpt-bench", 4).await?;
    let dir = tempfile::tempdir()?;
    let mut node = Node::configure(dir.path(), &kafka, &topics)?;
    node.set("checkpoint.interval", "\"0s\"");
    node.set("checkpoint.keep", "10");
    node.set("checkpoint.upload-bytes-per-second", "0");
    node.set("checkpoint.restore-on-empty", "true");
    node.checkpoint_to_s3(
        &cluster.s3,
        &cluster.s3.endpoint,
        &format!("{}/", unique("ckpt-bench")),
    );
    println!("# geostate checkpoint benchmark");
    println!();
    println!(
        "{KEYS} counters, a node of this build, the local S3 server (s3s-fs) on the same disk, {} cores shared by everything",
        std::thread::available_parallelism()?.get()
    );
    println!();

    let producer = producer(&kafka)?;
    let events: Vec<(String, Vec<u8>)> = (0..KEYS)
        .map(|i| {
            let key = format!("trips/k{i:07}");
            let payload = format!(r#"{{"key":"{key}","add":1}}"#).into_bytes();
            (key, payload)
        })
        .collect();
    for chunk in events.chunks(100_000) {
        produce_all(&producer, &topics.updates, chunk).await?;
    }
    node.start().await?;
    node.caught_up(Duration::from_secs(900)).await?;
    let mut admin = AdminClient::connect(node.grpc.clone()).await?;
    let full = admin
        .checkpoint(pb::CheckpointRequest {})
        .await?
        .into_inner();

    let changed: Vec<(String, Vec<u8>)> = (0..CHANGED)
        .map(|i| {
            let key = format!("trips/k{:07}", (i * 7919) % KEYS);
            let payload = format!(r#"{{"key":"{key}","add":1}}"#).into_bytes();
            (key, payload)
        })
        .collect();
    produce_all(&producer, &topics.updates, &changed).await?;
    node.caught_up(Duration::from_secs(300)).await?;
    let incremental = admin
        .checkpoint(pb::CheckpointRequest {})
        .await?
        .into_inner();

    println!("## Checkpoints");
    println!();
    println!("| checkpoint | time | files | size | uploaded |");
    println!("|---|---:|---:|---:|---:|");
    for (name, c) in [
        ("full, 1,000,000 keys", &full),
        ("incremental, after 1 % of keys changed", &incremental),
    ] {
        println!(
            "| {name} | {} ms | {} | {:.1} MB | {:.1} MB |",
            c.duration_ms,
            c.files,
            c.bytes_total as f64 / 1e6,
            c.bytes_uploaded as f64 / 1e6
        );
    }
    println!();

    println!("## Restore onto an empty data dir ({RESTORES} runs)");
    println!();
    println!("| run | start → first read | download + open | own deltas merge |");
    println!("|---:|---:|---:|---:|");
    let mut totals = Vec::new();
    for run in 1..=RESTORES {
        node.kill9();
        std::fs::remove_dir_all(dir.path().join("data"))?;
        let started = Instant::now();
        node.start().await?;
        let mut state = node.state().await?;
        state
            .get(pb::GetRequest {
                key: "trips/k0000000".into(),
                ..Default::default()
            })
            .await?;
        let total = started.elapsed();
        totals.push(total);
        let log = std::fs::read_to_string(&node.log)?;
        println!(
            "| {run} | {} ms | {} ms | {} ms |",
            total.as_millis(),
            took_ms(&log, "restored the newest checkpoint").unwrap_or_default(),
            took_ms(&log, "merged this region's own deltas topic").unwrap_or_default()
        );
    }
    let mean = totals.iter().sum::<Duration>() / totals.len() as u32;
    let max = totals.iter().max().copied().unwrap_or_default();
    println!();
    println!(
        "restore to first read: mean {} ms, max {} ms",
        mean.as_millis(),
        max.as_millis()
    );
    node.kill9();
    Ok(())
}
