//! Surge prices computed from windows, end to end on the cluster (both regions' nodes, the
//! lease group, each region's `geostate pricer` and `geostate sink postgres`, PostgreSQL):
//!
//! - demand (`requests/`) and supply (`supply/`) of two geohashes are written in both
//!   regions inside one minute of event time; each geohash's price key is homed at
//!   another region;
//! - in the middle of the window the node of the region holding the first geohash's
//!   price is SIGKILLed; the other region takes the shard; the node starts again;
//! - once the window is final in both regions, each geohash has one multiplier for the
//!   window, computed by the region's formula from the demand and supply of both regions:
//!   one record across both regions' outputs topics, written at an epoch after the
//!   failover, one row in PostgreSQL with that value, and `sink reconcile` finds no
//!   difference for them.
//!
//! Its own test binary: it kills a node the other tests use, and starts it again.

mod common;

use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use common::failover::{RestartNodes, regions, signal, wait_held};
use common::{add_at, cluster, cluster_script, node_config, now_ms, read_output_records, unique};
use geostate::sink::postgres::connect;
use geostate::sink::reconcile::{Source, reconcile};

const MIN: u64 = 60_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_geohash_window_is_priced_once_across_a_lease_failover() -> anyhow::Result<()> {
    let cluster = cluster()?;
    let pg = cluster
        .postgres
        .clone()
        .context("the cluster runs PostgreSQL")?;
    let (mut regions, lease) = regions(&cluster).await?;
    ensure!(regions.len() == 2, "the test needs two regions");
    let config = node_config(&cluster.regions[&regions[0].name])?;
    let pricing = config.pricing.clone().context("the region files price")?;
    let label = unique("gh");
    // a geohash whose price key's shard prefers `home`
    let homed = |home: &str| {
        (0..)
            .map(|i| format!("{label}-{i}"))
            .find(|gh| {
                let shard = lease.shard_of_key(&format!("{}{gh}", pricing.prices));
                lease.home_of(shard).is_some_and(|h| h.as_str() == home)
            })
            .expect("every region is some shard's home")
    };
    let (gh_a, gh_b) = (homed(&regions[0].name), homed(&regions[1].name));
    let price_key = |gh: &str| format!("{}{gh}", pricing.prices);
    let shard_a = lease.shard_of_key(&price_key(&gh_a));
    let epoch_before = wait_held(&mut regions[0], shard_a, Duration::from_secs(60)).await?;
    wait_held(
        &mut regions[1],
        lease.shard_of_key(&price_key(&gh_b)),
        Duration::from_secs(60),
    )
    .await?;

    // a window with at least 20 s left for the writes
    if now_ms() % MIN > MIN - 20_000 {
        tokio::time::sleep(Duration::from_millis(MIN - now_ms() % MIN + 1_000)).await;
    }
    let start = now_ms() / MIN * MIN;
    let (demand, supply) = (
        |gh: &str| format!("{}{gh}", pricing.demand),
        |gh: &str| format!("{}{gh}", pricing.supply),
    );
    // (region, key, events): gh_a 30 requests and 10 drivers, gh_b 13 and 10
    let writes = [
        (0, demand(&gh_a), 20),
        (1, demand(&gh_a), 10),
        (0, supply(&gh_a), 5),
        (1, supply(&gh_a), 5),
        (0, demand(&gh_b), 6),
        (1, demand(&gh_b), 7),
        (1, supply(&gh_b), 10),
    ];
    for (region, key, n) in &writes {
        for _ in 0..*n {
            let t = now_ms();
            ensure!(t < start + MIN, "the writes took past the window's end");
            regions[*region].state.update(add_at(key, t)).await?;
        }
    }

    // in the middle of the window, the holder of gh_a's price dies; the other region
    // takes the shard, and the node starts again
    let _restart = RestartNodes;
    signal("-KILL", regions[0].pid)?;
    while std::path::Path::new(&format!("/proc/{}", regions[0].pid)).exists() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let taken = wait_held(&mut regions[1], shard_a, Duration::from_secs(60)).await?;
    ensure!(taken > epoch_before, "epoch {epoch_before} -> {taken}");
    println!(
        "{} killed {} ms into the window; {} took shard {shard_a} at epoch {taken}",
        regions[0].name,
        now_ms() - start,
        regions[1].name
    );
    tokio::task::spawn_blocking(|| cluster_script(&["up", "--no-build"]))
        .await?
        .context("restarting the killed node")?;

    // after the window, a trickle in both regions moves event time on (into later
    // windows) until both prices are rows
    let db = connect(&pg.url, "tests/pricing").await?;
    let keys = [price_key(&gh_a), price_key(&gh_b)];
    let deadline = Instant::now() + Duration::from_secs(240);
    let rows = loop {
        let rows = db
            .query(
                "SELECT key, value::float8, epoch, region FROM geostate_outputs
                 WHERE key = ANY($1) AND window_start_ms = $2",
                &[&keys.to_vec(), &(start as i64)],
            )
            .await?;
        if rows.len() == keys.len() {
            break rows;
        }
        ensure!(
            Instant::now() < deadline,
            "{} of 2 prices in PostgreSQL 240 s after the window",
            rows.len()
        );
        let t = now_ms();
        if t >= start + MIN {
            for region in regions.iter_mut() {
                for gh in [&gh_a, &gh_b] {
                    let _ = region.state.update(add_at(&demand(gh), t)).await;
                    let _ = region.state.update(add_at(&supply(gh), t)).await;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };

    // the formula's multipliers: 1 + 0.5 × (30/10 − 1) = 2, 1 + 0.5 × (13/10 − 1) = 1.15
    let f = pricing.formula;
    let expected = [
        (keys[0].clone(), f.hundredths(30, 10), 200),
        (keys[1].clone(), f.hundredths(13, 10), 115),
    ];
    for (key, by_formula, literal) in &expected {
        ensure!(
            by_formula == literal,
            "{key}: the formula gives {by_formula}"
        );
        // gh_b may sort first: its homed index can be the lower one
        let row = rows
            .iter()
            .find(|r| r.get::<_, String>(0) == *key)
            .context("a row per key")?;
        let (found, value, epoch): (String, f64, i64) = (row.get(0), row.get(1), row.get(2));
        ensure!(
            (value * 100.0).round() as i64 == *literal,
            "{found} = {value} in PostgreSQL, expected {literal} hundredths"
        );
        if key == &keys[0] {
            ensure!(
                epoch as u64 > epoch_before,
                "gh_a priced at epoch {epoch}, not after the failover (epoch {epoch_before})"
            );
        }
        println!(
            "{found}: {value} at epoch {epoch} by {}",
            row.get::<_, String>(3)
        );
    }

    // one multiplier per geohash and window across both regions' outputs topics
    let mut sources = Vec::new();
    let mut records = Vec::new();
    for (name, r) in &cluster.regions {
        let kafka = node_config(r)?.kafka;
        records.extend(
            read_output_records(
                &kafka.bootstrap,
                &kafka.outputs_topic,
                4,
                0,
                Duration::from_secs(30),
            )
            .await?
            .into_iter()
            .filter(|o| keys.iter().any(|k| o["key"] == k.as_str())),
        );
        sources.push(Source {
            region: name.clone(),
            kafka,
        });
    }
    for key in &keys {
        let of_window: Vec<_> = records
            .iter()
            .filter(|o| o["key"] == key.as_str() && o["start_ms"] == start)
            .collect();
        if of_window.len() != 1 {
            bail!("{key} window {start}: {of_window:?} in the outputs topics, not one");
        }
    }
    let found = reconcile(&pg.url, &sources, Duration::from_secs(60)).await?;
    let ours: Vec<&String> = found
        .differences
        .iter()
        .filter(|d| d.contains(&label))
        .collect();
    ensure!(ours.is_empty(), "reconcile: {ours:?}");
    let twice: Vec<&String> = found
        .rewritten
        .iter()
        .filter(|r| r.contains(&label))
        .collect();
    ensure!(twice.is_empty(), "priced twice: {twice:?}");
    Ok(())
}
