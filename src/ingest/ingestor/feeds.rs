//! A task per partition read: each reads its partition's own queue of the node's client
//! ([`PartitionReader`]) and applies and commits what it reads, one part after another,
//! under the partition's writer; partitions read and apply in parallel, and none waits
//! behind another's records.
//!
//! ```text
//!  Split client ──queue of p──► task of p: read a part ─► apply, commit ─► read on
//!                                          past the end at the take ─► replayed
//!               ──own queue──► errors ─► the ingest task drains the tasks, a new client
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::watch;
use tokio::task::JoinSet;

use super::{Applying, IngestError, Ingestor, REPLAY_POLL};
use crate::ingest::batch::Grants;
use crate::log::{Batch, Batching, LogError, PartitionReader};
use crate::partition::{Owned, PartitionHandle};

/// Where a partition's task reads its records: its queue of the node's client
/// ([`PartitionReader`]), or a list in tests.
pub(super) trait Source: Send + 'static {
    /// The next batch, `None` once `stop` turned true ([`PartitionReader::next_batch`]).
    fn next_batch(
        &mut self,
        batching: Batching,
        stop: &mut watch::Receiver<bool>,
    ) -> impl Future<Output = Option<Batch>> + Send;
    /// The offset read next, if known.
    fn position(&self) -> Option<i64>;
}

impl Source for PartitionReader {
    fn next_batch(
        &mut self,
        batching: Batching,
        stop: &mut watch::Receiver<bool>,
    ) -> impl Future<Output = Option<Batch>> + Send {
        PartitionReader::next_batch(self, batching, stop)
    }
    fn position(&self) -> Option<i64> {
        PartitionReader::position(self)
    }
}

/// How a partition's task ended.
pub(super) enum Ended {
    /// Asked to end (a drain): it finished the part it applied, if any.
    Drained,
    /// Asked to stop meanwhile.
    Stopped,
    /// Its term ended ([`PartitionHandle::cut`]): a part was not committed.
    Cut,
    /// Reading failed, after what was read before was committed: a new client reads on.
    Failed(LogError),
}

/// How [`Feeds::drain`] ended.
pub(super) enum Drained {
    /// Asked to stop meanwhile.
    Stopped,
    /// Every task ended; the first read that failed meanwhile, if any.
    Done(Option<LogError>),
}

/// The tasks of the partitions one client reads.
pub(super) struct Feeds {
    /// Turned true to end the tasks after the part each applies.
    closing: watch::Sender<bool>,
    tasks: JoinSet<Result<Ended, IngestError>>,
}

/// No tasks: nothing read yet.
impl Default for Feeds {
    fn default() -> Self {
        Self {
            closing: watch::Sender::new(false),
            tasks: JoinSet::new(),
        }
    }
}

impl Feeds {
    /// A task for each partition of `read`, reading its source in `sources` and applying
    /// in the partition's term.
    pub(super) fn start(
        ingestor: &Arc<Ingestor>,
        read: &Owned,
        sources: BTreeMap<i32, impl Source>,
        shutdown: &watch::Receiver<bool>,
    ) -> Self {
        let mut feeds = Self::default();
        for (p, source) in sources {
            let Some(handle) = read.get(&p) else {
                continue;
            };
            let closing = feeds.closing.subscribe();
            let task = feed(
                ingestor.clone(),
                handle.clone(),
                source,
                closing,
                shutdown.clone(),
            );
            feeds.tasks.spawn(task);
        }
        feeds
    }

    /// How a task that ended on its own (stopped, cut or failed) ended; pending while
    /// every task runs, `None` without tasks.
    pub(super) async fn next_ended(&mut self) -> Option<Result<Ended, IngestError>> {
        let ended = self.tasks.join_next().await?;
        Some(ended.map_err(IngestError::from).and_then(|e| e))
    }

    /// Ends every task once it finished the part it applies (the next client reads what
    /// follows again, after the applied offsets).
    pub(super) async fn drain(&mut self) -> Result<Drained, IngestError> {
        self.closing.send_replace(true);
        // every task joined, whatever the first to fail said
        let (mut stopped, mut read_failed, mut failed) = (false, None, None);
        while let Some(ended) = self.next_ended().await {
            match ended {
                Ok(Ended::Stopped) => stopped = true,
                Ok(Ended::Failed(e)) => read_failed = read_failed.or(Some(e)),
                Ok(Ended::Drained | Ended::Cut) => {}
                Err(e) => failed = failed.or(Some(e)),
            }
        }
        match failed {
            Some(e) => Err(e),
            None if stopped => Ok(Drained::Stopped),
            None => Ok(Drained::Done(read_failed)),
        }
    }
}

/// A partition's task: reads `source` and applies what it reads, in order, in `handle`'s
/// term, until `closing` or `shutdown` turns true, the term ends or reading fails.
async fn feed(
    ingestor: Arc<Ingestor>,
    handle: Arc<PartitionHandle>,
    mut source: impl Source,
    mut closing: watch::Receiver<bool>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<Ended, IngestError> {
    let mut grants = Grants::default();
    // whether the last batch was empty
    let mut idle = false;
    loop {
        note_replayed(&handle, &source, idle);
        let batching = Batching {
            max: ingestor.config.ingest.batch_max_events,
            linger: ingestor.config.ingest.batch_max_wait,
            // the last records may be ones nobody applies (a transaction marker)
            idle: handle.replay_to().is_some().then_some(REPLAY_POLL),
        };
        let batch = tokio::select! {
            biased;
            // what was read beyond the part applied is read again by the next client
            _ = closing.wait_for(|&c| c) => return Ok(Ended::Drained),
            batch = source.next_batch(batching, &mut shutdown) => batch,
        };
        let Some(batch) = batch else {
            return Ok(Ended::Stopped);
        };
        idle = batch.records.is_empty();
        if let Some(first) = batch.records.first() {
            ingestor.observe_fetch(first);
            let received = batch.first_at.unwrap_or_else(Instant::now);
            let applying = (ingestor)
                .apply(&handle, batch.records, received, &mut grants, &mut shutdown)
                .await?;
            match applying {
                Applying::Done => {}
                Applying::Stopped => return Ok(Ended::Stopped),
                Applying::Cut => return Ok(Ended::Cut),
            }
        }
        if let Some(e) = batch.failed {
            return Ok(Ended::Failed(e));
        }
    }
}

/// Marks the partition replayed once it applied up to the end it had when this node took
/// it, or once `source` read up to there (this task committed everything it read before).
/// The position is asked for only after an empty batch (`idle`): the records left below
/// the end are then ones nobody applies (a transaction marker), and asking waits for
/// librdkafka's main thread.
fn note_replayed(handle: &PartitionHandle, source: &impl Source, idle: bool) {
    let Some(end) = handle.replay_to() else {
        return;
    };
    if handle.applied().is_some_and(|o| o + 1 >= end)
        || (idle && source.position().is_some_and(|o| o >= end))
    {
        handle.replayed();
        tracing::info!(
            partition = handle.partition,
            end,
            "replayed the partition as it was when this node took it"
        );
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::Mutex;
    use std::time::Duration;

    use super::*;
    use crate::ingest::batch::Record;
    use crate::ingest::ingestor::tests::offline_ingestor;
    use crate::partition::Partitions;
    use crate::shutdown::stopped;
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

    /// Batches of partition 0, read in turn; then nothing more.
    #[derive(Clone, Default)]
    struct Listed {
        batches: Arc<Mutex<VecDeque<Vec<Record>>>>,
        position: Arc<Mutex<Option<i64>>>,
    }

    impl Listed {
        fn of(batches: &[&[i64]]) -> Self {
            let listed = Self::default();
            let batches = batches.iter().map(|b| b.iter().copied().map(add).collect());
            listed.batches.lock().unwrap().extend(batches);
            listed
        }
        fn left(&self) -> usize {
            self.batches.lock().unwrap().len()
        }
    }

    impl Source for Listed {
        async fn next_batch(
            &mut self,
            batching: Batching,
            stop: &mut watch::Receiver<bool>,
        ) -> Option<Batch> {
            let next = self.batches.lock().unwrap().pop_front();
            let Some(records) = next else {
                tokio::select! {
                    () = stopped(stop) => return None,
                    () = tokio::time::sleep(batching.idle.unwrap_or(Duration::MAX)) => {
                        return Some(Batch::default());
                    }
                }
            };
            *self.position.lock().unwrap() = records.last().map(|r| r.offset + 1);
            Some(Batch {
                records,
                first_at: Some(Instant::now()),
                ..Batch::default()
            })
        }
        fn position(&self) -> Option<i64> {
            *self.position.lock().unwrap()
        }
    }

    /// Partition 0 taken (nothing applied, to be replayed to offset 2) and its task
    /// started on `source`, with the partition's writer held by the test: the task waits
    /// in its first part until the test lets it go.
    async fn blocked_task(
        source: Listed,
    ) -> (Arc<Store>, Arc<PartitionHandle>, Feeds, StateWriter, Stop) {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(&dir.keep(), 1).unwrap());
        let owned = Arc::new(Partitions::default());
        let ingestor = Arc::new(offline_ingestor(store.clone(), owned.clone()));
        let handle = owned.take(0, None, 2);
        let writer = store.writer(0).await;
        let (stop, shutdown) = watch::channel(false);
        let read = Owned::from([(0, handle.clone())]);
        let feeds = Feeds::start(&ingestor, &read, BTreeMap::from([(0, source)]), &shutdown);
        (store, handle, feeds, writer, stop)
    }

    /// A partition read past its end is replayed only once what was read before is
    /// committed: a replayed partition's shipper may send heartbeats, which tell other
    /// regions nothing below them is missing.
    #[tokio::test]
    async fn a_partition_read_past_its_end_is_replayed_only_once_what_came_before_is_committed() {
        let (_store, handle, _feeds, writer, _stop) = blocked_task(Listed::of(&[&[0, 1]])).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!((handle.applied(), handle.replay_to()), (None, Some(2)));
        drop(writer);
        let mut replay = handle.replay();
        replay.wait_for(Option::is_none).await.unwrap();
        assert_eq!(handle.applied(), Some(1));
    }

    /// A drain lets each task finish the part it applies and leaves what follows: the next
    /// client reads that again, after the applied offsets.
    #[tokio::test]
    async fn a_drain_finishes_the_part_applied_and_leaves_the_rest_to_be_read_again() {
        let source = Listed::of(&[&[0], &[1], &[2]]);
        let (store, handle, mut feeds, writer, _stop) = blocked_task(source.clone()).await;
        // taken by the task: it waits for the writer with its first part
        while source.left() > 2 {
            tokio::task::yield_now().await;
        }
        let drained = tokio::spawn(async move { feeds.drain().await.unwrap() });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!drained.is_finished(), "a drain waits for the part applied");
        drop(writer);
        assert!(matches!(drained.await.unwrap(), Drained::Done(None)));
        assert_eq!(handle.applied(), Some(0));
        assert_eq!(source.left(), 2, "what follows the part applied is left");
        assert_eq!(
            store.source_offsets("geostate.updates").unwrap(),
            BTreeMap::from([(0, 0)])
        );
    }
}
