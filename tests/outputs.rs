//! The outputs topic against real Kafka and the real `geostate` binary: every final window
//! of an output namespace is produced once, in the shipping transaction that saw it final,
//! and a `read_committed` reader finds each window once with its value, also after the
//! node was SIGKILLed and restarted on its disk; every accepted write of an owned register
//! that outputs its changes is there once, with its lease epoch.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{
    Node, Output, Topics, add_one_at, cluster, produce_all, producer, read_output_records,
    read_outputs, unique,
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
        epoch: 0,
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

/// `prices/` (an owned register, `output = "register-changes"` in the region files) on the
/// cluster's lease group: a value that is no window result is refused; each accepted
/// write is in the holder region's outputs topic once, with the lease epoch it was
/// written under, and the regions' sinks write it into PostgreSQL with that epoch.
#[tokio::test]
async fn each_accepted_owned_write_goes_out_once_with_its_lease_epoch() -> anyhow::Result<()> {
    use common::failover::{epoch_of, regions, set, wait_held, write_until_accepted};
    let cluster = cluster()?;
    let (mut regions, lease) = regions(&cluster).await?;
    let home = regions[0].name.clone();
    let label = unique("gh");
    let key = (0..)
        .map(|i| format!("prices/{label}-{i}"))
        .find(|k| {
            lease
                .home_of(lease.shard_of_key(k))
                .is_some_and(|h| h.as_str() == home)
        })
        .expect("every region is some shard's home");
    wait_held(
        &mut regions[0],
        lease.shard_of_key(&key),
        Duration::from_secs(60),
    )
    .await?;
    let refused = regions[0]
        .state
        .update(set(&key, "1.5"))
        .await
        .expect_err("a value that is no window result");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("window result"), "{refused:?}");
    let result = |start: u64, value: i64| {
        format!(
            r#"{{"start_ms":{start},"end_ms":{},"value":{value}}}"#,
            start + MIN
        )
    };
    let within = Duration::from_secs(30);
    let (_, first) = write_until_accepted(&mut regions[0], &key, &result(0, 15), within).await?;
    let (_, second) = write_until_accepted(&mut regions[0], &key, &result(MIN, 20), within).await?;
    let epoch = epoch_of(&first);
    assert!(epoch > 0 && epoch_of(&second) == epoch);

    let kafka = cluster.regions[&home].kafka.clone();
    let until = std::time::Instant::now() + Duration::from_secs(60);
    let mine = loop {
        let all = read_output_records(&kafka, "geostate.outputs", PARTITIONS, 0, within).await?;
        let mine: Vec<Output> = all
            .into_iter()
            .filter(|o| o["key"] == key.as_str())
            .map(serde_json::from_value)
            .collect::<Result<_, _>>()?;
        if mine.len() >= 2 || std::time::Instant::now() > until {
            break mine;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let output = |start: u64, value| Output {
        key: key.clone(),
        start_ms: start,
        end_ms: start + MIN,
        value,
        region: home.clone(),
        epoch,
    };
    // each window's record is keyed `<key>@<start>`: the two may be on two partitions,
    // so a reader may find them in either order
    let mut mine = mine;
    mine.sort();
    assert_eq!(mine, [output(0, 15), output(MIN, 20)], "each write once");

    if let Some(pg) = &cluster.postgres {
        let client = geostate::sink::postgres::connect(&pg.url, "tests/outputs").await?;
        let rows = loop {
            let rows: Vec<(i64, i64, i64)> = client
                .query(
                    "SELECT window_start_ms, value::int8, epoch FROM geostate_outputs WHERE key = $1 ORDER BY 1",
                    &[&key],
                )
                .await?
                .iter()
                .map(|r| (r.get(0), r.get(1), r.get(2)))
                .collect();
            if rows.len() >= 2 || std::time::Instant::now() > until {
                break rows;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let epoch = epoch as i64;
        assert_eq!(rows, [(0, 15, epoch), (MIN as i64, 20, epoch)]);
    }
    Ok(())
}
