//! Leases on a private two-region group with its own witness (real processes, real Kafka):
//! owned writes forwarded to the holder when `forward-writes` is on (past an entry address of
//! the holder that refuses connections), and a planned handoff
//! with `Admin/TransferLease` that sticks (the home region does not pull it back), and a
//! graceful stop that releases the stopping region's shards.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use common::failover::{epoch_of, set, wait_held, write_until_accepted};
use common::{Node, Topics, cluster, free_port};
use geostate::pb;
use geostate::pb::admin_client::AdminClient;
use tonic::Code;
use tonic::transport::Channel;

/// The `[lease]` table of member `id` (TOML, inline) in a group of two regions
/// (us-east-1 = 1, eu-west-1 = 2) and a witness (3); each region's entry addresses.
fn lease_table(id: u64, raft: &[u16; 3], apis: &[Vec<String>; 2]) -> String {
    let mut members = Vec::new();
    for (i, region) in ["us-east-1", "eu-west-1"].iter().enumerate() {
        let api: Vec<String> = apis[i]
            .iter()
            .map(|a| format!("\"{}\"", a.trim_start_matches("http://")))
            .collect();
        members.push(format!(
            "{{ id = {}, addr = \"127.0.0.1:{}\", region = \"{region}\", api = [{}] }}",
            i + 1,
            raft[i],
            api.join(", ")
        ));
    }
    members.push(format!("{{ id = 3, addr = \"127.0.0.1:{}\" }}", raft[2]));
    format!(
        "{{ member-id = {id}, listen = \"127.0.0.1:{}\", shards = 4, duration = \"4s\", forward-writes = true, member = [{}] }}",
        raft[id as usize - 1],
        members.join(", ")
    )
}

struct Witness(Child);

impl Drop for Witness {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn holder_of(admin: &mut AdminClient<Channel>, shard: u32) -> anyhow::Result<pb::ShardLease> {
    admin
        .leases(pb::LeasesRequest::default())
        .await?
        .into_inner()
        .shards
        .into_iter()
        .find(|s| s.shard == shard)
        .context("no such shard")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owned_writes_forward_to_the_holder_and_a_transfer_sticks() -> anyhow::Result<()> {
    let cluster = cluster()?;
    let kafka = cluster.regions["us-east-1"].kafka.clone();
    let (ta, tb) = (
        Topics::create(&kafka, "lease-a", 2).await?,
        Topics::create(&kafka, "lease-b", 2).await?,
    );
    let dirs: Vec<tempfile::TempDir> = (0..3)
        .map(|_| tempfile::tempdir())
        .collect::<Result<_, _>>()?;
    let (mut a, mut b) = Node::pair(&kafka, (&ta, &tb), (dirs[0].path(), dirs[1].path()))?;
    let raft = [free_port(), free_port(), free_port()];
    // us-east-1's first entry address is a port nobody listens on (its node down):
    // forwarded writes go on to the next
    let down = format!("127.0.0.1:{}", free_port());
    let apis = [vec![down, a.grpc.clone()], vec![b.grpc.clone()]];
    a.set("lease", &lease_table(1, &raft, &apis));
    b.set("lease", &lease_table(2, &raft, &apis));
    let witness_config = dirs[2].path().join("witness.toml");
    std::fs::write(
        &witness_config,
        format!(
            "data-dir = {:?}\nlease = {}\n",
            dirs[2].path().join("raft"),
            lease_table(3, &raft, &apis)
        ),
    )?;
    let _witness = Witness(
        Command::new(env!("CARGO_BIN_EXE_geostate"))
            .args(["run", "--role", "witness", "--config"])
            .arg(&witness_config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dirs[2].path().join("witness.log"))?)
            .spawn()?,
    );
    let pid_a = a.start().await?;
    b.start().await?;
    let lease = a.config()?.lease.context("[lease]")?;
    // the regions as the failover helpers see them: a non-holder's copy of the lease
    // table may lag the leader's for a moment, so a forwarded write is retried briefly
    let region = |name: &str, node: &Node, state, admin| common::failover::Region {
        name: name.into(),
        state,
        admin,
        pid: 0,
        metrics: node.metrics.clone(),
    };
    let mut region_a = region(
        "us-east-1",
        &a,
        a.state().await?,
        AdminClient::connect(a.grpc.clone()).await?,
    );
    let mut region_b = region(
        "eu-west-1",
        &b,
        b.state().await?,
        AdminClient::connect(b.grpc.clone()).await?,
    );

    // a key of a shard us-east-1 (a) is home to
    let key = (0..)
        .map(|i| format!("surge/fwd-{i}"))
        .find(|k| {
            lease
                .home_of(lease.shard_of_key(k))
                .is_some_and(|h| h.as_str() == "us-east-1")
        })
        .context("a key homed at us-east-1")?;
    let shard = lease.shard_of_key(&key);
    let held = wait_held(&mut region_a, shard, Duration::from_secs(30)).await?;

    // written at the non-holder: forwarded, applied at the holder with its epoch
    let (_, r) = write_until_accepted(&mut region_b, &key, "1.7", Duration::from_secs(10)).await?;
    let stamp = r.stamp.context("a register write has a stamp")?;
    ensure!(
        stamp.origin == "us-east-1" && stamp.epoch == held,
        "the forwarded write is the holder's: {stamp:?}"
    );

    // planned handoff to eu-west-1: it writes at a higher epoch, us-east-1 forwards to it
    let moved = region_a
        .admin
        .transfer_lease(pb::TransferLeaseRequest {
            shard,
            to_region: "eu-west-1".into(),
        })
        .await?
        .into_inner()
        .lease
        .context("the transferred lease")?;
    ensure!(
        moved.holder == "eu-west-1" && moved.epoch > held,
        "{moved:?}"
    );
    let at_b = wait_held(&mut region_b, shard, Duration::from_secs(10)).await?;
    let r = region_b.state.update(set(&key, "1.9")).await?.into_inner();
    ensure!(epoch_of(&r) == at_b, "written at the new epoch: {r:?}");
    let (_, r) = write_until_accepted(&mut region_a, &key, "2.1", Duration::from_secs(10)).await?;
    let stamp = r.stamp.context("stamp")?;
    ensure!(
        stamp.origin == "eu-west-1",
        "forwarded to the new holder: {stamp:?}"
    );

    // a transfer asked of a region that does not hold the shard is refused
    let refused = region_a
        .admin
        .transfer_lease(pb::TransferLeaseRequest {
            shard,
            to_region: "eu-west-1".into(),
        })
        .await
        .expect_err("only the holder transfers");
    ensure!(refused.code() == Code::FailedPrecondition, "{refused}");

    // the handoff sticks: two lease durations later eu-west-1 still holds it
    tokio::time::sleep(lease.duration * 2).await;
    let still = holder_of(&mut region_b.admin, shard).await?;
    ensure!(
        still.held_here && still.epoch == at_b,
        "the home region pulled the shard back: {still:?}"
    );

    // a node stopping gracefully releases its shards: the other region takes them a
    // clock offset later, not at the lease's expiry (at least duration − renew-every)
    let home_a = lease
        .all_shards()
        .find(|&s| s != shard && lease.home_of(s).is_some_and(|h| h.as_str() == "us-east-1"))
        .context("another shard homed at us-east-1")?;
    wait_held(&mut region_a, home_a, Duration::from_secs(10)).await?;
    let stopping = Instant::now();
    Command::new("kill")
        .args(["-TERM", &pid_a.to_string()])
        .status()?;
    wait_held(&mut region_b, home_a, lease.duration * 2).await?;
    let took = stopping.elapsed();
    println!("eu-west-1 held us-east-1's shard {home_a} {took:?} after SIGTERM");
    ensure!(
        took < lease.duration - lease.renew_every - Duration::from_millis(500),
        "taken {took:?} after the stop: the shard was not released"
    );
    a.terminate(Duration::from_secs(20)).await?;
    b.terminate(Duration::from_secs(20)).await?;
    Ok(())
}
