//! What one caller flooding `Update` does to another caller's tail: the other writes in an
//! open loop while the flooder keeps 64 calls in flight from another address (127.0.0.2),
//! against the plaintext node of section 3 (no limits) and a node whose callers are each
//! held to a quarter of that node's maximum (`api.limits`), the runs in turn.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::*;

/// Calls the flooder keeps in flight.
const FLOOD: usize = 64;
/// The other caller's open-loop rate.
const VICTIM_RATE: u64 = 100;

/// What the flooder got.
#[derive(Default)]
struct Flooded {
    served: AtomicU64,
    limited: AtomicU64,
}

/// Keeps `FLOOD` `Update`s in flight from 127.0.0.2 against `grpc` until `stop`, refused
/// or not (a flooder does not back off).
async fn flood(
    grpc: &str,
    stop: Arc<AtomicBool>,
    flooded: Arc<Flooded>,
) -> anyhow::Result<Vec<tokio::task::JoinHandle<()>>> {
    let channel = tonic::transport::Endpoint::from_shared(grpc.to_owned())?
        .local_address(Some("127.0.0.2".parse()?))
        .connect()
        .await?;
    Ok((0..FLOOD)
        .map(|i| {
            let mut state = pb::state_client::StateClient::new(channel.clone());
            let (stop, flooded) = (stop.clone(), flooded.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let request = pb::UpdateRequest {
                        key: format!("trips/flood{i:02}"),
                        op: Some(pb::update_request::Op::Add(1)),
                        id: String::new(),
                        event_time_ms: 0,
                    };
                    match state.update(request).await {
                        Ok(_) => flooded.served.fetch_add(1, Ordering::Relaxed),
                        Err(_) => flooded.limited.fetch_add(1, Ordering::Relaxed),
                    };
                }
            })
        })
        .collect())
}

/// The other caller's latencies at `VICTIM_RATE` on `clients`, beside a flooder of `grpc`
/// or alone; and the flooder's calls served and refused per second.
async fn victim(
    clients: &[pb::state_client::StateClient<tonic::transport::Channel>],
    flooded_node: Option<&str>,
) -> anyhow::Result<(Vec<Duration>, usize, f64, f64)> {
    let (stop, flooded) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(Flooded::default()),
    );
    let tasks = match flooded_node {
        Some(grpc) => flood(grpc, stop.clone(), flooded.clone()).await?,
        None => Vec::new(),
    };
    let (latencies, errors) = update_latencies(clients, VICTIM_RATE).await?;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await?;
    }
    let per_second = |n: &AtomicU64| n.load(Ordering::Relaxed) as f64 / LEVEL_SECONDS as f64;
    let (served, limited) = (per_second(&flooded.served), per_second(&flooded.limited));
    Ok((latencies, errors, served, limited))
}

/// The four rows: `plaintext` are the clients of section 3's node at `plaintext_grpc`,
/// whose maximum was `max` acknowledged `Update`s a second.
pub(crate) async fn flood_cost(
    kafka: &str,
    work: &Path,
    max: f64,
    plaintext_grpc: &str,
    plaintext: &[pb::state_client::StateClient<tonic::transport::Channel>],
) -> anyhow::Result<Value> {
    let dir = work.join("limits");
    std::fs::create_dir_all(&dir)?;
    let topics = Topics::create(kafka, "bench-limits", PARTITIONS).await?;
    let mut node = Node::configure(&dir, kafka, &topics)?;
    // an open API: every caller is admin
    let per_caller = (max / 4.0).max(10.0).round();
    node.set(
        "api.limits",
        &format!("{{ admin = {{ rate = {per_caller}, concurrency = 8 }} }}"),
    );
    let pid = node.start().await?;
    pin(pid, SUT_CORE)?;
    let mut limited = Vec::new();
    for _ in 0..4 {
        limited.push(node.state().await?);
    }
    // warm up: the keys' first writes
    update_latencies(&limited, VICTIM_RATE).await?;
    let runs = [
        ("no limits", false, victim(plaintext, None).await?),
        (
            "no limits",
            true,
            victim(plaintext, Some(plaintext_grpc)).await?,
        ),
        ("api.limits", false, victim(&limited, None).await?),
        (
            "api.limits",
            true,
            victim(&limited, Some(&node.grpc)).await?,
        ),
    ];
    node.kill9();

    println!(
        "## One caller flooding `Update` beside another ({VICTIM_RATE}/s open loop from 127.0.0.1, {LEVEL_SECONDS} s per row; the flooder keeps {FLOOD} calls in flight from 127.0.0.2, refused or not; `api.limits`: {per_caller} calls/s and 8 in flight per caller, a quarter of the node's maximum; the runs in turn, both nodes on the node core)"
    );
    println!();
    println!(
        "| node | flooder | other caller p50 | p99 | p99.9 | errors | flooder served/s | refused/s |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    let q = |l: &[Duration], p: f64| ms_of(percentile(l, p));
    let mut rows = Vec::new();
    for (name, flooding, (mut lat, errors, served, refused)) in runs {
        lat.sort();
        println!(
            "| {name} | {} | {:.2} ms | {:.2} ms | {:.2} ms | {errors} | {served:.0} | {refused:.0} |",
            if flooding { "yes" } else { "no" },
            q(&lat, 0.5),
            q(&lat, 0.99),
            q(&lat, 0.999)
        );
        rows.push(json!({"node": name, "flooder": flooding, "errors": errors,
            "p50_ms": q(&lat, 0.5), "p99_ms": q(&lat, 0.99), "p99_9_ms": q(&lat, 0.999),
            "flooder_served_per_second": served, "flooder_refused_per_second": refused}));
    }
    println!();
    Ok(json!(rows))
}
