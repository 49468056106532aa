//! One region node, end to end, on real Kafka and RocksDB: exactly-once ingest across
//! `kill -9`, dead-lettering of bad records without stalling, and the gRPC write/read/watch
//! path. Each test runs its own node process on its own topics of the local cluster.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use common::failover::replica;
use common::{Node, Topics, cluster, counter, producer};
use geostate::pb;
use geostate::workload::Rng;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::Message;
use rdkafka::producer::FutureProducer;
use rdkafka::producer::FutureRecord;
use tokio_stream::StreamExt;

const EVENTS: usize = 200_000;
const KEYS: usize = 500;

/// 200,000 increments over 1,000 counters, with the node killed by SIGKILL at random
/// moments at least three times while it ingests: afterwards every counter equals what
/// was produced — nothing lost, nothing applied twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_during_ingest_loses_nothing_and_applies_nothing_twice() -> anyhow::Result<()> {
    let cluster = cluster()?;
    let kafka = cluster.regions["us-east-1"].kafka.clone();
    let topics = Topics::create(&kafka, "kill9", 4).await?;
    let dir = tempfile::tempdir()?;
    let mut node = Node::configure(dir.path(), &kafka, &topics)?;
    let seed = SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos() as u64 | 1;
    println!("seed {seed}");
    let mut rng = Rng(seed);

    // what will be produced, and the totals it must add up to
    let mut records = Vec::with_capacity(EVENTS);
    let mut expected: BTreeMap<String, i64> = BTreeMap::new();
    for _ in 0..EVENTS {
        let k = rng.below(KEYS as u64);
        let (key, n) = if rng.below(2) == 0 {
            (format!("trips/k{k}"), 1 + rng.below(3) as i64)
        } else {
            (format!("drivers/k{k}"), rng.below(7) as i64 - 3)
        };
        *expected.entry(key.clone()).or_default() += n;
        let payload = format!(r#"{{"key":"{key}","add":{n}}}"#);
        records.push((key, payload));
    }

    node.start().await?;
    let producer = producer(&kafka)?;
    let updates = topics.updates.clone();
    let produce = tokio::spawn(async move {
        let mut pending = Vec::with_capacity(records.len());
        for (key, payload) in &records {
            let record = FutureRecord::to(&updates).key(key).payload(payload);
            pending.push(producer.send_result(record).map_err(|(e, _)| e)?);
        }
        for delivery in pending {
            delivery.await?.map_err(|(e, _)| e)?;
        }
        anyhow::Ok(())
    });

    let mut kills = 0;
    let deadline = Instant::now() + Duration::from_secs(240);
    while kills < 3 || !produce.is_finished() {
        tokio::time::sleep(Duration::from_millis(200 + rng.below(1200))).await;
        let applied = node.status().await?.events_applied;
        if kills >= 3 && applied == 0 {
            continue;
        }
        node.kill9();
        kills += 1;
        println!("kill -9 #{kills} after {applied} events applied by that incarnation");
        node.start().await?;
        if Instant::now() > deadline {
            bail!("the producer did not finish within 240 s");
        }
    }
    produce.await??;
    node.caught_up(Duration::from_secs(120)).await?;

    let mut state = node.state().await?;
    let keys: Vec<String> = expected.keys().cloned().collect();
    let mut got = BTreeMap::new();
    for chunk in keys.chunks(200) {
        let reply = state
            .batch_get(pb::BatchGetRequest {
                keys: chunk.to_vec(),
                window: None,
            })
            .await?
            .into_inner();
        for v in reply.values {
            got.insert(v.key.clone(), counter(&v));
        }
    }
    let wrong: Vec<_> = expected
        .iter()
        .filter(|(k, v)| got.get(*k) != Some(v))
        .take(5)
        .collect();
    assert!(
        wrong.is_empty(),
        "after {kills} kills, counters differ from what was produced, e.g. {wrong:?} (got {:?})",
        wrong.iter().map(|(k, _)| got.get(*k)).collect::<Vec<_>>()
    );
    assert!(kills >= 3);
    Ok(())
}

/// Bad records go to the dead-letter topic with their reason; records after them apply.
/// One is as large as the broker takes (1 MB, more than the node's producer sends): its
/// dead letter carries the first 512 KiB and the original length, and does not wedge the
/// partition.
#[tokio::test]
async fn bad_records_are_dead_lettered_and_the_partition_keeps_flowing() -> anyhow::Result<()> {
    let cluster = cluster()?;
    let kafka = cluster.regions["us-east-1"].kafka.clone();
    let topics = Topics::create(&kafka, "dlq", 1).await?;
    let dir = tempfile::tempdir()?;
    let mut node = Node::configure(dir.path(), &kafka, &topics)?;
    node.start().await?;

    let oversize = format!(r#"{{"key":"zones/big","set":"{}"}}"#, "x".repeat(70_000));
    let long_id = format!(
        r#"{{"key":"trips/after","add":1,"id":"{}"}}"#,
        "i".repeat(70_000)
    );
    let huge = format!(
        r#"{{"key":"zones/huge","set":"{}"}}"#,
        "x".repeat(1_040_000)
    );
    let bad = [
        ("{not json", "malformed"),
        (r#"{"key":"nowhere/x","add":1}"#, "no_namespace"),
        (r#"{"key":"trips/x","set":"1"}"#, "wrong_op"),
        (oversize.as_str(), "value_too_large"),
        (long_id.as_str(), "id_too_long"),
        (huge.as_str(), "value_too_large"),
    ];
    let producer: FutureProducer = common::kafka_config(&kafka)
        .set("message.max.bytes", "1048000")
        .create()?;
    for (payload, _) in &bad {
        producer
            .send(
                FutureRecord::<(), _>::to(&topics.updates).payload(*payload),
                Duration::from_secs(10),
            )
            .await
            .map_err(|(e, _)| e)?;
    }
    producer
        .send(
            FutureRecord::<(), _>::to(&topics.updates).payload(r#"{"key":"trips/after","add":5}"#),
            Duration::from_secs(10),
        )
        .await
        .map_err(|(e, _)| e)?;
    node.caught_up(Duration::from_secs(30)).await?;

    let value = node
        .state()
        .await?
        .get(replica("trips/after"))
        .await?
        .into_inner();
    assert_eq!(
        counter(&value),
        5,
        "the record after the bad ones is applied"
    );

    let letters = common::dead_letters(
        &kafka,
        &topics.dlq,
        bad.len(),
        Duration::from_secs(30),
        |_| true,
    )
    .await?;
    let mut codes = Vec::new();
    for letter in &letters {
        assert!(
            letter
                .header("geostate.error")
                .is_some_and(|r| !r.is_empty())
        );
        assert!(
            letter
                .header("geostate.source")
                .is_some_and(|s| s.starts_with(&topics.updates))
        );
        if letter.len == 512 * 1024 {
            let truncated = format!("key=0,value={}", huge.len());
            assert_eq!(
                letter.header("geostate.truncated"),
                Some(truncated.as_str())
            );
        } else {
            assert_eq!(
                letter.header("geostate.truncated"),
                None,
                "{} bytes",
                letter.len
            );
        }
        codes.push(letter.header("geostate.error.code").unwrap_or_default());
    }
    let expected: Vec<&str> = bad.iter().map(|(_, code)| *code).collect();
    assert_eq!(codes, expected);
    assert_eq!(node.status().await?.events_dead_lettered, bad.len() as u64);
    Ok(())
}

/// A record produced to another partition than its key's (a producer that does not
/// partition like the Java client) is dead-lettered, counted and named, never applied:
/// the key's state is in its own partition's store, and the record's offset in another.
#[tokio::test]
async fn a_record_off_its_keys_partition_is_dead_lettered_and_counted() -> anyhow::Result<()> {
    const PARTITIONS: i32 = 4;
    let cluster = cluster()?;
    let kafka = cluster.regions["us-east-1"].kafka.clone();
    let topics = Topics::create(&kafka, "misrouted", PARTITIONS).await?;
    let dir = tempfile::tempdir()?;
    let mut node = Node::configure(dir.path(), &kafka, &topics)?;
    node.start().await?;
    let key = format!("trips/{}", common::unique("misrouted"));
    let home = geostate::log::partition_of(key.as_bytes(), PARTITIONS);
    let off = (home + 1) % PARTITIONS;
    for partition in [home, off] {
        producer(&kafka)?
            .send(
                FutureRecord::to(&topics.updates)
                    .key(&key)
                    .partition(partition)
                    .payload(&format!(r#"{{"key":"{key}","add":1}}"#)),
                Duration::from_secs(10),
            )
            .await
            .map_err(|(e, _)| e)?;
    }
    node.caught_up(Duration::from_secs(30)).await?;
    let value = node.state().await?.get(replica(&key)).await?.into_inner();
    assert_eq!(counter(&value), 1, "only the record on the key's partition");
    let letters =
        common::dead_letters(&kafka, &topics.dlq, 1, Duration::from_secs(30), |_| true).await?;
    assert_eq!(letters[0].header("geostate.error.code"), Some("misrouted"));
    let source = letters[0].header("geostate.source").unwrap_or_default();
    assert!(
        source.starts_with(&format!("{}/{off}/", topics.updates)),
        "{source}"
    );
    let metrics = common::http_get(&node.metrics, "/metrics")?;
    assert!(
        metrics
            .lines()
            .any(|l| l == "geostate_events_misrouted_total 1"),
        "{metrics}"
    );
    Ok(())
}

/// A node whose dead-letter, late or outputs topic is missing refuses to start and names
/// it: refused events would have nowhere to go, and a late event or a final window would
/// stop its partition's shipping rounds.
#[tokio::test]
async fn a_node_without_its_dead_letter_late_or_outputs_topic_refuses_to_start()
-> anyhow::Result<()> {
    let cluster = cluster()?;
    let kafka = cluster.regions["us-east-1"].kafka.clone();
    let topics = Topics::create(&kafka, "no-side-topic", 4).await?;
    for setting in ["kafka.dlq-topic", "kafka.late-topic", "kafka.outputs-topic"] {
        let missing = common::unique("missing");
        let dir = tempfile::tempdir()?;
        let mut node = Node::configure(dir.path(), &kafka, &topics)?;
        node.set(setting, &format!("{missing:?}"));
        let refused = node.start().await.expect_err("a node without its topic");
        assert!(
            refused
                .to_string()
                .contains(&format!("topic {missing} does not exist")),
            "{setting}: {refused:#}"
        );
    }
    Ok(())
}

/// `Admin/Route` answers a key's partition (the Java producer's murmur2, where geostate's
/// producers put it) and the node serving it: the listener's address, or `api.advertise`.
#[tokio::test]
async fn route_answers_the_keys_partition_and_the_node_serving_it() -> anyhow::Result<()> {
    const PARTITIONS: i32 = 4;
    let cluster = cluster()?;
    let kafka = cluster.regions["us-east-1"].kafka.clone();
    let topics = Topics::create(&kafka, "route", PARTITIONS).await?;
    for advertise in [None, Some("geostate-0.example:7000")] {
        let dir = tempfile::tempdir()?;
        let mut node = Node::configure(dir.path(), &kafka, &topics)?;
        if let Some(a) = advertise {
            node.set("api.advertise", &format!("{a:?}"));
        }
        node.start().await?;
        let mut admin = pb::admin_client::AdminClient::connect(node.grpc.clone()).await?;
        for key in ["trips/a", "surge/9q8yy", "zones/x"] {
            let r = admin
                .route(pb::RouteRequest { key: key.into() })
                .await?
                .into_inner();
            let bound = node.grpc.trim_start_matches("http://");
            assert_eq!(
                (r.key.as_str(), r.partition, r.partitions, r.region.as_str()),
                (
                    key,
                    geostate::log::partition_of(key.as_bytes(), PARTITIONS),
                    PARTITIONS,
                    "us-east-1"
                )
            );
            assert_eq!(r.node, advertise.unwrap_or(bound));
        }
        let empty = admin.route(pb::RouteRequest::default()).await.unwrap_err();
        assert_eq!(empty.code(), tonic::Code::InvalidArgument, "{empty}");
    }
    Ok(())
}

/// A partition that cannot be read (the records after its applied offset deleted before
/// the node read them, as retention would) fails alone: the node restarts its client,
/// counted, again and again, and meanwhile applies the other partition's records exactly
/// once across those restarts, never skipping the unreadable one's gap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_that_cannot_be_read_fails_alone() -> anyhow::Result<()> {
    use rdkafka::admin::{AdminClient as KafkaAdmin, AdminOptions};
    use rdkafka::client::DefaultClientContext;
    use rdkafka::{Offset, TopicPartitionList};
    let cluster = cluster()?;
    let kafka = cluster.regions["us-east-1"].kafka.clone();
    let topics = Topics::create(&kafka, "unreadable", 2).await?;
    let key_on = |p: i32| {
        (0..)
            .map(|i| format!("trips/unreadable-{i}"))
            .find(|k| geostate::log::partition_of(k.as_bytes(), 2) == p)
            .expect("a key on each partition")
    };
    let (readable, unreadable) = (key_on(0), key_on(1));
    let adds = |n: usize| {
        (0..n)
            .flat_map(|_| [&readable, &unreadable])
            .map(|k| {
                (
                    k.clone(),
                    format!(r#"{{"key":"{k}","add":1}}"#).into_bytes(),
                )
            })
            .collect::<Vec<_>>()
    };
    let producer = producer(&kafka)?;
    let dir = tempfile::tempdir()?;
    let mut node = Node::configure(dir.path(), &kafka, &topics)?;
    node.set("checkpoint.interval", "\"0s\"");
    node.start().await?;
    common::produce_all(&producer, &topics.updates, &adds(1)).await?;
    node.caught_up(Duration::from_secs(60)).await?;
    node.terminate(Duration::from_secs(30)).await?;

    // while the node is down: 5 more on each, and the unreadable partition's deleted
    common::produce_all(&producer, &topics.updates, &adds(5)).await?;
    let admin: KafkaAdmin<DefaultClientContext> = common::kafka_config(&kafka).create()?;
    let mut upto = TopicPartitionList::new();
    upto.add_partition_offset(&topics.updates, 1, Offset::End)?;
    admin.delete_records(&upto, &AdminOptions::new()).await?;

    node.start().await?;
    let mut state = node.state().await?;
    let restarts = || {
        common::metric(
            &node.metrics,
            "geostate_consumer_restarts_total{consumer=\"ingest\"}",
        )
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut sent = 6;
    // more of the readable partition while the other keeps failing: applied once each
    while sent < 16 {
        common::produce_all(&producer, &topics.updates, &adds(1)).await?;
        sent += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    loop {
        let got = state.get(replica(&readable)).await?.into_inner();
        let (applied, restarted) = (counter(&got), restarts()?.unwrap_or(0.0));
        if applied == sent && restarted >= 2.0 {
            break;
        }
        anyhow::ensure!(applied <= sent, "{applied} applied of {sent} sent");
        if Instant::now() > deadline {
            bail!("{applied} of {sent} applied, {restarted} restarts of ingest's client");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // never read past the gap: the unreadable partition stays where it was
    let stuck = state.get(replica(&unreadable)).await?.into_inner();
    assert_eq!(counter(&stuck), 1);
    node.terminate(Duration::from_secs(30)).await?;
    Ok(())
}

/// A node whose log cannot be written (a full disk) serves on and stops cleanly: a log
/// line it cannot write is lost, never a reason to abort.
#[tokio::test]
async fn a_node_whose_log_cannot_be_written_serves_on() -> anyhow::Result<()> {
    let cluster = cluster()?;
    let kafka = cluster.regions["us-east-1"].kafka.clone();
    let topics = Topics::create(&kafka, "full-log", 1).await?;
    let dir = tempfile::tempdir()?;
    let mut node = Node::configure(dir.path(), &kafka, &topics)?;
    // every write to it fails with "no space left on device"
    node.log = "/dev/full".into();
    node.start().await?;
    let mut state = node.state().await?;
    for _ in 0..3 {
        state.update(common::add("trips/full", 1)).await?;
    }
    let value = state.get(replica("trips/full")).await?.into_inner();
    assert_eq!(counter(&value), 3);
    node.terminate(Duration::from_secs(30)).await?;
    Ok(())
}

/// `Update` answers after the node applied the write; `Get` reads it; `Watch` sees it;
/// mistakes get clear statuses; SIGTERM stops the node cleanly with a stream open.
#[tokio::test]
async fn update_then_get_reads_the_write_and_watch_sees_it() -> anyhow::Result<()> {
    let cluster = cluster()?;
    let kafka = cluster.regions["us-east-1"].kafka.clone();
    let topics = Topics::create(&kafka, "api", 2).await?;
    let dir = tempfile::tempdir()?;
    let mut node = Node::configure(dir.path(), &kafka, &topics)?;
    node.start().await?;
    let mut state = node.state().await?;

    let mut watch = state
        .watch(pb::WatchRequest {
            prefix: "zones/".into(),
        })
        .await?
        .into_inner();

    let update = |key: &str, op| pb::UpdateRequest {
        key: key.into(),
        op: Some(op),
        id: String::new(),
        event_time_ms: 0,
    };
    let reply = state
        .update(update(
            "zones/9q8yy",
            pb::update_request::Op::Set(b"downtown".to_vec()),
        ))
        .await?
        .into_inner();
    let stamp = reply
        .stamp
        .context("a register write returns its order stamp")?;
    assert_eq!(stamp.origin, "us-east-1");
    assert_eq!(stamp.epoch, 0);

    let value = state.get(replica("zones/9q8yy")).await?.into_inner();
    assert_eq!(
        value.value,
        Some(pb::value::Value::Register(b"downtown".to_vec()))
    );
    assert_eq!(value.stamp, Some(stamp));

    for n in [3, -1] {
        state
            .update(update("drivers/9q8yy", pb::update_request::Op::Add(n)))
            .await?;
    }
    let value = state.get(replica("drivers/9q8yy")).await?.into_inner();
    assert_eq!(counter(&value), 2);

    // a retried write with the same idempotency id counts once
    for _ in 0..2 {
        let mut retried = update("trips/idem", pb::update_request::Op::Add(2));
        retried.id = "order-17".into();
        state.update(retried).await?;
    }
    // a counter's value stays in int64: the add that would leave it is refused, and the
    // key still reads
    state
        .update(update(
            "drivers/full",
            pb::update_request::Op::Add(i64::MAX),
        ))
        .await?;
    let over = state
        .update(update(
            "drivers/full",
            pb::update_request::Op::Add(i64::MAX),
        ))
        .await
        .expect_err("an add past int64");
    assert_eq!(over.code(), tonic::Code::OutOfRange, "{over}");
    let full = state.get(replica("drivers/full")).await?.into_inner();
    assert_eq!(counter(&full), i64::MAX);
    assert!(!full.saturated);
    // an id longer than `ingest.max-id-bytes` is refused, nothing applied
    let mut long_id = update("trips/idem", pb::update_request::Op::Add(2));
    long_id.id = "i".repeat(257);
    let refused = state.update(long_id).await.expect_err("an id too long");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused}");
    assert!(refused.message().contains("idempotency id"), "{refused}");
    let value = state.get(replica("trips/idem")).await?.into_inner();
    assert_eq!(counter(&value), 2);

    let seen = tokio::time::timeout(Duration::from_secs(10), watch.next())
        .await?
        .context("watch ended")??;
    assert_eq!(seen.key, "zones/9q8yy");
    assert_eq!(
        seen.value,
        Some(pb::value::Value::Register(b"downtown".to_vec()))
    );

    let code =
        |r: Result<tonic::Response<pb::UpdateResponse>, tonic::Status>| r.unwrap_err().code();
    assert_eq!(
        code(
            state
                .update(update(
                    "trips/x",
                    pb::update_request::Op::Set(b"1".to_vec())
                ))
                .await
        ),
        tonic::Code::InvalidArgument
    );
    assert_eq!(
        code(
            state
                .update(update("nowhere/x", pb::update_request::Op::Add(1)))
                .await
        ),
        tonic::Code::InvalidArgument
    );
    assert_eq!(
        code(
            state
                .update(update("trips/x", pb::update_request::Op::Add(0)))
                .await
        ),
        tonic::Code::InvalidArgument
    );
    assert_eq!(
        code(
            state
                .update(update(
                    "surge/x",
                    pb::update_request::Op::Set(b"1.8".to_vec())
                ))
                .await
        ),
        tonic::Code::FailedPrecondition
    );
    let missing = state.get(replica("zones/never")).await;
    assert_eq!(missing.unwrap_err().code(), tonic::Code::NotFound);
    let untouched = state.get(replica("trips/never")).await?.into_inner();
    assert_eq!(counter(&untouched), 0);

    let page = state
        .scan(pb::ScanRequest {
            prefix: "".into(),
            page_token: String::new(),
            limit: 1,
            window: None,
        })
        .await?
        .into_inner();
    assert_eq!(page.values.len(), 1);
    assert_eq!(page.values[0].key, "drivers/9q8yy");
    let rest = state
        .scan(pb::ScanRequest {
            prefix: "".into(),
            page_token: page.next_page_token,
            limit: 10,
            window: None,
        })
        .await?
        .into_inner();
    assert_eq!(
        rest.values
            .iter()
            .map(|v| v.key.as_str())
            .collect::<Vec<_>>(),
        ["drivers/full", "trips/idem", "zones/9q8yy"]
    );
    assert!(rest.next_page_token.is_empty());

    // SIGTERM stops the node cleanly and promptly, open Watch stream and all
    node.terminate(Duration::from_secs(10)).await?;
    drop(watch);
    Ok(())
}

/// Every applied key's own part reaches the region's deltas topic, keyed by the state key:
/// the newest delta of each key equals this region's part of the key's state. Each
/// partition ships on its own: a key's deltas on its partition, followed there by a
/// resume point that names that updates partition only.
#[tokio::test]
async fn applied_keys_ship_their_own_part_to_the_deltas_topic() -> anyhow::Result<()> {
    use geostate::crdt::{CrdtValue, Delta, RESUME_KEY, ResumePoint};
    use geostate::replication::HEARTBEAT_KEY;

    let cluster = cluster()?;
    let kafka = cluster.regions["us-east-1"].kafka.clone();
    let topics = Topics::create(&kafka, "ship", 2).await?;
    let dir = tempfile::tempdir()?;
    let mut node = Node::configure(dir.path(), &kafka, &topics)?;
    node.start().await?;
    let mut state = node.state().await?;
    for (key, op) in [
        ("trips/a", pb::update_request::Op::Add(2)),
        ("trips/a", pb::update_request::Op::Add(3)),
        ("drivers/b", pb::update_request::Op::Add(-1)),
        ("zones/c", pb::update_request::Op::Set(b"x".to_vec())),
    ] {
        state
            .update(pb::UpdateRequest {
                key: key.into(),
                op: Some(op),
                id: String::new(),
                event_time_ms: 0,
            })
            .await?;
    }

    let consumer: StreamConsumer = common::kafka_config(&kafka)
        .set("group.id", common::unique("deltas-reader"))
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed")
        .create()?;
    consumer.subscribe(&[&topics.deltas])?;
    let mut newest: BTreeMap<String, Delta> = BTreeMap::new();
    // per deltas partition, the updates partitions its resume points named
    let mut resumed: BTreeMap<i32, BTreeSet<i32>> = BTreeMap::new();
    let done = |newest: &BTreeMap<String, Delta>, resumed: &BTreeMap<i32, BTreeSet<i32>>| {
        let value = |k: &str| newest.get(k).map(|d| d.state.clone());
        let every_key_resumed = newest
            .keys()
            .all(|k| resumed.contains_key(&geostate::log::partition_of(k.as_bytes(), 2)));
        matches!(value("trips/a"), Some(CrdtValue::GCounter(c)) if c.value() == 5)
            && matches!(value("drivers/b"), Some(CrdtValue::PnCounter(c)) if c.value() == -1)
            && matches!(value("zones/c"), Some(CrdtValue::LwwRegister(r)) if r.value() == b"x")
            && every_key_resumed
    };
    let until = Instant::now() + Duration::from_secs(30);
    while !done(&newest, &resumed) {
        let left = until.saturating_duration_since(Instant::now());
        let message = tokio::time::timeout(left, consumer.recv())
            .await
            .with_context(|| format!("deltas incomplete: {newest:?}, resumed {resumed:?}"))??;
        if message.key() == Some(HEARTBEAT_KEY) {
            continue; // each shipping transaction ends with a heartbeat
        }
        if message.key() == Some(RESUME_KEY) {
            let resume = ResumePoint::decode(message.payload().unwrap_or_default())?;
            resumed
                .entry(message.partition())
                .or_default()
                .extend(resume.updates_offsets.keys());
            continue;
        }
        let delta = Delta::decode(message.payload().unwrap_or_default())?;
        assert_eq!(
            message.key(),
            Some(delta.key.as_bytes()),
            "record key = state key"
        );
        assert_eq!(
            message.partition(),
            geostate::log::partition_of(delta.key.as_bytes(), 2),
            "{} ships on its own partition",
            delta.key
        );
        assert_eq!(delta.origin.as_str(), "us-east-1");
        assert_eq!(delta.epoch, 0);
        newest.insert(delta.key.clone(), delta);
    }
    for (partition, named) in &resumed {
        assert_eq!(
            named,
            &BTreeSet::from([*partition]),
            "the resume points on deltas partition {partition} name that updates partition only"
        );
    }
    Ok(())
}

/// Every request and stream has a limit, named when it is passed: a `BatchGet` over
/// `api.max-batch-keys` is RESOURCE_EXHAUSTED, a `Scan` page token that is not a key under
/// the prefix INVALID_ARGUMENT, a `Watch` over `api.max-watchers` RESOURCE_EXHAUSTED, and a
/// watcher that stops reading is cut off (RESOURCE_EXHAUSTED, counted) instead of
/// buffering every change for it.
#[tokio::test]
async fn requests_and_streams_are_bounded() -> anyhow::Result<()> {
    let cluster = cluster()?;
    let kafka = cluster.regions["us-east-1"].kafka.clone();
    let topics = Topics::create(&kafka, "limits", 1).await?;
    let dir = tempfile::tempdir()?;
    let mut node = Node::configure(dir.path(), &kafka, &topics)?;
    node.set("api.max-batch-keys", "10");
    node.set("api.max-watchers", "2");
    node.start().await?;
    let mut state = node.state().await?;

    let keys = |n: usize| pb::BatchGetRequest {
        keys: (0..n).map(|i| format!("trips/k{i}")).collect(),
        window: None,
    };
    let ten = state.batch_get(keys(10)).await?.into_inner();
    assert_eq!(ten.values.len() + ten.missing.len(), 10);
    let err = state.batch_get(keys(11)).await.expect_err("11 keys");
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err}");
    assert!(err.message().contains("api.max-batch-keys is 10"), "{err}");

    let err = state
        .scan(pb::ScanRequest {
            prefix: "trips/".into(),
            page_token: "zones/z".into(),
            limit: 10,
            window: None,
        })
        .await
        .expect_err("a token from another prefix");
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err}");

    // two watchers, and a third: refused
    let watch = || pb::WatchRequest {
        prefix: "trips/".into(),
    };
    let mut stalled = state.watch(watch()).await?.into_inner();
    let other = state.watch(watch()).await?.into_inner();
    let err = state.watch(watch()).await.expect_err("a third watcher");
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err}");
    assert!(err.message().contains("api.max-watchers is 2"), "{err}");
    drop(other);

    // far more changes than the stalled watcher's queue and its connection's buffers hold
    let updates: Vec<(String, Vec<u8>)> = (0..20_000)
        .map(|i| {
            let key = format!("trips/w{i}");
            let payload = format!(r#"{{"key":"{key}","add":1}}"#).into_bytes();
            (key, payload)
        })
        .collect();
    common::produce_all(&producer(&kafka)?, &topics.updates, &updates).await?;
    node.caught_up(Duration::from_secs(120)).await?;
    let mut received = 0;
    let ended = loop {
        match tokio::time::timeout(Duration::from_secs(30), stalled.next()).await {
            Ok(Some(Ok(_))) => received += 1,
            Ok(Some(Err(status))) => break status,
            Ok(None) => bail!("the stalled watcher's stream ended without a reason"),
            Err(_) => bail!("the stalled watcher was never cut off ({received} values)"),
        }
    };
    assert_eq!(ended.code(), tonic::Code::ResourceExhausted, "{ended}");
    assert!(received < updates.len(), "{received} values buffered");
    // counted; the watcher closed above counts too if its queue filled before the node
    // learned the client had closed it
    let dropped = common::metric(&node.metrics, "geostate_watchers_dropped_total ")?;
    assert!(
        dropped.is_some_and(|n| (1.0..=2.0).contains(&n)),
        "{dropped:?}"
    );
    Ok(())
}

/// `--log-format json` (here `GEOSTATE_LOG_FORMAT`): every log line is a JSON object; with
/// `geostate::api=debug` each write's span is logged as it ends, naming its key,
/// partition and offset as the answer gave them.
#[tokio::test]
async fn json_logs_trace_each_write_with_its_key_partition_and_offset() -> anyhow::Result<()> {
    let cluster = cluster()?;
    let kafka = cluster.regions["us-east-1"].kafka.clone();
    let topics = Topics::create(&kafka, "json-log", 2).await?;
    let dir = tempfile::tempdir()?;
    let mut node = Node::configure(dir.path(), &kafka, &topics)?;
    node.env = vec![
        ("GEOSTATE_LOG_FORMAT".into(), "json".into()),
        ("RUST_LOG".into(), "info,geostate::api=debug".into()),
    ];
    node.start().await?;
    let mut state = node.state().await?;
    let answer = state
        .update(pb::UpdateRequest {
            key: "trips/json-log".into(),
            op: Some(pb::update_request::Op::Add(3)),
            id: String::new(),
            event_time_ms: 0,
        })
        .await?
        .into_inner();
    let position = answer.position.context("an update answers its position")?;

    let deadline = Instant::now() + Duration::from_secs(10);
    let span = loop {
        let log = std::fs::read_to_string(&node.log)?;
        let mut lines = Vec::new();
        for line in log.lines().filter(|l| !l.trim().is_empty()) {
            let value: serde_json::Value = serde_json::from_str(line)
                .with_context(|| format!("a log line that is not JSON: {line}"))?;
            lines.push(value);
        }
        let closed = lines
            .into_iter()
            .find(|l| l["span"]["name"] == "update" && l["fields"]["message"] == "close");
        if let Some(line) = closed {
            break line;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "no update span in the log: {log}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    println!("{span}");
    let fields = &span["span"];
    assert_eq!(fields["key"], "trips/json-log", "{span}");
    assert_eq!(fields["partition"], position.partition, "{span}");
    assert_eq!(fields["offset"], position.offset, "{span}");
    assert!(span["fields"]["time.busy"].is_string(), "{span}");
    assert_eq!(span["level"], "DEBUG", "{span}");
    Ok(())
}
