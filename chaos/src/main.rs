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
//! chaos kill-region|pause-holder|broker-loss|mirror-backlog|region-wipe|isolate-region|clock-skew \
//!       [--cluster regions/local/run/cluster.json] [--region eu-west-1] [--out chaos/reports]
//! ```
//!
//! Writes `<out>/<drill>.md` and `<out>/<drill>.json`; exits 1 when the verdict is fail.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Parser, ValueEnum};
use geostate::pb;
use geostate::workload::Rng;
use geostate_jepsen::control::{
    ClusterFile, broker_outage, clock_offset, cluster_script, grpc, hash_shards, heal, holder,
    isolate, read_cluster, signal, state_client, wipe_node,
};
use serde::Serialize;
use tokio::sync::Mutex;
use tonic::Code;

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
    /// The node SIGKILLed and its data dir deleted: it restores from the newest S3
    /// checkpoint and its own deltas topic.
    RegionWipe,
    /// The region cut off the other sites (other region, witness, MirrorMaker 2) for 15 s:
    /// packets dropped by iptables (`cluster.py net isolate`), both directions.
    IsolateRegion,
    /// The region's node restarted with its wall clock 2 s ahead (beyond
    /// `max-clock-offset`) for 15 s, then restarted with the clock right (`clock-offset`).
    ClockSkew,
}

#[derive(Parser)]
#[command(about = "A failover drill against a running geostate cluster, ending in a verdict")]
struct Args {
    #[arg(value_enum)]
    drill: Drill,
    #[arg(long, default_value = "regions/local/run/cluster.json")]
    cluster: PathBuf,
    /// The region the fault hits (default: the first in `cluster.json`); `pause-holder`
    /// always pauses the holder of the first owned key.
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
}

/// Keys of each kind the load spreads over.
const KEYS: usize = 8;
/// A scope a fault leaves alone may pause no longer than this.
const UNAFFECTED_BUDGET: Duration = Duration::from_secs(3);
/// A scope the fault takes down must be back within this after the heal.
const RECOVERY_BUDGET: Duration = Duration::from_secs(30);
/// Owned keys of a holder that died or froze must be writable elsewhere within this: the
/// lease (2 s in the local cluster) runs out and another region takes the shard.
const LEASE_FAILOVER_BUDGET: Duration = Duration::from_secs(10);
/// Longest wait for every region to agree once the load stops.
const SETTLE: Duration = Duration::from_secs(120);

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
enum Kind {
    /// `add 1` to a shared g-counter with a unique idempotency id.
    Write,
    /// `set` of an owned register (refused outside the holder's region).
    OwnedWrite,
    Read,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
enum Outcome {
    Ok,
    /// Certainly not applied (refused).
    Fail,
    /// Indeterminate: timed out or unavailable; may have been applied.
    Info,
}

#[derive(Clone, Debug, Serialize)]
struct Op {
    kind: Kind,
    region: String,
    key: String,
    start_ns: u64,
    end_ns: u64,
    outcome: Outcome,
}

struct Load {
    started: Instant,
    ops: Mutex<Vec<Op>>,
    stop: tokio::sync::watch::Receiver<bool>,
}

impl Load {
    fn now_ns(&self) -> u64 {
        self.started.elapsed().as_nanos() as u64
    }
}

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

/// One client loop of one kind in one region until the load stops.
async fn run_client(
    load: Arc<Load>,
    kind: Kind,
    region: String,
    addr: String,
    keys: Vec<String>,
    seed: u64,
) -> anyhow::Result<()> {
    let mut state = state_client(&addr)?;
    let mut rng = Rng(seed);
    let mut n = 0u64;
    let mut stop = load.stop.clone();
    while !*stop.borrow() {
        n += 1;
        let key = keys[rng.below(keys.len() as u64) as usize].clone();
        let start_ns = load.now_ns();
        let result = match kind {
            Kind::Write => state
                .update(pb::UpdateRequest {
                    key: key.clone(),
                    op: Some(pb::update_request::Op::Add(1)),
                    id: format!("{region}-{seed}-{n}"),
                })
                .await
                .map(drop),
            Kind::OwnedWrite => state
                .update(pb::UpdateRequest {
                    key: key.clone(),
                    op: Some(pb::update_request::Op::Set(n.to_string().into_bytes())),
                    id: String::new(),
                })
                .await
                .map(drop),
            Kind::Read => match state
                .get(pb::GetRequest {
                    key: key.clone(),
                    ..Default::default()
                })
                .await
            {
                Err(s) if s.code() == Code::NotFound => Ok(()),
                other => other.map(drop),
            },
        };
        let outcome = match result {
            Ok(()) => Outcome::Ok,
            Err(s)
                if matches!(
                    s.code(),
                    Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange
                ) =>
            {
                Outcome::Fail
            }
            Err(_) => Outcome::Info,
        };
        let op = Op {
            kind,
            region: region.clone(),
            key,
            start_ns,
            end_ns: load.now_ns(),
            outcome,
        };
        load.ops.lock().await.push(op);
        tokio::select! {
            _ = stop.changed() => {}
            () = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
    }
    Ok(())
}

/// What the fault did: which region it hit and when it was healed.
struct Fault {
    target: String,
    /// Regions whose writes and reads the fault is expected to take down.
    affected: Vec<String>,
    /// How long owned-key writes may stop (per key, in whichever region holds it).
    owned_budget: Option<Duration>,
}

async fn inject(
    args: &Args,
    cluster: &ClusterFile,
    region: &str,
    owned_key: &str,
) -> anyhow::Result<Fault> {
    let path = &args.cluster;
    let fault = match args.drill {
        Drill::KillRegion => {
            let node_pid = cluster.regions[region].pid.context("node pid")?;
            signal("-KILL", node_pid).await;
            // the broker's restart is followed by the node's (`up`)
            broker_outage(path, region, Duration::from_secs(10)).await?;
            Fault {
                target: format!("node and Kafka broker of {region}"),
                affected: vec![region.to_string()],
                owned_budget: Some(LEASE_FAILOVER_BUDGET),
            }
        }
        Drill::PauseHolder => {
            let hash_shards = hash_shards(&cluster.regions[region]).await?;
            let (holder, pid) = holder(cluster, owned_key, hash_shards).await?;
            signal("-STOP", pid).await;
            tokio::time::sleep(Duration::from_secs(6)).await;
            signal("-CONT", pid).await;
            Fault {
                target: format!("node of {holder}, holding {owned_key}"),
                affected: vec![holder],
                owned_budget: Some(LEASE_FAILOVER_BUDGET),
            }
        }
        Drill::BrokerLoss => {
            broker_outage(path, region, Duration::from_secs(10)).await?;
            Fault {
                target: format!("Kafka broker of {region}"),
                affected: vec![region.to_string()],
                // the node keeps its leases (the lease group does not use Kafka), so its
                // owned keys wait for the broker: the fault's whole length
                owned_budget: None,
            }
        }
        Drill::MirrorBacklog => {
            cluster_script(path, &["mirror", "stop"]).await?;
            tokio::time::sleep(Duration::from_secs(20)).await;
            cluster_script(path, &["mirror", "start"]).await?;
            Fault {
                target: "MirrorMaker 2".into(),
                affected: vec![],
                owned_budget: Some(UNAFFECTED_BUDGET),
            }
        }
        Drill::RegionWipe => {
            wipe_node(path, cluster, region).await?;
            Fault {
                target: format!("node of {region}, data dir wiped"),
                affected: vec![region.to_string()],
                owned_budget: Some(LEASE_FAILOVER_BUDGET),
            }
        }
        Drill::IsolateRegion => {
            isolate(path, region, "both", Duration::from_secs(15)).await?;
            Fault {
                target: format!("network of {region} (both directions)"),
                // both regions keep taking commutative writes and serving reads: that is
                // what active-active is for
                affected: vec![],
                // the cut-off region's leases run out; the majority side takes its shards
                owned_budget: Some(LEASE_FAILOVER_BUDGET),
            }
        }
        Drill::ClockSkew => {
            clock_offset(path, region, 2000, Duration::from_secs(15)).await?;
            Fault {
                target: format!("clock of the node of {region}, +2 s"),
                // two restarts of the node
                affected: vec![region.to_string()],
                owned_budget: Some(LEASE_FAILOVER_BUDGET),
            }
        }
    };
    // whatever else the fault left behind
    heal(path).await?;
    Ok(fault)
}

async fn drill(args: Args) -> anyhow::Result<bool> {
    let cluster = read_cluster(&args.cluster)?;
    let regions: Vec<String> = cluster.regions.keys().cloned().collect();
    let region = args.region.clone().unwrap_or_else(|| regions[0].clone());
    anyhow::ensure!(
        cluster.regions.contains_key(&region),
        "no region {region} in {}",
        args.cluster.display()
    );
    let tag = format!("chaos-{}", std::process::id());
    let counters: Vec<String> = (0..KEYS).map(|i| format!("requests/{tag}-{i}")).collect();
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
    let fault = inject(&args, &cluster, &region, &owned[0]).await?;
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
    let finals = settle(&cluster, &regions, &counters).await?;
    let ops = load.ops.lock().await.clone();
    let report = Report::new(
        &args,
        &regions,
        &fault,
        &ops,
        &finals,
        convergence,
        fault_ns,
        heal_ns,
        end_ns,
    );
    report.write(&args.out, args.drill)?;
    Ok(report.pass)
}

/// Right after the heal, every region adds 1 to one marker key (retrying until it is
/// acknowledged); the time until every region reads the full count.
async fn converge_marker(
    cluster: &ClusterFile,
    regions: &[String],
    tag: &str,
) -> anyhow::Result<Option<Duration>> {
    let healed = Instant::now();
    let key = format!("requests/{tag}-marker");
    for region in regions {
        let mut state = state_client(&grpc(&cluster.regions[region])?)?;
        let add = pb::UpdateRequest {
            key: key.clone(),
            op: Some(pb::update_request::Op::Add(1)),
            id: format!("marker-{region}"),
        };
        while state.update(add.clone()).await.is_err() {
            if healed.elapsed() > SETTLE {
                return Ok(None);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    for region in regions {
        let mut state = state_client(&grpc(&cluster.regions[region])?)?;
        loop {
            let read = state
                .get(pb::GetRequest {
                    key: key.clone(),
                    ..Default::default()
                })
                .await;
            if read.is_ok_and(|v| counter(&v.into_inner()) == regions.len() as i64) {
                break;
            }
            if healed.elapsed() > SETTLE {
                return Ok(None);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(Some(healed.elapsed()))
}

fn counter(v: &pb::Value) -> i64 {
    match v.value {
        Some(pb::value::Value::Counter(n)) => n,
        _ => 0,
    }
}

/// Every counter in every region once they agree (or after [`SETTLE`]): key → region →
/// value.
async fn settle(
    cluster: &ClusterFile,
    regions: &[String],
    keys: &[String],
) -> anyhow::Result<BTreeMap<String, BTreeMap<String, i64>>> {
    let deadline = Instant::now() + SETTLE;
    loop {
        let mut finals: BTreeMap<String, BTreeMap<String, i64>> = BTreeMap::new();
        for region in regions {
            let mut state = state_client(&grpc(&cluster.regions[region])?)?;
            if let Ok(values) = state
                .batch_get(pb::BatchGetRequest {
                    keys: keys.to_vec(),
                })
                .await
            {
                for v in values.into_inner().values {
                    finals
                        .entry(v.key.clone())
                        .or_default()
                        .insert(region.clone(), counter(&v));
                }
            }
        }
        let agreed = finals.len() == keys.len()
            && finals.values().all(|by| {
                by.len() == regions.len() && by.values().all(|v| Some(v) == by.values().next())
            });
        if agreed || Instant::now() > deadline {
            return Ok(finals);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// One scope's longest stretch without a success, from the fault to the end of the load.
#[derive(Serialize)]
struct Rto {
    scope: String,
    longest_gap_ms: f64,
    budget_ms: f64,
    pass: bool,
}

/// Latency of successful operations in one phase.
#[derive(Serialize)]
struct Latency {
    scope: String,
    phase: &'static str,
    count: usize,
    p50_ms: f64,
    p99_ms: f64,
}

#[derive(Serialize)]
struct Report {
    drill: Drill,
    target: String,
    fault_at_s: f64,
    fault_lasted_s: f64,
    operations: usize,
    ok: usize,
    fail: usize,
    info: usize,
    rto: Vec<Rto>,
    /// Acknowledged increments missing from the final counters.
    rpo_lost_writes: i64,
    /// Increments counted beyond every acknowledged and indeterminate one.
    duplicates: i64,
    regions_agree: bool,
    /// From the heal until a write made in every region right after it was read back in
    /// every region; `None` if that took longer than two minutes.
    convergence_ms: Option<f64>,
    latency: Vec<Latency>,
    failures: Vec<String>,
    pass: bool,
}

/// The longest time between successes at `times` (sorted) from `from_ns` to `to_ns`.
fn longest_gap(times: &[u64], from_ns: u64, to_ns: u64) -> u64 {
    let mut previous = times
        .iter()
        .rev()
        .find(|&&t| t < from_ns)
        .copied()
        .unwrap_or(from_ns);
    let mut longest = 0;
    for &t in times.iter().filter(|&&t| t >= from_ns && t <= to_ns) {
        longest = longest.max(t - previous);
        previous = t;
    }
    longest.max(to_ns - previous)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

impl Report {
    #[allow(clippy::too_many_arguments)]
    fn new(
        args: &Args,
        regions: &[String],
        fault: &Fault,
        ops: &[Op],
        finals: &BTreeMap<String, BTreeMap<String, i64>>,
        convergence: Option<Duration>,
        fault_ns: u64,
        heal_ns: u64,
        end_ns: u64,
    ) -> Self {
        let fault_budget = Duration::from_nanos(heal_ns - fault_ns) + RECOVERY_BUDGET;
        let successes = |pick: &dyn Fn(&Op) -> bool| {
            let mut t: Vec<u64> = ops
                .iter()
                .filter(|o| o.outcome == Outcome::Ok && pick(o))
                .map(|o| o.end_ns)
                .collect();
            t.sort_unstable();
            t
        };
        let mut rto = Vec::new();
        let mut judge = |scope: String, gap_ns: u64, budget: Duration| {
            let gap_ms = gap_ns as f64 / 1e6;
            let budget_ms = budget.as_secs_f64() * 1e3;
            rto.push(Rto {
                scope,
                longest_gap_ms: gap_ms,
                budget_ms,
                pass: gap_ms <= budget_ms,
            });
        };
        for region in regions {
            let budget = if fault.affected.contains(region) {
                fault_budget
            } else {
                UNAFFECTED_BUDGET
            };
            for (kind, label) in [(Kind::Write, "writes"), (Kind::Read, "reads")] {
                let times = successes(&|o| o.kind == kind && o.region == *region);
                // broker loss leaves reads (served from the node's own store) untouched
                let budget = if kind == Kind::Read && args.drill == Drill::BrokerLoss {
                    UNAFFECTED_BUDGET
                } else {
                    budget
                };
                judge(
                    format!("{label} in {region}"),
                    longest_gap(&times, fault_ns, end_ns),
                    budget,
                );
            }
        }
        let owned_keys: std::collections::BTreeSet<&str> = ops
            .iter()
            .filter(|o| o.kind == Kind::OwnedWrite)
            .map(|o| o.key.as_str())
            .collect();
        let owned_gap = owned_keys
            .iter()
            .map(|key| {
                let times = successes(&|o| o.kind == Kind::OwnedWrite && o.key == *key);
                longest_gap(&times, fault_ns, end_ns)
            })
            .max()
            .unwrap_or(end_ns - fault_ns);
        judge(
            "owned-key writes (any region, worst key)".into(),
            owned_gap,
            fault.owned_budget.unwrap_or(fault_budget),
        );

        // every add is +1: per key, acknowledged ≤ final ≤ acknowledged + indeterminate
        let (mut lost, mut duplicates) = (0, 0);
        for (key, by_region) in finals {
            let count = |outcome| {
                ops.iter()
                    .filter(|o| o.kind == Kind::Write && o.key == *key && o.outcome == outcome)
                    .count() as i64
            };
            let (acked, info) = (count(Outcome::Ok), count(Outcome::Info));
            let last = by_region.values().copied().max().unwrap_or(0);
            lost += (acked - last).max(0);
            duplicates += (last - acked - info).max(0);
        }
        let regions_agree = finals.values().all(|by| {
            by.len() == regions.len() && by.values().all(|v| Some(v) == by.values().next())
        });

        let mut latency = Vec::new();
        for (kind, label) in [
            (Kind::Write, "writes"),
            (Kind::OwnedWrite, "owned-key writes"),
            (Kind::Read, "reads"),
        ] {
            for (phase, from, to) in [
                ("before", 0, fault_ns),
                ("during", fault_ns, heal_ns),
                ("after", heal_ns, end_ns),
            ] {
                let mut ms: Vec<f64> = ops
                    .iter()
                    .filter(|o| {
                        o.kind == kind
                            && o.outcome == Outcome::Ok
                            && o.start_ns >= from
                            && o.start_ns < to
                    })
                    .map(|o| (o.end_ns - o.start_ns) as f64 / 1e6)
                    .collect();
                ms.sort_by(f64::total_cmp);
                latency.push(Latency {
                    scope: label.into(),
                    phase,
                    count: ms.len(),
                    p50_ms: percentile(&ms, 0.5),
                    p99_ms: percentile(&ms, 0.99),
                });
            }
        }

        let mut failures: Vec<String> = rto
            .iter()
            .filter(|r| !r.pass)
            .map(|r| {
                format!(
                    "RTO of {}: {:.0} ms, budget {:.0} ms",
                    r.scope, r.longest_gap_ms, r.budget_ms
                )
            })
            .collect();
        if lost > 0 {
            failures.push(format!("RPO: {lost} acknowledged increments lost"));
        }
        if duplicates > 0 {
            failures.push(format!("{duplicates} increments applied twice"));
        }
        if !regions_agree {
            failures.push(format!(
                "regions disagree {} s after the load stopped",
                SETTLE.as_secs()
            ));
        }
        if convergence.is_none() {
            failures.push("no convergence within two minutes of the heal".into());
        }
        let count = |outcome| ops.iter().filter(|o| o.outcome == outcome).count();
        Report {
            drill: args.drill,
            target: fault.target.clone(),
            fault_at_s: fault_ns as f64 / 1e9,
            fault_lasted_s: (heal_ns - fault_ns) as f64 / 1e9,
            operations: ops.len(),
            ok: count(Outcome::Ok),
            fail: count(Outcome::Fail),
            info: count(Outcome::Info),
            rto,
            rpo_lost_writes: lost,
            duplicates,
            regions_agree,
            convergence_ms: convergence.map(|d| d.as_secs_f64() * 1e3),
            latency,
            pass: failures.is_empty(),
            failures,
        }
    }

    fn write(&self, out: &Path, drill: Drill) -> anyhow::Result<()> {
        std::fs::create_dir_all(out)?;
        let name = serde_json::to_value(drill)?
            .as_str()
            .unwrap_or("drill")
            .to_string();
        std::fs::write(
            out.join(format!("{name}.json")),
            serde_json::to_string_pretty(self)? + "\n",
        )?;
        let mut md = format!(
            "# Drill `{name}`: **{}**\n\n\
             Fault: {} at {:.1} s, healed after {:.1} s. {} operations: {} ok, {} refused, \
             {} indeterminate.\n\n\
             | check | figure | budget | |\n|---|---:|---:|---|\n",
            if self.pass { "pass" } else { "FAIL" },
            self.target,
            self.fault_at_s,
            self.fault_lasted_s,
            self.operations,
            self.ok,
            self.fail,
            self.info,
        );
        for r in &self.rto {
            md.push_str(&format!(
                "| RTO, {} | {:.0} ms | {:.0} ms | {} |\n",
                r.scope,
                r.longest_gap_ms,
                r.budget_ms,
                if r.pass { "pass" } else { "FAIL" }
            ));
        }
        let mark = |ok: bool| if ok { "pass" } else { "FAIL" };
        md.push_str(&format!(
            "| RPO, acknowledged increments lost | {} | 0 | {} |\n\
             | duplicate applications | {} | 0 | {} |\n\
             | regions agree once the load stops | {} | yes | {} |\n\
             | convergence after the heal | {} | {} s | {} |\n",
            self.rpo_lost_writes,
            mark(self.rpo_lost_writes == 0),
            self.duplicates,
            mark(self.duplicates == 0),
            if self.regions_agree { "yes" } else { "no" },
            mark(self.regions_agree),
            self.convergence_ms
                .map_or("none".into(), |ms| format!("{ms:.0} ms")),
            SETTLE.as_secs(),
            mark(self.convergence_ms.is_some()),
        ));
        md.push_str(
            "\nLatency of successful operations (ms):\n\n\
             | operation | phase | count | p50 | p99 |\n|---|---|---:|---:|---:|\n",
        );
        for l in &self.latency {
            md.push_str(&format!(
                "| {} | {} | {} | {:.1} | {:.1} |\n",
                l.scope, l.phase, l.count, l.p50_ms, l.p99_ms
            ));
        }
        if !self.failures.is_empty() {
            md.push_str("\nFailed checks:\n\n");
            for f in &self.failures {
                md.push_str(&format!("- {f}\n"));
            }
        }
        std::fs::write(out.join(format!("{name}.md")), &md)?;
        print!("{md}");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_gap_spans_the_fault_and_runs_to_the_end_without_recovery() {
        // successes at 1, 2, then 10 and 11 s; the fault starts at 3 s
        let s = 1_000_000_000;
        let times = [s, 2 * s, 10 * s, 11 * s];
        assert_eq!(longest_gap(&times, 3 * s, 12 * s), 8 * s);
        // nothing after the fault: the gap runs to the end
        assert_eq!(longest_gap(&times[..2], 3 * s, 12 * s), 10 * s);
        // no success at all before or after: the whole window
        assert_eq!(longest_gap(&[], 3 * s, 12 * s), 9 * s);
    }

    #[test]
    fn percentiles_of_a_sorted_sample() {
        let sample: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&sample, 0.5), 51.0);
        assert_eq!(percentile(&sample, 0.99), 99.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
    }
}
