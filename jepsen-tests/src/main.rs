//! `jepsen`: the Jepsen-style harness against the local cluster (`make up` / `make test`
//! start one; `cluster.json` names it). Concurrent clients in every region run one
//! workload through the public gRPC API while a nemesis injects faults on a schedule;
//! then everything is healed, the regions are given time to converge, every key is read
//! in every region, and the checkers decide from the history alone.
//!
//! ```text
//! jepsen --workload pn-counter|g-counter|shared-register|owned-register|owned-append \
//!        --nemesis pause-holder,kill,mirror,broker,wipe \
//!        --seconds 60 --seed 7 --out jepsen-tests/results/<run>
//! ```
//!
//! Writes `history.jsonl` (every operation: invoke, then ok / fail / info), `nemesis.jsonl`
//! (every fault with its start and end), `results.json` and `summary.md`; exits 1 on any
//! anomaly (including a requested fault that never fired).

mod client;
mod converge;
mod nemesis;
mod report;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Parser, ValueEnum};
use geostate_jepsen::control::{self, heal, read_cluster};
use geostate_jepsen::windowed;
use geostate_proto::workload::Rng;
use serde::Serialize;
use tokio::sync::Mutex;

use client::{Client, Run};
use converge::converge;
use nemesis::nemesis;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
enum Workload {
    /// `add` of ±1..5 on pn-counters with unique idempotency ids, in every region.
    #[value(alias = "counter")]
    PnCounter,
    /// `add` of 1..5 on g-counters with unique idempotency ids, in every region.
    GCounter,
    /// writes of unique values and reads of shared (last-writer-wins) registers, in every
    /// region.
    SharedRegister,
    /// owned registers, from every region: leaseholder reads, writes of unique values,
    /// and compare-and-sets from the value last read (the non-holder's are refused).
    OwnedRegister,
    /// owned lists, from every region: leaseholder reads, and appends of unique elements
    /// by read-then-compare-and-set at the holder.
    OwnedAppend,
    /// `add` of 1..5 with unique ids to windowed g-counters (1-minute tumbling windows,
    /// `requests/`), each with an event time near the run's clock, one in ten up to 80 s
    /// early (some late), and reads of recent windows, in every region.
    WindowedCounter,
}

/// The windows of `requests/` in the region files.
pub(crate) const WINDOW_MS: u64 = 60_000;
/// How far past a window's end an event time closes it: `requests/` allows 10 s of
/// lateness (`regions/*.toml`), and a watermark trails event time by 5 s.
const CLOSE_AFTER_MS: u64 = 20_000;

/// The wall clock in milliseconds (the nodes' clock: one machine).
fn wall_ms() -> u64 {
    geostate_jepsen::control::now_nanos() / 1_000_000
}

impl Workload {
    fn prefix(self) -> &'static str {
        match self {
            Workload::WindowedCounter => "requests/",
            Workload::PnCounter => "drivers/",
            Workload::GCounter => "trips/",
            Workload::SharedRegister => "zones/",
            Workload::OwnedRegister | Workload::OwnedAppend => "surge/",
        }
    }

    fn owned(self) -> bool {
        matches!(self, Workload::OwnedRegister | Workload::OwnedAppend)
    }

    fn counter(self) -> bool {
        matches!(self, Workload::PnCounter | Workload::GCounter)
    }

    fn windowed(self) -> bool {
        self == Workload::WindowedCounter
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
enum Nemesis {
    /// SIGSTOP the node holding the first key's lease past the lease, then SIGCONT.
    PauseHolder,
    /// SIGKILL a node, then restart it (`cluster.py up`).
    Kill,
    /// stop MirrorMaker 2, let a backlog build, start it again.
    Mirror,
    /// SIGKILL a region's Kafka broker, start it again on the same log dir
    /// (`cluster.py kafka`).
    Broker,
    /// SIGKILL a node and delete its data dir: it restarts from the newest S3 checkpoint
    /// and its own deltas topic (`restore-on-empty`). Owned workloads wipe the holder of a
    /// key (the keys in turn), the others the regions in turn.
    Wipe,
    /// Cut a region off the other sites (the other region, the witness, MirrorMaker 2) in
    /// both directions for 8 s: packets dropped by iptables (`cluster.py net isolate`).
    Partition,
    /// Like `partition`, one way: the region's processes cannot open connections to the
    /// other sites, which can still reach it.
    PartitionOneWay,
    /// Restart a node with its wall clock 300 ms ahead (within `max-clock-offset`, 500 ms)
    /// for 8 s, then restart it with the clock right (`cluster.py node restart
    /// --clock-offset`, the node's `clock-offset`).
    ClockWithin,
    /// Like `clock-within`, 2 s ahead: beyond `max-clock-offset` (the guard that refuses
    /// a remote delta stamped too far ahead; README says what the runs showed).
    ClockBeyond,
    /// WAN latency on a region's links to the other sites for 8 s: every packet of those
    /// connections held 100 ± 50 ms (`cluster.py net delay`, iptables NFQUEUE and
    /// `chaos/wan-delay`). A delay that held no packet counts as never fired.
    Wan,
    /// Add a node to a region (`cluster.py node add`): the region's group moves some of
    /// its partitions to it, caught up from the region's deltas; after 6 s remove it
    /// (`node remove`: it hands them back). The regions in turn.
    Scale,
    /// Kill one node of several: add a node to a region, after 4 s SIGKILL it or (every
    /// other time per region) the region's first node, its lease group member, mid-ingest
    /// (the other node evicts it from the group: its partitions move within about a
    /// second), 12 s later start it again
    /// (`up`: it takes its partitions back), then remove the added node. The regions in
    /// turn.
    KillNode,
}

#[derive(Parser)]
#[command(about = "Jepsen-style run against the local geostate cluster")]
struct Args {
    #[arg(long, default_value = "regions/local/run/cluster.json")]
    cluster: PathBuf,
    #[arg(long, value_enum)]
    workload: Workload,
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "pause-holder,kill,mirror"
    )]
    nemesis: Vec<Nemesis>,
    /// How long the clients run at least (faults included). A run lasts longer when the
    /// faults are slow: every nemesis of the list fires once, and the clients go on for
    /// `--interval` after the last fault healed.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[arg(long, default_value_t = 3)]
    clients_per_region: u64,
    #[arg(long, default_value_t = 4)]
    keys: usize,
    /// Seconds between faults (each fault heals before the next starts).
    #[arg(long, default_value_t = 8)]
    interval: u64,
    #[arg(long)]
    out: PathBuf,
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let result = tokio::runtime::Runtime::new()
        .context("starting the runtime")
        .and_then(|rt| rt.block_on(run(args)));
    match result {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::from(1),
        Err(e) => {
            eprintln!("jepsen: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}

async fn run(args: Args) -> anyhow::Result<bool> {
    std::fs::create_dir_all(&args.out)?;
    let cluster = read_cluster(&args.cluster)?;
    let regions: Vec<String> = cluster.regions.keys().cloned().collect();
    let tag = format!("jepsen-{}-{}", args.seed, std::process::id());
    let keys: Vec<String> = (0..args.keys)
        .map(|i| format!("{}{tag}-{i}", args.workload.prefix()))
        .collect();
    // the ownership shard of each key, as the server maps it
    let shards = Arc::new(control::shards_of(&cluster.regions[&regions[0]], &keys).await?);

    let run = Arc::new(Run {
        started: Instant::now(),
        history: Mutex::new(Vec::new()),
        event_base_ms: wall_ms(),
    });
    let deadline = Instant::now() + Duration::from_secs(args.seconds);
    let (stop_clients, clients_stop) = tokio::sync::watch::channel(false);
    let stride = regions.len() as u64 * args.clients_per_region;
    let client = |region: &String, process: u64, at: usize| -> anyhow::Result<Client> {
        Ok(Client {
            run: run.clone(),
            region: region.clone(),
            at,
            addrs: control::node_grpcs(&cluster.regions[region])?,
            cluster: args.cluster.clone(),
            refused: Default::default(),
            keys: keys.clone(),
            workload: args.workload,
            shards: shards.clone(),
            stride,
            rng: Rng(args.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (process + 1)),
            last_read: BTreeMap::new(),
        })
    };
    let mut clients = Vec::new();
    for (r, region) in regions.iter().enumerate() {
        let nodes = control::node_grpcs(&cluster.regions[region])?.len();
        for c in 0..args.clients_per_region {
            let first_process = (r as u64) * args.clients_per_region + c;
            // the region's clients spread over its nodes
            let client = client(region, first_process, c as usize % nodes)?;
            clients.push(tokio::spawn(
                client.run(first_process, clients_stop.clone()),
            ));
        }
    }
    let faults = nemesis(&args, &run, &keys, deadline).await?;
    // the clients see the last fault's recovery, and run for `--seconds` at least
    tokio::time::sleep(Duration::from_secs(args.interval)).await;
    tokio::time::sleep_until(deadline.into()).await;
    stop_clients.send_replace(true);
    for c in clients {
        c.await??;
    }

    // heal everything, then let the regions converge
    heal(&args.cluster).await?;
    let end = run.event_time_now();
    if args.workload.windowed() {
        // one add per key and region past the close of the run's last window: every
        // watermark passes the run's windows, which then close everywhere. At that time
        // once the wall clock is there: a node refuses an event time ahead of its clock.
        let ahead = end - end % WINDOW_MS + WINDOW_MS + CLOSE_AFTER_MS;
        tokio::time::sleep(Duration::from_millis(ahead.saturating_sub(wall_ms()))).await;
        for (r, region) in regions.iter().enumerate() {
            let process = stride * 1_000 + r as u64;
            let closer = client(region, process, 0)?;
            let mut state = closer
                .connect()
                .with_context(|| format!("a client of {region}"))?;
            for (n, key) in keys.iter().enumerate() {
                closer
                    .add(&mut state, process, key, 1, n as u64, Some(ahead))
                    .await;
            }
        }
    }
    // reads went back up to three windows before the first add
    let (from, to) = (run.event_base_ms - 4 * WINDOW_MS, end);
    // windows settle by their completeness certificate, other keys by `converge`'s
    let (finals, unsettled) = if args.workload.windowed() {
        let finals = converge::windows(
            &args.cluster,
            &regions,
            &keys,
            (from, to),
            Duration::from_secs(90),
        )
        .await?;
        (finals, Vec::new())
    } else {
        converge(&args.cluster, &regions, &keys, Duration::from_secs(90)).await?
    };
    // each window final everywhere is in every region's outputs topic, once
    let outputs = if args.workload.windowed() {
        let counted = |by: &BTreeMap<String, converge::FinalRead>| {
            by.values().any(|f| f.value.unwrap_or(0) != 0)
        };
        let wanted = finals.values().filter(|by| counted(by)).count();
        let prefix = format!("{}{tag}-", args.workload.prefix());
        let by_region = converge::outputs(
            &args.cluster,
            &regions,
            &prefix,
            wanted,
            Duration::from_secs(30),
        )
        .await?;
        let mut problems =
            windowed::check_outputs(&report::values(&finals), &by_region, (from, to));
        // and the PostgreSQL table the regions' sinks write them into, one row each
        if let Some(rows) =
            converge::table(&args.cluster, &prefix, wanted, Duration::from_secs(30)).await?
        {
            problems.extend(windowed::check_table(
                &report::values(&finals),
                &rows,
                (from, to),
            ));
        }
        problems
    } else {
        unsettled
    };
    let history = run.history.lock().await.clone();
    report::write(&args, &history, &faults, &finals, outputs)
}
