//! Sinks of the outputs topic: `geostate sink postgres` writes each output into a
//! PostgreSQL table exactly once, and `geostate sink reconcile` compares the table with
//! the outputs topics, window by window.
//!
//! ```text
//!  geostate.outputs (read_committed) ──► batch ──► one PostgreSQL transaction:
//!      upsert rows keyed by (key, window start), guarded by (epoch, version)
//!      + the offsets consumed ──► commit
//!  restart ──► offsets from PostgreSQL ──► read on after them
//! ```
//!
//! The sink is a process of its own, not a task of a node: its progress lives in the
//! database it writes (the offsets commit with the rows, so Kafka's consumer offsets and
//! two-phase commit play no part), a slow or absent database never holds back a node's
//! ingest or shipping, and one sink per region serves however many nodes the region has
//! and wherever its partitions move.

pub mod postgres;
pub mod reconcile;

use std::collections::BTreeMap;

/// One record of the outputs topic, as the sink reads it: a final window (epoch and
/// version 0: every region produces the same) or an owned result (the lease epoch of its
/// writer and the version of the write); and a number's text as the table compares it.
/// Both are the record's one definition, shared with its producer.
pub use geostate_proto::outputs::{OutputRecord, normalized};

/// Why a record of the outputs topic is not an output.
pub fn parse(payload: Option<&[u8]>) -> Result<OutputRecord, String> {
    let payload = payload.ok_or("a record without a payload")?;
    let record: OutputRecord =
        serde_json::from_slice(payload).map_err(|e| format!("not an output record: {e}"))?;
    if record.key.is_empty() {
        return Err("an output record with an empty key".into());
    }
    if record.end_ms <= record.start_ms {
        return Err(format!(
            "an output record whose window ends ({}) before it starts ({})",
            record.end_ms, record.start_ms
        ));
    }
    if i64::try_from(record.end_ms.max(record.epoch).max(record.version)).is_err() {
        return Err("an output record with a time, epoch or version beyond int64".into());
    }
    Ok(record)
}

/// One row of the table, or the result a topic says it should hold.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Row {
    pub key: String,
    pub start_ms: u64,
    pub value: String,
    pub epoch: u64,
    pub version: u64,
}

/// A window's rows summed up: how many, and a digest of their keys and values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    pub count: usize,
    pub digest: u64,
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} rows, digest {:016x}", self.count, self.digest)
    }
}

/// The summary of each window (by start) of `rows`: FNV-1a over `key=value` lines in key
/// order, so two sides agree exactly when they hold the same keys with the same values.
pub fn summaries<'a>(rows: impl IntoIterator<Item = &'a Row>) -> BTreeMap<u64, Summary> {
    let mut by_window: BTreeMap<u64, Vec<&Row>> = BTreeMap::new();
    for row in rows {
        by_window.entry(row.start_ms).or_default().push(row);
    }
    by_window
        .into_iter()
        .map(|(start, mut rows)| {
            rows.sort_by(|a, b| a.key.cmp(&b.key));
            let mut digest: u64 = 0xcbf2_9ce4_8422_2325;
            for row in &rows {
                for byte in format!("{}={}\n", row.key, row.value).bytes() {
                    digest ^= u64::from(byte);
                    digest = digest.wrapping_mul(0x0100_0000_01b3);
                }
            }
            let summary = Summary {
                count: rows.len(),
                digest,
            };
            (start, summary)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_output_record_parses_and_bad_ones_say_why() {
        let record = parse(Some(
            br#"{"key":"requests/9q8yy","start_ms":60000,"end_ms":120000,"value":7,"region":"us-east-1"}"#,
        ))
        .expect("parses");
        assert_eq!(
            (record.id(), record.rank(), record.value_text()),
            (("requests/9q8yy".into(), 60_000), (0, 0), "7".into())
        );
        let owned = parse(Some(
            br#"{"key":"surge/9q8yy","start_ms":0,"end_ms":1,"value":1.5,"region":"eu-west-1","epoch":4,"version":9}"#,
        ))
        .expect("parses");
        assert_eq!((owned.rank(), owned.value_text()), ((4, 9), "1.5".into()));
        for (bad, why) in [
            (None, "without a payload"),
            (Some(&b"garbage"[..]), "not an output record"),
            (
                Some(&br#"{"key":"","start_ms":0,"end_ms":1,"value":1,"region":"r"}"#[..]),
                "empty key",
            ),
            (
                Some(&br#"{"key":"k","start_ms":5,"end_ms":5,"value":1,"region":"r"}"#[..]),
                "ends (5) before it starts (5)",
            ),
            (
                Some(
                    &br#"{"key":"k","start_ms":0,"end_ms":1,"value":1,"region":"r","epoch":9223372036854775808}"#
                        [..],
                ),
                "beyond int64",
            ),
        ] {
            let error = parse(bad).expect_err("refused");
            assert!(error.contains(why), "{error:?} should say {why:?}");
        }
    }

    #[test]
    fn numbers_read_the_same_from_json_and_from_postgres() {
        for (json, pg) in [("5", "5"), ("1.5", "1.50"), ("2.0", "2"), ("-3", "-3")] {
            assert_eq!(normalized(json), normalized(pg), "{json} vs {pg}");
        }
        assert_ne!(normalized("1.5"), normalized("1.25"));
    }

    #[test]
    fn window_summaries_differ_exactly_when_the_rows_do() {
        let row = |key: &str, start, value: &str| Row {
            key: key.into(),
            start_ms: start,
            value: value.into(),
            epoch: 0,
            version: 0,
        };
        let a = [row("k1", 0, "1"), row("k2", 0, "2"), row("k1", 60, "3")];
        let reordered = [row("k1", 60, "3"), row("k2", 0, "2"), row("k1", 0, "1")];
        assert_eq!(summaries(&a), summaries(&reordered));
        let changed = [row("k1", 0, "1"), row("k2", 0, "5"), row("k1", 60, "3")];
        let (sa, sc) = (summaries(&a), summaries(&changed));
        assert_eq!((sa[&0].count, sc[&0].count), (2, 2));
        assert_ne!(sa[&0].digest, sc[&0].digest);
        assert_eq!(sa[&60], sc[&60]);
        assert_eq!(summaries(&a[..1])[&0].count, 1);
    }
}
