//! Owned-key failover on the cluster's region nodes, shared by `tests/partition.rs` and
//! `benches/failover.rs`: find a key whose lease a region holds, freeze that region's
//! node (SIGSTOP: its Raft, Kafka and gRPC traffic all stop), and write the key at the
//! other region until it is accepted.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use geostate::config::LeaseConfig;
use geostate::pb;
use geostate::pb::admin_client::AdminClient;
use geostate::pb::state_client::StateClient;
use tonic::Code;
use tonic::transport::Channel;

use super::Cluster;

pub struct Region {
    pub name: String,
    pub state: StateClient<Channel>,
    pub admin: AdminClient<Channel>,
    pub pid: u32,
    pub metrics: String,
}

/// The cluster's regions (sorted by name) and their lease configuration.
pub async fn regions(cluster: &Cluster) -> anyhow::Result<(Vec<Region>, LeaseConfig)> {
    let mut out = Vec::new();
    let mut lease = None;
    for (name, r) in &cluster.regions {
        let grpc = r
            .grpc
            .clone()
            .context("the cluster runs a node per region")?;
        let config = super::node_config(r)?;
        lease = config.lease.or(lease);
        out.push(Region {
            name: name.clone(),
            state: StateClient::connect(format!("http://{grpc}")).await?,
            admin: AdminClient::connect(format!("http://{grpc}")).await?,
            pid: r.pid.context("node pid")?,
            metrics: r.metrics.clone().context("metrics address")?,
        });
    }
    Ok((
        out,
        lease.context("the cluster's nodes have a [lease] section")?,
    ))
}

/// A register write.
pub fn set(key: &str, value: &str) -> pb::UpdateRequest {
    pb::UpdateRequest {
        key: key.into(),
        op: Some(pb::update_request::Op::Set(value.as_bytes().to_vec())),
        id: String::new(),
        event_time_ms: 0,
    }
}

/// A plain (replica) read of `key`.
pub fn replica(key: &str) -> pb::GetRequest {
    pb::GetRequest {
        key: key.into(),
        ..Default::default()
    }
}

/// A leaseholder read of `key`.
pub fn at_holder(key: &str) -> pb::GetRequest {
    pb::GetRequest {
        key: key.into(),
        leaseholder: true,
        window: None,
    }
}

/// A register's value, if `v` is a register.
pub fn register(v: &pb::Value) -> Option<&[u8]> {
    match &v.value {
        Some(pb::value::Value::Register(b)) => Some(b),
        _ => None,
    }
}

/// The epoch an accepted owned write was stamped with.
pub fn epoch_of(r: &pb::UpdateResponse) -> u64 {
    r.stamp.as_ref().map_or(0, |s| s.epoch)
}

/// Waits until `region` holds a valid lease on `shard`, and its own table names it the
/// holder (a follower's table applies the grant a heartbeat after the answer that made
/// the lease valid here: until then it shows the previous holder's epoch). Answers the
/// epoch.
pub async fn wait_held(region: &mut Region, shard: u32, within: Duration) -> anyhow::Result<u64> {
    let deadline = Instant::now() + within;
    loop {
        let leases = leases(region).await?;
        if let Some(s) = leases
            .shards
            .iter()
            .find(|s| s.shard == shard && s.held_here && s.holder == region.name)
        {
            return Ok(s.epoch);
        }
        if Instant::now() > deadline {
            bail!(
                "{} did not hold shard {shard} within {within:?}: {:?}",
                region.name,
                leases.shards
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A fresh owned key whose shard prefers `home` (so its home holds it when all is well).
pub fn key_homed_at(lease: &LeaseConfig, home: &str, label: &str) -> (String, u32) {
    (0..)
        .map(|i| format!("surge/{label}-{i}"))
        .map(|k| {
            let shard = lease.shard_of_key(&k);
            (k, shard)
        })
        .find(|(_, shard)| lease.home_of(*shard).is_some_and(|h| h.as_str() == home))
        .expect("every region is some shard's home")
}

/// Starts every dead node of the cluster when dropped (however the test ends).
pub struct RestartNodes;

impl Drop for RestartNodes {
    fn drop(&mut self) {
        if let Err(e) = super::cluster_script(&["up", "--no-build"]) {
            eprintln!("restarting the nodes: {e}");
        }
    }
}

/// SIGSTOPs a process; SIGCONTs it when dropped (however the test ends).
pub struct Frozen(u32);

impl Frozen {
    pub fn new(pid: u32) -> anyhow::Result<Self> {
        signal("-STOP", pid)?;
        Ok(Self(pid))
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        let _ = signal("-CONT", self.0);
    }
}

/// The witness's pid, from the cluster file.
pub fn witness_pid(cluster: &Cluster) -> anyhow::Result<u32> {
    cluster
        .witness
        .as_ref()
        .and_then(|w| w.pid)
        .context("make test starts a witness")
}

/// `kill <sig> <pid>`.
pub fn signal(sig: &str, pid: u32) -> anyhow::Result<()> {
    let status = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()?;
    anyhow::ensure!(status.success(), "kill {sig} {pid} failed");
    Ok(())
}

/// A refusal by the region its own table names as the holder, while its grant or renewal
/// is on the way: nothing was appended.
pub fn renewing(s: &tonic::Status) -> bool {
    s.code() == Code::Unavailable && s.message().contains("it is renewing it")
}

/// The key's partition is moving between the region's nodes (also within one node's
/// region: a node frozen past its Kafka session rejoins its group when it resumes).
pub fn moving(s: &tonic::Status) -> bool {
    s.code() == Code::Unavailable
        && s.message()
            .contains("is moving between this region's nodes")
}

/// Writes `key` at `region` every 20 ms until it is accepted; `FAILED_PRECONDITION` (not
/// the holder yet), a [`renewing`] or a [`moving`] refusal is expected meanwhile, anything
/// else is an error.
pub async fn write_until_accepted(
    region: &mut Region,
    key: &str,
    value: &str,
    within: Duration,
) -> anyhow::Result<(Duration, pb::UpdateResponse)> {
    let started = Instant::now();
    loop {
        match region.state.update(set(key, value)).await {
            Ok(r) => return Ok((started.elapsed(), r.into_inner())),
            Err(s) if s.code() == Code::FailedPrecondition || renewing(&s) || moving(&s) => {}
            Err(s) => bail!("{} answered {s}", region.name),
        }
        if started.elapsed() > within {
            bail!(
                "{} accepted no write of {key} within {within:?}",
                region.name
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One failover: `holder` (holding `key`'s lease) writes the key, is frozen, and `other`
/// writes until it is accepted. Returns the time from the freeze to the accepted write and
/// the two epochs; the holder stays frozen until the returned guard drops. The holder's
/// own write is retried like the other's: its renewal may be on the way (an election
/// just ended, a renewal answered late).
pub async fn cut_off(
    holder: &mut Region,
    other: &mut Region,
    key: &str,
    value: &str,
) -> anyhow::Result<(Duration, u64, u64, Frozen)> {
    let (_, before) = write_until_accepted(holder, key, "before", Duration::from_secs(60)).await?;
    let before = epoch_of(&before);
    let frozen = Frozen::new(holder.pid)?;
    let (took, accepted) = write_until_accepted(other, key, value, Duration::from_secs(60)).await?;
    Ok((took, before, epoch_of(&accepted), frozen))
}

/// The lease group leader's member id, as `region` knows it (0: none).
pub async fn leader(region: &mut Region) -> anyhow::Result<usize> {
    Ok(leases(region).await?.leader as usize)
}

/// `region`'s own view of the lease group and table (`Admin/Leases`).
pub async fn leases(region: &mut Region) -> anyhow::Result<pb::LeasesResponse> {
    Ok(region
        .admin
        .leases(pb::LeasesRequest::default())
        .await?
        .into_inner())
}

/// Makes one of the regions the lease group's leader, if the witness leads: the witness is
/// frozen until the regions elect one of themselves, then resumed (it rejoins as a
/// follower). Returns the leading region's index in `regions` (member ids follow the
/// sorted region names).
pub async fn make_a_region_lead(regions: &mut [Region], witness_pid: u32) -> anyhow::Result<usize> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut frozen = None;
    loop {
        let leader = leader(&mut regions[0]).await?;
        if (1..=regions.len()).contains(&leader) {
            drop(frozen);
            return Ok(leader - 1);
        }
        if frozen.is_none() {
            frozen = Some(Frozen::new(witness_pid)?);
        }
        if Instant::now() > deadline {
            bail!("no region became the lease group leader within 30 s (leader: member {leader})");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until `state` answers `key` (a plain read) with `value`.
pub async fn wait_value(
    state: &mut StateClient<Channel>,
    key: &str,
    value: &str,
    within: Duration,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + within;
    loop {
        let read = state.get(replica(key)).await;
        let last = match read {
            Ok(v) if register(v.get_ref()) == Some(value.as_bytes()) => return Ok(()),
            Ok(v) => format!("{:?}", register(v.get_ref()).map(String::from_utf8_lossy)),
            Err(s) => s.to_string(),
        };
        ensure!(
            Instant::now() < deadline,
            "{key} is not {value:?} within {within:?}: {last}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until `region` reads the counter `key` as `want`.
pub async fn wait_counter(
    region: &mut Region,
    key: &str,
    want: i64,
    within: Duration,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + within;
    loop {
        let got = region
            .state
            .get(replica(key))
            .await
            .map(|v| super::counter(v.get_ref()))
            .unwrap_or(0);
        if got == want {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "{}: {key} is {got}, not {want}, after {within:?}",
            region.name
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Writes `key` (value "taken") at each of `regions` in turn until one accepts it: that
/// region took the key's shard. Answers its index and the accepted write.
pub async fn write_anywhere(
    regions: &mut [Region],
    key: &str,
) -> anyhow::Result<(usize, pb::UpdateResponse)> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        for (i, region) in regions.iter_mut().enumerate() {
            if let Ok(r) = region.state.update(set(key, "taken")).await {
                return Ok((i, r.into_inner()));
            }
        }
        if Instant::now() > deadline {
            bail!("no region took {key}'s shard within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
