//! The nemesis: the requested faults in turn, each healed before the next, recorded with
//! their start and end.

use std::time::{Duration, Instant};

use anyhow::Context;
use geostate_jepsen::control::{self, cluster_script, holder, read_cluster, signal, target_region};
use serde::Serialize;

use crate::client::Run;
use crate::{Args, Nemesis};

/// One fault as it happened.
#[derive(Serialize, Clone, Debug)]
pub(crate) struct Fault {
    pub(crate) nemesis: Nemesis,
    pub(crate) target: String,
    pub(crate) start_ns: u64,
    pub(crate) end_ns: u64,
}

/// Runs the faults in turn, each healed before the next: every kind once, then more until
/// `deadline` (a slow machine lengthens the run rather than skip a fault).
pub(crate) async fn nemesis(
    args: &Args,
    run: &Run,
    keys: &[String],
    deadline: Instant,
) -> anyhow::Result<Vec<Fault>> {
    let mut faults = Vec::new();
    let mut i = 0;
    tokio::time::sleep(Duration::from_secs(
        args.interval.min(args.seconds / 4).max(1),
    ))
    .await;
    while !args.nemesis.is_empty()
        && (i < args.nemesis.len() || Instant::now() + Duration::from_secs(5) < deadline)
    {
        let kind = args.nemesis[i % args.nemesis.len()];
        // each kind of fault takes the regions in turn, the kinds starting one region
        // apart: a run too short for a second round still hits every region
        let round = i / args.nemesis.len();
        let turn = round + i % args.nemesis.len();
        i += 1;
        let cluster = read_cluster(&args.cluster)?;
        let start_ns = run.now_ns();
        let target = match kind {
            Nemesis::PauseHolder => {
                let (region, pid) = holder(&cluster, &keys[0]).await?;
                control::pause(pid, Duration::from_secs(4)).await;
                region
            }
            Nemesis::Kill => {
                let region = target_region(&cluster, turn);
                let pid = cluster.regions[&region].pid.context("node pid")?;
                signal("-KILL", pid).await;
                tokio::time::sleep(Duration::from_secs(2)).await;
                cluster_script(&args.cluster, &["up", "--no-build"]).await?;
                region
            }
            Nemesis::Mirror => {
                control::mirror_outage(&args.cluster, Duration::from_secs(5)).await?;
                "mirrormaker2".to_string()
            }
            Nemesis::Broker => {
                let region = target_region(&cluster, turn);
                control::broker_outage(&args.cluster, &region, Duration::from_secs(5)).await?;
                format!("kafka {region}")
            }
            Nemesis::Wipe => {
                // an owned workload's wipe hits a key's holder (the keys in turn): what it
                // acknowledged and had not shipped is what the lost disk must not take along
                let region = if args.workload.owned() {
                    holder(&cluster, &keys[round % keys.len()]).await?.0
                } else {
                    target_region(&cluster, turn)
                };
                control::wipe_node(&args.cluster, &cluster, &region).await?;
                format!("node {region} (data dir wiped)")
            }
            Nemesis::Partition | Nemesis::PartitionOneWay => {
                let region = target_region(&cluster, turn);
                let direction = if kind == Nemesis::Partition {
                    "both"
                } else {
                    "out"
                };
                control::isolate(&args.cluster, &region, direction, Duration::from_secs(8)).await?;
                format!("{region} cut off ({direction})")
            }
            Nemesis::ClockWithin | Nemesis::ClockBeyond => {
                let region = target_region(&cluster, turn);
                let offset = if kind == Nemesis::ClockWithin {
                    300
                } else {
                    2000
                };
                control::clock_offset(&args.cluster, &region, offset, Duration::from_secs(8))
                    .await?;
                format!("node {region} clock +{offset} ms")
            }
            Nemesis::Scale => {
                let region = target_region(&cluster, turn);
                let node = control::add_node(&args.cluster, &region).await?;
                tokio::time::sleep(Duration::from_secs(6)).await;
                cluster_script(&args.cluster, &["node", "remove", &node]).await?;
                format!("node {node} added, removed 6 s later")
            }
            Nemesis::KillNode => {
                let region = target_region(&cluster, turn);
                let node = control::add_node(&args.cluster, &region).await?;
                tokio::time::sleep(Duration::from_secs(4)).await;
                // in turn the added node, and the first (the region's lease group member,
                // whose leases the added node, a learner, keeps renewing)
                let victim = if (round / 2).is_multiple_of(2) {
                    &node
                } else {
                    &region
                };
                let of = 1 + read_cluster(&args.cluster)?.regions[&region].nodes.len();
                cluster_script(&args.cluster, &["node", "kill", victim]).await?;
                // its partitions move to the other node (which evicts it from the group
                // within about a second), and stay there past the session timeout
                tokio::time::sleep(Duration::from_secs(12)).await;
                cluster_script(&args.cluster, &["up", "--no-build"]).await?;
                tokio::time::sleep(Duration::from_secs(3)).await;
                cluster_script(&args.cluster, &["node", "remove", &node]).await?;
                format!("node {victim} (of {of}) killed, restarted; {node} removed")
            }
            Nemesis::Wan => {
                let region = target_region(&cluster, turn);
                let delayed =
                    control::wan_delay(&args.cluster, &region, 100, 50, Duration::from_secs(8))
                        .await?;
                if delayed == 0 {
                    // never fired: the coverage check reports it
                    tokio::time::sleep(Duration::from_secs(args.interval)).await;
                    continue;
                }
                format!("{region} links delayed 100 ± 50 ms ({delayed} packets)")
            }
        };
        faults.push(Fault {
            nemesis: kind,
            target,
            start_ns,
            end_ns: run.now_ns(),
        });
        tokio::time::sleep(Duration::from_secs(args.interval)).await;
    }
    Ok(faults)
}
