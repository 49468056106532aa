//! Regions benchmark (`make bench`): replication lag and convergence with two regions (the
//! bench cluster) and with three (a private cluster of its own, started and stopped
//! here), measured side by side in one run. Prints figures, asserts nothing.
//!
//! Every region writes one new key per write at the same open-loop rate at once, and
//! every region watches every key: the lag of a flow is the time from a write's `Update`
//! ack in its region (applied there) to its `Watch` event in another region; a write has
//! converged once every other region delivered it.

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "shared/flow.rs"]
mod flow;

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, bail};
use common::{Cluster, PrivateCluster, cluster, unique};
use geostate::pb::state_client::StateClient;

/// Writes per second per region, and for how long; first a round of `WARM_UP` seconds,
/// not counted, so that every mirror flow has its connections and fetch sessions open.
const RATE: u64 = 50;
const SECONDS: u64 = 15;
const WARM_UP: u64 = 5;
const THREE: [&str; 3] = ["ap-southeast-1", "eu-west-1", "us-east-1"];

fn main() -> anyhow::Result<()> {
    common::block_on(run())
}

struct Measured {
    regions: usize,
    /// (origin, remote) -> lags, sorted.
    flows: BTreeMap<(String, String), Vec<Duration>>,
    /// Per write, until every other region had it, sorted.
    everywhere: Vec<Duration>,
}

async fn run() -> anyhow::Result<()> {
    println!("# geostate regions benchmark");
    println!();
    println!(
        "machine: {} cores; every region's broker, MirrorMaker 2, nodes and the load generator share them",
        std::thread::available_parallelism()?.get()
    );
    println!();
    let two = cluster()?;
    measure(&two, WARM_UP).await?;
    let two = measure(&two, SECONDS).await?;
    let private = PrivateCluster::up("three-regions", &THREE)?;
    let three = private.cluster()?;
    measure(&three, WARM_UP).await?;
    let three = measure(&three, SECONDS).await?;
    drop(private);

    println!(
        "## Replication lag per flow ({RATE} writes/s per region for {SECONDS} s after {WARM_UP} s not counted, open loop, all regions at once)"
    );
    println!();
    println!(
        "From the `Update` ack in the origin (applied there) to the `Watch` event in the remote, through MirrorMaker 2."
    );
    println!();
    println!("| regions | flow | writes | p50 | p99 | max |");
    println!("|---:|---|---:|---:|---:|---:|");
    for m in [&two, &three] {
        for ((origin, remote), lags) in &m.flows {
            println!(
                "| {} | {origin} → {remote} | {} |",
                m.regions,
                flow::figures(lags)
            );
        }
    }
    println!();
    println!("## Convergence");
    println!();
    println!("From a write's ack in its region until every other region delivered it.");
    println!();
    println!("| regions | writes | p50 | p99 | max |");
    println!("|---:|---:|---:|---:|---:|");
    for m in [&two, &three] {
        println!("| {} | {} |", m.regions, flow::figures(&m.everywhere));
    }
    Ok(())
}

async fn measure(cluster: &Cluster, seconds: u64) -> anyhow::Result<Measured> {
    let mut clients = BTreeMap::new();
    for (name, r) in &cluster.regions {
        let grpc = r.grpc.clone().context("the cluster runs no node")?;
        clients.insert(
            name.clone(),
            StateClient::connect(format!("http://{grpc}")).await?,
        );
    }
    let prefix = format!("trips/{}/", unique("regions"));
    let per_region = (RATE * seconds) as usize;
    let total = per_region * clients.len();
    // every region watches every key (its own writes among them)
    let mut watchers = BTreeMap::new();
    for (name, client) in &mut clients {
        watchers.insert(
            name.clone(),
            flow::first_seen(client, &prefix, total).await?,
        );
    }
    let writers: Vec<_> = clients
        .iter()
        .map(|(name, client)| {
            let (client, keys) = (client.clone(), format!("{prefix}{name}/"));
            tokio::spawn(async move { flow::add_new_keys(&client, &keys, RATE, per_region).await })
        })
        .collect();
    let mut acked = BTreeMap::new();
    for (name, writer) in clients.keys().zip(writers) {
        acked.insert(name.clone(), writer.await??);
    }
    let mut seen = BTreeMap::new();
    for (name, watcher) in watchers {
        let got = watcher.await?;
        if got.len() < total {
            bail!("{name} delivered {} of {total} writes", got.len());
        }
        seen.insert(name, got);
    }
    let mut flows = BTreeMap::new();
    let mut everywhere = Vec::new();
    for (origin, writes) in &acked {
        let mut last = vec![Duration::ZERO; writes.len()];
        for (remote, got) in seen.iter().filter(|(r, _)| *r != origin) {
            let mut lags: Vec<Duration> = writes
                .iter()
                .map(|(key, at)| got[key].saturating_duration_since(*at))
                .collect();
            for (l, lag) in last.iter_mut().zip(&lags) {
                *l = (*l).max(*lag);
            }
            lags.sort();
            flows.insert((origin.clone(), remote.clone()), lags);
        }
        everywhere.extend(last);
    }
    everywhere.sort();
    Ok(Measured {
        regions: clients.len(),
        flows,
        everywhere,
    })
}
