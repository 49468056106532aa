//! A record written straight to a region's updates topic cannot choose its lease epoch.
//! One above every epoch the lease group granted for its shard is dead-lettered
//! (`epoch_not_granted`), and the shard's later writes through the holder's API still
//! apply. Applied, it would have raised the shard's fence to its epoch, refusing every
//! later write below it: for ever at `u64::MAX`.

mod common;

use std::time::Duration;

use anyhow::{Context, ensure};
use common::failover::{epoch_of, key_homed_at, regions, register, replica, set, wait_held};
use common::{cluster, produce_all, producer, unique};
use geostate::ingest::event::{Op, Update};
use tonic::Code;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_epoch_the_lease_group_never_granted_is_dead_lettered_and_fences_nothing()
-> anyhow::Result<()> {
    let cluster = cluster()?;
    let (regions, lease) = regions(&cluster).await?;
    let mut home = regions.into_iter().next().context("a region")?;
    let label = unique("forged");
    let (key, shard) = key_homed_at(&lease, &home.name, &label);
    let epoch = wait_held(&mut home, shard, Duration::from_secs(30)).await?;
    let node = &cluster.regions[&home.name];
    let config = common::node_config(node)?;

    // two forged writes of the shard: the last epoch there is, and one far past the
    // current grant (the home keeps the shard: it renews, which keeps the epoch)
    let keys = (0..)
        .map(|i| format!("surge/{label}-forged-{i}"))
        .filter(|k| lease.shard_of_key(k) == shard);
    let forged: Vec<(String, Vec<u8>)> = [u64::MAX, epoch + 1000]
        .into_iter()
        .zip(keys)
        .map(|(forged_epoch, k)| {
            let update = Update {
                key: k.clone(),
                op: Op::Set(b"forged".to_vec()),
                id: None,
                event_time_ms: None,
                hlc: None,
                epoch: Some(forged_epoch),
            };
            (k, update.encode(config.kafka.format))
        })
        .collect();
    produce_all(
        &producer(&node.kafka)?,
        &config.kafka.updates_topic,
        &forged,
    )
    .await?;

    // both are dead-lettered, saying why
    let letters = common::dead_letters(
        &node.kafka,
        &config.kafka.dlq_topic,
        forged.len(),
        Duration::from_secs(60),
        |d| forged.iter().any(|(f, _)| d.key.as_ref() == Some(f)),
    )
    .await?;
    let codes: Vec<&str> = letters
        .iter()
        .map(|d| d.header("geostate.error.code").unwrap_or_default())
        .collect();
    ensure!(
        codes.iter().all(|&c| c == "epoch_not_granted"),
        "dead-letter codes {codes:?}"
    );

    // the holder's next write of the shard applies at the current epoch
    let written = home.state.update(set(&key, "after")).await?.into_inner();
    ensure!(epoch_of(&written) == epoch, "{written:?}");
    let read = home.state.get(replica(&key)).await?.into_inner();
    ensure!(register(&read) == Some(b"after"), "{read:?}");
    for (k, _) in &forged {
        let read = home.state.get(replica(k)).await;
        ensure!(
            read.as_ref().is_err_and(|s| s.code() == Code::NotFound),
            "{k} was applied: {read:?}"
        );
    }
    Ok(())
}
