//! A region on several nodes: Kafka's group assigns the updates partitions among them, a
//! partition that moves is caught up from the region's own deltas before it is ingested,
//! and every node answers every key (the owner's answer, routed). Counters stay exact
//! when a node joins, leaves, or is killed in the middle of ingest; the deltas the region
//! shipped stay exact too (a node rebuilt from them alone reads the same counts).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure};
use common::failover::{Frozen, replica};
use common::{Node, Topics, cluster, counter, produce_all, producer};
use geostate::pb;
use rdkafka::producer::FutureProducer;

const PARTITIONS: i32 = 4;
const KEYS: usize = 24;

/// One region's private topics on the test cluster's us-east-1 Kafka, its keys, and its
/// nodes' data dirs (removed with it, after the nodes it made are dropped).
struct Region {
    kafka: String,
    topics: Topics,
    base: String,
    producer: FutureProducer,
    dirs: Vec<tempfile::TempDir>,
}

impl Region {
    async fn new(label: &str) -> anyhow::Result<Self> {
        let kafka = cluster()?.regions["us-east-1"].kafka.clone();
        Ok(Self {
            topics: Topics::create(&kafka, label, PARTITIONS).await?,
            base: common::unique(label),
            producer: producer(&kafka)?,
            kafka,
            dirs: Vec::new(),
        })
    }

    /// A node of the region with a data dir of its own, not started.
    fn node(&mut self) -> anyhow::Result<Node> {
        let dir = tempfile::tempdir()?;
        let node = Node::configure(dir.path(), &self.kafka, &self.topics)?;
        self.dirs.push(dir);
        Ok(node)
    }

    /// An eu-west-1 node with topics of its own on the same Kafka, started.
    async fn remote(&self) -> anyhow::Result<Remote> {
        let topics = Topics::create(&self.kafka, "eu", PARTITIONS).await?;
        let dir = tempfile::tempdir()?;
        let mut node = Node::configure_region(dir.path(), "eu-west-1", &self.kafka, &topics, &[])?;
        node.start().await?;
        Ok(Remote {
            _node: node,
            topics,
            _dir: dir,
        })
    }

    /// A node of the region merging `remote`'s deltas, not started.
    fn node_merging(&mut self, remote: &Remote) -> anyhow::Result<Node> {
        let dir = tempfile::tempdir()?;
        let deltas = [("eu-west-1", remote.topics.deltas.as_str())];
        let node =
            Node::configure_region(dir.path(), "us-east-1", &self.kafka, &self.topics, &deltas)?;
        self.dirs.push(dir);
        Ok(node)
    }

    /// Produces round `round` of [`events`] to the updates topic.
    async fn round(&self, round: usize) -> anyhow::Result<()> {
        produce_all(
            &self.producer,
            &self.topics.updates,
            &events(&self.base, round),
        )
        .await
    }
}

/// A region whose deltas a [`Region`]'s nodes merge (from the same Kafka).
struct Remote {
    /// Running; stopped when dropped, before its data dir goes.
    _node: Node,
    topics: Topics,
    _dir: tempfile::TempDir,
}

/// Events of `round` for every key: key `i` gets `i + 1` increments of 1.
fn events(base: &str, round: usize) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for i in 0..KEYS {
        let key = format!("trips/{base}-{i}");
        for n in 0..=i {
            let id = format!("{round}-{n}");
            out.push((
                key.clone(),
                format!(r#"{{"key":"{key}","add":1,"id":"{id}"}}"#).into_bytes(),
            ));
        }
    }
    out
}

/// Waits until the nodes' owned partitions are disjoint and cover every partition, each
/// node owning at least one; answers who owns what.
async fn shared_out(nodes: &[&Node], within: Duration) -> anyhow::Result<Vec<Vec<i32>>> {
    let until = Instant::now() + within;
    loop {
        let mut owned = Vec::new();
        for node in nodes {
            owned.push(node.status().await?.owned_partitions);
        }
        let all: BTreeSet<i32> = owned.iter().flatten().copied().collect();
        let count: usize = owned.iter().map(Vec::len).sum();
        if all.len() == PARTITIONS as usize
            && count == all.len()
            && owned.iter().all(|o| !o.is_empty())
        {
            return Ok(owned);
        }
        if Instant::now() > until {
            bail!("partitions not shared out within {within:?}: {owned:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Starts `a`, waits until it owns every partition, then starts `b` and waits until the
/// two share them out; answers who owns what and `b`'s process id.
async fn start_pair(
    a: &mut Node,
    b: &mut Node,
    within: Duration,
) -> anyhow::Result<(Vec<Vec<i32>>, u32)> {
    a.start().await?;
    owns_all(a, within).await?;
    let pid = b.start().await?;
    Ok((shared_out(&[a, b], within).await?, pid))
}

/// Waits until `node` owns every partition.
async fn owns_all(node: &Node, within: Duration) -> anyhow::Result<()> {
    let until = Instant::now() + within;
    loop {
        let owned = node.status().await?.owned_partitions;
        if owned.len() == PARTITIONS as usize {
            return Ok(());
        }
        if Instant::now() > until {
            bail!("one node does not own every partition within {within:?}: {owned:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Asks `node` for every key until each reads `rounds × (i + 1)`; fails with the keys that
/// differ after `within`.
async fn exact(node: &Node, base: &str, rounds: usize, within: Duration) -> anyhow::Result<()> {
    let until = Instant::now() + within;
    loop {
        let mut state = node.state().await?;
        let mut wrong = BTreeMap::new();
        for i in 0..KEYS {
            let key = format!("trips/{base}-{i}");
            let want = (rounds * (i + 1)) as i64;
            match state.get(replica(&key)).await {
                Ok(v) if counter(v.get_ref()) == want => {}
                Ok(v) => {
                    wrong.insert(key, format!("{} (want {want})", counter(&v.into_inner())));
                }
                Err(s) => {
                    wrong.insert(key, format!("{s} (want {want})"));
                }
            }
        }
        if wrong.is_empty() {
            return Ok(());
        }
        if Instant::now() > until {
            bail!(
                "counts at {} not exact within {within:?}: {wrong:?}",
                node.grpc
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Every key under `prefix` with its count, paging through `Scan` at `node` 7 keys at a
/// time.
async fn scan_all(node: &Node, prefix: &str) -> anyhow::Result<BTreeMap<String, i64>> {
    let mut state = node.state().await?;
    let (mut out, mut token) = (BTreeMap::new(), String::new());
    loop {
        let page = state
            .scan(pb::ScanRequest {
                prefix: prefix.to_string(),
                page_token: token,
                limit: 7,
                window: None,
            })
            .await?
            .into_inner();
        for v in &page.values {
            out.insert(v.key.clone(), counter(v));
        }
        if page.next_page_token.is_empty() {
            return Ok(out);
        }
        token = page.next_page_token;
    }
}

/// Two nodes share the partitions; the first leaves and the second takes them all; the
/// first comes back. After each step every key reads exactly what was produced, at either
/// node (one answers, the other routes to it; a `Scan` at either pages through both), and
/// a third node rebuilt from the deltas topic alone reads the same.
#[tokio::test]
async fn counts_stay_exact_as_nodes_join_and_leave() -> anyhow::Result<()> {
    let mut region = Region::new("scale").await?;
    let (mut a, mut b) = (region.node()?, region.node()?);
    let base = region.base.clone();
    let wait = Duration::from_secs(60);

    a.start().await?;
    owns_all(&a, wait).await?;
    region.round(1).await?;
    exact(&a, &base, 1, wait).await?;

    b.start().await?;
    let owned = shared_out(&[&a, &b], wait).await?;
    println!("two nodes share the partitions: {owned:?}");
    region.round(2).await?;
    exact(&a, &base, 2, wait).await?;
    exact(&b, &base, 2, wait).await?;
    // a Scan at either node pages through the keys of both
    let want: BTreeMap<String, i64> = (0..KEYS)
        .map(|i| (format!("trips/{base}-{i}"), (2 * (i + 1)) as i64))
        .collect();
    for node in [&a, &b] {
        assert_eq!(scan_all(node, &format!("trips/{base}-")).await?, want);
    }

    let route = pb::admin_client::AdminClient::connect(b.grpc.clone())
        .await?
        .route(pb::RouteRequest {
            key: format!("trips/{base}-0"),
        })
        .await?
        .into_inner();
    let home = geostate::log::partition_of(route.key.as_bytes(), PARTITIONS);
    let expected = if owned[0].contains(&home) { &a } else { &b };
    assert_eq!(
        format!("http://{}", route.node),
        expected.grpc,
        "Route names the node owning the key's partition"
    );

    let stopping = Instant::now();
    a.terminate(Duration::from_secs(30)).await?;
    let stopped = stopping.elapsed();
    owns_all(&b, wait).await?;
    println!(
        "the first node stopped in {} ms (its partitions handed off); the second owned all {} ms after the stop began",
        stopped.as_millis(),
        stopping.elapsed().as_millis()
    );
    region.round(3).await?;
    exact(&b, &base, 3, wait).await?;
    shipped_all(&b, wait).await?;

    // a's copies miss round 3, which b shipped: a catches them up before it joins, so
    // the partitions it takes merge none of it then, while they are unavailable
    a.start().await?;
    shared_out(&[&a, &b], wait).await?;
    let merged = |by: &str| {
        gauge(
            &a,
            &format!("geostate_catch_up_deltas_total{{by=\"{by}\"}}"),
        )
    };
    ensure!(
        merged("join")? > 0.0 && merged("take")? == 0.0,
        "deltas merged before joining {}, at the takes {}: {}",
        merged("join")?,
        merged("take")?,
        a.log_tail()
    );
    region.round(4).await?;
    exact(&a, &base, 4, wait).await?;
    exact(&b, &base, 4, wait).await?;

    // what the region shipped is exact too: a node with an empty disk rebuilds from it
    a.terminate(Duration::from_secs(30)).await?;
    b.terminate(Duration::from_secs(30)).await?;
    let mut c = region.node()?;
    c.start().await?;
    owns_all(&c, wait).await?;
    exact(&c, &base, 4, wait).await?;
    Ok(())
}

/// A node killed (SIGKILL) in the middle of ingest: once the other node finds its port
/// refusing connections and evicts it from the group, its partitions move to the other node, which catches them up from what the killed node
/// shipped and replays the rest, once. Killed again as soon as it is back, it is evicted
/// again. It comes back and takes its share again with exact counts (whether its copy had anything unshipped depends on where the
/// kill fell; the next test makes sure it has).
#[tokio::test]
async fn a_killed_nodes_partitions_move_and_count_once() -> anyhow::Result<()> {
    let mut region = Region::new("killed").await?;
    let (mut a, mut b) = (region.node()?, region.node()?);
    let base = region.base.clone();
    let wait = Duration::from_secs(90);
    start_pair(&mut a, &mut b, wait).await?;

    // b is killed while a large round is being ingested
    let rounds = 8;
    let mut all = Vec::new();
    for round in 1..=rounds {
        all.extend(events(&base, round));
    }
    produce_all(&region.producer, &region.topics.updates, &all).await?;
    b.kill9();
    let killed = Instant::now();
    owns_all(&a, wait).await?;
    println!(
        "the survivor owned every partition {} ms after the kill (it evicted the killed node from the group)",
        killed.elapsed().as_millis()
    );
    exact(&a, &base, rounds, wait).await?;

    // killed again right after it came back: evicted again, not left to its session
    b.start().await?;
    shared_out(&[&a, &b], wait).await?;
    b.kill9();
    let killed = Instant::now();
    owns_all(&a, wait).await?;
    println!(
        "killed again: the survivor owned every partition {} ms after the kill",
        killed.elapsed().as_millis()
    );
    // each eviction on the first refusals that make it dead, the second as the first: not
    // a second of probes later (it was not held back by the first eviction)
    // the node logs an eviction once its stand-in left the group, which may be after the
    // partitions moved
    let evicted = "refuses connections: removed it from the group";
    let until = Instant::now() + Duration::from_secs(5);
    let mut refusals = a.log_values(evicted, "refusals=", 0).0;
    while refusals.len() < 2 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(100)).await;
        refusals = a.log_values(evicted, "refusals=", 0).0;
    }
    println!("the survivor evicted the killed node after {refusals:?} refusals in a row");
    ensure!(
        refusals.len() == 2 && refusals.iter().all(|&n| n < 10),
        "the twice killed node was evicted after {refusals:?} refusals in a row (the first eviction held back the second)"
    );

    b.start().await?;
    shared_out(&[&a, &b], wait).await?;
    region.round(rounds + 1).await?;
    exact(&a, &base, rounds + 1, wait).await?;
    exact(&b, &base, rounds + 1, wait).await?;
    let log = std::fs::read_to_string(&b.log)?;
    println!(
        "the restarted node: {}",
        log.lines()
            .filter(|l| l.contains("took the partition"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    Ok(())
}

/// A node fenced out of a partition by another that no longer holds it (a take that
/// finished after its node lost the partition: here a producer of the partition's
/// transactional id, made by the test) is still assigned the partition by the group, so
/// no revoke comes: it takes the partition again and counts every write once.
#[tokio::test]
async fn a_node_fenced_by_a_stale_take_takes_its_partition_again() -> anyhow::Result<()> {
    let mut region = Region::new("stale-take").await?;
    let mut a = region.node()?;
    let base = region.base.clone();
    let wait = Duration::from_secs(90);
    a.start().await?;
    owns_all(&a, wait).await?;
    region.round(1).await?;
    exact(&a, &base, 1, wait).await?;

    // the stale take: a shipping producer of partition 0 made as a take makes it, whose
    // init_transactions fences a's
    let _stale = geostate::keeper::ship_producer(&a.config()?, 0).await?;
    // a's next round (a heartbeat within a second) finds it fenced; the group revokes
    // nothing, so a takes partition 0 again
    let until = Instant::now() + wait;
    while gauge(&a, "geostate_partitions_retaken_total")? < 1.0 {
        ensure!(Instant::now() < until, "partition 0 was not taken again");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    region.round(2).await?;
    exact(&a, &base, 2, wait).await?;
    owns_all(&a, wait).await?;
    Ok(())
}

/// `Watch` at one node of two streams the changes of every partition (the other node's
/// through a routed `Watch`), and ends `UNAVAILABLE` once partitions move between them
/// (the other node stops), rather than miss a moving partition's changes silently.
#[tokio::test]
async fn watch_at_one_node_sees_every_partition_and_ends_when_partitions_move() -> anyhow::Result<()>
{
    let mut region = Region::new("watch").await?;
    let (mut a, mut b) = (region.node()?, region.node()?);
    let base = region.base.clone();
    let wait = Duration::from_secs(90);
    let (owned, _) = start_pair(&mut a, &mut b, wait).await?;
    let mut stream = a
        .state()
        .await?
        .watch(pb::WatchRequest {
            prefix: format!("trips/{base}-"),
        })
        .await?
        .into_inner();
    region.round(1).await?;
    let until = tokio::time::Instant::now() + wait;
    let mut seen = BTreeSet::new();
    while seen.len() < KEYS {
        let Some(value) = tokio::time::timeout_at(until, stream.message()).await?? else {
            bail!("the Watch ended after {} keys", seen.len());
        };
        seen.insert(value.key);
    }
    let at_b = seen
        .iter()
        .filter(|k| owned[1].contains(&geostate::log::partition_of(k.as_bytes(), PARTITIONS)))
        .count();
    assert!(at_b > 0, "no key of the other node's partitions: {owned:?}");

    b.terminate(Duration::from_secs(60)).await?;
    let ended = loop {
        match tokio::time::timeout_at(until, stream.message()).await? {
            Ok(Some(_)) => {}
            Ok(None) => bail!("the Watch ended without a reason"),
            Err(status) => break status,
        }
    };
    assert_eq!(ended.code(), tonic::Code::Unavailable, "{ended}");
    assert!(ended.message().contains("moved"), "{ended}");
    Ok(())
}

/// A retry of an update its key's partition applied before the partition moved is
/// skipped by the new owner: the deltas it catches up from carry each key's id window.
/// `a` applies two rounds (every update has an id) and stops; `b`, which never held
/// `a`'s partitions, takes them from the deltas topic, and the same two rounds produced
/// again count nothing anywhere (without the windows `a`'s keys would count them twice).
#[tokio::test]
async fn a_retry_applied_before_its_partition_moved_is_skipped_by_the_new_owner()
-> anyhow::Result<()> {
    let mut region = Region::new("retry").await?;
    let (mut a, mut b) = (region.node()?, region.node()?);
    let base = region.base.clone();
    let wait = Duration::from_secs(90);
    start_pair(&mut a, &mut b, wait).await?;
    let rounds = 2;
    for round in 1..=rounds {
        region.round(round).await?;
    }
    exact(&a, &base, rounds, wait).await?;
    a.terminate(wait).await?;
    owns_all(&b, wait).await?;
    let skipped = gauge(&b, "geostate_events_duplicate_total")?;
    for round in 1..=rounds {
        region.round(round).await?;
    }
    // after the retries on every partition: once it counts, they were all read
    region.round(rounds + 1).await?;
    exact(&b, &base, rounds + 1, wait).await?;
    let retries: usize = (1..=rounds).map(|r| events(&base, r).len()).sum();
    assert_eq!(
        gauge(&b, "geostate_events_duplicate_total")? - skipped,
        retries as f64,
        "every retry skipped"
    );
    Ok(())
}

/// `key`'s count at `node` and the newest eu-west-1 time its freshness says it holds.
async fn eu_applied(node: &Node, key: &str) -> anyhow::Result<(i64, (u64, u32))> {
    let value = node
        .state()
        .await?
        .get(pb::GetRequest {
            key: key.into(),
            leaseholder: false,
            window: None,
        })
        .await?
        .into_inner();
    let remotes = value
        .freshness
        .clone()
        .map(|f| f.remotes)
        .unwrap_or_default();
    let Some(applied) = remotes
        .iter()
        .find(|r| r.region == "eu-west-1")
        .and_then(|r| r.applied.as_ref())
    else {
        return Ok((counter(&value), (0, 0)));
    };
    Ok((counter(&value), (applied.wall_nanos, applied.logical)))
}

/// Waits until `key` reads `(count, applied)` at `node`; fails with what it read last.
async fn reads(
    node: &Node,
    key: &str,
    want: (i64, (u64, u32)),
    within: Duration,
) -> anyhow::Result<()> {
    let until = Instant::now() + within;
    loop {
        let read = eu_applied(node, key).await?;
        if read == want {
            return Ok(());
        }
        if Instant::now() > until {
            bail!("{key} reads (count, eu-west-1 applied) {read:?}, not {want:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A read's freshness is its key's partition's: two us-east-1 nodes merge an eu-west-1
/// node's deltas; eu-west-1 writes every key, then only one key. Another key of the same
/// node still reports the older time, and so it does at the other node once both keys'
/// partitions moved there (the region-wide newest would claim deltas the other key's
/// partition never received).
#[tokio::test]
async fn a_reads_freshness_is_its_partitions_also_after_a_move() -> anyhow::Result<()> {
    let mut region = Region::new("fresh").await?;
    let eu = region.remote().await?;
    let (mut a, mut b) = (region.node_merging(&eu)?, region.node_merging(&eu)?);
    let wait = Duration::from_secs(90);
    let (owned, _) = start_pair(&mut a, &mut b, wait).await?;
    // x: a node owning two partitions or more (of four, one of the two does)
    let (mut x, y, mine) = if owned[0].len() >= 2 {
        (a, b, owned[0].clone())
    } else {
        (b, a, owned[1].clone())
    };
    let base = region.base.clone();
    let key_on = |p: i32| {
        (0..KEYS)
            .map(|i| format!("trips/{base}-{i}"))
            .find(|k| geostate::log::partition_of(k.as_bytes(), PARTITIONS) == p)
    };
    let (Some(hot), Some(cold)) = (key_on(mine[0]), key_on(mine[1])) else {
        bail!("no key on partitions {mine:?}");
    };
    produce_all(&region.producer, &eu.topics.updates, &events(&base, 1)).await?;
    exact(&x, &base, 1, wait).await?;
    let again: Vec<_> = events(&base, 2)
        .into_iter()
        .filter(|(k, _)| k == &hot)
        .collect();
    produce_all(&region.producer, &eu.topics.updates, &again).await?;
    let twice = 2 * again.len() as i64;
    let until = Instant::now() + wait;
    while eu_applied(&x, &hot).await?.0 < twice {
        if Instant::now() > until {
            bail!("{hot} did not count eu-west-1's second round within {wait:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (at_hot, at_cold) = (eu_applied(&x, &hot).await?, eu_applied(&x, &cold).await?);
    assert!(
        at_cold.1 < at_hot.1,
        "{cold} reports eu-west-1 as of {at_cold:?}, as {hot} does ({at_hot:?}), which alone got the later round"
    );

    x.terminate(wait).await?;
    owns_all(&y, wait).await?;
    reads(&y, &hot, at_hot, wait).await?;
    reads(&y, &cold, at_cold, wait).await?;
    Ok(())
}

/// Waits until `node`'s merger of `remote` has read every partition to its end (its last
/// commit marker aside).
async fn merged_to_the_end(node: &Node, remote: &str, within: Duration) -> anyhow::Result<()> {
    let until = Instant::now() + within;
    loop {
        let status = node.status().await?;
        let parts = status
            .remotes
            .iter()
            .find(|r| r.region == remote)
            .map(|r| r.partitions.clone())
            .unwrap_or_default();
        let behind: Vec<_> = parts.iter().filter(|p| p.lag > 1).collect();
        if parts.len() == PARTITIONS as usize && behind.is_empty() {
            return Ok(());
        }
        if Instant::now() > until {
            bail!("{remote}'s deltas not merged to their end within {within:?}: {parts:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// With `standby-replicas = 1` and a remote region, a standby copy holds the remote's
/// deltas too: `a` and `b` of us-east-1 merge an eu-west-1 node's deltas; once `b`'s
/// standby refreshes merged as many of them as `a` merged for its partitions, `a` is
/// killed, and `b` serves `a`'s partitions with every eu-west-1 count exact without its
/// mergers merging one more delta (without the remote part of the refresh they merge
/// every eu-west-1 delta of those partitions after the take).
#[tokio::test]
async fn a_warm_standby_holds_the_remote_regions_deltas_too() -> anyhow::Result<()> {
    let mut region = Region::new("standby-remote").await?;
    let eu = region.remote().await?;
    let (mut a, mut b) = (region.node_merging(&eu)?, region.node_merging(&eu)?);
    for node in [&mut a, &mut b] {
        node.set("replication.standby-replicas", "1");
    }
    let wait = Duration::from_secs(90);
    start_pair(&mut a, &mut b, wait).await?;
    let base = region.base.clone();
    produce_all(&region.producer, &eu.topics.updates, &events(&base, 1)).await?;
    exact(&a, &base, 1, wait).await?;
    exact(&b, &base, 1, wait).await?;

    let merged = "geostate_deltas_merged_total{region=\"eu-west-1\"}";
    let refreshed = "geostate_catch_up_deltas_total{by=\"standby\",region=\"eu-west-1\"}";
    let at_a = gauge(&a, merged)?;
    let until = Instant::now() + wait;
    while gauge(&b, refreshed)? < at_a {
        if Instant::now() > until {
            bail!(
                "b's standby copies merged {} of the {at_a} eu-west-1 deltas a merged, within {wait:?}",
                gauge(&b, refreshed)?
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let before = gauge(&b, merged)?;
    a.kill9();
    owns_all(&b, wait).await?;
    exact(&b, &base, 1, wait).await?;
    merged_to_the_end(&b, "eu-west-1", wait).await?;
    assert_eq!(
        gauge(&b, merged)?,
        before,
        "b's mergers merged eu-west-1 deltas its standby copies should have held"
    );
    Ok(())
}

/// Waits until `node`'s outbox is empty: it shipped everything it applied.
async fn shipped_all(node: &Node, within: Duration) -> anyhow::Result<()> {
    let until = Instant::now() + within;
    while gauge(node, "geostate_outbox_keys")? > 0.0 {
        ensure!(
            Instant::now() < until,
            "the outbox not shipped within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// A node's metric `line` (a name with its labels), 0 if absent.
fn gauge(node: &Node, line: &str) -> anyhow::Result<f64> {
    Ok(common::metric(&node.metrics, &format!("{line} "))?.unwrap_or(0.0))
}

/// With `standby-replicas = 1`, each node keeps the other's partitions warm: once its
/// copies hold every delta the other shipped, the other is killed and the survivor takes
/// its partitions merging no delta at all (without the standby it merges them all then).
#[tokio::test]
async fn a_warm_standby_keeps_a_copy_current_so_a_take_merges_nothing_more() -> anyhow::Result<()> {
    let mut region = Region::new("standby").await?;
    let (mut a, mut b) = (region.node()?, region.node()?);
    for node in [&mut a, &mut b] {
        node.set("replication.standby-replicas", "1");
    }
    let base = region.base.clone();
    let wait = Duration::from_secs(90);
    let (owned, _) = start_pair(&mut a, &mut b, wait).await?;
    let rounds = 3;
    for round in 1..=rounds {
        region.round(round).await?;
    }
    exact(&a, &base, rounds, wait).await?;
    exact(&b, &base, rounds, wait).await?;

    // a shipped everything it applied; b's copies of a's partitions hold it all
    shipped_all(&a, wait).await?;
    let until = Instant::now() + wait;
    loop {
        let mut behind = Vec::new();
        for p in &owned[0] {
            let line = format!("geostate_copy_through{{partition=\"{p}\"}}");
            let (at_a, at_b) = (gauge(&a, &line)?, gauge(&b, &line)?);
            if at_a == 0.0 || at_b < at_a {
                behind.push((p, at_a, at_b));
            }
        }
        if behind.is_empty() {
            break;
        }
        if Instant::now() > until {
            bail!("b's standby copies not current within {wait:?}: (partition, a, b) {behind:?}");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(gauge(&b, "geostate_standby_partitions")? >= 1.0);
    let taken = "geostate_catch_up_deltas_total{by=\"take\"}";
    let before = gauge(&b, taken)?;
    a.kill9();
    owns_all(&b, wait).await?;
    assert_eq!(
        gauge(&b, taken)?,
        before,
        "the take merged deltas its standby copy should have held"
    );
    exact(&b, &base, rounds, wait).await?;
    region.round(rounds + 1).await?;
    exact(&b, &base, rounds + 1, wait).await?;
    Ok(())
}

/// A node applies a round it cannot ship (its deltas topic refuses writes) and is killed.
/// Another node takes every partition and applies the round again from the last resume
/// point, under its own actor, and ships it. When the first node comes back, its copy of
/// the partitions it is given holds increments it never shipped: it discards that copy and
/// rebuilds from the deltas topic, so no key counts the round twice.
#[tokio::test]
async fn a_copy_with_unshipped_increments_is_discarded_when_another_node_shipped_since()
-> anyhow::Result<()> {
    let mut region = Region::new("discard").await?;
    let (mut a, mut b) = (region.node()?, region.node()?);
    let base = region.base.clone();
    let wait = Duration::from_secs(90);

    let stuck = common::unwritable::Unwritable::new(&region.kafka, &region.topics.deltas).await?;
    b.start().await?;
    owns_all(&b, wait).await?;
    region.round(1).await?;
    b.caught_up(wait).await?;
    exact(&b, &base, 1, wait).await?;
    b.kill9();
    drop(stuck);

    a.start().await?;
    owns_all(&a, wait).await?;
    exact(&a, &base, 1, wait).await?;
    // another actor: with b's, a's rounds would look like b's own and nothing be discarded
    let incarnation = |n: &common::Node| n.log_values("node starting", "incarnation=", 0).0;
    assert_ne!(
        incarnation(&a),
        incarnation(&b),
        "a bootstrapped under b's incarnation"
    );

    b.start().await?;
    shared_out(&[&a, &b], wait).await?;
    exact(&b, &base, 1, wait).await?;
    region.round(2).await?;
    exact(&a, &base, 2, wait).await?;
    exact(&b, &base, 2, wait).await?;
    let log = std::fs::read_to_string(&b.log)?;
    // before it joined (catching its copies up) or at its take
    assert!(
        log.lines().any(|l| l.contains("discarding the copy")),
        "the restarted node discarded its copy: {}",
        b.log_tail()
    );
    Ok(())
}

/// A zombie is fenced: a node frozen (SIGSTOP) past the group's session timeout loses its
/// partitions to the other node, whose shipping producers fence its own. Thawed, it gives
/// them up (its assignment lost) or finds its shipper fenced, never ships for them, and
/// the group gives it a share again; every count stays exact at both nodes.
#[tokio::test]
async fn a_node_frozen_past_its_session_is_fenced_and_counts_stay_exact() -> anyhow::Result<()> {
    let mut region = Region::new("zombie").await?;
    let (mut a, mut b) = (region.node()?, region.node()?);
    let base = region.base.clone();
    let wait = Duration::from_secs(90);
    let (_, pid) = start_pair(&mut a, &mut b, wait).await?;
    region.round(1).await?;
    exact(&b, &base, 1, wait).await?;

    {
        let _frozen = Frozen::new(pid)?;
        region.round(2).await?;
        owns_all(&a, wait).await?;
        exact(&a, &base, 2, wait).await?;
    }
    shared_out(&[&a, &b], wait).await?;
    region.round(3).await?;
    exact(&a, &base, 3, wait).await?;
    exact(&b, &base, 3, wait).await?;
    let log = std::fs::read_to_string(&b.log)?;
    let fenced: Vec<&str> = log
        .lines()
        .filter(|l| {
            (l.contains("gave up the partitions") && l.contains("lost=true"))
                || l.contains("another node ships this partition now")
        })
        .collect();
    assert!(
        !fenced.is_empty(),
        "the thawed node gave nothing up: {}",
        b.log_tail()
    );
    println!("the thawed node: {}", fenced.join("\n"));
    Ok(())
}

/// Produces rounds `rounds` of [`events`], one every 100 ms, in the background (so that
/// what the caller does next falls in the middle of ingest).
fn produce_while(region: &Region, rounds: std::ops::RangeInclusive<usize>) -> Background {
    let (producer, topic, base) = (
        region.producer.clone(),
        region.topics.updates.clone(),
        region.base.clone(),
    );
    tokio::spawn(async move {
        for round in rounds {
            produce_all(&producer, &topic, &events(&base, round)).await?;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    })
}

type Background = tokio::task::JoinHandle<anyhow::Result<()>>;

/// What a reader saw at one node while partitions moved: per phase, the reads answered,
/// and the refusals by code and reason.
#[derive(Default)]
struct Reads {
    answered: BTreeMap<&'static str, usize>,
    refused: BTreeMap<&'static str, BTreeMap<(String, String), usize>>,
}

/// Reads every key at `node` in a loop until `stop`, counting under the phase `phase`
/// names at the time; a count above `rounds_at_most × (i + 1)` for key `i` fails it.
fn read_while(
    node: &Node,
    base: &str,
    rounds_at_most: usize,
    phase: tokio::sync::watch::Receiver<&'static str>,
) -> tokio::task::JoinHandle<anyhow::Result<Reads>> {
    let (grpc, base) = (node.grpc.clone(), base.to_owned());
    tokio::spawn(async move {
        let mut state = pb::state_client::StateClient::connect(grpc).await?;
        let mut reads = Reads::default();
        loop {
            for i in 0..KEYS {
                let now = *phase.borrow();
                if now == "done" {
                    return Ok(reads);
                }
                let key = format!("trips/{base}-{i}");
                match state.get(replica(&key)).await {
                    Ok(v) => {
                        let count = counter(v.get_ref());
                        ensure!(
                            count <= (rounds_at_most * (i + 1)) as i64,
                            "{key} read {count}, more than was ever produced"
                        );
                        *reads.answered.entry(now).or_default() += 1;
                    }
                    Err(s) => {
                        // the reason without the key
                        let why = if s.message().contains("is moving") {
                            "partition moving"
                        } else if s.message().contains("ask it") {
                            "owned by another node than the one routed to"
                        } else {
                            s.message().rsplit(": ").next().unwrap_or_default()
                        };
                        *reads
                            .refused
                            .entry(now)
                            .or_default()
                            .entry((format!("{:?}", s.code()), why.to_owned()))
                            .or_default() += 1;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
}

/// Three nodes of a region: a third joins, one is killed (SIGKILL) and one stops while
/// rounds are being ingested. After each step every key reads exactly what was produced
/// at every running node, and a reader at the node that stays sees reads answered in the
/// middle of every move, never a count above what was produced; a read is refused only
/// `UNAVAILABLE` (a partition on its way between nodes).
#[tokio::test]
async fn three_nodes_count_exact_through_a_join_a_kill_and_a_stop() -> anyhow::Result<()> {
    let mut region = Region::new("three").await?;
    let (mut a, mut b, mut c) = (region.node()?, region.node()?, region.node()?);
    let base = region.base.clone();
    let wait = Duration::from_secs(90);
    start_pair(&mut a, &mut b, wait).await?;
    region.round(1).await?;
    exact(&a, &base, 1, wait).await?;
    let last_round = 13;
    let (phase, watched) = tokio::sync::watch::channel("join");
    let reader = read_while(&a, &base, last_round, watched);

    // c joins while rounds 2..=4 are ingested
    let producing = produce_while(&region, 2..=4);
    c.start().await?;
    let owned = shared_out(&[&a, &b, &c], wait).await?;
    println!("three nodes share the partitions: {owned:?}");
    producing.await??;
    for node in [&a, &b, &c] {
        exact(node, &base, 4, wait).await?;
    }

    // c is killed while rounds 5..=9 are ingested
    phase.send_replace("kill");
    let producing = produce_while(&region, 5..=9);
    tokio::time::sleep(Duration::from_millis(250)).await;
    c.kill9();
    let killed = Instant::now();
    shared_out(&[&a, &b], wait).await?;
    println!(
        "a and b own every partition {} ms after the kill",
        killed.elapsed().as_millis()
    );
    // not the session timeout: one of them found c's port refusing and evicted it (counted
    // once its stand-in left the group, which may be after the partitions moved)
    let until = Instant::now() + Duration::from_secs(5);
    let evicted = loop {
        let evicted =
            gauge(&a, "geostate_nodes_evicted_total")? + gauge(&b, "geostate_nodes_evicted_total")?;
        if evicted >= 1.0 || Instant::now() > until {
            break evicted;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(evicted >= 1.0, "c was not evicted from the group");
    producing.await??;
    for node in [&a, &b] {
        exact(node, &base, 9, wait).await?;
    }

    // b stops while rounds 10..=13 are ingested
    phase.send_replace("stop");
    let producing = produce_while(&region, 10..=last_round);
    tokio::time::sleep(Duration::from_millis(150)).await;
    b.terminate(Duration::from_secs(30)).await?;
    owns_all(&a, wait).await?;
    producing.await??;
    exact(&a, &base, last_round, wait).await?;

    phase.send_replace("done");
    let reads = reader.await??;
    println!("reads answered per phase {:?}", reads.answered);
    println!("reads refused per phase {:?}", reads.refused);
    for moving in ["join", "kill", "stop"] {
        assert!(
            reads.answered.get(moving).copied().unwrap_or(0) > 0,
            "no read was answered while partitions moved ({moving})"
        );
    }
    let wrong: Vec<_> = reads
        .refused
        .values()
        .flat_map(BTreeMap::keys)
        .filter(|(code, _)| code != "Unavailable")
        .collect();
    assert!(
        wrong.is_empty(),
        "reads refused other than UNAVAILABLE: {wrong:?}"
    );
    Ok(())
}
