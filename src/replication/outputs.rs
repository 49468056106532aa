//! Final windows to the outputs topic, each exactly once: the shipping round that first
//! sees a window final produces it, in the round's transaction, and the round's resume
//! point carries how far the partition's outputs went (`outputs_through`).
//!
//! ```text
//!  round: lowest watermark over the regions on partition p (own: the round's snapshot;
//!         every remote: its heartbeats merged here) ──► windows closing in (through, lowest]
//!         ──► every key of an output namespace in p with a slice in one ──► Σ slices
//!         ──► geostate.outputs (same transaction as the deltas) ; resume point: through := lowest
//! ```
//!
//! A window is final once every region's watermark on its partition passed its close
//! (end plus allowed lateness): no region takes an event for it any more, and every
//! remote part was merged before the heartbeat that carried the remote's watermark. Its
//! value can no longer change, so whichever node produces it produces the same record. A
//! new owner of the partition goes on from the `outputs_through` of the newest resume
//! point (`bootstrap::catch_up`), so a window produced in a committed round is never
//! produced again, and one whose round was aborted is produced by the next.
//!
//! The record itself (its JSON and its key) is `geostate_proto::outputs`'s, shared with
//! the sink, the tests and the Jepsen checkers that read it.

use std::collections::BTreeSet;

/// The records a shipping round produces (its final windows, and the owned outputs the
/// ingest path put in the outbox), defined once with the topic's readers.
pub use geostate_proto::outputs::{FinalWindow, RegisterChange};

use crate::config::Config;
use crate::crdt::RegionId;
use crate::store::{Store, StoreError};
use crate::window::{self, WindowSpec};

/// The most windows per namespace one round produces (the oldest wait for the next).
const MAX_WINDOWS_PER_ROUND: u64 = 1000;

/// What a node outputs: the namespaces whose final windows go out, and the regions whose
/// watermarks decide finality.
#[derive(Debug)]
pub struct Outputs {
    /// Prefix and windows of each namespace with `output = "final-windows"`.
    namespaces: Vec<(String, WindowSpec)>,
    remotes: Vec<RegionId>,
    region: RegionId,
    pub topic: String,
}

impl Outputs {
    /// `None` if no namespace outputs its final windows.
    pub fn new(config: &Config) -> Option<Self> {
        let namespaces: Vec<(String, WindowSpec)> = config
            .namespaces
            .iter()
            .filter(|ns| ns.outputs_final_windows)
            .filter_map(|ns| ns.window.map(|w| (ns.prefix.clone(), w)))
            .collect();
        (!namespaces.is_empty()).then(|| Outputs {
            namespaces,
            remotes: config
                .replication
                .remotes
                .iter()
                .map(|r| r.region.clone())
                .collect(),
            region: config.region.clone(),
            topic: config.kafka.outputs_topic.clone(),
        })
    }

    /// The lowest watermark over the regions on `partition`, this region's being `own`
    /// (`None`: some region has none yet, so no window is final).
    pub fn lowest(
        &self,
        store: &Store,
        partition: i32,
        own: Option<u64>,
    ) -> Result<Option<u64>, StoreError> {
        let remote = store.remote_watermarks(partition)?;
        let mut lowest = own;
        for region in &self.remotes {
            lowest = match (lowest, remote.get(region)) {
                (Some(a), Some(&b)) => Some(a.min(b)),
                _ => None,
            };
        }
        Ok(lowest)
    }

    /// The windows of `partition`'s keys that became final as the lowest watermark rose
    /// from `from` (exclusive; `None`: never) to `to`, each summed from its slices.
    pub fn final_windows(
        &self,
        store: &Store,
        partition: i32,
        from: Option<u64>,
        to: u64,
    ) -> Result<Vec<FinalWindow>, StoreError> {
        let mut out = Vec::new();
        let partitions = BTreeSet::from([partition]);
        for (prefix, spec) in &self.namespaces {
            let mut closing = spec.closing_between(from.unwrap_or(0), to, MAX_WINDOWS_PER_ROUND);
            // a store that never produced anything does not reach back past the retention,
            // where a window's slices may be deleted already
            if from.is_none() {
                closing.retain(|w| !spec.expired(*w, Some(to)));
            }
            if closing.is_empty() {
                continue;
            }
            let stored = store.scan_in(&partitions, prefix, None, usize::MAX)?;
            let found =
                window::windows_with_slices(stored.iter().map(|(k, _)| k.as_str()), &closing);
            for (key, start_ms) in found {
                let window = spec.window_at(start_ms);
                let mut total: i128 = 0;
                for slice in spec.slices_of(window) {
                    let state = store.get(&window::slice_key(&key, slice))?;
                    total = total.saturating_add(state.and_then(|s| s.count()).unwrap_or(0));
                }
                out.push(FinalWindow {
                    key,
                    start_ms,
                    end_ms: window.end_ms,
                    value: total.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64,
                    region: self.region.to_string(),
                });
            }
        }
        Ok(out)
    }
}
