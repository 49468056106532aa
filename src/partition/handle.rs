//! One partition's handle for one term of it on this node: how far its state is applied,
//! what became of its refused records, whether it is replayed, read and still held. The
//! keeper creates it on take and cuts it on give-up; ingest commits a part of the
//! partition only while it is not cut ([`PartitionHandle::commit_in_term`]).

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::watch;

use crate::ingest::event::Rejection;

/// Rejections remembered per partition for `Update` callers waiting on their record.
const RECENT_REJECTIONS: usize = 4096;

/// What became of a record the partition's ingest has passed.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    Applied,
    Refused(Rejection),
    /// Refused or applied: its rejection, if any, is no longer remembered.
    Forgotten,
    /// Not passed here: its partition moved to another node of the region first, which
    /// applies it.
    Moved,
}

/// How far a partition's state is applied in this term, and whether the term ended.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Position {
    /// The last offset applied to state (the previous owner's at the take, then this
    /// node's commits).
    offset: Option<i64>,
    /// The term ended ([`PartitionHandle::cut`]): nothing of it commits any more.
    moved: bool,
}

pub struct PartitionHandle {
    pub partition: i32,
    applied: watch::Sender<Position>,
    rejected: Mutex<Rejections>,
    /// True once cut; held by ingest from its check to the end of its commit, and by a cut.
    cut: Mutex<bool>,
    /// The group took the partition away (it may still be read and shipped until cut).
    let_go: AtomicBool,
    /// Ingest's reader reads the partition now (it follows the owned partitions between
    /// batches): a partition given up is handed on only once ingest no longer reads it.
    reading: watch::Sender<bool>,
    /// The updates topic's end when this node took the partition, until ingest applied
    /// or passed everything before it: the records an earlier owner may have applied
    /// and acknowledged.
    replay_to: watch::Sender<Option<i64>>,
    /// Counts committed parts with outbox entries (wakes the partition's shipper).
    committed: watch::Sender<u64>,
}

impl PartitionHandle {
    /// A new term: applied through `applied`, replayed once `end` is reached.
    pub(super) fn new(partition: i32, applied: Option<i64>, end: i64) -> Self {
        let replayed = applied.is_some_and(|o| o + 1 >= end) || end <= 0;
        Self {
            partition,
            applied: watch::Sender::new(Position {
                offset: applied,
                moved: false,
            }),
            rejected: Mutex::default(),
            cut: Mutex::new(false),
            let_go: AtomicBool::new(false),
            reading: watch::Sender::new(false),
            replay_to: watch::Sender::new((!replayed).then_some(end)),
            committed: watch::Sender::new(0),
        }
    }

    /// The last offset applied to the partition's state.
    pub fn applied(&self) -> Option<i64> {
        self.applied.borrow().offset
    }

    pub(super) fn let_go(&self) {
        self.let_go.store(true, Ordering::SeqCst);
    }

    /// Whether the group took the partition away from this node.
    pub fn is_let_go(&self) -> bool {
        self.let_go.load(Ordering::SeqCst)
    }

    /// Ends the term (given up: the keeper hands the partition on, or another node fenced
    /// this one out of it): an ingest part not committed yet never is, and a waiter learns
    /// it moved. Once this returns, no ingest commit of the term is under way or to come.
    /// (A merge checks the cut under the partition's writer, and a catch-up of the copy
    /// waits for that writer.)
    pub fn cut(&self) {
        // waits for a commit that passed its check (never for Kafka)
        *self.lock_cut() = true;
        self.applied.send_modify(|at| at.moved = true);
    }

    pub fn is_cut(&self) -> bool {
        *self.lock_cut()
    }

    fn lock_cut(&self) -> std::sync::MutexGuard<'_, bool> {
        self.cut.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `commit` unless the term was cut (`None`), holding off any cut until it
    /// returned. Commits of the partition call [`PartitionHandle::publish`] inside it.
    pub fn commit_in_term<T, E>(
        &self,
        commit: impl FnOnce() -> Result<T, E>,
    ) -> Result<Option<T>, E> {
        let cut = self.lock_cut();
        if *cut {
            return Ok(None);
        }
        let done = commit()?;
        drop(cut);
        Ok(Some(done))
    }

    /// Tells waiters what a committed part applied: its refusals first, then its last
    /// offset.
    pub fn publish<'a>(
        &self,
        refused: impl IntoIterator<Item = (i64, &'a Rejection)>,
        through: Option<i64>,
    ) {
        let mut recent = self.rejected.lock().unwrap_or_else(|p| p.into_inner());
        for (offset, why) in refused {
            recent.remember(offset, why.clone());
        }
        drop(recent);
        if let Some(o) = through {
            self.applied
                .send_modify(|at| at.offset = Some(at.offset.map_or(o, |was| was.max(o))));
        }
    }

    /// Notes a committed part that wrote outbox entries: the shipper's round comes.
    pub fn note_committed(&self) {
        self.committed.send_modify(|n| *n += 1);
    }

    /// Changes after every committed part with outbox entries.
    pub fn commits(&self) -> watch::Receiver<u64> {
        self.committed.subscribe()
    }

    /// Waits until ingest passed the record at `offset`, or until the term ended before
    /// it did (the partition's next owner applies the record, or refuses it); answers
    /// what became of it.
    pub async fn passed(&self, offset: i64) -> Outcome {
        let mut applied = self.applied.subscribe();
        loop {
            let at = *applied.borrow_and_update();
            if at.offset.is_some_and(|o| o >= offset) {
                return self.outcome(offset);
            }
            if at.moved {
                return Outcome::Moved;
            }
            // the sender lives in `self`: this never ends
            let _ = applied.changed().await;
        }
    }

    /// What became of the record at `offset`, once it is applied (see
    /// [`Rejections::outcome`]).
    pub fn outcome(&self, offset: i64) -> Outcome {
        let rejected = self.rejected.lock().unwrap_or_else(|p| p.into_inner());
        rejected.outcome(offset)
    }

    /// Says whether ingest's reader reads the partition.
    pub fn set_reading(&self, reading: bool) {
        self.reading.send_replace(reading);
    }

    /// Completes once ingest's reader no longer reads the partition.
    pub async fn not_read(&self) {
        let mut reading = self.reading.subscribe();
        let _ = reading.wait_for(|&r| !r).await;
    }

    /// The offset ingest must reach before the partition counts as replayed (`None`:
    /// replayed).
    pub fn replay_to(&self) -> Option<i64> {
        *self.replay_to.borrow()
    }

    /// Marks the partition replayed.
    pub fn replayed(&self) {
        self.replay_to.send_replace(None);
    }

    /// The offset still to reach, `None` once the partition is replayed (the shipper
    /// sends heartbeats from then on).
    pub fn replay(&self) -> watch::Receiver<Option<i64>> {
        self.replay_to.subscribe()
    }
}

/// The last [`RECENT_REJECTIONS`] rejections of a partition, and the highest offset whose
/// rejection was forgotten: a record at or below it that is not remembered may have been
/// refused, so its outcome is unknown, never "applied".
#[derive(Debug, Default)]
struct Rejections {
    recent: VecDeque<(i64, Rejection)>,
    forgotten: Option<i64>,
}

impl Rejections {
    fn remember(&mut self, offset: i64, why: Rejection) {
        if self.recent.len() == RECENT_REJECTIONS
            && let Some((o, _)) = self.recent.pop_front()
        {
            self.forgotten = Some(self.forgotten.map_or(o, |f| f.max(o)));
        }
        self.recent.push_back((offset, why));
    }

    /// The outcome of a record ingest has passed: its rejection if remembered, else
    /// applied unless a rejection at or after its offset was forgotten.
    fn outcome(&self, offset: i64) -> Outcome {
        if let Some((_, why)) = self.recent.iter().rev().find(|(at, _)| *at == offset) {
            return Outcome::Refused(why.clone());
        }
        match self.forgotten {
            Some(through) if offset <= through => Outcome::Forgotten,
            _ => Outcome::Applied,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_pushed_out_by_later_ones_is_never_answered_as_applied() {
        let mut rejections = Rejections::default();
        let why = Rejection::Malformed("bad".into());
        // every even offset refused
        for o in 0..2 * RECENT_REJECTIONS as i64 {
            rejections.remember(2 * o, why.clone());
        }
        // the oldest refusals are forgotten: unknown, not applied
        assert_eq!(rejections.outcome(0), Outcome::Forgotten);
        assert_eq!(rejections.outcome(1), Outcome::Forgotten);
        assert_eq!(
            rejections.outcome(2 * RECENT_REJECTIONS as i64 - 2),
            Outcome::Forgotten
        );
        // the recent ones are known, and so is what lies after the forgotten ones
        let last = 2 * (2 * RECENT_REJECTIONS as i64 - 1);
        assert_eq!(rejections.outcome(last), Outcome::Refused(why.clone()));
        assert_eq!(rejections.outcome(last - 1), Outcome::Applied);
        // another partition's handle knows its own
        let mut other = Rejections::default();
        other.remember(5, why.clone());
        assert_eq!(other.outcome(5), Outcome::Refused(why));
        assert_eq!(other.outcome(4), Outcome::Applied);
    }
}
