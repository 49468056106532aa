//! What a fault cost the clients, from the history alone: per scope (each region's writes,
//! and writes anywhere), the longest stretch without an acknowledged write that overlaps
//! the fault, and how the operations invoked during the fault ended. Not a checker: a
//! fault is allowed to make a region unavailable; this says for how long.

use serde::Serialize;

use crate::history::{Event, EventType, Function, operations};

/// One scope's view of one fault.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Window {
    /// A region's name, or `any` (a write acknowledged in any region).
    pub scope: String,
    /// The longest time between two acknowledged writes of the scope that overlaps the
    /// fault, in milliseconds; up to the end of the history when no write was
    /// acknowledged after the fault ended.
    pub longest_gap_ms: f64,
    /// Writes invoked during the fault, by how they ended.
    pub ok: usize,
    pub fail: usize,
    pub info: usize,
}

/// Every operation that changes state: an owned list's append and a compare-and-set too
/// (without them an owned-append run showed no write at all).
fn is_write(e: &Event) -> bool {
    matches!(
        e.f,
        Function::Add | Function::Write | Function::Cas | Function::Append
    )
}

/// The windows of the fault `[start_ns, end_ns]`, one per region in `regions` and one for
/// `any`.
pub fn during(history: &[Event], regions: &[String], start_ns: u64, end_ns: u64) -> Vec<Window> {
    let last_ns = history.iter().map(|e| e.time_ns).max().unwrap_or(end_ns);
    let ops = operations(history);
    let scopes = regions
        .iter()
        .map(|r| (r.clone(), Some(r.as_str())))
        .chain([("any".to_string(), None)]);
    scopes
        .map(|(scope, region)| {
            let in_scope = |e: &Event| is_write(e) && region.is_none_or(|r| e.region == r);
            let mut acked: Vec<u64> = history
                .iter()
                .filter(|e| e.kind == EventType::Ok && in_scope(e))
                .map(|e| e.time_ns)
                .collect();
            acked.sort_unstable();
            let mut longest = 0;
            let mut previous = acked
                .iter()
                .rev()
                .find(|&&t| t < start_ns)
                .copied()
                .unwrap_or(start_ns);
            let mut recovered = false;
            for &t in acked.iter().filter(|&&t| t >= start_ns) {
                longest = longest.max(t - previous);
                previous = t;
                if t > end_ns {
                    recovered = true;
                    break;
                }
            }
            if !recovered {
                longest = longest.max(last_ns.saturating_sub(previous));
            }
            let (mut ok, mut fail, mut info) = (0, 0, 0);
            for op in ops
                .iter()
                .filter(|o| in_scope(o.invoke) && (start_ns..=end_ns).contains(&o.invoke.time_ns))
            {
                match op.kind() {
                    EventType::Ok => ok += 1,
                    EventType::Fail => fail += 1,
                    _ => info += 1,
                }
            }
            Window {
                scope,
                longest_gap_ms: longest as f64 / 1e6,
                ok,
                fail,
                info,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(process: u64, kind: EventType, region: &str, ms: u64) -> Event {
        Event {
            event_time: None,
            window: None,
            is_final: None,
            process,
            kind,
            f: Function::Add,
            key: "drivers/k".into(),
            value: Some(1),
            region: region.into(),
            time_ns: ms * 1_000_000,
            shard: None,
            epoch: None,
            expected: None,
            list: None,
            stamp: None,
        }
    }

    /// Region a acknowledges every 10 ms except between 100 and 700 ms (a fault from 120 to
    /// 300 ms); region b never stops.
    fn history() -> Vec<Event> {
        let mut h = Vec::new();
        for t in (0..1000).step_by(10) {
            if !(101..700).contains(&t) {
                h.push(ev(1, EventType::Invoke, "a", t));
                h.push(ev(1, EventType::Ok, "a", t + 1));
            }
            h.push(ev(2, EventType::Invoke, "b", t));
            h.push(ev(2, EventType::Ok, "b", t + 1));
        }
        h.push(ev(1, EventType::Invoke, "a", 150));
        h.push(ev(1, EventType::Info, "a", 650));
        h.sort_by_key(|e| e.time_ns);
        h
    }

    #[test]
    fn the_gap_overlapping_the_fault_is_measured_per_region_and_for_any() {
        let regions = vec!["a".to_string(), "b".to_string()];
        let w = during(&history(), &regions, 120_000_000, 300_000_000);
        assert_eq!(w[0].scope, "a");
        assert_eq!(w[0].longest_gap_ms, 600.0, "{w:?}"); // 101 ms → 701 ms
        assert_eq!((w[0].ok, w[0].fail, w[0].info), (0, 0, 1));
        assert_eq!(w[1].scope, "b");
        assert_eq!(w[1].longest_gap_ms, 10.0);
        assert_eq!(w[2].scope, "any");
        assert!(w[2].longest_gap_ms <= 10.0, "{w:?}");
    }

    /// An owned list's appends are its writes: the same history as appends measures the
    /// same; reads are not writes.
    #[test]
    fn appends_count_as_writes_and_reads_do_not() {
        let regions = vec!["a".to_string()];
        let as_f = |f: Function| -> Vec<Event> {
            history().into_iter().map(|e| Event { f, ..e }).collect()
        };
        let w = during(&as_f(Function::Append), &regions, 120_000_000, 300_000_000);
        assert_eq!((w[0].longest_gap_ms, w[0].info), (600.0, 1), "{w:?}");
        let w = during(&as_f(Function::Read), &regions, 120_000_000, 300_000_000);
        assert_eq!((w[0].ok, w[0].fail, w[0].info), (0, 0, 0), "{w:?}");
    }

    #[test]
    fn a_region_that_never_recovers_is_unavailable_to_the_end_of_the_history() {
        let mut h: Vec<Event> = history()
            .into_iter()
            .filter(|e| e.region != "a" || e.time_ns < 100_000_000)
            .collect();
        h.sort_by_key(|e| e.time_ns);
        let w = during(&h, &["a".to_string()], 120_000_000, 300_000_000);
        // the last ack of a is at 91 ms, the history ends at 991 ms
        assert_eq!(w[0].longest_gap_ms, 900.0, "{w:?}");
    }
}
