//! The nodes `make up` starts, grown to two per region with `cluster.py node add` and shrunk
//! back with `node remove`: through MirrorMaker 2, both regions count every write exactly
//! at every node, before and after one added node is killed in the middle of ingest, and
//! after it is started again; and owned keys are written at whichever node of the holder
//! region owns their partition, an added node (a learner of the lease group) keeping the
//! region's leases when the first node (its member) is killed; and counters both regions
//! write stay exact while a second node of eu-west-1 joins and leaves 30 times, moving
//! partitions the counters are not on. Each test leaves the
//! cluster as it found it (the added nodes removed, the first nodes owning every
//! partition again) for the tests after it.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use common::failover::{epoch_of, register, replica};
use common::{cluster, cluster_script, counter, produce_all, producer, unique};
use geostate::log::partition_of;
use geostate::pb;
use geostate::pb::admin_client::AdminClient;
use geostate::pb::state_client::StateClient;

const PARTITIONS: usize = 4;
const KEYS: usize = 16;

/// The tests share the cluster's nodes (they add, kill and remove them): one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Removes the nodes it added when the test ends, however it ends, and starts again
/// whatever else of the cluster a failed test left dead (`up` does nothing otherwise).
struct Added(Vec<String>);

impl Drop for Added {
    fn drop(&mut self) {
        for node in &self.0 {
            if let Err(e) = cluster_script(&["node", "remove", node]) {
                eprintln!("removing {node}: {e}");
            }
        }
        if let Err(e) = cluster_script(&["up", "--no-build"]) {
            eprintln!("starting the cluster again: {e}");
        }
    }
}

/// Every running node's gRPC address, per region (the first node first).
fn nodes() -> anyhow::Result<Vec<(String, Vec<String>)>> {
    let cluster = cluster()?;
    let alive = |pid: Option<u32>| {
        pid.is_some_and(|p| std::path::Path::new(&format!("/proc/{p}")).exists())
    };
    let mut out = Vec::new();
    for (region, r) in &cluster.regions {
        let mut addrs = vec![r.grpc.clone().context("no first node")?];
        addrs.extend(
            r.nodes
                .values()
                .filter(|n| alive(n.pid))
                .filter_map(|n| n.grpc.clone()),
        );
        out.push((region.clone(), addrs));
    }
    Ok(out)
}

async fn owned(addr: &str) -> anyhow::Result<Vec<i32>> {
    let mut admin = AdminClient::connect(format!("http://{addr}")).await?;
    Ok(admin
        .status(pb::StatusRequest {})
        .await?
        .into_inner()
        .owned_partitions)
}

/// Waits until, in every region, the nodes own disjoint sets covering every partition,
/// each at least one (`spread`) or the first node all of them.
async fn owners_settled(spread: bool, within: Duration) -> anyhow::Result<()> {
    let until = Instant::now() + within;
    loop {
        let mut settled = true;
        let mut seen = Vec::new();
        for (region, addrs) in nodes()? {
            let mut all = BTreeSet::new();
            let mut count = 0;
            let mut each = Vec::new();
            for addr in &addrs {
                let o = owned(addr).await.unwrap_or_default();
                count += o.len();
                each.push(o.len());
                all.extend(o);
            }
            settled &= all.len() == PARTITIONS
                && count == PARTITIONS
                && if spread {
                    each.iter().all(|&n| n > 0)
                } else {
                    each.first() == Some(&PARTITIONS)
                };
            seen.push((region, each));
        }
        if settled {
            return Ok(());
        }
        if Instant::now() > until {
            bail!("partitions not settled (spread {spread}) within {within:?}: {seen:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `trips/<base>-<i>` for the first `KEYS` i.
fn keys_of(base: &str) -> Vec<String> {
    (0..KEYS).map(|i| format!("trips/{base}-{i}")).collect()
}

/// Waits until every node of every region reads `want(i)` for every `keys[i]`.
async fn everywhere(
    keys: &[String],
    want: impl Fn(usize) -> i64,
    within: Duration,
) -> anyhow::Result<()> {
    let until = Instant::now() + within;
    loop {
        let mut wrong = Vec::new();
        for (region, addrs) in nodes()? {
            for addr in addrs {
                let Ok(mut state) = StateClient::connect(format!("http://{addr}")).await else {
                    wrong.push(format!("{region} {addr}: unreachable"));
                    continue;
                };
                for (i, key) in keys.iter().enumerate() {
                    match state.get(replica(key)).await {
                        Ok(v) if counter(v.get_ref()) == want(i) => {}
                        Ok(v) => wrong.push(format!(
                            "{region} {addr} {key}: {} (want {})",
                            counter(v.get_ref()),
                            want(i)
                        )),
                        Err(s) => wrong.push(format!("{region} {addr} {key}: {}", s.message())),
                    }
                }
            }
        }
        if wrong.is_empty() {
            return Ok(());
        }
        if Instant::now() > until {
            bail!("not every node reads every count within {within:?}: {wrong:?}");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

#[tokio::test]
async fn two_nodes_per_region_count_every_write_across_regions_through_a_kill() -> anyhow::Result<()>
{
    let _alone = ONE_AT_A_TIME.lock().await;
    let wait = Duration::from_secs(90);
    let mut added = Added(Vec::new());
    for region in ["us-east-1", "eu-west-1"] {
        cluster_script(&["node", "add", region])?;
        added.0.push(format!("{region}/1"));
    }
    owners_settled(true, wait).await?;

    // each key gets i+1 through gRPC in each region, at its first node and at its added
    // one (whichever owns the key's partition answers)
    let base = unique("cluster-scale");
    for (_, addrs) in nodes()? {
        for (n, addr) in addrs.iter().enumerate() {
            let mut state = StateClient::connect(format!("http://{addr}")).await?;
            for i in (0..KEYS).filter(|i| i % 2 == n % 2) {
                state
                    .update(pb::UpdateRequest {
                        key: format!("trips/{base}-{i}"),
                        op: Some(pb::update_request::Op::Add(2 * (i as i64 + 1))),
                        id: String::new(),
                        event_time_ms: 0,
                    })
                    .await?;
            }
        }
    }
    everywhere(&keys_of(&base), |i| 4 * (i as i64 + 1), wait).await?;

    // 50 rounds more straight to us-east-1's updates topic; its added node dies meanwhile
    let cluster = cluster()?;
    let kafka = cluster.regions["us-east-1"].kafka.clone();
    let mut records = Vec::new();
    for _ in 0..50 {
        for i in 0..KEYS {
            let key = format!("trips/{base}-{i}");
            records.push((
                key.clone(),
                format!(r#"{{"key":"{key}","add":1}}"#).into_bytes(),
            ));
        }
    }
    produce_all(&producer(&kafka)?, "geostate.updates", &records).await?;
    cluster_script(&["node", "kill", "us-east-1/1"])?;
    everywhere(&keys_of(&base), |i| 4 * (i as i64 + 1) + 50, wait).await?;

    cluster_script(&["up", "--no-build"])?;
    owners_settled(true, wait).await?;
    everywhere(&keys_of(&base), |i| 4 * (i as i64 + 1) + 50, wait).await?;

    drop(added);
    owners_settled(false, wait).await?;
    Ok(())
}

/// Both regions write the same counters while a second node of eu-west-1 joins and leaves
/// again and again (`GEOSTATE_MOVES` times, 30 by default), taking partitions the counters
/// are not on: at every step eu-west-1's first node's owned set changes while it keeps the
/// counters' partitions and merges us-east-1's deltas of them. Every write is retried with
/// its id until acknowledged, so each counter reads exactly what was written, at every
/// node. (A merge cancelled by such a change once rolled an acknowledged increment back in
/// every region.)
#[tokio::test]
async fn counters_stay_exact_while_other_partitions_move_back_and_forth() -> anyhow::Result<()> {
    let _alone = ONE_AT_A_TIME.lock().await;
    let moves: usize = std::env::var("GEOSTATE_MOVES")
        .ok()
        .and_then(|m| m.parse().ok())
        .unwrap_or(30);
    let wait = Duration::from_secs(90);
    let added = Added(vec!["eu-west-1/1".into()]);
    cluster_script(&["node", "add", "eu-west-1"])?;
    owners_settled(true, wait).await?;
    let taken = owned(&region_nodes("eu-west-1")?[1]).await?;
    let base = unique("kept-counters");
    let keys: Vec<String> = (0..)
        .map(|i| format!("trips/{base}-{i}"))
        .filter(|k| !taken.contains(&partition_of(k.as_bytes(), PARTITIONS as i32)))
        .take(KEYS / 2)
        .collect();

    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = ["us-east-1", "eu-west-1"]
        .into_iter()
        .map(|region| {
            let first = region_nodes(region).map(|n| n[0].clone());
            tokio::spawn(write_until(region, first, keys.clone(), stop.clone()))
        })
        .collect();
    let mut also_taken = BTreeSet::new();
    for step in 1..=moves {
        cluster_script(&["node", "remove", "eu-west-1/1"])?;
        owners_settled(false, wait).await?;
        cluster_script(&["node", "add", "eu-west-1"])?;
        owners_settled(true, wait).await?;
        let now = owned(&region_nodes("eu-west-1")?[1]).await?;
        also_taken.extend(now.into_iter().filter(|p| !taken.contains(p)));
        eprintln!("move {step} of {moves} done");
    }
    stop.store(true, Ordering::Relaxed);
    let mut want = vec![0i64; keys.len()];
    for writer in writers {
        for (i, n) in writer.await??.into_iter().enumerate() {
            want[i] += n;
        }
    }
    eprintln!(
        "{} writes acknowledged over {moves} moves; the added node took {taken:?}, and later also {also_taken:?}",
        want.iter().sum::<i64>()
    );
    everywhere(&keys, |i| want[i], wait).await?;
    drop(added);
    owners_settled(false, wait).await?;
    Ok(())
}

/// The gRPC addresses of `region`'s running nodes, the first node first.
fn region_nodes(region: &str) -> anyhow::Result<Vec<String>> {
    nodes()?
        .into_iter()
        .find(|(r, _)| r == region)
        .map(|(_, addrs)| addrs)
        .with_context(|| format!("no region {region}"))
}

/// Adds 1 to each of `keys` in turn at the node at `addr` until `stop`, each write retried
/// with its id until acknowledged (60 s at most); answers how many were written per key.
async fn write_until(
    region: &'static str,
    addr: anyhow::Result<String>,
    keys: Vec<String>,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<Vec<i64>> {
    let mut state = StateClient::connect(format!("http://{}", addr?)).await?;
    let mut written = vec![0i64; keys.len()];
    for n in 0u64.. {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let i = n as usize % keys.len();
        let add = pb::UpdateRequest {
            key: keys[i].clone(),
            op: Some(pb::update_request::Op::Add(1)),
            id: format!("{region}-{n}"),
            event_time_ms: 0,
        };
        let until = Instant::now() + Duration::from_secs(60);
        while let Err(e) = state.update(add.clone()).await {
            if Instant::now() > until {
                bail!("{region} {}: not acknowledged within 60 s: {e}", add.key);
            }
            eprintln!("{region} {}: {} (retried)", add.key, e.message());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        written[i] += 1;
    }
    Ok(written)
}

/// A region's added node is a learner of the lease group: owned keys of the partitions it
/// owns are written there (not refused for want of a lease group member), and when the
/// first node, the region's member (a follower of the group, made so first), is killed,
/// the added node owns every partition and goes on writing the region's owned keys under
/// the epochs it kept renewing; each key reads its last acknowledged value in both regions.
#[tokio::test]
async fn an_added_node_writes_owned_keys_and_keeps_the_leases_when_the_first_node_dies()
-> anyhow::Result<()> {
    first_node_dies(false).await
}

/// As above, with the first node leading the lease group (made so first) when it is
/// killed: the others elect a leader (Raft's leader lease, then an election timeout:
/// 0.75–1 s with the default `election-timeout`) before the leases' last renewal runs
/// out, so the added node renews them under the new leader and the epochs stay.
#[tokio::test]
async fn the_region_keeps_its_leases_when_its_first_node_dies_leading_the_lease_group()
-> anyhow::Result<()> {
    first_node_dies(true).await
}

async fn first_node_dies(leading: bool) -> anyhow::Result<()> {
    let _alone = ONE_AT_A_TIME.lock().await;
    let wait = Duration::from_secs(90);
    let added = add_to_us_east_1(wait).await?;
    let cluster = cluster()?;
    let first = cluster.regions["us-east-1"]
        .grpc
        .clone()
        .context("no first node")?;
    let second = added_node()?;
    let mut admin = AdminClient::connect(format!("http://{first}")).await?;
    let first_pid = cluster.regions["us-east-1"]
        .pid
        .context("no first node pid")?;
    if leading {
        let others = BTreeMap::from([
            (
                EU_WEST_1_MEMBER,
                cluster.regions["eu-west-1"].pid.context("eu pid")?,
            ),
            (WITNESS_MEMBER, common::failover::witness_pid(&cluster)?),
        ]);
        lead(&first, |l| l == US_EAST_1_MEMBER, &others, wait).await?;
    } else {
        let west = cluster.regions["eu-west-1"].grpc.clone().context("eu")?;
        let first = BTreeMap::from([(US_EAST_1_MEMBER, first_pid)]);
        lead(&west, |l| l != US_EAST_1_MEMBER, &first, wait).await?;
    }
    home_shards_held(&second, wait).await?;

    // owned keys whose lease us-east-1 holds, some on each node
    let base = unique("owned-scale");
    let mut keys = Vec::new();
    for i in 0..64 {
        let key = format!("surge/{base}-{i}");
        let shard = admin
            .leases(pb::LeasesRequest { key: key.clone() })
            .await?
            .into_inner()
            .shards
            .pop()
            .context("no shard")?;
        let node = admin
            .route(pb::RouteRequest { key: key.clone() })
            .await?
            .into_inner()
            .node;
        // (a shard of eu-west-1's held here is handed back: not those)
        if shard.holder == "us-east-1" && shard.home == "us-east-1" {
            keys.push((key, node, shard.shard));
        }
    }
    assert!(
        keys.iter().any(|(_, n, _)| *n == second) && keys.iter().any(|(_, n, _)| *n == first),
        "no held key on one of the nodes: {keys:?}"
    );
    // the added node holds the leases itself once the lease group lists it as a learner
    for shard in keys.iter().map(|(_, _, s)| *s).collect::<BTreeSet<_>>() {
        holds(&second, shard, wait).await?;
    }
    // written at the node owning each key's partition (asked of the first, routed)
    let keys_only: Vec<&str> = keys.iter().map(|(k, _, _)| k.as_str()).collect();
    let epochs = write_all(&first, &keys_only, "before", wait).await?;

    cluster_script(&["node", "kill", "us-east-1"])?;
    let started = Instant::now();
    let after = write_all(&second, &keys_only, "after", wait).await?;
    eprintln!(
        "every owned key written at the added node {:?} after the first node was killed",
        started.elapsed()
    );
    cluster_script(&["up", "--no-build"])?;
    // the same epochs: the region kept its leases (no new grant was needed)
    assert_eq!(after, epochs);
    for addr in [
        first.as_str(),
        second.as_str(),
        &cluster.regions["eu-west-1"].grpc.clone().context("eu")?,
    ] {
        let until = Instant::now() + wait;
        let mut state = StateClient::connect(format!("http://{addr}")).await?;
        for (key, _, _) in &keys {
            loop {
                let read = state.get(replica(key)).await;
                match read.as_ref().map(|v| register(v.get_ref())) {
                    Ok(Some(b"after")) => break,
                    _ if Instant::now() < until => {
                        tokio::time::sleep(Duration::from_millis(200)).await
                    }
                    other => bail!("{addr} {key}: {other:?} (want \"after\")"),
                }
            }
        }
    }
    drop(added);
    owners_settled(false, wait).await?;
    Ok(())
}

/// Sets every key to `value` at the node at `addr`, each retried until written (printing
/// why not) within `within`; answers the epochs written under.
async fn write_all(
    addr: &str,
    keys: &[&str],
    value: &str,
    within: Duration,
) -> anyhow::Result<Vec<u64>> {
    let mut state = StateClient::connect(format!("http://{addr}")).await?;
    let (started, until) = (Instant::now(), Instant::now() + within);
    let mut epochs = Vec::new();
    for key in keys {
        let set = pb::UpdateRequest {
            key: key.to_string(),
            op: Some(pb::update_request::Op::Set(value.as_bytes().to_vec())),
            id: String::new(),
            event_time_ms: 0,
        };
        let written = loop {
            match state.update(set.clone()).await {
                Ok(r) => break r.into_inner(),
                Err(e) if Instant::now() < until => {
                    eprintln!("{key}: {} ({:?})", e.message(), started.elapsed());
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => bail!("{key} not written at {addr} within {within:?}: {e}"),
            }
        };
        epochs.push(epoch_of(&written));
    }
    Ok(epochs)
}

/// The lease group's member ids (the regions numbered by sorted name, then the witness).
const EU_WEST_1_MEMBER: u64 = 1;
const US_EAST_1_MEMBER: u64 = 2;
const WITNESS_MEMBER: u64 = 3;

/// Waits until the lease group's leader, as the node at `observer` sees it, is one
/// `wanted` accepts: whichever member of `freezable` (member id → pid) leads otherwise is
/// frozen until another one does.
///
/// When the next leader is unwanted too, it is frozen once it committed a renewal and
/// only then is the one before thawed: that one missed the new leader's entries, so its
/// log is behind the wanted member's and it cannot win the election that follows (its
/// pre-vote is refused for its older log).
async fn lead(
    observer: &str,
    wanted: impl Fn(u64) -> bool,
    freezable: &BTreeMap<u64, u32>,
    within: Duration,
) -> anyhow::Result<()> {
    let mut admin = AdminClient::connect(format!("http://{observer}")).await?;
    let until = Instant::now() + within;
    let mut frozen: Option<(u64, common::failover::Frozen)> = None;
    loop {
        let leader = admin
            .leases(pb::LeasesRequest::default())
            .await?
            .into_inner()
            .leader;
        let elected = leader != 0 && frozen.as_ref().is_none_or(|(m, _)| *m != leader);
        if elected && wanted(leader) {
            return Ok(());
        }
        if let (true, Some(&pid)) = (elected, freezable.get(&leader)) {
            if frozen.is_some() {
                a_renewal_committed(&mut admin, until.saturating_duration_since(Instant::now()))
                    .await?;
            }
            eprintln!("member {leader} leads the lease group: frozen until another one does");
            // the new one frozen first, then the one before thawed (dropped)
            frozen = Some((leader, common::failover::Frozen::new(pid)?));
        } else if elected {
            frozen = None;
        }
        if Instant::now() > until {
            bail!("member {leader} still leads the lease group after {within:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the lease table the node behind `admin` applies shows a renewal
/// committed from now on: some shard's expiry moved more than 100 ms later.
async fn a_renewal_committed(
    admin: &mut AdminClient<tonic::transport::Channel>,
    within: Duration,
) -> anyhow::Result<()> {
    let origin = Instant::now();
    let mut expiries = async || -> anyhow::Result<BTreeMap<u32, i64>> {
        let shards = admin.leases(pb::LeasesRequest::default()).await?;
        let now = origin.elapsed().as_millis() as i64;
        Ok(shards
            .into_inner()
            .shards
            .iter()
            .map(|s| (s.shard, now + s.expires_in_ms))
            .collect())
    };
    let first = expiries().await?;
    while Instant::now() < origin + within {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let renewed = expiries().await?;
        if renewed
            .iter()
            .any(|(s, at)| first.get(s).is_some_and(|was| *at > was + 100))
        {
            return Ok(());
        }
    }
    bail!("no lease renewal committed within {within:?}")
}

/// Waits until the node at `addr` holds every shard whose home is its region.
async fn home_shards_held(addr: &str, within: Duration) -> anyhow::Result<()> {
    holds_all(addr, within, |s, region| s.home == region).await
}

/// Waits until the node at `addr` holds `shard` (may write its keys).
async fn holds(addr: &str, shard: u32, within: Duration) -> anyhow::Result<()> {
    holds_all(addr, within, |s, _| s.shard == shard).await
}

/// Waits until the node at `addr` holds every shard `wanted` picks (given the node's
/// region).
async fn holds_all(
    addr: &str,
    within: Duration,
    wanted: impl Fn(&pb::ShardLease, &str) -> bool,
) -> anyhow::Result<()> {
    let mut admin = AdminClient::connect(format!("http://{addr}")).await?;
    let until = Instant::now() + within;
    loop {
        let leases = admin
            .leases(pb::LeasesRequest::default())
            .await?
            .into_inner();
        let missing: Vec<u32> = leases
            .shards
            .iter()
            .filter(|s| wanted(s, &leases.region) && !s.held_here)
            .map(|s| s.shard)
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        if Instant::now() > until {
            bail!("{addr} does not hold shards {missing:?} within {within:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Adds a node to us-east-1 (removed when the guard drops) and waits until the group
/// shares the partitions out.
async fn add_to_us_east_1(within: Duration) -> anyhow::Result<Added> {
    cluster_script(&["node", "add", "us-east-1"])?;
    let added = Added(vec!["us-east-1/1".into()]);
    owners_settled(true, within).await?;
    Ok(added)
}

/// The gRPC address of the node `add_to_us_east_1` added.
fn added_node() -> anyhow::Result<String> {
    nodes()?
        .into_iter()
        .find(|(r, _)| r == "us-east-1")
        .and_then(|(_, addrs)| addrs.get(1).cloned())
        .context("no added node")
}

/// A killed added node never asks to leave the lease group; the group's leader finds its
/// lease port refusing connections and removes it, so its region may transfer leases
/// again (refused `SeveralNodes` while a learner of the region is listed). When it starts
/// again it joins again.
#[tokio::test]
async fn a_killed_added_node_leaves_the_lease_group_so_its_region_transfers_leases_again()
-> anyhow::Result<()> {
    let _alone = ONE_AT_A_TIME.lock().await;
    let wait = Duration::from_secs(90);
    let added = add_to_us_east_1(wait).await?;
    let cluster = cluster()?;
    let grpc = |region: &str| -> anyhow::Result<String> {
        let addr = cluster.regions[region]
            .grpc
            .clone()
            .context("no first node")?;
        Ok(format!("http://{addr}"))
    };
    let (mut east, mut west) = (
        AdminClient::connect(grpc("us-east-1")?).await?,
        AdminClient::connect(grpc("eu-west-1")?).await?,
    );
    // a shard us-east-1 holds
    let mut shard = None;
    for i in 0..64 {
        let leases = east
            .leases(pb::LeasesRequest {
                key: format!("surge/{}-{i}", unique("learner")),
            })
            .await?
            .into_inner();
        if let Some(s) = leases.shards.into_iter().find(|s| s.held_here) {
            shard = Some(s.shard);
            break;
        }
    }
    let shard = shard.context("no shard held by us-east-1")?;
    let added_node = added_node()?;
    // the added node is listed as a learner once it holds the region's leases itself
    holds(&added_node, shard, wait).await?;
    let transfer = |to: &str| pb::TransferLeaseRequest {
        shard,
        to_region: to.into(),
    };
    let refused = east
        .transfer_lease(transfer("eu-west-1"))
        .await
        .expect_err("a region with a learner transfers nothing");
    assert!(
        refused.message().contains("SeveralNodes"),
        "refused for another reason: {refused}"
    );

    cluster_script(&["node", "kill", "us-east-1/1"])?;
    let killed = Instant::now();
    let moved = loop {
        match east.transfer_lease(transfer("eu-west-1")).await {
            Ok(r) => break r.into_inner().lease.context("the transferred lease")?,
            Err(e) if killed.elapsed() < wait => {
                eprintln!("{} ({:?} after the kill)", e.message(), killed.elapsed());
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => bail!("no transfer within {wait:?} of the learner's kill: {e}"),
        }
    };
    eprintln!(
        "transferred {:?} after the learner was killed",
        killed.elapsed()
    );
    assert_eq!(moved.holder, "eu-west-1");
    // back home, for the tests after this one
    let until = Instant::now() + wait;
    while let Err(e) = west.transfer_lease(transfer("us-east-1")).await {
        anyhow::ensure!(Instant::now() < until, "no transfer back: {e}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // started again, it joins again (and only then holds leases): transfers are refused
    // once more
    cluster_script(&["up", "--no-build"])?;
    owners_settled(true, wait).await?;
    holds(&added_node, shard, wait).await?;
    let refused = east
        .transfer_lease(transfer("eu-west-1"))
        .await
        .expect_err("the restarted learner joined again");
    assert!(
        refused.message().contains("SeveralNodes"),
        "refused for another reason: {refused}"
    );
    drop(added);
    owners_settled(false, wait).await?;
    Ok(())
}
