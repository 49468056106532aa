//! The register checker for last-writer-wins registers (shared, and owned ones too): the
//! value every region ended with was written by some operation, and no write was
//! acknowledged with a newer order stamp than that final value's — such a write would have
//! been lost, since a register keeps the value with the greatest stamp.

use std::collections::BTreeMap;

use crate::history::{Event, EventType, Function, Stamp};

/// A register's final read (agreed by every region): its value and order stamp.
pub type Final = (Option<i64>, Option<Stamp>);

/// Every problem found, one line each, for the keys in `finals`.
pub fn check(history: &[Event], finals: &BTreeMap<String, Final>) -> Vec<String> {
    let mut problems = Vec::new();
    for (key, (value, stamp)) in finals {
        let writes = history.iter().filter(|e| {
            e.key == *key && matches!(e.f, Function::Write | Function::Cas | Function::Append)
        });
        let mut written = false;
        for w in writes {
            if w.kind == EventType::Ok
                && let Some(acked) = &w.stamp
                && stamp.as_ref().is_none_or(|s| acked > s)
            {
                problems.push(format!(
                    "{key}: a write of {:?} was acknowledged at {acked:?}, newer than the final value's {stamp:?}: lost",
                    w.value
                ));
            }
            written |= w.kind == EventType::Invoke && w.value == *value;
        }
        if value.is_some() && !written && history.iter().any(|e| e.key == *key) {
            problems.push(format!("{key}: final value {value:?} was never written"));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::parse;

    fn stamp(epoch: u64, wall: u64, origin: &str) -> Stamp {
        Stamp {
            epoch,
            wall_nanos: wall,
            logical: 0,
            origin: origin.into(),
        }
    }

    fn write(p: u64, v: i64, kind: &str, acked: Option<&Stamp>) -> String {
        let invoke = format!(
            r#"{{"process":{p},"type":"invoke","f":"write","key":"zones/k","value":{v},"region":"a","time_ns":{p}}}"#
        );
        let stamp = acked.map_or(String::new(), |s| {
            format!(r#","stamp":{}"#, serde_json::to_string(s).unwrap())
        });
        format!(
            "{invoke}\n{{\"process\":{p},\"type\":\"{kind}\",\"f\":\"write\",\"key\":\"zones/k\",\"value\":{v},\"region\":\"a\",\"time_ns\":{}{stamp}}}",
            p + 1
        )
    }

    fn finals(value: i64, s: &Stamp) -> BTreeMap<String, Final> {
        BTreeMap::from([("zones/k".to_string(), (Some(value), Some(s.clone())))])
    }

    #[test]
    fn the_newest_acknowledged_write_wins() {
        let (s1, s2) = (stamp(0, 10, "a"), stamp(0, 20, "b"));
        let h = parse(&[write(1, 1, "ok", Some(&s1)), write(3, 2, "ok", Some(&s2))].join("\n"))
            .unwrap();
        assert_eq!(check(&h, &finals(2, &s2)), Vec::<String>::new());
    }

    #[test]
    fn a_lost_newer_write_and_a_value_never_written_are_flagged() {
        let (s1, s2) = (stamp(0, 10, "a"), stamp(0, 20, "b"));
        let h = parse(&[write(1, 1, "ok", Some(&s1)), write(3, 2, "ok", Some(&s2))].join("\n"))
            .unwrap();
        // the region kept 1, but 2 was acknowledged with a newer stamp
        assert_eq!(check(&h, &finals(1, &s1)).len(), 1);
        // a newer epoch orders first, whatever the clocks
        let fenced = stamp(1, 5, "a");
        assert_eq!(check(&h, &finals(1, &fenced)), Vec::<String>::new());
        assert_eq!(check(&h, &finals(7, &stamp(0, 30, "a"))).len(), 1);
    }
}
