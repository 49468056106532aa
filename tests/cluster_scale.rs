//! The nodes `make up` starts, grown to two per region with `cluster.py node add` and shrunk
//! back with `node remove`: through MirrorMaker 2, both regions count every write exactly
//! at every node, before and after one added node is killed in the middle of ingest, and
//! after it is started again. The region's first node keeps its lease group member, so
//! the test leaves the cluster as it found it (the added nodes removed, the first nodes
//! owning every partition again) for the tests after it.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use common::failover::replica;
use common::{cluster, cluster_script, counter, produce_all, producer, unique};
use geostate::pb;
use geostate::pb::admin_client::AdminClient;
use geostate::pb::state_client::StateClient;

const PARTITIONS: usize = 4;
const KEYS: usize = 16;

/// Removes the nodes it added when the test ends, however it ends.
struct Added(Vec<String>);

impl Drop for Added {
    fn drop(&mut self) {
        for node in &self.0 {
            if let Err(e) = cluster_script(&["node", "remove", node]) {
                eprintln!("removing {node}: {e}");
            }
        }
    }
}

/// Every running node's gRPC address, per region (the first node first).
fn nodes() -> anyhow::Result<Vec<(String, Vec<String>)>> {
    let cluster = cluster()?;
    let alive = |pid: Option<u32>| {
        pid.is_some_and(|p| std::path::Path::new(&format!("/proc/{p}")).exists())
    };
    let mut out = Vec::new();
    for (region, r) in &cluster.regions {
        let mut addrs = vec![r.grpc.clone().context("no first node")?];
        addrs.extend(
            r.nodes
                .values()
                .filter(|n| alive(n.pid))
                .filter_map(|n| n.grpc.clone()),
        );
        out.push((region.clone(), addrs));
    }
    Ok(out)
}

async fn owned(addr: &str) -> anyhow::Result<Vec<i32>> {
    let mut admin = AdminClient::connect(format!("http://{addr}")).await?;
    Ok(admin
        .status(pb::StatusRequest {})
        .await?
        .into_inner()
        .owned_partitions)
}

/// Waits until, in every region, the nodes own disjoint sets covering every partition,
/// each at least one (`spread`) or the first node all of them.
async fn owners_settled(spread: bool, within: Duration) -> anyhow::Result<()> {
    let until = Instant::now() + within;
    loop {
        let mut settled = true;
        let mut seen = Vec::new();
        for (region, addrs) in nodes()? {
            let mut all = BTreeSet::new();
            let mut count = 0;
            let mut each = Vec::new();
            for addr in &addrs {
                let o = owned(addr).await.unwrap_or_default();
                count += o.len();
                each.push(o.len());
                all.extend(o);
            }
            settled &= all.len() == PARTITIONS
                && count == PARTITIONS
                && if spread {
                    each.iter().all(|&n| n > 0)
                } else {
                    each.first() == Some(&PARTITIONS)
                };
            seen.push((region, each));
        }
        if settled {
            return Ok(());
        }
        if Instant::now() > until {
            bail!("partitions not settled (spread {spread}) within {within:?}: {seen:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until every node of every region reads `want(i)` for every key.
async fn everywhere(
    base: &str,
    want: impl Fn(usize) -> i64,
    within: Duration,
) -> anyhow::Result<()> {
    let until = Instant::now() + within;
    loop {
        let mut wrong = Vec::new();
        for (region, addrs) in nodes()? {
            for addr in addrs {
                let Ok(mut state) = StateClient::connect(format!("http://{addr}")).await else {
                    wrong.push(format!("{region} {addr}: unreachable"));
                    continue;
                };
                for i in 0..KEYS {
                    let key = format!("requests/{base}-{i}");
                    match state.get(replica(&key)).await {
                        Ok(v) if counter(v.get_ref()) == want(i) => {}
                        Ok(v) => wrong.push(format!(
                            "{region} {addr} {key}: {} (want {})",
                            counter(v.get_ref()),
                            want(i)
                        )),
                        Err(s) => wrong.push(format!("{region} {addr} {key}: {}", s.message())),
                    }
                }
            }
        }
        if wrong.is_empty() {
            return Ok(());
        }
        if Instant::now() > until {
            bail!("not every node reads every count within {within:?}: {wrong:?}");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

#[tokio::test]
async fn two_nodes_per_region_count_every_write_across_regions_through_a_kill() -> anyhow::Result<()>
{
    let wait = Duration::from_secs(90);
    let mut added = Added(Vec::new());
    for region in ["us-east-1", "eu-west-1"] {
        cluster_script(&["node", "add", region])?;
        added.0.push(format!("{region}/1"));
    }
    owners_settled(true, wait).await?;

    // each key gets i+1 through gRPC in each region, at its first node and at its added
    // one (whichever owns the key's partition answers)
    let base = unique("cluster-scale");
    for (_, addrs) in nodes()? {
        for (n, addr) in addrs.iter().enumerate() {
            let mut state = StateClient::connect(format!("http://{addr}")).await?;
            for i in (0..KEYS).filter(|i| i % 2 == n % 2) {
                state
                    .update(pb::UpdateRequest {
                        key: format!("requests/{base}-{i}"),
                        op: Some(pb::update_request::Op::Add(2 * (i as i64 + 1))),
                        id: String::new(),
                    })
                    .await?;
            }
        }
    }
    everywhere(&base, |i| 4 * (i as i64 + 1), wait).await?;

    // 50 rounds more straight to us-east-1's updates topic; its added node dies meanwhile
    let cluster = cluster()?;
    let kafka = cluster.regions["us-east-1"].kafka.clone();
    let mut records = Vec::new();
    for _ in 0..50 {
        for i in 0..KEYS {
            let key = format!("requests/{base}-{i}");
            records.push((
                key.clone(),
                format!(r#"{{"key":"{key}","add":1}}"#).into_bytes(),
            ));
        }
    }
    produce_all(&producer(&kafka)?, "geostate.updates", &records).await?;
    cluster_script(&["node", "kill", "us-east-1/1"])?;
    everywhere(&base, |i| 4 * (i as i64 + 1) + 50, wait).await?;

    cluster_script(&["up", "--no-build"])?;
    owners_settled(true, wait).await?;
    everywhere(&base, |i| 4 * (i as i64 + 1) + 50, wait).await?;

    drop(added);
    owners_settled(false, wait).await?;
    Ok(())
}
