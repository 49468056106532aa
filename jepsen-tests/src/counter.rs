//! The counter checker (Maelstrom's rule): for every key, each region's final read lies
//! between the sum of the `ok` adds plus the `info` adds that could have lowered it and the
//! same sum plus the `info` adds that could have raised it — an `info` add may or may not
//! have happened, an `ok` one certainly did, a `fail` one certainly did not — and every
//! region's final read is the same.

use std::collections::BTreeMap;

use crate::history::{Event, EventType, Function};

/// What the checker found for one key.
#[derive(Debug, PartialEq, Eq)]
pub struct KeyVerdict {
    pub key: String,
    /// Lowest and highest final value the history allows.
    pub bounds: (i64, i64),
    /// Final read per region.
    pub finals: BTreeMap<String, i64>,
    pub problems: Vec<String>,
}

/// Checks every key that has adds or final reads. `finals` are the reads taken after the
/// faults healed: key → region → value. A key with adds but no final read is a problem.
pub fn check(
    history: &[Event],
    finals: &BTreeMap<String, BTreeMap<String, i64>>,
) -> Vec<KeyVerdict> {
    let mut adds: BTreeMap<&str, (i64, i64, i64)> = BTreeMap::new(); // ok sum, info neg, info pos
    for e in history.iter().filter(|e| e.f == Function::Add) {
        let n = e.value.unwrap_or(0);
        let entry = adds.entry(&e.key).or_default();
        match e.kind {
            EventType::Ok => entry.0 += n,
            EventType::Info if n < 0 => entry.1 += n,
            EventType::Info => entry.2 += n,
            EventType::Invoke | EventType::Fail => {}
        }
    }
    let mut keys: Vec<&str> = adds.keys().copied().collect();
    keys.extend(finals.keys().map(String::as_str));
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .map(|key| {
            let (ok, neg, pos) = adds.get(key).copied().unwrap_or_default();
            let bounds = (ok + neg, ok + pos);
            let finals = finals.get(key).cloned().unwrap_or_default();
            let mut problems = Vec::new();
            if finals.is_empty() {
                problems.push("no final read".to_string());
            }
            for (region, &v) in &finals {
                if v < bounds.0 || v > bounds.1 {
                    problems.push(format!("{region} read {v}, outside {bounds:?}"));
                }
            }
            let mut distinct: Vec<i64> = finals.values().copied().collect();
            distinct.dedup();
            if distinct.len() > 1 {
                problems.push(format!("regions disagree: {finals:?}"));
            }
            KeyVerdict {
                key: key.to_string(),
                bounds,
                finals,
                problems,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::parse;

    const HISTORY: &str = r#"
{"process":1,"type":"invoke","f":"add","key":"k","value":5,"region":"a","time_ns":1}
{"process":1,"type":"ok","f":"add","key":"k","value":5,"region":"a","time_ns":2}
{"process":2,"type":"invoke","f":"add","key":"k","value":-2,"region":"b","time_ns":3}
{"process":2,"type":"info","f":"add","key":"k","value":-2,"region":"b","time_ns":4}
{"process":3,"type":"invoke","f":"add","key":"k","value":7,"region":"b","time_ns":5}
{"process":3,"type":"fail","f":"add","key":"k","value":7,"region":"b","time_ns":6}
{"process":4,"type":"invoke","f":"add","key":"k","value":1,"region":"a","time_ns":7}
{"process":4,"type":"info","f":"add","key":"k","value":1,"region":"a","time_ns":8}
"#;

    fn finals(a: i64, b: i64) -> BTreeMap<String, BTreeMap<String, i64>> {
        BTreeMap::from([(
            "k".to_string(),
            BTreeMap::from([("a".to_string(), a), ("b".to_string(), b)]),
        )])
    }

    #[test]
    fn reads_within_the_bounds_and_equal_everywhere_pass() {
        let history = parse(HISTORY).unwrap();
        for v in [3, 4, 5, 6] {
            let verdict = check(&history, &finals(v, v));
            assert_eq!(verdict[0].bounds, (3, 6));
            assert!(
                verdict[0].problems.is_empty(),
                "{v}: {:?}",
                verdict[0].problems
            );
        }
    }

    #[test]
    fn a_lost_ok_add_a_double_apply_a_failed_add_that_happened_and_divergence_are_caught() {
        let history = parse(HISTORY).unwrap();
        assert!(
            !check(&history, &finals(2, 2))[0].problems.is_empty(),
            "lost ok add"
        );
        assert!(
            !check(&history, &finals(12, 12))[0].problems.is_empty(),
            "failed add applied"
        );
        assert!(
            !check(&history, &finals(10, 10))[0].problems.is_empty(),
            "the ok add of 5 applied twice"
        );
        assert!(
            !check(&history, &finals(4, 5))[0].problems.is_empty(),
            "divergence"
        );
        assert!(
            !check(&history, &BTreeMap::new())[0].problems.is_empty(),
            "no final read"
        );
    }

    #[test]
    fn malformed_lines_name_their_line() {
        let err = parse("\n{\"process\":1}\n").unwrap_err();
        assert_eq!(err.line, 2);
    }
}
