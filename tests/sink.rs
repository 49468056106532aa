//! The PostgreSQL sink against real Kafka, a real PostgreSQL (the cluster's) and the real
//! `geostate` binary: every final window of the outputs topic is one row with its value,
//! after the sink was SIGKILLed inside its PostgreSQL transaction, after PostgreSQL
//! crashed and restarted, and after the node was SIGKILLed; `geostate sink reconcile`
//! finds no difference, and names the ones made by hand.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use common::{Node, Topics, add_one_at, cluster, cluster_script, produce_all, producer, unique};
use geostate::config::RecordFormat;
use geostate::sink::postgres::connect;

const MIN: u64 = 60_000;
const PARTITIONS: i32 = 4;
const WITHIN: Duration = Duration::from_secs(90);

/// `geostate sink postgres` for `node`'s region and topics, into `url`.
struct Sink {
    child: Option<Child>,
    node: (std::path::PathBuf, Vec<String>),
    url: String,
    log: std::path::PathBuf,
}

impl Sink {
    fn start(node: &Node, url: &str, dir: &Path) -> anyhow::Result<Self> {
        let mut sink = Sink {
            child: None,
            node: (node.config.clone(), node.set_args()),
            url: url.to_owned(),
            log: dir.join("sink.log"),
        };
        sink.restart()?;
        Ok(sink)
    }

    fn restart(&mut self) -> anyhow::Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        self.child = Some(
            Command::new(env!("CARGO_BIN_EXE_geostate"))
                .args(["sink", "postgres", "--config"])
                .arg(&self.node.0)
                .args(&self.node.1)
                .args(["--postgres", &self.url])
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()?,
        );
        Ok(())
    }

    fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        text.lines().rev().take(20).collect::<Vec<_>>().join("\n")
    }

    /// `geostate sink reconcile` for the node's region: its exit status and output.
    fn reconcile(&self) -> anyhow::Result<(bool, String)> {
        let out = Command::new(env!("CARGO_BIN_EXE_geostate"))
            .args(["sink", "reconcile", "--config"])
            .arg(&self.node.0)
            .args(&self.node.1)
            .args(["--postgres", &self.url, "--wait-seconds", "60"])
            .output()?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        Ok((out.status.success(), text))
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// The table: (key, window start) → value.
async fn rows(url: &str) -> anyhow::Result<BTreeMap<(String, u64), i64>> {
    let client = connect(url, "tests/sink").await?;
    let rows = client
        .query(
            "SELECT key, window_start_ms, value::int8 FROM geostate_outputs",
            &[],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| ((r.get(0), r.get::<_, i64>(1) as u64), r.get(2)))
        .collect())
}

/// Waits until the table holds every row of `expected` (and fails on any other row).
async fn wait_rows(
    url: &str,
    expected: &BTreeMap<(String, u64), i64>,
    sink: &Sink,
) -> anyhow::Result<()> {
    let until = Instant::now() + WITHIN;
    loop {
        let found = rows(url).await.unwrap_or_default();
        if let Some((k, v)) = found.iter().find(|(k, v)| expected.get(*k) != Some(*v)) {
            bail!("a row nobody expected: {k:?} = {v}; expected {expected:?}");
        }
        if found.len() == expected.len() {
            return Ok(());
        }
        if Instant::now() > until {
            bail!(
                "{} of {} rows within {WITHIN:?}: {found:?}\nsink log:\n{}",
                found.len(),
                expected.len(),
                sink.log_tail()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `n` events of `key` at event time `t`.
fn adds(key: &str, t: u64, n: usize) -> Vec<(String, Vec<u8>)> {
    (0..n)
        .map(|_| add_one_at(key, t, RecordFormat::Json))
        .collect()
}

#[tokio::test]
async fn each_final_window_is_one_row_across_sink_postgres_and_node_crashes() -> anyhow::Result<()>
{
    let cluster = cluster()?;
    let pg = cluster
        .postgres
        .clone()
        .context("the cluster has no PostgreSQL: restart it with `cluster.py down; up`")?;
    let database = unique("sink")
        .to_lowercase()
        .replace(|c: char| !c.is_ascii_alphanumeric(), "_");
    connect(&pg.url, "tests/sink")
        .await?
        .batch_execute(&format!("CREATE DATABASE {database}"))
        .await?;
    let url = format!(
        "host=127.0.0.1 port={} user=geostate dbname={database}",
        pg.port
    );
    let kafka = cluster.regions["us-east-1"].kafka.clone();
    let topics = Topics::create(&kafka, "sink", PARTITIONS).await?;
    let dir = tempfile::tempdir()?;
    let mut node = Node::configure(dir.path(), &kafka, &topics)?;
    node.set("watermark.idle-after", "\"1s\"");
    node.start().await?;
    let mut sink = Sink::start(&node, &url, dir.path())?;
    let producer = producer(&kafka)?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis() as u64;
    let t0 = (now - 50 * MIN) / MIN * MIN;
    let keys: Vec<String> = (0..6).map(|i| unique(&format!("requests/k{i}"))).collect();
    let mut expected = BTreeMap::new();
    // window w of every key gets i + w + 1 events; an event in window `w + 1` makes window
    // w final (lateness 10 s, out-of-orderness 5 s)
    let window = |w: u64, expected: &mut BTreeMap<(String, u64), i64>| {
        let mut events = Vec::new();
        for (i, key) in keys.iter().enumerate() {
            let n = i + w as usize + 1;
            events.extend(adds(key, t0 + w * MIN + 30_000, n));
            expected.insert((key.clone(), t0 + w * MIN), n as i64);
        }
        events
    };

    // 1. the sink writes final windows
    let mut events = window(0, &mut expected);
    events.extend(window(1, &mut expected));
    // window 2's events close windows 0 and 1; window 2 stays open until window 3's
    let mut open = BTreeMap::new();
    events.extend(window(2, &mut open));
    produce_all(&producer, &topics.updates, &events).await?;
    wait_rows(&url, &expected, &sink).await?;

    // 2. SIGKILL inside the sink's PostgreSQL transaction: its offsets upsert waits on a
    // lock this test holds, after its rows were written in the same transaction
    let mut locker = connect(&url, "tests/sink").await?;
    let lock = locker.transaction().await?;
    lock.batch_execute("LOCK TABLE geostate_sink_offsets IN ACCESS EXCLUSIVE MODE")
        .await?;
    expected.append(&mut open);
    let events = window(3, &mut open);
    produce_all(&producer, &topics.updates, &events).await?;
    let watcher = connect(&pg.url, "tests/sink").await?;
    let until = Instant::now() + WITHIN;
    loop {
        let waiting = watcher
            .query(
                "SELECT pid FROM pg_stat_activity WHERE datname = $1 AND application_name LIKE 'geostate-sink%' AND wait_event_type = 'Lock'",
                &[&database],
            )
            .await?;
        if !waiting.is_empty() {
            break;
        }
        if Instant::now() > until {
            bail!(
                "the sink never waited on the offsets lock; log:\n{}",
                sink.log_tail()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    sink.kill9();
    lock.rollback().await?;
    drop(locker);
    // the killed sink's backend goes on, finds no COMMIT and rolls back
    let until = Instant::now() + WITHIN;
    while !watcher
        .query(
            "SELECT pid FROM pg_stat_activity WHERE datname = $1 AND application_name LIKE 'geostate-sink%'",
            &[&database],
        )
        .await?
        .is_empty()
    {
        if Instant::now() > until {
            bail!("the killed sink's backend is still there");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let after_kill = rows(&url).await?;
    let window_2 = t0 + 2 * MIN;
    assert!(
        after_kill.keys().all(|(_, start)| *start < window_2),
        "rows of the killed transaction were committed: {after_kill:?}"
    );
    sink.restart()?;
    wait_rows(&url, &expected, &sink).await?;

    // 3. PostgreSQL crashes (SIGKILL) while windows go final, and starts again
    expected.append(&mut open);
    let events = window(4, &mut open);
    cluster_script(&["postgres", "kill"])?;
    produce_all(&producer, &topics.updates, &events).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    cluster_script(&["postgres", "start"])?;
    wait_rows(&url, &expected, &sink).await?;

    // 4. the node SIGKILLed and restarted on its disk
    node.kill9();
    node.start().await?;
    expected.append(&mut open);
    let events = window(5, &mut open);
    produce_all(&producer, &topics.updates, &events).await?;
    wait_rows(&url, &expected, &sink).await?;

    let (clean, report) = sink.reconcile()?;
    assert!(clean, "reconcile after the faults: {report}");
    assert!(report.contains(" 0 differences"), "{report}");

    // differences made by hand are named
    let client = connect(&url, "tests/sink").await?;
    let (changed, deleted) = (&keys[1], &keys[2]);
    client
        .execute(
            "UPDATE geostate_outputs SET value = value + 100 WHERE key = $1 AND window_start_ms = $2",
            &[changed, &(t0 as i64)],
        )
        .await?;
    client
        .execute(
            "DELETE FROM geostate_outputs WHERE key = $1 AND window_start_ms = $2",
            &[deleted, &((t0 + MIN) as i64)],
        )
        .await?;
    let (clean, report) = sink.reconcile()?;
    assert!(!clean, "reconcile missed the differences: {report}");
    assert!(
        report.contains(&format!("{changed} is 102 in the table, 2 in the topics")),
        "{report}"
    );
    assert!(
        report.contains(&format!("{deleted} missing from the table")),
        "{report}"
    );
    assert!(report.contains(" 2 differences"), "{report}");
    drop(sink);
    node.terminate(Duration::from_secs(30)).await?;
    Ok(())
}
