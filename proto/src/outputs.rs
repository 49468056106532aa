//! The record of the outputs topic (`geostate.outputs`, JSON), defined once for the
//! server that produces it and for every reader: the PostgreSQL sink, the integration
//! tests and the Jepsen checkers. A record outlives the build that wrote it (a reader of
//! another version, or of no version of geostate at all, parses the same bytes), so the
//! field names, their order and the numbers' forms are a contract: they do not change.
//!
//! ```text
//!  a final window (every region's watermark passed its close) ──► FinalWindow
//!      {"key","start_ms","end_ms","value":<int64>,"region"}
//!  an accepted write of an owned register (`output = "register-changes"`), its value a
//!  WindowResult {"start_ms","end_ms","value":<number>} ──► RegisterChange
//!      {"key","start_ms","end_ms","value":<number>,"region","epoch","version"}
//!  either, read back ──► OutputRecord (= RegisterChange; a final window's epoch and
//!      version 0)
//! ```
//!
//! Every record is keyed `<key>@<start_ms>`, so a compacted outputs topic keeps one
//! record per (key, window).

use serde::{Deserialize, Serialize};

/// The record key of `key`'s window starting at `start_ms`: `<key>@<start_ms>`.
fn record_key(key: &str, start_ms: u64) -> Vec<u8> {
    format!("{key}@{start_ms}").into_bytes()
}

/// One final window, as the node that saw it final writes its record. Its value can no
/// longer change, so every node of a region writes the same record, and each region its
/// own (equal but for `region`). It carries no epoch and no version: a reader reads it as
/// an [`OutputRecord`] with both 0.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinalWindow {
    /// The state key (a key of a namespace with `output = "final-windows"`).
    pub key: String,
    pub start_ms: u64,
    pub end_ms: u64,
    /// The sum of every region's counts in the window (saturated to int64).
    pub value: i64,
    /// The region that produced this record (each region produces its own, equal).
    pub region: String,
}

impl FinalWindow {
    /// The record key: the state key and the window's start, so a compacted outputs topic
    /// keeps one record per window.
    pub fn record_key(&self) -> Vec<u8> {
        record_key(&self.key, self.start_ms)
    }

    /// The record's value: `{"key","start_ms","end_ms","value","region"}`, in this order.
    pub fn payload(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// What a register of a `register-changes` namespace holds: one window's result. Its
/// window and value become the [`RegisterChange`] of each accepted write.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WindowResult {
    pub start_ms: u64,
    pub end_ms: u64,
    pub value: serde_json::Number,
}

impl WindowResult {
    /// The result a register value holds, or why it is none.
    pub fn parse(value: &[u8]) -> Result<Self, String> {
        let result: WindowResult = serde_json::from_slice(value).map_err(|e| e.to_string())?;
        if result.end_ms <= result.start_ms {
            return Err(format!(
                "the window ends ({}) before it starts ({})",
                result.end_ms, result.start_ms
            ));
        }
        if i64::try_from(result.end_ms).is_err() {
            return Err("a window time beyond int64".into());
        }
        Ok(result)
    }
}

/// One record of the outputs topic as every reader reads it, and as an accepted write of
/// an owned register is written ([`RegisterChange`]): the window result, the region that
/// wrote it, the lease epoch it was written under and its stamp (`version`: the HLC as
/// one number). A reader keeps, per key and window, the record of the highest (epoch,
/// version) ([`OutputRecord::rank`]).
///
/// A [`FinalWindow`] has no epoch and no version: it reads as 0 for both
/// (`#[serde(default)]`), below every owned write and the same in every region. `value`
/// is a [`serde_json::Number`], which holds a final window's int64 count and a
/// register's number (a price, `1.5`) as written, so this one type reads every record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputRecord {
    pub key: String,
    pub start_ms: u64,
    pub end_ms: u64,
    pub value: serde_json::Number,
    pub region: String,
    /// The lease epoch of an owned register's write; 0 (absent) for a final window.
    #[serde(default)]
    pub epoch: u64,
    /// The stamp of an owned register's write; 0 (absent) for a final window.
    #[serde(default)]
    pub version: u64,
}

/// One accepted write of an owned register of a `register-changes` namespace, as its
/// record carries it (JSON, every field written, epoch and version too): an
/// [`OutputRecord`] under the name of what produces it.
pub type RegisterChange = OutputRecord;

impl OutputRecord {
    /// The record key: the state key and the window's start, as for a final window.
    pub fn record_key(&self) -> Vec<u8> {
        record_key(&self.key, self.start_ms)
    }

    /// The record's value: every field, epoch and version too, in the struct's order.
    pub fn payload(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// The window the record is a result of: its key and start.
    pub fn id(&self) -> (String, u64) {
        (self.key.clone(), self.start_ms)
    }

    /// Which of two results for one (key, window) stands: the higher (epoch, version).
    pub fn rank(&self) -> (u64, u64) {
        (self.epoch, self.version)
    }

    /// The value as text, the same for equal numbers however they were written
    /// ([`normalized`]).
    pub fn value_text(&self) -> String {
        normalized(&self.value.to_string())
    }
}

/// A number's text, the same whether it came from JSON or from PostgreSQL's `numeric`:
/// an integer as itself, any other number in its shortest decimal form (`5`, `1.5`; not
/// `5.0`, `1.50`).
pub fn normalized(text: &str) -> String {
    if let Ok(n) = text.parse::<i64>() {
        return n.to_string();
    }
    match text.parse::<f64>() {
        Ok(x) if x.fract() == 0.0 && x.abs() < 9e15 => (x as i64).to_string(),
        Ok(x) => x.to_string(),
        Err(_) => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes each producer writes are the contract with every reader.
    #[test]
    fn each_record_is_written_as_its_readers_expect() {
        let window = FinalWindow {
            key: "requests/9q8yy".into(),
            start_ms: 60_000,
            end_ms: 120_000,
            value: -7,
            region: "us-east-1".into(),
        };
        assert_eq!(
            String::from_utf8(window.payload()).unwrap(),
            r#"{"key":"requests/9q8yy","start_ms":60000,"end_ms":120000,"value":-7,"region":"us-east-1"}"#
        );
        assert_eq!(window.record_key(), b"requests/9q8yy@60000");
        let change = RegisterChange {
            key: "prices/9q8yy".into(),
            start_ms: 0,
            end_ms: 60_000,
            value: serde_json::Number::from_f64(1.5).unwrap(),
            region: "eu-west-1".into(),
            epoch: 4,
            version: 9,
        };
        assert_eq!(
            String::from_utf8(change.payload()).unwrap(),
            r#"{"key":"prices/9q8yy","start_ms":0,"end_ms":60000,"value":1.5,"region":"eu-west-1","epoch":4,"version":9}"#
        );
        assert_eq!(change.record_key(), b"prices/9q8yy@0");
    }

    /// A final window reads back as an output record below every owned write, with the
    /// same key and value; an owned write reads back as itself.
    #[test]
    fn every_record_reads_back_as_an_output_record() {
        let window = FinalWindow {
            key: "k".into(),
            start_ms: 0,
            end_ms: 60_000,
            value: 7,
            region: "r".into(),
        };
        let read: OutputRecord = serde_json::from_slice(&window.payload()).unwrap();
        assert_eq!(
            (read.id(), read.rank(), read.value_text(), read.record_key()),
            (("k".into(), 0), (0, 0), "7".into(), window.record_key())
        );
        let change = OutputRecord {
            epoch: 1,
            version: 2,
            value: serde_json::Number::from(3_i64),
            ..read.clone()
        };
        let back: OutputRecord = serde_json::from_slice(&change.payload()).unwrap();
        assert_eq!(back, change);
        assert!(back.rank() > read.rank());
    }

    #[test]
    fn a_window_result_is_checked() {
        let ok = WindowResult::parse(br#"{"start_ms":0,"end_ms":60000,"value":1.5}"#).unwrap();
        assert_eq!(
            (ok.start_ms, ok.end_ms, ok.value.as_f64()),
            (0, 60_000, Some(1.5))
        );
        for (bad, why) in [
            (
                &br#"{"start_ms":5,"end_ms":5,"value":1}"#[..],
                "before it starts",
            ),
            (
                &br#"{"start_ms":0,"end_ms":9223372036854775808,"value":1}"#[..],
                "beyond int64",
            ),
            (
                &br#"{"start_ms":0,"end_ms":1,"value":1,"extra":2}"#[..],
                "unknown field",
            ),
            (
                &br#"{"start_ms":0,"end_ms":1,"value":"1"}"#[..],
                "invalid type",
            ),
        ] {
            let error = WindowResult::parse(bad).expect_err("refused");
            assert!(error.contains(why), "{error:?} should say {why:?}");
        }
    }

    #[test]
    fn numbers_read_the_same_however_written() {
        for (json, pg) in [("5", "5"), ("1.5", "1.50"), ("2.0", "2"), ("-3", "-3")] {
            assert_eq!(normalized(json), normalized(pg), "{json} vs {pg}");
        }
        assert_ne!(normalized("1.5"), normalized("1.25"));
    }
}
