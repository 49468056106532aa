//! Open-loop writes of new keys in one region and the `Watch` that sees them arrive in
//! another: the replication lag the benchmarks measure (`benches/replication.rs`,
//! `benches/regions.rs`).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use geostate::pb;
use geostate::pb::state_client::StateClient;
use tokio::task::JoinHandle;
use tokio_stream::StreamExt;
use tonic::transport::Channel;

/// Watches `prefix` at `client` until `keys` keys arrived (or none for 30 s): each key
/// with when its first event was delivered. Open once this returns.
pub(crate) async fn first_seen(
    client: &mut StateClient<Channel>,
    prefix: &str,
    keys: usize,
) -> anyhow::Result<JoinHandle<BTreeMap<String, Instant>>> {
    let mut stream = client
        .watch(pb::WatchRequest {
            prefix: prefix.to_owned(),
        })
        .await?
        .into_inner();
    Ok(tokio::spawn(async move {
        let mut seen = BTreeMap::new();
        while seen.len() < keys {
            match tokio::time::timeout(Duration::from_secs(30), stream.next()).await {
                Ok(Some(Ok(v))) => {
                    seen.entry(v.key).or_insert_with(Instant::now);
                }
                _ => break,
            }
        }
        seen
    }))
}

/// `writes` new keys `<prefix><i, 6 digits>`, each added 1 at `rate` per second on a
/// fixed schedule (open loop); answers each key and when its `Update` was acknowledged.
pub(crate) async fn add_new_keys(
    client: &StateClient<Channel>,
    prefix: &str,
    rate: u64,
    writes: usize,
) -> anyhow::Result<Vec<(String, Instant)>> {
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(writes);
    for i in 0..writes {
        let scheduled = started + Duration::from_micros(i as u64 * 1_000_000 / rate);
        tokio::time::sleep_until(scheduled.into()).await;
        let (mut client, key) = (client.clone(), format!("{prefix}{i:06}"));
        tasks.push(tokio::spawn(async move {
            client
                .update(crate::common::add(&key, 1))
                .await
                .map(|_| (key, Instant::now()))
        }));
    }
    let mut acked = Vec::with_capacity(writes);
    for t in tasks {
        acked.push(t.await??);
    }
    Ok(acked)
}

/// A table's `writes | p50 | p99 | max` cells for sorted times.
pub(crate) fn figures(sorted: &[Duration]) -> String {
    use crate::common::{ms, percentile};
    format!(
        "{} | {} | {} | {}",
        sorted.len(),
        ms(percentile(sorted, 0.5)),
        ms(percentile(sorted, 0.99)),
        ms(sorted.last().copied().unwrap_or_default())
    )
}
