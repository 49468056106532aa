//! The owned-append checker (Jepsen's list-append, one key at a time). Each append reads
//! the list at the lease holder and writes it back one element longer by compare-and-set,
//! so under a correct lease the list only grows. Flagged: two observed lists neither of
//! which is a prefix of the other (divergence); an element twice, or never appended, or
//! whose append failed; an `ok` append missing from the final list (lost); a read that
//! began after another read or an `ok` append had ended but saw less (stale).

use std::collections::{BTreeMap, BTreeSet};

use crate::history::{Event, EventType, Function, operations};

/// Every problem found, one line each. `finals`: key → the list every region ended with.
pub fn check(history: &[Event], finals: &BTreeMap<String, Vec<i64>>) -> Vec<String> {
    let mut problems = Vec::new();
    let ops = operations(history);
    let keys: BTreeSet<&str> = ops
        .iter()
        .filter(|o| matches!(o.invoke.f, Function::Append | Function::Read))
        .map(|o| o.invoke.key.as_str())
        .chain(finals.keys().map(String::as_str))
        .collect();
    for key in keys {
        let of_key = || ops.iter().filter(move |o| o.invoke.key == key);
        // reads: (invoked, ended, list)
        let reads: Vec<(u64, u64, &[i64])> = of_key()
            .filter(|o| o.invoke.f == Function::Read && o.kind() == EventType::Ok)
            .filter_map(|o| {
                let list = o.completion?.list.as_deref().unwrap_or_default();
                Some((o.invoke.time_ns, o.end_ns(), list))
            })
            .collect();
        let final_list = finals.get(key).map(Vec::as_slice).unwrap_or_default();
        // the longest list observed; every other must be its prefix
        let longest = reads
            .iter()
            .map(|r| r.2)
            .chain([final_list])
            .max_by_key(|l| l.len())
            .unwrap_or_default();
        for (_, _, list) in &reads {
            if !longest.starts_with(list) {
                problems.push(format!(
                    "{key}: diverged: read {list:?}, not a prefix of {longest:?}"
                ));
            }
        }
        if !longest.starts_with(final_list) {
            problems.push(format!(
                "{key}: diverged: final {final_list:?}, not a prefix of {longest:?}"
            ));
        }
        let mut seen = BTreeSet::new();
        for x in longest {
            if !seen.insert(*x) {
                problems.push(format!("{key}: {x} appended twice: {longest:?}"));
            }
        }
        let appends: BTreeMap<i64, (EventType, u64)> = of_key()
            .filter(|o| o.invoke.f == Function::Append)
            .filter_map(|o| Some((o.invoke.value?, (o.kind(), o.end_ns()))))
            .collect();
        let position: BTreeMap<i64, usize> =
            longest.iter().enumerate().map(|(i, x)| (*x, i)).collect();
        for x in longest {
            match appends.get(x) {
                None => problems.push(format!("{key}: {x} was never appended")),
                Some((EventType::Fail, _)) => {
                    problems.push(format!("{key}: {x} is in the list, but its append failed"))
                }
                _ => {}
            }
        }
        for (x, (kind, _)) in &appends {
            if *kind == EventType::Ok && !final_list.contains(x) {
                problems.push(format!(
                    "{key}: the acknowledged append of {x} is not in the final list: lost"
                ));
            }
        }
        // real time: what had ended before a read began, the read must see
        let mut ended: Vec<(u64, usize)> = reads.iter().map(|r| (r.1, r.2.len())).collect();
        for (x, (kind, end)) in &appends {
            if let (EventType::Ok, Some(i)) = (kind, position.get(x)) {
                ended.push((*end, i + 1));
            }
        }
        ended.sort_unstable();
        let mut most = Vec::with_capacity(ended.len());
        let mut m = 0;
        for (_, len) in &ended {
            m = m.max(*len);
            most.push(m);
        }
        for (invoked, _, list) in &reads {
            let before = ended.partition_point(|(end, _)| end < invoked);
            if before > 0 && most[before - 1] > list.len() {
                problems.push(format!(
                    "{key}: stale read: {} element(s) seen, but {} were acknowledged or read before it began",
                    list.len(),
                    most[before - 1]
                ));
            }
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::parse;

    /// `(process, f, value, invoke, completion, end)`; a read's value is its list.
    type Spec<'a> = (u64, &'a str, &'a [i64], u64, &'a str, u64);

    fn history(ops: &[Spec<'_>]) -> Vec<Event> {
        let mut lines = Vec::new();
        for &(p, f, v, from, kind, to) in ops {
            let (value, list) = if f == "read" {
                ("null".to_string(), format!(r#","list":{v:?}"#))
            } else {
                (v[0].to_string(), String::new())
            };
            lines.push((from, format!(
                r#"{{"process":{p},"type":"invoke","f":"{f}","key":"surge/l","value":{value},"region":"a","time_ns":{from}}}"#
            )));
            lines.push((to, format!(
                r#"{{"process":{p},"type":"{kind}","f":"{f}","key":"surge/l","value":{value},"region":"a","time_ns":{to}{}}}"#,
                if kind == "ok" { list.as_str() } else { "" }
            )));
        }
        lines.sort_by_key(|(t, _)| *t);
        parse(
            &lines
                .into_iter()
                .map(|(_, l)| l)
                .collect::<Vec<_>>()
                .join("\n"),
        )
        .unwrap()
    }

    fn finals(list: &[i64]) -> BTreeMap<String, Vec<i64>> {
        BTreeMap::from([("surge/l".to_string(), list.to_vec())])
    }

    #[test]
    fn a_growing_list_passes() {
        let h = history(&[
            (1, "append", &[1], 0, "ok", 10),
            (2, "read", &[1], 20, "ok", 30),
            (3, "append", &[2], 25, "info", 40),
            (4, "append", &[3], 50, "fail", 60),
            (5, "read", &[1, 2], 70, "ok", 80),
        ]);
        assert_eq!(check(&h, &finals(&[1, 2])), Vec::<String>::new());
    }

    #[test]
    fn lost_stale_diverged_and_phantom_elements_are_flagged() {
        let lost = history(&[
            (1, "append", &[1], 0, "ok", 10),
            (2, "append", &[2], 20, "ok", 30),
        ]);
        assert!(
            check(&lost, &finals(&[2]))
                .iter()
                .any(|p| p.contains("lost"))
        );
        let stale = history(&[
            (1, "append", &[1], 0, "ok", 10),
            (2, "append", &[2], 20, "ok", 30),
            (3, "read", &[1], 40, "ok", 50),
        ]);
        assert_eq!(check(&stale, &finals(&[1, 2])).len(), 1);
        let diverged = history(&[
            (1, "append", &[1], 0, "ok", 10),
            (2, "append", &[2], 20, "info", 30),
            (3, "append", &[3], 20, "info", 30),
            (4, "read", &[1, 2], 40, "ok", 50),
        ]);
        assert!(!check(&diverged, &finals(&[1, 3])).is_empty());
        let failed = history(&[(1, "append", &[1], 0, "fail", 10)]);
        assert_eq!(check(&failed, &finals(&[1])).len(), 1);
        let twice = history(&[(1, "append", &[1], 0, "ok", 10)]);
        assert_eq!(check(&twice, &finals(&[1, 1])).len(), 1);
    }
}
