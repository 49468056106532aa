//! Event-time windows, pure: which slice an event falls in, which windows a slice
//! belongs to, when a region's part of a window closes, when a slice may be deleted, and
//! how a slice is stored.
//!
//! A windowed counter counts per key and per *slice* of event time. Slices are
//! `gcd(size, slide)` long, so one event touches one stored key however many windows it
//! falls in; a window (tumbling: one slice; hopping: `size / slice` consecutive slices) is
//! the sum of its slices.
//!
//! ```text
//!  event time t ──► slice [s, s + slice) ──► stored key "<key>\0<s as 20 digits>"
//!  window [w, w + size), w a multiple of slide  =  Σ slices s with w ≤ s < w + size
//!  a region's part of the window is closed once its watermark ≥ w + size + lateness
//! ```
//!
//! Times are milliseconds since the Unix epoch; the window grid starts at 0.

use std::time::Duration;

/// Separates a windowed key from its slice's start in the stored key. Keys of windowed
/// namespaces may not contain it.
pub const SLICE_SEP: char = '\0';
const SLICE_DIGITS: usize = 20;

/// A windowed namespace's windows, validated (`config`): every length is at least 1 ms,
/// and `size` is a multiple of `slide`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowSpec {
    pub size_ms: u64,
    /// Equal to `size_ms` for tumbling windows.
    pub slide_ms: u64,
    /// How long after a window's end its region still takes events for it.
    pub allowed_lateness_ms: u64,
    /// How long a final window stays readable before its slices are deleted.
    pub retention_ms: u64,
}

/// A window: `[start_ms, end_ms)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Window {
    pub start_ms: u64,
    pub end_ms: u64,
}

impl WindowSpec {
    pub fn tumbling(size: Duration) -> Self {
        let ms = size.as_millis() as u64;
        Self {
            size_ms: ms,
            slide_ms: ms,
            allowed_lateness_ms: 0,
            retention_ms: ms,
        }
    }

    pub fn slice_ms(&self) -> u64 {
        gcd(self.size_ms, self.slide_ms).max(1)
    }

    /// The start of the slice holding event time `t`.
    pub fn slice_of(&self, t: u64) -> u64 {
        t - t % self.slice_ms()
    }

    /// The window starting at `start_ms` (rounded down to the slide grid).
    pub fn window_at(&self, start_ms: u64) -> Window {
        let start_ms = start_ms - start_ms % self.slide_ms;
        Window {
            start_ms,
            end_ms: start_ms.saturating_add(self.size_ms),
        }
    }

    /// The newest window holding event time `t` (the one a "current window" read means).
    pub fn newest_window_of(&self, t: u64) -> Window {
        self.window_at(t)
    }

    /// The starts of the slices a window sums, oldest first.
    pub fn slices_of(&self, window: Window) -> impl Iterator<Item = u64> + use<> {
        let step = self.slice_ms();
        (window.start_ms..window.end_ms).step_by(step as usize)
    }

    /// The watermark at which a region's part of `window` closes: its end plus the
    /// allowed lateness.
    pub fn closes_at(&self, window: Window) -> u64 {
        window.end_ms.saturating_add(self.allowed_lateness_ms)
    }

    /// The windows whose close (end plus lateness) is in `(from, to]`, oldest first: those
    /// that became final as the lowest watermark over the regions rose from `from` to
    /// `to`. At most `max` (the newest).
    pub fn closing_between(&self, from: u64, to: u64, max: u64) -> Vec<Window> {
        let before_close = self.size_ms.saturating_add(self.allowed_lateness_ms);
        // start = close - size - lateness, on the slide grid
        let last = match to.checked_sub(before_close) {
            Some(start) => self.window_at(start),
            None => return Vec::new(),
        };
        let mut out = Vec::new();
        let mut start = last.start_ms;
        while self.closes_at(self.window_at(start)) > from && (out.len() as u64) < max {
            out.push(self.window_at(start));
            match start.checked_sub(self.slide_ms) {
                Some(earlier) => start = earlier,
                None => break,
            }
        }
        out.reverse();
        out
    }

    /// The watermark from which the slice at `s` may no longer change in a region: when
    /// the first window to end among those holding it closes. An event for it is late
    /// from then on.
    pub fn slice_closes_at(&self, s: u64) -> u64 {
        // the windows [w, w + size) holding s have w > s - size; the first to end has the
        // smallest such w on the slide grid
        let first = match (s + 1).checked_sub(self.size_ms) {
            Some(after) if after > 0 => after.div_ceil(self.slide_ms) * self.slide_ms,
            _ => 0,
        };
        self.closes_at(Window {
            start_ms: first,
            end_ms: first.saturating_add(self.size_ms),
        })
    }

    /// Whether an event at `t` is late at a region whose watermark is `watermark`: it
    /// would change a window whose part there is closed.
    pub fn is_late(&self, t: u64, watermark: Option<u64>) -> bool {
        watermark.is_some_and(|w| w >= self.slice_closes_at(self.slice_of(t)))
    }

    /// Whether the slice at `s` may be deleted once every region's watermark is at least
    /// `watermark`: the last window holding it has been closed for the retention.
    pub fn slice_expired(&self, s: u64, watermark: u64) -> bool {
        let last = self.window_at(s);
        watermark >= self.closes_at(last).saturating_add(self.retention_ms)
    }
}

/// Which window of a windowed key a read names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Selector {
    /// The window holding the newest event time the key's partition has seen here.
    Current,
    /// The newest window final in every region.
    LatestFinal,
    /// The window starting at this time (rounded down to the slide).
    Start(u64),
}

/// Why a selector names no window.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NoWindow {
    #[error("the key's partition has seen no windowed event in this region yet")]
    NoEventYet,
    #[error("no window is final yet: some region's watermark has not passed the first one's close")]
    NoneFinal,
}

impl WindowSpec {
    /// The window `selector` names, given this region's watermark on the key's partition
    /// and the lowest watermark over every region (`None` if one has none yet).
    pub fn select(
        &self,
        selector: Selector,
        own: Option<u64>,
        lowest: Option<u64>,
        out_of_orderness_ms: u64,
    ) -> Result<Window, NoWindow> {
        match selector {
            Selector::Start(start) => Ok(self.window_at(start)),
            Selector::Current => own
                .map(|w| self.newest_window_of(w.saturating_add(out_of_orderness_ms)))
                .ok_or(NoWindow::NoEventYet),
            Selector::LatestFinal => {
                // the newest window whose end plus the lateness is at or below `lowest`
                let latest_start = lowest
                    .and_then(|w| w.checked_sub(self.allowed_lateness_ms))
                    .and_then(|w| w.checked_sub(self.size_ms))
                    .ok_or(NoWindow::NoneFinal)?;
                Ok(self.window_at(latest_start))
            }
        }
    }

    /// The regions whose watermark has not passed `window`'s close: none, and the window
    /// is final (its value the same in every region, for ever).
    pub fn behind<'a, R>(
        &self,
        window: Window,
        watermarks: &'a [(R, Option<u64>)],
    ) -> Vec<&'a (R, Option<u64>)> {
        let closes_at = self.closes_at(window);
        watermarks
            .iter()
            .filter(|(_, w)| w.is_none_or(|w| w < closes_at))
            .collect()
    }

    /// Whether `window` was final for the retention once every region's watermark is at
    /// least `lowest`: its slices may be gone.
    pub fn expired(&self, window: Window, lowest: Option<u64>) -> bool {
        lowest.is_some_and(|w| w >= self.closes_at(window).saturating_add(self.retention_ms))
    }
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// The stored key of `key`'s slice at `slice_ms`: sorts by key, then by time.
pub fn slice_key(key: &str, slice_ms: u64) -> String {
    format!("{key}{SLICE_SEP}{slice_ms:0SLICE_DIGITS$}")
}

/// The (windowed key, window start) pairs of `windows` that hold a slice among `stored`
/// keys: the windows of those keys that have something to read.
pub fn windows_with_slices<'a>(
    stored: impl IntoIterator<Item = &'a str>,
    windows: &[Window],
) -> std::collections::BTreeSet<(String, u64)> {
    let mut found = std::collections::BTreeSet::new();
    for stored in stored {
        let (key, Some(slice)) = split_slice_key(stored) else {
            continue;
        };
        for w in windows
            .iter()
            .filter(|w| (w.start_ms..w.end_ms).contains(&slice))
        {
            found.insert((key.to_owned(), w.start_ms));
        }
    }
    found
}

/// A stored key's windowed key and slice start, if it is a slice's key.
pub fn split_slice_key(stored: &str) -> (&str, Option<u64>) {
    match stored.rsplit_once(SLICE_SEP) {
        Some((key, digits))
            if digits.len() == SLICE_DIGITS && digits.bytes().all(|b| b.is_ascii_digit()) =>
        {
            (key, digits.parse().ok())
        }
        _ => (stored, None),
    }
}

/// The key whose partition a stored key lives in: a slice lives with its windowed key.
pub fn home_key(stored: &str) -> &str {
    split_slice_key(stored).0
}

/// The Kafka key of a watermark record: a partition's owner appends one to an idle
/// partition of the updates topic (`ingest::idle`), and ingest raises the partition's
/// watermark to its value where it meets it in the log, so a replay does the same.
pub const WATERMARK_KEY: &[u8] = b"\0geostate.watermark";

/// A watermark record's value: the watermark's eight big-endian bytes.
pub fn encode_watermark(watermark_ms: u64) -> Vec<u8> {
    watermark_ms.to_be_bytes().to_vec()
}

pub fn decode_watermark(bytes: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(bytes.try_into().ok()?))
}

/// Outbox keys of late events start with this; no state key does (none starts with NUL).
pub const LATE_PREFIX: &str = "\0late/";

/// The outbox key of the late event read at `partition`/`offset` of the updates topic:
/// unique per source record, so a replay that judges it late again writes the same entry.
pub fn late_key(partition: i32, offset: i64) -> String {
    format!("{LATE_PREFIX}{partition}/{offset:0SLICE_DIGITS$}")
}

/// Outbox keys of owned registers' outputs (`register-changes`) start with this.
pub const OUTPUT_PREFIX: &str = "\0output/";

/// The outbox key of the output of the owned write read at `partition`/`offset` of the
/// updates topic: unique per source record, as a late event's.
pub fn output_key(partition: i32, offset: i64) -> String {
    format!("{OUTPUT_PREFIX}{partition}/{offset:0SLICE_DIGITS$}")
}

/// The source position a late event's outbox key names.
pub fn late_position(key: &str) -> Option<(i32, i64)> {
    position_after(key, LATE_PREFIX)
}

/// The source position an outbox key of a late event or of an owned output names: the
/// outbox entries that are records for other topics, one per source record, never
/// coalesced with another.
pub fn record_position(key: &str) -> Option<(i32, i64)> {
    position_after(key, LATE_PREFIX).or_else(|| position_after(key, OUTPUT_PREFIX))
}

fn position_after(key: &str, prefix: &str) -> Option<(i32, i64)> {
    let (partition, offset) = key.strip_prefix(prefix)?.split_once('/')?;
    Some((partition.parse().ok()?, offset.parse().ok()?))
}

/// A partition's watermark after an event at `t`: the largest event time seen less the
/// out-of-orderness bound, never moving back.
pub fn advanced(watermark: Option<u64>, t: u64, out_of_orderness_ms: u64) -> Option<u64> {
    let candidate = t.saturating_sub(out_of_orderness_ms);
    Some(watermark.map_or(candidate, |w| w.max(candidate)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: u64 = 60_000;

    #[test]
    fn the_windows_closing_as_the_watermark_rises_are_those_whose_close_it_passed() {
        let spec = WindowSpec {
            size_ms: MIN,
            slide_ms: MIN,
            allowed_lateness_ms: 10_000,
            retention_ms: 60 * MIN,
        };
        let starts = |from, to| -> Vec<u64> {
            spec.closing_between(from, to, 1000)
                .iter()
                .map(|w| w.start_ms / MIN)
                .collect()
        };
        // [10, 11) closes at 11:10, [11, 12) at 12:10
        assert_eq!(starts(11 * MIN, 11 * MIN + 9_999), Vec::<u64>::new());
        assert_eq!(starts(11 * MIN, 11 * MIN + 10_000), [10]);
        assert_eq!(starts(11 * MIN + 10_000, 12 * MIN + 10_000), [11]);
        assert_eq!(starts(11 * MIN, 13 * MIN + 10_000), [10, 11, 12]);
        assert_eq!(starts(0, 5_000), Vec::<u64>::new());
        let newest_two: Vec<u64> = spec
            .closing_between(11 * MIN, 13 * MIN + 10_000, 2)
            .iter()
            .map(|w| w.start_ms / MIN)
            .collect();
        assert_eq!(newest_two, [11, 12], "at most `max`, the newest");
    }

    #[test]
    fn the_windows_with_a_slice_are_named_by_their_windowed_key() {
        let spec = hopping(2 * MIN, MIN, 0);
        let windows = [spec.window_at(0), spec.window_at(MIN)];
        let stored = [
            slice_key("k", 0),
            slice_key("k", 2 * MIN),
            slice_key("j", MIN),
            "plain".to_owned(),
        ];
        let found = windows_with_slices(stored.iter().map(String::as_str), &windows);
        let expected = [("j", 0), ("j", MIN), ("k", 0), ("k", MIN)].map(|(k, s)| (k.to_owned(), s));
        assert_eq!(found, expected.into_iter().collect());
    }

    fn hopping(size: u64, slide: u64, lateness: u64) -> WindowSpec {
        WindowSpec {
            size_ms: size,
            slide_ms: slide,
            allowed_lateness_ms: lateness,
            retention_ms: 10 * MIN,
        }
    }

    #[test]
    fn a_tumbling_window_is_one_slice_and_closes_at_its_end_plus_lateness() {
        let spec = hopping(MIN, MIN, 5_000);
        assert_eq!(spec.slice_ms(), MIN);
        assert_eq!(spec.slice_of(3 * MIN + 59_999), 3 * MIN);
        let w = spec.newest_window_of(3 * MIN + 1);
        assert_eq!((w.start_ms, w.end_ms), (3 * MIN, 4 * MIN));
        assert_eq!(spec.slices_of(w).collect::<Vec<_>>(), vec![3 * MIN]);
        assert_eq!(spec.slice_closes_at(3 * MIN), 4 * MIN + 5_000);
        assert!(!spec.is_late(3 * MIN, Some(4 * MIN + 4_999)));
        assert!(spec.is_late(3 * MIN, Some(4 * MIN + 5_000)));
        assert!(
            !spec.is_late(3 * MIN, None),
            "no watermark yet: nothing is late"
        );
    }

    /// Five-minute windows every minute: a slice is in five windows and closes with the
    /// first of them to end; a window sums five slices.
    #[test]
    fn a_hopping_window_sums_its_slices_and_a_slice_closes_with_its_first_window() {
        let spec = hopping(5 * MIN, MIN, 0);
        assert_eq!(spec.slice_ms(), MIN);
        let w = spec.window_at(10 * MIN + 30_000);
        assert_eq!((w.start_ms, w.end_ms), (10 * MIN, 15 * MIN));
        assert_eq!(
            spec.slices_of(w).collect::<Vec<_>>(),
            (10..15).map(|m| m * MIN).collect::<Vec<_>>()
        );
        // the slice [10, 11) is in the windows starting at 6..=10: the first ends at 11
        assert_eq!(spec.slice_closes_at(10 * MIN), 11 * MIN);
        // the slices at the grid's start are in fewer windows
        assert_eq!(spec.slice_closes_at(0), 5 * MIN);
        assert_eq!(spec.slice_closes_at(4 * MIN), 5 * MIN);
        assert_eq!(spec.slice_closes_at(5 * MIN), 6 * MIN);
        // uneven: 3-minute windows every 2 minutes slice by 1 minute
        let uneven = hopping(3 * MIN, 2 * MIN, 0);
        assert_eq!(uneven.slice_ms(), MIN);
        // [4, 5) is in [2, 5) and [4, 7)
        assert_eq!(uneven.slice_closes_at(4 * MIN), 5 * MIN);
        // [5, 6) is in [4, 7) only
        assert_eq!(uneven.slice_closes_at(5 * MIN), 7 * MIN);
    }

    /// Every window that holds a slice closes no earlier than the slice does: a slice
    /// closed for new events never belongs to a window that is still open.
    #[test]
    fn a_slice_closes_exactly_when_its_first_window_does() {
        for (size, slide) in [(5, 1), (3, 2), (4, 4), (6, 4), (7, 3)] {
            let spec = hopping(size * MIN, slide * MIN, 0);
            for s in (0..40 * MIN).step_by(spec.slice_ms() as usize) {
                let holding: Vec<Window> = (0..=s)
                    .step_by(spec.slide_ms as usize)
                    .map(|w| spec.window_at(w))
                    .filter(|w| w.start_ms <= s && s < w.end_ms)
                    .collect();
                let first = holding.iter().map(|w| spec.closes_at(*w)).min();
                assert_eq!(
                    Some(spec.slice_closes_at(s)),
                    first,
                    "{size}/{slide} at {s}"
                );
            }
        }
    }

    #[test]
    fn a_slice_expires_once_its_last_window_was_closed_for_the_retention() {
        let spec = WindowSpec {
            retention_ms: 2 * MIN,
            ..hopping(5 * MIN, MIN, 10_000)
        };
        // the last window holding [10, 11) is [10, 15): closed at 15:10, kept to 17:10
        assert!(!spec.slice_expired(10 * MIN, 17 * MIN + 9_999));
        assert!(spec.slice_expired(10 * MIN, 17 * MIN + 10_000));
    }

    /// A read names the current window by this region's newest event time, the latest
    /// final one by the lowest watermark over the regions; the certificate lists the
    /// regions whose watermark is short of the window's close.
    #[test]
    fn a_selector_names_a_window_and_the_certificate_the_regions_behind() {
        let spec = hopping(MIN, MIN, 10_000);
        let current = spec.select(Selector::Current, Some(10 * MIN), None, 5_000);
        assert_eq!(current.map(|w| w.start_ms), Ok(10 * MIN));
        assert_eq!(
            spec.select(Selector::Current, None, None, 5_000),
            Err(NoWindow::NoEventYet)
        );
        // [8, 9) closes at 9:10; [9, 10) at 10:10
        let latest = spec.select(Selector::LatestFinal, None, Some(10 * MIN), 0);
        assert_eq!(latest.map(|w| w.start_ms), Ok(8 * MIN));
        let latest = spec.select(Selector::LatestFinal, None, Some(10 * MIN + 10_000), 0);
        assert_eq!(latest.map(|w| w.start_ms), Ok(9 * MIN));
        assert_eq!(
            spec.select(Selector::LatestFinal, None, Some(MIN), 0),
            Err(NoWindow::NoneFinal)
        );
        assert_eq!(
            spec.select(Selector::LatestFinal, None, None, 0),
            Err(NoWindow::NoneFinal)
        );
        let at = spec
            .select(Selector::Start(9 * MIN + 1), None, None, 0)
            .unwrap();
        assert_eq!(at.start_ms, 9 * MIN);

        let watermarks = [
            ("us-east-1", Some(10 * MIN + 10_000)),
            ("eu-west-1", Some(10 * MIN + 9_999)),
            ("ap-south-1", None),
        ];
        let behind: Vec<&str> = spec
            .behind(at, &watermarks)
            .iter()
            .map(|(r, _)| *r)
            .collect();
        assert_eq!(behind, ["eu-west-1", "ap-south-1"]);
        assert!(spec.behind(at, &watermarks[..1]).is_empty(), "final");
        assert!(!spec.expired(at, Some(10 * MIN + 10_000)));
        assert!(spec.expired(at, Some(20 * MIN + 10_000)));
    }

    #[test]
    fn a_slice_key_sorts_by_key_then_time_and_splits_back() {
        let a = slice_key("requests/9q8yy", 60_000);
        let b = slice_key("requests/9q8yy", 600_000);
        assert!(a < b);
        assert_eq!(split_slice_key(&b), ("requests/9q8yy", Some(600_000)));
        assert_eq!(home_key(&a), "requests/9q8yy");
        assert_eq!(split_slice_key("requests/9q8yy"), ("requests/9q8yy", None));
        assert_eq!(split_slice_key("odd\0key"), ("odd\0key", None));
        assert_eq!(record_position(&output_key(2, 7)), Some((2, 7)));
        assert_eq!(late_position(&output_key(2, 7)), None);
        let late = late_key(3, 42);
        assert_eq!(late_position(&late), Some((3, 42)));
        assert_eq!(late_position("requests/9q8yy"), None);
    }

    #[test]
    fn a_watermark_follows_the_largest_event_time_less_the_bound_and_never_moves_back() {
        let w = advanced(None, 10_000, 2_000);
        assert_eq!(w, Some(8_000));
        assert_eq!(advanced(w, 9_000, 2_000), Some(8_000));
        assert_eq!(advanced(w, 15_000, 2_000), Some(13_000));
        assert_eq!(advanced(None, 1_000, 2_000), Some(0));
    }
}
