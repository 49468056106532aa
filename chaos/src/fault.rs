//! The faults: each drill's one fault, injected and healed through `cluster.py` and
//! signals (`geostate_jepsen::control`).

use std::time::Duration;

use anyhow::Context;
use geostate_jepsen::control::{
    ClusterFile, broker_outage, clock_offset, heal, holder, isolate, mirror_outage, pause, signal,
    wipe_node,
};

use crate::{Args, Drill, LEASE_FAILOVER_BUDGET, UNAFFECTED_BUDGET};

/// What the fault did: which region it hit and when it was healed.
pub(crate) struct Fault {
    pub(crate) target: String,
    /// Regions whose writes and reads the fault is expected to take down.
    pub(crate) affected: Vec<String>,
    /// How long owned-key writes may stop (per key, in whichever region holds it).
    pub(crate) owned_budget: Option<Duration>,
}

pub(crate) async fn inject(
    args: &Args,
    cluster: &ClusterFile,
    region: &str,
    owned_key: &str,
) -> anyhow::Result<Fault> {
    let path = &args.cluster;
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
            }
        }
        Drill::PauseHolder => {
            let (holder, pid) = holder(cluster, owned_key).await?;
            pause(pid, Duration::from_secs(6)).await;
            Fault {
                target: format!("node of {holder}, holding {owned_key}"),
                affected: vec![holder],
                owned_budget: Some(LEASE_FAILOVER_BUDGET),
            }
        }
        Drill::BrokerLoss => {
            broker_outage(path, region, Duration::from_secs(10)).await?;
            Fault {
                target: format!("Kafka broker of {region}"),
                affected: vec![region.to_string()],
                // the node keeps its leases (the lease group does not use Kafka), so its
                // owned keys wait for the broker: the fault's whole length
                owned_budget: None,
            }
        }
        Drill::MirrorBacklog => {
            mirror_outage(path, Duration::from_secs(20)).await?;
            Fault {
                target: "MirrorMaker 2".into(),
                affected: vec![],
                owned_budget: Some(UNAFFECTED_BUDGET),
            }
        }
        Drill::RegionWipe => {
            wipe_node(path, cluster, region).await?;
            Fault {
                target: format!("node of {region}, data dir wiped"),
                affected: vec![region.to_string()],
                owned_budget: Some(LEASE_FAILOVER_BUDGET),
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
            }
        }
        Drill::ClockSkew => {
            clock_offset(path, region, 2000, Duration::from_secs(15)).await?;
            Fault {
                target: format!("clock of the node of {region}, +2 s"),
                // two restarts of the node
                affected: vec![region.to_string()],
                owned_budget: Some(LEASE_FAILOVER_BUDGET),
            }
        }
    };
    // whatever else the fault left behind
    heal(path).await?;
    Ok(fault)
}
