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

/// One record of a region's outputs topic (`geostate.outputs`): a final window, as the
/// server writes it (its count an int64), or a row of the table the sinks wrote it into.
pub type Output = geostate_proto::outputs::FinalWindow;

/// Checks every region's outputs (`region` → the records its outputs topic holds for the
/// run's keys, `read_committed`) against the windows final in every region at the end,
/// read for the windows starting in `[from, to)`: each final window that counted an add
/// is in each region's outputs exactly once, with its final value there, and no other
/// window of the range is (a window nothing was added to has no slice, so nothing to
/// produce).
pub fn check_outputs(
    finals: &BTreeMap<String, BTreeMap<String, i64>>,
    outputs: &BTreeMap<String, Vec<Output>>,
    range: (u64, u64),
) -> Vec<String> {
    let mut problems = Vec::new();
    for (region, records) in outputs {
        problems.extend(check_records(
            &format!("{region}'s outputs"),
            finals,
            |by_region| by_region.get(region).copied(),
            records,
            range,
        ));
    }
    problems
}

/// Checks the rows the PostgreSQL sinks wrote for the run's keys (`geostate_outputs`)
/// as [`check_outputs`] checks a region's outputs topic: each final window that counted
/// an add is one row with its final value, and no other window of the range is a row.
pub fn check_table(
    finals: &BTreeMap<String, BTreeMap<String, i64>>,
    rows: &[Output],
    range: (u64, u64),
) -> Vec<String> {
    // the regions agree on a final window (checked with the reads); any one stands
    check_records(
        "the PostgreSQL table",
        finals,
        |by_region| by_region.values().next().copied(),
        rows,
        range,
    )
}

/// `records` (named `what`) against `finals`, each window's value taken by `value_of`.
fn check_records(
    what: &str,
    finals: &BTreeMap<String, BTreeMap<String, i64>>,
    value_of: impl Fn(&BTreeMap<String, i64>) -> Option<i64>,
    records: &[Output],
    (from, to): (u64, u64),
) -> Vec<String> {
    let mut problems = Vec::new();
    let mut seen: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for o in records.iter().filter(|o| (from..to).contains(&o.start_ms)) {
        seen.entry(window_key(&o.key, o.start_ms))
            .or_default()
            .push(o.value);
    }
    for (key, by_region) in finals {
        let Some(value) = value_of(by_region) else {
            continue;
        };
        match seen.remove(key).as_deref() {
            None if value == 0 => {}
            Some([v]) if *v == value => {}
            Some([v]) => problems.push(format!("{key}: {what} hold {v}, the window is {value}")),
            Some(many) => problems.push(format!(
                "{key}: {what} hold it {} times: {many:?}",
                many.len()
            )),
            None => problems.push(format!("{key}: final, and not in {what}")),
        }
    }
    for (key, values) in seen {
        problems.push(format!(
            "{key}: in {what} ({values:?}), and not final everywhere at the end"
        ));
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::parse;

    #[test]
    fn each_final_window_once_in_each_regions_outputs_passes_and_all_else_is_caught() {
        let finals = finals((5, 5), Some((2, 2)));
        let out = |start_ms, value, region: &str| Output {
            key: "k".into(),
            start_ms,
            end_ms: start_ms + MIN,
            value,
            region: region.into(),
        };
        let both = |records: Vec<Output>| {
            BTreeMap::from([
                ("a".to_string(), records.clone()),
                ("b".to_string(), records),
            ])
        };
        let check_outputs = |finals: &BTreeMap<String, BTreeMap<String, i64>>,
                             outputs: &BTreeMap<String, Vec<Output>>| {
            check_outputs(finals, outputs, (0, 3 * MIN))
        };
        let right = vec![out(0, 5, "a"), out(MIN, 2, "a")];
        assert_eq!(
            check_outputs(&finals, &both(right.clone())),
            Vec::<String>::new()
        );
        // a window nothing counted in has nothing to produce; one past the range is not judged
        let mut empty = finals.clone();
        empty.insert(
            window_key("k", 2 * MIN),
            BTreeMap::from([("a".into(), 0), ("b".into(), 0)]),
        );
        let mut later = right.clone();
        later.push(out(3 * MIN, 9, "a"));
        assert_eq!(check_outputs(&empty, &both(later)), Vec::<String>::new());
        let twice = check_outputs(
            &finals,
            &both(vec![out(0, 5, "a"), out(0, 5, "a"), out(MIN, 2, "a")]),
        );
        assert!(twice.iter().any(|p| p.contains("2 times")), "{twice:?}");
        let missing = check_outputs(&finals, &both(vec![out(0, 5, "a")]));
        assert!(missing.iter().any(|p| p.contains("not in")), "{missing:?}");
        let wrong = check_outputs(&finals, &both(vec![out(0, 4, "a"), out(MIN, 2, "a")]));
        assert!(wrong.iter().any(|p| p.contains("hold 4")), "{wrong:?}");
        let open = check_outputs(
            &finals,
            &both(vec![out(0, 5, "a"), out(MIN, 2, "a"), out(2 * MIN, 1, "a")]),
        );
        assert!(
            open.iter().any(|p| p.contains("not final everywhere")),
            "{open:?}"
        );
        let table = |rows: Vec<Output>| check_table(&finals, &rows, (0, 3 * MIN));
        assert_eq!(table(right.clone()), Vec::<String>::new());
        let short = table(vec![out(0, 5, "a")]);
        assert!(
            short
                .iter()
                .any(|p| p.contains("not in the PostgreSQL table")),
            "{short:?}"
        );
        let off = table(vec![out(0, 5, "a"), out(MIN, 3, "b")]);
        assert!(off.iter().any(|p| p.contains("hold 3")), "{off:?}");
    }

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
