//! Linearizability of single registers (owned keys, under their lease) by the Wing–Gong
//! search with Lowe's memoization: is there an order of the operations, each taking
//! effect between its invocation and its completion, in which every read returns the
//! latest write? `info` writes may take effect at any time after their invocation, or
//! never; `info` and `fail` reads say nothing; `fail` writes never happened.

use std::collections::{BTreeMap, HashSet};

use crate::history::{Event, EventType, Function, operations};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Write(i64),
    /// The value read (`None`: the register was never set).
    Read(Option<i64>),
}

#[derive(Clone, Copy, Debug)]
struct Timed {
    op: Op,
    invoke_ns: u64,
    /// `u64::MAX` for an indeterminate write.
    end_ns: u64,
    /// Must be linearized (`ok`); an indeterminate write need not.
    required: bool,
}

/// A key whose history has no linearization.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotLinearizable {
    pub key: String,
    pub operations: usize,
}

/// Checks every key with register reads or writes in `history`.
pub fn check(history: &[Event]) -> Vec<NotLinearizable> {
    let mut by_key: BTreeMap<&str, Vec<Timed>> = BTreeMap::new();
    for op in operations(history) {
        let f = op.invoke.f;
        let kind = op.kind();
        let timed = match (f, kind) {
            (Function::Write, EventType::Ok | EventType::Info) => Timed {
                op: Op::Write(op.invoke.value.unwrap_or_default()),
                invoke_ns: op.invoke.time_ns,
                end_ns: op.end_ns(),
                required: kind == EventType::Ok,
            },
            (Function::Read, EventType::Ok) => Timed {
                op: Op::Read(op.completion.and_then(|c| c.value)),
                invoke_ns: op.invoke.time_ns,
                end_ns: op.end_ns(),
                required: true,
            },
            _ => continue,
        };
        by_key.entry(&op.invoke.key).or_default().push(timed);
    }
    by_key
        .into_iter()
        .filter(|(_, ops)| !linearizable(ops))
        .map(|(key, ops)| NotLinearizable {
            key: key.to_string(),
            operations: ops.len(),
        })
        .collect()
}

fn linearizable(ops: &[Timed]) -> bool {
    let words = ops.len().div_ceil(64);
    let mut seen: HashSet<(Vec<u64>, Option<i64>)> = HashSet::new();
    search(ops, &mut vec![0; words], None, &mut seen)
}

fn is_done(done: &[u64], i: usize) -> bool {
    done[i / 64] & (1 << (i % 64)) != 0
}

fn search(
    ops: &[Timed],
    done: &mut Vec<u64>,
    state: Option<i64>,
    seen: &mut HashSet<(Vec<u64>, Option<i64>)>,
) -> bool {
    let pending = (0..ops.len()).filter(|&i| !is_done(done, i));
    let mut required_left = false;
    let mut first_end = u64::MAX;
    for i in pending {
        required_left |= ops[i].required;
        first_end = first_end.min(ops[i].end_ns);
    }
    if !required_left {
        return true;
    }
    // the next operation to take effect began before the earliest pending one ended
    for i in 0..ops.len() {
        if is_done(done, i) || ops[i].invoke_ns > first_end {
            continue;
        }
        let next = match ops[i].op {
            Op::Write(v) => Some(v),
            Op::Read(r) if r == state => state,
            Op::Read(_) => continue,
        };
        done[i / 64] |= 1 << (i % 64);
        if seen.insert((done.clone(), next)) && search(ops, done, next, seen) {
            return true;
        }
        done[i / 64] &= !(1 << (i % 64));
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::parse;

    /// `(process, f, value, invoke, completion type, end)`; a read's value is what it read.
    type Spec<'a> = (u64, &'a str, Option<i64>, u64, &'a str, u64);

    fn history(ops: &[Spec<'_>]) -> Vec<Event> {
        let mut lines = Vec::new();
        for &(p, f, v, from, kind, to) in ops {
            let value = |v: Option<i64>| v.map_or("null".to_string(), |v| v.to_string());
            let invoked = if f == "read" { None } else { v };
            lines.push((from, format!(
                r#"{{"process":{p},"type":"invoke","f":"{f}","key":"surge/k","value":{},"region":"a","time_ns":{from}}}"#,
                value(invoked)
            )));
            lines.push((to, format!(
                r#"{{"process":{p},"type":"{kind}","f":"{f}","key":"surge/k","value":{},"region":"a","time_ns":{to}}}"#,
                value(v)
            )));
        }
        lines.sort_by_key(|(t, _)| *t);
        let text: Vec<String> = lines.into_iter().map(|(_, l)| l).collect();
        parse(&text.join("\n")).unwrap()
    }

    #[test]
    fn concurrent_reads_may_see_either_side_of_a_concurrent_write() {
        let h = history(&[
            (1, "write", Some(1), 0, "ok", 10),
            (2, "write", Some(2), 20, "ok", 50),
            (3, "read", Some(1), 25, "ok", 30),
            (4, "read", Some(2), 26, "ok", 40),
            (5, "read", Some(2), 60, "ok", 70),
        ]);
        assert_eq!(check(&h), []);
    }

    #[test]
    fn a_stale_read_after_a_completed_write_is_flagged() {
        let h = history(&[
            (1, "write", Some(1), 0, "ok", 10),
            (2, "write", Some(2), 20, "ok", 30),
            (3, "read", Some(1), 40, "ok", 50),
        ]);
        assert_eq!(check(&h).len(), 1);
    }

    #[test]
    fn a_value_never_written_is_flagged_and_an_unset_register_reads_null() {
        let h = history(&[
            (1, "read", None, 0, "ok", 5),
            (2, "read", Some(7), 10, "ok", 20),
        ]);
        assert_eq!(check(&h).len(), 1);
        assert_eq!(check(&history(&[(1, "read", None, 0, "ok", 5)])), []);
    }

    #[test]
    fn an_indeterminate_write_may_or_may_not_have_happened_but_a_failed_one_did_not() {
        let info = history(&[
            (1, "write", Some(1), 0, "ok", 10),
            (2, "write", Some(2), 20, "info", 30),
            (3, "read", Some(2), 100, "ok", 110),
            (4, "read", Some(2), 120, "ok", 130),
        ]);
        assert_eq!(check(&info), []);
        let never = history(&[
            (1, "write", Some(1), 0, "ok", 10),
            (2, "write", Some(2), 20, "info", 30),
            (3, "read", Some(1), 100, "ok", 110),
        ]);
        assert_eq!(check(&never), []);
        let failed = history(&[
            (1, "write", Some(1), 0, "ok", 10),
            (2, "write", Some(2), 20, "fail", 30),
            (3, "read", Some(2), 100, "ok", 110),
        ]);
        assert_eq!(check(&failed).len(), 1);
    }
}
