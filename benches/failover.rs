//! Owned-key failover benchmark (`make bench`): prints figures, asserts nothing.
//!
//! For each lease setting (the templates' as `make up` runs them, then a fast one): the
//! cluster's witness and nodes restart with it; a calm window measures what the leases
//! cost (lease commands per second, each one Raft log entry replicated to a majority) and
//! counts false failovers (epochs that moved with nothing cut); then, in each of the
//! trials, the holder of a fresh owned key is frozen (SIGSTOP) and the other region
//! writes the key every 20 ms: the time from the freeze to the first accepted write is
//! the failover. Trials alternate between a holder whose node follows the lease group's
//! leader and one whose node leads it (then the failover includes an election). The
//! frozen region resumes and its home shard comes back to it (take-back). Before the
//! trials, a WAN window: the links of the region whose member leads the lease group (a
//! region is made to lead) to the other sites are held 100 ± 50 ms per packet
//! (`cluster.py net delay`, the `wan` nemesis) and every lease epoch granted meanwhile is
//! a false failover.

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use common::failover::{
    Region, cut_off, key_homed_at, leader, leases, make_a_region_lead, regions, wait_held,
    write_until_accepted,
};
use common::{cluster, cluster_script_env, http_get, ms, percentile, unique};
use geostate::config::LeaseConfig;

/// Trials per setting and kind (`GEOSTATE_FAILOVER_TRIALS` overrides).
const TRIALS: usize = 20;
const CALM: Duration = Duration::from_secs(10);

/// (name, settings, seconds of the WAN window: `GEOSTATE_WAN_SECS` overrides). The
/// template's window is the 10 minutes #20 asks of the defaults.
const PROFILES: [(&str, &str, u64); 2] = [
    ("template (make up)", "", 600),
    (
        "fast",
        "lease.duration=700ms lease.renew-every=150ms lease.heartbeat=50ms lease.election-timeout=250ms max-clock-offset=100ms",
        120,
    ),
];

fn main() -> anyhow::Result<()> {
    common::block_on(run())
}

fn wan(secs: u64) -> Duration {
    let secs = std::env::var("GEOSTATE_WAN_SECS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(secs);
    Duration::from_secs(secs)
}

fn trials() -> usize {
    std::env::var("GEOSTATE_FAILOVER_TRIALS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(TRIALS)
}

async fn run() -> anyhow::Result<()> {
    println!("# geostate owned-key failover benchmark");
    println!();
    println!(
        "machine: 2 cores; two regions + a witness on loopback, release-build nodes; per setting {} trials where the holder's node follows the lease group's leader and {} where it leads; the holder is frozen with SIGSTOP (its Raft, Kafka and gRPC traffic stop), the other region writes every 20 ms; before the trials, a WAN window: the links of the region leading the lease group to the other sites held 100 ± 50 ms per packet",
        trials(),
        trials(),
    );
    let mut rows = Vec::new();
    for (name, spec, wan_secs) in PROFILES {
        cluster_script_env(&["restart-nodes"], &[("GEOSTATE_SET", spec)])?;
        rows.push(profile(name, wan(wan_secs)).await?);
    }
    // leave the cluster as `make up` configures it
    cluster_script_env(&["restart-nodes"], &[("GEOSTATE_SET", "")])?;

    println!();
    println!(
        "| setting | lease / renew / election / max-clock-offset | failover p50 / p99 / max, holder's node follows ({t} trials) | the same, holder's node leads the group ({t} trials) | take-back p50 | lease commands/s in Raft entries/s | false failovers in {}s | WAN window | WAN window: epochs granted (false failovers) / shard-seconds without a valid holding |",
        CALM.as_secs(),
        t = trials()
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        println!("{r}");
    }
    Ok(())
}

/// The sum of a counter's series on a region's metrics endpoint.
fn counter(region: &Region, name: &str) -> anyhow::Result<f64> {
    Ok(http_get(&region.metrics, "/metrics")?
        .lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

async fn epochs(region: &mut Region) -> anyhow::Result<BTreeMap<u32, (String, u64)>> {
    Ok(leases(region)
        .await?
        .shards
        .into_iter()
        .map(|s| (s.shard, (s.holder, s.epoch)))
        .collect())
}

/// Waits until every region holds (a valid lease, in its own view) every shard homed at it,
/// and every region's table agrees on holders and epochs. Right after `restart-nodes` a
/// node's table is still replaying the Raft log, so one region's view of holders alone can
/// show an old state: the calm window then measured the start-up take-backs.
async fn settled(regions: &mut [Region], lease: &LeaseConfig) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut views = Vec::new();
        let mut held = true;
        for region in regions.iter_mut() {
            let shards = leases(region).await?.shards;
            held &= lease.all_shards().all(|s| {
                lease.home_of(s).as_ref().map(|r| r.as_str()) != Some(region.name.as_str())
                    || shards.iter().any(|l| l.shard == s && l.held_here)
            });
            views.push(
                shards
                    .into_iter()
                    .map(|l| (l.shard, (l.holder, l.epoch)))
                    .collect::<BTreeMap<_, _>>(),
            );
        }
        if held && views.windows(2).all(|w| w[0] == w[1]) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("shards not held at home within 60 s: {views:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Samples every region's leases every 100 ms for `window`: the shard-seconds in which
/// no region held a valid lease (so the shard's owned keys could be written nowhere).
async fn unheld_during(regions: &mut [Region], window: Duration) -> anyhow::Result<f64> {
    const EVERY: Duration = Duration::from_millis(100);
    let end = Instant::now() + window;
    let (mut unheld, mut last) = (0.0, Instant::now());
    while Instant::now() < end {
        let mut held = BTreeMap::<u32, bool>::new();
        for region in regions.iter_mut() {
            for s in leases(region).await?.shards {
                *held.entry(s.shard).or_default() |= s.held_here;
            }
        }
        // each sample stands for the time since the one before
        unheld += held.values().filter(|h| !**h).count() as f64 * last.elapsed().as_secs_f64();
        last = Instant::now();
        tokio::time::sleep(EVERY).await;
    }
    Ok(unheld)
}

async fn profile(name: &str, wan: Duration) -> anyhow::Result<String> {
    let cluster = cluster()?;
    let (mut regions, lease) = regions(&cluster).await?;
    settled(&mut regions, &lease).await?;

    // the cost of holding leases, and whether they move with nothing cut
    let totals = |regions: &[Region]| -> anyhow::Result<(f64, f64)> {
        let mut sum = (0.0, 0.0);
        for r in regions {
            sum.0 += counter(r, "geostate_lease_proposals_total")?;
            sum.1 += counter(r, "geostate_lease_log_entries_total")?;
        }
        Ok(sum)
    };
    let before = totals(&regions)?;
    let epochs_before = epochs(&mut regions[0]).await?;
    tokio::time::sleep(CALM).await;
    let after = totals(&regions)?;
    let epochs_after = epochs(&mut regions[0]).await?;
    let false_failovers = epochs_before
        .iter()
        .filter(|(s, (_, e))| epochs_after.get(s).is_some_and(|(_, e2)| e2 != e))
        .count();
    for (shard, (holder, epoch)) in &epochs_before {
        if let Some((now_holder, now_epoch)) = epochs_after.get(shard)
            && now_epoch != epoch
        {
            eprintln!(
                "{name}: shard {shard} moved in the calm window: {holder}@{epoch} -> {now_holder}@{now_epoch}"
            );
        }
    }
    let commands_per_second = (after.0 - before.0) / CALM.as_secs_f64();
    let entries_per_second = (after.1 - before.1) / CALM.as_secs_f64();

    // the WAN window, on the region whose member leads the group (the worst case: every
    // entry waits on its slow links): a slow link is no failure, yet every epoch granted
    // is a failover
    let witness = cluster
        .witness
        .as_ref()
        .and_then(|w| w.pid)
        .context("the cluster has a witness")?;
    let leading = make_a_region_lead(&mut regions, witness).await?;
    let delayed = regions[leading].name.clone();
    let observer = (leading + 1) % regions.len();
    let epochs_before = epochs(&mut regions[observer]).await?;
    cluster_script_env(
        &["net", "delay", &delayed, "--ms", "100", "--jitter", "50"],
        &[],
    )?;
    let unheld = unheld_during(&mut regions, wan).await?;
    cluster_script_env(&["net", "heal"], &[])?;
    settled(&mut regions, &lease).await?;
    let epochs_after = epochs(&mut regions[observer]).await?;
    let wan_failovers: u64 = epochs_after
        .iter()
        .map(|(s, (_, e))| e.saturating_sub(epochs_before.get(s).map_or(0, |(_, e)| *e)))
        .sum();

    // trials in pairs: the holder's node follows the group's leader, then leads it (the
    // witness paused until a region is elected), so the failover includes an election
    let mut failovers: [Vec<Duration>; 2] = Default::default();
    let mut take_backs = Vec::new();
    let trials = trials();
    for t in 0..2 * trials {
        let leading = t % 2 == 1;
        let victim = if leading {
            make_a_region_lead(&mut regions, witness).await?
        } else {
            let leader = leader(&mut regions[0]).await?;
            // a region that does not lead (both do not: the witness leads)
            (0..regions.len())
                .find(|&i| i + 1 != leader)
                .context("a region that does not lead")?
        };
        let (key, shard) = key_homed_at(&lease, &regions[victim].name, &unique("failover"));
        wait_held(&mut regions[victim], shard, Duration::from_secs(30)).await?;
        let (first, second) = regions.split_at_mut(1);
        let (a, b) = if victim == 0 {
            (&mut first[0], &mut second[0])
        } else {
            (&mut second[0], &mut first[0])
        };
        let (took, _, _, frozen) = cut_off(a, b, &key, "after").await?;
        failovers[usize::from(leading)].push(took);
        drop(frozen);
        let (back, _) = write_until_accepted(a, &key, "back", Duration::from_secs(60)).await?;
        take_backs.push(back);
    }
    take_backs.sort();
    let spread = |d: &mut Vec<Duration>| {
        d.sort();
        format!(
            "{} / {} / {}",
            ms(percentile(d, 0.5)),
            ms(percentile(d, 0.99)),
            ms(*d.last().unwrap_or(&Duration::ZERO))
        )
    };
    let [follower, leader] = &mut failovers;
    Ok(format!(
        "| {name} | {:?} / {:?} / {:?} / {:?} | {} | {} | {} | {commands_per_second:.1} in {entries_per_second:.1} | {false_failovers} | {} s | {wan_failovers} / {unheld:.1} |",
        lease.duration,
        lease.renew_every,
        lease.election_timeout,
        max_clock_offset(&cluster)?,
        spread(follower),
        spread(leader),
        ms(percentile(&take_backs, 0.5)),
        wan.as_secs(),
    ))
}

fn max_clock_offset(cluster: &common::Cluster) -> anyhow::Result<Duration> {
    let Some(r) = cluster.regions.values().next() else {
        bail!("no region");
    };
    Ok(common::node_config(r)?.max_clock_offset)
}
