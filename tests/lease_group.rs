//! The lease group on real parts: three openraft members (two regions and a witness), each
//! with its own RocksDB storage, talking gRPC over loopback. A lease granted through the
//! leader is applied everywhere; with the leader's member stopped, the remaining majority
//! elects a new leader and keeps granting (a new holder, a higher epoch); the stopped
//! member restarts from its own disk and catches up.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use common::now_ms;
use geostate::clock::SystemClock;
use geostate::config::{LeaseConfig, Member as MemberConfig};
use geostate::crdt::RegionId;
use geostate::lease::member::Member;
use geostate::lease::raft_store::{Proposal, Reply};
use geostate::lease::table::{Command, Outcome};
use openraft::error::{ClientWriteError, RaftError};

/// Member `id` of a three-member group on `ports`, with fast Raft timings.
fn config(id: u64, ports: &[u16]) -> LeaseConfig {
    let members = ports
        .iter()
        .enumerate()
        .map(|(i, port)| {
            let id = i as u64 + 1;
            let member = MemberConfig {
                id,
                addr: format!("127.0.0.1:{port}"),
                region: None,
                api: Vec::new(),
            };
            (id, member)
        })
        .collect();
    LeaseConfig {
        member_id: id,
        learner: 0,
        listen: format!("127.0.0.1:{}", ports[id as usize - 1])
            .parse()
            .expect("an address"),
        members,
        shards: 8,
        homes: Vec::new(),
        duration: Duration::from_millis(500),
        renew_every: Duration::from_millis(100),
        heartbeat: Duration::from_millis(100),
        election_timeout: Duration::from_millis(400),
        take_back: false,
        forward_writes: false,
    }
}

async fn leader(members: &BTreeMap<u64, Member>) -> anyhow::Result<u64> {
    let any = members.values().next().context("no member")?;
    let metrics = any
        .raft
        .wait(Some(Duration::from_secs(10)))
        .metrics(
            |m| m.current_leader.is_some_and(|l| members.contains_key(&l)),
            "a live leader",
        )
        .await?;
    metrics.current_leader.context("no leader")
}

async fn acquire(
    members: &BTreeMap<u64, Member>,
    region: &str,
    duration_ms: u64,
) -> anyhow::Result<Outcome> {
    // a member's view of the leader can be a term behind while the group (re-)elects:
    // the member it names then answers "forward to the leader"; ask again
    let until = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let leader = leader(members).await?;
        let written = members[&leader]
            .raft
            .client_write(Proposal(vec![Command::Acquire {
                shard: 7,
                region: RegionId::new(region)?,
                now_ms: now_ms(),
                duration_ms,
            }]))
            .await;
        match written {
            Ok(written) => {
                let reply: Reply = written.data;
                return reply.0.into_iter().next().context("no outcome");
            }
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(_)))
                if std::time::Instant::now() < until =>
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

async fn applied_everywhere(members: &BTreeMap<u64, Member>, epoch: u64) -> anyhow::Result<()> {
    for (id, m) in members {
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while m.view.lease(7).map(|l| l.epoch) != Some(epoch) {
            anyhow::ensure!(
                std::time::Instant::now() < until,
                "member {id} did not apply epoch {epoch}: {:?}",
                m.view.lease(7)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_are_granted_by_the_majority_after_the_leader_stops() -> anyhow::Result<()> {
    let dirs: Vec<tempfile::TempDir> = (0..3)
        .map(|_| tempfile::tempdir())
        .collect::<Result<_, _>>()?;
    let ports: Vec<u16> = (0..3).map(|_| common::free_port()).collect();
    let mut members = BTreeMap::new();
    // every member forms the group with the same first membership on its first start
    for (i, dir) in dirs.iter().enumerate() {
        let id = i as u64 + 1;
        members.insert(
            id,
            Member::start(&config(id, &ports), dir.path(), 100, Arc::new(SystemClock)).await?,
        );
    }

    // a grant through the leader reaches every member's table
    let Outcome::Granted(first) = acquire(&members, "us-east-1", 2000).await? else {
        anyhow::bail!("the first acquire was refused");
    };
    assert_eq!((first.holder.as_str(), first.epoch), ("us-east-1", 1));
    applied_everywhere(&members, 1).await?;
    // held elsewhere: refused while in force
    assert!(matches!(
        acquire(&members, "eu-west-1", 500).await?,
        Outcome::Refused { .. }
    ));

    // the leader's member stops; the other two elect a leader and keep granting
    let old_leader = leader(&members).await?;
    let stopped_at = std::time::Instant::now();
    members.remove(&old_leader).context("leader")?.stop().await;
    // the first lease ends at its recorded expiry (the proposer's wall clock is ours)
    tokio::time::sleep(Duration::from_millis(
        first.expires_at_ms.saturating_sub(now_ms()),
    ))
    .await;
    let Outcome::Granted(second) = acquire(&members, "eu-west-1", 500).await? else {
        anyhow::bail!("the majority did not grant the expired shard");
    };
    println!(
        "new grant {} ms after the first lease's expiry, {:.0} ms after the leader stopped",
        now_ms().saturating_sub(first.expires_at_ms),
        stopped_at.elapsed().as_secs_f64() * 1e3
    );
    assert_eq!((second.holder.as_str(), second.epoch), ("eu-west-1", 2));
    applied_everywhere(&members, 2).await?;

    // the stopped member comes back from its own disk and catches up
    let back = Member::start(
        &config(old_leader, &ports),
        dirs[old_leader as usize - 1].path(),
        100,
        Arc::new(SystemClock),
    )
    .await?;
    members.insert(old_leader, back);
    applied_everywhere(&members, 2).await?;
    for (_, m) in members {
        m.stop().await;
    }
    Ok(())
}
