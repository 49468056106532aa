//! `jepsen`: the Jepsen-style harness against the local cluster (`make up` / `make test`
//! start one; `cluster.json` names it). Concurrent clients in every region run one
//! workload through the public gRPC API while a nemesis injects faults on a schedule;
//! then everything is healed, the regions are given time to converge, every key is read
//! in every region, and the checkers decide from the history alone.
//!
//! ```text
//! jepsen --workload counter|owned-register --nemesis pause-holder,kill,mirror,broker,wipe \
//!        --seconds 60 --seed 7 --out jepsen-tests/results/<run>
//! ```
//!
//! Writes `history.jsonl` (every operation: invoke, then ok / fail / info), `nemesis.jsonl`
//! (every fault with its start and end), `results.json` and `summary.md`; exits 1 on any
//! anomaly (including a requested fault that never fired).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Parser, ValueEnum};
use geostate::pb;
use geostate::pb::state_client::StateClient;
use geostate::workload::Rng;
use geostate_jepsen::control::{
    self, cluster_script, grpc, heal, holder, read_cluster, signal, target_region,
};
use geostate_jepsen::history::{Event, EventType, Function};
use geostate_jepsen::{availability, counter, fencing, register};
use serde::Serialize;
use tokio::sync::Mutex;
use tonic::Code;
use tonic::transport::Channel;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
enum Workload {
    /// `add` on pn-counters with unique idempotency ids, in every region.
    Counter,
    /// writes of unique values and reads of owned registers, in every region (the
    /// non-holder's writes are refused).
    OwnedRegister,
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
    /// and its own deltas topic (`restore-on-empty`).
    Wipe,
    /// Cut a region off the other sites (the other region, the witness, MirrorMaker 2) in
    /// both directions for 8 s: packets dropped by iptables (`cluster.py net isolate`).
    Partition,
    /// Like `partition`, one way: the region's processes cannot open connections to the
    /// other sites, which can still reach it.
    PartitionOneWay,
    /// Restart a node with its wall clock 300 ms ahead (within `max-clock-offset`, 500 ms)
    /// for 8 s, then restart it with the clock right (`cluster.py node restart
    /// --clock-offset`, libfaketime).
    ClockWithin,
    /// Like `clock-within`, 2 s ahead: beyond `max-clock-offset` (the guard that refuses
    /// a remote delta stamped too far ahead; README says what the runs showed).
    ClockBeyond,
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
    /// How long the clients run (faults included).
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

/// One fault as it happened.
#[derive(Serialize, Clone, Debug)]
struct Fault {
    nemesis: Nemesis,
    target: String,
    start_ns: u64,
    end_ns: u64,
}

struct Run {
    started: Instant,
    history: Mutex<Vec<Event>>,
}

impl Run {
    fn now_ns(&self) -> u64 {
        self.started.elapsed().as_nanos() as u64
    }

    async fn record(&self, event: Event) {
        self.history.lock().await.push(event);
    }
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
        .map(|i| match args.workload {
            Workload::Counter => format!("drivers/{tag}-{i}"),
            Workload::OwnedRegister => format!("surge/{tag}-{i}"),
        })
        .collect();
    // the hash shards of owned keys, from the public lease listing
    let hash_shards = control::hash_shards(&cluster.regions[&regions[0]])
        .await
        .unwrap_or(0);

    let run = Arc::new(Run {
        started: Instant::now(),
        history: Mutex::new(Vec::new()),
    });
    let deadline = Instant::now() + Duration::from_secs(args.seconds);
    let mut clients = Vec::new();
    for (r, region) in regions.iter().enumerate() {
        for c in 0..args.clients_per_region {
            let first_process = (r as u64) * args.clients_per_region + c;
            let client = Client {
                run: run.clone(),
                region: region.clone(),
                addr: grpc(&cluster.regions[region])?,
                keys: keys.clone(),
                workload: args.workload,
                hash_shards,
                stride: regions.len() as u64 * args.clients_per_region,
                rng: Rng(args.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (first_process + 1)),
            };
            clients.push(tokio::spawn(client.run(first_process, deadline)));
        }
    }
    let faults = nemesis(&args, &run, &keys, hash_shards, deadline).await?;
    for c in clients {
        c.await??;
    }

    // heal everything, then let the regions converge
    heal(&args.cluster).await?;
    let finals = converge(&args.cluster, &regions, &keys, Duration::from_secs(90)).await?;
    let history = run.history.lock().await.clone();
    report(&args, &history, &faults, &finals)
}

struct Client {
    run: Arc<Run>,
    region: String,
    addr: String,
    keys: Vec<String>,
    workload: Workload,
    hash_shards: u32,
    /// Added to the process id after an indeterminate operation (that process may still
    /// have it in flight; Jepsen's rule: a process does one operation at a time).
    stride: u64,
    rng: Rng,
}

impl Client {
    fn connect(&self) -> Option<StateClient<Channel>> {
        control::state_client(&self.addr).ok()
    }

    fn event(
        &self,
        process: u64,
        kind: EventType,
        f: Function,
        key: &str,
        value: Option<i64>,
    ) -> Event {
        Event {
            process,
            kind,
            f,
            key: key.to_string(),
            value,
            region: self.region.clone(),
            time_ns: self.run.now_ns(),
            shard: (self.workload == Workload::OwnedRegister && self.hash_shards > 0)
                .then(|| geostate::lease::table::shard_of(key, self.hash_shards)),
            epoch: None,
        }
    }

    async fn run(mut self, mut process: u64, deadline: Instant) -> anyhow::Result<()> {
        let Some(mut client) = self.connect() else {
            bail!("bad address {}", self.addr);
        };
        let mut n = 0u64;
        while Instant::now() < deadline {
            n += 1;
            let key = self.keys[self.rng.below(self.keys.len() as u64) as usize].clone();
            let indeterminate = match self.workload {
                Workload::Counter => {
                    let v = self.rng.below(5) as i64 + 1;
                    let v = if self.rng.below(3) == 0 { -v } else { v };
                    self.add(&mut client, process, &key, v, n).await
                }
                Workload::OwnedRegister if self.rng.below(2) == 0 => {
                    let v = (process * 1_000_000 + n) as i64;
                    self.write(&mut client, process, &key, v).await
                }
                Workload::OwnedRegister => self.read(&mut client, process, &key).await,
            };
            if indeterminate {
                process += self.stride;
            }
            tokio::time::sleep(Duration::from_millis(10 + self.rng.below(20))).await;
        }
        Ok(())
    }

    /// Records the completion of an update; true if indeterminate.
    async fn complete(
        &self,
        mut done: Event,
        result: Result<pb::UpdateResponse, tonic::Status>,
    ) -> bool {
        let (kind, epoch) = match &result {
            Ok(r) => (EventType::Ok, r.stamp.as_ref().map(|s| s.epoch)),
            // certainly not applied
            Err(s)
                if matches!(
                    s.code(),
                    Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange
                ) =>
            {
                (EventType::Fail, None)
            }
            Err(_) => (EventType::Info, None),
        };
        done.kind = kind;
        done.epoch = epoch.filter(|_| self.workload == Workload::OwnedRegister);
        done.time_ns = self.run.now_ns();
        self.run.record(done).await;
        kind == EventType::Info
    }

    async fn add(
        &self,
        client: &mut StateClient<Channel>,
        p: u64,
        key: &str,
        v: i64,
        n: u64,
    ) -> bool {
        let invoke = self.event(p, EventType::Invoke, Function::Add, key, Some(v));
        self.run.record(invoke.clone()).await;
        let result = client
            .update(pb::UpdateRequest {
                key: key.into(),
                op: Some(pb::update_request::Op::Add(v)),
                id: format!("{}-{p}-{n}", self.region),
            })
            .await
            .map(|r| r.into_inner());
        self.complete(invoke, result).await
    }

    async fn write(&self, client: &mut StateClient<Channel>, p: u64, key: &str, v: i64) -> bool {
        let invoke = self.event(p, EventType::Invoke, Function::Write, key, Some(v));
        self.run.record(invoke.clone()).await;
        let result = client
            .update(pb::UpdateRequest {
                key: key.into(),
                op: Some(pb::update_request::Op::Set(v.to_string().into_bytes())),
                id: String::new(),
            })
            .await
            .map(|r| r.into_inner());
        self.complete(invoke, result).await
    }

    async fn read(&self, client: &mut StateClient<Channel>, p: u64, key: &str) -> bool {
        let mut e = self.event(p, EventType::Invoke, Function::Read, key, None);
        self.run.record(e.clone()).await;
        let result = client.get(pb::GetRequest { key: key.into() }).await;
        e.time_ns = self.run.now_ns();
        match result {
            Ok(v) => {
                let v = v.into_inner();
                e.kind = EventType::Ok;
                e.value = register_value(&v);
                e.epoch = v.stamp.as_ref().map(|s| s.epoch);
            }
            Err(s) if s.code() == Code::NotFound => e.kind = EventType::Ok,
            // a read changes nothing: a failed one is simply not an observation
            Err(_) => e.kind = EventType::Fail,
        }
        self.run.record(e).await;
        false
    }
}

fn register_value(v: &pb::Value) -> Option<i64> {
    match &v.value {
        Some(pb::value::Value::Register(b)) => String::from_utf8_lossy(b).parse().ok(),
        _ => None,
    }
}

/// Runs the faults in turn until `deadline`, each healed before the next.
async fn nemesis(
    args: &Args,
    run: &Run,
    keys: &[String],
    hash_shards: u32,
    deadline: Instant,
) -> anyhow::Result<Vec<Fault>> {
    let mut faults = Vec::new();
    let mut i = 0;
    tokio::time::sleep(Duration::from_secs(
        args.interval.min(args.seconds / 4).max(1),
    ))
    .await;
    while !args.nemesis.is_empty() && Instant::now() + Duration::from_secs(5) < deadline {
        let kind = args.nemesis[i % args.nemesis.len()];
        // each kind of fault takes the regions in turn
        let round = i / args.nemesis.len();
        i += 1;
        let cluster = read_cluster(&args.cluster)?;
        let start_ns = run.now_ns();
        let target = match kind {
            Nemesis::PauseHolder => {
                let (region, pid) = holder(&cluster, &keys[0], hash_shards).await?;
                signal("-STOP", pid).await;
                tokio::time::sleep(Duration::from_secs(4)).await;
                signal("-CONT", pid).await;
                region
            }
            Nemesis::Kill => {
                let region = target_region(&cluster, round);
                let pid = cluster.regions[&region].pid.context("node pid")?;
                signal("-KILL", pid).await;
                tokio::time::sleep(Duration::from_secs(2)).await;
                cluster_script(&args.cluster, &["up", "--no-build"]).await?;
                region
            }
            Nemesis::Mirror => {
                cluster_script(&args.cluster, &["mirror", "stop"]).await?;
                tokio::time::sleep(Duration::from_secs(5)).await;
                cluster_script(&args.cluster, &["mirror", "start"]).await?;
                "mirrormaker2".to_string()
            }
            Nemesis::Broker => {
                let region = target_region(&cluster, round);
                control::broker_outage(&args.cluster, &region, Duration::from_secs(5)).await?;
                format!("kafka {region}")
            }
            Nemesis::Wipe => {
                let region = target_region(&cluster, round);
                control::wipe_node(&args.cluster, &cluster, &region).await?;
                format!("node {region} (data dir wiped)")
            }
            Nemesis::Partition | Nemesis::PartitionOneWay => {
                let region = target_region(&cluster, round);
                let direction = if kind == Nemesis::Partition {
                    "both"
                } else {
                    "out"
                };
                control::isolate(&args.cluster, &region, direction, Duration::from_secs(8)).await?;
                format!("{region} cut off ({direction})")
            }
            Nemesis::ClockWithin | Nemesis::ClockBeyond => {
                let region = target_region(&cluster, round);
                let offset = if kind == Nemesis::ClockWithin {
                    300
                } else {
                    2000
                };
                control::clock_offset(&args.cluster, &region, offset, Duration::from_secs(8))
                    .await?;
                format!("node {region} clock +{offset} ms")
            }
        };
        faults.push(Fault {
            nemesis: kind,
            target,
            start_ns,
            end_ns: run.now_ns(),
        });
        tokio::time::sleep(Duration::from_secs(args.interval)).await;
    }
    Ok(faults)
}

/// The final read of every key in every region: key → region → (value, epoch).
type Finals = BTreeMap<String, BTreeMap<String, (Option<i64>, u64)>>;

/// Reads every key in every region until all regions agree (or `within` passes).
async fn converge(
    cluster_json: &Path,
    regions: &[String],
    keys: &[String],
    within: Duration,
) -> anyhow::Result<Finals> {
    let cluster = read_cluster(cluster_json)?;
    let deadline = Instant::now() + within;
    loop {
        let mut finals: Finals = BTreeMap::new();
        for region in regions {
            let mut state = StateClient::connect(grpc(&cluster.regions[region])?).await?;
            let values = state
                .batch_get(pb::BatchGetRequest {
                    keys: keys.to_vec(),
                })
                .await?
                .into_inner();
            for v in values.values {
                let value = match &v.value {
                    Some(pb::value::Value::Counter(n)) => Some(*n),
                    _ => register_value(&v),
                };
                let epoch = v.stamp.as_ref().map_or(0, |s| s.epoch);
                finals
                    .entry(v.key.clone())
                    .or_default()
                    .insert(region.clone(), (value, epoch));
            }
            for missing in values.missing {
                finals
                    .entry(missing)
                    .or_default()
                    .insert(region.clone(), (None, 0));
            }
        }
        let agreed = finals.values().all(|by_region| {
            let mut seen = by_region.values();
            let first = seen.next();
            seen.all(|v| Some(v) == first)
        });
        if agreed || Instant::now() > deadline {
            return Ok(finals);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[derive(Serialize)]
struct Results<'a> {
    workload: Workload,
    nemesis: &'a [Nemesis],
    seed: u64,
    seconds: u64,
    operations: usize,
    ok: usize,
    fail: usize,
    info: usize,
    faults: &'a [Fault],
    /// Per fault, in order: what it cost each region's writes and writes anywhere.
    availability: Vec<Vec<availability::Window>>,
    anomalies: Vec<String>,
    /// Keys whose owned-register history has no linearization. Informational: the
    /// workload reads in every region, and a non-holder's read is a replica read
    /// (eventually consistent by design); owned keys are also not linearizable across a
    /// failover (ARCHITECTURE.md). Needs a holder-only read to mean more.
    not_linearizable: Vec<String>,
    valid: bool,
}

fn report(
    args: &Args,
    history: &[Event],
    faults: &[Fault],
    finals: &Finals,
) -> anyhow::Result<bool> {
    let count = |k: EventType| history.iter().filter(|e| e.kind == k).count();
    let mut anomalies = Vec::new();
    for requested in &args.nemesis {
        if !faults.iter().any(|f| f.nemesis == *requested) {
            anomalies.push(format!("coverage: {requested:?} never fired"));
        }
    }
    for (key, by_region) in finals {
        let mut values = by_region.values();
        let first = values.next();
        if !values.all(|v| Some(v) == first) {
            anomalies.push(format!("{key}: regions disagree: {by_region:?}"));
        }
    }
    let mut not_linearizable = Vec::new();
    match args.workload {
        Workload::Counter => {
            let counters: BTreeMap<String, BTreeMap<String, i64>> = finals
                .iter()
                .map(|(k, by)| {
                    (
                        k.clone(),
                        by.iter()
                            .map(|(r, (v, _))| (r.clone(), v.unwrap_or(0)))
                            .collect(),
                    )
                })
                .collect();
            for verdict in counter::check(history, &counters) {
                for p in verdict.problems {
                    anomalies.push(format!("{}: {p}", verdict.key));
                }
            }
        }
        Workload::OwnedRegister => {
            for v in fencing::check(history) {
                anomalies.push(format!("shard {}: {:?}: {}", v.shard, v.kind, v.detail));
            }
            // the final value was written, and no accepted write has a higher epoch
            for (key, by_region) in finals {
                let Some((value, epoch)) = by_region.values().next() else {
                    continue;
                };
                let writes = history
                    .iter()
                    .filter(|e| e.key == *key && e.f == Function::Write);
                let mut written = false;
                for w in writes {
                    if w.kind == EventType::Ok && w.epoch.is_some_and(|e| e > *epoch) {
                        anomalies.push(format!(
                            "{key}: final value at epoch {epoch}, but a write was accepted at epoch {:?}",
                            w.epoch
                        ));
                    }
                    written |= w.kind == EventType::Invoke && w.value == *value;
                }
                if value.is_some() && !written {
                    anomalies.push(format!("{key}: final value {value:?} was never written"));
                }
            }
            not_linearizable = register::check(history)
                .into_iter()
                .map(|n| format!("{} ({} operations)", n.key, n.operations))
                .collect();
        }
    }
    let valid = anomalies.is_empty();
    let regions: Vec<String> = finals
        .values()
        .flat_map(|by_region| by_region.keys().cloned())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let windows: Vec<Vec<availability::Window>> = faults
        .iter()
        .map(|f| availability::during(history, &regions, f.start_ns, f.end_ns))
        .collect();
    let mut table = String::new();
    if !faults.is_empty() {
        table.push_str(
            "\n| fault | target | at | lasted | scope | longest stretch without an acknowledged write | writes during the fault ok / fail / info |\n|---|---|---:|---:|---|---:|---|\n",
        );
        for (f, ws) in faults.iter().zip(&windows) {
            for w in ws {
                table.push_str(&format!(
                    "| {:?} | {} | {:.1} s | {:.1} s | {} | {:.0} ms | {} / {} / {} |\n",
                    f.nemesis,
                    f.target,
                    f.start_ns as f64 / 1e9,
                    (f.end_ns - f.start_ns) as f64 / 1e9,
                    w.scope,
                    w.longest_gap_ms,
                    w.ok,
                    w.fail,
                    w.info
                ));
            }
        }
    }
    let results = Results {
        workload: args.workload,
        nemesis: &args.nemesis,
        seed: args.seed,
        seconds: args.seconds,
        operations: count(EventType::Invoke),
        ok: count(EventType::Ok),
        fail: count(EventType::Fail),
        info: count(EventType::Info),
        faults,
        availability: windows,
        anomalies,
        not_linearizable,
        valid,
    };
    let mut lines = String::new();
    for e in history {
        lines.push_str(&serde_json::to_string(e)?);
        lines.push('\n');
    }
    std::fs::write(args.out.join("history.jsonl"), lines)?;
    let mut nemesis = String::new();
    for f in faults {
        nemesis.push_str(&serde_json::to_string(f)?);
        nemesis.push('\n');
    }
    std::fs::write(args.out.join("nemesis.jsonl"), nemesis)?;
    std::fs::write(
        args.out.join("results.json"),
        serde_json::to_string_pretty(&results)? + "\n",
    )?;
    let summary = format!(
        "# jepsen run: {:?} workload, nemesis {:?}, seed {}, {} s\n\n\
         {} operations: {} ok, {} fail, {} info (indeterminate)\n\n\
         faults: {}\n\n\
         verdict: **{}**\n\n{}{}{}",
        args.workload,
        args.nemesis,
        args.seed,
        args.seconds,
        results.operations,
        results.ok,
        results.fail,
        results.info,
        faults
            .iter()
            .map(|f| format!(
                "{:?} on {} ({:.1} s)",
                f.nemesis,
                f.target,
                (f.end_ns - f.start_ns) as f64 / 1e9
            ))
            .collect::<Vec<_>>()
            .join(", "),
        if valid { "valid" } else { "ANOMALIES" },
        results
            .anomalies
            .iter()
            .map(|a| format!("- {a}\n"))
            .collect::<String>(),
        match (args.workload, results.not_linearizable.is_empty()) {
            (Workload::Counter, _) => String::new(),
            (Workload::OwnedRegister, true) => {
                "\nowned-register linearizability: every key linearizable\n".to_string()
            }
            (Workload::OwnedRegister, false) => format!(
                "\nowned-register linearizability (informational: reads are served by every \
                 region, and a non-holder's read is a replica read): no linearization for {}\n",
                results.not_linearizable.join(", ")
            ),
        },
        table,
    );
    std::fs::write(args.out.join("summary.md"), &summary)?;
    print!("{summary}");
    Ok(valid)
}
