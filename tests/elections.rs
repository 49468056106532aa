//! The lease group's elections on the test cluster: a voter cut off (iptables) or frozen
//! (SIGSTOP) past its election timeout, then back, finds a leader the others still follow
//! and stays its follower. With openraft 0.9's own elections a cut-off member stands again
//! and again, each time at a higher term, and a thawed one may stand at once; the leader
//! steps down on seeing the higher term (`lease::election`'s pre-vote prevents both).
//! And a leader whose links turn slow (100 ± 50 ms each way) hands the lead to a voter
//! whose links are fast, and no lease moves: it keeps leading while slow, its calls going
//! for a second (`lease::runtime`; openraft 0.9 would time them out after a heartbeat, the
//! others would elect and the slow region's renewals lapse), until the voters' round
//! trips show another voter better placed (`lease::placement`).
//!
//! Its own test binary: it cuts off and freezes cluster parts the other tests use.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use common::failover::{Frozen, Region, leases, make_a_region_lead, regions, witness_pid};
use common::{cluster, cluster_script};

/// (leader, term) of the lease group as `region`'s member knows them.
async fn group(region: &mut Region) -> anyhow::Result<(u64, u64)> {
    let answer = leases(region).await?;
    Ok((answer.leader, answer.term))
}

/// Waits until the group's leader and term stayed the same for `calm`; answers them.
async fn settled(region: &mut Region, calm: Duration) -> anyhow::Result<(u64, u64)> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = group(region).await?;
    let mut since = Instant::now();
    while since.elapsed() < calm {
        ensure!(
            Instant::now() < deadline,
            "the lease group did not settle within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = group(region).await?;
        if now != seen || now.0 == 0 {
            (seen, since) = (now, Instant::now());
        }
    }
    Ok(seen)
}

/// The tests cut off and freeze the cluster's parts: one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Heals the network when dropped.
struct Healed;

impl Drop for Healed {
    fn drop(&mut self) {
        let _ = cluster_script(&["net", "heal"]);
    }
}

/// How a voter is kept away from the group.
enum Fault {
    CutOff(String),
    Frozen(String, u32),
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_voter_kept_away_past_its_election_timeout_comes_back_as_a_follower() -> anyhow::Result<()>
{
    let _alone = ONE_AT_A_TIME.lock().await;
    let cluster = cluster()?;
    let (mut regions, lease) = regions(&cluster).await?;
    let witness = witness_pid(&cluster)?;
    let leading = region_leading(&mut regions, witness).await?;
    let follower = regions[1 - leading].name.clone();
    // away past the longest election timeout (the leader lease, twice the setting, plus
    // up to twice the setting again)
    let away_for = 6 * lease.election_timeout;
    // a thawed member that stands at once does so before or after it handles the leader's
    // first message, by chance; a cut-off one stands while cut off
    let faults = [
        Fault::CutOff(follower.clone()),
        Fault::Frozen("the witness".into(), witness),
        Fault::Frozen(follower, regions[1 - leading].pid),
    ];
    for fault in &faults {
        let before = settled(&mut regions[leading], Duration::from_secs(1)).await?;
        ensure!(
            before.0 == leading as u64 + 1,
            "member {} leads, not {}",
            before.0,
            regions[leading].name
        );
        let name = match fault {
            Fault::CutOff(region) => {
                let _healed = Healed;
                cluster_script(&["net", "isolate", region])?;
                tokio::time::sleep(away_for).await;
                format!("{region}, cut off,")
            }
            Fault::Frozen(name, pid) => {
                let _frozen = Frozen::new(*pid)?;
                tokio::time::sleep(away_for).await;
                format!("{name}, frozen,")
            }
        };
        let resumed = Instant::now();
        while resumed.elapsed() < Duration::from_secs(2) {
            let now = group(&mut regions[leading]).await?;
            if now != before {
                bail!(
                    "{:?} after {name} came back from {away_for:?} away, the lease group went \
                     from leader {} at term {} to leader {} at term {}",
                    resumed.elapsed(),
                    before.0,
                    before.1,
                    now.0,
                    now.1
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        println!(
            "{name} back after {away_for:?}: member {} still leads at term {}",
            before.0, before.1
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_links_turn_slow_hands_the_lead_to_a_voter_with_fast_links_and_no_lease_moves()
-> anyhow::Result<()> {
    let _alone = ONE_AT_A_TIME.lock().await;
    let cluster = cluster()?;
    let (mut regions, _) = regions(&cluster).await?;
    let witness = witness_pid(&cluster)?;
    let leading = region_leading(&mut regions, witness).await?;
    let before = (
        group(&mut regions[leading]).await?,
        holders(&mut regions)
            .await
            .context("before the links turned slow")?,
    );
    let slow = regions[leading].name.clone();
    let fast = 1 - leading;
    let _healed = Healed;
    cluster_script(&["net", "delay", &slow, "--ms", "100", "--jitter", "50"])?;
    let delayed = Instant::now();
    // the least time left on a lease the slow region holds (in the fresher of the two
    // regions' tables), and how long the slow region did not hold one its table gives it
    let (mut least_left, mut lapsed) = (i64::MAX, Duration::ZERO);
    let mut moved = None;
    let mut polled = Instant::now();
    while delayed.elapsed() < SLOW_FOR {
        let answer = leases(&mut regions[fast]).await?;
        if moved.is_none() && answer.leader != before.0.0 && answer.leader != 0 {
            moved = Some(((answer.leader, answer.term), delayed.elapsed()));
        }
        let own = leases(&mut regions[1 - fast]).await?;
        for s in own.shards.iter().filter(|s| s.holder == slow) {
            let other = answer
                .shards
                .iter()
                .find(|o| o.shard == s.shard && o.holder == slow);
            let left = other.map_or(s.expires_in_ms, |o| o.expires_in_ms.max(s.expires_in_ms));
            least_left = least_left.min(left);
        }
        if own.shards.iter().any(|s| s.holder == slow && !s.held_here) {
            lapsed += polled.elapsed();
        }
        polled = Instant::now();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let Some(moved) = moved else {
        bail!(
            "{SLOW_FOR:?} after {slow}'s links turned slow, its member {} still leads",
            before.0.0
        );
    };
    // the lead stays with the member on fast links while the slow one's links stay slow
    let last = group(&mut regions[fast]).await?;
    ensure!(
        last == moved.0,
        "after the handover to member {} at term {}, the lead moved on to {} at term {}",
        moved.0.0,
        moved.0.1,
        last.0,
        last.1
    );
    let after = holders(&mut regions)
        .await
        .with_context(|| format!("{SLOW_FOR:?} after {slow}'s links turned slow"))?;
    ensure!(
        after == before.1,
        "with {slow}'s links slow for {SLOW_FOR:?}, leases moved: {:?} -> {after:?} (the least left of {slow}'s: {least_left} ms; not held in its own view for {lapsed:?})",
        before.1
    );
    println!(
        "{slow}'s links slow: member {} handed the lead to member {} (term {} -> {}) after {:?}; every shard with its holder at its epoch, held in its holder's view; the least left of {slow}'s leases: {least_left} ms; not held in its own view for {lapsed:?}",
        before.0.0, moved.0.0, before.0.1, moved.0.1, moved.1
    );
    Ok(())
}

/// How long the leader's links stay slow: long enough for the voters' round trips to
/// show it (`lease::placement`: the median of five probes half a second apart, three in
/// a row) and the handover, and five leases of the template.
const SLOW_FOR: Duration = Duration::from_secs(12);

/// Each shard's (holder, epoch), the same in every region's table, and held (valid, in
/// its holder's own view).
async fn holders(regions: &mut [Region]) -> anyhow::Result<BTreeMap<u32, (String, u64)>> {
    let mut views = Vec::new();
    for region in regions.iter_mut() {
        let shards = leases(region).await?.shards;
        for s in &shards {
            ensure!(
                s.holder != region.name || s.held_here,
                "{}'s lease on shard {} lapsed in its own view",
                region.name,
                s.shard
            );
        }
        views.push(
            shards
                .into_iter()
                .map(|s| (s.shard, (s.holder, s.epoch)))
                .collect::<BTreeMap<_, _>>(),
        );
    }
    ensure!(
        views.windows(2).all(|w| w[0] == w[1]),
        "the regions' lease tables differ: {views:?}"
    );
    Ok(views.swap_remove(0))
}

/// Makes a region lead the group (the witness frozen while it leads), settled; answers
/// its index in `regions`.
async fn region_leading(regions: &mut [Region], witness: u32) -> anyhow::Result<usize> {
    ensure!(regions.len() == 2, "the test needs two regions");
    let mut leading = settled(&mut regions[0], Duration::from_secs(2)).await?.0;
    for _ in 0..3 {
        if leading != 3 {
            break;
        }
        make_a_region_lead(regions, witness).await?;
        leading = settled(&mut regions[0], Duration::from_secs(2)).await?.0;
    }
    ensure!(leading != 3, "the witness still leads the lease group");
    Ok(leading as usize - 1)
}
