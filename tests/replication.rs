//! Two regions, active-active, on real Kafka and RocksDB: each node ships its own deltas
//! and merges the other's (read directly from the other's deltas topic, the single-cluster
//! switch). Concurrent writes on the same keys converge; deltas replayed twice and out of
//! order change nothing; a delta stamped beyond the clock guard is refused and counted; a
//! node that loses its disk comes back with exact totals in both regions.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use common::failover::replica;
use common::unwritable::Unwritable;
use common::{Node, Topics, add, cluster, counter, http_get, produce_all, producer};
use geostate::clock::{Clock, SystemClock};
use geostate::crdt::{Actor, CrdtValue, Delta, GCounter, RegionId};
use geostate::pb;
use geostate::pb::state_client::StateClient;
use geostate::workload::Rng;
use rdkafka::Message;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use tonic::transport::Channel;

const WRITES_PER_REGION: usize = 600;
/// Few keys, so local batches and merges of remote deltas keep touching the same ones.
const KEYS: usize = 4;
/// Concurrent writers per region.
const WRITERS: usize = 4;

/// Every value of every key (freshness cleared).
async fn everything(
    state: &mut StateClient<Channel>,
) -> anyhow::Result<BTreeMap<String, pb::Value>> {
    let mut out = BTreeMap::new();
    let mut page_token = String::new();
    loop {
        let page = state
            .scan(pb::ScanRequest {
                prefix: String::new(),
                page_token,
                limit: 1000,
                window: None,
            })
            .await?
            .into_inner();
        for mut v in page.values {
            v.freshness = None; // differs per region by design
            out.insert(v.key.clone(), v);
        }
        if page.next_page_token.is_empty() {
            return Ok(out);
        }
        page_token = page.next_page_token;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writes_in_two_regions_converge_and_count_every_increment() -> anyhow::Result<()>
{
    let cluster = cluster()?;
    let kafka = cluster.regions["us-east-1"].kafka.clone();
    let (ta, tb) = (
        Topics::create(&kafka, "repl-a", 2).await?,
        Topics::create(&kafka, "repl-b", 2).await?,
    );
    let (dir_a, dir_b) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let (mut a, mut b) = Node::pair(&kafka, (&ta, &tb), (dir_a.path(), dir_b.path()))?;
    a.start().await?;
    b.start().await?;

    // both regions write the same keys at the same time
    let mut expected: BTreeMap<String, i64> = BTreeMap::new();
    let mut writers = Vec::new();
    for (node, seed) in [(&a, 1u64), (&b, 2u64)] {
        let state = node.state().await?;
        let mut plan = Vec::new();
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        for i in 0..WRITES_PER_REGION {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let k = x % KEYS as u64;
            let (key, op) = match i % 3 {
                0 => (
                    format!("trips/{k}"),
                    pb::update_request::Op::Add(1 + (x % 5) as i64),
                ),
                1 => (
                    format!("drivers/{k}"),
                    pb::update_request::Op::Add((x % 7) as i64 - 3),
                ),
                _ => (
                    format!("zones/{k}"),
                    pb::update_request::Op::Set(format!("{seed}-{i}").into_bytes()),
                ),
            };
            if let pb::update_request::Op::Add(n) = op {
                *expected.entry(key.clone()).or_default() += n;
            }
            plan.push((key, op));
        }
        for chunk in plan.chunks(WRITES_PER_REGION / WRITERS) {
            let (mut state, chunk) = (state.clone(), chunk.to_vec());
            writers.push(tokio::spawn(async move {
                for (key, op) in chunk {
                    state
                        .update(pb::UpdateRequest {
                            key,
                            op: Some(op),
                            id: String::new(),
                            event_time_ms: 0,
                        })
                        .await?;
                }
                anyhow::Ok(())
            }));
        }
    }
    for w in writers {
        w.await??;
    }

    // both regions converge: identical state, every counter the sum of all acknowledged adds
    let (mut sa, mut sb) = (a.state().await?, b.state().await?);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (va, vb) = (everything(&mut sa).await?, everything(&mut sb).await?);
        let counters_right = expected.iter().all(|(k, n)| {
            [&va, &vb].iter().all(|v| {
                v.get(k).and_then(|v| v.value.clone()) == Some(pb::value::Value::Counter(*n))
            })
        });
        if va == vb && counters_right {
            break;
        }
        if Instant::now() > deadline {
            let differing: Vec<_> = expected
                .keys()
                .chain(va.keys())
                .filter(|k| {
                    va.get(*k) != vb.get(*k)
                        || expected.get(*k).is_some_and(|n| {
                            va.get(*k).and_then(|v| v.value.clone())
                                != Some(pb::value::Value::Counter(*n))
                        })
                })
                .take(3)
                .map(|k| {
                    (
                        k,
                        va.get(k).and_then(|v| v.value.clone()),
                        vb.get(k).and_then(|v| v.value.clone()),
                        expected.get(k),
                    )
                })
                .collect();
            bail!(
                "regions did not converge within 60 s; differing (key, a, b, expected): {differing:?}"
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // reads carry freshness: the other region's newest merged delta
    let value = sa.get(replica("trips/0")).await?.into_inner();
    let remotes = value.freshness.unwrap_or_default().remotes;
    assert_eq!(remotes.len(), 1);
    assert_eq!(remotes[0].region, "eu-west-1");
    assert!(remotes[0].applied.unwrap_or_default().wall_nanos > 0);
    Ok(())
}

/// `Admin/Status` names, per remote, a time the remote's heartbeats on every partition the
/// node merges have passed: the node then holds every write the remote acknowledged
/// before it. Checked while the remote writes: each time the time moves, a read right
/// after holds every add acknowledged before that time (it fails if the heartbeat's time
/// were read after the outbox, or if the newest partition's heartbeat stood for all).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_heard_from_since_t_is_held_up_to_t() -> anyhow::Result<()> {
    let cluster = cluster()?;
    let kafka = cluster.regions["us-east-1"].kafka.clone();
    let (ta, tb) = (
        Topics::create(&kafka, "heard-a", 2).await?,
        Topics::create(&kafka, "heard-b", 2).await?,
    );
    let (dir_a, dir_b) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let (mut a, mut b) = Node::pair(&kafka, (&ta, &tb), (dir_a.path(), dir_b.path()))?;
    a.start().await?;
    b.start().await?;
    let keys: Vec<String> = (0..KEYS).map(|k| format!("trips/heard-{k}")).collect();
    let now = || SystemClock.now_nanos();

    // a writes for 8 s; each add's acknowledgement time, in order
    let (acked_tx, acked) = tokio::sync::watch::channel(Vec::<(u64, usize)>::new());
    let writer = {
        let (mut state, keys) = (a.state().await?, keys.clone());
        tokio::spawn(async move {
            let until = Instant::now() + Duration::from_secs(8);
            let mut i = 0;
            while Instant::now() < until {
                state.update(add(&keys[i % keys.len()], 1)).await?;
                acked_tx.send_modify(|acked| acked.push((now(), i % keys.len())));
                i += 1;
            }
            anyhow::Ok(())
        })
    };
    let mut sb = b.state().await?;
    let (mut checked, mut last) = (0, 0);
    while !writer.is_finished() {
        let status = b.status().await?;
        let since = status
            .remotes
            .first()
            .map_or(0, |r| r.heard_from_all_since_nanos);
        if since > last {
            last = since;
            let mut held = vec![0; keys.len()];
            for (i, key) in keys.iter().enumerate() {
                held[i] = counter(&sb.get(replica(key)).await?.into_inner());
            }
            let mut before = vec![0; keys.len()];
            for &(_, k) in acked.borrow().iter().filter(|(at, _)| *at < since) {
                before[k] += 1;
            }
            for (i, key) in keys.iter().enumerate() {
                ensure!(
                    held[i] >= before[i],
                    "{key}: b heard from a since {since} but holds {} of the {} adds a acknowledged before",
                    held[i],
                    before[i]
                );
            }
            checked += 1;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    writer.await??;
    ensure!(
        checked >= 4,
        "the heartbeat time moved only {checked} times in 8 s"
    );
    Ok(())
}

/// With `replication.ship-every`, a partition ships deltas at most once per interval:
/// updates of a key meanwhile leave one delta, and the other region still counts every one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shipping_interval_coalesces_a_keys_updates_and_loses_none() -> anyhow::Result<()> {
    const UPDATES: i64 = 60;
    let cluster = cluster()?;
    let kafka = cluster.regions["us-east-1"].kafka.clone();
    let (ta, tb) = (
        Topics::create(&kafka, "ship-every-a", 1).await?,
        Topics::create(&kafka, "ship-every-b", 1).await?,
    );
    let (dir_a, dir_b) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let (mut a, mut b) = Node::pair(&kafka, (&ta, &tb), (dir_a.path(), dir_b.path()))?;
    a.set("replication.ship-every", "\"1s\"");
    a.start().await?;
    b.start().await?;

    // one update at a time: each its own batch, which without the interval ships alone
    let key = "trips/coalesced";
    let (mut sa, mut sb) = (a.state().await?, b.state().await?);
    let started = Instant::now();
    for _ in 0..UPDATES {
        sa.update(pb::UpdateRequest {
            key: key.into(),
            op: Some(pb::update_request::Op::Add(1)),
            id: String::new(),
            event_time_ms: 0,
        })
        .await?;
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let read = sb.get(replica(key)).await;
        if read.is_ok_and(|v| counter(v.get_ref()) == UPDATES) {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "eu-west-1 did not count {UPDATES} within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let elapsed = started.elapsed();

    // every round carrying the key shipped within `elapsed`, at least 1 s apart
    let deltas = read_all(&kafka, &ta.deltas)
        .await?
        .iter()
        .filter(|(k, _)| k == key.as_bytes())
        .count();
    let most = elapsed.as_secs() as usize + 2;
    ensure!(
        deltas <= most,
        "{deltas} deltas of {key} for {UPDATES} updates in {elapsed:?}: more than one round per second ({most})"
    );
    Ok(())
}

/// Reads every committed record of `topic` from the beginning to its end.
async fn read_all(kafka: &str, topic: &str) -> anyhow::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let consumer: StreamConsumer = common::kafka_config(kafka)
        .set("group.id", common::unique("reader"))
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true")
        .create()?;
    consumer.subscribe(&[topic])?;
    let partitions = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))?
        .topics()
        .iter()
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect::<Vec<_>>();
    let mut at_end = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    while at_end.len() < partitions.len() {
        match tokio::time::timeout(Duration::from_secs(30), consumer.recv())
            .await
            .context("reading the deltas topic timed out")?
        {
            Ok(m) => out.push((
                m.key().unwrap_or_default().to_vec(),
                m.payload().unwrap_or_default().to_vec(),
            )),
            Err(KafkaError::PartitionEOF(p)) => {
                at_end.insert(p);
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(out)
}

/// Waits until `node` merged every record of its one remote's topic.
async fn remote_caught_up(node: &Node, deadline: Duration) -> anyhow::Result<pb::RemoteStatus> {
    let until = Instant::now() + deadline;
    loop {
        let status = node.status().await?;
        let remote = status.remotes.first().cloned().context("no remote")?;
        if remote.caught_up
            && !remote.partitions.is_empty()
            && remote
                .partitions
                .iter()
                .all(|p| p.end_offset >= 0 && p.lag == 0)
        {
            return Ok(remote);
        }
        if Instant::now() > until {
            bail!("remote not merged within {deadline:?}: {remote:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Merging a region's deltas again — all of them, twice, newest first — changes nothing;
/// a delta stamped 5 s ahead is held, counted, and merged once the clock allows (never
/// dropped); a region that only merges ships nothing (deltas never echo back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replayed_reordered_deltas_change_nothing_and_a_clock_ahead_delta_is_held()
-> anyhow::Result<()> {
    let cluster = cluster()?;
    let kafka = cluster.regions["us-east-1"].kafka.clone();
    let (ta, tb) = (
        Topics::create(&kafka, "replay-a", 2).await?,
        Topics::create(&kafka, "replay-b", 2).await?,
    );
    let (dir_a, dir_b) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let (mut a, mut b) = Node::pair(&kafka, (&ta, &tb), (dir_a.path(), dir_b.path()))?;
    a.start().await?;
    b.start().await?;
    let mut sa = a.state().await?;
    for i in 0..300 {
        let (key, op) = match i % 3 {
            0 => (
                format!("trips/{}", i % 7),
                pb::update_request::Op::Add(1 + i % 4),
            ),
            1 => (
                format!("drivers/{}", i % 5),
                pb::update_request::Op::Add(i % 9 - 4),
            ),
            _ => (
                format!("zones/{}", i % 4),
                pb::update_request::Op::Set(format!("v{i}").into_bytes()),
            ),
        };
        sa.update(pb::UpdateRequest {
            key,
            op: Some(op),
            id: String::new(),
            event_time_ms: 0,
        })
        .await?;
    }
    let mut sb = b.state().await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let before = loop {
        let (va, vb) = (everything(&mut sa).await?, everything(&mut sb).await?);
        if va == vb && va.len() == 7 + 5 + 4 {
            break vb;
        }
        if Instant::now() > deadline {
            bail!(
                "b did not converge with a: {} vs {} keys",
                va.len(),
                vb.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let merged_before = remote_caught_up(&b, Duration::from_secs(30))
        .await?
        .deltas_merged;

    // every shipped delta again, twice, newest first; then one from 5 s ahead
    let shipped = read_all(&kafka, &ta.deltas).await?;
    let deltas: Vec<(String, Vec<u8>)> = shipped
        .iter()
        .filter(|(k, _)| k.first() != Some(&0)) // resume points are not deltas
        .rev()
        .map(|(k, v)| (String::from_utf8_lossy(k).into_owned(), v.clone()))
        .collect();
    assert!(deltas.len() >= 16, "only {} deltas shipped", deltas.len());
    let producer = producer(&kafka)?;
    produce_all(&producer, &ta.deltas, &deltas).await?;
    produce_all(&producer, &ta.deltas, &deltas).await?;
    let mut ahead = GCounter::new();
    ahead.increment(&Actor::new(RegionId::new("us-east-1")?, 1), 5)?;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
    let ahead = Delta {
        key: "trips/ahead".into(),
        origin: RegionId::new("us-east-1")?,
        state: CrdtValue::GCounter(ahead),
        origin_time: geostate::clock::HlcTimestamp::new(now.as_nanos() as u64 + 5_000_000_000, 0),
        epoch: 0,
        recent_ids: Vec::new(),
    };
    produce_all(
        &producer,
        &ta.deltas,
        &[(ahead.key.clone(), ahead.encode())],
    )
    .await?;

    let remote = remote_caught_up(&b, Duration::from_secs(60)).await?;
    assert_eq!(
        remote.deltas_merged - merged_before,
        2 * deltas.len() as u64 + 1,
        "every replayed delta was merged, and the one from the future too"
    );
    assert_eq!(remote.deltas_refused, 0, "nothing is refused");
    let metrics = http_get(&b.metrics, "/metrics")?;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("geostate_deltas_held_total")
                && l.contains(r#"reason="clock_ahead""#)),
        "the hold is not counted by reason: {metrics}"
    );
    let mut after = everything(&mut sb).await?;
    let held = after.remove("trips/ahead");
    assert_eq!(before, after, "replaying deltas changed the state");
    assert_eq!(
        held.and_then(|v| v.value),
        Some(pb::value::Value::Counter(5)),
        "the delta from the future merged once the clock allowed"
    );
    // b took no write of its own: merging hundreds of deltas shipped none back
    assert!(
        !metrics
            .lines()
            .any(|l| l.starts_with("geostate_deltas_shipped_total") && !l.ends_with(" 0")),
        "a merge produced outbound deltas: {metrics}"
    );
    Ok(())
}

/// A node killed mid-ingest and restarted on an EMPTY data dir rebuilds itself from the
/// deltas topics (its own past incarnation's and the other region's) under a new
/// incarnation: once it answers, and after more events, every counter in both regions
/// equals what was produced in both — nothing lost, nothing counted twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_on_an_empty_disk_comes_back_with_exact_totals_in_both_regions() -> anyhow::Result<()>
{
    const KEYS: u64 = 40;
    let cluster = cluster()?;
    let kafka = cluster.regions["us-east-1"].kafka.clone();
    let (ta, tb) = (
        Topics::create(&kafka, "wipe-a", 4).await?,
        Topics::create(&kafka, "wipe-b", 4).await?,
    );
    let (dir_a, dir_b) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let (mut a, mut b) = Node::pair(&kafka, (&ta, &tb), (dir_a.path(), dir_b.path()))?;
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_nanos() as u64
        | 1;
    println!("seed {seed}");
    let mut rng = Rng(seed);
    let mut expected: BTreeMap<String, i64> = BTreeMap::new();
    let mut events = |n: usize| {
        (0..n)
            .map(|_| {
                let k = rng.below(KEYS);
                let (key, add) = if rng.below(2) == 0 {
                    (format!("trips/k{k}"), 1 + rng.below(3) as i64)
                } else {
                    (format!("drivers/k{k}"), rng.below(7) as i64 - 3)
                };
                *expected.entry(key.clone()).or_default() += add;
                let payload = format!(r#"{{"key":"{key}","add":{add}}}"#).into_bytes();
                (key, payload)
            })
            .collect::<Vec<_>>()
    };
    let (before_a, in_b, after_a) = (events(40_000), events(5_000), events(5_000));

    a.start().await?;
    b.start().await?;
    let old = a.status().await?.incarnation;
    let producer = producer(&kafka)?;
    produce_all(&producer, &tb.updates, &in_b).await?;
    let feed = {
        let (producer, topic) = (producer.clone(), ta.updates.clone());
        tokio::spawn(async move { produce_all(&producer, &topic, &before_a).await })
    };
    // kill -9 while it ingests: some batches shipped, some not, a transaction maybe open
    let until = Instant::now() + Duration::from_secs(120);
    loop {
        let applied = a.status().await?.events_applied;
        if applied >= 8_000 {
            println!("kill -9 after {applied} events applied");
            break;
        }
        if Instant::now() > until {
            bail!("a applied only {applied} events in 120 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    a.kill9();
    std::fs::remove_dir_all(dir_a.path().join("data"))?;
    feed.await??;
    a.start().await?;
    let status = a.status().await?;
    assert!(
        status.incarnation > old,
        "a new incarnation: {} after {old}",
        status.incarnation
    );
    assert!(
        status.remotes.iter().all(|r| r.caught_up),
        "served before bootstrap: {status:?}"
    );
    produce_all(&producer, &ta.updates, &after_a).await?;
    a.caught_up(Duration::from_secs(120)).await?;
    b.caught_up(Duration::from_secs(120)).await?;

    let keys: Vec<String> = expected.keys().cloned().collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut wrong = Vec::new();
        for (name, node) in [("us-east-1", &a), ("eu-west-1", &b)] {
            let values = node
                .state()
                .await?
                .batch_get(pb::BatchGetRequest {
                    keys: keys.clone(),
                    window: None,
                })
                .await?
                .into_inner()
                .values;
            for v in values {
                if expected[&v.key] != counter(&v) {
                    wrong.push((name, v.key.clone(), counter(&v), expected[&v.key]));
                }
            }
        }
        if wrong.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "{} counters wrong 60 s after load, e.g. (region, key, got, expected) {:?}",
                wrong.len(),
                &wrong[..wrong.len().min(4)]
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// `key`'s register value at `node`, `None` if it has none.
async fn register_of(node: &Node, key: &str) -> anyhow::Result<Option<String>> {
    let got = node.state().await?.get(replica(key)).await;
    Ok(match got {
        Ok(v) => match v.into_inner().value {
            Some(pb::value::Value::Register(b)) => Some(String::from_utf8(b)?),
            other => bail!("{key} is not a register: {other:?}"),
        },
        Err(s) if s.code() == tonic::Code::NotFound => None,
        Err(s) => bail!("{s}"),
    })
}

/// A node rebuilt from its deltas topic judges the owned records it replays by the fence
/// of the last resume point, as the lost node did: a record of an older epoch, which the
/// region had refused as fenced after applying a newer one, is refused again rather than
/// applied. Fails if the resume point carries no fences (a merge never raises the fence).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuilt_node_refuses_again_what_its_lost_node_refused_as_fenced() -> anyhow::Result<()> {
    let cluster = cluster()?;
    let kafka = &cluster.regions["us-east-1"].kafka;
    let topics = Topics::create(kafka, "refence", 1).await?;
    let dir = tempfile::tempdir()?;
    let mut node = Node::configure(dir.path(), kafka, &topics)?;
    node.start().await?;
    let producer = producer(kafka)?;
    let owned = |key: &str, value: &str, epoch: u64| {
        let json = format!(r#"{{"key":"{key}","set":"{value}","epoch":{epoch}}}"#);
        (key.to_string(), json.into_bytes())
    };
    // epoch 5 applies and ships: its resume point carries the shard's fence
    produce_all(&producer, &topics.updates, &[owned("surge/a", "five", 5)]).await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !read_all(kafka, &topics.deltas)
        .await?
        .iter()
        .any(|(key, _)| key.as_slice() == geostate::crdt::RESUME_KEY)
    {
        if Instant::now() > deadline {
            bail!("no resume point shipped within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // epoch 3 after it is refused, and ships nothing
    produce_all(&producer, &topics.updates, &[owned("surge/b", "three", 3)]).await?;
    node.caught_up(Duration::from_secs(60)).await?;
    assert_eq!(read_all(kafka, &topics.dlq).await?.len(), 1);
    assert_eq!(register_of(&node, "surge/b").await?, None);

    // the disk is lost: the node rebuilds from its deltas topic and replays the refused record
    node.kill9();
    std::fs::remove_dir_all(dir.path().join("data"))?;
    node.start().await?;
    node.caught_up(Duration::from_secs(60)).await?;
    assert_eq!(
        read_all(kafka, &topics.dlq).await?.len(),
        2,
        "the replay dead-letters the record again"
    );
    assert_eq!(
        register_of(&node, "surge/b").await?,
        None,
        "the replay applied a record the lost node had refused"
    );
    assert_eq!(
        register_of(&node, "surge/a").await?.as_deref(),
        Some("five")
    );
    Ok(())
}

/// With `replication.max-outbox-keys = 500` and batches of 100, a region whose deltas
/// topic takes no writes stops ingesting once its outbox holds 500 keys; once the topic
/// takes writes again it ships a backlog of 20,000 keys in rounds (Kafka transactions) of
/// at most 600 deltas, every key arriving. Without the bound the outbox, and the one round
/// that ships it, grow with the backlog: past what a transaction can carry within its
/// timeout, replication from the region stops for good. `GEOSTATE_BACKLOG="1000000
/// 100000"` runs it with a million keys and the default bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_ships_in_bounded_rounds() -> anyhow::Result<()> {
    let setting = std::env::var("GEOSTATE_BACKLOG").unwrap_or_else(|_| "20000 500".into());
    let mut numbers = setting.split_whitespace().map(str::parse::<usize>);
    let (Some(Ok(keys)), Some(Ok(bound))) = (numbers.next(), numbers.next()) else {
        bail!("GEOSTATE_BACKLOG={setting:?} is not \"<keys> <bound>\"");
    };
    const BATCH: u64 = 100;
    let cluster = cluster()?;
    let kafka = cluster.regions["us-east-1"].kafka.clone();
    let topics = Topics::create(&kafka, "outbox", 1).await?;
    let dir = tempfile::tempdir()?;
    let mut node = Node::configure(dir.path(), &kafka, &topics)?;
    node.set("replication.max-outbox-keys", &bound.to_string());
    node.set("ingest.batch-max-events", &BATCH.to_string());
    let stuck = Unwritable::new(&kafka, &topics.deltas).await?;
    node.start().await?;
    let started = Instant::now();
    let records: Vec<(String, Vec<u8>)> = (0..keys)
        .map(|i| {
            let key = format!("trips/backlog-{i}");
            let payload = format!(r#"{{"key":"{key}","add":1}}"#).into_bytes();
            (key, payload)
        })
        .collect();
    produce_all(&producer(&kafka)?, &topics.updates, &records).await?;

    // ingest stops at the bound (one batch may cross it)
    let bound = bound as u64;
    let deadline = Instant::now() + Duration::from_secs(600);
    let stopped_at = loop {
        let applied = node.status().await?.events_applied;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let again = node.status().await?.events_applied;
        if again == applied && applied >= bound {
            break applied;
        }
        if Instant::now() > deadline {
            bail!("ingest never stopped: {again} events applied");
        }
    };
    assert!(
        stopped_at <= bound + BATCH,
        "{stopped_at} keys applied while the outbox could not ship (bound {bound} + a batch of {BATCH})"
    );

    drop(stuck);
    let writable = Instant::now();
    node.caught_up(Duration::from_secs(1800)).await?;
    let deadline = Instant::now() + Duration::from_secs(600);
    while !http_get(&node.metrics, "/metrics")?
        .lines()
        .any(|l| l == "geostate_outbox_keys 0")
    {
        ensure!(Instant::now() < deadline, "the outbox never emptied");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let drained = writable.elapsed();
    let deadline = Instant::now() + Duration::from_secs(120);
    let (rounds, shipped) = loop {
        let all = read_all(&kafka, &topics.deltas).await?;
        let mut rounds = vec![0usize];
        let mut shipped = std::collections::BTreeSet::new();
        for (key, _) in &all {
            match key.first() {
                // a resume point ends a round; heartbeats are not deltas
                Some(0) if key.as_slice() == geostate::crdt::RESUME_KEY => rounds.push(0),
                Some(0) => {}
                _ => {
                    shipped.insert(key.clone());
                    if let Some(last) = rounds.last_mut() {
                        *last += 1;
                    }
                }
            }
        }
        if shipped.len() == keys {
            break (rounds, shipped.len());
        }
        if Instant::now() > deadline {
            bail!("{} of {keys} keys shipped", shipped.len());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let largest = rounds.iter().copied().max().unwrap_or(0) as u64;
    println!(
        "{shipped} keys shipped in {} rounds, the largest {largest} deltas; ingest stopped at {stopped_at} keys while the topic took no writes; {:.1} s from writable to an empty outbox ({:.1} s in all)",
        rounds.len() - 1,
        drained.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    assert!(largest <= bound + BATCH, "a round of {largest} deltas");
    Ok(())
}
