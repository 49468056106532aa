//! The fencing checker for owned keys, from the history alone: per shard, no lease epoch
//! is accepted in two regions, and no write is accepted at an epoch once a write at a
//! higher epoch had completed before it was invoked (the old holder kept writing after a
//! newer holder had started: its lease had ended). Only `ok` writes count; `fail` and
//! `info` ones promise nothing.

use std::collections::BTreeMap;

use crate::history::{Event, EventType, Function, operations};

/// One anomaly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub shard: u32,
    pub kind: ViolationKind,
    pub detail: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ViolationKind {
    /// Two regions accepted writes in one epoch: two holders.
    SharedEpoch,
    /// A write accepted at an epoch below one already completed before it began.
    StaleEpoch,
    /// An accepted owned write without an epoch.
    Unstamped,
}

struct Write<'a> {
    region: &'a str,
    epoch: u64,
    invoke_ns: u64,
    ok_ns: u64,
    key: &'a str,
}

pub fn check(history: &[Event]) -> Vec<Violation> {
    let mut out = Vec::new();
    let mut by_shard: BTreeMap<u32, Vec<Write<'_>>> = BTreeMap::new();
    for op in operations(history) {
        let Some(done) = op.completion else { continue };
        if op.invoke.f != Function::Write || done.kind != EventType::Ok {
            continue;
        }
        let Some(shard) = op.invoke.shard.or(done.shard) else {
            continue; // a shared key
        };
        let Some(epoch) = done.epoch else {
            out.push(Violation {
                shard,
                kind: ViolationKind::Unstamped,
                detail: format!("{} accepted {:?} with no epoch", done.region, done.key),
            });
            continue;
        };
        by_shard.entry(shard).or_default().push(Write {
            region: &done.region,
            epoch,
            invoke_ns: op.invoke.time_ns,
            ok_ns: done.time_ns,
            key: &done.key,
        });
    }
    for (shard, mut writes) in by_shard {
        let mut owner: BTreeMap<u64, &str> = BTreeMap::new();
        for w in &writes {
            let first = owner.entry(w.epoch).or_insert(w.region);
            if *first != w.region {
                out.push(Violation {
                    shard,
                    kind: ViolationKind::SharedEpoch,
                    detail: format!("epoch {} accepted in {first} and {}", w.epoch, w.region),
                });
            }
        }
        // sweep the writes by invocation, with the highest epoch completed before each
        let mut completed: Vec<(u64, u64, &str)> =
            writes.iter().map(|w| (w.ok_ns, w.epoch, w.key)).collect();
        completed.sort();
        writes.sort_by_key(|w| w.invoke_ns);
        let (mut next, mut highest): (usize, Option<(u64, &str)>) = (0, None);
        for w in &writes {
            while next < completed.len() && completed[next].0 < w.invoke_ns {
                let (_, epoch, key) = completed[next];
                if highest.is_none_or(|(h, _)| epoch > h) {
                    highest = Some((epoch, key));
                }
                next += 1;
            }
            if let Some((h, key)) = highest
                && w.epoch < h
            {
                out.push(Violation {
                    shard,
                    kind: ViolationKind::StaleEpoch,
                    detail: format!(
                        "{} accepted {:?} at epoch {} after epoch {h} ({key:?}) had completed",
                        w.region, w.key, w.epoch
                    ),
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::parse;

    fn write(p: u64, region: &str, epoch: u64, from: u64, to: u64) -> String {
        format!(
            "{{\"process\":{p},\"type\":\"invoke\",\"f\":\"write\",\"key\":\"surge/a\",\"value\":{p},\"region\":\"{region}\",\"time_ns\":{from},\"shard\":1}}\n\
             {{\"process\":{p},\"type\":\"ok\",\"f\":\"write\",\"key\":\"surge/a\",\"value\":{p},\"region\":\"{region}\",\"time_ns\":{to},\"shard\":1,\"epoch\":{epoch}}}\n"
        )
    }

    fn kinds(history: &str) -> Vec<ViolationKind> {
        check(&parse(history).unwrap())
            .into_iter()
            .map(|v| v.kind)
            .collect()
    }

    #[test]
    fn a_clean_failover_passes_even_with_overlapping_writes() {
        // a's epoch-1 write still in flight when b's epoch-2 write completes: allowed
        let h = write(1, "a", 1, 10, 20)
            + &write(2, "a", 1, 30, 90)
            + &write(3, "b", 2, 40, 60)
            + &write(4, "b", 2, 100, 110);
        assert_eq!(kinds(&h), []);
    }

    #[test]
    fn two_holders_in_one_epoch_are_flagged() {
        let h = write(1, "a", 3, 10, 20) + &write(2, "b", 3, 30, 40);
        assert_eq!(kinds(&h), [ViolationKind::SharedEpoch]);
    }

    #[test]
    fn a_write_at_an_old_epoch_after_a_newer_one_completed_is_flagged() {
        let h = write(1, "b", 2, 10, 20) + &write(2, "a", 1, 30, 40);
        assert_eq!(kinds(&h), [ViolationKind::StaleEpoch]);
    }

    #[test]
    fn an_unstamped_owned_write_is_flagged() {
        let h = write(1, "a", 1, 10, 20).replace(",\"epoch\":1", "");
        assert_eq!(kinds(&h), [ViolationKind::Unstamped]);
    }
}
