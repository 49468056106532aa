//! The partitions a node owns, each behind its [`PartitionHandle`]: the unit of execution.
//! A partition of the updates topic is one RocksDB instance (`store`), one shipping
//! transactional id, one fence and watermark per owned shard; here it is also one thing
//! that runs. The keeper creates a handle when the node takes the partition and ends it
//! when the node gives it up; ingest's reader and the mergers feed the partitions they
//! read, each part under the partition's own writer (`Store::writer`), so partitions
//! apply in parallel and share no lock; the API, `Watch`, the shipper and the checkpointer
//! hold handles.
//!
//! ```text
//!  keeper ── take(p) ──► Partitions { p ─► PartitionHandle } ── let_go(p) ──► cut() ─► Moved
//!                          ▲ owned()            │ applied / replayed / committed
//!  ingest reader, mergers ─┘ (feed p's parts)   ▼
//!                                     API `Update` waits (passed), shipper of p wakes
//! ```
//!
//! A handle lives for one term of the partition here: taken again, the partition gets a
//! new handle, so whoever holds the old one learns that it moved (its `applied` ends in
//! `moved`) and never mistakes the next term's offsets for its own.
//!
//! A partition let go leaves its copy behind: what this node applied up to then. Until
//! the node takes the partition again or catches the copy up for another owner, reads
//! may be answered from it while no node of the region is known to own the partition (the
//! region's Kafka unreachable, or the partition between nodes), with a certificate that
//! says how old it is ([`StaleCopy`]).

mod handle;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, broadcast, watch};

use crate::crdt::CrdtValue;
pub use handle::{Outcome, PartitionHandle};

/// A key's new state after a batch, as sent to watchers.
pub type Change = (String, CrdtValue);

/// The partitions a node owns now, by number.
pub type Owned = BTreeMap<i32, Arc<PartitionHandle>>;

/// The node's partitions: the owned ones and what the node counts over all of them.
pub struct Partitions {
    /// The partitions this node owns (the region's group assigned them and they caught
    /// up): ingest reads them, the API answers their keys, the mergers merge them.
    owned: watch::Sender<Owned>,
    /// Every committed batch's changed keys, of every partition (`Watch` fans them out).
    pub changes: broadcast::Sender<Arc<Vec<Change>>>,
    /// Notified after every shipped round (wakes ingest waiting for outbox room).
    pub shipped: Arc<Notify>,
    pub events_applied: AtomicU64,
    pub events_dead_lettered: AtomicU64,
    /// The partitions let go whose copy holds what this node applied while it owned them.
    copies: Mutex<BTreeMap<i32, Left>>,
}

/// A partition let go: its last term's handle and when it was let go.
struct Left {
    handle: Arc<PartitionHandle>,
    at: Instant,
}

impl Left {
    fn copy(&self) -> StaleCopy {
        StaleCopy {
            applied: self.handle.applied(),
            age: self.at.elapsed(),
        }
    }
}

/// What a copy of a partition this node no longer owns holds: every record of the
/// region's updates topic through `applied` that this node applied, and nothing this node
/// applied for `age` (nor what another node may have applied since).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StaleCopy {
    pub applied: Option<i64>,
    pub age: Duration,
}

/// What this node holds of a term of a partition ([`Partitions::holds`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    /// It owns the partition in that term.
    Owned,
    /// It let that term go and keeps its copy.
    Copy(StaleCopy),
    /// Neither: the copy was forgotten (to be caught up, which may rebuild it) or the
    /// partition was taken again since.
    Gone,
}

/// Nothing owned yet: the keeper takes each partition.
impl Default for Partitions {
    fn default() -> Self {
        Self {
            owned: watch::Sender::new(BTreeMap::new()),
            changes: broadcast::Sender::new(1024),
            shipped: Arc::new(Notify::new()),
            events_applied: AtomicU64::new(0),
            events_dead_lettered: AtomicU64::new(0),
            copies: Mutex::default(),
        }
    }
}

impl Partitions {
    /// Owns `partition` in a new term: its store applied through `applied`, to be replayed
    /// up to `end` (the updates topic's end when this node took it) before it is counted
    /// as replayed.
    pub fn take(&self, partition: i32, applied: Option<i64>, end: i64) -> Arc<PartitionHandle> {
        let handle = Arc::new(PartitionHandle::new(partition, applied, end));
        self.forget_copy(partition);
        let owned = handle.clone();
        let mut replaced = None;
        self.owned
            .send_modify(|o| replaced = o.insert(partition, owned));
        // never two terms at once (the keeper cuts a term before it takes it again)
        if let Some(old) = replaced {
            old.let_go();
            old.cut();
        }
        handle
    }

    /// Stops owning `partitions` (ingest stops reading them, the API stops answering their
    /// keys); answers their handles, for the keeper to wait for ingest and then
    /// [`PartitionHandle::cut`] them.
    pub fn let_go(&self, partitions: &[i32]) -> Vec<Arc<PartitionHandle>> {
        // the copies first: a read finds the partition owned or its copy, never neither
        let at = Instant::now();
        for p in partitions {
            if let Some(handle) = self.get(*p) {
                self.copies().insert(*p, Left { handle, at });
            }
        }
        let mut gone = Vec::new();
        self.owned.send_modify(|o| {
            for p in partitions {
                gone.extend(o.remove(p));
            }
        });
        for handle in &gone {
            handle.let_go();
        }
        gone
    }

    /// What this node's copy of `partition` holds, if it owned the partition and let it
    /// go, and has not changed the copy since (`None` while it owns it).
    pub fn copy_of(&self, partition: i32) -> Option<StaleCopy> {
        self.copies().get(&partition).map(Left::copy)
    }

    /// The term of `partition` a read answers from: the one owned here, else the one whose
    /// copy this node keeps. A read notes it before it reads the store and asks
    /// [`Partitions::holds`] after: what it read is that term's only if the term is still
    /// held (a copy is forgotten before anything rebuilds it).
    pub fn term_of(&self, partition: i32) -> Option<Arc<PartitionHandle>> {
        let copy = || self.copies().get(&partition).map(|l| l.handle.clone());
        self.get(partition).or_else(copy)
    }

    /// What this node holds of `term` now.
    pub fn holds(&self, term: &Arc<PartitionHandle>) -> Held {
        let p = term.partition;
        if self.get(p).is_some_and(|h| Arc::ptr_eq(&h, term)) {
            return Held::Owned;
        }
        match self.copies().get(&p) {
            Some(left) if Arc::ptr_eq(&left.handle, term) => Held::Copy(left.copy()),
            _ => Held::Gone,
        }
    }

    /// Stops answering reads from the copy of `partition`: it is about to be caught up
    /// (taken again, or refreshed as a standby), which may discard it first.
    pub fn forget_copy(&self, partition: i32) {
        self.copies().remove(&partition);
    }

    fn copies(&self) -> std::sync::MutexGuard<'_, BTreeMap<i32, Left>> {
        self.copies.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The handle of `partition`, if this node owns it.
    pub fn get(&self, partition: i32) -> Option<Arc<PartitionHandle>> {
        self.owned.borrow().get(&partition).cloned()
    }

    pub fn owns(&self, partition: i32) -> bool {
        self.owned.borrow().contains_key(&partition)
    }

    /// The partitions owned now.
    pub fn owned(&self) -> BTreeSet<i32> {
        self.owned.borrow().keys().copied().collect()
    }

    /// Changes whenever a partition is taken or let go.
    pub fn subscribe(&self) -> watch::Receiver<Owned> {
        self.owned.subscribe()
    }

    /// Per owned partition, the last offset applied to its state (if any).
    pub fn applied(&self) -> BTreeMap<i32, i64> {
        applied_in(&self.owned.borrow())
    }
}

/// The last offset applied of each partition of `owned` (if any).
pub fn applied_in(owned: &Owned) -> BTreeMap<i32, i64> {
    (owned.iter())
        .filter_map(|(&p, handle)| handle.applied().map(|o| (p, o)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A partition taken while a term of it is still held ends that term: never two
    /// terms at once, and the old term's waiters learn it moved.
    #[test]
    fn a_take_ends_a_term_still_held() {
        use futures_util::FutureExt;
        let partitions = Partitions::default();
        let old = partitions.take(0, Some(3), 0);
        let new = partitions.take(0, Some(3), 0);
        assert!(old.is_cut() && old.is_let_go() && !new.is_cut());
        assert_eq!(old.passed(5).now_or_never(), Some(Outcome::Moved));
        assert!(Arc::ptr_eq(&partitions.get(0).unwrap(), &new));
    }

    /// A partition let go leaves a copy read from until it is taken again or forgotten,
    /// each term a copy of its own; one never owned has none.
    #[test]
    fn a_partition_let_go_leaves_its_copy_until_taken_again() {
        let partitions = Partitions::default();
        partitions.take(0, Some(3), 0);
        partitions.take(1, None, 0);
        assert_eq!(partitions.copy_of(0), None, "owned: no copy");
        partitions.let_go(&[0, 1]);
        assert_eq!(partitions.copy_of(0).map(|c| c.applied), Some(Some(3)));
        assert_eq!(partitions.copy_of(1).map(|c| c.applied), Some(None));
        assert_eq!(partitions.copy_of(2), None, "never owned");
        let first = partitions.term_of(0).unwrap();
        assert!(matches!(partitions.holds(&first), Held::Copy(_)));
        let second = partitions.take(0, Some(3), 0);
        assert_eq!(partitions.copy_of(0), None, "taken again");
        assert_eq!(
            partitions.holds(&first),
            Held::Gone,
            "a read of the first copy must tell"
        );
        assert_eq!(partitions.holds(&second), Held::Owned);
        partitions.let_go(&[0]);
        assert!(matches!(partitions.holds(&second), Held::Copy(_)));
        assert_eq!(partitions.holds(&first), Held::Gone);
        partitions.forget_copy(1);
        assert_eq!(partitions.copy_of(1), None, "forgotten");
    }
}
