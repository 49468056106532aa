//! `chaos`: the failover drills an operator runs against a running deployment before
//! trusting it (`chaos/run <drill>`; the local cluster of `make up` by default). Each drill
//! runs steady load in every region through the public gRPC API, injects one fault, heals
//! it, keeps the load on, and ends in a verdict:
//!
//! - **RTO** per scope: the longest stretch without a successful operation from the fault
//!   on: commutative writes in each region, owned-key writes (per key, in whichever region
//!   holds it), reads in each region; each against a budget;
//! - **RPO**: acknowledged increments missing from the final counters (must be 0), and
//!   **duplicates**: increments counted beyond every acknowledged and indeterminate one
//!   (must be 0);
//! - **convergence**: from the heal until a write made in every region right after it is
//!   read back in every region;
//! - **latency** of acknowledged writes and reads before, during and after the fault.
//!
//! ```text
//! chaos kill-region|pause-holder|broker-loss|mirror-backlog|s3-outage|region-wipe|isolate-region|clock-skew \
//!       [--cluster regions/local/run/cluster.json] [--region eu-west-1] [--out chaos/reports]
//! ```
//!
//! Writes `<out>/<drill>.md` and `<out>/<drill>.json`; exits 1 when the verdict is fail.

mod alerts;
mod fault;
mod ledger;
mod load;
mod report;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Parser, ValueEnum};
use geostate_jepsen::control::{grpc, now_nanos, read_cluster};
use serde::Serialize;
use tokio::sync::Mutex;

use load::{Kind, Load, converge_marker, run_client, settle};
use report::{DrillRun, Report};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
enum Drill {
    /// The whole region down: its node and its Kafka broker SIGKILLed, restarted 10 s later.
    KillRegion,
    /// The node holding an owned key's lease SIGSTOPped for three lease durations.
    PauseHolder,
    /// The region's Kafka broker SIGKILLed, restarted 10 s later (the node stays up).
    BrokerLoss,
    /// MirrorMaker 2 stopped for 20 s under load, then started: the backlog drains.
    MirrorBacklog,
    /// The S3 server (the checkpoint store) SIGKILLed for 40 s (over two checkpoint
    /// intervals), then started again: checkpoints fail meanwhile, nothing else stops.
    S3Outage,
    /// The node SIGKILLed and its data dir deleted: it restores from the newest S3
    /// checkpoint and its own deltas topic.
    RegionWipe,
    /// The region cut off the other sites (other region, witness, MirrorMaker 2) for 15 s:
    /// packets dropped by iptables (`cluster.py net isolate`), both directions.
    IsolateRegion,
    /// The region's node restarted with its wall clock 2 s ahead (beyond
    /// `max-clock-offset`) for 15 s, then restarted with the clock right (`clock-offset`).
    ClockSkew,
    /// The region scaled out under load from one node to three (`cluster.py node add`, 8 s
    /// apart) and back (`node remove`): partitions move live each time; writes are judged
    /// per partition (RTO within a move's budget) and no acknowledged increment may be
    /// lost or applied twice.
    ScaleOutUnderLoad,
    /// The links of the region whose member leads the lease group (a region is made to
    /// lead first: the witness is frozen until one does) to the other sites (other
    /// region, witness, MirrorMaker 2) delayed 100 ± 50 ms per packet (`cluster.py net
    /// delay`) for `--wan-secs`: a slow link is not a failure, so no shard's lease may
    /// change hands or epoch (a false failover), and owned keys keep being written.
    WanDelay,
}

#[derive(Parser)]
#[command(about = "A failover drill against a running geostate cluster, ending in a verdict")]
struct Args {
    #[arg(value_enum)]
    drill: Drill,
    #[arg(long, default_value = "regions/local/run/cluster.json")]
    cluster: PathBuf,
    /// The region the fault hits (default: the first in `cluster.json`); `pause-holder`
    /// always pauses the holder of the first owned key, `wan-delay` always delays the
    /// region leading the lease group.
    #[arg(long)]
    region: Option<String>,
    /// Seconds of steady load before the fault.
    #[arg(long, default_value_t = 15)]
    before: u64,
    /// Seconds of load after the heal.
    #[arg(long, default_value_t = 20)]
    after: u64,
    #[arg(long, default_value = "chaos/reports")]
    out: PathBuf,
    /// Seconds the `wan-delay` drill keeps the links delayed.
    #[arg(long, default_value_t = 60)]
    wan_secs: u64,
}

/// Keys of each kind the load spreads over.
pub(crate) const KEYS: usize = 8;
/// A scope a fault leaves alone may pause no longer than this.
pub(crate) const UNAFFECTED_BUDGET: Duration = Duration::from_secs(3);
/// A scope the fault takes down must be back within this after the heal.
pub(crate) const RECOVERY_BUDGET: Duration = Duration::from_secs(30);
/// Owned keys of a holder that died, froze or lost its Kafka must be writable elsewhere
/// within this: the lease (2 s in the local cluster) runs out, or the holder releases it,
/// and another region takes the shard.
pub(crate) const LEASE_FAILOVER_BUDGET: Duration = Duration::from_secs(10);
/// A partition's writes may stop no longer than this while it moves between a region's
/// nodes (the old owner ships its last round, the new one catches up from the deltas).
pub(crate) const MOVE_BUDGET: Duration = Duration::from_secs(5);
/// Longest wait, before the load, for the alerts the drill must fire to be quiet (the
/// slowest to clear, `GeostateConsumerRestarts` and `GeostateCheckpointsFailing`, look five
/// minutes back: `chaos/run all` runs broker-loss a few minutes after kill-region).
const ALERTS_QUIET: Duration = Duration::from_secs(360);
/// Longest wait for every region to agree once the load stops.
pub(crate) const SETTLE: Duration = Duration::from_secs(120);

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let result = tokio::runtime::Runtime::new()
        .context("starting the runtime")
        .and_then(|rt| rt.block_on(drill(args)));
    match result {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::from(1),
        Err(e) => {
            eprintln!("chaos: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}

async fn drill(args: Args) -> anyhow::Result<bool> {
    let cluster = read_cluster(&args.cluster)?;
    let regions: Vec<String> = cluster.regions.keys().cloned().collect();
    let region = match args.drill {
        // set up before the load starts: making a region lead stalls the lease group
        Drill::WanDelay => fault::leading_region(&cluster).await?,
        _ => args.region.clone().unwrap_or_else(|| regions[0].clone()),
    };
    anyhow::ensure!(
        cluster.regions.contains_key(&region),
        "no region {region} in {}",
        args.cluster.display()
    );
    // the alerts this fault must fire are quiet before it (a restart a minute ago would
    // still fire the one a restart fires)
    if let Some(p) = &cluster.prometheus {
        alerts::wait_quiet(&p.url, args.drill, &region, ALERTS_QUIET).await?;
    }
    let tag = format!("chaos-{}", std::process::id());
    let counters: Vec<String> = (0..KEYS).map(|i| format!("trips/{tag}-{i}")).collect();
    let owned: Vec<String> = (0..KEYS).map(|i| format!("surge/{tag}-{i}")).collect();

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let load = Arc::new(Load {
        started: Instant::now(),
        ops: Mutex::new(Vec::new()),
        stop: stop_rx,
    });
    let mut clients = Vec::new();
    for (r, name) in regions.iter().enumerate() {
        let addr = grpc(&cluster.regions[name])?;
        for (c, (kind, keys)) in [
            (Kind::Write, &counters),
            (Kind::Write, &counters),
            (Kind::OwnedWrite, &owned),
            (Kind::OwnedWrite, &owned),
            (Kind::Read, &counters),
        ]
        .into_iter()
        .enumerate()
        {
            let seed = (r * 16 + c + 1) as u64;
            clients.push(tokio::spawn(run_client(
                load.clone(),
                kind,
                name.clone(),
                addr.clone(),
                keys.clone(),
                seed,
            )));
        }
    }

    println!("{:?}: {} s of steady load", args.drill, args.before);
    tokio::time::sleep(Duration::from_secs(args.before)).await;
    let fault_ns = load.now_ns();
    println!("{:?}: fault on {region}", args.drill);
    let fault = fault::inject(&args, &cluster, &region, &owned[0], &counters).await?;
    let heal_ns = load.now_ns();
    println!(
        "{:?}: healed after {:.1} s",
        args.drill,
        (heal_ns - fault_ns) as f64 / 1e9
    );
    let convergence = converge_marker(&cluster, &regions, &tag).await?;
    let elapsed = Duration::from_nanos(load.now_ns() - heal_ns);
    tokio::time::sleep(Duration::from_secs(args.after).saturating_sub(elapsed)).await;
    stop_tx.send_replace(true);
    for c in clients {
        c.await??;
    }
    let end_ns = load.now_ns();
    let finals = settle(&cluster, &regions, &counters, now_nanos()).await?;
    // the alerts that fired from the fault on (those with a `for` have had the heal's
    // `--after` seconds to fire)
    let alerts = match &cluster.prometheus {
        Some(p) => {
            let window = Duration::from_nanos(load.now_ns() - fault_ns);
            let fired = alerts::fired(&p.url, window).await?;
            Some(alerts::Alerts::judge(args.drill, &region, fired))
        }
        None => None,
    };
    let ops = load.ops.lock().await.clone();
    let mut run = DrillRun {
        regions: &regions,
        fault: &fault,
        ops: &ops,
        finals: &finals,
        convergence,
        fault_ns,
        heal_ns,
        end_ns,
        alerts: alerts.as_ref(),
        ledger: Vec::new(),
    };
    for key in run.counters_off() {
        // Kafka reads that block: off the async threads
        let (cluster, owned, ops) = (cluster.clone(), key.to_owned(), ops.clone());
        let read = tokio::task::spawn_blocking(move || ledger::ledger(&cluster, &owned, &ops));
        match read.await.map_err(anyhow::Error::from).and_then(|r| r) {
            Ok(lines) => run.ledger.extend(lines),
            Err(e) => run.ledger.push(format!("{key}: no ledger: {e:#}")),
        }
    }
    let report = Report::new(&args, &run);
    report.write(&args.out, args.drill)?;
    Ok(report.pass)
}
