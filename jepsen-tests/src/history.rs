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
    /// A register write (owned or shared).
    Write,
    /// An owned register's compare-and-set: `value` if the register holds `expected`.
    Cas,
    /// An owned list's append of `value` (read at the holder, then compare-and-set).
    Append,
}

/// A register value's order stamp as the server returned it: ordered by epoch, then
/// clock, then origin region, like the registers themselves.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Stamp {
    pub epoch: u64,
    pub wall_nanos: u64,
    pub logical: u32,
    pub origin: String,
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
    /// Owned keys: the ownership shard.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<u32>,
    /// Owned keys: the lease epoch the server stamped an accepted write (or a read's
    /// value) with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<u64>,
    /// A compare-and-set's expected value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected: Option<i64>,
    /// An owned list as read (`append` workload).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub list: Option<Vec<i64>>,
    /// Registers: the order stamp of the value written or read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stamp: Option<Stamp>,
    /// Windowed counters: an add's event time (ms since the Unix epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_time: Option<u64>,
    /// Windowed counters: the start of the window a read read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<u64>,
    /// Windowed counters: whether the window read was final.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub is_final: Option<bool>,
}

/// One operation: its invocation and how it ended (`None` while it never completed,
/// which counts as indeterminate).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Operation<'a> {
    pub invoke: &'a Event,
    pub completion: Option<&'a Event>,
}

impl Operation<'_> {
    pub fn kind(&self) -> EventType {
        self.completion.map_or(EventType::Info, |c| c.kind)
    }

    /// When it ended, or never (an indeterminate operation may take effect any time later).
    pub fn end_ns(&self) -> u64 {
        match self.completion {
            Some(c) if c.kind != EventType::Info => c.time_ns,
            _ => u64::MAX,
        }
    }
}

/// Pairs every invocation with its process's next completion.
pub fn operations(history: &[Event]) -> Vec<Operation<'_>> {
    let mut open: std::collections::BTreeMap<u64, usize> = std::collections::BTreeMap::new();
    let mut ops: Vec<Operation<'_>> = Vec::new();
    for e in history {
        if e.kind == EventType::Invoke {
            open.insert(e.process, ops.len());
            ops.push(Operation {
                invoke: e,
                completion: None,
            });
        } else if let Some(i) = open.remove(&e.process) {
            ops[i].completion = Some(e);
        }
    }
    ops
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
