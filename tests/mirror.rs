//! MirrorMaker 2 stopped while both regions keep taking writes, then restarted: nothing is
//! lost, both regions converge to the sum. Its own test binary, because it stops the
//! mirror every other test of the cluster relies on (test binaries run one at a time).

mod common;

use std::time::{Duration, Instant};

use anyhow::bail;
use common::failover::replica;
use common::{RestartMirror, cluster, cluster_script, counter, unique};
use geostate::pb;
use geostate::pb::state_client::StateClient;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mirrormaker_2_stopped_then_restarted_loses_nothing() -> anyhow::Result<()> {
    const WRITES: i64 = 50;
    let cluster = cluster()?;
    let mut clients = Vec::new();
    for r in cluster.regions.values() {
        let grpc = r.grpc.clone().expect("make test starts a node per region");
        clients.push(StateClient::connect(format!("http://{grpc}")).await?);
    }
    let keys: Vec<String> = (0..5)
        .map(|i| format!("trips/{}-{i}", unique("mm2-stop")))
        .collect();

    cluster_script(&["mirror", "stop"])?;
    let _restart = RestartMirror;
    // every region adds (region index + 1) per write to every key
    for (i, client) in clients.iter_mut().enumerate() {
        for w in 0..WRITES {
            client
                .update(pb::UpdateRequest {
                    key: keys[(w % 5) as usize].clone(),
                    op: Some(pb::update_request::Op::Add(i as i64 + 1)),
                    id: String::new(),
                    event_time_ms: 0,
                })
                .await?;
        }
    }
    // with the mirror down, each region sees only its own writes, and hears no heartbeat
    tokio::time::sleep(Duration::from_secs(3)).await;
    for (region, r) in &cluster.regions {
        let metrics = r.metrics.as_deref().expect("a node per region");
        wait_silence(
            metrics,
            |s| s >= SILENT,
            &format!("{region} to notice the silence"),
        )
        .await?;
    }
    for (i, client) in clients.iter_mut().enumerate() {
        let v = client.get(replica(&keys[0])).await?.into_inner();
        assert_eq!(
            counter(&v),
            (i as i64 + 1) * WRITES / 5,
            "region {i} saw another region's writes with the mirror stopped"
        );
    }

    cluster_script(&["mirror", "start"])?;
    let restarted = Instant::now();
    let regions = clients.len() as i64;
    let expected = (1..=regions).sum::<i64>() * WRITES / 5;
    for (i, client) in clients.iter_mut().enumerate() {
        loop {
            let values = client
                .batch_get(pb::BatchGetRequest {
                    keys: keys.clone(),
                    window: None,
                })
                .await?
                .into_inner()
                .values;
            if values.iter().all(|v| counter(v) == expected) {
                break;
            }
            if restarted.elapsed() > Duration::from_secs(120) {
                bail!("region {i} did not converge 120 s after the mirror restarted: {values:?}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    println!(
        "converged {:.1} s after MirrorMaker 2 was restarted",
        restarted.elapsed().as_secs_f64()
    );
    for (region, r) in &cluster.regions {
        let metrics = r.metrics.as_deref().expect("a node per region");
        wait_silence(metrics, |s| s < SILENT, &format!("{region} to hear again")).await?;
    }
    Ok(())
}

/// Heartbeats come every second: a remote silent this long is cut off.
const SILENT: f64 = 5.0;

/// Waits (at most 60 s) until the node's `geostate_remote_silence_seconds` for its one
/// remote region satisfies `ok`.
async fn wait_silence(metrics: &str, ok: impl Fn(f64) -> bool, what: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let silence = common::metric(metrics, "geostate_remote_silence_seconds{")?;
        if silence.is_some_and(&ok) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("waited 60 s for {what}: geostate_remote_silence_seconds is {silence:?}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
