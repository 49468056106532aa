//! Three regions, on a private local cluster the test starts and stops itself
//! (`REGIONS=us-east-1,eu-west-1,ap-southeast-1`, a run folder next to the suite's): the
//! lease group is the three regions and no witness, MirrorMaker 2 mirrors every region's
//! deltas into both others, and each region is home to a share of the shards. A counter
//! written in all three converges in all three; an owned write at its home is seen in the
//! other two; with one region's node killed, the other two (a majority) take its shards
//! and write them at a higher epoch, and it takes them back once it runs again.

mod common;

use std::time::Duration;

use anyhow::ensure;
use common::failover;

const REGIONS: [&str; 3] = ["ap-southeast-1", "eu-west-1", "us-east-1"];

#[test]
fn three_regions_replicate_each_to_each_and_two_of_them_take_over_a_lost_ones_shards()
-> anyhow::Result<()> {
    let three = common::PrivateCluster::up("three-regions", &REGIONS)?;
    common::block_on(async {
        let cluster = three.cluster()?;
        ensure!(
            cluster.witness.is_none(),
            "three regions are a majority of their own: no witness"
        );
        let (mut regions, lease) = failover::regions(&cluster).await?;
        let names: Vec<&str> = regions.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, REGIONS);
        assert_eq!(lease.members.len(), 3, "{:?}", lease.members);
        assert!(lease.members.values().all(|m| m.region.is_some()));

        // every region is some shard's home and holds it
        let mut owned = Vec::new();
        for i in 0..regions.len() {
            let (key, shard) = failover::key_homed_at(&lease, REGIONS[i], &common::unique("three"));
            failover::wait_held(&mut regions[i], shard, Duration::from_secs(30)).await?;
            owned.push((key, shard));
        }

        // a counter written in each region converges in each: six mirror flows
        let counter = format!("trips/{}", common::unique("three"));
        for (i, region) in regions.iter_mut().enumerate() {
            region.state.update(common::add(&counter, 1 << i)).await?;
        }
        for region in &mut regions {
            failover::wait_counter(region, &counter, 7, Duration::from_secs(60)).await?;
        }

        // an owned write at its home is seen in the other two
        let mut epochs = Vec::new();
        for i in 0..regions.len() {
            let (key, _) = &owned[i];
            let (_, written) = failover::write_until_accepted(
                &mut regions[i],
                key,
                REGIONS[i],
                Duration::from_secs(30),
            )
            .await?;
            epochs.push(failover::epoch_of(&written));
            for other in regions.iter_mut() {
                failover::wait_value(&mut other.state, key, REGIONS[i], Duration::from_secs(60))
                    .await?;
            }
        }

        // ap-southeast-1's node killed: the other two are a majority and take its shard
        let (key, shard) = owned[0].clone();
        three.script(&["node", "kill", REGIONS[0]])?;
        let (mut taker, took) = failover::write_anywhere(&mut regions[1..], &key).await?;
        ensure!(
            failover::epoch_of(&took) > epochs[0],
            "the shard was written at epoch {} after {}'s epoch {}",
            failover::epoch_of(&took),
            REGIONS[0],
            epochs[0]
        );
        taker += 1;
        println!(
            "{} took shard {shard} of the killed {} at epoch {}",
            REGIONS[taker],
            REGIONS[0],
            failover::epoch_of(&took)
        );

        // started again, it takes its home shard back, at a higher epoch still
        three.script(&["up", "--no-build"])?;
        let cluster = three.cluster()?;
        let (mut regions, _) = failover::regions(&cluster).await?;
        let back = failover::wait_held(&mut regions[0], shard, Duration::from_secs(60)).await?;
        ensure!(
            back > failover::epoch_of(&took),
            "taken back at epoch {back}"
        );
        let (_, written) =
            failover::write_until_accepted(&mut regions[0], &key, "back", Duration::from_secs(30))
                .await?;
        ensure!(failover::epoch_of(&written) >= back);
        for other in regions.iter_mut() {
            failover::wait_value(&mut other.state, &key, "back", Duration::from_secs(60)).await?;
        }
        Ok(())
    })
}
