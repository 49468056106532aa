//! A region whose wall clock runs 2 s ahead (beyond `max-clock-offset`, 500 ms) must not
//! hold leases: it would judge the other region's leases ended early and take their
//! shards while the holder still writes. Its node restarted with `clock-offset = "2000ms"`:
//!
//! - it reports its clock off (`geostate_clock_off 1`), holds no shard, and refuses owned
//!   writes, while the other region takes its home shard and writes it;
//! - restarted with its clock right, it holds shards again (its home shard comes back).
//!
//! Its own test binary: it restarts a node the other tests use.

mod common;

use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use common::failover::{key_homed_at, regions, set, wait_held};
use common::{cluster, cluster_script, unique};
use geostate::pb;
use tonic::Code;

/// Restarts the node with its clock right however the test ends.
struct RightClock(String);

impl Drop for RightClock {
    fn drop(&mut self) {
        if let Err(e) = cluster_script(&["node", "restart", &self.0]) {
            eprintln!("restarting {} with its clock right: {e}", self.0);
        }
    }
}

fn clock_off(metrics: &str) -> anyhow::Result<Option<f64>> {
    common::metric(metrics, "geostate_clock_off ")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_region_with_its_clock_beyond_the_bound_holds_no_lease() -> anyhow::Result<()> {
    let cluster = cluster()?;
    let (mut regions, lease) = regions(&cluster).await?;
    ensure!(regions.len() == 2, "the test needs two regions");
    let mut other = regions.pop().context("region")?;
    let mut skewed = regions.pop().context("region")?;
    let (key, shard) = key_homed_at(&lease, &skewed.name, &unique("clock"));
    wait_held(&mut skewed, shard, Duration::from_secs(30)).await?;

    cluster_script(&["node", "restart", &skewed.name, "--clock-offset", "2000"])?;
    let right = RightClock(skewed.name.clone());
    let deadline = Instant::now() + Duration::from_secs(60);
    while clock_off(&skewed.metrics).ok().flatten() != Some(1.0) {
        ensure!(
            Instant::now() < deadline,
            "{} did not report its clock off within 60 s",
            skewed.name
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // the other region takes the skewed region's home shard and writes it
    wait_held(&mut other, shard, Duration::from_secs(30)).await?;
    other.state.update(set(&key, "from-other")).await?;
    // for a while, the skewed region holds nothing and refuses owned writes
    for _ in 0..10 {
        let leases = skewed
            .admin
            .leases(pb::LeasesRequest::default())
            .await?
            .into_inner();
        let held: Vec<u32> = leases
            .shards
            .iter()
            .filter(|s| s.held_here)
            .map(|s| s.shard)
            .collect();
        ensure!(
            held.is_empty(),
            "{} holds {held:?} with its clock 2 s ahead",
            skewed.name
        );
        match skewed.state.update(set(&key, "from-skewed")).await {
            Err(s) if s.code() == Code::FailedPrecondition => {}
            Err(s) => bail!("an owned write at the skewed region answered {s}"),
            Ok(_) => bail!("the skewed region accepted an owned write"),
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    // its clock right again, it holds shards again: its home shard comes back
    drop(right);
    wait_held(&mut skewed, shard, Duration::from_secs(60)).await?;
    ensure!(
        clock_off(&skewed.metrics)?.unwrap_or(0.0) == 0.0,
        "the restarted node still reports its clock off"
    );
    Ok(())
}
