//! An owned write its holder acknowledged survives the loss of the holder's disk before the
//! write was shipped:
//!
//! - a region holds a shard (handed to it by the shard's home), and its deltas topic takes
//!   no writes (`Unwritable`: `max.message.bytes` = 90, below any geostate batch: every
//!   shipping round fails and is retried);
//! - it applies a backlog of counter events, then acknowledges "acked" for an owned key;
//! - its node is killed and its data dir deleted; the home region takes the shard at a
//!   later epoch and writes another key of the same shard;
//! - the node starts again on the empty dir (S3 checkpoint, own deltas topic, then a replay
//!   of its updates topic). Every leaseholder read the new holder answers from then on
//!   must return "acked", never the value from before, and both regions end with it.
//!
//! It fails if the restarted node sends a heartbeat before its replay has applied and
//! shipped what the lost node acknowledged (the new holder then serves the older value),
//! or if the replay refuses "acked" as fenced because the node merged the new holder's
//! write to another key of the shard first (then it never arrives).
//!
//! Its own test binary: it kills and wipes a node the other tests use, and starts it again.

mod common;

use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use common::failover::{
    RestartNodes, at_holder, epoch_of, key_homed_at, regions, register, set, signal, wait_held,
    wait_value,
};
use common::unwritable::Unwritable;
use common::{cluster, cluster_script, produce_all, producer, unique};
use geostate::ingest::event::{Op, Update};
use geostate::pb;
use geostate::pb::state_client::StateClient;
use tonic::Code;

/// Counter events the holder applies, and does not ship, before the owned write: its
/// replay after the wipe takes a while.
const BACKLOG: usize = 50_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acknowledged_owned_write_survives_its_holders_disk_loss() -> anyhow::Result<()> {
    let cluster = cluster()?;
    let (mut regions, lease) = regions(&cluster).await?;
    ensure!(regions.len() == 2, "the test needs two regions");
    let mut home = regions.pop().context("region")?;
    let mut holder = regions.pop().context("region")?;
    let label = unique("wipe");
    let (key, shard) = key_homed_at(&lease, &home.name, &label);
    let other_key = (0..)
        .map(|i| format!("surge/{label}-other-{i}"))
        .find(|k| lease.shard_of_key(k) == shard)
        .context("a second key of the shard")?;
    // the home hands the shard over; once it takes it back it keeps it
    wait_held(&mut home, shard, Duration::from_secs(30)).await?;
    home.admin
        .transfer_lease(pb::TransferLeaseRequest {
            shard,
            to_region: holder.name.clone(),
        })
        .await?;
    wait_held(&mut holder, shard, Duration::from_secs(30)).await?;
    holder.state.update(set(&key, "before")).await?;
    wait_value(&mut home.state, &key, "before", Duration::from_secs(60)).await?;

    // from here the holder applies and acknowledges, and ships nothing
    let node = &cluster.regions[&holder.name];
    let config = common::node_config(node)?;
    let unwritable = Unwritable::new(&node.kafka, &config.kafka.deltas_topic).await?;
    let backlog: Vec<(String, Vec<u8>)> = (0..BACKLOG)
        .map(|i| {
            let key = format!("trips/{label}-{}", i % 1000);
            let event = Update {
                key: key.clone(),
                op: Op::Add(1),
                id: None,
                event_time_ms: None,
                hlc: None,
                epoch: None,
            };
            (key, event.encode(config.kafka.format))
        })
        .collect();
    produce_all(
        &producer(&node.kafka)?,
        &config.kafka.updates_topic,
        &backlog,
    )
    .await?;
    let acked = holder.state.update(set(&key, "acked")).await?.into_inner();
    let old_epoch = epoch_of(&acked);

    // the holder's disk is lost
    let _restart = RestartNodes;
    signal("-KILL", holder.pid)?;
    while std::path::Path::new(&format!("/proc/{}", holder.pid)).exists() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    std::fs::remove_dir_all(&config.data_dir)
        .with_context(|| format!("wiping {}", config.data_dir.display()))?;

    // the home takes the shard and writes another of its keys (a blind write: no wait)
    let new_epoch = wait_held(&mut home, shard, Duration::from_secs(60)).await?;
    ensure!(new_epoch > old_epoch, "epoch {old_epoch} -> {new_epoch}");
    let other = home
        .state
        .update(set(&other_key, "other"))
        .await?
        .into_inner();
    ensure!(epoch_of(&other) == new_epoch, "{other:?}");
    println!(
        "{} acknowledged \"acked\" at epoch {old_epoch} and lost its disk; {} holds shard {shard} at epoch {new_epoch}",
        holder.name, home.name
    );

    // the node starts again on the empty dir; meanwhile the new holder's leaseholder reads
    // wait, and the first it answers must hold "acked"
    drop(unwritable);
    let started = Instant::now();
    let mut restart = Some(tokio::task::spawn_blocking(|| {
        cluster_script(&["up", "--no-build"])
    }));
    let mut waited = 0;
    let mut refusal;
    loop {
        match home.state.get(at_holder(&key)).await {
            Ok(v) => {
                let v = v.into_inner();
                ensure!(
                    register(&v) == Some(b"acked"),
                    "the new holder served {:?} after {waited} refusals, not the acknowledged \"acked\"",
                    register(&v).map(String::from_utf8_lossy)
                );
                break;
            }
            Err(s) if s.code() == Code::Unavailable => {
                waited += 1;
                refusal = s.message().to_string();
            }
            Err(s) => bail!("a leaseholder read at the new holder answered {s}"),
        }
        if let Some(done) = restart.take_if(|r| r.is_finished()) {
            // the script's own error, if it failed, instead of waiting out the deadline
            let said = done.await?.context("restarting the wiped node")?;
            let pid = common::cluster()?.regions[&holder.name].pid;
            ensure!(
                pid.is_some_and(|p| std::path::Path::new(&format!("/proc/{p}")).exists()),
                "cluster.py up ended, and the wiped node is not running (pid {pid:?}); it said: {said}"
            );
        }
        ensure!(
            started.elapsed() < Duration::from_secs(180),
            "the new holder did not serve {key} within 180 s of the restart; it last said: {refusal}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!(
        "the new holder served \"acked\" {:?} after the restart began ({waited} refusals before)",
        started.elapsed()
    );
    if let Some(restart) = restart {
        restart.await?.context("restarting the wiped node")?;
    }

    // both regions end with both writes
    let grpc = node.grpc.as_ref().context("node grpc")?;
    let mut restarted = StateClient::connect(format!("http://{grpc}")).await?;
    for (k, v) in [(&key, "acked"), (&other_key, "other")] {
        wait_value(&mut restarted, k, v, Duration::from_secs(60)).await?;
        wait_value(&mut home.state, k, v, Duration::from_secs(60)).await?;
    }
    Ok(())
}
