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
//!    then over TLS, and beside a caller flooding `Update`, without and with `api.limits`;
//! 4. `Get` throughput and latency at 1, 10 and 100 streams, without and with ingest load.
//!
//! Where the machine has two cores or more, the system under test (node, Kafka Streams JVM,
//! Redis server and its consumer) runs on core 1 and the brokers and the load generator on
//! core 0 (`taskset`; `scripts/bench.sh` pins the cluster). The peers come from
//! `bench/peers/peers.py install` (`KSTREAMS_CP`, `REDIS_SERVER`); a missing peer is
//! reported as not run.

#[path = "../../tests/common/mod.rs"]
mod common;
#[path = "../shared/cpu.rs"]
mod cpu;
mod data;
mod ingest;
mod latency;
mod limits;
mod peers;
mod tls;

use cpu::*;
use data::*;
use ingest::*;
use latency::*;
use peers::*;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
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
use rdkafka::{Offset, TopicPartitionList};
use serde_json::{Value, json};

const EVENTS: usize = 300_000;
const PARTITIONS: i32 = 4;
const BATCH: usize = 1000;
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

    let (datasets, produce_rate) = produce_datasets(&kafka).await?;
    if std::env::var("GEOSTATE_BENCH_ONLY").as_deref() == Ok("cores") {
        // the node alone on one core and on two over every dataset, this build and a
        // baseline's in turn, then section 3; writes no JSON
        let baseline = std::env::var_os("GEOSTATE_BENCH_BASELINE").map(PathBuf::from);
        for data in &datasets {
            cores_section(&kafka, data, None, baseline.as_deref(), work.path()).await?;
        }
        latency_and_gets(&kafka, work.path(), 20_000).await?;
        return Ok(());
    }
    let (ceilings_json, ceilings) =
        ceilings_section(&kafka, &datasets, &config, produce_rate).await?;
    let (ingest_json, headline) = ingest_section(&kafka, &datasets, work.path()).await?;
    let ratios_json = ratios_section(&headline, &ceilings);
    let cores_json = if pinned {
        cores_section(&kafka, &datasets[0], Some(headline[0].1), None, work.path()).await?
    } else {
        Value::Null
    };

    // 3 and 4
    let load_rate = (headline[0].1.events_per_second / 4.0).max(1000.0) as u64;
    let served = latency_and_gets(&kafka, work.path(), load_rate).await?;

    let report = json!({
        "machine": {"cores": cores, "pinned": pinned, "sut_core": if pinned { Some(SUT_CORE) } else { None }},
        "produce_events_per_second": produce_rate.round(),
        "ceilings": ceilings_json,
        "ingest": ingest_json,
        "ratios": ratios_json,
        "cores": cores_json,
        "latency": served["latency"],
        "get": served["get"],
        "tls": served["tls"],
        "limits": served["limits"],
    });
    std::fs::create_dir_all("bench/results")?;
    std::fs::write(
        "bench/results/node.json",
        serde_json::to_string_pretty(&report)?,
    )?;
    Ok(())
}

/// One dataset's ingest figures: geostate, Kafka Streams at exactly-once and at least
/// once, Redis (a peer that did not run is `None`).
type Headline = (String, Rate, Option<Rate>, Option<Rate>, Option<Rate>);

/// The four datasets, each produced once to its own topic; and the produce rate.
async fn produce_datasets(kafka: &str) -> anyhow::Result<(Vec<Dataset>, f64)> {
    // the datasets, produced once
    let producer = common::producer(kafka)?;
    let mut datasets = Vec::new();
    let mut produce = Duration::ZERO;
    for (keys, zipf) in [
        (10_000, false),
        (10_000, true),
        (1_000_000, false),
        (1_000_000, true),
    ] {
        let topic = Topics::create(kafka, "bench", PARTITIONS).await?;
        let data = Dataset::generate(keys, zipf, topic);
        let started = Instant::now();
        common::produce_all(&producer, &data.topic.updates, &data.records).await?;
        produce += started.elapsed();
        datasets.push(data);
    }
    let produce_rate = (EVENTS * datasets.len()) as f64 / produce.as_secs_f64();

    Ok((datasets, produce_rate))
}

/// Section 1: raw consume, the CRDT core in memory, consume + apply in memory.
async fn ceilings_section(
    kafka: &str,
    datasets: &[Dataset],
    config: &Config,
    produce_rate: f64,
) -> anyhow::Result<(Vec<Value>, Vec<Ceilings>)> {
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
    let mut rates = Vec::new();
    for data in datasets {
        let [raw, core, no_durability] = ceilings(kafka, data, config).await?;
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
        rates.push(Ceilings { raw, no_durability });
    }
    println!();

    Ok((ceilings_json, rates))
}

/// What the ratios compare geostate's ingest with, per dataset.
struct Ceilings {
    /// rdkafka consuming the topic and nothing else.
    raw: Rate,
    /// Consume + apply in memory, nothing made durable.
    no_durability: Rate,
}

/// Section 2: each system over each dataset.
async fn ingest_section(
    kafka: &str,
    datasets: &[Dataset],
    work: &Path,
) -> anyhow::Result<(Vec<Value>, Vec<Headline>)> {
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
    for data in datasets {
        let dir = work.join(data.name.replace([' ', ',', '.'], "-"));
        std::fs::create_dir_all(&dir)?;
        let (ours, deltas_per_event) = geostate(kafka, data, &dir).await?;
        let eos = kafka_streams(kafka, data, "exactly_once_v2", &dir).await?;
        let alos = kafka_streams(kafka, data, "at_least_once", &dir).await?;
        let redis = redis(kafka, data, &dir).await?;
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
    Ok((ingest_json, headline))
}

/// The node's ingest of `data` on core 1 (`one`: already measured) and on cores 0 and 1,
/// and a `baseline` build's in the same run, alternating; meanwhile the cluster's other
/// processes are stopped, so that core 0 is shared with the one broker serving fetches.
async fn cores_section(
    kafka: &str,
    data: &Dataset,
    one: Option<Rate>,
    baseline: Option<&Path>,
    work: &Path,
) -> anyhow::Result<Value> {
    let paused = Paused::cluster_but(&["kafka-us-east-1", "s3", "postgres"])?;
    // per build: name, binary, its runs on core 1 and on cores 0-1
    type Runs<'a> = (String, Option<&'a Path>, Vec<Run>, Vec<Run>);
    let mut builds: Vec<Runs> = vec![(
        "this build".to_owned(),
        None,
        one.map(Run::of).into_iter().collect(),
        Vec::new(),
    )];
    if let Some(b) = baseline {
        builds.push((
            format!("baseline ({})", b.display()),
            Some(b),
            Vec::new(),
            Vec::new(),
        ));
    }
    let slug = data.name.replace([' ', ',', '.'], "-");
    // the rounds in turn, and in each the builds in turn: drift over the run is shared
    for round in 0..CORES_ROUNDS {
        for cores in [SUT_CORE, "0-1"] {
            for (i, (_, binary, one, two)) in builds.iter_mut().enumerate() {
                let runs = if cores == SUT_CORE { one } else { two };
                if runs.len() > round {
                    continue; // section 2 measured it
                }
                let dir = work.join(format!("cores-{slug}-{i}-{cores}-{round}"));
                std::fs::create_dir_all(&dir)?;
                let node = ingest::geostate_on(kafka, data, &dir, cores, *binary).await?;
                runs.push(Run {
                    rate: node.rate,
                    broker: Some(node.broker_cpu_per_event),
                    parts: Some(node.parts),
                });
            }
        }
    }
    drop(paused);
    println!("## Ingest on one core and on two ({})", data.name);
    println!();
    println!(
        "The same pre-loaded topic ({PARTITIONS} partitions): the node alone on core 1 (section 2's run, with the cluster running, in a full run), then on cores 0 and 1 (started on them: a runtime worker per core), sharing core 0 with the Kafka broker that serves its fetches and takes its deltas; the cluster's other processes that take CPU (the other region's broker, MirrorMaker 2, the idle nodes, the witness) are stopped meanwhile. Each build runs {CORES_ROUNDS} times on each, in turn, and each figure is the median of its runs. The broker's CPU per event is measured over each run; the bound is what two cores allow the node and the broker together (2 ÷ their CPU-seconds per event on cores 0-1) over the node's rate on core 1. Goal: two cores at least 1.6x one."
    );
    println!();
    println!(
        "| build | core 1: events/s (per CPU-s) | cores 0-1: events/s (per CPU-s) | 0-1 ÷ 1 | bound ÷ 1 |"
    );
    println!("|---|---:|---:|---:|---:|");
    let mut rows = Vec::new();
    let mut profiles = Vec::new();
    for (name, _, one_runs, two_runs) in &builds {
        let (one, two) = (Run::median(one_runs), Run::median(two_runs));
        let each = |runs: &[Run]| -> Vec<f64> {
            runs.iter()
                .map(|r| r.rate.events_per_second.round())
                .collect()
        };
        let bound = two
            .broker
            .map(|b| 2.0 / (1.0 / two.rate.per_cpu_second.max(1e-9) + b));
        println!(
            "| {name} | {:.0} ({:.0}) | {:.0} ({:.0}) | {} | {} |",
            one.rate.events_per_second,
            one.rate.per_cpu_second,
            two.rate.events_per_second,
            two.rate.per_cpu_second,
            ratio(two.rate.events_per_second, one.rate.events_per_second),
            bound.map_or("—".into(), |b| ratio(b, one.rate.events_per_second)),
        );
        for (cores, run) in [("core 1", one), ("cores 0-1", two)] {
            if let (Some(broker), Some(p)) = (run.broker, run.parts) {
                profiles.push(format!(
                    "| {name} | {cores} | {:.2} | {:.0} | {:.1} | {:.1} | {:.2} |",
                    broker * 1e6,
                    p.events,
                    p.wait * 1e3,
                    p.work * 1e3,
                    p.busy
                ));
            }
        }
        let parts = |p: Option<ingest::Parts>| {
            p.map(|p| json!({"events": p.events, "wait_seconds": p.wait, "work_seconds": p.work, "busy": p.busy}))
        };
        rows.push(json!({
            "build": name,
            "one_core": one.rate.json(),
            "two_cores": two.rate.json(),
            "broker_cpu_seconds_per_event": {"one_core": one.broker, "two_cores": two.broker},
            "parts": {"one_core": parts(one.parts), "two_cores": parts(two.parts)},
            "runs_events_per_second": {"one_core": each(one_runs), "two_cores": each(two_runs)},
            "ratio": two.rate.events_per_second / one.rate.events_per_second.max(1e-9),
            "bound_ratio": bound.map(|b| b / one.rate.events_per_second.max(1e-9)),
        }));
    }
    println!();
    if !profiles.is_empty() {
        println!(
            "Where it goes (medians): the broker's CPU per event; per part a partition applied at once, its events, its wait from the first record's arrival to its partition's writer, and its apply and commit; and the partitions at work at once, on average (apply and commit seconds over all partitions per second of the run)."
        );
        println!();
        println!(
            "| build | cores | broker µs per event | events per part | wait per part, ms | apply + commit per part, ms | partitions at work |"
        );
        println!("|---|---|---:|---:|---:|---:|---:|");
        for row in profiles {
            println!("{row}");
        }
        println!();
    }
    Ok(json!({"dataset": data.name, "builds": rows}))
}

/// Runs of each build on each set of cores in the cores section, reported by their median
/// (one run of a build differs from the next by up to 15 % on this machine).
const CORES_ROUNDS: usize = 3;

/// A node's run in the cores section: its rate, the broker's CPU-seconds per event and
/// how its partitions applied (`None`: measured in section 2, without them).
#[derive(Clone, Copy, Default)]
struct Run {
    rate: Rate,
    broker: Option<f64>,
    parts: Option<ingest::Parts>,
}

impl Run {
    fn of(rate: Rate) -> Self {
        Self {
            rate,
            ..Self::default()
        }
    }

    /// Each figure's median over `runs`.
    fn median(runs: &[Run]) -> Run {
        fn middle(mut values: Vec<f64>) -> Option<f64> {
            values.sort_by(f64::total_cmp);
            values.get(values.len() / 2).copied()
        }
        let of = |f: fn(&Run) -> Option<f64>| middle(runs.iter().filter_map(f).collect());
        Run {
            rate: Rate {
                events_per_second: of(|r| Some(r.rate.events_per_second)).unwrap_or_default(),
                per_cpu_second: of(|r| Some(r.rate.per_cpu_second)).unwrap_or_default(),
            },
            broker: of(|r| r.broker),
            parts: runs
                .iter()
                .any(|r| r.parts.is_some())
                .then(|| ingest::Parts {
                    events: of(|r| r.parts.map(|p| p.events)).unwrap_or_default(),
                    wait: of(|r| r.parts.map(|p| p.wait)).unwrap_or_default(),
                    work: of(|r| r.parts.map(|p| p.work)).unwrap_or_default(),
                    busy: of(|r| r.parts.map(|p| p.busy)).unwrap_or_default(),
                }),
        }
    }
}

/// The ratios between the systems and the exactly-once taxes, per dataset.
fn ratios_section(headline: &[Headline], ceilings: &[Ceilings]) -> Vec<Value> {
    println!(
        "Ratios and exactly-once taxes (tax = 1 − exactly-once rate ÷ the same work without it); events/s unless per CPU-second:"
    );
    println!();
    println!(
        "| dataset | geostate ÷ raw rdkafka consume | geostate ÷ Kafka Streams EOS | per CPU-second | geostate ÷ Kafka Streams ALOS | geostate ÷ Redis | per CPU-second | Kafka Streams EOS tax (vs ALOS) | geostate tax (vs consume + apply in memory) |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut ratios_json = Vec::new();
    for ((name, ours, eos, alos, redis), ceiling) in headline.iter().zip(ceilings) {
        let no_durability = &ceiling.no_durability;
        let over = |r: &Option<Rate>| {
            r.map_or("—".into(), |r| {
                ratio(ours.events_per_second, r.events_per_second)
            })
        };
        let per_cpu = |r: &Option<Rate>| {
            r.map_or("—".into(), |r| {
                ratio(ours.per_cpu_second, r.per_cpu_second)
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
            "| {name} | {} | {} | {} | {} | {} | {} | {ks_tax} | {our_tax:.0} % |",
            ratio(ours.events_per_second, ceiling.raw.events_per_second),
            over(eos),
            per_cpu(eos),
            over(alos),
            over(redis),
            per_cpu(redis)
        );
        ratios_json.push(json!({
            "dataset": name,
            "geostate_over_raw_consume": ours.events_per_second / ceiling.raw.events_per_second,
            "geostate_over_kstreams_eos_per_cpu_second": eos.map(|r| ours.per_cpu_second / r.per_cpu_second),
            "geostate_over_redis_per_cpu_second": redis.map(|r| ours.per_cpu_second / r.per_cpu_second),
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

    ratios_json
}
