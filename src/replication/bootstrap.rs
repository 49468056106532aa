//! Bootstrap of a node that starts on an empty disk (a lost or new volume).
//!
//! ```text
//!  own geostate.deltas ──read_committed, from the beginning to the end──► merge_batch
//!        ──► the region's past incarnations' own parts, the last ResumePoint
//!  store ◄── states; updates offsets and fences := resume point; clock ≥ its high-water
//!  then: a NEW incarnation; remote deltas topics read to their ends before serving
//! ```
//!
//! Guarantee: every event the region applied and shipped before the loss counts exactly
//! once. The shipper commits deltas and the resume point that covers them in one Kafka
//! transaction, and the shipping producer of this node was initialised (fencing any older
//! node of the region and aborting its open transaction) before this reads, so the merged
//! deltas hold exactly the events up to the resume point's offsets; ingest resumes after
//! them. Events applied but not shipped were lost with the disk and are applied again,
//! once, under the new incarnation, whose entries nothing old can absorb.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use super::merger::{Refusal, merge_and_commit};
use crate::clock::Hlc;
use crate::config::Config;
use crate::crdt::ResumePoint;
use crate::log::{self, LogError};
use crate::store::{Commit, Store, StoreError};

const BATCH: usize = 1000;

#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    #[error(transparent)]
    Log(#[from] LogError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("reading {topic}: {source}")]
    Read {
        topic: String,
        source: log::LogError,
    },
    #[error(
        "own delta {topic}/{partition}/{offset} cannot be merged ({reason}); refusing to start rather than lose it"
    )]
    Refused {
        topic: String,
        partition: i32,
        offset: i64,
        reason: Refusal,
    },
    #[error(
        "the last resume point on {topic} covers topic {found:?}, but this node ingests {expected:?}"
    )]
    OtherTopic {
        topic: String,
        found: String,
        expected: String,
    },
}

/// What the region's own deltas topic held.
#[derive(Debug, Default)]
pub struct Recovered {
    pub deltas: usize,
    /// Own deltas of owned keys below the epoch the key already holds: a restored
    /// checkpoint (or a later delta) carries a newer value, which wins every merge.
    pub superseded: usize,
    pub keys: usize,
    /// Every partition's last resume point, absorbed; `None` if the region never shipped
    /// anything.
    pub resume: Option<ResumePoint>,
}

/// Merges every committed delta of the region's own deltas topic into `store` and
/// positions ingest after the last resume point. Call with the shipping producer of this
/// node already initialised, before ingest starts.
pub async fn recover_own_past(
    config: &Arc<Config>,
    hlc: &Arc<Hlc>,
    store: &Arc<Store>,
) -> Result<Recovered, BootstrapError> {
    let recovered = merge_own_topic(config, hlc, store).await?;
    if let Some(resume) = &recovered.resume {
        resume_after(config, hlc, store, resume).await?;
    }
    Ok(recovered)
}

/// Reads the own deltas topic to its end (from where a restored copy was taken, or the
/// beginning) and merges it; stops at the first delta that cannot be merged and is not
/// superseded.
async fn merge_own_topic(
    config: &Arc<Config>,
    hlc: &Arc<Hlc>,
    store: &Arc<Store>,
) -> Result<Recovered, BootstrapError> {
    let topic = config.kafka.deltas_topic.clone();
    let partitions = log::partitions(&config.kafka, &topic).await?;
    // a restored store starts where its copy was taken; an empty one at the beginning
    let from = store.bootstrap_offsets(&topic)?;
    let spec = log::ConsumerSpec {
        kafka: config.kafka.clone(),
        group: format!("geostate-bootstrap-{}", config.region),
        report_end: true,
        topic: topic.clone(),
        partitions: partitions.clone(),
        role: "bootstrap",
    };
    let mut reader = log::Reader::start(spec, &from)?;
    let batching = log::Batching {
        max: BATCH,
        linger: Duration::ZERO,
        idle: None,
    };
    // bootstrap runs before the node's tasks: nothing stops it but an error
    let (_running, mut never_stopped) = tokio::sync::watch::channel(false);
    let (mut at_end, mut keys) = (BTreeSet::new(), BTreeSet::new());
    let mut recovered = Recovered::default();
    while at_end.len() < partitions.len() {
        let Some(batch) = reader.next_batch(batching, &mut never_stopped).await else {
            break;
        };
        at_end.extend(batch.at_end.iter().map(|(p, _)| *p));
        if let Some(source) = batch.failed {
            return Err(BootstrapError::Read { topic, source });
        }
        if batch.records.is_empty() {
            continue;
        }
        let (store, config, hlc) = (store.clone(), config.clone(), hlc.clone());
        let region = config.region.clone();
        let merged = merge_and_commit(store, config, hlc, batch.records, region, None).await?;
        let held = merged.held.into_iter().map(|(p, (o, why))| (p, o, why));
        let (superseded, fatal) = sort_refusals(merged.refused.into_iter().chain(held).collect());
        if let Some((partition, offset, reason)) = fatal {
            return Err(BootstrapError::Refused {
                topic,
                partition,
                offset,
                reason,
            });
        }
        recovered.superseded += superseded;
        recovered.deltas += merged.merged;
        keys.extend(merged.states.into_keys());
        if let Some(later) = merged.resume {
            ResumePoint::absorb_into(&mut recovered.resume, later);
        }
    }
    recovered.keys = keys.len();
    Ok(recovered)
}

/// Positions ingest after `resume` (with its fences) in every partition where it is later
/// than the restored copy: per partition, both are snapshots of that partition's one
/// history (its store is written one batch at a time), so one is at or past the other,
/// and the later one is kept. The clock starts past the resume point's high-water.
async fn resume_after(
    config: &Config,
    hlc: &Arc<Hlc>,
    store: &Arc<Store>,
    resume: &ResumePoint,
) -> Result<(), BootstrapError> {
    if resume.updates_topic != config.kafka.updates_topic {
        return Err(BootstrapError::OtherTopic {
            topic: config.kafka.deltas_topic.clone(),
            found: resume.updates_topic.clone(),
            expected: config.kafka.updates_topic.clone(),
        });
    }
    hlc.advance_past(resume.hlc_high_water);
    let current = store.source_offsets(&config.kafka.updates_topic)?;
    let later = later_partitions(&resume.updates_offsets, &current);
    if later.len() < resume.updates_offsets.len() {
        tracing::info!(restored = ?current, resume = ?resume.updates_offsets, "the restored copy is newer than the last resume point in some partitions; those resume after the copy");
    }
    if later.is_empty() {
        return Ok(());
    }
    let (store, resume, updates_topic, hlc) = (
        store.clone(),
        resume.clone(),
        config.kafka.updates_topic.clone(),
        hlc.clone(),
    );
    tokio::task::spawn_blocking(move || {
        // the records after the resume point are judged by the fence as of it
        let stored = store.fences()?;
        let fences: BTreeMap<(u32, i32), u64> = resume
            .fences
            .iter()
            .filter(|((_, partition), _)| later.contains_key(partition))
            .map(|(&id, &epoch)| (id, epoch.max(stored.get(&id).copied().unwrap_or(0))))
            .collect();
        store.commit(&Commit {
            topic: &updates_topic,
            states: &BTreeMap::new(),
            offsets: &later,
            outbox: &[],
            recent_ids: &BTreeMap::<String, VecDeque<String>>::new(),
            hlc_high_water: hlc.now(),
            remote_applied: None,
            fences: &fences,
        })
    })
    .await
    .unwrap_or_else(|e| Err(StoreError::Task(e.to_string())))?;
    Ok(())
}

/// The partitions where `resume` is past `current`, with its offsets.
fn later_partitions(
    resume: &BTreeMap<i32, i64>,
    current: &BTreeMap<i32, i64>,
) -> BTreeMap<i32, i64> {
    resume
        .iter()
        .filter(|(p, o)| current.get(p).copied().unwrap_or(-1) < **o)
        .map(|(p, o)| (*p, *o))
        .collect()
}

/// Splits the refusals of a batch of own deltas into those superseded by what the store
/// already holds (an owned key's older epoch: skipped, nothing is lost) and the first
/// that would lose data if skipped (the node must not start).
fn sort_refusals(refused: Vec<(i32, i64, Refusal)>) -> (usize, Option<(i32, i64, Refusal)>) {
    let mut superseded = 0;
    for r in refused {
        match r.2 {
            Refusal::Fenced { .. } => superseded += 1,
            _ => return (superseded, Some(r)),
        }
    }
    (superseded, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resume_point_is_kept_where_it_is_past_the_copy() {
        let resume = BTreeMap::from([(0, 5), (1, 7), (2, 9)]);
        let copy = BTreeMap::from([(0, 6), (1, 7), (2, 3)]);
        assert_eq!(later_partitions(&resume, &copy), BTreeMap::from([(2, 9)]));
        assert_eq!(
            later_partitions(&resume, &BTreeMap::new()),
            resume,
            "anything is past an empty store"
        );
        assert!(later_partitions(&BTreeMap::new(), &copy).is_empty());
    }

    #[test]
    fn an_own_delta_below_its_keys_epoch_is_skipped_and_anything_else_stops_the_start() {
        let fenced = |offset| {
            (
                2,
                offset,
                Refusal::Fenced {
                    key: "surge/9q8yy".into(),
                    epoch: 8,
                    highest: 9,
                },
            )
        };
        let (superseded, fatal) = sort_refusals(vec![fenced(1), fenced(2)]);
        assert_eq!((superseded, fatal.is_none()), (2, true));
        let no_namespace = (
            0,
            7,
            Refusal::NoNamespace {
                key: "gone/k".into(),
            },
        );
        let (_, fatal) = sort_refusals(vec![fenced(1), no_namespace]);
        assert_eq!(fatal.map(|(p, o, _)| (p, o)), Some((0, 7)));
    }
}
