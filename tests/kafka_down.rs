//! The region's Kafka broker frozen (SIGSTOP) under a node: an `Update` that cannot be
//! appended is answered `UNAVAILABLE` with the reason, never hangs past the producer's
//! delivery timeout, and once the broker resumes (SIGCONT) the node serves writes again;
//! the write that timed out is indeterminate (it may still be appended from the broker's
//! socket buffer), so the counter ends at either total. The region's cluster node counts
//! its Kafka unreachable during the freeze (and lets its leases go), answers reads from its
//! copies once its group session ended (the certificate says so), and counts its Kafka
//! reachable again after. The cluster's own node of that
//! region went through the same freeze: it ingests and merges again afterwards (its
//! broker, fenced by its controller during the freeze, first answers Metadata listing no
//! brokers, which can leave a librdkafka client unable to reconnect for good: the node's
//! consumers are replaced by new clients after an error). Its own test binary: it freezes
//! a broker the other tests use (test binaries run one at a time).

mod common;

use std::time::{Duration, Instant};

use common::failover::{Frozen, replica};
use common::{Node, Topics, add, cluster, counter, unique};
use geostate::pb;
use geostate::pb::admin_client::AdminClient;
use geostate::pb::state_client::StateClient;
use tonic::transport::Channel;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_broker_gives_unavailable_and_the_node_recovers() -> anyhow::Result<()> {
    let cluster = cluster()?;
    let region = &cluster.regions["us-east-1"];
    let topics = Topics::create(&region.kafka, "kafka-down", 2).await?;
    let dir = tempfile::tempdir()?;
    let mut node = Node::configure(dir.path(), &region.kafka, &topics)?;
    node.set("checkpoint.interval", "\"0s\"");
    node.start().await?;
    let mut state = node.state().await?;
    state.update(add("trips/frozen", 1)).await?;
    let grpc = region
        .grpc
        .clone()
        .expect("make test starts a node per region");
    let mut cluster_node = AdminClient::connect(format!("http://{grpc}")).await?;
    let owned_before = owned(&mut cluster_node).await?;
    let mut cluster_state = StateClient::connect(format!("http://{grpc}")).await?;
    let copied = format!("trips/{}", unique("copied"));
    cluster_state.update(add(&copied, 1)).await?;

    // resumed however the test ends
    let frozen = Frozen::new(region.kafka_pid)?;
    let asked = Instant::now();
    let answer = tokio::time::timeout(
        Duration::from_secs(40),
        state.update(add("trips/frozen", 10)),
    )
    .await?;
    let waited = asked.elapsed();
    let status = answer.expect_err("a write with the broker frozen must fail");
    // a write acknowledged by a frozen broker cannot be: say what the broker was doing
    let broker = std::fs::read_to_string(format!("/proc/{}/stat", region.kafka_pid))
        .ok()
        .and_then(|stat| Some(stat.rsplit_once(')')?.1.trim().chars().next()?.to_string()))
        .unwrap_or_else(|| "gone".into());
    println!(
        "answered after {:.1} s (broker pid {} in state {broker}): {status}",
        waited.as_secs_f64(),
        region.kafka_pid
    );
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status}");
    assert!(status.message().contains("kafka"), "{status}");
    assert!(waited < Duration::from_secs(30), "took {waited:?}");
    // the region's cluster node no longer counts its Kafka reachable (`lease.kafka-down-after`
    // is 3 s; the write waited longer): it has let its leases go
    let metrics = region.metrics.as_deref().expect("a node per region");
    let reachable = || common::metric(metrics, "geostate_kafka_reachable ");
    assert_eq!(reachable()?, Some(0.0), "after {waited:?} frozen");
    // and once its group session ends (10 s) it answers reads from its copies, saying so
    let until = Instant::now() + Duration::from_secs(20);
    let copy = loop {
        let value = cluster_state.get(replica(&copied)).await?.into_inner();
        assert_eq!(counter(&value), 1, "{value:?}");
        if let Some(copy) = value.freshness.as_ref().and_then(|f| f.copy) {
            break copy;
        }
        assert!(
            Instant::now() < until,
            "no read answered from a copy: {value:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    println!("answered from a copy: {copy:?}");
    assert!(copy.applied_offset >= 0 && copy.age_ms < 20_000, "{copy:?}");
    drop(frozen);

    // the node serves writes again once the broker is back
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        match state.update(add("trips/frozen", 100)).await {
            Ok(_) => break,
            Err(e) if Instant::now() < until => {
                println!("not yet: {e}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
    node.caught_up(Duration::from_secs(60)).await?;
    let until = Instant::now() + Duration::from_secs(30);
    while reachable()? != Some(1.0) {
        assert!(
            Instant::now() < until,
            "the cluster node counts its Kafka unreachable still"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let total = counter(&state.get(replica("trips/frozen")).await?.into_inner());
    assert!(
        total == 101 || total == 111,
        "the acknowledged writes add to 101 (111 if the timed-out one was appended after all); got {total}"
    );

    // every cluster node takes a write (applied before it is acknowledged) and merges the
    // others' writes
    let key = format!("trips/{}", unique("after-freeze"));
    let mut nodes = Vec::new();
    for r in cluster.regions.values() {
        let grpc = r.grpc.clone().expect("make test starts a node per region");
        nodes.push(StateClient::connect(format!("http://{grpc}")).await?);
    }
    let regions = nodes.len() as i64;
    let until = Instant::now() + Duration::from_secs(60);
    for (i, node) in nodes.iter_mut().enumerate() {
        while let Err(e) = node.update(add(&key, 1)).await {
            anyhow::ensure!(
                Instant::now() < until,
                "cluster node {i} takes no writes: {e}"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    for (i, node) in nodes.iter_mut().enumerate() {
        loop {
            let value = node.get(replica(&key)).await?.into_inner();
            if counter(&value) == regions {
                break;
            }
            anyhow::ensure!(
                Instant::now() < until,
                "cluster node {i} merged no other region's write after the freeze: {value:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    // and the frozen region's cluster node owns every partition it owned before, for a
    // whole group session: its session expired during the freeze, it rejoined, and its
    // broker's own recovery (its controller fenced it) may cost it the group once more
    let settle_by = Instant::now() + Duration::from_secs(90);
    let mut since = Instant::now();
    loop {
        let now = owned(&mut cluster_node).await.unwrap_or_default();
        if now != owned_before {
            since = Instant::now();
        } else if since.elapsed() > GROUP_SESSION {
            break;
        }
        anyhow::ensure!(
            Instant::now() < settle_by,
            "the cluster node owns {now:?} after the freeze, not {owned_before:?} as before"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

/// Longer than the nodes' Kafka group session (10 s).
const GROUP_SESSION: Duration = Duration::from_secs(12);

async fn owned(node: &mut AdminClient<Channel>) -> anyhow::Result<Vec<i32>> {
    let mut owned = node
        .status(pb::StatusRequest {})
        .await?
        .into_inner()
        .owned_partitions;
    owned.sort_unstable();
    Ok(owned)
}
