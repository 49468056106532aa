//! The faults: each drill's one fault, injected and healed through `cluster.py` and
//! signals (`geostate_jepsen::control`).

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context;
use geostate_jepsen::control::{
    ClusterFile, add_node, broker_outage, clock_offset, cluster_script, grpc, heal, holder,
    isolate, mirror_outage, pause, signal, wan_delay, wipe_node,
};
use geostate_proto::pb;

use crate::{Args, Drill, LEASE_FAILOVER_BUDGET, MOVE_BUDGET, UNAFFECTED_BUDGET};

/// What the fault did: which region it hit and when it was healed.
pub(crate) struct Fault {
    pub(crate) target: String,
    /// Regions whose writes and reads the fault is expected to take down.
    pub(crate) affected: Vec<String>,
    /// How long owned-key writes may stop (per key, in whichever region holds it).
    pub(crate) owned_budget: Option<Duration>,
    /// Counter key → its partition, where the drill judges each partition's writes alone
    /// (partitions move); empty otherwise.
    pub(crate) partitions: BTreeMap<String, i32>,
    /// Lease epochs granted during a fault that must not move any lease (none where
    /// moving them is the point).
    pub(crate) failovers: Option<u64>,
}

/// The region whose member leads the lease group, after making a region lead if the
/// witness does: the witness is frozen until the regions elect one of themselves (at
/// most 30 s; member ids follow the sorted region names, the witness's is the last).
pub(crate) async fn leading_region(cluster: &ClusterFile) -> anyhow::Result<String> {
    let names: Vec<&String> = cluster.regions.keys().collect();
    let witness = cluster.witness.as_ref().and_then(|w| w.pid);
    let mut admin =
        pb::admin_client::AdminClient::connect(grpc(&cluster.regions[names[0]])?).await?;
    let mut frozen = None;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let leading = loop {
        let leader = admin
            .leases(pb::LeasesRequest::default())
            .await?
            .into_inner()
            .leader as usize;
        if let Some(name) = leader.checked_sub(1).and_then(|i| names.get(i)) {
            break Ok(name.to_string());
        }
        if let (None, Some(pid), true) = (frozen, witness, leader != 0) {
            signal("-STOP", pid).await;
            frozen = Some(pid);
        }
        if std::time::Instant::now() > deadline {
            break Err(anyhow::anyhow!(
                "no region's member came to lead the lease group within 30 s"
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    if let Some(pid) = frozen {
        signal("-CONT", pid).await;
    }
    leading
}

/// Each shard's lease epoch, the highest any region's node reports (`Admin/Leases`).
async fn lease_epochs(cluster: &ClusterFile) -> anyhow::Result<BTreeMap<u32, u64>> {
    let mut epochs = BTreeMap::new();
    for site in cluster.regions.values() {
        let mut admin = pb::admin_client::AdminClient::connect(grpc(site)?).await?;
        let leases = admin
            .leases(pb::LeasesRequest::default())
            .await?
            .into_inner();
        for shard in leases.shards {
            let epoch = epochs.entry(shard.shard).or_default();
            *epoch = shard.epoch.max(*epoch);
        }
    }
    Ok(epochs)
}

/// Each key's partition, as the region's node answers `Admin/Route`.
async fn partitions_of(
    cluster: &ClusterFile,
    region: &str,
    keys: &[String],
) -> anyhow::Result<BTreeMap<String, i32>> {
    let mut admin = pb::admin_client::AdminClient::connect(grpc(&cluster.regions[region])?).await?;
    let mut out = BTreeMap::new();
    for key in keys {
        let route = admin
            .route(pb::RouteRequest { key: key.clone() })
            .await?
            .into_inner();
        out.insert(key.clone(), route.partition);
    }
    Ok(out)
}

pub(crate) async fn inject(
    args: &Args,
    cluster: &ClusterFile,
    region: &str,
    owned_key: &str,
    counters: &[String],
) -> anyhow::Result<Fault> {
    let path = &args.cluster;
    let partitions = BTreeMap::new();
    let fault = match args.drill {
        Drill::KillRegion => {
            let node_pid = cluster.regions[region].pid.context("node pid")?;
            signal("-KILL", node_pid).await;
            // the broker's restart is followed by the node's (`up`)
            broker_outage(path, region, Duration::from_secs(10)).await?;
            Fault {
                target: format!("node and Kafka broker of {region}"),
                affected: vec![region.to_string()],
                owned_budget: Some(LEASE_FAILOVER_BUDGET),
                partitions,
                failovers: None,
            }
        }
        Drill::PauseHolder => {
            let (holder, pid) = holder(cluster, owned_key).await?;
            pause(pid, Duration::from_secs(6)).await;
            Fault {
                target: format!("node of {holder}, holding {owned_key}"),
                affected: vec![holder],
                owned_budget: Some(LEASE_FAILOVER_BUDGET),
                partitions,
                failovers: None,
            }
        }
        Drill::BrokerLoss => {
            broker_outage(path, region, Duration::from_secs(10)).await?;
            Fault {
                target: format!("Kafka broker of {region}"),
                // its writes need the broker; its reads go on from the node's copies
                affected: vec![region.to_string()],
                // the node releases its leases once it cannot reach its Kafka, and another
                // region takes the shards
                owned_budget: Some(LEASE_FAILOVER_BUDGET),
                partitions,
                failovers: None,
            }
        }
        Drill::MirrorBacklog => {
            mirror_outage(path, Duration::from_secs(20)).await?;
            Fault {
                target: "MirrorMaker 2".into(),
                affected: vec![],
                owned_budget: Some(UNAFFECTED_BUDGET),
                partitions,
                failovers: None,
            }
        }
        Drill::S3Outage => {
            cluster_script(path, &["s3", "kill"]).await?;
            tokio::time::sleep(Duration::from_secs(40)).await;
            cluster_script(path, &["s3", "start"]).await?;
            Fault {
                target: "the S3 server (checkpoint store)".into(),
                // checkpoints only: no write, read or lease waits on them
                affected: vec![],
                owned_budget: Some(UNAFFECTED_BUDGET),
                partitions,
                failovers: None,
            }
        }
        Drill::RegionWipe => {
            wipe_node(path, cluster, region).await?;
            Fault {
                target: format!("node of {region}, data dir wiped"),
                affected: vec![region.to_string()],
                owned_budget: Some(LEASE_FAILOVER_BUDGET),
                partitions,
                failovers: None,
            }
        }
        Drill::IsolateRegion => {
            isolate(path, region, "both", Duration::from_secs(15)).await?;
            Fault {
                target: format!("network of {region} (both directions)"),
                // both regions keep taking commutative writes and serving reads: that is
                // what active-active is for
                affected: vec![],
                // the cut-off region's leases run out; the majority side takes its shards
                owned_budget: Some(LEASE_FAILOVER_BUDGET),
                partitions,
                failovers: None,
            }
        }
        Drill::ClockSkew => {
            clock_offset(path, region, 2000, Duration::from_secs(15)).await?;
            Fault {
                target: format!("clock of the node of {region}, +2 s"),
                // two restarts of the node
                affected: vec![region.to_string()],
                owned_budget: Some(LEASE_FAILOVER_BUDGET),
                partitions,
                failovers: None,
            }
        }
        Drill::ScaleOutUnderLoad => {
            let partitions = partitions_of(cluster, region, counters).await?;
            let second = add_node(path, region).await?;
            tokio::time::sleep(Duration::from_secs(8)).await;
            let third = add_node(path, region).await?;
            tokio::time::sleep(Duration::from_secs(8)).await;
            cluster_script(path, &["node", "remove", &third]).await?;
            tokio::time::sleep(Duration::from_secs(5)).await;
            cluster_script(path, &["node", "remove", &second]).await?;
            Fault {
                target: format!("{region} scaled out to three nodes and back, one node at a time"),
                // every partition moves, each alone: no scope goes down as a whole
                affected: vec![],
                owned_budget: Some(MOVE_BUDGET),
                partitions,
                failovers: None,
            }
        }
        Drill::WanDelay => {
            // `region` leads the lease group (`leading_region`, before the load): the worst
            // case, every entry waits on its slow links
            let before = lease_epochs(cluster).await?;
            let wan = Duration::from_secs(args.wan_secs);
            let delayed = wan_delay(path, region, 100, 50, wan).await?;
            anyhow::ensure!(delayed > 0, "the WAN delay held no packet");
            let after = lease_epochs(cluster).await?;
            let granted = after
                .iter()
                .map(|(shard, e)| e.saturating_sub(before.get(shard).copied().unwrap_or(0)))
                .sum();
            Fault {
                target: format!(
                    "links of {region} to the other sites delayed 100 ± 50 ms ({delayed} packets)"
                ),
                // slower, never down
                affected: vec![],
                owned_budget: Some(UNAFFECTED_BUDGET),
                partitions,
                failovers: Some(granted),
            }
        }
    };
    // whatever else the fault left behind
    heal(path).await?;
    Ok(fault)
}
