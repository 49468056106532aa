//! Hybrid logical clock over `hybrid-clocks`, fed by an injected [`Clock`].
//!
//! Guarantees: every [`Hlc::now`] is strictly greater than every earlier `now`, every
//! observed remote stamp, and the high-water mark it was restored with; a remote stamp
//! more than `max_clock_offset` ahead of the local physical clock is refused and leaves
//! the clock untouched, so one region with a runaway clock cannot drag the others along.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use hybrid_clocks::{ClockSource, OffsetLimiter, Timestamp, WallNST};
use serde::{Deserialize, Serialize};

use super::Clock;

/// One HLC reading. Ordered by wall time, then by the logical counter.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct HlcTimestamp {
    /// Physical component: nanoseconds since the Unix epoch.
    pub wall_nanos: u64,
    /// Logical component: orders events that share a physical reading.
    pub logical: u32,
}

impl HlcTimestamp {
    pub const ZERO: HlcTimestamp = HlcTimestamp {
        wall_nanos: 0,
        logical: 0,
    };

    pub fn new(wall_nanos: u64, logical: u32) -> Self {
        Self {
            wall_nanos,
            logical,
        }
    }

    fn to_hybrid(self) -> Timestamp<WallNST> {
        Timestamp {
            epoch: 0,
            time: WallNST::of_u64(self.wall_nanos),
            count: self.logical,
        }
    }

    fn from_hybrid(ts: Timestamp<WallNST>) -> Self {
        Self::new(ts.time.as_u64(), ts.count)
    }
}

impl fmt::Display for HlcTimestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.wall_nanos, self.logical)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClockError {
    /// A remote stamp is further ahead of the local physical clock than allowed.
    #[error(
        "remote timestamp {remote} is {ahead:?} ahead of the local clock (max_clock_offset {max:?})"
    )]
    AheadOfLocal {
        remote: HlcTimestamp,
        ahead: Duration,
        max: Duration,
    },
    /// A remote stamp whose logical counter no real clock reaches (the clock adds one to
    /// what it observes, so `u32::MAX` would overflow it).
    #[error("remote timestamp {remote} has a logical counter above {max}: no clock issues that")]
    LogicalTooLarge { remote: HlcTimestamp, max: u32 },
}

impl ClockError {
    /// The reason label of a refused remote stamp.
    pub fn code(&self) -> &'static str {
        match self {
            ClockError::AheadOfLocal { .. } => "clock_ahead",
            ClockError::LogicalTooLarge { .. } => "logical_too_large",
        }
    }
}

/// The largest logical counter accepted from elsewhere. A real one stays tiny: it counts
/// the stamps issued within one nanosecond of wall time.
pub const MAX_LOGICAL: u32 = u32::MAX / 2;

/// Adapts an injected [`Clock`] to the `hybrid-clocks` source trait.
struct Source(Arc<dyn Clock>);

impl ClockSource for Source {
    type Time = WallNST;
    type Delta = Duration;

    fn now(&mut self) -> hybrid_clocks::Result<WallNST> {
        Ok(WallNST::of_u64(self.0.now_nanos()))
    }
}

/// A thread-safe hybrid logical clock with a max-offset guard.
pub struct Hlc {
    physical: Arc<dyn Clock>,
    max_offset: Duration,
    inner: Mutex<OffsetLimiter<Source>>,
}

impl Hlc {
    pub fn new(physical: Arc<dyn Clock>, max_offset: Duration) -> Self {
        // `Source::now` never fails, so neither does creating the clock.
        let clock = match hybrid_clocks::Clock::new(Source(physical.clone())) {
            Ok(clock) => clock,
            Err(_) => unreachable!("Source::now is infallible"),
        };
        Self {
            physical,
            max_offset,
            inner: Mutex::new(clock.with_max_diff(max_offset)),
        }
    }

    pub fn max_offset(&self) -> Duration {
        self.max_offset
    }

    /// The physical clock this HLC reads.
    pub fn physical(&self) -> &Arc<dyn Clock> {
        &self.physical
    }

    /// A stamp greater than any stamp this clock produced or accepted before.
    pub fn now(&self) -> HlcTimestamp {
        match self.lock().now() {
            Ok(ts) => HlcTimestamp::from_hybrid(ts),
            Err(_) => unreachable!("Source::now is infallible"),
        }
    }

    /// Accepts a stamp from another region: later local stamps are greater than it.
    /// Refuses (and ignores) one more than `max_offset` ahead of the local physical clock.
    pub fn observe(&self, remote: HlcTimestamp) -> Result<(), ClockError> {
        if remote.logical > MAX_LOGICAL {
            return Err(ClockError::LogicalTooLarge {
                remote,
                max: MAX_LOGICAL,
            });
        }
        let mut inner = self.lock();
        inner.observe(&remote.to_hybrid()).map_err(|_| {
            let local = self.physical.now_nanos();
            ClockError::AheadOfLocal {
                remote,
                ahead: Duration::from_nanos(remote.wall_nanos.saturating_sub(local)),
                max: self.max_offset,
            }
        })
    }

    /// Moves the clock past a stamp this region itself issued before (a restored
    /// high-water mark), without the offset guard: our own past is never refused.
    pub fn advance_past(&self, high_water: HlcTimestamp) {
        // past a corrupt logical counter by the next nanosecond instead (no overflow)
        let high_water = if high_water.logical > MAX_LOGICAL {
            HlcTimestamp::new(high_water.wall_nanos.saturating_add(1), 0)
        } else {
            high_water
        };
        self.lock().inner_mut().observe(&high_water.to_hybrid());
    }

    fn lock(&self) -> MutexGuard<'_, OffsetLimiter<Source>> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl fmt::Debug for Hlc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hlc")
            .field("max_offset", &self.max_offset)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use proptest::prelude::*;

    const SEC: u64 = 1_000_000_000;

    fn hlc(at: u64, max: Duration) -> (Arc<ManualClock>, Hlc) {
        let clock = Arc::new(ManualClock::new(at));
        let hlc = Hlc::new(clock.clone(), max);
        (clock, hlc)
    }

    #[test]
    fn stamps_are_strictly_monotone_when_physical_time_stands_still() {
        let (_clock, hlc) = hlc(100 * SEC, Duration::from_millis(500));
        let a = hlc.now();
        let b = hlc.now();
        assert!(b > a, "{b} must follow {a}");
        assert_eq!(a.wall_nanos, 100 * SEC);
    }

    #[test]
    fn stamps_follow_physical_time_when_it_moves() {
        let (clock, hlc) = hlc(100 * SEC, Duration::from_millis(500));
        hlc.now();
        clock.advance(Duration::from_secs(1));
        assert_eq!(hlc.now(), HlcTimestamp::new(101 * SEC, 0));
    }

    #[test]
    fn a_stamp_within_the_offset_is_accepted_and_later_stamps_follow_it() {
        let (_clock, hlc) = hlc(100 * SEC, Duration::from_millis(500));
        let remote = HlcTimestamp::new(100 * SEC + 400_000_000, 7);
        hlc.observe(remote).unwrap();
        assert!(hlc.now() > remote);
    }

    #[test]
    fn a_logical_counter_no_clock_issues_is_refused_and_never_overflows_the_clock() {
        let (_clock, hlc) = hlc(100 * SEC, Duration::from_millis(500));
        let forged = HlcTimestamp::new(100 * SEC, u32::MAX);
        assert_eq!(hlc.observe(forged).unwrap_err().code(), "logical_too_large");
        assert!(
            hlc.now() < forged,
            "a refused stamp must not move the clock"
        );
        // our own past (a restored high-water mark) is never refused, and never overflows
        hlc.advance_past(forged);
        assert!(hlc.now() > forged);
    }

    #[test]
    fn a_stamp_past_the_offset_guard_is_refused_and_ignored() {
        let (_clock, hlc) = hlc(100 * SEC, Duration::from_millis(500));
        let remote = HlcTimestamp::new(100 * SEC + 600_000_000, 0);
        let err = hlc.observe(remote).unwrap_err();
        assert_eq!(
            err,
            ClockError::AheadOfLocal {
                remote,
                ahead: Duration::from_millis(600),
                max: Duration::from_millis(500),
            }
        );
        assert!(
            hlc.now() < remote,
            "a refused stamp must not move the clock"
        );
    }

    #[test]
    fn a_stamp_in_the_past_is_always_accepted() {
        let (_clock, hlc) = hlc(100 * SEC, Duration::from_millis(1));
        hlc.observe(HlcTimestamp::new(SEC, 3)).unwrap();
    }

    #[test]
    fn a_restored_high_water_mark_is_never_stamped_below() {
        let (_clock, hlc) = hlc(100 * SEC, Duration::from_millis(1));
        let high_water = HlcTimestamp::new(200 * SEC, 5);
        hlc.advance_past(high_water);
        assert!(hlc.now() > high_water);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]

        /// Whatever the interleaving of local stamps, physical moves (also backwards) and
        /// remote stamps, every local stamp exceeds everything seen or issued before it.
        #[test]
        fn local_stamps_exceed_everything_before_them(
            steps in proptest::collection::vec((0u8..3, 0u64..2 * SEC, 0u32..4), 1..60)
        ) {
            let (clock, hlc) = hlc(1_000 * SEC, Duration::from_millis(250));
            let mut highest = HlcTimestamp::ZERO;
            for (kind, amount, logical) in steps {
                match kind {
                    0 => {
                        let ts = hlc.now();
                        prop_assert!(ts > highest, "{} not above {}", ts, highest);
                        highest = ts;
                    }
                    1 => clock.set(1_000 * SEC + amount),
                    _ => {
                        let remote = HlcTimestamp::new(1_000 * SEC + amount, logical);
                        if hlc.observe(remote).is_ok() {
                            highest = highest.max(remote);
                        } else {
                            prop_assert!(remote.wall_nanos > clock.now_nanos() + 250_000_000);
                        }
                    }
                }
            }
        }
    }
}
