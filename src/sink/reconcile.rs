//! `geostate sink reconcile`: the outputs topics of the regions against the PostgreSQL
//! table, window by window (count and digest), naming every difference.
//!
//! ```text
//!  each region's outputs topic, read_committed to its end ──► per (key, window): the
//!       result with the highest (epoch, version); a window twice in one topic, or two
//!       regions with different values at one (epoch, version), is a difference
//!  wait until each region's sink offsets in PostgreSQL reach the topic's end
//!  geostate_outputs ──► per window start: count and digest on both sides; where they
//!       differ, every key missing, extra or different
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use super::postgres::{connect, stored_offsets};
use super::{OutputRecord, Row, normalized, parse, summaries};
use crate::config::KafkaConfig;
use crate::log::{self, Batching};

/// One region's outputs topic.
#[derive(Clone, Debug)]
pub struct Source {
    pub region: String,
    pub kafka: KafkaConfig,
}

/// What reconciling found: the windows compared, and every difference in words.
#[derive(Debug, Default)]
pub struct Reconciled {
    pub windows: usize,
    pub rows: usize,
    /// The (key, window)s with owned results (a lease epoch) from more than one write: a
    /// later holder wrote the window again, and the highest (epoch, version) stands.
    pub rewritten: Vec<String>,
    pub differences: Vec<String>,
}

/// A result as a topic delivered it, and where.
struct Delivered {
    output: OutputRecord,
    region: String,
    at: (i32, i64),
}

/// Reads every source's topic to its end, waits (at most `wait`) for each region's sink
/// to have written all of it, then compares with the table.
pub async fn reconcile(
    postgres: &str,
    sources: &[Source],
    wait: Duration,
) -> anyhow::Result<Reconciled> {
    let mut out = Reconciled::default();
    let mut delivered: BTreeMap<(String, u64), Vec<Delivered>> = BTreeMap::new();
    let mut ends = Vec::new();
    for source in sources {
        let (records, end) = read_to_end(source, &mut out.differences).await?;
        for d in records {
            delivered.entry(d.output.id()).or_default().push(d);
        }
        ends.push((source, end));
    }
    let client = connect(postgres, "geostate-sink-reconcile").await?;
    for (source, end) in ends {
        let topic = &source.kafka.outputs_topic;
        let deadline = Instant::now() + wait;
        loop {
            let stored = stored_offsets(&client, &source.region, topic)
                .await
                .unwrap_or_default();
            let behind: Vec<String> = end
                .iter()
                .filter(|(p, last)| stored.get(p).is_none_or(|s| s < last))
                .map(|(p, last)| format!("partition {p}: written to {:?} of {last}", stored.get(p)))
                .collect();
            if behind.is_empty() {
                break;
            }
            if Instant::now() > deadline {
                out.differences.push(format!(
                    "the {} sink is behind its topic {topic} after {wait:?}: {}",
                    source.region,
                    behind.join(", ")
                ));
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let expected = expected_rows(&delivered, &mut out.differences);
    out.rewritten = rewritten(&delivered);
    let table: Vec<Row> = client
        .query(
            "SELECT key, window_start_ms, value::text, epoch, version FROM geostate_outputs",
            &[],
        )
        .await?
        .iter()
        .map(|r| Row {
            key: r.get(0),
            start_ms: r.get::<_, i64>(1) as u64,
            value: normalized(r.get(2)),
            epoch: r.get::<_, i64>(3) as u64,
            version: r.get::<_, i64>(4) as u64,
        })
        .collect();
    out.rows = table.len();
    compare(&expected, &table, &mut out);
    Ok(out)
}

/// Every record of `source`'s outputs topic, and each partition's last offset read. A
/// record that is no output is a difference.
async fn read_to_end(
    source: &Source,
    differences: &mut Vec<String>,
) -> anyhow::Result<(Vec<Delivered>, BTreeMap<i32, i64>)> {
    let topic = source.kafka.outputs_topic.clone();
    let partitions = log::partitions(&source.kafka, &topic).await?;
    let spec = log::ConsumerSpec {
        kafka: source.kafka.clone(),
        group: "geostate-sink-reconcile".into(),
        report_end: true,
        topic: topic.clone(),
        partitions: partitions.clone(),
        role: "reconcile",
    };
    let mut reader = log::Reader::start(spec, &BTreeMap::new()).await?;
    let batching = Batching {
        max: 10_000,
        linger: Duration::ZERO,
        idle: None,
    };
    let (_running, mut never_stopped) = tokio::sync::watch::channel(false);
    let (mut records, mut last) = (Vec::new(), BTreeMap::new());
    let mut at_end = BTreeSet::new();
    while at_end.len() < partitions.len() {
        let Some(batch) = reader.next_batch(batching, &mut never_stopped).await else {
            break;
        };
        if let Some(e) = batch.failed {
            anyhow::bail!("reading {topic} of {}: {e}", source.region);
        }
        at_end.extend(batch.at_end.iter().map(|(p, _)| *p));
        for record in batch.records {
            last.insert(record.partition, record.offset);
            match parse(record.payload.as_deref()) {
                Ok(output) => records.push(Delivered {
                    output,
                    region: source.region.clone(),
                    at: (record.partition, record.offset),
                }),
                Err(reason) => differences.push(format!(
                    "{topic} of {} at {}/{}: {reason}",
                    source.region, record.partition, record.offset
                )),
            }
        }
    }
    Ok((records, last))
}

/// The row each (key, window) should have: the delivered result with the highest
/// (epoch, version). Two deliveries by one region, or different values at one (epoch,
/// version), are differences.
fn expected_rows(
    delivered: &BTreeMap<(String, u64), Vec<Delivered>>,
    differences: &mut Vec<String>,
) -> Vec<Row> {
    let mut rows = Vec::new();
    for ((key, start), all) in delivered {
        let mut by_region: BTreeMap<&str, Vec<(i32, i64)>> = BTreeMap::new();
        for d in all {
            by_region.entry(&d.region).or_default().push(d.at);
        }
        for (region, at) in by_region.iter().filter(|(_, at)| at.len() > 1) {
            differences.push(format!(
                "{key} window {start}: {} times in {region}'s outputs topic (at {at:?})",
                at.len()
            ));
        }
        let Some(best) = all.iter().max_by_key(|d| d.output.rank()) else {
            continue;
        };
        let disagree: Vec<String> = all
            .iter()
            .filter(|d| {
                d.output.rank() == best.output.rank()
                    && d.output.value_text() != best.output.value_text()
            })
            .map(|d| format!("{} says {}", d.region, d.output.value_text()))
            .collect();
        if !disagree.is_empty() {
            differences.push(format!(
                "{key} window {start}: regions disagree at epoch {} version {}: {} says {}, {}",
                best.output.epoch,
                best.output.version,
                best.region,
                best.output.value_text(),
                disagree.join(", ")
            ));
        }
        rows.push(Row {
            key: key.clone(),
            start_ms: *start,
            value: best.output.value_text(),
            epoch: best.output.epoch,
            version: best.output.version,
        });
    }
    rows
}

/// The (key, window)s with more than one owned result (a lease epoch) across the topics.
fn rewritten(delivered: &BTreeMap<(String, u64), Vec<Delivered>>) -> Vec<String> {
    delivered
        .iter()
        .filter(|(_, all)| all.iter().filter(|d| d.output.epoch > 0).count() > 1)
        .map(|((key, start), _)| format!("{key} window {start}"))
        .collect()
}

/// Window by window: count and digest of the topics' results against the table's rows,
/// and where they differ, each key.
fn compare(expected: &[Row], table: &[Row], out: &mut Reconciled) {
    let (want, have) = (summaries(expected), summaries(table));
    let windows: BTreeSet<u64> = want.keys().chain(have.keys()).copied().collect();
    out.windows = windows.len();
    for start in windows {
        if want.get(&start) == have.get(&start) {
            continue;
        }
        let side = |s: Option<&super::Summary>| s.map_or("nothing".to_owned(), |s| s.to_string());
        let mut detail = Vec::new();
        let in_window = |rows: &[Row]| -> BTreeMap<String, String> {
            rows.iter()
                .filter(|r| r.start_ms == start)
                .map(|r| (r.key.clone(), r.value.clone()))
                .collect()
        };
        let (w, h) = (in_window(expected), in_window(table));
        for (key, value) in &w {
            match h.get(key) {
                None => detail.push(format!("{key} missing from the table (topics: {value})")),
                Some(v) if v != value => {
                    detail.push(format!("{key} is {v} in the table, {value} in the topics"))
                }
                Some(_) => {}
            }
        }
        for (key, value) in h.iter().filter(|(k, _)| !w.contains_key(*k)) {
            detail.push(format!("{key} = {value} in the table, in no topic"));
        }
        out.differences.push(format!(
            "window {start}: topics {}, table {}: {}",
            side(want.get(&start)),
            side(have.get(&start)),
            detail.join("; ")
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(key: &str, start: u64, value: &str) -> Row {
        Row {
            key: key.into(),
            start_ms: start,
            value: value.into(),
            epoch: 0,
            version: 0,
        }
    }

    fn delivered(
        key: &str,
        start: u64,
        value: i64,
        region: &str,
        epoch: u64,
        at: i64,
    ) -> Delivered {
        Delivered {
            output: OutputRecord {
                key: key.into(),
                start_ms: start,
                end_ms: start + 60_000,
                value: value.into(),
                region: region.into(),
                epoch,
                version: 0,
            },
            region: region.into(),
            at: (0, at),
        }
    }

    #[test]
    fn every_missing_extra_or_different_row_is_named_with_its_window() {
        let expected = [row("a", 0, "1"), row("b", 0, "2"), row("c", 60, "3")];
        let table = [
            row("a", 0, "1"),
            row("b", 0, "9"),
            row("c", 60, "3"),
            row("d", 120, "4"),
        ];
        let mut out = Reconciled::default();
        compare(&expected, &table, &mut out);
        assert_eq!(out.windows, 3);
        assert_eq!(out.differences.len(), 2, "{:?}", out.differences);
        assert!(
            out.differences[0].contains("window 0")
                && out.differences[0].contains("b is 9 in the table, 2 in the topics")
        );
        assert!(
            out.differences[1].contains("window 120")
                && out.differences[1].contains("d = 4 in the table, in no topic")
        );
        let mut same = Reconciled::default();
        compare(&expected, &expected, &mut same);
        assert!(same.differences.is_empty());
        let mut missing = Reconciled::default();
        compare(&expected, &expected[1..], &mut missing);
        assert!(missing.differences[0].contains("a missing from the table"));
    }

    #[test]
    fn a_window_twice_in_a_topic_or_regions_disagreeing_is_a_difference() {
        let mut delivered_map: BTreeMap<(String, u64), Vec<Delivered>> = BTreeMap::new();
        for d in [
            delivered("a", 0, 5, "us-east-1", 0, 1),
            delivered("a", 0, 5, "eu-west-1", 0, 1),
            delivered("b", 0, 5, "us-east-1", 0, 2),
            delivered("b", 0, 5, "us-east-1", 0, 3),
            delivered("c", 0, 5, "us-east-1", 0, 4),
            delivered("c", 0, 6, "eu-west-1", 0, 2),
            delivered("s", 0, 1, "us-east-1", 1, 5),
            delivered("s", 0, 2, "eu-west-1", 2, 3),
        ] {
            delivered_map.entry(d.output.id()).or_default().push(d);
        }
        let mut differences = Vec::new();
        let rows = expected_rows(&delivered_map, &mut differences);
        assert_eq!(differences.len(), 2, "{differences:?}");
        assert!(differences[0].starts_with("b window 0: 2 times in us-east-1"));
        assert!(differences[1].starts_with("c window 0: regions disagree"));
        // the higher epoch stands
        assert_eq!(
            rows.iter().find(|r| r.key == "s").map(|r| r.value.as_str()),
            Some("2")
        );
        assert_eq!(rows.len(), 4);
        // a final window in both regions is no rewrite; two owned results are
        assert_eq!(rewritten(&delivered_map), ["s window 0"]);
    }
}
