//! Every writer puts a key on the partition the Java producer would: the node's appender
//! (the gRPC `Update` path and dead letters) and its transactional shipper both use
//! librdkafka's `murmur2_random`, which `geostate::log::partition_of` computes, and which
//! the Java client's `Utils.murmur2` gives for the keys below (computed with kafka-clients
//! 4.1.1). A key's records therefore stay on one partition whoever produced them. And a
//! node refuses topics whose partition counts differ: its updates and deltas topics, and
//! every remote deltas topic it merges, have one count, so a key's partition is one number
//! everywhere.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use common::{Node, Topics, cluster, create_topic, repo_file, unique};
use geostate::config::{Config, Setting};
use geostate::log::{Made, RenewingProducer, TransactionalSpec, TxRecord, partition_of};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Message, Offset, TopicPartitionList};

const PARTITIONS: i32 = 12;

/// (key, its partition of 12 as the Java producer computes it).
const JAVA: [(&str, i32); 6] = [
    ("foobar", 6),
    ("a-little-bit-longer-string", 11),
    ("requests/9q8yy", 1),
    ("surge/9q8yy", 5),
    ("drivers/u4pruyd", 4),
    ("zones/é", 9),
];

fn kafka(bootstrap: &str) -> anyhow::Result<geostate::config::KafkaConfig> {
    let set = [format!("kafka.bootstrap={bootstrap:?}")]
        .into_iter()
        .chain(common::kafka_client_setting(bootstrap));
    let set: Vec<Setting> = set
        .map(|s| s.parse().map_err(anyhow::Error::msg))
        .collect::<anyhow::Result<_>>()?;
    Ok(Config::load_with(&repo_file("regions/us-east-1.toml"), &set)?.kafka)
}

/// Every record of `topic` (committed ones): key → the partitions it was found on.
fn partitions_of_keys(
    bootstrap: &str,
    topic: &str,
    expected: usize,
) -> anyhow::Result<BTreeMap<String, Vec<i32>>> {
    let consumer: BaseConsumer = common::kafka_config(bootstrap)
        .set("group.id", unique("partitioner"))
        .set("isolation.level", "read_committed")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition_offset(topic, p, Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;
    let (mut found, mut seen) = (BTreeMap::<String, Vec<i32>>::new(), 0);
    let deadline = Instant::now() + Duration::from_secs(30);
    while seen < expected {
        if Instant::now() > deadline {
            // where the client stood and what the broker holds, per partition
            let positions = consumer.position()?;
            let mut at = Vec::new();
            for p in 0..PARTITIONS {
                let position = positions.find_partition(topic, p).map(|e| e.offset());
                let marks = consumer.fetch_watermarks(topic, p, Duration::from_secs(5));
                at.push(format!("{p}: position {position:?}, watermarks {marks:?}"));
            }
            bail!(
                "read {seen} of {expected} records of {topic} within 30 s; {}",
                at.join("; ")
            );
        }
        if let Some(m) = consumer.poll(Duration::from_millis(200)) {
            let m = m?;
            let key = String::from_utf8(m.key().context("a key")?.to_vec())?;
            found.entry(key).or_default().push(m.partition());
            seen += 1;
        }
    }
    Ok(found)
}

fn check(found: &BTreeMap<String, Vec<i32>>, keys: &[String]) -> anyhow::Result<()> {
    for key in keys {
        let expected = partition_of(key.as_bytes(), PARTITIONS);
        let on = found.get(key).context("a key never arrived")?;
        assert!(
            on.iter().all(|&p| p == expected),
            "{key:?} landed on {on:?}, the Java producer's partition is {expected}"
        );
    }
    for (key, java) in JAVA {
        assert_eq!(partition_of(key.as_bytes(), PARTITIONS), java, "{key:?}");
        assert_eq!(found[key], vec![java, java], "{key:?}");
    }
    Ok(())
}

#[tokio::test]
async fn the_appender_and_the_shipper_partition_keys_as_the_java_producer() -> anyhow::Result<()> {
    let cluster = cluster()?;
    let bootstrap = cluster.regions["us-east-1"].kafka.clone();
    let kafka = kafka(&bootstrap)?;
    let keys: Vec<String> = JAVA
        .iter()
        .map(|(k, _)| k.to_string())
        .chain((0..200).map(|i| format!("requests/cell-{i}")))
        .collect();

    // the appender (the gRPC Update path): each key twice
    let appended = unique("partitioner-appended");
    create_topic(&bootstrap, &appended, PARTITIONS).await?;
    let producer = RenewingProducer::new(&kafka, Duration::from_secs(10))?;
    for key in keys.iter().chain(&keys) {
        let queued = producer.queue_made(&appended, || Made {
            key: key.clone(),
            payload: b"{}".to_vec(),
            timestamp_ms: 1_700_000_000_000,
        })?;
        let delivery = queued.await?;
        assert_eq!(
            delivery.partition,
            partition_of(key.as_bytes(), PARTITIONS),
            "{key:?}"
        );
    }
    check(
        &partitions_of_keys(&bootstrap, &appended, 2 * keys.len())?,
        &keys,
    )?;

    // the shipper's transactions: each key twice, in one transaction
    let shipped = unique("partitioner-shipped");
    create_topic(&bootstrap, &shipped, PARTITIONS).await?;
    let transactional = TransactionalSpec {
        kafka,
        transactional_id: unique("partitioner"),
        transaction_timeout: Duration::from_secs(30),
        compression: "none",
    }
    .start()
    .await?;
    let records = keys
        .iter()
        .chain(&keys)
        .map(|k| TxRecord::by_key(k.as_bytes(), b"{}"));
    transactional.commit_all(&shipped, records).await?;
    check(
        &partitions_of_keys(&bootstrap, &shipped, 2 * keys.len())?,
        &keys,
    )
}

/// Starts `node`, which must fail, and answers what it said.
async fn refused(node: &mut Node) -> anyhow::Result<String> {
    match node.start().await {
        Ok(pid) => bail!("the node started (pid {pid})"),
        Err(e) => Ok(e.to_string()),
    }
}

#[tokio::test]
async fn a_node_refuses_topics_with_different_partition_counts() -> anyhow::Result<()> {
    let cluster = cluster()?;
    let kafka = cluster.regions["us-east-1"].kafka.clone();
    let topics = Topics::create(&kafka, "counts", 4).await?;
    let odd = unique("counts-odd");
    create_topic(&kafka, &odd, 2).await?;

    // its own deltas topic
    let dir = tempfile::tempdir()?;
    let mut node = Node::configure(dir.path(), &kafka, &topics)?;
    node.set("kafka.deltas-topic", &format!("{odd:?}"));
    let said = refused(&mut node).await?;
    let expected = format!("{odd} has 2 partitions, the updates topic 4");
    assert!(said.contains(&expected), "{said}");

    // a remote region's deltas topic
    let dir = tempfile::tempdir()?;
    let mut node = Node::configure_region(
        dir.path(),
        "us-east-1",
        &kafka,
        &topics,
        &[("eu-west-1", &odd)],
    )?;
    let said = refused(&mut node).await?;
    let expected = format!("{odd} has 2 partitions, this region's topics 4");
    assert!(said.contains(&expected), "{said}");
    Ok(())
}
