//! Reads of windowed keys: a window's value is the sum of its slices' counters, and it
//! carries its completeness certificate (final, or which regions' watermarks on the key's
//! partition have not passed its close).
//!
//! ```text
//!  selector ──(own watermark, lowest over regions)──► windows ──► Σ slices ──► Value
//!                                   every region's watermark ──► WindowInfo { is_final, behind }
//! ```

use std::collections::{BTreeMap, BTreeSet};

use super::{ApiError, Handler, convert};
use crate::crdt::{CrdtType, CrdtValue};
use crate::pb;
use crate::pb::window_selector::Which;
use crate::window::{self, NoWindow, Selector, Window, WindowSpec};

/// Every region's watermark on a partition, this region's first; and the lowest (`None`:
/// one has none yet).
pub(super) struct Watermarks {
    pub regions: Vec<(String, Option<u64>)>,
    pub lowest: Option<u64>,
}

/// What [`Handler::windows_closed_since`] found.
#[derive(Default)]
pub(super) struct Closed {
    /// Per partition whose lowest watermark rose, the lowest now.
    pub risen: BTreeMap<i32, Option<u64>>,
    /// The windows that became final meanwhile, read whole.
    pub values: Vec<Result<pb::Value, ApiError>>,
}

/// The most windows one read of a range answers per key.
pub const MAX_RANGE_WINDOWS: u64 = 1000;

impl Handler {
    /// A windowed key's values, one per window `selector` names (absent: the current
    /// one; a range: each window starting in it, oldest first).
    pub(super) fn read_windows(
        &self,
        key: &str,
        spec: &WindowSpec,
        crdt: CrdtType,
        selector: Option<&pb::WindowSelector>,
    ) -> Result<Vec<pb::Value>, ApiError> {
        let api = &self.0;
        let partition = self.partition_of(key);
        let Watermarks {
            regions: watermarks,
            lowest,
        } = self.watermarks(partition)?;
        let own = watermarks[0].1;
        let out_of_orderness = api.config.watermark.out_of_orderness.as_millis() as u64;
        let chosen = |s| {
            spec.select(s, own, lowest, out_of_orderness)
                .map(|w| vec![w])
                .map_err(|e| no_window(key, e, &watermarks))
        };
        let windows = match selector.and_then(|s| s.which.as_ref()) {
            None | Some(Which::Current(_)) => chosen(Selector::Current)?,
            Some(Which::LatestFinal(_)) => chosen(Selector::LatestFinal)?,
            Some(Which::StartMs(start)) => chosen(Selector::Start(*start))?,
            Some(Which::Range(range)) => in_range(spec, range)?,
        };
        let mut values = Vec::with_capacity(windows.len());
        for window in windows {
            if spec.expired(window, lowest) {
                return Err(ApiError::WindowExpired {
                    key: key.to_owned(),
                    start_ms: window.start_ms,
                });
            }
            let mut total: i128 = 0;
            for slice in spec.slices_of(window) {
                let state = api.store.get(&window::slice_key(key, slice))?;
                total =
                    total.saturating_add(state.as_ref().and_then(CrdtValue::count).unwrap_or(0));
            }
            let behind: Vec<pb::RegionWatermark> = spec
                .behind(window, &watermarks)
                .into_iter()
                .map(|(region, w)| pb::RegionWatermark {
                    region: region.clone(),
                    watermark_ms: w.unwrap_or_default(),
                    known: w.is_some(),
                })
                .collect();
            let info = pb::WindowInfo {
                start_ms: window.start_ms,
                end_ms: window.end_ms,
                closes_at_ms: spec.closes_at(window),
                is_final: behind.is_empty(),
                behind,
            };
            let mut value = convert::window_value(key, crdt, total, info);
            self.fill_freshness(&mut value, partition);
            values.push(value);
        }
        Ok(values)
    }
}

impl Handler {
    /// Every region's watermark on `partition`, this region's first, then every region it
    /// merges (`None`: none known yet); and the lowest (`None`: one has none yet).
    pub(super) fn watermarks(&self, partition: i32) -> Result<Watermarks, ApiError> {
        let api = &self.0;
        let own = api.store.watermark(partition)?;
        let remotes = api.store.remote_watermarks(partition)?;
        let watermarks: Vec<(String, Option<u64>)> =
            std::iter::once((api.config.region.to_string(), own))
                .chain(
                    api.config
                        .replication
                        .remotes
                        .iter()
                        .map(|r| (r.region.to_string(), remotes.get(&r.region).copied())),
                )
                .collect();
        let lowest = watermarks
            .iter()
            .map(|(_, w)| *w)
            .collect::<Option<Vec<u64>>>()
            .and_then(|all| all.into_iter().min());
        Ok(Watermarks {
            regions: watermarks,
            lowest,
        })
    }

    /// For `Watch`: per partition of `seen` (the lowest watermark over the regions when
    /// last looked), the lowest now where it rose, and the values of the windows of keys
    /// under `prefix` that became final meanwhile.
    pub(super) fn windows_closed_since(
        &self,
        prefix: &str,
        seen: BTreeMap<i32, Option<u64>>,
    ) -> Closed {
        let mut closed = Closed::default();
        for (partition, before) in seen {
            let now = match self.watermarks(partition) {
                Ok(w) => w.lowest,
                Err(e) => {
                    closed.values.push(Err(e));
                    continue;
                }
            };
            if let Some(to) = now.filter(|&to| before.is_none_or(|b| to > b)) {
                let values = self.closed_windows(partition, prefix, (before.unwrap_or(0), to));
                closed.values.extend(values);
                closed.risen.insert(partition, now);
            }
        }
        closed
    }

    /// For `Watch`: the windows of keys under `prefix` in `partition` that became final as
    /// the lowest watermark over the regions rose from `from` to `to`, each read whole.
    pub(super) fn closed_windows(
        &self,
        partition: i32,
        prefix: &str,
        (from, to): (u64, u64),
    ) -> Vec<Result<pb::Value, ApiError>> {
        let mut out = Vec::new();
        let namespaces = self.0.config.namespaces.iter();
        for ns in namespaces.filter(|ns| ns.overlaps(prefix)) {
            let Some(spec) = ns.window else {
                continue;
            };
            let closing = spec.closing_between(from, to, MAX_RANGE_WINDOWS);
            if closing.is_empty() {
                continue;
            }
            // the longer of the two prefixes: the keys under both
            let under = if prefix.len() > ns.prefix.len() {
                prefix
            } else {
                &ns.prefix
            };
            let partitions = BTreeSet::from([partition]);
            let stored = match self.0.store.scan_in(&partitions, under, None, usize::MAX) {
                Ok(stored) => stored,
                Err(e) => {
                    out.push(Err(e.into()));
                    continue;
                }
            };
            let found =
                window::windows_with_slices(stored.iter().map(|(k, _)| k.as_str()), &closing);
            for (key, start) in found {
                let selector = pb::WindowSelector {
                    which: Some(Which::StartMs(start)),
                };
                match self.read_windows(&key, &spec, ns.crdt, Some(&selector)) {
                    Ok(values) => out.extend(values.into_iter().map(Ok)),
                    Err(e) => out.push(Err(e)),
                }
            }
        }
        out
    }

    /// For `Watch`: per changed slice (windowed key, slice start), the value of the key's
    /// newest window holding it.
    pub(super) fn changed_windows(
        &self,
        slices: Vec<(String, u64)>,
    ) -> Vec<Result<pb::Value, ApiError>> {
        let mut out = Vec::with_capacity(slices.len());
        for (key, slice) in slices {
            let Some(ns) = self.0.config.namespaces.lookup(&key) else {
                continue;
            };
            let Some(spec) = ns.window else {
                continue;
            };
            let selector = pb::WindowSelector {
                which: Some(Which::StartMs(slice)),
            };
            match self.read_windows(&key, &spec, ns.crdt, Some(&selector)) {
                Ok(values) => out.extend(values.into_iter().map(Ok)),
                Err(e) => out.push(Err(e)),
            }
        }
        out
    }
}

/// The windows starting in `[from_ms, to_ms)`, at most [`MAX_RANGE_WINDOWS`].
fn in_range(spec: &WindowSpec, range: &pb::WindowRange) -> Result<Vec<Window>, ApiError> {
    let first = spec.window_at(range.from_ms);
    let first = if first.start_ms < range.from_ms {
        spec.window_at(first.start_ms.saturating_add(spec.slide_ms))
    } else {
        first
    };
    let count = range
        .to_ms
        .saturating_sub(first.start_ms)
        .div_ceil(spec.slide_ms);
    if count > MAX_RANGE_WINDOWS {
        return Err(ApiError::InvalidArgument(format!(
            "the range [{}, {}) holds {count} windows, more than the {MAX_RANGE_WINDOWS} one read answers",
            range.from_ms, range.to_ms
        )));
    }
    Ok((0..count)
        .map(|i| spec.window_at(first.start_ms + i * spec.slide_ms))
        .collect())
}

fn no_window(key: &str, why: NoWindow, watermarks: &[(String, Option<u64>)]) -> ApiError {
    let known: Vec<String> = watermarks
        .iter()
        .map(|(region, w)| match w {
            Some(w) => format!("{region} at {w} ms"),
            None => format!("{region} none yet"),
        })
        .collect();
    ApiError::Precondition(format!(
        "{key:?}: {why} (watermarks on its partition: {})",
        known.join(", ")
    ))
}
