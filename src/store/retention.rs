//! Deleting the slices of windows past their retention, in RocksDB's own compactions: a
//! compaction filter on the state and id column families drops a slice's entries once
//! the lowest watermark over every region on the partition says its last window has been
//! final for the namespace's retention. Nothing is scanned; the slice goes when
//! compaction rewrites its file. Reads refuse an expired window before that
//! (`api::windows`), so whether it is gone yet is never seen.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use rocksdb::compaction_filter::Decision;

use crate::crdt::RegionId;
use crate::window;

/// Whether a stored slice expired: (windowed key, slice start, lowest watermark over
/// every region on its partition). Built from the namespaces by the node.
pub type Expiry = Arc<dyn Fn(&str, u64, u64) -> bool + Send + Sync>;

/// What the compaction filter of one partition instance reads, shared with the store.
#[derive(Default)]
pub(super) struct Retention {
    /// The lowest watermark over this region and every expected remote one (0: some
    /// region has none yet, nothing expires).
    lowest: AtomicU64,
    state: Mutex<Watermarks>,
    rule: RwLock<Option<Expiry>>,
}

#[derive(Default)]
struct Watermarks {
    own: Option<u64>,
    remotes: BTreeMap<RegionId, u64>,
    /// The remote regions whose watermark counts (set with the rule).
    expected: Vec<RegionId>,
}

impl Watermarks {
    fn lowest(&self) -> u64 {
        let remotes = self.expected.iter().map(|r| self.remotes.get(r).copied());
        std::iter::once(self.own)
            .chain(remotes)
            .collect::<Option<Vec<u64>>>()
            .and_then(|all| all.into_iter().min())
            .unwrap_or(0)
    }
}

impl Retention {
    /// The rule, and the remote regions whose watermarks count besides this one's.
    pub(super) fn set_rule(&self, expected: Vec<RegionId>, rule: Expiry) {
        *self.rule.write().unwrap_or_else(|p| p.into_inner()) = Some(rule);
        self.update(|w| w.expected = expected);
    }

    /// This region's watermark on the partition, raised.
    pub(super) fn own(&self, watermark: u64) {
        self.update(|w| w.own = Some(w.own.unwrap_or(0).max(watermark)));
    }

    /// A remote region's watermark on the partition, raised.
    pub(super) fn remote(&self, region: &RegionId, watermark: u64) {
        self.update(|w| {
            let at = w.remotes.entry(region.clone()).or_default();
            *at = (*at).max(watermark);
        });
    }

    /// Forgets every watermark (the copy was discarded, to be rebuilt).
    pub(super) fn reset(&self) {
        self.update(|w| {
            w.own = None;
            w.remotes.clear();
        });
    }

    fn update(&self, change: impl FnOnce(&mut Watermarks)) {
        let mut w = self.state.lock().unwrap_or_else(|p| p.into_inner());
        change(&mut w);
        self.lowest.store(w.lowest(), Ordering::Relaxed);
    }

    /// The lowest watermark over every region (`None`: some region has none yet).
    pub(super) fn lowest(&self) -> Option<u64> {
        Some(self.lowest.load(Ordering::Relaxed)).filter(|&w| w > 0)
    }

    /// Whether the stored key `key` is an expired slice.
    pub(super) fn expired(&self, key: &[u8]) -> bool {
        let Some(lowest) = self.lowest() else {
            return false;
        };
        let Ok(key) = std::str::from_utf8(key) else {
            return false;
        };
        let (home, Some(slice)) = window::split_slice_key(key) else {
            return false;
        };
        let rule = self.rule.read().unwrap_or_else(|p| p.into_inner());
        rule.as_ref()
            .is_some_and(|expired| expired(home, slice, lowest))
    }

    /// The compaction filter of a column family holding state keys.
    pub(super) fn filter(
        this: &Arc<Self>,
    ) -> impl FnMut(u32, &[u8], &[u8]) -> Decision + Send + 'static {
        let this = this.clone();
        move |_level, key, _value| {
            if this.expired(key) {
                Decision::Remove
            } else {
                Decision::Keep
            }
        }
    }
}
