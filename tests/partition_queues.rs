//! One Kafka client, a queue per partition (`geostate::log::Split`, what ingest reads
//! with), against the local cluster's broker: each partition's records come on its own
//! queue only, from its position, and a partition that cannot be read fails on its own
//! queue while the others read on; the client's own queue stays quiet.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, ensure};
use common::*;
use geostate::log::{Batching, ConsumerSpec, PartitionReader, Split};
use rdkafka::producer::FutureRecord;
use tokio::sync::watch;

/// Records per partition.
const RECORDS: i64 = 5;

/// Reads `reader` until it holds the offsets from `from` to the last record, or a read
/// fails (its error is the `Err`).
async fn read_from(reader: &mut PartitionReader, from: i64) -> anyhow::Result<Vec<i64>> {
    let (_stop, mut stop) = watch::channel(false);
    let batching = Batching {
        max: 2,
        linger: Duration::from_millis(5),
        idle: None,
    };
    let mut offsets = Vec::new();
    while offsets.len() < (RECORDS - from) as usize {
        let Some(batch) = reader.next_batch(batching, &mut stop).await else {
            bail!("stopped");
        };
        for record in &batch.records {
            ensure!(
                record.partition == reader.partition(),
                "partition {} delivered a record of partition {}",
                reader.partition(),
                record.partition
            );
            offsets.push(record.offset);
        }
        if let Some(e) = batch.failed {
            return Err(e.into());
        }
    }
    Ok(offsets)
}

#[tokio::test]
async fn each_partition_reads_on_its_own_queue_and_fails_alone() -> anyhow::Result<()> {
    let cluster = cluster()?;
    let region = &cluster.regions["us-east-1"];
    let topic = unique("partition-queues");
    create_topic(&region.kafka, &topic, 3).await?;
    let producer = producer(&region.kafka)?;
    for partition in 0..3 {
        for i in 0..RECORDS {
            let payload = format!("{partition}-{i}");
            let record = FutureRecord::to(&topic)
                .partition(partition)
                .key("k")
                .payload(&payload);
            producer
                .send(record, Duration::from_secs(10))
                .await
                .map_err(|(e, _)| e)?;
        }
    }
    let spec = ConsumerSpec {
        kafka: node_config(region)?.kafka,
        group: unique("partition-queues"),
        report_end: false,
        topic,
        partitions: vec![0, 1, 2],
        role: "test",
    };
    // 0 from its start, 1 after offset 1, 2 after an offset beyond its end
    let applied = BTreeMap::from([(1, 1), (2, 100)]);
    let (split, mut readers) = Split::start(&spec, &applied).await?;
    let mut take = |p| readers.remove(&p).expect("a reader per partition");
    let (mut zero, mut one, mut two) = (take(0), take(1), take(2));

    let read = async {
        let from_zero = read_from(&mut zero, 0).await?;
        let from_one = read_from(&mut one, 2).await?;
        let from_two = read_from(&mut two, 0).await;
        anyhow::Ok((from_zero, from_one, from_two))
    };
    let (from_zero, from_one, from_two) = tokio::select! {
        read = tokio::time::timeout(Duration::from_secs(30), read) => read??,
        error = split.failed() => bail!("the client's own queue delivered {error}"),
    };
    assert_eq!(from_zero, (0..RECORDS).collect::<Vec<_>>());
    assert_eq!(from_one, (2..RECORDS).collect::<Vec<_>>());
    let Err(failed) = from_two else {
        bail!("a partition positioned beyond its end was read: {from_two:?}");
    };
    assert!(
        failed.to_string().to_lowercase().contains("offset"),
        "its own queue says why: {failed}"
    );
    assert_eq!(
        (zero.position(), one.position()),
        (Some(RECORDS), Some(RECORDS))
    );
    Ok(())
}
