//! The history format: one JSON object per line, one line per event.
//!
//! ```json
//! {"process":3,"type":"invoke","f":"add","key":"drivers/9q8yy","value":2,"region":"us-east-1","time_ns":17}
//! {"process":3,"type":"ok","f":"add","key":"drivers/9q8yy","value":2,"region":"us-east-1","time_ns":42}
//! ```

use serde::{Deserialize, Serialize};

/// How an operation ended: `ok` (it happened), `fail` (it certainly did not), `info`
/// (unknown: timed out or the connection was lost; it may or may not have happened).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EventType {
    Invoke,
    Ok,
    Fail,
    Info,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Function {
    Add,
    Read,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    pub process: u64,
    #[serde(rename = "type")]
    pub kind: EventType,
    pub f: Function,
    pub key: String,
    /// The amount added, or the value read (`None` on an invoked read).
    pub value: Option<i64>,
    pub region: String,
    pub time_ns: u64,
}

#[derive(Debug, PartialEq, Eq)]
pub struct ParseError {
    pub line: usize,
    pub reason: String,
}

/// Parses a JSON-lines history; blank lines are skipped.
pub fn parse(text: &str) -> Result<Vec<Event>, ParseError> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|e| ParseError {
                line: i + 1,
                reason: e.to_string(),
            })
        })
        .collect()
}
