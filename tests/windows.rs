//! Event-time windows across two regions, on real Kafka and RocksDB: events count in the
//! window of their event time, wherever and in whatever order they arrive; a window is
//! final once both regions' watermarks passed its close, and then reads the same in both;
//! an event for a closed window is late: refused, kept once in the late topic with why,
//! never counted, also after a restart (the watermark is stored with the state).

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use common::{Node, Output, Topics, cluster, counter, produce_all, producer, read_outputs, unique};
use geostate::ingest::event::{Op, Update};
use geostate::pb;
use geostate::pb::state_client::StateClient;
use geostate::pb::window_selector::Which;
use rdkafka::Message;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Headers;
use tonic::Code;
use tonic::transport::Channel;

const MIN: u64 = 60_000;

fn add(key: &str, n: i64, event_time_ms: u64, id: &str) -> pb::UpdateRequest {
    pb::UpdateRequest {
        key: key.into(),
        op: Some(pb::update_request::Op::Add(n)),
        id: id.into(),
        event_time_ms,
    }
}

fn at(start_ms: u64) -> Option<pb::WindowSelector> {
    Some(pb::WindowSelector {
        which: Some(Which::StartMs(start_ms)),
    })
}

async fn window(
    state: &mut StateClient<Channel>,
    key: &str,
    selector: Option<pb::WindowSelector>,
) -> anyhow::Result<pb::Value> {
    Ok(state
        .get(pb::GetRequest {
            key: key.into(),
            leaseholder: false,
            window: selector,
        })
        .await?
        .into_inner())
}

/// Reads the window starting at `start_ms` until it is final (an error after `within`).
async fn final_window(
    state: &mut StateClient<Channel>,
    key: &str,
    start_ms: u64,
    within: Duration,
) -> anyhow::Result<pb::Value> {
    let deadline = Instant::now() + within;
    loop {
        let v = window(state, key, at(start_ms)).await?;
        if v.window.as_ref().is_some_and(|w| w.is_final) {
            return Ok(v);
        }
        if Instant::now() > deadline {
            bail!("the window at {start_ms} of {key} not final within {within:?}: {v:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every record of a one-partition topic, read committed to its end: (key, headers).
fn whole_topic(
    kafka: &str,
    topic: &str,
) -> anyhow::Result<Vec<(String, BTreeMap<String, String>)>> {
    let consumer: BaseConsumer = common::kafka_config(kafka)
        .set("group.id", unique("late-reader"))
        .set("isolation.level", "read_committed")
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()?;
    let mut assignment = rdkafka::TopicPartitionList::new();
    assignment.add_partition_offset(topic, 0, rdkafka::Offset::Beginning)?;
    consumer.assign(&assignment)?;
    let (_, high) = consumer.fetch_watermarks(topic, 0, Duration::from_secs(10))?;
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let position = consumer
            .position()?
            .find_partition(topic, 0)
            .and_then(|p| p.offset().to_raw());
        if position.is_some_and(|p| p >= high) || high == 0 {
            return Ok(out);
        }
        ensure!(
            Instant::now() < deadline,
            "{topic} not read to {high} within 30 s"
        );
        if let Some(message) = consumer.poll(Duration::from_millis(200)) {
            let message = message?;
            let headers = message.headers().map_or_else(BTreeMap::new, |h| {
                h.iter()
                    .map(|h| {
                        let v = h.value.map(String::from_utf8_lossy).unwrap_or_default();
                        (h.key.to_owned(), v.into_owned())
                    })
                    .collect()
            });
            let key = message
                .key()
                .map(String::from_utf8_lossy)
                .unwrap_or_default();
            out.push((key.into_owned(), headers));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn windows_close_alike_in_both_regions_and_late_events_are_kept_once() -> anyhow::Result<()> {
    let cluster = cluster()?;
    let kafka = cluster.regions["us-east-1"].kafka.clone();
    let (ta, tb) = (
        Topics::create(&kafka, "win-a", 2).await?,
        Topics::create(&kafka, "win-b", 2).await?,
    );
    let (dir_a, dir_b) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let (mut a, mut b) = Node::pair(&kafka, (&ta, &tb), (dir_a.path(), dir_b.path()))?;
    a.start().await?;
    b.start().await?;
    let (mut sa, mut sb) = (a.state().await?, b.state().await?);
    let key = format!("requests/{}", unique("9q8yy"));

    // minute 10 in both regions, out of order with minute 11
    sa.update(add(&key, 1, 10 * MIN + 5, "a-1")).await?;
    sa.update(add(&key, 2, 11 * MIN, "")).await?;
    sa.update(add(&key, 4, 10 * MIN + 59_999, "")).await?;
    // a retry of an acknowledged write counts once
    sa.update(add(&key, 1, 10 * MIN + 5, "a-1")).await?;
    sb.update(add(&key, 8, 10 * MIN + 30_000, "")).await?;
    // minute 12 moves both watermarks past minute 10's close (11:10) and 11's (12:10)
    sa.update(add(&key, 16, 12 * MIN + 20_000, "")).await?;
    sb.update(add(&key, 32, 12 * MIN + 20_000, "")).await?;

    // minute 10 is final, and the same, in both regions
    for state in [&mut sa, &mut sb] {
        let v = final_window(state, &key, 10 * MIN, Duration::from_secs(30)).await?;
        ensure!(counter(&v) == 1 + 4 + 8, "minute 10: {v:?}");
        let w = v.window.context("a window")?;
        ensure!(
            (w.start_ms, w.end_ms, w.closes_at_ms) == (10 * MIN, 11 * MIN, 11 * MIN + 10_000),
            "{w:?}"
        );
        let v = final_window(state, &key, 11 * MIN, Duration::from_secs(30)).await?;
        ensure!(counter(&v) == 2, "minute 11: {v:?}");
    }
    // and each region's outputs topic holds each final window once, with that value
    for (topics, region) in [(&ta, "us-east-1"), (&tb, "eu-west-1")] {
        let mut found =
            read_outputs(&kafka, &topics.outputs, 2, 2, Duration::from_secs(30)).await?;
        found.sort();
        let output = |start_ms, value| Output {
            key: key.clone(),
            start_ms,
            end_ms: start_ms + MIN,
            value,
            region: region.into(),
            epoch: 0,
        };
        ensure!(
            found == [output(10 * MIN, 1 + 4 + 8), output(11 * MIN, 2)],
            "{region}: {found:?}"
        );
    }
    // minute 12 is open: each region's own watermark (12:15) is short of its close
    let open = window(&mut sa, &key, at(12 * MIN)).await?;
    let w = open.window.clone().context("a window")?;
    let behind: Vec<&str> = w.behind.iter().map(|r| r.region.as_str()).collect();
    ensure!(
        !w.is_final && behind == ["us-east-1", "eu-west-1"],
        "{open:?}"
    );
    // the current window is minute 12, the latest final one minute 11
    let current = window(&mut sa, &key, None).await?;
    ensure!(
        current.window.map(|w| w.start_ms) == Some(12 * MIN),
        "current"
    );
    let latest = window(
        &mut sa,
        &key,
        Some(pb::WindowSelector {
            which: Some(Which::LatestFinal(true)),
        }),
    )
    .await?;
    ensure!(
        latest.window.map(|w| w.start_ms) == Some(11 * MIN),
        "latest final"
    );

    // late: through the API (refused, saying why) and straight into the updates topic
    let refused = sa
        .update(add(&key, 64, 10 * MIN + 1, "late-1"))
        .await
        .expect_err("a late event is refused");
    ensure!(
        refused.code() == Code::FailedPrecondition && refused.message().contains("late"),
        "{refused:?}"
    );
    let config = a.config()?;
    let late = Update {
        key: key.clone(),
        op: Op::Add(128),
        id: None,
        event_time_ms: Some(11 * MIN + 1),
        hlc: None,
        epoch: None,
    };
    produce_all(
        &producer(&kafka)?,
        &ta.updates,
        &[(key.clone(), late.encode(config.kafka.format))],
    )
    .await?;

    // a restart keeps the watermark: minute 10 stays closed
    a.terminate(Duration::from_secs(30)).await?;
    a.start().await?;
    let mut sa = a.state().await?;
    let refused = sa.update(add(&key, 256, 10 * MIN + 2, "")).await;
    ensure!(
        refused
            .as_ref()
            .is_err_and(|s| s.code() == Code::FailedPrecondition),
        "after a restart: {refused:?}"
    );
    sa.update(add(&key, 512, 12 * MIN + 1, "")).await?;

    // the late events are in the late topic once each, with why; none counted
    let deadline = Instant::now() + Duration::from_secs(30);
    let letters = loop {
        let letters = whole_topic(&kafka, &ta.late)?;
        if letters.len() >= 3 || Instant::now() > deadline {
            break letters;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let times: Vec<&str> = letters
        .iter()
        .map(|(_, h)| h.get("geostate.event-time").map_or("", String::as_str))
        .collect();
    let expected = [10 * MIN + 1, 11 * MIN + 1, 10 * MIN + 2].map(|t| t.to_string());
    ensure!(times == expected, "late topic: {letters:?}");
    for (k, headers) in &letters {
        ensure!(k == &key, "{k}");
        ensure!(
            headers.get("geostate.error.code").map(String::as_str) == Some("late")
                && headers.contains_key("geostate.watermark")
                && headers.contains_key("geostate.source"),
            "{headers:?}"
        );
    }
    for state in [&mut sa, &mut sb] {
        let ten = window(state, &key, at(10 * MIN)).await?;
        let eleven = window(state, &key, at(11 * MIN)).await?;
        ensure!(
            (counter(&ten), counter(&eleven)) == (13, 2),
            "late events never count: {ten:?} {eleven:?}"
        );
    }

    // a range reads one value per window, oldest first; a scan names the key, not slices
    let range = sb
        .batch_get(pb::BatchGetRequest {
            keys: vec![key.clone()],
            window: range_selector(10 * MIN, 13 * MIN),
        })
        .await?
        .into_inner();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut values: Vec<i64> = range.values.iter().map(counter).collect();
    while values != [13, 2, 16 + 32 + 512] {
        ensure!(Instant::now() < deadline, "range: {values:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
        let again = sb
            .batch_get(pb::BatchGetRequest {
                keys: vec![key.clone()],
                window: range_selector(10 * MIN, 13 * MIN),
            })
            .await?
            .into_inner();
        values = again.values.iter().map(counter).collect();
    }
    let page = sb
        .scan(pb::ScanRequest {
            prefix: key.clone(),
            page_token: String::new(),
            limit: 10,
            window: None,
        })
        .await?
        .into_inner();
    let keys: Vec<&str> = page.values.iter().map(|v| v.key.as_str()).collect();
    ensure!(keys == [key.as_str()], "scan: {keys:?}");

    // the operator replays the late events into minute 12, still open: they count once,
    // however often replayed
    for _ in 0..2 {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_geostate"))
            .args(["dlq", "replay", "--config"])
            .arg(&a.config)
            .args(a.set_args())
            .args(["--event-time", &(12 * MIN + 30_000).to_string()])
            .output()?;
        let said = String::from_utf8_lossy(&out.stdout);
        ensure!(
            out.status.success() && said.contains("replayed 3 records"),
            "dlq replay: {said} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        a.caught_up(Duration::from_secs(30)).await?;
        let twelve = window(&mut sa, &key, at(12 * MIN)).await?;
        ensure!(
            counter(&twelve) == 16 + 32 + 512 + 64 + 128 + 256,
            "after the replay: {twelve:?}"
        );
    }

    a.terminate(Duration::from_secs(30)).await?;
    b.terminate(Duration::from_secs(30)).await?;
    Ok(())
}

/// An event time from a clock far ahead (a year, or microseconds taken for milliseconds)
/// is refused, through `Update` with `OUT_OF_RANGE` and from the updates topic to the
/// dead-letter topic with its code, and counted; it never raises the watermark, so the
/// partition's next event, a second old, still counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_time_ahead_of_the_clock_is_refused_and_moves_no_watermark() -> anyhow::Result<()>
{
    let cluster = cluster()?;
    let kafka = cluster.regions["us-east-1"].kafka.clone();
    let topics = Topics::create(&kafka, "win-ahead", 1).await?;
    let dir = tempfile::tempdir()?;
    let mut node = Node::configure(dir.path(), &kafka, &topics)?;
    node.start().await?;
    let mut state = node.state().await?;
    let key = format!("requests/{}", unique("9q8yy"));
    let now = common::now_ms();

    let refused = state
        .update(add(&key, 1, now + 365 * 24 * 3_600_000, ""))
        .await
        .expect_err("a year ahead is refused");
    ensure!(
        refused.code() == Code::OutOfRange && refused.message().contains("max-clock-offset"),
        "{refused:?}"
    );
    let micros = Update {
        key: key.clone(),
        op: Op::Add(2),
        id: None,
        event_time_ms: Some(now * 1_000),
        hlc: None,
        epoch: None,
    };
    let format = node.config()?.kafka.format;
    produce_all(
        &producer(&kafka)?,
        &topics.updates,
        &[(key.clone(), micros.encode(format))],
    )
    .await?;
    // after it in the partition's log: late, had it raised the watermark
    let recent = now - 1_000;
    state.update(add(&key, 4, recent, "")).await?;
    let v = window(&mut state, &key, at(recent - recent % MIN)).await?;
    ensure!(counter(&v) == 4, "{v:?}");

    let letters =
        common::dead_letters(&kafka, &topics.dlq, 1, Duration::from_secs(30), |_| true).await?;
    let codes: Vec<_> = (letters.iter())
        .map(|l| (l.key.as_deref(), l.header("geostate.error.code")))
        .collect();
    ensure!(
        codes == [(Some(key.as_str()), Some("event_time_ahead"))],
        "{codes:?}"
    );
    let metrics = common::http_get(&node.metrics, "/metrics")?;
    ensure!(
        metrics.contains("geostate_events_dead_lettered_total{reason=\"event_time_ahead\"} 1"),
        "{metrics}"
    );
    Ok(())
}

/// Region B never writes the key's partition: its watermark there would never move, and
/// would hold the window open in both regions. B's node moves the idle partition to A's
/// watermark for it (a watermark record in B's log), and the window closes everywhere;
/// B's `Watch` reports it final.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_closes_though_one_region_never_writes_its_partition() -> anyhow::Result<()> {
    let cluster = cluster()?;
    let kafka = cluster.regions["us-east-1"].kafka.clone();
    let (ta, tb) = (
        Topics::create(&kafka, "idle-a", 2).await?,
        Topics::create(&kafka, "idle-b", 2).await?,
    );
    let (dir_a, dir_b) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let (mut a, mut b) = Node::pair(&kafka, (&ta, &tb), (dir_a.path(), dir_b.path()))?;
    for node in [&mut a, &mut b] {
        node.set("watermark.idle-after", "\"1s\"");
        node.start().await?;
    }
    let (mut sa, mut sb) = (a.state().await?, b.state().await?);
    let key = format!("requests/{}", unique("idle"));
    // B's watchers hear when the window closes
    let mut watch = sb
        .watch(pb::WatchRequest {
            prefix: key.clone(),
        })
        .await?
        .into_inner();
    sa.update(add(&key, 3, 10 * MIN, "")).await?;
    sa.update(add(&key, 5, 12 * MIN, "")).await?;
    for state in [&mut sa, &mut sb] {
        let v = final_window(state, &key, 10 * MIN, Duration::from_secs(30)).await?;
        ensure!(counter(&v) == 3, "{v:?}");
    }
    let closed = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(v) = watch.message().await? {
            if v.window.as_ref().is_some_and(|w| w.is_final) {
                return anyhow::Ok(v);
            }
        }
        bail!("the watch ended")
    })
    .await
    .context("no final window watched within 10 s")??;
    ensure!(
        closed.key == key
            && counter(&closed) == 3
            && closed.window.as_ref().map(|w| w.start_ms) == Some(10 * MIN),
        "watched {closed:?}"
    );
    // B judges by the watermark it took: an event for minute 10 is late there too
    let refused = sb.update(add(&key, 7, 10 * MIN + 1, "")).await;
    ensure!(
        refused
            .as_ref()
            .is_err_and(|s| s.code() == Code::FailedPrecondition),
        "{refused:?}"
    );
    a.terminate(Duration::from_secs(30)).await?;
    b.terminate(Duration::from_secs(30)).await?;
    Ok(())
}

/// What an uninterrupted run decides for `events` (event times of one key, in log
/// order) with the region file's windows (1 min tumbling, 10 s lateness) and watermark
/// (5 s out of order): the count per window start, and how many are late.
fn uninterrupted(events: &[u64]) -> (BTreeMap<u64, i64>, usize) {
    let (mut counts, mut late, mut watermark) = (BTreeMap::new(), 0, None::<u64>);
    for &t in events {
        let start = t - t % MIN;
        if watermark.is_some_and(|w| w >= start + MIN + 10_000) {
            late += 1;
            continue;
        }
        *counts.entry(start).or_default() += 1;
        watermark = Some(watermark.unwrap_or(0).max(t.saturating_sub(5_000)));
    }
    (counts, late)
}

/// Windowed events with skewed event times, some late, into a node that checkpoints to
/// S3 every second; it is killed mid-stream, its disk wiped, and it restores the newest
/// checkpoint: every window reads what an uninterrupted run counts, and every late event
/// is in the late topic exactly once (the restored outbox's late events that a committed
/// round had shipped are not shipped again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_mid_window_counts_as_an_uninterrupted_run() -> anyhow::Result<()> {
    let cluster = cluster()?;
    let kafka = cluster.regions["us-east-1"].kafka.clone();
    let topics = Topics::create(&kafka, "win-ckpt", 2).await?;
    let dir = tempfile::tempdir()?;
    let mut node = Node::configure(dir.path(), &kafka, &topics)?;
    node.set("checkpoint.interval", "\"1s\"");
    node.set("checkpoint.restore-on-empty", "true");
    node.checkpoint_to_s3(
        &cluster.s3,
        &cluster.s3.endpoint,
        &format!("{}/", unique("win")),
    );
    let format = node.config()?.kafka.format;

    // 200 ms apart in event time, each up to 3 s early, one in ten up to 90 s: late
    let base = 1_700_000_000_000 - 1_700_000_000_000 % MIN;
    let mut rng = geostate::workload::Rng(0x005e_ed0f_1a7e);
    let times: Vec<u64> = (0..6_000u64)
        .map(|i| {
            let early = if rng.below(10) == 0 { 90_000 } else { 3_000 };
            base + 90_000 + i * 200 - rng.below(early)
        })
        .collect();
    let (expected, late) = uninterrupted(&times);
    ensure!(late > 50, "the events hold late ones: {late}");
    let key = format!("requests/{}", unique("ckpt"));
    let records: Vec<(String, Vec<u8>)> = times
        .iter()
        .map(|&t| common::add_one_at(&key, t, format))
        .collect();
    let (first, second) = records.split_at(4_000);

    node.start().await?;
    let producer = producer(&kafka)?;
    let feed = {
        let (producer, topic, first) = (producer.clone(), topics.updates.clone(), first.to_vec());
        tokio::spawn(async move {
            for chunk in first.chunks(100) {
                produce_all(&producer, &topic, chunk).await?;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            anyhow::Ok(())
        })
    };
    let until = Instant::now() + Duration::from_secs(120);
    loop {
        let status = node.status().await?;
        let taken = status.checkpoint.as_ref().map_or(0, |c| c.taken);
        if taken >= 2 && status.events_applied >= 1_500 {
            break;
        }
        ensure!(
            Instant::now() < until,
            "no two checkpoints within 120 s: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    node.kill9();
    std::fs::remove_dir_all(dir.path().join("data"))?;
    feed.await??;
    node.start().await?;
    let restored = node
        .status()
        .await?
        .checkpoint
        .context("checkpoint status")?;
    ensure!(
        restored.restored_from.starts_with("checkpoint "),
        "not restored from a checkpoint: {restored:?}"
    );
    produce_all(&producer, &topics.updates, second).await?;
    node.caught_up(Duration::from_secs(120)).await?;

    let mut state = node.state().await?;
    let (from, to) = (
        *expected.keys().next().context("a window")?,
        *expected.keys().last().context("a window")? + MIN,
    );
    let read = state
        .batch_get(pb::BatchGetRequest {
            keys: vec![key.clone()],
            window: range_selector(from, to),
        })
        .await?
        .into_inner();
    let got: BTreeMap<u64, i64> = read
        .values
        .iter()
        .filter_map(|v| Some((v.window.as_ref()?.start_ms, counter(v))))
        .filter(|(_, n)| *n != 0)
        .collect();
    ensure!(
        got == expected,
        "windows after the restore {got:?}, uninterrupted {expected:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let letters = whole_topic(&kafka, &topics.late)?;
        let sources: std::collections::BTreeSet<&str> = letters
            .iter()
            .filter_map(|(_, h)| h.get("geostate.source").map(String::as_str))
            .collect();
        ensure!(
            sources.len() == letters.len(),
            "a late event shipped twice: {} records, {} distinct",
            letters.len(),
            sources.len()
        );
        if letters.len() == late {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "{} late events in the late topic, {late} expected",
            letters.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    node.terminate(Duration::from_secs(30)).await?;
    Ok(())
}

fn range_selector(from_ms: u64, to_ms: u64) -> Option<pb::WindowSelector> {
    Some(pb::WindowSelector {
        which: Some(Which::Range(pb::WindowRange { from_ms, to_ms })),
    })
}
