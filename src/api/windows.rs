//! Reads of windowed keys: a window's value is the sum of its slices' counters, and it
//! carries its completeness certificate (final, or which regions' watermarks on the key's
//! partition have not passed its close).
//!
//! ```text
//!  selector ──(own watermark, lowest over regions)──► windows ──► Σ slices ──► Value
//!                                   every region's watermark ──► WindowInfo { is_final, behind }
//! ```

use super::{ApiError, Handler, convert};
use crate::crdt::CrdtType;
use crate::pb;
use crate::pb::window_selector::Which;
use crate::window::{self, NoWindow, Selector, Window, WindowSpec};

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
        let own = api.store.watermark(partition)?;
        let remotes = api.store.remote_watermarks(partition)?;
        // this region first, then every region it merges
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
                total = total.saturating_add(state.as_ref().and_then(convert::count).unwrap_or(0));
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
