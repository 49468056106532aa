//! What TLS costs an `Update`: the same open loop at half the plaintext node's maximum,
//! against the plaintext node and a node with `[tls]` and `[api.auth]` (over connections
//! kept open, and over a new connection, a full TLS 1.3 handshake, per request), taken in
//! turns, twice, so that the brokers' state drifts alike for all three.

use super::*;
use common::pki::Pki;
use common::{Secure, percentile};
use geostate::security::tls;

/// An open loop of `Update`s at `rate`/s for `LEVEL_SECONDS` over TLS with `client`:
/// on `kept` channels, or (none) on a new connection each.
async fn tls_latencies(
    node: &Node,
    client: &Arc<rustls::ClientConfig>,
    kept: &[pb::state_client::StateClient<tonic::transport::Channel>],
    rate: u64,
) -> anyhow::Result<(Vec<Duration>, usize)> {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..rate * LEVEL_SECONDS {
        let scheduled = schedule(started, rate, i);
        let kept = (!kept.is_empty()).then(|| kept[i as usize % kept.len()].clone());
        let (addr, client) = (node.grpc.clone(), client.clone());
        tokio::time::sleep_until(scheduled.into()).await;
        tasks.push(tokio::spawn(async move {
            let mut state = match kept {
                Some(state) => state,
                None => {
                    let channel = tls::connect_with(&addr, client, Duration::from_secs(5)).await;
                    pb::state_client::StateClient::new(channel.map_err(|e| e.to_string())?)
                }
            };
            let request = pb::UpdateRequest {
                key: format!("trips/tls{:04}", i % 1000),
                op: Some(pb::update_request::Op::Add(1)),
                id: String::new(),
                event_time_ms: 0,
            };
            let acked = state.update(request).await.map_err(|e| e.to_string());
            acked.map(|_| scheduled.elapsed())
        }));
    }
    let mut latencies = Vec::new();
    let mut errors = 0;
    for t in tasks {
        match t.await? {
            Ok(d) => latencies.push(d),
            Err(_) => errors += 1,
        }
    }
    latencies.sort();
    Ok((latencies, errors))
}

/// Rounds of the three runs.
const ROUNDS: usize = 2;

/// The three rows at `rate`: `plaintext` are the plaintext node's clients.
pub(crate) async fn tls_cost(
    kafka: &str,
    work: &Path,
    rate: u64,
    plaintext: &[pb::state_client::StateClient<tonic::transport::Channel>],
) -> anyhow::Result<Value> {
    let dir = work.join("tls");
    std::fs::create_dir_all(&dir)?;
    let pki = Pki::new(&dir, "bench")?;
    let tls_config = pki.tls("us-east-1")?;
    let admin_tokens = dir.join("admin.tokens");
    std::fs::write(&admin_tokens, "bench-admin-token\n")?;
    let topics = Topics::create(kafka, "bench-tls", PARTITIONS).await?;
    let mut node = Node::configure(&dir, kafka, &topics)?;
    let path = |p: &Path| format!("{:?}", p.display().to_string());
    node.set(
        "tls",
        &format!(
            "{{ cert = {}, key = {}, ca = {} }}",
            path(&tls_config.cert),
            path(&tls_config.key),
            path(&tls_config.ca)
        ),
    );
    node.set(
        "api.auth",
        &format!(
            "{{ anonymous = \"write\", token-files = {{ admin = {} }} }}",
            path(&admin_tokens)
        ),
    );
    let client = pki.client(None)?;
    node.secure = Some(Secure {
        client: client.clone(),
        admin_token: "bench-admin-token".into(),
    });
    let pid = node.start().await?;
    pin(pid, SUT_CORE)?;
    let mut kept = Vec::new();
    for _ in 0..4 {
        let channel = tls::connect_with(&node.grpc, client.clone(), Duration::from_secs(5)).await?;
        kept.push(pb::state_client::StateClient::new(channel));
    }
    // warm up: the keys' first writes, the connections' first streams
    tls_latencies(&node, &client, &kept, rate / 4).await?;
    let mut runs: [(Vec<Duration>, usize); 3] = Default::default();
    for _ in 0..ROUNDS {
        let measured = [
            update_latencies(plaintext, rate).await?,
            tls_latencies(&node, &client, &kept, rate).await?,
            tls_latencies(&node, &client, &[], rate).await?,
        ];
        for (run, (latencies, errors)) in runs.iter_mut().zip(measured) {
            run.0.extend(latencies);
            run.1 += errors;
        }
    }
    for run in &mut runs {
        run.0.sort();
    }
    node.kill9();

    println!(
        "## TLS on `Update` ({rate}/s open loop, half the plaintext node's maximum; {ROUNDS} rounds of {LEVEL_SECONDS} s per row, the rows in turn; the plaintext node above beside a second node with `[tls]` (TLS 1.3, ECDSA P-256 certificates from `geostate certs`) and `[api.auth]`, both on the node core)"
    );
    println!();
    println!("| connection | p50 | p99 | p99.9 | errors |");
    println!("|---|---:|---:|---:|---:|");
    let q = |l: &[Duration], p: f64| ms_of(percentile(l, p));
    let mut rows = Vec::new();
    let names = [
        "plaintext",
        "TLS, connections kept",
        "TLS, a new connection (handshake) per Update",
    ];
    for (name, (lat, errors)) in names.into_iter().zip(&runs) {
        let lat = &lat[..];
        println!(
            "| {name} | {:.2} ms | {:.2} ms | {:.2} ms | {errors} |",
            q(lat, 0.5),
            q(lat, 0.99),
            q(lat, 0.999)
        );
        rows.push(json!({"connection": name, "rate": rate, "errors": errors,
            "p50_ms": q(lat, 0.5), "p99_ms": q(lat, 0.99), "p99_9_ms": q(lat, 0.999)}));
    }
    println!();
    Ok(json!(rows))
}
