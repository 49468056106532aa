//! The nodes `make up` starts, reached with standard tools: `grpcurl` lists the services
//! through server reflection and writes and reads a key without any proto file, and the
//! metrics address serves Prometheus text.

mod common;

use std::process::Command;

use anyhow::{Context, bail};
use common::failover::replica;
use common::{cluster, http_get, unique};

fn grpcurl(tool: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(tool)
        .args(args)
        .output()
        .with_context(|| format!("running {tool}"))?;
    if !out.status.success() {
        bail!(
            "grpcurl {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8(out.stdout)?)
}

#[test]
fn grpcurl_lists_the_services_and_a_write_reads_back_in_every_region() -> anyhow::Result<()> {
    let cluster = cluster()?;
    for (region, node) in &cluster.regions {
        let grpc = node.grpc.as_deref().context("a node per region")?;
        let services = grpcurl(&cluster.tools.grpcurl, &["-plaintext", grpc, "list"])?;
        for service in [
            "geostate.v1.State",
            "geostate.v1.Admin",
            "grpc.health.v1.Health",
        ] {
            assert!(
                services.lines().any(|l| l == service),
                "{region}: {service} missing in {services}"
            );
        }
        let key = format!("trips/{}", unique("grpcurl"));
        let update = format!(r#"{{"key":"{key}","add":7}}"#);
        grpcurl(
            &cluster.tools.grpcurl,
            &[
                "-plaintext",
                "-d",
                &update,
                grpc,
                "geostate.v1.State/Update",
            ],
        )?;
        let get = format!(r#"{{"key":"{key}"}}"#);
        let value: serde_json::Value = serde_json::from_str(&grpcurl(
            &cluster.tools.grpcurl,
            &["-plaintext", "-d", &get, grpc, "geostate.v1.State/Get"],
        )?)?;
        assert_eq!(value["counter"], "7", "{region}: {value}");
        assert_eq!(value["kind"], "CRDT_KIND_G_COUNTER");

        let metrics_addr = node.metrics.as_deref().context("metrics")?;
        let metrics = http_get(metrics_addr, "/metrics")?;
        assert!(
            metrics.contains("geostate_events_applied_total"),
            "{region}: {metrics}"
        );
        assert!(
            metrics.contains("geostate_grpc_seconds"),
            "{region}: {metrics}"
        );
        assert!(http_get(metrics_addr, "/health")?.ends_with("ok\n"));
        let elsewhere = http_get(metrics_addr, "/metric")?;
        assert!(elsewhere.starts_with("HTTP/1.1 404"), "{elsewhere}");
    }
    Ok(())
}

/// The real path between the `make up` regions: node → `geostate.deltas` → MirrorMaker 2
/// → `<region>.geostate.deltas` → the other node. Writes in both regions on one key are
/// counted in both.
#[tokio::test]
async fn writes_in_both_regions_meet_through_mirrormaker2() -> anyhow::Result<()> {
    use geostate::pb;
    use geostate::pb::state_client::StateClient;

    let cluster = cluster()?;
    let key = format!("trips/{}", unique("mm2"));
    let mut clients = Vec::new();
    for (i, node) in cluster.regions.values().enumerate() {
        let grpc = node.grpc.as_deref().context("a node per region")?;
        let mut client = StateClient::connect(format!("http://{grpc}")).await?;
        client
            .update(pb::UpdateRequest {
                key: key.clone(),
                op: Some(pb::update_request::Op::Add(i as i64 + 3)),
                id: String::new(),
                event_time_ms: 0,
            })
            .await?;
        clients.push(client);
    }
    let expected: i64 = (0..clients.len() as i64).map(|i| i + 3).sum();
    let started = std::time::Instant::now();
    for client in &mut clients {
        loop {
            let v = client.get(replica(&key)).await?.into_inner();
            if v.value == Some(pb::value::Value::Counter(expected)) {
                break;
            }
            if started.elapsed() > std::time::Duration::from_secs(30) {
                bail!("{key} reads {:?}, not {expected}, after 30 s", v.value);
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }
    println!(
        "both regions read {expected} after {} ms",
        started.elapsed().as_millis()
    );
    Ok(())
}

/// Deltas are shipped in transactions, and MirrorMaker 2 reads `read_committed`: a delta
/// of an aborted transaction never reaches the other region, a committed one does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aborted_deltas_are_never_mirrored() -> anyhow::Result<()> {
    use geostate::crdt::{Actor, CrdtValue, Delta, GCounter, RegionId};
    use geostate::pb;
    use geostate::pb::state_client::StateClient;
    use rdkafka::Message;
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
    use std::time::Duration;

    let cluster = common::cluster()?;
    let (source, target) = ("us-east-1", "eu-west-1");
    let delta = |key: &str, n: u64| -> anyhow::Result<Vec<u8>> {
        let mut c = GCounter::new();
        c.increment(&Actor::new(RegionId::new(source)?, 1), n)?;
        Ok(Delta {
            key: key.into(),
            origin: RegionId::new(source)?,
            state: CrdtValue::GCounter(c),
            origin_time: geostate::clock::HlcTimestamp::new(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)?
                    .as_nanos() as u64,
                0,
            ),
            epoch: 0,
            recent_ids: Vec::new(),
        }
        .encode())
    };
    let (aborted, committed) = (
        format!("trips/{}", unique("aborted")),
        format!("trips/{}", unique("committed")),
    );
    let producer: FutureProducer = common::kafka_config(&cluster.regions[source].kafka)
        .set("transactional.id", unique("abort-test"))
        .create()?;
    let p = producer.clone();
    let (aborted_delta, committed_delta) = (delta(&aborted, 1)?, delta(&committed, 2)?);
    let (a, c) = (aborted.clone(), committed.clone());
    tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        p.init_transactions(Duration::from_secs(30))?;
        p.begin_transaction()?;
        p.send_result(
            FutureRecord::to("geostate.deltas")
                .key(&a)
                .payload(&aborted_delta),
        )
        .map_err(|(e, _)| e)?;
        p.flush(Duration::from_secs(30))?;
        p.abort_transaction(Duration::from_secs(30))?;
        p.begin_transaction()?;
        p.send_result(
            FutureRecord::to("geostate.deltas")
                .key(&c)
                .payload(&committed_delta),
        )
        .map_err(|(e, _)| e)?;
        p.commit_transaction(Duration::from_secs(30))?;
        Ok(())
    })
    .await??;

    // the committed delta arrives in the other region through the mirror
    let grpc = cluster.regions[target].grpc.clone().context("no node")?;
    let mut client = StateClient::connect(format!("http://{grpc}")).await?;
    let started = std::time::Instant::now();
    loop {
        let v = client.get(replica(&committed)).await?.into_inner();
        if v.value == Some(pb::value::Value::Counter(2)) {
            break;
        }
        if started.elapsed() > Duration::from_secs(60) {
            bail!("the committed delta did not arrive within 60 s: {v:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // the mirrored topic holds it, and not the aborted one — even read uncommitted
    let mirrored = format!("{source}.geostate.deltas");
    let consumer: BaseConsumer = common::kafka_config(&cluster.regions[target].kafka)
        .set("group.id", unique("mirror-reader"))
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_uncommitted")
        .set("enable.partition.eof", "true")
        .create()?;
    consumer.subscribe(&[&mirrored])?;
    let partitions = consumer
        .fetch_metadata(Some(&mirrored), Duration::from_secs(10))?
        .topics()[0]
        .partitions()
        .len();
    let (mut at_end, mut keys) = (std::collections::BTreeSet::new(), Vec::new());
    let reading = std::time::Instant::now();
    while at_end.len() < partitions {
        if reading.elapsed() > Duration::from_secs(30) {
            bail!("reading {mirrored} timed out");
        }
        // `None`: a timeout or an event that is not a message (a rebalance)
        match consumer.poll(Duration::from_secs(1)) {
            Some(Ok(m)) => keys.push(m.key().unwrap_or_default().to_vec()),
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(p))) => {
                at_end.insert(p);
            }
            Some(Err(e)) => return Err(e.into()),
            None => {}
        }
    }
    assert!(keys.contains(&committed.clone().into_bytes()));
    assert!(
        !keys.contains(&aborted.clone().into_bytes()),
        "an aborted delta was mirrored"
    );
    let v = client.get(replica(&aborted)).await?.into_inner();
    assert_eq!(v.value, Some(pb::value::Value::Counter(0)));
    Ok(())
}
