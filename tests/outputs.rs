//! The outputs topic against real Kafka and the real `geostate` binary: every final window
//! of an output namespace is produced once, in the shipping transaction that saw it final,
//! and a `read_committed` reader finds each window once with its value, also after the
//! node was SIGKILLed and restarted on its disk.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{
    Node, Output, Topics, add_one_at, cluster, produce_all, producer, read_outputs, unique,
};
use geostate::config::RecordFormat;

const MIN: u64 = 60_000;
const PARTITIONS: i32 = 4;

/// Events of one key at event time `t`, `n` of them.
fn adds(key: &str, t: u64, n: usize) -> Vec<(String, Vec<u8>)> {
    (0..n)
        .map(|_| add_one_at(key, t, RecordFormat::Json))
        .collect()
}

/// `requests/` (1-minute windows, 10 s lateness, 5 s out-of-orderness) outputs its final
/// windows: each once, with the sum of its events; a window not final yet is not out; and
/// after a SIGKILL and a restart the node goes on from where its rounds left the outputs.
#[tokio::test]
async fn each_final_window_goes_out_once_also_after_a_kill() -> anyhow::Result<()> {
    let cluster = cluster()?;
    let kafka = cluster.regions["us-east-1"].kafka.clone();
    let topics = Topics::create(&kafka, "outputs", PARTITIONS).await?;
    let dir = tempfile::tempdir()?;
    let mut node = Node::configure(dir.path(), &kafka, &topics)?;
    // partitions without events follow the others' watermark soon
    node.set("watermark.idle-after", "\"1s\"");
    node.start().await?;
    let producer = producer(&kafka)?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis() as u64;
    // minute windows well inside the hour kept, on the grid
    let t0 = (now - 20 * MIN) / MIN * MIN;
    let (a, b, c, d) = (
        unique("requests/a"),
        unique("requests/b"),
        unique("requests/c"),
        unique("requests/d"),
    );
    let mut first = adds(&a, t0 + 1_000, 3);
    first.extend(adds(&b, t0 + 2_000, 2));
    // moves the watermark past [t0, t0 + 1m)'s close; its own window stays open
    first.extend(adds(&c, t0 + 5 * MIN, 1));
    produce_all(&producer, &topics.updates, &first).await?;
    let output = |key: &str, start: u64, value| Output {
        key: key.to_owned(),
        start_ms: start,
        end_ms: start + MIN,
        value,
        region: "us-east-1".into(),
    };
    let mut expected = vec![output(&a, t0, 3), output(&b, t0, 2)];
    expected.sort();
    let within = Duration::from_secs(60);
    let mut found =
        read_outputs(&kafka, &topics.outputs, PARTITIONS, expected.len(), within).await?;
    found.sort();
    assert_eq!(found, expected, "the final windows, each once; c's is open");

    node.kill9();
    node.start().await?;
    // d's window opens after the watermark; a later event closes c's and d's
    let mut second = adds(&d, t0 + 6 * MIN + 1_000, 1);
    second.extend(adds(&a, t0 + 9 * MIN, 1));
    produce_all(&producer, &topics.updates, &second).await?;
    expected.extend([output(&c, t0 + 5 * MIN, 1), output(&d, t0 + 6 * MIN, 1)]);
    expected.sort();
    let mut found =
        read_outputs(&kafka, &topics.outputs, PARTITIONS, expected.len(), within).await?;
    found.sort();
    let mut per_window: BTreeMap<(String, u64), usize> = BTreeMap::new();
    for o in &found {
        *per_window.entry((o.key.clone(), o.start_ms)).or_default() += 1;
    }
    assert!(
        per_window.values().all(|&n| n == 1),
        "no window twice after the restart: {per_window:?}"
    );
    assert_eq!(found, expected);
    node.terminate(Duration::from_secs(30)).await?;
    Ok(())
}
