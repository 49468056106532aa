//! Concurrent writes of one owned register enter the updates topic in the order of their
//! stamps. The log's order decides a compare-and-set, the stamp decides the register: if
//! a write stamped earlier reached the log after one stamped later, the earlier one would
//! be acknowledged and yet lose to the later one (a Jepsen run found such a write: no
//! linearization of the key).

mod common;

use std::time::Duration;

use anyhow::{Context, ensure};
use common::failover::{key_homed_at, regions, set, wait_held};
use common::{cluster, unique};
use geostate::ingest::event::Update;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Message, Offset, TopicPartitionList};

/// Writes in flight at once.
const WRITERS: usize = 16;
/// Writes per writer.
const EACH: usize = 40;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_writes_of_a_key_enter_the_log_in_stamp_order() -> anyhow::Result<()> {
    let cluster = cluster()?;
    let (regions, lease) = regions(&cluster).await?;
    let mut home = regions.into_iter().next().context("a region")?;
    let (key, shard) = key_homed_at(&lease, &home.name, &unique("order"));
    wait_held(&mut home, shard, Duration::from_secs(30)).await?;

    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let mut state = home.state.clone();
        let key = key.clone();
        writers.push(tokio::spawn(async move {
            let mut partition_offsets = Vec::new();
            for i in 0..EACH {
                let r = state
                    .update(set(&key, &format!("{w}-{i}")))
                    .await?
                    .into_inner();
                let at = r.position.context("an applied write has a position")?;
                partition_offsets.push((at.partition, at.offset));
            }
            anyhow::Ok(partition_offsets)
        }));
    }
    let mut written = Vec::new();
    for w in writers {
        written.extend(w.await??);
    }
    let partition = written[0].0;
    ensure!(
        written.iter().all(|(p, _)| *p == partition),
        "one key, one partition"
    );
    let last = written.iter().map(|(_, o)| *o).max().context("writes")?;

    // the key's records, in log order, with their stamps
    let node = &cluster.regions[&home.name];
    let config = common::node_config(node)?;
    let consumer: BaseConsumer = common::kafka_config(&node.kafka)
        .set("group.id", unique("order-reader"))
        .set("enable.auto.commit", "false")
        .create()?;
    let first = written.iter().map(|(_, o)| *o).min().context("writes")?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(
        &config.kafka.updates_topic,
        partition,
        Offset::Offset(first),
    )?;
    consumer.assign(&tpl)?;
    let mut stamps = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        ensure!(std::time::Instant::now() < deadline, "reading the log back");
        let Some(message) = consumer.poll(Duration::from_millis(500)) else {
            continue;
        };
        let message = message?;
        let update = Update::decode(config.kafka.format, message.payload().unwrap_or_default())
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        if update.key == key {
            let hlc = update.hlc.context("a register write carries its stamp")?;
            stamps.push((message.offset(), hlc));
        }
        if message.offset() >= last {
            break;
        }
    }
    ensure!(stamps.len() == WRITERS * EACH, "{} records", stamps.len());
    let behind: Vec<_> = stamps
        .windows(2)
        .filter(|w| w[1].1 <= w[0].1)
        .map(|w| (w[0], w[1]))
        .collect();
    ensure!(
        behind.is_empty(),
        "{} of {} records stamped no later than the record before them in the log, e.g. {:?}",
        behind.len(),
        stamps.len(),
        behind.first()
    );
    Ok(())
}
