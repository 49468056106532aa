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

use super::merger::{Merger, Refusal, merge_and_commit};
use crate::clock::Hlc;
use crate::config::{Config, KafkaConfig, RemoteConfig};
use crate::crdt::{RESUME_KEY, RegionId, ResumePoint};
use crate::log::{self, LogError};
use crate::metrics as m;
use crate::store::{Commit, Store, StoreError};

/// How every read here gathers its batches: up to 1000 records, whatever has arrived.
const BATCHING: log::Batching = log::Batching {
    max: 1000,
    linger: Duration::ZERO,
    idle: None,
};

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
        "own delta {topic}/{partition}/{offset} cannot be merged yet ({reason}); its partition is not caught up past it"
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
    /// Per partition, the last offset read.
    pub through: BTreeMap<i32, i64>,
    /// The incarnations that wrote the resume points read.
    pub writers: BTreeSet<u32>,
}

/// Merges every committed delta of the region's own deltas topic into `store` and
/// positions ingest after the last resume point. Call with the shipping producer of this
/// node already initialised, before ingest starts.
pub async fn recover_own_past(
    config: &Arc<Config>,
    hlc: &Arc<Hlc>,
    store: &Arc<Store>,
) -> Result<Recovered, BootstrapError> {
    let mut all = Recovered::default();
    for p in log::partitions(&config.kafka, &config.kafka.deltas_topic).await? {
        let recovered = catch_up(config, hlc, store, p, &|| {}).await?.recovered;
        all.deltas += recovered.deltas;
        all.superseded += recovered.superseded;
        all.keys += recovered.keys;
        all.through.extend(recovered.through);
        all.writers.extend(recovered.writers);
        if let Some(resume) = recovered.resume {
            ResumePoint::absorb_into(&mut all.resume, resume);
        }
    }
    Ok(all)
}

/// How a partition this node takes caught up with what its region shipped.
#[derive(Debug)]
pub struct CaughtUp {
    pub recovered: Recovered,
    /// This node's copy held increments it never shipped while another node shipped the
    /// partition since: it was forgotten and the partition rebuilt from the deltas topic.
    pub discarded: bool,
}

/// Brings this node's copy of `partition` up to what its region shipped, before the node
/// ingests it: merges the region's own deltas partition from where the copy holds them
/// (the copy's last shipped round, catch-up or restore) to its end, and positions ingest
/// after the newest resume point. Call with the partition's shipping producer already
/// initialised (the previous owner fenced, its open round aborted).
///
/// A copy with unshipped outbox entries is kept only if every round shipped since came
/// from the incarnation that wrote those entries (the same actor's entry only grows, over
/// the same records): a round of another incarnation applied those records again under
/// its own actor, and merging both would count them twice, so the copy is discarded and
/// rebuilt from the deltas topic alone; `discarding` is called first (reads answered from
/// the copy must stop before it is rebuilt).
pub async fn catch_up(
    config: &Arc<Config>,
    hlc: &Arc<Hlc>,
    store: &Arc<Store>,
    partition: i32,
    discarding: &(dyn Fn() + Sync),
) -> Result<CaughtUp, BootstrapError> {
    // a writer of the copy that started before (an aborted shipper's last store writes)
    // finishes before anything of it is read
    drop(store.writer(partition).await);
    // a copy that will be discarded must not be read while another incarnation's rounds
    // are merged into it (they count its unshipped records a second time): found out
    // before merging anything
    if store.outbox_len_in(&BTreeSet::from([partition])) > 0 {
        let writer = store.outbox_writer(partition)?;
        let region = &config.region;
        let (_, shipped_by) =
            committed_since(&config.kafka, region, store, partition, "catch-up").await?;
        if shipped_by.iter().any(|&w| Some(w) != writer) {
            discarding();
        }
    }
    let mut discarded = false;
    loop {
        let recovered = merge_own_topic(config, hlc, store, vec![partition]).await?;
        let unshipped = store.outbox_len_in(&BTreeSet::from([partition])) > 0;
        let writer = store.outbox_writer(partition)?;
        let others = recovered.writers.iter().any(|&w| Some(w) != writer);
        if unshipped && others {
            tracing::warn!(
                partition,
                "this node's copy of the partition holds increments it never shipped, and another node shipped the partition since: discarding the copy and rebuilding it from the deltas topic"
            );
            discarding();
            // every key of the partition: off the async threads
            let (copy, writer) = (store.clone(), store.writer(partition).await);
            tokio::task::spawn_blocking(move || {
                let _writer = writer;
                copy.discard(partition)
            })
            .await
            .unwrap_or_else(|e| Err(StoreError::Task(e.to_string())))?;
            discarded = true;
            continue;
        }
        if let Some(resume) = &recovered.resume {
            resume_after(config, hlc, store, resume).await?;
            let _writer = store.writer(partition).await;
            // the final windows the rounds merged produced go out no second time
            if let Some(&through) = resume.outputs_through.get(&partition) {
                store.raise_outputs_through(partition, through)?;
            }
            // a round committed after this copy last cleared its outbox (it crashed in
            // between): the late events it covered were shipped, and go no second time
            if let Some(&through) = resume.updates_offsets.get(&partition) {
                let dropped = store.drop_records_through(partition, through)?;
                if dropped > 0 {
                    tracing::info!(
                        partition,
                        dropped,
                        through,
                        "late events a committed round already shipped, dropped from the outbox"
                    );
                }
            }
        }
        note_through(config, store, &recovered)?;
        return Ok(CaughtUp {
            recovered,
            discarded,
        });
    }
}

/// Brings this node's copy of `partition` up to the end of `remote`'s deltas there, from
/// the position the copy stored (a warm standby's refresh; the partition's merger goes
/// on from that position once this node takes it): merged as the merger merges, with
/// the position, under the merger's offsets id. Stops before a delta held for the
/// clock (read again at the next refresh). Answers how many deltas it merged.
pub async fn catch_up_remote(
    config: &Arc<Config>,
    hlc: &Arc<Hlc>,
    store: &Arc<Store>,
    remote: &RemoteConfig,
    partition: i32,
) -> Result<usize, BootstrapError> {
    let id = Merger::offsets_id(remote);
    let spec = log::ConsumerSpec {
        kafka: remote.kafka(&config.kafka),
        group: format!("geostate-standby-{}", config.region),
        report_end: true,
        topic: remote.topic.clone(),
        partitions: vec![partition],
        role: "standby",
    };
    let mut reader = log::Reader::start(spec, &store.source_offsets(&id)?).await?;
    let (_running, mut never_stopped) = tokio::sync::watch::channel(false);
    let mut merged = 0;
    loop {
        let Some(batch) = reader.next_batch(BATCHING, &mut never_stopped).await else {
            return Ok(merged);
        };
        if let Some(source) = batch.failed {
            let topic = remote.topic.clone();
            return Err(BootstrapError::Read { topic, source });
        }
        if !batch.records.is_empty() {
            let (store, config, hlc) = (store.clone(), config.clone(), hlc.clone());
            let origin = remote.region.clone();
            let batch_merged = merge_and_commit(
                store,
                config,
                hlc,
                batch.records,
                origin,
                Some(id.clone()),
                None,
            )
            .await?;
            merged += batch_merged.merged;
            if !batch_merged.held.is_empty() {
                return Ok(merged);
            }
        }
        if !batch.at_end.is_empty() {
            return Ok(merged);
        }
    }
}

/// Reads the own deltas topic's `partitions` to their end (from where the copy holds
/// them, or the beginning) and merges them; stops at the first delta that cannot be
/// merged and is not superseded. Records how far each partition was read.
/// A reader of `partitions` of this region's own deltas topic, from where the copy holds
/// every delta up to (`Store::own_deltas_through`).
async fn own_deltas(
    kafka: &KafkaConfig,
    region: &RegionId,
    store: &Arc<Store>,
    partitions: Vec<i32>,
    role: &'static str,
) -> Result<log::Reader, BootstrapError> {
    let from = store.bootstrap_offsets(&kafka.deltas_topic)?;
    let spec = log::ConsumerSpec {
        kafka: kafka.clone(),
        group: format!("geostate-bootstrap-{region}"),
        report_end: true,
        topic: kafka.deltas_topic.clone(),
        partitions,
        role,
    };
    Ok(log::Reader::start(spec, &from).await?)
}

/// The resume points committed on `partition` of this region's own deltas topic after
/// the position its copy holds every delta up to (`Store::own_deltas_through`), absorbed:
/// how far the rounds committed since cover. Reads to the end; merges nothing.
pub async fn committed_resume(
    kafka: &KafkaConfig,
    region: &RegionId,
    store: &Arc<Store>,
    partition: i32,
) -> Result<Option<ResumePoint>, BootstrapError> {
    Ok(committed_since(kafka, region, store, partition, "shipper")
        .await?
        .0)
}

/// [`committed_resume`], and the incarnations that wrote those resume points.
async fn committed_since(
    kafka: &KafkaConfig,
    region: &RegionId,
    store: &Arc<Store>,
    partition: i32,
    role: &'static str,
) -> Result<(Option<ResumePoint>, BTreeSet<u32>), BootstrapError> {
    let topic = kafka.deltas_topic.clone();
    let mut reader = own_deltas(kafka, region, store, vec![partition], role).await?;
    let (_running, mut never_stopped) = tokio::sync::watch::channel(false);
    let (mut resume, mut writers) = (None, BTreeSet::new());
    loop {
        let Some(batch) = reader.next_batch(BATCHING, &mut never_stopped).await else {
            return Ok((resume, writers));
        };
        if let Some(source) = batch.failed {
            return Err(BootstrapError::Read { topic, source });
        }
        for record in batch.records {
            if record.key.as_deref() == Some(RESUME_KEY)
                && let Ok(point) =
                    ResumePoint::decode(record.payload.as_deref().unwrap_or_default())
            {
                writers.insert(point.incarnation);
                ResumePoint::absorb_into(&mut resume, point);
            }
        }
        if batch.at_end.iter().any(|(p, _)| *p == partition) {
            return Ok((resume, writers));
        }
    }
}

async fn merge_own_topic(
    config: &Arc<Config>,
    hlc: &Arc<Hlc>,
    store: &Arc<Store>,
    partitions: Vec<i32>,
) -> Result<Recovered, BootstrapError> {
    let topic = config.kafka.deltas_topic.clone();
    let (kafka, region) = (&config.kafka, &config.region);
    let mut reader = own_deltas(kafka, region, store, partitions.clone(), "bootstrap").await?;
    // bootstrap runs before the node's tasks: nothing stops it but an error
    let (_running, mut never_stopped) = tokio::sync::watch::channel(false);
    let (mut at_end, mut keys) = (BTreeSet::new(), BTreeSet::new());
    let mut through: BTreeMap<i32, i64> = BTreeMap::new();
    let mut recovered = Recovered::default();
    while at_end.len() < partitions.len() {
        let Some(batch) = reader.next_batch(BATCHING, &mut never_stopped).await else {
            break;
        };
        for (p, next) in &batch.at_end {
            at_end.insert(*p);
            if let Some(next) = next {
                let at = through.entry(*p).or_insert(next - 1);
                *at = (*at).max(next - 1);
            }
        }
        for r in &batch.records {
            let at = through.entry(r.partition).or_insert(r.offset);
            *at = (*at).max(r.offset);
        }
        if let Some(source) = batch.failed {
            return Err(BootstrapError::Read { topic, source });
        }
        if batch.records.is_empty() {
            continue;
        }
        let region = config.region.clone();
        let (store, config, hlc) = (store.clone(), config.clone(), hlc.clone());
        let merged = merge_and_commit(
            store,
            config,
            hlc,
            batch.records,
            region.clone(),
            None,
            None,
        )
        .await?;
        let held = merged.held.into_iter().map(|(p, (o, why))| (p, o, why));
        let refused = merged.refused.into_iter().chain(held).collect();
        let (superseded, fatal) = sort_refusals(refused, &topic, region.as_str());
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
        recovered.writers.extend(merged.writers);
        if let Some(later) = merged.resume {
            ResumePoint::absorb_into(&mut recovered.resume, later);
        }
    }
    recovered.keys = keys.len();
    recovered.through = through;
    Ok(recovered)
}

/// Records how far the own deltas topic was merged: last, after the resume point it held
/// was applied (a crash before this merges the same deltas again, which is harmless; after
/// it, the next catch-up would never see that resume point again).
fn note_through(config: &Config, store: &Store, recovered: &Recovered) -> Result<(), StoreError> {
    for (&p, &offset) in &recovered.through {
        store.own_deltas_through(&config.kafka.deltas_topic, p, offset)?;
        metrics::gauge!(m::COPY_THROUGH, "partition" => p.to_string()).set(offset as f64);
    }
    Ok(())
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
    // the stored positions read and raised by their partitions' writers
    let writer = store
        .writers(resume.updates_offsets.keys().copied().collect())
        .await;
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
        let _writer = writer;
        // the records after the resume point are judged by the fence and the watermark as
        // of it
        let stored = store.fences()?;
        let fences: BTreeMap<(u32, i32), u64> = resume
            .fences
            .iter()
            .filter(|((_, partition), _)| later.contains_key(partition))
            .map(|(&id, &epoch)| (id, epoch.max(stored.get(&id).copied().unwrap_or(0))))
            .collect();
        let stored = store.watermarks()?;
        let watermarks: BTreeMap<i32, u64> = resume
            .watermarks
            .iter()
            .filter(|(partition, _)| later.contains_key(partition))
            .map(|(&p, &w)| (p, w.max(stored.get(&p).copied().unwrap_or(0))))
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
            watermarks: &watermarks,
            late: &[],
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

/// Sorts the refusals of a batch of own deltas: superseded by what the store already
/// holds (an owned key's older epoch: skipped, nothing is lost), unmergeable here (a key
/// in no namespace or of another type now, or a record this region's shippers never
/// wrote: skipped, logged and counted, as a remote region's would be; ingest refuses such
/// keys too, so no state of theirs can be served), and the first held for the clock
/// (its stamp ahead: the catch-up is tried again, never past it).
fn sort_refusals(
    refused: Vec<(i32, i64, Refusal)>,
    topic: &str,
    region: &str,
) -> (usize, Option<(i32, i64, Refusal)>) {
    let mut superseded = 0;
    for r in refused {
        match &r.2 {
            Refusal::Fenced { .. } => superseded += 1,
            why if why.holds().is_some() => return (superseded, Some(r)),
            why => {
                tracing::error!(%topic, partition = r.0, offset = r.1, reason = %why, "an own delta cannot be merged here: skipped");
                metrics::counter!(m::DELTAS_REFUSED, "region" => region.to_string(), "reason" => why.code())
                    .increment(1);
            }
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
    fn an_own_delta_is_skipped_unless_the_clock_holds_it() {
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
        let sort = |refused| sort_refusals(refused, "geostate.deltas", "us-east-1");
        let (superseded, fatal) = sort(vec![fenced(1), fenced(2)]);
        assert_eq!((superseded, fatal.is_none()), (2, true));
        let no_namespace = (
            0,
            7,
            Refusal::NoNamespace {
                key: "gone/k".into(),
            },
        );
        let (superseded, fatal) = sort(vec![fenced(1), no_namespace]);
        assert_eq!((superseded, fatal.is_none()), (1, true));
        let ahead = (
            0,
            9,
            Refusal::Clock(crate::clock::ClockError::AheadOfLocal {
                remote: crate::clock::HlcTimestamp::new(9, 0),
                ahead: std::time::Duration::from_secs(9),
                max: std::time::Duration::from_millis(500),
            }),
        );
        let (_, fatal) = sort(vec![fenced(1), ahead]);
        assert_eq!(fatal.map(|(p, o, _)| (p, o)), Some((0, 9)));
    }
}
