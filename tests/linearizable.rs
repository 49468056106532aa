//! A new lease holder serves linearizable operations (leaseholder reads, compare-and-sets)
//! only once the old holder's acknowledged writes have arrived:
//!
//! - a region holds a shard homed at the other region (handed to it by a transfer), and
//!   acknowledges a write while MirrorMaker 2 is stopped, so it cannot reach the other
//!   region; then it is frozen past its lease;
//! - the other region (the shard's home) takes the shard, but its leaseholder read and its compare-and-set
//!   from the value it last saw are answered UNAVAILABLE (not the stale value), while a
//!   plain read there still shows the stale replica;
//! - once the mirror runs and the old holder is resumed, the new holder's leaseholder read
//!   returns the acknowledged write, and a compare-and-set from it succeeds at the new
//!   epoch.
//!
//! Its own test binary: it stops the mirror and freezes a node the other tests use.

mod common;

use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use common::failover::{
    Frozen, at_holder, epoch_of, key_homed_at, moving, regions, register, replica, set, wait_held,
    wait_value,
};
use common::{RestartMirror, cluster, cluster_script, unique};
use geostate::pb;
use tonic::Code;

fn cas(key: &str, expected: &str, value: &str) -> pb::UpdateRequest {
    pb::UpdateRequest {
        key: key.into(),
        op: Some(pb::update_request::Op::Cas(pb::CompareAndSet {
            expected: Some(expected.as_bytes().to_vec()),
            value: value.as_bytes().to_vec(),
        })),
        id: String::new(),
        event_time_ms: 0,
    }
}

/// The new holder refuses: the old holder's acknowledged writes have not all arrived.
fn changed_hands(s: &tonic::Status) -> bool {
    s.code() == Code::Unavailable && s.message().contains("changed hands")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_holder_waits_for_the_old_holders_acknowledged_writes() -> anyhow::Result<()> {
    let cluster = cluster()?;
    let (mut regions, lease) = regions(&cluster).await?;
    ensure!(regions.len() == 2, "the test needs two regions");
    let mut other = regions.pop().context("region")?;
    let mut holder = regions.pop().context("region")?;
    // homed at the other region, which hands it over: once it takes the shard back it
    // keeps it (the resumed holder does not ask for a shard homed elsewhere)
    let (key, shard) = key_homed_at(&lease, &other.name, &unique("linearizable"));
    wait_held(&mut other, shard, Duration::from_secs(30)).await?;
    other
        .admin
        .transfer_lease(pb::TransferLeaseRequest {
            shard,
            to_region: holder.name.clone(),
        })
        .await?;
    wait_held(&mut holder, shard, Duration::from_secs(30)).await?;

    // "seen" reaches the other region; then the mirror stops and "acked" does not
    holder.state.update(set(&key, "seen")).await?;
    wait_value(&mut other.state, &key, "seen", Duration::from_secs(60)).await?;
    cluster_script(&["mirror", "stop"])?;
    let _restart = RestartMirror;
    let acked = holder.state.update(set(&key, "acked")).await?.into_inner();
    let old_epoch = epoch_of(&acked);

    // the holder frozen past its lease: the other region takes the shard
    let frozen = Frozen::new(holder.pid)?;
    let new_epoch = wait_held(&mut other, shard, Duration::from_secs(60)).await?;
    ensure!(new_epoch > old_epoch, "epoch {old_epoch} -> {new_epoch}");
    println!(
        "{} holds shard {shard} at epoch {new_epoch}; {} acknowledged \"acked\" at {old_epoch}",
        other.name, holder.name
    );

    // the replica still shows "seen"; the holder's linearizable answers must not
    let replica = other.state.get(replica(&key)).await?.into_inner();
    ensure!(register(&replica) == Some(b"seen"), "{replica:?}");
    // (three refusals each for the reason; a key whose partition is moving between the
    // region's nodes is refused before any lease is looked at, and asked again)
    let (mut reads, mut writes) = (0, 0);
    let deadline = Instant::now() + Duration::from_secs(60);
    while reads < 3 || writes < 3 {
        ensure!(
            Instant::now() < deadline,
            "{reads} reads and {writes} writes refused for the change of hands within 60 s"
        );
        match other.state.get(at_holder(&key)).await {
            Err(s) if changed_hands(&s) => reads += 1,
            Err(s) if moving(&s) => {}
            Err(s) => bail!("a leaseholder read at the new holder answered {s}"),
            Ok(v) => bail!(
                "the new holder served a leaseholder read before the old holder's acknowledged write arrived: {:?}",
                v.into_inner()
            ),
        }
        match other.state.update(cas(&key, "seen", "from-stale")).await {
            Err(s) if changed_hands(&s) => writes += 1,
            Err(s) if moving(&s) => {}
            Err(s) => bail!("a compare-and-set at the new holder answered {s}"),
            Ok(_) => bail!("the new holder applied a compare-and-set on a stale value"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // healed: the acknowledged write arrives, and the new holder serves it
    drop(frozen);
    cluster_script(&["mirror", "start"])?;
    let deadline = Instant::now() + Duration::from_secs(120);
    let seen = loop {
        match other.state.get(at_holder(&key)).await {
            Ok(v) => break v.into_inner(),
            Err(s) if s.code() == Code::Unavailable => {}
            Err(s) => bail!("{s}"),
        }
        ensure!(
            Instant::now() < deadline,
            "the new holder did not settle within 120 s of the heal"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    ensure!(
        register(&seen) == Some(b"acked"),
        "the new holder read {seen:?}, not the acknowledged \"acked\""
    );
    let next = other.state.update(cas(&key, "acked", "next")).await?;
    ensure!(epoch_of(&next.into_inner()) == new_epoch);
    // and from a stale one it fails, naming the current value
    let stale = other
        .state
        .update(cas(&key, "seen", "again"))
        .await
        .expect_err("a compare-and-set from a value no longer current");
    ensure!(
        stale.code() == Code::FailedPrecondition && stale.message().contains("\"next\""),
        "{stale}"
    );
    Ok(())
}
