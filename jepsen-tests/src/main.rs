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
use geostate_jepsen::history::{Event, EventType, Function, Stamp};
use geostate_jepsen::{append, availability, counter, fencing, lww, register};
use serde::Serialize;
use tokio::sync::Mutex;
use tonic::Code;
use tonic::transport::Channel;

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
}

impl Workload {
    fn prefix(self) -> &'static str {
        match self {
            Workload::PnCounter => "drivers/",
            Workload::GCounter => "requests/",
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
        .map(|i| format!("{}{tag}-{i}", args.workload.prefix()))
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
    let (stop_clients, clients_stop) = tokio::sync::watch::channel(false);
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
                last_read: BTreeMap::new(),
            };
            clients.push(tokio::spawn(
                client.run(first_process, clients_stop.clone()),
            ));
        }
    }
    let faults = nemesis(&args, &run, &keys, hash_shards, deadline).await?;
    // the clients see the last fault's recovery, and run for `--seconds` at least
    tokio::time::sleep(Duration::from_secs(args.interval)).await;
    tokio::time::sleep_until(deadline.into()).await;
    stop_clients.send_replace(true);
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
    /// The value this client last read per key, which its compare-and-sets expect.
    last_read: BTreeMap<String, i64>,
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
            shard: (self.workload.owned() && self.hash_shards > 0)
                .then(|| geostate::lease::table::shard_of(key, self.hash_shards)),
            epoch: None,
            expected: None,
            list: None,
            stamp: None,
        }
    }

    async fn run(
        mut self,
        mut process: u64,
        stop: tokio::sync::watch::Receiver<bool>,
    ) -> anyhow::Result<()> {
        let Some(mut client) = self.connect() else {
            bail!("bad address {}", self.addr);
        };
        let mut n = 0u64;
        while !*stop.borrow() {
            n += 1;
            let key = self.keys[self.rng.below(self.keys.len() as u64) as usize].clone();
            // unique per operation
            let unique = (process * 1_000_000 + n) as i64;
            let dice = self.rng.below(6);
            let indeterminate = match self.workload {
                Workload::PnCounter | Workload::GCounter => {
                    let v = self.rng.below(5) as i64 + 1;
                    let negative = self.workload == Workload::PnCounter && dice < 2;
                    let v = if negative { -v } else { v };
                    self.add(&mut client, process, &key, v, n).await
                }
                Workload::SharedRegister if dice < 3 => {
                    self.write(&mut client, process, &key, unique, None).await
                }
                Workload::OwnedRegister if dice < 2 => {
                    self.write(&mut client, process, &key, unique, None).await
                }
                Workload::OwnedRegister if dice < 4 && self.last_read.contains_key(&key) => {
                    let expected = self.last_read.get(&key).copied();
                    self.write(&mut client, process, &key, unique, expected)
                        .await
                }
                Workload::SharedRegister | Workload::OwnedRegister => {
                    if let Some(Some(v)) = self.read(&mut client, process, &key).await {
                        self.last_read.insert(key.clone(), v);
                    }
                    false
                }
                Workload::OwnedAppend if dice < 2 => {
                    self.read_list(&mut client, process, &key).await;
                    false
                }
                Workload::OwnedAppend => self.append(&mut client, process, &key, unique).await,
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
        let (kind, stamp) = match &result {
            Ok(r) => (EventType::Ok, r.stamp.as_ref().map(stamp)),
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
        done.epoch = stamp
            .as_ref()
            .map(|s| s.epoch)
            .filter(|_| self.workload.owned());
        done.stamp = stamp;
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

    /// A write of `v`, or with `expected` a compare-and-set; true if indeterminate.
    async fn write(
        &self,
        client: &mut StateClient<Channel>,
        p: u64,
        key: &str,
        v: i64,
        expected: Option<i64>,
    ) -> bool {
        let f = if expected.is_some() {
            Function::Cas
        } else {
            Function::Write
        };
        let mut invoke = self.event(p, EventType::Invoke, f, key, Some(v));
        invoke.expected = expected;
        self.run.record(invoke.clone()).await;
        let value = v.to_string().into_bytes();
        let op = match expected {
            Some(e) => pb::update_request::Op::Cas(pb::CompareAndSet {
                expected: Some(e.to_string().into_bytes()),
                value,
            }),
            None => pb::update_request::Op::Set(value),
        };
        let result = client
            .update(pb::UpdateRequest {
                key: key.into(),
                op: Some(op),
                id: String::new(),
            })
            .await
            .map(|r| r.into_inner());
        self.complete(invoke, result).await
    }

    /// A read (at the lease holder for owned keys); the register's value if it answered.
    async fn get(&self, client: &mut StateClient<Channel>, e: &mut Event) -> Option<pb::Value> {
        self.run.record(e.clone()).await;
        let result = client
            .get(pb::GetRequest {
                key: e.key.clone(),
                leaseholder: self.workload.owned(),
            })
            .await;
        e.time_ns = self.run.now_ns();
        match result {
            Ok(v) => {
                let v = v.into_inner();
                e.kind = EventType::Ok;
                e.stamp = v.stamp.as_ref().map(stamp);
                e.epoch = e.stamp.as_ref().map(|s| s.epoch);
                Some(v)
            }
            Err(s) if s.code() == Code::NotFound => {
                e.kind = EventType::Ok;
                None
            }
            // a read changes nothing: a failed one is simply not an observation
            Err(_) => {
                e.kind = EventType::Fail;
                None
            }
        }
    }

    /// Reads a register; `Some(value)` if the read succeeded.
    async fn read(
        &self,
        client: &mut StateClient<Channel>,
        p: u64,
        key: &str,
    ) -> Option<Option<i64>> {
        let mut e = self.event(p, EventType::Invoke, Function::Read, key, None);
        let v = self.get(client, &mut e).await;
        e.value = v.as_ref().and_then(register_value);
        let seen = (e.kind == EventType::Ok).then_some(e.value);
        self.run.record(e).await;
        seen
    }

    async fn read_list(&self, client: &mut StateClient<Channel>, p: u64, key: &str) {
        let mut e = self.event(p, EventType::Invoke, Function::Read, key, None);
        let v = self.get(client, &mut e).await;
        if e.kind == EventType::Ok {
            e.list = Some(v.as_ref().map(list_value).unwrap_or_default());
        }
        self.run.record(e).await;
    }

    /// Appends `x`: a leaseholder read, then a compare-and-set of the list one longer;
    /// true if indeterminate.
    async fn append(&self, client: &mut StateClient<Channel>, p: u64, key: &str, x: i64) -> bool {
        let invoke = self.event(p, EventType::Invoke, Function::Append, key, Some(x));
        self.run.record(invoke.clone()).await;
        let read = client
            .get(pb::GetRequest {
                key: key.into(),
                leaseholder: true,
            })
            .await;
        let current = match read {
            Ok(v) => v.into_inner().value.and_then(|v| match v {
                pb::value::Value::Register(b) => Some(b),
                pb::value::Value::Counter(_) => None,
            }),
            Err(s) if s.code() == Code::NotFound => None,
            // the read failed, so nothing was written
            Err(s) => {
                let nothing = tonic::Status::failed_precondition(s.message());
                return self.complete(invoke, Err(nothing)).await;
            }
        };
        let mut next = current.clone().unwrap_or_default();
        if !next.is_empty() {
            next.push(b' ');
        }
        next.extend_from_slice(x.to_string().as_bytes());
        let result = client
            .update(pb::UpdateRequest {
                key: key.into(),
                op: Some(pb::update_request::Op::Cas(pb::CompareAndSet {
                    expected: current,
                    value: next,
                })),
                id: String::new(),
            })
            .await
            .map(|r| r.into_inner());
        self.complete(invoke, result).await
    }
}

fn stamp(s: &pb::OrderStamp) -> Stamp {
    let hlc = s.hlc.unwrap_or_default();
    Stamp {
        epoch: s.epoch,
        wall_nanos: hlc.wall_nanos,
        logical: hlc.logical,
        origin: s.origin.clone(),
    }
}

/// An owned list as stored: elements separated by spaces.
fn list_value(v: &pb::Value) -> Vec<i64> {
    match &v.value {
        Some(pb::value::Value::Register(b)) => String::from_utf8_lossy(b)
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect(),
        _ => Vec::new(),
    }
}

fn register_value(v: &pb::Value) -> Option<i64> {
    match &v.value {
        Some(pb::value::Value::Register(b)) => String::from_utf8_lossy(b).parse().ok(),
        _ => None,
    }
}

/// Runs the faults in turn, each healed before the next: every kind once, then more until
/// `deadline` (a slow machine lengthens the run rather than skip a fault).
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
    while !args.nemesis.is_empty()
        && (i < args.nemesis.len() || Instant::now() + Duration::from_secs(5) < deadline)
    {
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
                // an owned workload's wipe hits a key's holder (the keys in turn): what it
                // acknowledged and had not shipped is what the lost disk must not take along
                let region = if args.workload.owned() {
                    holder(&cluster, &keys[round % keys.len()], hash_shards)
                        .await?
                        .0
                } else {
                    target_region(&cluster, round)
                };
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
            Nemesis::Wan => {
                let region = target_region(&cluster, round);
                let delayed =
                    control::wan_delay(&args.cluster, &region, 100, 50, Duration::from_secs(8))
                        .await?;
                if delayed == 0 {
                    // never fired: the coverage check reports it
                    tokio::time::sleep(Duration::from_secs(args.interval)).await;
                    continue;
                }
                format!("{region} links delayed 100 ± 50 ms ({delayed} packets)")
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

/// One key's final read in one region.
#[derive(Clone, Debug, PartialEq, Eq)]
struct FinalRead {
    /// A counter, or a register holding an integer.
    value: Option<i64>,
    /// A register holding a list (`owned-append`).
    list: Vec<i64>,
    stamp: Option<Stamp>,
}

/// The final read of every key in every region: key → region → read.
type Finals = BTreeMap<String, BTreeMap<String, FinalRead>>;

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
                let read = FinalRead {
                    value: match &v.value {
                        Some(pb::value::Value::Counter(n)) => Some(*n),
                        _ => register_value(&v),
                    },
                    list: list_value(&v),
                    stamp: v.stamp.as_ref().map(stamp),
                };
                finals
                    .entry(v.key.clone())
                    .or_default()
                    .insert(region.clone(), read);
            }
            for missing in values.missing {
                let read = FinalRead {
                    value: None,
                    list: Vec::new(),
                    stamp: None,
                };
                finals
                    .entry(missing)
                    .or_default()
                    .insert(region.clone(), read);
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
    /// Keys whose owned-register history (leaseholder reads, writes, compare-and-sets)
    /// has no linearization; each is also an anomaly.
    not_linearizable: Vec<String>,
    valid: bool,
}

fn report(
    args: &Args,
    history: &[Event],
    faults: &[Fault],
    finals: &Finals,
) -> anyhow::Result<bool> {
    // the history first: a checker may take long
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
    // every region agrees (checked above), so one region's read stands for all
    let agreed: Vec<(&String, &FinalRead)> = finals
        .iter()
        .filter_map(|(k, by)| Some((k, by.values().next()?)))
        .collect();
    // each register's final value (as the checker reads it) and order stamp
    let registers = |value: fn(&FinalRead) -> Option<i64>| -> BTreeMap<String, lww::Final> {
        agreed
            .iter()
            .map(|(k, r)| ((*k).clone(), (value(r), r.stamp.clone())))
            .collect()
    };
    let mut not_linearizable = Vec::new();
    if args.workload.counter() {
        let counters: BTreeMap<String, BTreeMap<String, i64>> = finals
            .iter()
            .map(|(k, by)| {
                let reads = by.iter().map(|(r, f)| (r.clone(), f.value.unwrap_or(0)));
                (k.clone(), reads.collect())
            })
            .collect();
        for verdict in counter::check(history, &counters) {
            for p in verdict.problems {
                anomalies.push(format!("{}: {p}", verdict.key));
            }
        }
    }
    if args.workload.owned() {
        for v in fencing::check(history) {
            anomalies.push(format!("shard {}: {:?}: {}", v.shard, v.kind, v.detail));
        }
    }
    match args.workload {
        Workload::SharedRegister | Workload::OwnedRegister => {
            anomalies.extend(lww::check(history, &registers(|r| r.value)));
        }
        Workload::OwnedAppend => {
            // a list's stamps, not its value: the elements are checked below
            anomalies.extend(lww::check(history, &registers(|_| None)));
            let lists = agreed
                .iter()
                .map(|(k, r)| ((*k).clone(), r.list.clone()))
                .collect();
            anomalies.extend(append::check(history, &lists));
        }
        Workload::PnCounter | Workload::GCounter => {}
    }
    if args.workload == Workload::OwnedRegister {
        not_linearizable = register::check(history)
            .into_iter()
            .map(|n| format!("{} ({} operations)", n.key, n.operations))
            .collect();
        anomalies.extend(
            not_linearizable
                .iter()
                .map(|k| format!("not linearizable: {k}")),
        );
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
            (Workload::OwnedRegister, true) => {
                "\nowned-register linearizability: every key linearizable\n".to_string()
            }
            (Workload::OwnedRegister, false) => format!(
                "\nowned-register linearizability: no linearization for {}\n",
                results.not_linearizable.join(", ")
            ),
            _ => String::new(),
        },
        table,
    );
    std::fs::write(args.out.join("summary.md"), &summary)?;
    print!("{summary}");
    Ok(valid)
}
