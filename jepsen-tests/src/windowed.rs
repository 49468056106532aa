//! The windowed-counter checker: every window final in every region is a counter of its
//! own, so the counter checker's rule applies per (key, window) — its value lies between
//! the `ok` adds whose event time falls in the window and those plus the `info` ones, the
//! same in every region; a `fail` add (a late one among them) never counts. And a final
//! window never changes: every read during the run that the server answered as final
//! equals the window's value at the end.

use std::collections::BTreeMap;

use crate::counter;
use crate::history::{Event, EventType, Function};

/// The name the checks give a key's window: `<key>@<window start>`.
pub fn window_key(key: &str, start_ms: u64) -> String {
    format!("{key}@{start_ms}")
}

/// Checks the history against the windows final in every region at the end:
/// `finals` maps [`window_key`] → region → value. Tumbling windows of `window_ms`.
pub fn check(
    history: &[Event],
    finals: &BTreeMap<String, BTreeMap<String, i64>>,
    window_ms: u64,
) -> Vec<String> {
    // each add counts in its event time's window; only windows final everywhere are judged
    let per_window: Vec<Event> = history
        .iter()
        .filter(|e| e.f == Function::Add)
        .filter_map(|e| {
            let t = e.event_time?;
            let key = window_key(&e.key, t - t % window_ms);
            finals
                .contains_key(&key)
                .then(|| Event { key, ..e.clone() })
        })
        .collect();
    let mut problems: Vec<String> = counter::check(&per_window, finals)
        .into_iter()
        .flat_map(|v| {
            let key = v.key;
            v.problems.into_iter().map(move |p| format!("{key}: {p}"))
        })
        .collect();
    for read in history
        .iter()
        .filter(|e| e.f == Function::Read && e.kind == EventType::Ok && e.is_final == Some(true))
    {
        let (Some(start), Some(value)) = (read.window, read.value) else {
            continue;
        };
        let key = window_key(&read.key, start);
        match finals.get(&key).and_then(|by| by.get(&read.region)) {
            Some(&at_end) if at_end == value => {}
            Some(&at_end) => problems.push(format!(
                "{key}: {} read it final as {value} at {} ns, and it is {at_end} at the end",
                read.region, read.time_ns
            )),
            None => problems.push(format!(
                "{key}: {} read it final at {} ns, and it is not final everywhere at the end",
                read.region, read.time_ns
            )),
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::parse;

    const MIN: u64 = 60_000;

    /// Two windows of `k`: minute 0 gets an ok add of 5 and a late (failed) add of 7,
    /// minute 1 an ok add of 2 and an indeterminate one of 1.
    const HISTORY: &str = r#"
{"process":1,"type":"invoke","f":"add","key":"k","value":5,"region":"a","time_ns":1,"event_time":1000}
{"process":1,"type":"ok","f":"add","key":"k","value":5,"region":"a","time_ns":2,"event_time":1000}
{"process":2,"type":"invoke","f":"add","key":"k","value":7,"region":"b","time_ns":3,"event_time":2000}
{"process":2,"type":"fail","f":"add","key":"k","value":7,"region":"b","time_ns":4,"event_time":2000}
{"process":3,"type":"invoke","f":"add","key":"k","value":2,"region":"b","time_ns":5,"event_time":61000}
{"process":3,"type":"ok","f":"add","key":"k","value":2,"region":"b","time_ns":6,"event_time":61000}
{"process":4,"type":"invoke","f":"add","key":"k","value":1,"region":"a","time_ns":7,"event_time":62000}
{"process":4,"type":"info","f":"add","key":"k","value":1,"region":"a","time_ns":8,"event_time":62000}
{"process":5,"type":"invoke","f":"read","key":"k","region":"a","time_ns":9,"window":0}
{"process":5,"type":"ok","f":"read","key":"k","value":5,"region":"a","time_ns":10,"window":0,"is_final":true}
"#;

    fn finals(
        zero: (i64, i64),
        one: Option<(i64, i64)>,
    ) -> BTreeMap<String, BTreeMap<String, i64>> {
        let by = |(a, b): (i64, i64)| BTreeMap::from([("a".to_string(), a), ("b".to_string(), b)]);
        let mut f = BTreeMap::from([(window_key("k", 0), by(zero))]);
        if let Some(one) = one {
            f.insert(window_key("k", MIN), by(one));
        }
        f
    }

    #[test]
    fn final_windows_holding_their_acknowledged_adds_pass() {
        let history = parse(HISTORY).unwrap();
        assert_eq!(
            check(&history, &finals((5, 5), Some((2, 2))), MIN),
            Vec::<String>::new()
        );
        assert_eq!(
            check(&history, &finals((5, 5), Some((3, 3))), MIN),
            Vec::<String>::new()
        );
        // a window not final everywhere is not judged
        assert_eq!(
            check(&history, &finals((5, 5), None), MIN),
            Vec::<String>::new()
        );
    }

    #[test]
    fn a_counted_late_add_a_lost_add_divergence_and_a_changed_final_window_are_caught() {
        let history = parse(HISTORY).unwrap();
        let late_counted = check(&history, &finals((12, 12), Some((2, 2))), MIN);
        assert!(
            late_counted.iter().any(|p| p.contains("k@0")),
            "{late_counted:?}"
        );
        let lost = check(&history, &finals((5, 5), Some((0, 0))), MIN);
        assert!(lost.iter().any(|p| p.contains("k@60000")), "{lost:?}");
        let split = check(&history, &finals((5, 5), Some((2, 3))), MIN);
        assert!(split.iter().any(|p| p.contains("disagree")), "{split:?}");
        // the final read saw 5; had the window been 4 at the end, it changed
        let mut lower = parse(HISTORY).unwrap();
        lower.retain(|e| e.process != 1);
        let changed = check(&lower, &finals((0, 0), Some((2, 2))), MIN);
        assert!(
            changed.iter().any(|p| p.contains("read it final as 5")),
            "{changed:?}"
        );
    }
}
