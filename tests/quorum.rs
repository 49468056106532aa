//! A holder whose renewals stop being granted (the other two lease group members frozen:
//! no quorum) refuses its owned keys as transient, `UNAVAILABLE` with "renewing", while
//! its clock is known to be within the bound: it is the last holder on its table and keeps
//! proposing, so a client retries there, never a `FAILED_PRECONDITION` that names no other
//! region to ask. Once the members resume it serves the key again.
//!
//! Its own test binary: it freezes the witness and a cluster node the other tests use.

mod common;

use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use common::failover::{
    Frozen, at_holder, key_homed_at, regions, register, renewing, set, wait_held, wait_value,
    witness_pid,
};
use common::{cluster, unique};
use tonic::Code;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_without_a_quorum_refuses_as_transient_while_it_renews() -> anyhow::Result<()> {
    let cluster = cluster()?;
    let (mut regions, lease) = regions(&cluster).await?;
    ensure!(regions.len() == 2, "the test needs two regions");
    let other = regions.pop().context("region")?;
    let mut holder = regions.pop().context("region")?;
    let witness = witness_pid(&cluster)?;
    let (key, shard) = key_homed_at(&lease, &holder.name, &unique("quorum"));
    wait_held(&mut holder, shard, Duration::from_secs(30)).await?;
    holder.state.update(set(&key, "before")).await?;

    let frozen = (Frozen::new(witness)?, Frozen::new(other.pid)?);
    let started = Instant::now();
    let refusal = loop {
        match holder.state.get(at_holder(&key)).await {
            Ok(v) => ensure!(
                register(&v.into_inner()) == Some(b"before"),
                "the holder served another value"
            ),
            Err(s) => break s,
        }
        ensure!(
            started.elapsed() < Duration::from_secs(30),
            "the holder still served {key} 30 s after the lease group lost its quorum"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    println!(
        "{:?} after the freeze the holder refused: {refusal}",
        started.elapsed()
    );
    ensure!(
        renewing(&refusal),
        "the holder's first refusal after its lease lapsed: {refusal}"
    );
    match holder.state.update(set(&key, "unheld")).await {
        Err(s) if s.code() == Code::Unavailable || s.code() == Code::FailedPrecondition => {}
        Err(s) => bail!("an owned write at the lapsed holder answered {s}"),
        Ok(_) => bail!("the lapsed holder accepted an owned write"),
    }

    drop(frozen);
    wait_held(&mut holder, shard, Duration::from_secs(60)).await?;
    holder.state.update(set(&key, "after")).await?;
    wait_value(&mut holder.state, &key, "after", Duration::from_secs(60)).await?;
    Ok(())
}
