//! The surge-pricing workload (`make demo`): riders' requests and drivers' availability
//! pings (each counted per minute of its event time: `requests/` and `supply/` are
//! windowed namespaces) and drivers coming and going are written in every region at once,
//! with a skewed (Zipf 0.99) choice of geohash; probes measure how long a write in one
//! region takes to be read in the other. Ends with a table and whether every region holds
//! identical state. Uses the public gRPC API. Then, with the cluster's PostgreSQL, it keeps
//! a trickle of events going until the window the load ended in is final and priced, and
//! shows from `geostate_outputs` the final windows and the surge multipliers each
//! region's `geostate pricer` wrote (`prices/<geohash>`, by the region holding the
//! geohash's lease), the table reconciled with every region's outputs topic, and how long
//! rows took.

use std::collections::{BTreeMap, hash_map::DefaultHasher};
use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use clap::Parser;
use geostate::pb;
use geostate::pb::admin_client::AdminClient;
use geostate::pb::state_client::StateClient;
use geostate::sink::reconcile::Source;
use geostate::window::WindowSpec;
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
    postgres: Option<Postgres>,
}

#[derive(Deserialize)]
struct Region {
    grpc: String,
    /// The node's region file and `--set` overrides.
    config: PathBuf,
    #[serde(default)]
    set: Vec<String>,
}

#[derive(Deserialize)]
struct Postgres {
    url: String,
}

#[derive(Default)]
struct Counts {
    sent: AtomicU64,
    ok: AtomicU64,
    failed: AtomicU64,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tokio::runtime::Runtime::new()?.block_on(run(args))
}

type Clients = BTreeMap<String, StateClient<Channel>>;

async fn run(args: Args) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&args.cluster)
        .with_context(|| format!("reading {} (run `make up`)", args.cluster.display()))?;
    let cluster: Cluster = serde_json::from_str(&text)?;
    let regions: Vec<String> = cluster.regions.keys().cloned().collect();
    if regions.len() < 2 {
        bail!("the workload needs at least two regions");
    }
    let mut clients = Clients::new();
    for (name, r) in &cluster.regions {
        let client = StateClient::connect(format!("http://{}", r.grpc)).await?;
        clients.insert(name.clone(), client);
    }
    println!(
        "surge workload: {} regions, {} geohashes (Zipf 0.99), {} updates/s per region, {} s",
        regions.len(),
        args.geohashes,
        args.rate,
        args.seconds
    );
    let deadline = Instant::now() + Duration::from_secs(args.seconds);
    // every window the run's requests can fall in, for the digest
    let started_ms = now_ms();
    let windows = pb::WindowRange {
        from_ms: started_ms.saturating_sub(120_000),
        to_ms: started_ms + (args.seconds + 120) * 1000,
    };
    let counts: BTreeMap<String, Arc<Counts>> = regions
        .iter()
        .map(|r| (r.clone(), Arc::new(Counts::default())))
        .collect();
    let zipf = Arc::new(Zipf::new(args.geohashes, 0.99));
    let mut tasks = Vec::new();
    for (n, region) in regions.iter().enumerate() {
        // a few writers per region, open loop at the configured rate: each update is sent
        // on schedule whether or not the previous ones were answered (at most 256 open)
        let in_flight = Arc::new(tokio::sync::Semaphore::new(256));
        for w in 0..4u64 {
            let writer = Writer {
                client: clients[region].clone(),
                in_flight: in_flight.clone(),
                counts: counts[region].clone(),
                zipf: zipf.clone(),
                rng: Rng(0x9e37_79b9_7f4a_7c15 ^ ((n as u64) << 8 | w) | 1),
            };
            let period = Duration::from_micros(4_000_000 / args.rate.max(1));
            tasks.push(tokio::spawn(writer.run(period, deadline)));
        }
    }
    let lags = probe_until(&clients, &regions, &counts, deadline).await?;
    for t in tasks {
        t.await?;
    }
    let load_ended_ms = now_ms();
    let digests = settled(&mut clients, &windows).await?;
    report(&cluster, &counts, &digests, lags).await?;
    match &cluster.postgres {
        Some(pg) => in_postgres(&cluster, &pg.url, &clients, started_ms, load_ended_ms).await,
        None => Ok(()),
    }
}

/// Keeps a trickle of requests going (event time now, so the watermarks move) until the
/// window holding `load_ended_ms` is a row of the table; then the run's windows in
/// PostgreSQL, the table reconciled with every region's outputs topic, and the time from
/// a window's end (its last event) and from its output record to its row.
async fn in_postgres(
    cluster: &Cluster,
    url: &str,
    clients: &Clients,
    started_ms: u64,
    load_ended_ms: u64,
) -> anyhow::Result<()> {
    let (sources, spec) = outputs(cluster)?;
    let Some(spec) = spec else {
        println!(
            "(requests/ outputs no final windows in these region files: nothing in PostgreSQL)"
        );
        return Ok(());
    };
    let db = geostate::sink::postgres::connect(url, "surge-demo").await?;
    let holding = |ms: u64| i64::try_from(ms / spec.slide_ms * spec.slide_ms).unwrap_or(i64::MAX);
    let (first, last) = (holding(started_ms), holding(load_ended_ms));
    wait_until_priced(&db, clients, spec, last).await?;
    windows_table(&db, first, last).await?;
    busiest_geohashes(&db, last).await?;
    latencies(&db, first, last).await?;
    println!(
        "(a window closes {} s after its end, plus the watermark's out-of-orderness bound; then it is priced)",
        spec.allowed_lateness_ms / 1000
    );
    reconciled(url, &sources).await
}

/// Every region's outputs topic (its region file's Kafka settings), and the windows of
/// `requests/` when some region file outputs its final windows.
fn outputs(cluster: &Cluster) -> anyhow::Result<(Vec<Source>, Option<WindowSpec>)> {
    let mut sources = Vec::new();
    let mut spec = None;
    for (region, r) in &cluster.regions {
        let set = r
            .set
            .iter()
            .map(|s| s.parse().map_err(anyhow::Error::msg))
            .collect::<anyhow::Result<Vec<geostate::config::Setting>>>()?;
        let config = geostate::config::Config::load_with(&r.config, &set)?;
        spec = spec.or_else(|| {
            config
                .namespaces
                .iter()
                .find(|ns| ns.prefix == "requests/" && ns.outputs_final_windows)
                .and_then(|ns| ns.window)
        });
        sources.push(Source {
            region: region.clone(),
            kafka: config.kafka,
        });
    }
    Ok((sources, spec))
}

/// Keeps a trickle of requests and pings going in every region (event time now, so the
/// watermarks move) until the window starting at `last` is in the table with a price for
/// each of its geohashes; an error if it is not within the window's size + 120 s.
async fn wait_until_priced(
    db: &tokio_postgres::Client,
    clients: &Clients,
    spec: WindowSpec,
    last: i64,
) -> anyhow::Result<()> {
    println!();
    println!(
        "waiting for the window the load ended in to be final (its end + {} s allowed lateness + the watermark's bound) and in PostgreSQL; a trickle of requests and pings keeps event time moving",
        spec.allowed_lateness_ms / 1000
    );
    let waited = Instant::now();
    let mut i = 0u64;
    loop {
        // the last window's requests, and a price for each of its geohashes
        let rows = db
            .query_one(
                "SELECT count(*) FILTER (WHERE starts_with(key, 'requests/')),
                        count(*) FILTER (WHERE starts_with(key, 'prices/'))
                 FROM geostate_outputs WHERE window_start_ms = $1",
                &[&last],
            )
            .await?;
        let (requests, prices): (i64, i64) = (rows.get(0), rows.get(1));
        if requests > 0 && prices == requests {
            break;
        }
        if waited.elapsed() > Duration::from_secs(spec.size_ms / 1000 + 120) {
            bail!(
                "the window the load ended in is not in PostgreSQL after {:?} ({requests} geohashes, {prices} priced)",
                waited.elapsed()
            );
        }
        for client in clients.values() {
            i += 1;
            for prefix in ["requests/", "supply/"] {
                let request = pb::UpdateRequest {
                    key: format!("{prefix}{}", geohash(i as usize % 50)),
                    op: Some(pb::update_request::Op::Add(1)),
                    id: String::new(),
                    event_time_ms: now_ms(),
                };
                let _ = client.clone().update(request).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(())
}

/// The run's windows in PostgreSQL, a row each: geohashes, requests, driver pings, how
/// many were priced and surging, the highest multiplier, and which regions priced them.
async fn windows_table(db: &tokio_postgres::Client, first: i64, last: i64) -> anyhow::Result<()> {
    println!();
    println!(
        "| window (UTC) | geohashes (rows) | requests | driver pings | priced | surging (> 1) | highest multiplier | prices written by |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---|");
    let windows = db
        .query(
            "SELECT window_start_ms,
                    count(*) FILTER (WHERE starts_with(key, 'requests/')),
                    coalesce(sum(value) FILTER (WHERE starts_with(key, 'requests/')), 0)::int8,
                    coalesce(sum(value) FILTER (WHERE starts_with(key, 'supply/')), 0)::int8,
                    count(*) FILTER (WHERE starts_with(key, 'prices/')),
                    count(*) FILTER (WHERE starts_with(key, 'prices/') AND value > 1),
                    coalesce(max(value) FILTER (WHERE starts_with(key, 'prices/')), 0)::text,
                    coalesce(string_agg(DISTINCT region, ', ')
                             FILTER (WHERE starts_with(key, 'prices/')), '-')
             FROM geostate_outputs
             WHERE window_start_ms BETWEEN $1 AND $2
               AND split_part(key, '/', 1) IN ('requests', 'supply', 'prices')
             GROUP BY 1 ORDER BY 1",
            &[&first, &last],
        )
        .await?;
    for w in &windows {
        let start: i64 = w.get(0);
        let minute = (start / 1000) % 86_400;
        println!(
            "| {:02}:{:02} | {} | {} | {} | {} | {} | {} | {} |",
            minute / 3600,
            minute % 3600 / 60,
            w.get::<_, i64>(1),
            w.get::<_, i64>(2),
            w.get::<_, i64>(3),
            w.get::<_, i64>(4),
            w.get::<_, i64>(5),
            w.get::<_, String>(6),
            w.get::<_, String>(7)
        );
    }
    Ok(())
}

/// The last window's three busiest geohashes: requests, pings, and the multiplier priced.
async fn busiest_geohashes(db: &tokio_postgres::Client, last: i64) -> anyhow::Result<()> {
    let busiest = db
        .query(
            "SELECT r.key, r.value::int8, coalesce(s.value, 0)::int8, p.value::text, p.epoch
             FROM geostate_outputs r
             LEFT JOIN geostate_outputs s
               ON s.key = 'supply/' || split_part(r.key, '/', 2) AND s.window_start_ms = r.window_start_ms
             LEFT JOIN geostate_outputs p
               ON p.key = 'prices/' || split_part(r.key, '/', 2) AND p.window_start_ms = r.window_start_ms
             WHERE starts_with(r.key, 'requests/') AND r.window_start_ms = $1
             ORDER BY r.value DESC, r.key LIMIT 3",
            &[&last],
        )
        .await?;
    let busiest: Vec<String> = busiest
        .iter()
        .map(|r| {
            format!(
                "{} {} requests / {} pings -> x{} (epoch {})",
                r.get::<_, String>(0),
                r.get::<_, i64>(1),
                r.get::<_, i64>(2),
                r.get::<_, Option<String>>(3).unwrap_or_else(|| "?".into()),
                r.get::<_, Option<i64>>(4).unwrap_or_default()
            )
        })
        .collect();
    println!("busiest geohashes of the last window:");
    for b in busiest {
        println!("  {b}");
    }
    Ok(())
}

/// How long windows and multipliers took to become rows: from the window's end (its last
/// event) and from the output record, p50 and p99.
async fn latencies(db: &tokio_postgres::Client, first: i64, last: i64) -> anyhow::Result<()> {
    for (what, prefix) in [("window", "requests/"), ("multiplier", "prices/")] {
        let latency = db
            .query_one(
                "SELECT count(*),
                percentile_cont(0.5) WITHIN GROUP (ORDER BY ms_from_end),
                percentile_cont(0.99) WITHIN GROUP (ORDER BY ms_from_end),
                percentile_cont(0.5) WITHIN GROUP (ORDER BY ms_from_output),
                percentile_cont(0.99) WITHIN GROUP (ORDER BY ms_from_output)
             FROM (SELECT
                extract(epoch FROM written_at) * 1000 - window_end_ms AS ms_from_end,
                extract(epoch FROM written_at - produced_at) * 1000 AS ms_from_output
                FROM geostate_outputs
                WHERE starts_with(key, $3) AND window_start_ms BETWEEN $1 AND $2) AS r",
                &[&first, &last, &prefix],
            )
            .await?;
        let ms = |i: usize| latency.get::<_, Option<f64>>(i).unwrap_or(0.0);
        println!(
            "time to the {what} row, over {} rows: from the window's end (its last event) p50 {:.0} ms, p99 {:.0} ms; from the output record p50 {:.0} ms, p99 {:.0} ms",
            latency.get::<_, i64>(0),
            ms(1),
            ms(2),
            ms(3),
            ms(4)
        );
    }
    Ok(())
}

/// The table reconciled with every region's outputs topic: each difference, a summary,
/// and an error if there is any.
async fn reconciled(url: &str, sources: &[Source]) -> anyhow::Result<()> {
    let found = geostate::sink::reconcile::reconcile(url, sources, Duration::from_secs(30)).await?;
    for difference in &found.differences {
        println!("DIFFERENCE {difference}");
    }
    println!(
        "PostgreSQL against every region's outputs topic: {} windows, {} rows, one row per (key, window), {} differences{}; (geohash, window)s with two multipliers: {}",
        found.windows,
        found.rows,
        found.differences.len(),
        if found.differences.is_empty() {
            " (every region produced the same final windows)"
        } else {
            ""
        },
        found.rewritten.len()
    );
    if !found.differences.is_empty() {
        bail!("PostgreSQL and the outputs topics differ");
    }
    Ok(())
}

/// One open-loop writer of one region.
struct Writer {
    client: StateClient<Channel>,
    in_flight: Arc<tokio::sync::Semaphore>,
    counts: Arc<Counts>,
    zipf: Arc<Zipf>,
    rng: Rng,
}

impl Writer {
    /// Sends an update every `period` until `deadline`, then waits for the answers.
    async fn run(mut self, period: Duration, deadline: Instant) {
        let mut tick = tokio::time::interval(period);
        let mut sends: Vec<tokio::task::JoinHandle<()>> = Vec::new();
        while Instant::now() < deadline {
            tick.tick().await;
            let request = self.next_update();
            self.counts.sent.fetch_add(1, Ordering::Relaxed);
            let Ok(permit) = self.in_flight.clone().acquire_owned().await else {
                break;
            };
            let (mut client, counts) = (self.client.clone(), self.counts.clone());
            sends.push(tokio::spawn(async move {
                match client.update(request).await {
                    Ok(_) => counts.ok.fetch_add(1, Ordering::Relaxed),
                    Err(_) => counts.failed.fetch_add(1, Ordering::Relaxed),
                };
                drop(permit);
            }));
        }
        for send in sends {
            let _ = send.await;
        }
    }

    /// Five in ten a rider's request, three an available driver's ping (the event time of
    /// each the sender's clock: this one's), two a driver coming or going.
    fn next_update(&mut self) -> pb::UpdateRequest {
        let gh = geohash(self.zipf.sample(self.rng.unit()));
        let mut event_time_ms = 0;
        let (key, op) = match self.rng.next_u64() % 10 {
            0..=4 => {
                event_time_ms = now_ms();
                (format!("requests/{gh}"), pb::update_request::Op::Add(1))
            }
            5..=7 => {
                event_time_ms = now_ms();
                (format!("supply/{gh}"), pb::update_request::Op::Add(1))
            }
            _ => {
                let change = if self.rng.next_u64().is_multiple_of(2) {
                    1
                } else {
                    -1
                };
                (format!("drivers/{gh}"), pb::update_request::Op::Add(change))
            }
        };
        pb::UpdateRequest {
            key,
            op: Some(op),
            id: String::new(),
            event_time_ms,
        }
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Until `deadline`: a write in each region, timed until the next region reads it; and
/// progress every 5 s. Answers the lags, sorted.
async fn probe_until(
    clients: &Clients,
    regions: &[String],
    counts: &BTreeMap<String, Arc<Counts>>,
    deadline: Instant,
) -> anyhow::Result<Vec<Duration>> {
    let mut lags: Vec<Duration> = Vec::new();
    let mut last_report = Instant::now();
    // on a terminal the bar is redrawn in place every probe round; in a log, a line every 5 s
    let terminal = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let total = deadline.saturating_duration_since(Instant::now());
    while Instant::now() < deadline {
        for (i, from) in regions.iter().enumerate() {
            let to = &regions[(i + 1) % regions.len()];
            lags.push(probe(clients, from, to).await?);
        }
        if terminal || last_report.elapsed() >= Duration::from_secs(5) {
            last_report = Instant::now();
            let left = deadline.saturating_duration_since(Instant::now());
            let line = progress(total - left, total, counts, &lags);
            if terminal {
                print!("\r{line}\x1b[K");
                std::io::Write::flush(&mut std::io::stdout())?;
            } else {
                println!("{line}");
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    if terminal {
        let line = progress(total, total, counts, &lags);
        println!("\r{line}\x1b[K");
    }
    lags.sort();
    Ok(lags)
}

/// One line of progress: a bar of the run's time, seconds done, writes acknowledged per
/// region, and the median replication lag the probes measured so far.
fn progress(
    done: Duration,
    total: Duration,
    counts: &BTreeMap<String, Arc<Counts>>,
    lags: &[Duration],
) -> String {
    const WIDTH: usize = 30;
    let share = if total.is_zero() {
        1.0
    } else {
        (done.as_secs_f64() / total.as_secs_f64()).clamp(0.0, 1.0)
    };
    let filled = (share * WIDTH as f64).round() as usize;
    let acked: Vec<String> = counts
        .iter()
        .map(|(r, c)| format!("{r} {}", c.ok.load(Ordering::Relaxed)))
        .collect();
    let mut sorted = lags.to_vec();
    sorted.sort();
    let lag = sorted
        .get(sorted.len() / 2)
        .map_or("-".to_string(), |l| format!("{} ms", l.as_millis()));
    format!(
        "[{}{}] {:>3.0}/{:.0} s  acknowledged: {}  lag p50 {lag}",
        "#".repeat(filled),
        ".".repeat(WIDTH - filled),
        done.as_secs_f64(),
        total.as_secs_f64(),
        acked.join(", ")
    )
}

/// One probe: add 1 to `from`'s probe key there; the time until `to` reads that count.
async fn probe(clients: &Clients, from: &str, to: &str) -> anyhow::Result<Duration> {
    let key = format!("trips/probe-{from}");
    let mut writer = clients[from].clone();
    let request = pb::UpdateRequest {
        key: key.clone(),
        op: Some(pb::update_request::Op::Add(1)),
        id: String::new(),
        event_time_ms: 0,
    };
    writer.update(request).await?;
    let written = Instant::now();
    let target = probe_value(&mut writer, &key).await?;
    let mut reader = clients[to].clone();
    loop {
        if probe_value(&mut reader, &key).await? >= target {
            return Ok(written.elapsed());
        }
        if written.elapsed() > Duration::from_secs(30) {
            bail!("a write in {from} was not visible in {to} after 30 s");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Every region's digest, once they agree or 30 s have passed.
async fn settled(
    clients: &mut Clients,
    windows: &pb::WindowRange,
) -> anyhow::Result<BTreeMap<String, (usize, u64)>> {
    let settle = Instant::now();
    loop {
        let mut digests = BTreeMap::new();
        for (r, c) in clients.iter_mut() {
            digests.insert(r.clone(), digest(c, windows).await?);
        }
        let first = digests.values().next().cloned();
        if digests.values().all(|d| Some(d) == first.as_ref())
            || settle.elapsed() > Duration::from_secs(30)
        {
            return Ok(digests);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The table, the replication lag, and whether the regions hold identical state (an
/// error if not).
async fn report(
    cluster: &Cluster,
    counts: &BTreeMap<String, Arc<Counts>>,
    digests: &BTreeMap<String, (usize, u64)>,
    lags: Vec<Duration>,
) -> anyhow::Result<()> {
    println!();
    println!(
        "| region | updates sent | acknowledged | failed | events applied | keys | state digest |"
    );
    println!("|---|---:|---:|---:|---:|---:|---|");
    for (r, c) in counts {
        let mut admin = AdminClient::connect(format!("http://{}", cluster.regions[r].grpc)).await?;
        let status = admin.status(pb::StatusRequest {}).await?.into_inner();
        let (keys, d) = &digests[r];
        println!(
            "| {r} | {} | {} | {} | {} | {keys} | {d:016x} |",
            c.sent.load(Ordering::Relaxed),
            c.ok.load(Ordering::Relaxed),
            c.failed.load(Ordering::Relaxed),
            status.events_applied
        );
    }
    let pct = |p: f64| {
        lags.get(((lags.len().max(1) - 1) as f64 * p).round() as usize)
            .copied()
            .unwrap_or_default()
    };
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

/// Number of values and a hash of every (key, window, value) under the workload's
/// prefixes; the windowed ones are read for every window in `windows`, final or not.
async fn digest(
    client: &mut StateClient<Channel>,
    windows: &pb::WindowRange,
) -> anyhow::Result<(usize, u64)> {
    let mut hasher = DefaultHasher::new();
    let mut keys = 0;
    for prefix in ["requests/", "supply/", "trips/", "drivers/", "zones/"] {
        let window = matches!(prefix, "requests/" | "supply/").then_some(pb::WindowSelector {
            which: Some(pb::window_selector::Which::Range(*windows)),
        });
        let mut page_token = String::new();
        loop {
            let page = client
                .scan(pb::ScanRequest {
                    prefix: prefix.into(),
                    page_token,
                    limit: 1000,
                    window,
                })
                .await?
                .into_inner();
            for v in &page.values {
                keys += 1;
                v.key.hash(&mut hasher);
                v.window.as_ref().map(|w| w.start_ms).hash(&mut hasher);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_progress_bar_fills_with_the_run() {
        let counts = BTreeMap::from([("us-east-1".to_string(), Arc::new(Counts::default()))]);
        counts["us-east-1"].ok.store(1234, Ordering::Relaxed);
        let lags = [
            Duration::from_millis(30),
            Duration::from_millis(10),
            Duration::from_millis(20),
        ];
        let total = Duration::from_secs(60);
        let half = progress(Duration::from_secs(30), total, &counts, &lags);
        assert_eq!(
            half,
            "[###############...............]  30/60 s  acknowledged: us-east-1 1234  lag p50 20 ms"
        );
        assert!(progress(total, total, &counts, &[]).starts_with(&format!("[{}]", "#".repeat(30))));
        assert!(progress(Duration::ZERO, total, &counts, &[]).ends_with("lag p50 -"));
    }
}
