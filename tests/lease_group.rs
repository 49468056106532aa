//! The lease group on real parts: three openraft members (two regions and a witness), each
//! with its own RocksDB storage, talking gRPC over loopback. A lease granted through the
//! leader is applied everywhere; with the leader's member stopped, the remaining majority
//! elects a new leader and keeps granting (a new holder, a higher epoch); the stopped
//! member restarts from its own disk and catches up.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use geostate::crdt::RegionId;
use geostate::lease::network::{Network, Service};
use geostate::lease::raft_store::{self, LeaseRaft, Reply, TableView};
use geostate::lease::table::{Command, Outcome};
use openraft::{BasicNode, Raft};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio_stream::wrappers::TcpListenerStream;

struct Member {
    raft: Raft<LeaseRaft>,
    view: TableView,
    stop: Option<oneshot::Sender<()>>,
    server: tokio::task::JoinHandle<()>,
}

impl Member {
    async fn start(id: u64, dir: &std::path::Path, listener: TcpListener) -> anyhow::Result<Self> {
        let config = openraft::Config {
            heartbeat_interval: 100,
            election_timeout_min: 400,
            election_timeout_max: 800,
            ..Default::default()
        }
        .validate()?;
        let (log, machine, view) = raft_store::open(dir, 100)?;
        let raft = Raft::new(id, Arc::new(config), Network, log, machine).await?;
        let (stop, stopped) = oneshot::channel::<()>();
        let service = Service::server(raft.clone());
        let server = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                    let _ = stopped.await;
                })
                .await;
        });
        Ok(Self {
            raft,
            view,
            stop: Some(stop),
            server,
        })
    }

    async fn stop(mut self) -> anyhow::Result<()> {
        self.raft.shutdown().await.ok();
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.server.abort();
        Ok(())
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
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
    let leader = leader(members).await?;
    let reply: Reply = members[&leader]
        .raft
        .client_write(Command::Acquire {
            shard: 7,
            region: RegionId::new(region)?,
            now_ms: now_ms(),
            duration_ms,
        })
        .await?
        .data;
    reply.0.context("no outcome")
}

async fn applied_everywhere(members: &BTreeMap<u64, Member>, epoch: u64) -> anyhow::Result<()> {
    for (id, m) in members {
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while m.view.table().get(7).map(|l| l.epoch) != Some(epoch) {
            anyhow::ensure!(
                std::time::Instant::now() < until,
                "member {id} did not apply epoch {epoch}: {:?}",
                m.view.table().get(7)
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
    let mut nodes = BTreeMap::new();
    let mut members = BTreeMap::new();
    for (i, dir) in dirs.iter().enumerate() {
        let id = i as u64 + 1;
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        nodes.insert(id, BasicNode::new(listener.local_addr()?.to_string()));
        members.insert(id, Member::start(id, dir.path(), listener).await?);
    }
    members[&1].raft.initialize(nodes.clone()).await?;

    // a grant through the leader reaches every member's table
    let Outcome::Granted(first) = acquire(&members, "us-east-1", 500).await? else {
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
    members
        .remove(&old_leader)
        .context("leader")?
        .stop()
        .await?;
    // the first lease ends at its recorded expiry (the proposer's wall clock is ours)
    tokio::time::sleep(Duration::from_millis(
        first.expires_at_ms.saturating_sub(now_ms()),
    ))
    .await;
    let Outcome::Granted(second) = acquire(&members, "eu-west-1", 500).await? else {
        anyhow::bail!("the majority did not grant the expired shard");
    };
    println!(
        "new grant {:.0} ms after the leader stopped",
        stopped_at.elapsed().as_secs_f64() * 1e3
    );
    assert_eq!((second.holder.as_str(), second.epoch), ("eu-west-1", 2));
    applied_everywhere(&members, 2).await?;

    // the stopped member comes back from its own disk and catches up
    let listener = TcpListener::bind(&nodes[&old_leader].addr).await?;
    let back = Member::start(old_leader, dirs[old_leader as usize - 1].path(), listener).await?;
    members.insert(old_leader, back);
    applied_everywhere(&members, 2).await?;
    for (_, m) in members {
        m.stop().await?;
    }
    Ok(())
}
