//! The surge-pricing workload (`make demo`): riders' requests and available drivers per
//! geohash are written in every region at once, with a skewed (Zipf 0.99) choice of
//! geohash; each region publishes the surge multiplier (`surge/<geohash>`, an owned
//! namespace) of the geohashes whose lease it holds, and is refused the others; probes measure
//! how long a write in one region takes to be read in the other. Ends with a table and
//! whether every region holds identical state. Uses only the public gRPC API.

use std::collections::{BTreeMap, hash_map::DefaultHasher};
use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use geostate::pb;
use geostate::pb::admin_client::AdminClient;
use geostate::pb::state_client::StateClient;
use geostate::workload::{Rng, Zipf, geohash};
use serde::Deserialize;
use tonic::transport::Channel;

#[derive(Parser)]
#[command(about = "Surge-pricing workload across the local regions")]
struct Args {
    /// The cluster description written by `make up`.
    #[arg(long, default_value = "regions/local/run/cluster.json")]
    cluster: PathBuf,
    /// How long to write, in seconds.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// Updates per second per region.
    #[arg(long, default_value_t = 300)]
    rate: u64,
    /// Number of geohashes.
    #[arg(long, default_value_t = 500)]
    geohashes: usize,
}

#[derive(Deserialize)]
struct Cluster {
    regions: BTreeMap<String, Region>,
}

#[derive(Deserialize)]
struct Region {
    grpc: String,
}

#[derive(Default)]
struct Counts {
    sent: AtomicU64,
    ok: AtomicU64,
    failed: AtomicU64,
    /// Multipliers refused because another region holds the geohash's lease.
    not_holder: AtomicU64,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tokio::runtime::Runtime::new()?.block_on(run(args))
}

async fn run(args: Args) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&args.cluster)
        .with_context(|| format!("reading {} (run `make up`)", args.cluster.display()))?;
    let cluster: Cluster = serde_json::from_str(&text)?;
    let regions: Vec<String> = cluster.regions.keys().cloned().collect();
    if regions.len() < 2 {
        bail!("the workload needs at least two regions");
    }
    let mut clients = BTreeMap::new();
    for (name, r) in &cluster.regions {
        clients.insert(
            name.clone(),
            StateClient::connect(format!("http://{}", r.grpc)).await?,
        );
    }
    println!(
        "surge workload: {} regions, {} geohashes (Zipf 0.99), {} updates/s per region, {} s",
        regions.len(),
        args.geohashes,
        args.rate,
        args.seconds
    );

    let zipf = Arc::new(Zipf::new(args.geohashes, 0.99));
    let deadline = Instant::now() + Duration::from_secs(args.seconds);
    let counts: BTreeMap<String, Arc<Counts>> = regions
        .iter()
        .map(|r| (r.clone(), Arc::new(Counts::default())))
        .collect();
    let mut tasks = Vec::new();
    for (n, region) in regions.iter().enumerate() {
        // a few writers per region, open loop at the configured rate: each update is sent
        // on schedule whether or not the previous ones were answered (at most 256 open)
        let in_flight = Arc::new(tokio::sync::Semaphore::new(256));
        for w in 0..4u64 {
            let client = clients[region].clone();
            let in_flight = in_flight.clone();
            let counts = counts[region].clone();
            let zipf = zipf.clone();
            let region = region.clone();
            let period = Duration::from_micros(4_000_000 / args.rate.max(1));
            tasks.push(tokio::spawn(async move {
                let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ ((n as u64) << 8 | w) | 1);
                let mut tick = tokio::time::interval(period);
                let mut i = 0u64;
                let mut sends: Vec<tokio::task::JoinHandle<()>> = Vec::new();
                while Instant::now() < deadline {
                    tick.tick().await;
                    i += 1;
                    let gh = geohash(zipf.sample(rng.unit()));
                    let (key, op) = match rng.next_u64() % 10 {
                        0..=5 => (format!("requests/{gh}"), pb::update_request::Op::Add(1)),
                        6..=8 => (
                            format!("drivers/{gh}"),
                            pb::update_request::Op::Add(if rng.next_u64().is_multiple_of(2) {
                                1
                            } else {
                                -1
                            }),
                        ),
                        _ => {
                            // publish the multiplier: accepted only where the lease is held
                            let multiplier = 1.0 + (rng.next_u64() % 20) as f64 / 10.0;
                            (
                                format!("surge/{gh}"),
                                pb::update_request::Op::Set(
                                    format!("{multiplier:.1}@{region}#{i}").into_bytes(),
                                ),
                            )
                        }
                    };
                    counts.sent.fetch_add(1, Ordering::Relaxed);
                    let request = pb::UpdateRequest {
                        key,
                        op: Some(op),
                        id: String::new(),
                    };
                    let Ok(permit) = in_flight.clone().acquire_owned().await else {
                        break;
                    };
                    let (mut client, counts) = (client.clone(), counts.clone());
                    sends.push(tokio::spawn(async move {
                        match client.update(request).await {
                            Ok(_) => counts.ok.fetch_add(1, Ordering::Relaxed),
                            Err(s) if s.code() == tonic::Code::FailedPrecondition => {
                                counts.not_holder.fetch_add(1, Ordering::Relaxed)
                            }
                            Err(_) => counts.failed.fetch_add(1, Ordering::Relaxed),
                        };
                        drop(permit);
                    }));
                }
                for send in sends {
                    let _ = send.await;
                }
            }));
        }
    }

    // probes: a write in one region, timed until the next region reads it
    let mut lags: Vec<Duration> = Vec::new();
    let mut last_report = Instant::now();
    while Instant::now() < deadline {
        for (i, from) in regions.iter().enumerate() {
            let to = &regions[(i + 1) % regions.len()];
            let key = format!("requests/probe-{from}");
            let mut writer = clients[from].clone();
            writer
                .update(pb::UpdateRequest {
                    key: key.clone(),
                    op: Some(pb::update_request::Op::Add(1)),
                    id: String::new(),
                })
                .await?;
            let written = Instant::now();
            let target = probe_value(&mut clients[from].clone(), &key).await?;
            let mut reader = clients[to].clone();
            loop {
                if probe_value(&mut reader, &key).await? >= target {
                    lags.push(written.elapsed());
                    break;
                }
                if written.elapsed() > Duration::from_secs(30) {
                    bail!("a write in {from} was not visible in {to} after 30 s");
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
        if last_report.elapsed() >= Duration::from_secs(5) {
            last_report = Instant::now();
            let line: Vec<String> = counts
                .iter()
                .map(|(r, c)| format!("{r}: {} ok", c.ok.load(Ordering::Relaxed)))
                .collect();
            println!(
                "  {:>3} s left  {}",
                deadline.saturating_duration_since(Instant::now()).as_secs(),
                line.join("  ")
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for t in tasks {
        t.await?;
    }

    // wait for the regions to agree, then compare
    let settle = Instant::now();
    let mut digests;
    loop {
        digests = BTreeMap::new();
        for (r, c) in &mut clients {
            digests.insert(r.clone(), digest(c).await?);
        }
        let first = digests.values().next().cloned();
        if digests.values().all(|d| Some(d) == first.as_ref())
            || settle.elapsed() > Duration::from_secs(30)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    lags.sort();
    let pct = |p: f64| {
        lags.get(((lags.len().max(1) - 1) as f64 * p).round() as usize)
            .copied()
            .unwrap_or_default()
    };

    println!();
    println!(
        "| region | updates sent | acknowledged | not lease holder | failed | events applied | keys | state digest |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---|");
    for (r, c) in &counts {
        let mut admin = AdminClient::connect(format!("http://{}", cluster.regions[r].grpc)).await?;
        let status = admin.status(pb::StatusRequest {}).await?.into_inner();
        let (keys, d) = &digests[r];
        println!(
            "| {r} | {} | {} | {} | {} | {} | {keys} | {d:016x} |",
            c.sent.load(Ordering::Relaxed),
            c.ok.load(Ordering::Relaxed),
            c.not_holder.load(Ordering::Relaxed),
            c.failed.load(Ordering::Relaxed),
            status.events_applied
        );
    }
    println!();
    println!(
        "replication lag, write in one region to read in the other ({} probes): p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        lags.len(),
        pct(0.5).as_secs_f64() * 1e3,
        pct(0.99).as_secs_f64() * 1e3,
        lags.last().copied().unwrap_or_default().as_secs_f64() * 1e3
    );
    let identical = digests.values().all(|d| Some(d) == digests.values().next());
    println!(
        "regions hold identical state: {}",
        if identical { "yes" } else { "NO" }
    );
    if !identical {
        bail!("regions did not converge within 30 s after the load stopped");
    }
    Ok(())
}

async fn probe_value(client: &mut StateClient<Channel>, key: &str) -> anyhow::Result<i64> {
    let v = client
        .get(pb::GetRequest {
            key: key.into(),
            ..Default::default()
        })
        .await?
        .into_inner();
    Ok(match v.value {
        Some(pb::value::Value::Counter(n)) => n,
        _ => 0,
    })
}

/// Number of keys and a hash of every (key, value) under the workload's prefixes.
async fn digest(client: &mut StateClient<Channel>) -> anyhow::Result<(usize, u64)> {
    let mut hasher = DefaultHasher::new();
    let mut keys = 0;
    for prefix in ["requests/", "drivers/", "zones/", "surge/"] {
        let mut page_token = String::new();
        loop {
            let page = client
                .scan(pb::ScanRequest {
                    prefix: prefix.into(),
                    page_token,
                    limit: 1000,
                })
                .await?
                .into_inner();
            for v in &page.values {
                keys += 1;
                v.key.hash(&mut hasher);
                match &v.value {
                    Some(pb::value::Value::Counter(n)) => n.hash(&mut hasher),
                    Some(pb::value::Value::Register(b)) => b.hash(&mut hasher),
                    None => {}
                }
            }
            if page.next_page_token.is_empty() {
                break;
            }
            page_token = page.next_page_token;
        }
    }
    Ok((keys, hasher.finish()))
}
