//! The local multi-region infrastructure works end to end, on the real parts: MirrorMaker 2
//! mirrors every region's `geostate.deltas` into every other region's Kafka cluster as
//! `<region>.geostate.deltas`, and the S3-compatible server stores and returns objects
//! through `aws-sdk-s3`.
//!
//! Needs a running cluster: `make test` starts one and points `GEOSTATE_CLUSTER` at its
//! `cluster.json`; without the variable, the one from `make up` is used.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use aws_sdk_s3::primitives::ByteStream;
use geostate::clock::HlcTimestamp;
use geostate::crdt::{Actor, CrdtValue, Delta, GCounter, RegionId};
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};

mod common;

use common::{Cluster, cluster};

const MIRROR_DEADLINE: Duration = Duration::from_secs(30);

fn unique(label: &str) -> String {
    common::unique(&format!("infra-test/{label}"))
}

/// Produces one real delta to `from`'s `geostate.deltas` and waits for it to appear in
/// `to`'s `<from>.geostate.deltas`. Returns the end-to-end lag.
async fn mirror_one(cluster: &Cluster, from: &str, to: &str) -> anyhow::Result<Duration> {
    let origin = RegionId::new(from)?;
    let mut counter = GCounter::new();
    counter.increment(&Actor::new(origin.clone(), 1), 1)?;
    let delta = Delta {
        key: unique(from),
        origin,
        state: CrdtValue::GCounter(counter),
        origin_time: HlcTimestamp::new(1, 0),
        epoch: 0,
        recent_ids: Vec::new(),
    };
    let payload = delta.encode();

    let mirrored_topic = format!("{from}.geostate.deltas");
    let consumer: StreamConsumer = common::kafka_config(&cluster.regions[to].kafka)
        .set("group.id", unique("group").replace('/', "-"))
        .set("enable.auto.commit", "false")
        .set("fetch.wait.max.ms", "20")
        .create()?;
    let metadata = consumer.fetch_metadata(Some(&mirrored_topic), Duration::from_secs(10))?;
    let partitions = metadata
        .topics()
        .first()
        .map(|t| t.partitions().len())
        .unwrap_or(0);
    if partitions == 0 {
        bail!("{mirrored_topic} has no partitions in {to}: is MirrorMaker 2 running?");
    }
    let mut assignment = TopicPartitionList::new();
    for p in 0..partitions as i32 {
        assignment.add_partition_offset(&mirrored_topic, p, Offset::Beginning)?;
    }
    consumer.assign(&assignment)?;

    let producer: FutureProducer = common::kafka_config(&cluster.regions[from].kafka)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "0")
        .create()?;
    producer
        .send(
            FutureRecord::to("geostate.deltas")
                .key(&delta.key)
                .payload(&payload),
            Duration::from_secs(10),
        )
        .await
        .map_err(|(e, _)| e)
        .context("producing the delta")?;
    let sent = Instant::now();

    let deadline = sent + MIRROR_DEADLINE;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            bail!(
                "delta produced to {from} not seen in {to} as {mirrored_topic} within {MIRROR_DEADLINE:?}"
            );
        }
        let Ok(message) = tokio::time::timeout(left, consumer.recv()).await else {
            continue;
        };
        let message = message?;
        if message.key() == Some(delta.key.as_bytes()) {
            let lag = sent.elapsed();
            let mirrored = Delta::decode(message.payload().unwrap_or_default())?;
            assert_eq!(
                mirrored, delta,
                "the mirrored record must be byte-identical"
            );
            return Ok(lag);
        }
    }
}

#[tokio::test]
async fn every_region_deltas_reach_every_other_region_through_mirrormaker2() -> anyhow::Result<()> {
    let cluster = cluster()?;
    let regions: Vec<&String> = cluster.regions.keys().collect();
    assert!(
        regions.len() >= 2,
        "the local cluster has at least two regions"
    );
    for from in &regions {
        for to in regions.iter().filter(|to| *to != from) {
            let lag = mirror_one(&cluster, from, to).await?;
            println!("mirrormaker2 lag {from} -> {to}: {} ms", lag.as_millis());
        }
    }
    Ok(())
}

#[tokio::test]
async fn an_object_put_to_the_s3_server_reads_back() -> anyhow::Result<()> {
    let cluster = cluster()?;
    let s3 = &cluster.s3;
    let client = common::s3_client(s3, &s3.endpoint);
    let key = unique("s3");
    let body: Vec<u8> = (0..=255u8).cycle().take(100_000).collect();

    client
        .put_object()
        .bucket(&s3.bucket)
        .key(&key)
        .body(ByteStream::from(body.clone()))
        .send()
        .await
        .context("put_object")?;
    let got = client
        .get_object()
        .bucket(&s3.bucket)
        .key(&key)
        .send()
        .await
        .context("get_object")?
        .body
        .collect()
        .await?
        .into_bytes();
    assert_eq!(got.as_ref(), body.as_slice());

    let listed = client
        .list_objects_v2()
        .bucket(&s3.bucket)
        .prefix("infra-test/s3-")
        .send()
        .await
        .context("list_objects_v2")?;
    assert!(listed.contents().iter().any(|o| o.key() == Some(&key)));

    client
        .delete_object()
        .bucket(&s3.bucket)
        .key(&key)
        .send()
        .await
        .context("delete_object")?;
    let gone = client
        .get_object()
        .bucket(&s3.bucket)
        .key(&key)
        .send()
        .await;
    assert!(gone.is_err(), "a deleted object must not read back");
    Ok(())
}
