//! Time as an input. Owns the physical clock trait ([`Clock`]), its system and manual
//! implementations, and the hybrid logical clock ([`Hlc`]) that stamps register writes.
//! Pure: nothing here does I/O. Every wall-clock reading of a node (HLC stamps, leases,
//! the clock check, heartbeats, checkpoint and savepoint names) goes through a [`Clock`]:
//! [`SystemClock`], or [`ShiftedClock`] over it for a node whose `clock-offset` is set.
//!
//! ```text
//!  Clock (system | manual) ──now_nanos──► Hlc ──now()──► HlcTimestamp (stamps writes)
//!                      remote stamp ──observe()──┘  refused if ahead > max_clock_offset
//! ```

mod hlc;

pub use hlc::{ClockError, Hlc, HlcTimestamp};

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A physical clock: nanoseconds since the Unix epoch. Injected everywhere time matters,
/// so tests drive time by hand and no data type reads the wall clock itself.
pub trait Clock: Send + Sync + 'static {
    fn now_nanos(&self) -> u64;
}

/// The operating system's wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_nanos(&self) -> u64 {
        // A clock before 1970 or after 2554 reads as the nearest representable instant.
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
            .unwrap_or(0)
    }
}

/// The operating system's wall clock shifted by a fixed offset (`clock-offset`): a node
/// whose clock is wrong, made on purpose for drills and tests. Every wall-clock reading of
/// the node goes through it (stamps, leases, the clock check); monotonic time does not.
#[derive(Debug, Clone, Copy)]
pub struct ShiftedClock {
    pub offset_nanos: i64,
}

impl Clock for ShiftedClock {
    fn now_nanos(&self) -> u64 {
        let now = SystemClock.now_nanos();
        if self.offset_nanos >= 0 {
            now.saturating_add(self.offset_nanos.unsigned_abs())
        } else {
            now.saturating_sub(self.offset_nanos.unsigned_abs())
        }
    }
}

/// A clock that moves only when told to; for tests and simulations.
#[derive(Debug, Default)]
pub struct ManualClock {
    nanos: AtomicU64,
}

impl ManualClock {
    pub fn new(nanos: u64) -> Self {
        Self {
            nanos: AtomicU64::new(nanos),
        }
    }

    pub fn set(&self, nanos: u64) {
        self.nanos.store(nanos, Ordering::SeqCst);
    }

    pub fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        self.nanos.fetch_add(by, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_nanos(&self) -> u64 {
        self.nanos.load(Ordering::SeqCst)
    }
}
