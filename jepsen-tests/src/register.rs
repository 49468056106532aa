//! Linearizability of single registers (owned keys, under their lease) by the Wing–Gong
//! search with Lowe's memoization: is there an order of the operations, each taking
//! effect between its invocation and its completion, in which every read returns the
//! latest write and every compare-and-set found its expected value? `info` writes and
//! compare-and-sets may take effect at any time after their invocation, or never; `info`
//! and `fail` reads say nothing; `fail` writes and compare-and-sets never happened.

use std::collections::{BTreeMap, HashSet};

use crate::history::{Event, EventType, Function, operations};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Write(i64),
    /// The value read (`None`: the register was never set).
    Read(Option<i64>),
    /// Expected, then new.
    Cas(i64, i64),
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
            (Function::Write | Function::Cas, EventType::Ok | EventType::Info) => Timed {
                op: match (f, op.invoke.expected) {
                    (Function::Cas, Some(expected)) => {
                        Op::Cas(expected, op.invoke.value.unwrap_or_default())
                    }
                    _ => Op::Write(op.invoke.value.unwrap_or_default()),
                },
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

/// Values are unique per write, so an indeterminate write nobody observed (no read
/// returned its value, no compare-and-set expected it) may be taken as never having
/// happened, and one that was observed happened before its first observer ended. Both
/// bound the search: the history then falls apart into stretches no operation spans.
fn prune(ops: &[Timed]) -> Vec<Timed> {
    // value → by when it was observed; a kept compare-and-set observes what it expects
    let mut observed: BTreeMap<i64, u64> = BTreeMap::new();
    let mut kept: Vec<Option<Timed>> = vec![None; ops.len()];
    loop {
        for (o, k) in ops.iter().zip(&kept) {
            let by = if o.required {
                o.end_ns
            } else if let Some(k) = k {
                k.end_ns
            } else {
                continue;
            };
            let seen = match o.op {
                Op::Read(Some(v)) | Op::Cas(v, _) => v,
                _ => continue,
            };
            let end = observed.entry(seen).or_insert(u64::MAX);
            *end = (*end).min(by);
        }
        let mut changed = false;
        for (o, k) in ops.iter().zip(kept.iter_mut()) {
            let next = if o.required {
                Some(*o)
            } else {
                let written = match o.op {
                    Op::Write(v) | Op::Cas(_, v) => v,
                    Op::Read(_) => continue,
                };
                observed.get(&written).map(|by| Timed {
                    end_ns: o.end_ns.min(*by),
                    ..*o
                })
            };
            changed |= next.map(|n| n.end_ns) != k.map(|k| k.end_ns);
            *k = next;
        }
        if !changed {
            break;
        }
    }
    let mut kept: Vec<Timed> = kept.into_iter().flatten().collect();
    kept.sort_by_key(|o| o.invoke_ns);
    kept
}

fn linearizable(ops: &[Timed]) -> bool {
    let ops = prune(ops);
    // stretches that no operation spans, checked in turn from every state the one before
    // may have ended in (an unset register at first)
    let mut states: HashSet<Option<i64>> = HashSet::from([None]);
    let mut from = 0;
    let mut last_end = 0;
    for i in 0..=ops.len() {
        if i == ops.len() || (i > from && ops[i].invoke_ns > last_end) {
            let stretch = &ops[from..i];
            let mut ends = HashSet::new();
            for &state in &states {
                let mut seen = HashSet::new();
                let words = stretch.len().div_ceil(64);
                search(stretch, &mut vec![0; words], state, &mut seen, &mut ends);
            }
            if ends.is_empty() {
                return false;
            }
            states = ends;
            from = i;
        }
        if let Some(o) = ops.get(i) {
            last_end = if i == from {
                o.end_ns
            } else {
                last_end.max(o.end_ns)
            };
        }
    }
    true
}

fn is_done(done: &[u64], i: usize) -> bool {
    done[i / 64] & (1 << (i % 64)) != 0
}

/// Every state the stretch `ops` can end in from `state`, into `ends`.
fn search(
    ops: &[Timed],
    done: &mut Vec<u64>,
    state: Option<i64>,
    seen: &mut HashSet<(Vec<u64>, Option<i64>)>,
    ends: &mut HashSet<Option<i64>>,
) {
    let pending = (0..ops.len()).filter(|&i| !is_done(done, i));
    let mut required_left = false;
    let mut first_end = u64::MAX;
    for i in pending {
        required_left |= ops[i].required;
        first_end = first_end.min(ops[i].end_ns);
    }
    if !required_left {
        ends.insert(state);
    }
    // the next operation to take effect began before the earliest pending one ended
    for i in 0..ops.len() {
        if is_done(done, i) || ops[i].invoke_ns > first_end {
            continue;
        }
        let next = match ops[i].op {
            Op::Write(v) => Some(v),
            Op::Read(r) if r == state => state,
            Op::Cas(expected, v) if state == Some(expected) => Some(v),
            Op::Read(_) | Op::Cas(..) => continue,
        };
        done[i / 64] |= 1 << (i % 64);
        if seen.insert((done.clone(), next)) {
            search(ops, done, next, seen, ends);
        }
        done[i / 64] &= !(1 << (i % 64));
    }
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
            // "cas:E" is a compare-and-set expecting E
            let (f, expected) = match f.strip_prefix("cas:") {
                Some(e) => ("cas", format!(r#","expected":{e}"#)),
                None => (f, String::new()),
            };
            let invoked = if f == "read" { None } else { v };
            lines.push((from, format!(
                r#"{{"process":{p},"type":"invoke","f":"{f}","key":"surge/k","value":{}{expected},"region":"a","time_ns":{from}}}"#,
                value(invoked)
            )));
            lines.push((to, format!(
                r#"{{"process":{p},"type":"{kind}","f":"{f}","key":"surge/k","value":{}{expected},"region":"a","time_ns":{to}}}"#,
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

    #[test]
    fn a_compare_and_set_must_find_its_expected_value() {
        let ok = history(&[
            (1, "write", Some(1), 0, "ok", 10),
            (2, "cas:1", Some(2), 20, "ok", 30),
            (3, "read", Some(2), 40, "ok", 50),
        ]);
        assert_eq!(check(&ok), []);
        // the register held 2 when this compare-and-set expecting 1 succeeded
        let stale = history(&[
            (1, "write", Some(1), 0, "ok", 10),
            (2, "write", Some(2), 20, "ok", 30),
            (3, "cas:1", Some(3), 40, "ok", 50),
        ]);
        assert_eq!(check(&stale).len(), 1);
        // a failed one never happened; an indeterminate one may have
        let failed = history(&[
            (1, "write", Some(1), 0, "ok", 10),
            (2, "cas:1", Some(2), 20, "fail", 30),
            (3, "read", Some(2), 40, "ok", 50),
        ]);
        assert_eq!(check(&failed).len(), 1);
        let info = history(&[
            (1, "write", Some(1), 0, "ok", 10),
            (2, "cas:1", Some(2), 20, "info", 30),
            (3, "read", Some(2), 40, "ok", 50),
        ]);
        assert_eq!(check(&info), []);
    }
}
