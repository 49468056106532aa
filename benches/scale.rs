//! Scale-out benchmark (`make bench`): prints figures, asserts nothing.
//!
//! - **Scale-out tax**: 1, 2 and 3 nodes of this build sharing one region's private topics
//!   (8 partitions): the CPU-seconds of the node processes from their start until they
//!   share the partitions out, what they spend idle, then ROUNDS rounds of EVENTS
//!   increments over KEYS keys produced while they run, each measured from the first
//!   record produced until every partition is applied to its end: events per CPU-second
//!   (the median round) and the tax against one node. Starting a node and moving
//!   partitions to it is a one-off cost, reported apart from the rate.
//! - **Partition move**: a node holding MOVE_KEYS keys on 4 partitions; a second node joins
//!   with an empty data dir and takes half the partitions (a cold take: its catch-up merges
//!   the region's deltas of those partitions), MOVE_KEYS / 4 more increments go to the
//!   moved partitions, then the second node stops (or is killed) and the first takes them
//!   back: with `standby-replicas = 0` its copy is as old as the join (it merges what was
//!   shipped since), with `standby-replicas = 1` its warm standby already holds it. Each
//!   take is timed by the node itself (`took the partition ... took_ms`, the longest of
//!   the partitions, and of that the longest fencing, `fenced_ms`: the new shipping
//!   producer's `init_transactions`); what a client sees is timed too: from the stop (or the kill) until
//!   a read of a key of each moved partition at the first node is answered (a request for
//!   a moving partition is answered UNAVAILABLE meanwhile). TRIALS moves per case (the
//!   second node restarted from its own copy between them), each reported.
//!
//! `cargo bench --bench scale -- tax` (or `move`) runs one part.

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::failover::replica;
use common::{Node, Topics, cluster, cpu_seconds, metric, produce_all, producer, unique};

const EVENTS: usize = 400_000;
const KEYS: usize = 10_000;
const MOVE_KEYS: usize = 1_000_000;
const WAIT: Duration = Duration::from_secs(900);
/// How long the settled nodes are left idle to measure what they spend doing nothing.
const IDLE: Duration = Duration::from_secs(10);
/// Rounds of EVENTS per node count; the median is reported.
const ROUNDS: usize = 5;
/// Moves back to the first node per case; each is reported.
const TRIALS: usize = 3;

fn main() -> anyhow::Result<()> {
    common::block_on(run())
}

/// Waits until the nodes own every one of `partitions` between them, each once, and each
/// applied its own to the end.
async fn settled(nodes: &[Node], partitions: usize) -> anyhow::Result<()> {
    let until = Instant::now() + WAIT;
    loop {
        let mut owned = BTreeSet::new();
        let mut count = 0;
        let mut applied = true;
        for node in nodes {
            let status = node.status().await?;
            count += status.owned_partitions.len();
            owned.extend(status.owned_partitions);
            applied &= status
                .partitions
                .iter()
                .all(|p| p.end_offset >= 0 && p.applied_offset + 1 >= p.end_offset);
        }
        if owned.len() == partitions && count == partitions && applied {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < until, "not settled within {WAIT:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The longest `took_ms` of the node's log lines containing `what`, after line `from`.
fn longest_took_ms(node: &Node, what: &str, from: usize) -> (u64, usize) {
    longest_ms(node, what, "took_ms=", from)
}

/// The longest value of `field` (`name=`) in the node's log lines containing `what`,
/// after line `from`; and the number of lines.
fn longest_ms(node: &Node, what: &str, field: &str, from: usize) -> (u64, usize) {
    let (values, lines) = node.log_values(what, field, from);
    (values.into_iter().max().unwrap_or(0), lines)
}

/// The take-back counter of a node's catch-ups.
const TAKEN: &str = "geostate_catch_up_deltas_total{by=\"take\"} ";

/// Read before the second node goes: one key of each partition that moves, the first
/// node's log lines and its take-back deltas so far.
struct Before {
    probes: Vec<String>,
    a_lines: usize,
    merged: f64,
}

/// What one move back took: the take (ms), its fencing (ms), the deltas it merged, and
/// how long the moved partitions were unavailable at the first node (ms).
type Moved = (u64, u64, f64, u128);

/// Before the second node goes: the first node's standby copies of its partitions
/// current (or not kept), and one key of each of them to read at the first node.
async fn before_move(both: &[Node; 2], standby: usize, base: &str) -> anyhow::Result<Before> {
    let moved: Vec<i32> = both[1].status().await?.owned_partitions;
    if standby > 0 {
        let until = Instant::now() + WAIT;
        loop {
            let mut behind = false;
            for p in &moved {
                let line = format!("geostate_copy_through{{partition=\"{p}\"}} ");
                let at = |n: &Node| metric(&n.metrics, &line).map(|v| v.unwrap_or(0.0));
                behind |= at(&both[0])? < at(&both[1])?;
            }
            if !behind {
                break;
            }
            anyhow::ensure!(Instant::now() < until, "standby copies not current");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let probes = moved
        .iter()
        .filter_map(|&p| {
            (0..MOVE_KEYS)
                .map(|i| format!("trips/{base}-{i}"))
                .find(|k| geostate::log::partition_of(k.as_bytes(), 4) == p)
        })
        .collect();
    let (_, a_lines) = longest_took_ms(&both[0], "took the partition", 0);
    Ok(Before {
        probes,
        a_lines,
        merged: metric(&both[0].metrics, TAKEN)?.unwrap_or(0.0),
    })
}

fn increments(base: &str, events: usize, keys: usize) -> Vec<(String, Vec<u8>)> {
    (0..events)
        .map(|i| {
            let key = format!("trips/{base}-{}", i % keys);
            let payload = format!(r#"{{"key":"{key}","add":1}}"#).into_bytes();
            (key, payload)
        })
        .collect()
}

async fn run() -> anyhow::Result<()> {
    let cluster = cluster()?;
    let kafka = cluster.regions["us-east-1"].kafka.clone();
    let producer = producer(&kafka)?;
    println!("# geostate scale-out benchmark");
    println!();
    println!(
        "Nodes of this build in one region, on the local cluster's Kafka, {} cores shared by everything.",
        std::thread::available_parallelism()?.get()
    );
    println!();
    // `cargo bench --bench scale -- move` runs one part (`tax` or `move`)
    let only: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let part = |name: &str| only.is_empty() || only.iter().any(|a| a == name);
    if part("tax") {
        tax(&kafka, &producer).await?;
    }
    if part("move") {
        moves(&kafka, &producer).await?;
    }
    Ok(())
}

/// Events per CPU-second with 1, 2 and 3 nodes.
async fn tax(kafka: &str, producer: &rdkafka::producer::FutureProducer) -> anyhow::Result<()> {
    println!("## Scale-out tax: {EVENTS} increments over {KEYS} keys, 8 partitions");
    println!();
    println!(
        "| nodes | CPU-s to start and share out | idle CPU-s per s | events per CPU-s (median of {ROUNDS} rounds) | lowest – highest round | wall s per round | tax vs one node |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    let mut one = None;
    let mut last = 0.0;
    for n in 1..=3 {
        let topics = Topics::create(kafka, &format!("scale-bench-{n}"), 8).await?;
        let dirs: Vec<tempfile::TempDir> = (0..n)
            .map(|_| tempfile::tempdir())
            .collect::<Result<_, _>>()?;
        let mut nodes = Vec::new();
        let mut pids = Vec::new();
        for dir in &dirs {
            let mut node = Node::configure(dir.path(), kafka, &topics)?;
            pids.push(node.start().await?);
            nodes.push(node);
        }
        let cpu = || pids.iter().map(|&p| cpu_seconds(p)).sum::<f64>();
        settled(&nodes, 8).await?;
        let started = cpu();
        tokio::time::sleep(IDLE).await;
        let idle = (cpu() - started) / IDLE.as_secs_f64();
        let mut rounds = Vec::new();
        for _ in 0..ROUNDS {
            let base = unique("scale-bench");
            let (before, wall) = (cpu(), Instant::now());
            for chunk in increments(&base, EVENTS, KEYS).chunks(100_000) {
                produce_all(producer, &topics.updates, chunk).await?;
            }
            settled(&nodes, 8).await?;
            rounds.push((
                EVENTS as f64 / (cpu() - before),
                wall.elapsed().as_secs_f64(),
            ));
        }
        rounds.sort_by(|x, y| x.0.total_cmp(&y.0));
        let (rate, wall) = rounds[ROUNDS / 2];
        let tax = one.map_or("—".to_string(), |r: f64| {
            format!("{:.0} %", (1.0 - rate / r) * 100.0)
        });
        one.get_or_insert(rate);
        last = rate;
        let (low, high) = (rounds[0].0, rounds[ROUNDS - 1].0);
        println!(
            "| {n} | {started:.1} | {idle:.3} | {rate:.0} | {low:.0} – {high:.0} | {wall:.1} | {tax} |"
        );
    }
    println!();
    println!(
        "At the 3-node rate, 1,000,000 events/s take {:.1} cores of node CPU (Kafka's not counted): \
         for example {:.0} nodes of 8 cores each kept at 60 %.",
        1e6 / last,
        (1e6 / last / (8.0 * 0.6)).ceil()
    );
    println!();

    Ok(())
}

/// Partition moves back to the first node, after a stop or a kill of the second.
async fn moves(kafka: &str, producer: &rdkafka::producer::FutureProducer) -> anyhow::Result<()> {
    println!("## Partition move: {MOVE_KEYS} keys on 4 partitions, half of them moving");
    println!();
    println!(
        "| standby-replicas | the second node | cold take by it (longest partition) | more increments | take back by the first node (longest partition; longest fencing) | deltas it merged | moved partitions unavailable at the first node |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|");
    for (standby, killed) in [(0, false), (1, false), (1, true)] {
        let topics = Topics::create(kafka, &format!("move-bench-{standby}-{killed}"), 4).await?;
        let base = unique("move-bench");
        for chunk in increments(&base, MOVE_KEYS, MOVE_KEYS).chunks(100_000) {
            produce_all(producer, &topics.updates, chunk).await?;
        }
        let (da, db) = (tempfile::tempdir()?, tempfile::tempdir()?);
        let mut a = Node::configure(da.path(), kafka, &topics)?;
        let mut b = Node::configure(db.path(), kafka, &topics)?;
        for node in [&mut a, &mut b] {
            node.set("replication.standby-replicas", &standby.to_string());
        }
        a.start().await?;
        settled(std::slice::from_ref(&a), 4).await?;
        b.start().await?;
        let mut both = [a, b];
        settled(&both, 4).await?;
        let (cold, _) = longest_took_ms(&both[1], "took the partition", 0);
        // more increments to the moved partitions' keys (every key: half of them move)
        let more = MOVE_KEYS / 4;
        for chunk in increments(&base, more, MOVE_KEYS).chunks(100_000) {
            produce_all(producer, &topics.updates, chunk).await?;
        }
        let mut trials: Vec<Moved> = Vec::new();
        for trial in 0..TRIALS {
            if trial > 0 {
                // the second node back (from its own copy), owning half again (`settled`
                // alone holds too while the first node still owns everything)
                both[1].start().await?;
                let until = Instant::now() + WAIT;
                while both[1].status().await?.owned_partitions.is_empty() {
                    anyhow::ensure!(Instant::now() < until, "the second node took nothing");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            settled(&both, 4).await?;
            let before = before_move(&both, standby, &base).await?;
            let going = Instant::now();
            if killed {
                both[1].kill9();
            } else {
                both[1].terminate(Duration::from_secs(60)).await?;
            }
            let mut state = both[0].state().await?;
            for key in &before.probes {
                while state.get(replica(key)).await.is_err() {
                    anyhow::ensure!(going.elapsed() < WAIT, "{key} not answered");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
            let unavailable = going.elapsed().as_millis();
            settled(&both[..1], 4).await?;
            let took = "took the partition";
            let (back, _) = longest_took_ms(&both[0], took, before.a_lines);
            let (fenced, _) = longest_ms(&both[0], took, "fenced_ms=", before.a_lines);
            let merged = metric(&both[0].metrics, TAKEN)?.unwrap_or(0.0) - before.merged;
            trials.push((back, fenced, merged, unavailable));
        }
        let how = if killed { "killed (SIGKILL)" } else { "stops" };
        let cell =
            |f: &dyn Fn(&Moved) -> String| trials.iter().map(f).collect::<Vec<_>>().join(" / ");
        println!(
            "| {standby} | {how} | {cold} ms | {more} | {} | {} | {} |",
            cell(&|(back, fenced, _, _)| format!("{back} ({fenced})")),
            cell(&|(_, _, merged, _)| format!("{merged:.0}")),
            cell(&|(_, _, _, unavailable)| format!("{unavailable}")),
        );
    }
    println!();
    Ok(())
}
