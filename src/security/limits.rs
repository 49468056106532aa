//! Per-caller limits of the region API: a token bucket of calls per second and a bound on
//! calls in flight, per caller and configured per role (`[api.limits.<role>]`), so one
//! caller flooding `Update`, `Scan` or `Watch` is refused `RESOURCE_EXHAUSTED` (with the
//! delay after which a call would be taken) instead of starving the others.
//!
//! A caller is its certificate's name, else its bearer token, else its IP address; the
//! lease group's members (other regions forwarding owned writes, this region's nodes
//! routing requests, over TLS) carry many clients' calls and are not limited here.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::config::{CallLimit, Role};

/// Callers remembered before the idle ones (their bucket full, nothing in flight) are
/// first forgotten; a forgotten caller that comes back starts with a full bucket, as a
/// new one does. The next sweep waits until twice as many are remembered as were left.
const REMEMBERED: usize = 4096;
/// Callers remembered at most: beyond, new callers share one bucket per role (an
/// attacker spraying addresses is held to one caller's limits).
const MOST_CALLERS: usize = 65_536;
/// The caller that new callers beyond [`MOST_CALLERS`] share.
const OVERFLOW: &str = "overflow";
/// How often the idle callers are looked for while [`MOST_CALLERS`] are remembered (so
/// new callers get buckets of their own again once the others went quiet).
const SWEEP_AT_MOST_EVERY: Duration = Duration::from_secs(1);

/// What a caller's limits left of it.
struct Bucket {
    /// Calls it may start now (up to the burst).
    tokens: f64,
    at: Instant,
    /// Its calls in flight (`None`: no bound).
    in_flight: Option<Arc<Semaphore>>,
}

impl Bucket {
    fn new(limit: &CallLimit, now: Instant) -> Self {
        Self {
            tokens: limit.burst,
            at: now,
            in_flight: limit.concurrency.map(|n| Arc::new(Semaphore::new(n))),
        }
    }

    fn refill(&mut self, limit: &CallLimit, now: Instant) {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * limit.rate).min(limit.burst);
        self.at = now;
    }

    /// Nothing to remember: full and nothing in flight.
    fn idle(&mut self, limit: &CallLimit, now: Instant) -> bool {
        self.refill(limit, now);
        let running = (self.in_flight.as_ref()).zip(limit.concurrency);
        self.tokens >= limit.burst && running.is_none_or(|(s, n)| s.available_permits() == n)
    }
}

/// Why a call was refused, and when one would be taken.
#[derive(Debug, PartialEq)]
pub struct Exhausted {
    /// `rate` or `concurrency`.
    pub limit: &'static str,
    pub retry_after: Duration,
}

/// The remembered callers' buckets, by role and caller.
struct Callers {
    buckets: HashMap<(Role, String), Bucket>,
    /// How many remembered callers start the next sweep of the idle ones.
    sweep_at: usize,
    swept: Instant,
}

/// The limits per role, and each caller's bucket.
pub struct Limits {
    by_role: BTreeMap<Role, CallLimit>,
    callers: Mutex<Callers>,
}

/// How long a caller over its concurrency is told to wait.
const CONCURRENCY_RETRY: Duration = Duration::from_millis(100);

impl Limits {
    pub fn new(by_role: BTreeMap<Role, CallLimit>) -> Self {
        Self {
            by_role,
            callers: Mutex::new(Callers {
                buckets: HashMap::new(),
                sweep_at: REMEMBERED,
                swept: Instant::now(),
            }),
        }
    }

    /// Whether callers of `role` are limited at all (else nothing is to be counted).
    pub fn bounds(&self, role: Role) -> bool {
        self.by_role.contains_key(&role)
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
        let Callers {
            buckets,
            sweep_at,
            swept,
        } = &mut *callers;
        let mut key = (role, caller.to_owned());
        if !buckets.contains_key(&key) {
            let at_most = buckets.len() >= MOST_CALLERS
                && now.saturating_duration_since(*swept) >= SWEEP_AT_MOST_EVERY;
            if buckets.len() >= *sweep_at || at_most {
                // every bucket's role is limited: buckets are made for those only
                buckets
                    .retain(|(role, _), b| !self.by_role.get(role).is_some_and(|l| b.idle(l, now)));
                *sweep_at = (2 * buckets.len()).max(REMEMBERED);
                *swept = now;
            }
            if buckets.len() >= MOST_CALLERS {
                key.1 = OVERFLOW.to_owned();
            }
        }
        let bucket = (buckets.entry(key)).or_insert_with(|| Bucket::new(limit, now));
        bucket.refill(limit, now);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(rate: f64, burst: f64, concurrency: Option<usize>) -> CallLimit {
        CallLimit {
            rate,
            burst,
            concurrency,
        }
    }

    fn limits(rate: f64, burst: f64, concurrency: Option<usize>) -> Limits {
        Limits::new(BTreeMap::from([(
            Role::Write,
            limit(rate, burst, concurrency),
        )]))
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

    /// Many callers are remembered up to a bound; idle ones are forgotten first, never one
    /// with calls in flight, whatever the role of the caller that starts the sweep; past
    /// the most remembered, new callers share one bucket.
    #[test]
    fn idle_callers_are_forgotten_and_new_ones_beyond_the_most_share_a_bucket() {
        let limits = Limits::new(BTreeMap::from([
            (Role::Write, limit(1.0, 1.0, Some(1))),
            (Role::Read, limit(1.0, 1.0, None)),
        ]));
        let now = Instant::now();
        let busy = limits.take("busy", Role::Write, now).unwrap();
        // the next new caller starts a sweep
        for i in 1..REMEMBERED {
            drop(limits.take(&format!("c{i}"), Role::Write, now));
        }
        let later = now + Duration::from_secs(2);
        assert!(limits.take("new", Role::Read, later).is_ok());
        {
            let callers = limits.callers.lock().unwrap();
            assert!(
                callers.buckets.len() < REMEMBERED,
                "{}",
                callers.buckets.len()
            );
            assert!(callers.buckets.contains_key(&(Role::Write, "busy".into())));
        }
        assert_eq!(
            limits.take("busy", Role::Write, later).unwrap_err().limit,
            "concurrency",
            "still one in flight"
        );
        drop(busy);

        let limits = limits_for_many();
        let now = Instant::now();
        for i in 0..MOST_CALLERS {
            drop(limits.take(&format!("c{i}"), Role::Write, now));
        }
        assert!(limits.take("sprayed-1", Role::Write, now).is_ok());
        let refused = limits.take("sprayed-2", Role::Write, now).unwrap_err();
        assert_eq!(refused.limit, "rate", "one bucket for the callers beyond");
        // once the others went quiet, a new caller has a bucket of its own again
        let quiet = now + Duration::from_secs(2000);
        assert!(limits.take("fresh", Role::Write, quiet).is_ok());
        let callers = limits.callers.lock().unwrap();
        assert!(callers.buckets.contains_key(&(Role::Write, "fresh".into())));
    }

    /// A caller's single call a second: every bucket stays busy (never full again within
    /// the test), so none is forgotten.
    fn limits_for_many() -> Limits {
        limits(0.001, 1.0, None)
    }
}
