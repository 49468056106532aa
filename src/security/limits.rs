//! Per-caller limits of the region API: a token bucket of calls per second and a bound on
//! calls in flight, per caller and configured per role (`[api.limits.<role>]`), so one
//! caller flooding `Update`, `Scan` or `Watch` is refused `RESOURCE_EXHAUSTED` (with the
//! delay after which a call would be taken) instead of starving the others.
//!
//! A caller is its certificate's name, else its bearer token, else its IP address; the
//! lease group's members (other regions forwarding owned writes, this region's nodes
//! routing requests) carry many clients' calls and are not limited here.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::config::{CallLimit, Role};

/// Callers remembered beyond this many are forgotten once idle (their bucket full, nothing
/// in flight): a caller that comes back starts with a full bucket, as a new one does.
const REMEMBERED: usize = 4096;

/// What a caller's limits left of it.
struct Bucket {
    /// Calls it may start now (up to the burst).
    tokens: f64,
    at: Instant,
    /// Its calls in flight (`None`: no bound).
    in_flight: Option<Arc<Semaphore>>,
}

/// Why a call was refused, and when one would be taken.
#[derive(Debug, PartialEq)]
pub struct Exhausted {
    /// `rate` or `concurrency`.
    pub limit: &'static str,
    pub retry_after: Duration,
}

/// The limits per role, and each caller's bucket.
pub struct Limits {
    by_role: BTreeMap<Role, CallLimit>,
    callers: Mutex<HashMap<String, Bucket>>,
}

/// How long a caller over its concurrency waits before trying again.
const CONCURRENCY_RETRY: Duration = Duration::from_millis(10);

impl Limits {
    pub fn new(by_role: BTreeMap<Role, CallLimit>) -> Self {
        Self {
            by_role,
            callers: Mutex::new(HashMap::new()),
        }
    }

    /// Takes a call of `caller` (of `role`) at `now`: a permit held while it runs, where
    /// its role bounds calls in flight; refused once its bucket is empty or its calls in
    /// flight are at the bound.
    pub fn take(
        &self,
        caller: &str,
        role: Role,
        now: Instant,
    ) -> Result<Option<OwnedSemaphorePermit>, Exhausted> {
        let Some(limit) = self.by_role.get(&role) else {
            return Ok(None);
        };
        let mut callers = self.callers.lock().unwrap_or_else(|e| e.into_inner());
        if callers.len() >= REMEMBERED && !callers.contains_key(caller) {
            callers.retain(|_, b| !idle(b, limit, now));
        }
        let bucket = callers.entry(caller.to_owned()).or_insert_with(|| Bucket {
            tokens: limit.burst,
            at: now,
            in_flight: limit.concurrency.map(|n| Arc::new(Semaphore::new(n))),
        });
        let elapsed = now.saturating_duration_since(bucket.at).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * limit.rate).min(limit.burst);
        bucket.at = now;
        if bucket.tokens < 1.0 {
            let wait = (1.0 - bucket.tokens) / limit.rate;
            return Err(Exhausted {
                limit: "rate",
                retry_after: Duration::from_secs_f64(wait),
            });
        }
        let permit = match &bucket.in_flight {
            None => None,
            Some(in_flight) => match in_flight.clone().try_acquire_owned() {
                Ok(permit) => Some(permit),
                Err(_) => {
                    return Err(Exhausted {
                        limit: "concurrency",
                        retry_after: CONCURRENCY_RETRY,
                    });
                }
            },
        };
        bucket.tokens -= 1.0;
        Ok(permit)
    }
}

/// A bucket with nothing to remember: full and nothing in flight.
fn idle(bucket: &Bucket, limit: &CallLimit, now: Instant) -> bool {
    let elapsed = now.saturating_duration_since(bucket.at).as_secs_f64();
    let full = bucket.tokens + elapsed * limit.rate >= limit.burst;
    let running = (bucket.in_flight.as_ref())
        .is_some_and(|s| limit.concurrency.is_some_and(|n| s.available_permits() < n));
    full && !running
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(rate: f64, burst: f64, concurrency: Option<usize>) -> Limits {
        let limit = CallLimit {
            rate,
            burst,
            concurrency,
        };
        Limits::new(BTreeMap::from([(Role::Write, limit)]))
    }

    /// A caller spends its burst, is then refused with the time until its next token,
    /// and gets calls again at its rate; another caller's bucket is its own.
    #[test]
    fn a_caller_gets_its_burst_then_its_rate_and_no_more() {
        let limits = limits(10.0, 3.0, None);
        let t0 = Instant::now();
        for _ in 0..3 {
            assert!(limits.take("a", Role::Write, t0).is_ok());
        }
        let refused = limits.take("a", Role::Write, t0).unwrap_err();
        assert_eq!(refused.limit, "rate");
        assert_eq!(refused.retry_after, Duration::from_millis(100));
        assert!(
            limits.take("b", Role::Write, t0).is_ok(),
            "b has its own bucket"
        );
        let later = t0 + Duration::from_millis(100);
        assert!(limits.take("a", Role::Write, later).is_ok());
        assert!(limits.take("a", Role::Write, later).is_err());
        // a role without limits is not counted
        for _ in 0..100 {
            assert!(limits.take("a", Role::Read, later).is_ok());
        }
    }

    /// Calls in flight are bounded per caller: a permit is held while a call runs, and
    /// its end frees a place.
    #[test]
    fn a_callers_calls_in_flight_are_bounded() {
        let limits = limits(1000.0, 1000.0, Some(2));
        let now = Instant::now();
        let first = limits.take("a", Role::Write, now).unwrap();
        let _second = limits.take("a", Role::Write, now).unwrap();
        let refused = limits.take("a", Role::Write, now).unwrap_err();
        assert_eq!(refused.limit, "concurrency");
        drop(first);
        assert!(limits.take("a", Role::Write, now).is_ok());
    }

    /// Many callers are remembered up to a bound; idle ones are forgotten first, never
    /// one with calls in flight.
    #[test]
    fn idle_callers_are_forgotten_beyond_the_bound() {
        let limits = limits(1.0, 1.0, Some(1));
        let now = Instant::now();
        let busy = limits.take("busy", Role::Write, now).unwrap();
        for i in 0..REMEMBERED {
            drop(limits.take(&format!("c{i}"), Role::Write, now));
        }
        let later = now + Duration::from_secs(2);
        assert!(limits.take("new", Role::Write, later).is_ok());
        let callers = limits.callers.lock().unwrap();
        assert!(callers.len() < REMEMBERED, "{}", callers.len());
        assert!(callers.contains_key("busy"));
        drop(callers);
        drop(busy);
    }
}
