//! A region added to a running cluster and removed again (`cluster.py region add|remove`),
//! on a private local cluster of two regions the test starts and stops itself.
//!
//! Added: its lease member joins the running group through the group's log and votes,
//! its home shards are held and written there, it reads what the others wrote before it
//! existed (merged from their deltas topics, read from the start), and a counter written
//! in all three converges in all three. Removed: the group refuses it from then on, its
//! shard passes to another region at a higher epoch, and its increments stay counted.

mod common;

use std::time::Duration;

use anyhow::ensure;
use common::failover;

const NEW: &str = "ap-southeast-1";

#[test]
fn a_region_added_at_runtime_joins_leases_and_replication_and_leaves_again() -> anyhow::Result<()> {
    let private = common::PrivateCluster::up("region-membership", &["eu-west-1", "us-east-1"])?;
    let counter = format!("trips/{}", common::unique("regions"));
    common::block_on(async {
        // written before the third region exists: 1 in eu-west-1, 2 in us-east-1
        let (mut regions, _) = failover::regions(&private.cluster()?).await?;
        for (i, region) in regions.iter_mut().enumerate() {
            region.state.update(common::add(&counter, 1 << i)).await?;
        }
        anyhow::Ok(())
    })?;

    private.script(&["region", "add", NEW])?;
    let (key, held) = common::block_on(async {
        let (mut regions, lease) = failover::regions(&private.cluster()?).await?;
        let names: Vec<&str> = regions.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, [NEW, "eu-west-1", "us-east-1"]);
        let status = failover::leases(&mut regions[0]).await?;
        ensure!(
            status.shards.iter().any(|s| s.home == NEW),
            "the group counts {NEW} among the homes: {:?}",
            status.shards
        );
        // its home shard is held there and written there, and seen in the other two
        let (key, shard) = failover::key_homed_at(&lease, NEW, &common::unique("joined"));
        let held = failover::wait_held(&mut regions[0], shard, Duration::from_secs(60)).await?;
        let (_, written) =
            failover::write_until_accepted(&mut regions[0], &key, NEW, Duration::from_secs(30))
                .await?;
        ensure!(failover::epoch_of(&written) >= held);
        for other in regions.iter_mut() {
            failover::wait_value(&mut other.state, &key, NEW, Duration::from_secs(60)).await?;
        }
        // it merged what the others wrote before it existed; written there too: 1+2+4
        failover::wait_counter(&mut regions[0], &counter, 3, Duration::from_secs(60)).await?;
        regions[0].state.update(common::add(&counter, 4)).await?;
        for region in regions.iter_mut() {
            failover::wait_counter(region, &counter, 7, Duration::from_secs(60)).await?;
        }
        println!(
            "{NEW} joined: holds shard {shard} at epoch {held}; the counter reads 7 in all three"
        );
        anyhow::Ok((key, held))
    })?;

    private.script(&["region", "remove", NEW])?;
    common::block_on(async {
        let (mut regions, _) = failover::regions(&private.cluster()?).await?;
        let names: Vec<&str> = regions.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["eu-west-1", "us-east-1"]);
        let status = failover::leases(&mut regions[0]).await?;
        ensure!(
            status.shards.iter().all(|s| s.home != NEW),
            "{NEW} is still a home: {:?}",
            status.shards
        );
        // its shard passes to another region, at a higher epoch
        let (_, taken) = failover::write_anywhere(&mut regions, &key).await?;
        ensure!(
            failover::epoch_of(&taken) > held,
            "written at epoch {} after {NEW}'s {held}",
            failover::epoch_of(&taken)
        );
        for region in regions.iter_mut() {
            failover::wait_counter(region, &counter, 7, Duration::from_secs(60)).await?;
        }
        println!(
            "{NEW} removed: its shard written at epoch {}",
            failover::epoch_of(&taken)
        );
        anyhow::Ok(())
    })
}
