//! A counter's ledger, for a key whose final count is off: per region, round by round,
//! the records of the key each incarnation's shipping rounds covered on the updates
//! topic against how far that incarnation's entry rose in its delta, read back from the
//! region's own topics. A round whose entry rose by fewer than its records names the
//! writer and the offsets where an increment went missing (or, rising by more, where one
//! counted twice).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use geostate_jepsen::control::{ClusterFile, kafka_config};
use geostate_proto::pb;
use prost::Message as _;
use rdkafka::Message as _;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::{Offset, TopicPartitionList};

use crate::load::{Kind, Op};

const UPDATES_TOPIC: &str = "geostate.updates";
const DELTAS_TOPIC: &str = "geostate.deltas";
const RESUME_KEY: &[u8] = b"\0geostate.resume";
/// Longest a topic partition is read for.
const READ_FOR: Duration = Duration::from_secs(60);

/// One record of a partition, read from its start.
struct Record {
    offset: i64,
    key: Vec<u8>,
    value: Vec<u8>,
}

/// Every record of `topic`/`partition` on `kafka`, committed ones only.
fn read_partition(kafka: &str, topic: &str, partition: i32) -> anyhow::Result<Vec<Record>> {
    let consumer: BaseConsumer = kafka_config(kafka)
        .set("group.id", format!("chaos-ledger-{}", std::process::id()))
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true")
        .set("enable.auto.commit", "false")
        .create()?;
    let mut assignment = TopicPartitionList::new();
    assignment.add_partition_offset(topic, partition, Offset::Beginning)?;
    consumer.assign(&assignment)?;
    let (mut records, until) = (Vec::new(), Instant::now() + READ_FOR);
    while Instant::now() < until {
        match consumer.poll(Duration::from_millis(500)) {
            Some(Ok(m)) => records.push(Record {
                offset: m.offset(),
                key: m.key().unwrap_or_default().to_vec(),
                value: m.payload().unwrap_or_default().to_vec(),
            }),
            Some(Err(KafkaError::PartitionEOF(_))) => return Ok(records),
            Some(Err(e)) => return Err(e.into()),
            None => {}
        }
    }
    anyhow::bail!("{topic}/{partition} not read to its end within {READ_FOR:?}")
}

/// `region`'s own entries of a counter state, by incarnation (increments only).
fn own_entries(state: Option<&pb::CrdtState>, region: &str) -> BTreeMap<u32, u64> {
    let entries = match state.and_then(|s| s.kind.as_ref()) {
        Some(pb::crdt_state::Kind::GCounter(g)) => &g.entries,
        Some(pb::crdt_state::Kind::PnCounter(pn)) => &pn.increments,
        _ => return BTreeMap::new(),
    };
    entries
        .iter()
        .filter_map(|e| {
            let actor = e.actor.as_ref().filter(|a| a.region == region)?;
            Some((actor.incarnation, e.count))
        })
        .collect()
}

/// The ledger of counter `key` (every add +1) in each region that wrote it, as lines.
pub(crate) fn ledger(cluster: &ClusterFile, key: &str, ops: &[Op]) -> anyhow::Result<Vec<String>> {
    let mut lines = Vec::new();
    for (region, file) in &cluster.regions {
        let acked: Vec<(i32, i64)> = (ops.iter())
            .filter(|o| o.kind == Kind::Write && o.key == key && &o.region == region)
            .filter_map(|o| o.position)
            .collect();
        let Some(&(partition, _)) = acked.first() else {
            continue;
        };
        let records: Vec<i64> = read_partition(&file.kafka, UPDATES_TOPIC, partition)?
            .into_iter()
            .filter(|r| r.key == key.as_bytes())
            .map(|r| r.offset)
            .collect();
        lines.push(format!(
            "{region}, partition {partition}: {} records of {key} on the updates topic, {} acknowledged",
            records.len(),
            acked.len()
        ));
        let mut items = Vec::new();
        for r in read_partition(&file.kafka, DELTAS_TOPIC, partition)? {
            if r.key == RESUME_KEY {
                let resume = pb::ResumePoint::decode(r.value.as_slice())?;
                if let Some(&through) = resume.updates_offsets.get(&partition) {
                    let (offset, incarnation) = (r.offset, resume.incarnation);
                    items.push(Item::Resume {
                        offset,
                        incarnation,
                        through,
                    });
                }
            } else if r.key == key.as_bytes() {
                let delta = pb::Delta::decode(r.value.as_slice())?;
                items.push(Item::Delta(own_entries(delta.state.as_ref(), region)));
            }
        }
        let acked: Vec<i64> = acked.iter().map(|&(_, o)| o).collect();
        lines.extend(audit(&records, &acked, items));
    }
    Ok(lines)
}

/// What a region's own deltas partition holds for the ledger, in order.
#[derive(Debug)]
enum Item {
    /// A shipping round's end: its writer and the updates offset it covers.
    Resume {
        offset: i64,
        incarnation: u32,
        through: i64,
    },
    /// A delta of the key: the region's entries by incarnation.
    Delta(BTreeMap<u32, u64>),
}

/// Round by round, the key's update records (`records`, offsets; `acked` those
/// acknowledged) each round covered against how far the entries rose in its deltas: a
/// line per round where they differ, then the final entries.
fn audit(records: &[i64], acked: &[i64], items: Vec<Item>) -> Vec<String> {
    let mut lines = Vec::new();
    // the entries as of the last round, as of the deltas since, and the updates covered
    let (mut entries, mut seen, mut covered) =
        (BTreeMap::<u32, u64>::new(), BTreeMap::<u32, u64>::new(), -1);
    for item in items {
        match item {
            Item::Delta(own) => {
                for (incarnation, count) in own {
                    let at = seen.entry(incarnation).or_default();
                    *at = (*at).max(count);
                }
            }
            Item::Resume {
                offset,
                incarnation,
                through,
            } => {
                let round = |o: &&i64| **o > covered && **o <= through;
                let in_round = records.iter().filter(round).count() as u64;
                let acked_in = acked.iter().filter(round).count();
                let rose: u64 = (seen.iter())
                    .map(|(i, c): (&u32, &u64)| {
                        c.saturating_sub(entries.get(i).copied().unwrap_or(0))
                    })
                    .sum();
                if rose != in_round {
                    lines.push(format!(
                        "  round of #{incarnation} at deltas offset {offset}: updates {}..={through} hold {in_round} records of the key ({acked_in} acknowledged); its entries rose by {rose} ({entries:?} -> {seen:?})",
                        covered + 1
                    ));
                }
                entries = seen.clone();
                covered = covered.max(through);
            }
        }
    }
    let total: u64 = entries.values().sum();
    lines.push(format!(
        "  final entries {entries:?} = {total}; updates covered through {covered}"
    ));
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A round whose entry rose by fewer than its records is named; whole rounds are not.
    #[test]
    fn a_round_short_of_its_records_is_named() {
        let delta = |a: u64, b: u64| Item::Delta(BTreeMap::from([(1, a), (2, b)]));
        let resume = |offset, incarnation, through| Item::Resume {
            offset,
            incarnation,
            through,
        };
        // records 0..=5; #1 applies 0..=2, #2 takes over and applies 3..=5 but counts 2
        let items = vec![
            delta(2, 0),
            resume(1, 1, 1),
            delta(3, 0),
            resume(3, 1, 2),
            delta(3, 2),
            resume(5, 2, 5),
        ];
        let lines = audit(&[0, 1, 2, 3, 4, 5], &[0, 1, 2, 3, 4, 5], items);
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(
            lines[0].starts_with("  round of #2 at deltas offset 5: updates 3..=5 hold 3 records of the key (3 acknowledged); its entries rose by 2"),
            "{lines:?}"
        );
        assert!(lines[1].contains("= 5;"), "{lines:?}");
    }
}
