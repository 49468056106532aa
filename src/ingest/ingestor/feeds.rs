//! A task per partition read: the reader hands each partition's records to its task, in
//! the order read, and reads on; each task applies and commits its partition's records
//! one part after another under the partition's writer, so partitions apply in parallel
//! with each other and with the reading.
//!
//! ```text
//!  Reader ──batch──► split by partition ──► inputs of p (bounded) ──► task of p: apply, commit
//!         ──past the end at the take──► ReadPast ─────────────────►  (in order) replayed
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

use super::{Applying, IngestError, Ingestor};
use crate::ingest::batch::{Grants, Record};
use crate::log::Reader;
use crate::partition::{Owned, PartitionHandle};
use crate::shutdown::stopped;

/// Inputs a partition's task may hold beyond the one it applies: how far the reader reads
/// ahead of applying (each is at most `ingest.batch-max-events` records; the outbox bound,
/// `replication.max-outbox-keys`, is checked before each is applied).
const READ_AHEAD: usize = 2;

/// What the reader hands a partition's task, in the order it read it.
enum Input {
    /// Records of the partition, the first received at this instant.
    Records(Vec<Record>, Instant),
    /// The reader consumed the partition up to the end it had when this node took it:
    /// once what was handed before is committed, the partition is replayed (the records
    /// left, if any, are ones nobody applies, such as a transaction marker).
    ReadPast(i64),
}

/// How a partition's task ended.
pub(super) enum Ended {
    /// Its inputs closed (a drain): it finished the part it applied, if any.
    Drained,
    /// Asked to stop meanwhile.
    Stopped,
    /// Its term ended ([`PartitionHandle::cut`]): a part was not committed.
    Cut,
}

/// The tasks of the partitions one reader reads.
pub(super) struct Feeds {
    inputs: BTreeMap<i32, mpsc::Sender<Input>>,
    /// Turned true to end the tasks after the part each applies.
    closing: watch::Sender<bool>,
    tasks: JoinSet<Result<Ended, IngestError>>,
    /// Partitions told they were read past their end (told once).
    read_past: BTreeSet<i32>,
}

/// No tasks: nothing read yet.
impl Default for Feeds {
    fn default() -> Self {
        Self {
            inputs: BTreeMap::new(),
            closing: watch::Sender::new(false),
            tasks: JoinSet::new(),
            read_past: BTreeSet::new(),
        }
    }
}

impl Feeds {
    /// A task for each partition of `read`, applying in the partition's term.
    pub(super) fn start(
        ingestor: &Arc<Ingestor>,
        read: &Owned,
        shutdown: &watch::Receiver<bool>,
    ) -> Self {
        let mut feeds = Self::default();
        for (&p, handle) in read {
            let (input, inputs) = mpsc::channel(READ_AHEAD);
            feeds.inputs.insert(p, input);
            let closing = feeds.closing.subscribe();
            let task = feed(
                ingestor.clone(),
                handle.clone(),
                inputs,
                closing,
                shutdown.clone(),
            );
            feeds.tasks.spawn(task);
        }
        feeds
    }

    /// Hands each partition's records of a batch to its task (false: a task ended, its
    /// records were not handed).
    pub(super) async fn hand(&mut self, records: Vec<Record>, received: Instant) -> bool {
        let mut parts: BTreeMap<i32, Vec<Record>> = BTreeMap::new();
        for record in records {
            parts.entry(record.partition).or_default().push(record);
        }
        for (p, records) in parts {
            if !self.send(p, Input::Records(records, received)).await {
                return false;
            }
        }
        true
    }

    async fn send(&mut self, partition: i32, input: Input) -> bool {
        match self.inputs.get(&partition) {
            Some(inputs) => inputs.send(input).await.is_ok(),
            // never: the reader reads only the partitions it has tasks for
            None => false,
        }
    }

    /// Marks each partition replayed once it applied up to the end it had when this node
    /// took it, or, through its task (after what it was handed), once the reader consumed
    /// up to there.
    pub(super) async fn note_replayed(&mut self, reader: &Reader, read: &Owned) {
        for (&p, handle) in read {
            let Some(end) = handle.replay_to() else {
                continue;
            };
            if handle.applied().is_some_and(|o| o + 1 >= end) {
                replayed(handle, end);
            } else if reader.position(p).is_some_and(|o| o >= end) && self.read_past.insert(p) {
                self.send(p, Input::ReadPast(end)).await;
            }
        }
    }

    /// How a task that ended on its own (stopped, cut or failed) ended; pending while
    /// every task runs, `None` without tasks.
    pub(super) async fn next_ended(&mut self) -> Option<Result<Ended, IngestError>> {
        let ended = self.tasks.join_next().await?;
        Some(ended.map_err(IngestError::from).and_then(|e| e))
    }

    /// Ends every task once it finished the part it applies, dropping what it was handed
    /// beyond it (the next reader reads it again, after the applied offsets); false: asked
    /// to stop meanwhile.
    pub(super) async fn drain(&mut self) -> Result<bool, IngestError> {
        self.closing.send_replace(true);
        self.inputs.clear();
        // every task joined, whatever the first to fail said
        let (mut stopped, mut failed) = (false, None);
        while let Some(ended) = self.next_ended().await {
            match ended {
                Ok(ended) => stopped |= matches!(ended, Ended::Stopped),
                Err(e) => failed = failed.or(Some(e)),
            }
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(!stopped),
        }
    }
}

/// A partition's task: applies the inputs the reader hands it, in order, in `handle`'s
/// term, until `closing` or `shutdown` turns true or the term ends.
async fn feed(
    ingestor: Arc<Ingestor>,
    handle: Arc<PartitionHandle>,
    mut inputs: mpsc::Receiver<Input>,
    mut closing: watch::Receiver<bool>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<Ended, IngestError> {
    let mut grants = Grants::default();
    loop {
        let input = tokio::select! {
            biased;
            () = stopped(&mut shutdown) => return Ok(Ended::Stopped),
            // what was handed beyond the part applied is read again by the next reader
            _ = closing.wait_for(|&c| c) => return Ok(Ended::Drained),
            input = inputs.recv() => input,
        };
        match input {
            None => return Ok(Ended::Drained),
            Some(Input::Records(records, received)) => {
                let applying = (ingestor)
                    .apply(&handle, records, received, &mut grants, &mut shutdown)
                    .await?;
                match applying {
                    Applying::Done => {}
                    Applying::Stopped => return Ok(Ended::Stopped),
                    Applying::Cut => return Ok(Ended::Cut),
                }
            }
            Some(Input::ReadPast(end)) => {
                if handle.replay_to().is_some() {
                    replayed(&handle, end);
                }
            }
        }
    }
}

fn replayed(handle: &PartitionHandle, end: i64) {
    handle.replayed();
    tracing::info!(
        partition = handle.partition,
        end,
        "replayed the partition as it was when this node took it"
    );
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::ingest::ingestor::tests::offline_ingestor;
    use crate::partition::Partitions;
    use crate::store::{StateWriter, Store};

    /// Turned true to stop the tasks (they stop too once it is dropped).
    type Stop = watch::Sender<bool>;

    fn add(offset: i64) -> Record {
        Record {
            partition: 0,
            offset,
            timestamp_ms: Some(1_700_000_000_000),
            key: Some(b"trips/a".to_vec()),
            payload: Some(br#"{"key":"trips/a","add":1}"#.to_vec()),
        }
    }

    /// Partition 0 taken (nothing applied, to be replayed to offset 2) and its task
    /// started, with the partition's writer held by the test: the task waits in its
    /// first part until the test lets it go.
    async fn blocked_task() -> (Arc<Store>, Arc<PartitionHandle>, Feeds, StateWriter, Stop) {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(&dir.keep(), 1).unwrap());
        let owned = Arc::new(Partitions::default());
        let ingestor = Arc::new(offline_ingestor(store.clone(), owned.clone()));
        let handle = owned.take(0, None, 2);
        let writer = store.writer(0).await;
        let (stop, shutdown) = watch::channel(false);
        let read = Owned::from([(0, handle.clone())]);
        let feeds = Feeds::start(&ingestor, &read, &shutdown);
        (store, handle, feeds, writer, stop)
    }

    /// The reader passing a partition's end marks it replayed only once what it handed
    /// before is committed: a replayed partition's shipper may send heartbeats, which
    /// tell other regions nothing below them is missing.
    #[tokio::test]
    async fn a_partition_read_past_its_end_is_replayed_only_once_what_came_before_is_committed() {
        let (_store, handle, mut feeds, writer, _stop) = blocked_task().await;
        assert!(feeds.hand(vec![add(0), add(1)], Instant::now()).await);
        assert!(feeds.send(0, Input::ReadPast(2)).await);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!((handle.applied(), handle.replay_to()), (None, Some(2)));
        drop(writer);
        let mut replay = handle.replay();
        replay.wait_for(Option::is_none).await.unwrap();
        assert_eq!(handle.applied(), Some(1));
    }

    /// A drain lets each task finish the part it applies and drops what was handed beyond
    /// it: the next reader reads that again, after the applied offsets.
    #[tokio::test]
    async fn a_drain_finishes_the_part_applied_and_leaves_the_rest_to_be_read_again() {
        let (store, handle, mut feeds, writer, _stop) = blocked_task().await;
        assert!(feeds.hand(vec![add(0)], Instant::now()).await);
        // taken by the task: it waits for the writer with its first part
        while feeds.inputs[&0].capacity() < READ_AHEAD {
            tokio::task::yield_now().await;
        }
        assert!(feeds.hand(vec![add(1)], Instant::now()).await);
        assert!(feeds.hand(vec![add(2)], Instant::now()).await);
        let drained = tokio::spawn(async move { feeds.drain().await.unwrap() });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!drained.is_finished(), "a drain waits for the part applied");
        drop(writer);
        assert!(drained.await.unwrap());
        assert_eq!(handle.applied(), Some(0));
        assert_eq!(
            store.source_offsets("geostate.updates").unwrap(),
            BTreeMap::from([(0, 0)])
        );
    }
}
