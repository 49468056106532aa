//! The holder region cut off (its node frozen with SIGSTOP past the lease: its Raft, Kafka
//! and gRPC traffic all stop) while both regions write one owned key:
//!
//! - the other region takes the shard within lease + election time, at a higher epoch;
//! - the old holder's delta for the key at its old epoch (replayed onto its deltas topic,
//!   with a newer clock) is refused by the other region as `fenced`, its value stays;
//! - once resumed, the old holder refuses owned writes (its lease is gone) until its home
//!   shard comes back to it at a yet higher epoch;
//! - every accepted write's epoch belongs to one region only (no overlapping epochs),
//!   epochs rise in the order writes were accepted, and both regions converge to the
//!   newest owner's value.
//!
//! The frozen node is the lease group leader's region (if the witness leads, it is paused
//! until a region is elected), so the remaining majority (the other region and the
//! witness) must elect a new leader before it can grant. Its own test binary: it freezes
//! a cluster node the other tests use.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use common::failover::{
    cut_off, epoch_of, key_homed_at, make_a_region_lead, regions, renewing, replica, set,
    wait_held, witness_pid, write_until_accepted,
};
use common::{cluster, http_get, unique};
use geostate::crdt::{CrdtValue, Delta, LwwRegister, OrderStamp, RegionId};
use geostate::pb;
use rdkafka::producer::FutureRecord;
use tonic::Code;

fn fenced_count(metrics: &str, from: &str) -> anyhow::Result<u64> {
    let text = http_get(metrics, "/metrics")?;
    Ok(text
        .lines()
        .filter(|l| {
            l.starts_with("geostate_deltas_refused_total")
                && l.contains("reason=\"fenced\"")
                && l.contains(&format!("region=\"{from}\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64)
}

fn now_nanos() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_holder_loses_its_shard_and_epochs_never_overlap() -> anyhow::Result<()> {
    let cluster = cluster()?;
    let (mut regions, lease) = regions(&cluster).await?;
    ensure!(regions.len() == 2, "the partition test needs two regions");

    // the victim: the lease group leader's region (if the witness leads, it is paused
    // until a region is elected), so the remaining majority must elect a leader to grant
    let witness = witness_pid(&cluster)?;
    let victim = make_a_region_lead(&mut regions, witness).await?;
    let (mut holder, mut other) = {
        let mut it = regions.drain(..);
        let (a, b) = (it.next().context("region")?, it.next().context("region")?);
        if victim == 0 { (a, b) } else { (b, a) }
    };
    println!("freezing {}, the lease group leader's region", holder.name);
    let (key, shard) = key_homed_at(&lease, &holder.name, &unique("partition"));
    wait_held(&mut holder, shard, Duration::from_secs(30)).await?;

    // every accepted write: (epoch, region), in the order accepted
    let mut accepted: Vec<(u64, String)> = Vec::new();

    // only the holder writes it; the refusal names the holder (once the other region's
    // copy of the table shows it)
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let refused = other
            .state
            .update(set(&key, "from-other"))
            .await
            .expect_err("a non-holder must refuse an owned write");
        ensure!(refused.code() == Code::FailedPrecondition, "{refused}");
        if refused.message().contains(&holder.name) {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "the refusal does not name the holder: {refused}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // cut the holder off; the other region writes until it is accepted
    let (took, old_epoch, new_epoch, frozen) =
        cut_off(&mut holder, &mut other, &key, "after").await?;
    accepted.push((old_epoch, holder.name.clone()));
    accepted.push((new_epoch, other.name.clone()));
    println!(
        "{} took shard {shard} {:.0} ms after {} was frozen (epoch {old_epoch} -> {new_epoch}; lease {:?}, renew every {:?}, election timeout {:?})",
        other.name,
        took.as_secs_f64() * 1e3,
        holder.name,
        lease.duration,
        lease.renew_every,
        lease.election_timeout
    );
    ensure!(
        new_epoch > old_epoch,
        "the new holder's epoch must be higher"
    );
    // how fast is the failover benchmark's claim (`make bench`); here only that it happens
    // within the test's patience, whatever the machine's load (5.8 s was seen under CI
    // against a 5.2 s "lease + election" bound that was a timing claim, not a guarantee)
    ensure!(
        took < Duration::from_secs(30),
        "failover took {took:?}: the shard never moved"
    );

    // the old holder's delta for the key at its old epoch, replayed on its deltas topic
    // (its Kafka runs on) with a clock newer than the new holder's write: refused and
    // counted as fenced, the new holder's value stays
    let fenced_before = fenced_count(&other.metrics, &holder.name)?;
    let region = RegionId::new(&holder.name)?;
    let stamp = OrderStamp {
        epoch: old_epoch,
        hlc: geostate::clock::HlcTimestamp::new(now_nanos(), 0),
        origin: region.clone(),
    };
    let stale = Delta {
        key: key.clone(),
        origin: region,
        state: CrdtValue::LwwRegister(LwwRegister::new(b"stale".to_vec(), stamp.clone())),
        origin_time: stamp.hlc,
        epoch: old_epoch,
        recent_ids: Vec::new(),
    };
    let producer = common::producer(&cluster.regions[&holder.name].kafka)?;
    producer
        .send(
            FutureRecord::to("geostate.deltas")
                .key(&key)
                .payload(&stale.encode()),
            Duration::from_secs(10),
        )
        .await
        .map_err(|(e, _)| e)?;
    // resume the old holder before waiting for the mirror (a node frozen longer than its
    // shipping transaction's timeout is fenced by the coordinator and stops): its lease is
    // gone, so its first owned write is refused (or, if its home shard already came back,
    // stamped with a newer epoch)
    drop(frozen);
    let mut expected = (b"after".to_vec(), new_epoch);
    match holder.state.update(set(&key, "from-old-holder")).await {
        // refused: another region holds it, or (its table still naming it) it renews
        Err(s) if s.code() == Code::FailedPrecondition || renewing(&s) => {}
        Ok(r) => {
            let e = epoch_of(&r.into_inner());
            ensure!(e > new_epoch, "the resumed old holder wrote at epoch {e}");
            accepted.push((e, holder.name.clone()));
            expected = (b"from-old-holder".to_vec(), e);
        }
        Err(s) => bail!("the resumed old holder answered {s}"),
    }

    let deadline = Instant::now() + Duration::from_secs(60);
    while fenced_count(&other.metrics, &holder.name)? <= fenced_before {
        ensure!(
            Instant::now() < deadline,
            "{} did not refuse the replayed epoch-{old_epoch} delta within 60 s",
            other.name
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // the new holder's value stays (or, if the resumed old holder's write was accepted at
    // a newer epoch, that one arrives)
    let (value, epoch) = expected;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let kept = other.state.get(replica(&key)).await?.into_inner();
        if kept.value == Some(pb::value::Value::Register(value.clone()))
            && kept.stamp.as_ref().map(|s| s.epoch) == Some(epoch)
        {
            break;
        }
        ensure!(
            epoch != new_epoch && Instant::now() < deadline,
            "the fenced delta must not change the value: {kept:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // healing: the home region takes its shard back at a higher epoch and writes last
    let (_, last) =
        write_until_accepted(&mut holder, &key, "final", Duration::from_secs(60)).await?;
    let final_epoch = epoch_of(&last);
    accepted.push((final_epoch, holder.name.clone()));
    ensure!(final_epoch > new_epoch, "take-back must raise the epoch");

    // no epoch accepted in two regions; epochs rise in acceptance order
    let mut owners: BTreeMap<u64, &str> = BTreeMap::new();
    for (epoch, region) in &accepted {
        let owner = owners.entry(*epoch).or_insert(region);
        ensure!(
            owner == region,
            "epoch {epoch} accepted in {owner} and {region}"
        );
    }
    ensure!(
        accepted.windows(2).all(|w| w[0].0 <= w[1].0),
        "epochs went back: {accepted:?}"
    );

    // both regions converge to the newest owner's value
    let deadline = Instant::now() + Duration::from_secs(60);
    for region in [&mut holder, &mut other] {
        loop {
            let v = region.state.get(replica(&key)).await?.into_inner();
            let epoch = v.stamp.as_ref().map_or(0, |s| s.epoch);
            if v.value == Some(pb::value::Value::Register(b"final".to_vec())) {
                ensure!(epoch == final_epoch, "read carries epoch {epoch}");
                break;
            }
            ensure!(
                Instant::now() < deadline,
                "{} did not converge to the final value: {v:?}",
                region.name
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    println!("accepted writes (epoch, region): {accepted:?}");
    Ok(())
}
