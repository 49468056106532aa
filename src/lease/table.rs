//! PURE: the lease table, the Raft state machine's data. Commands carry their proposer's
//! wall-clock time; applying a command never reads a clock, so every replica of the table
//! decides the same.
//!
//! The rules, with `δ` = `max_clock_offset` (the largest difference between any two
//! regions' wall clocks) and `D` the lease duration:
//!
//! - a grant records `expires_at = proposer's time + D`; the holder itself treats the lease
//!   as valid until `request_sent + D − δ` on its monotonic clock ([`super::holder`]);
//! - a shard goes to another region only when the proposer's time is at or past the current
//!   `expires_at`, so its holder's validity (which ends `δ` before `expires_at`) has
//!   ended, whatever the two clocks say within `δ`;
//! - every grant that is not a renewal of a lease still in force increments the shard's
//!   epoch, the fencing token stamped on every owned write and delta;
//! - a renewal must name the current epoch: a delayed or duplicated command from an older
//!   holding is refused;
//! - a release or a transfer is proposed by the holder after it stopped writing; it ends
//!   the lease at `proposer's time + δ`, which keeps the rule above true for the next
//!   holder, and a transfer names the next holder, who must renew before it writes;
//! - a holder's command stamped earlier than its latest applied one is refused: the log
//!   may order a renewal sent after a release before it, and that release must not cut
//!   the renewed lease (found by the simulation).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::crdt::RegionId;

/// An ownership shard: a hash of the key into `shards` buckets.
pub type ShardId = u32;

/// The shard of `key` among `shards` (FNV-1a, stable across versions and platforms).
pub fn shard_of(key: &str, shards: u32) -> ShardId {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in key.as_bytes() {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (hash % u64::from(shards.max(1))) as ShardId
}

/// The id of learner `n` (1, 2, …) of the region whose member is `member`: the member's id
/// in the high half, so the table knows a learner's region.
pub fn learner_id(member: u64, n: u32) -> u64 {
    (member << 32) | u64::from(n)
}

/// One shard's row.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    pub holder: RegionId,
    /// Fencing token: increases with every new grant of the shard.
    pub epoch: u64,
    /// Wall-clock milliseconds (the proposer's clock) when the lease ends.
    pub expires_at_ms: u64,
    /// The holder's clock at its latest applied command: a holder's command stamped
    /// earlier was overtaken in the log by a later one (a renewal sent after a release,
    /// a release sent after a renewal) and is refused.
    pub last_ms: u64,
    /// The region last refused this shard because it was held (a preferred home asking
    /// for it back), and that region's clock then: the holder hands it over.
    #[serde(default)]
    pub wanted_by: Option<RegionId>,
    #[serde(default)]
    pub wanted_at_ms: u64,
}

/// A proposal to the lease group. `now_ms` is the proposer's wall clock when it sent it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Take the shard (or renew it, if `region` holds it and it is in force).
    Acquire {
        shard: ShardId,
        region: RegionId,
        now_ms: u64,
        duration_ms: u64,
    },
    /// Extend a holding; refused unless `region` holds the shard at `epoch`.
    Renew {
        shard: ShardId,
        region: RegionId,
        epoch: u64,
        now_ms: u64,
        duration_ms: u64,
    },
    /// Give the shard up (the holder stopped writing first).
    Release {
        shard: ShardId,
        region: RegionId,
        epoch: u64,
        now_ms: u64,
    },
    /// Hand the shard to `to` (the holder stopped writing first); `to` must renew before
    /// it writes.
    Transfer {
        shard: ShardId,
        from: RegionId,
        to: RegionId,
        epoch: u64,
        now_ms: u64,
    },
    /// Changes nothing: its outcome is the shard's row once every command before it is
    /// applied, a linearizable read through the log.
    Read { shard: ShardId },
}

impl Command {
    pub fn shard(&self) -> ShardId {
        match self {
            Command::Acquire { shard, .. }
            | Command::Renew { shard, .. }
            | Command::Release { shard, .. }
            | Command::Transfer { shard, .. }
            | Command::Read { shard } => *shard,
        }
    }
}

/// What applying a command decided.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    /// The lease now held (a new grant, a renewal, or the state after a release/transfer).
    Granted(Lease),
    Refused {
        reason: Refusal,
        current: Option<Lease>,
    },
    /// The row a [`Command::Read`] found.
    Current(Option<Lease>),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Refusal {
    /// Another region holds the shard and its lease has not ended at the proposer's time.
    HeldElsewhere,
    /// The command names an epoch that is not the current one (delayed or duplicated).
    StaleEpoch,
    /// The proposer does not hold the shard.
    NotHolder,
    /// The holder sent a later command that is already applied.
    Superseded,
    /// The shard's epoch is `u64::MAX`: no later one exists, so no new grant can fence the
    /// last (only a forged command gets there).
    EpochsExhausted,
    /// A release or transfer by a region with several nodes (learners in the group): its
    /// other nodes may still write under their own renewals, so the shard moves only
    /// once the lease expires.
    SeveralNodes,
    /// A region not in the group, a shard that does not exist, or times no member's clock
    /// can have sent ([`Bounds`]): a forged or corrupt command.
    Impossible,
}

/// The longest lease any configuration grants (`lease.duration` is at most this).
pub const MAX_DURATION_MS: u64 = 3_600_000;
/// A proposer's time is after 2020-01-01 ...
const EARLIEST_MS: u64 = 1_577_836_800_000;
/// ... and before 2200-01-01.
const LATEST_MS: u64 = 7_258_118_400_000;

/// What a command may name: the group's regions and shards, times that a clock of this
/// century sent, a duration no longer than [`MAX_DURATION_MS`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bounds {
    pub regions: BTreeSet<RegionId>,
    /// Shards are `0..shards`.
    pub shards: ShardId,
    /// Proposers' times (milliseconds since the Unix epoch).
    pub times: std::ops::Range<u64>,
}

impl Bounds {
    /// The group's regions and shard count, times of this century and the next.
    pub fn new(regions: BTreeSet<RegionId>, shards: ShardId) -> Self {
        Self {
            regions,
            shards,
            times: EARLIEST_MS..LATEST_MS,
        }
    }

    /// Whether `command` is possible.
    pub fn admit(&self, command: &Command) -> bool {
        let time = |ms: &u64| self.times.contains(ms);
        let duration = |ms: &u64| (1..=MAX_DURATION_MS).contains(ms);
        let region = |r: &RegionId| self.regions.contains(r);
        command.shard() < self.shards
            && match command {
                Command::Read { .. } => true,
                Command::Acquire {
                    region: r,
                    now_ms,
                    duration_ms,
                    ..
                }
                | Command::Renew {
                    region: r,
                    now_ms,
                    duration_ms,
                    ..
                } => region(r) && time(now_ms) && duration(duration_ms),
                Command::Release {
                    region: r, now_ms, ..
                } => region(r) && time(now_ms),
                Command::Transfer {
                    from, to, now_ms, ..
                } => region(from) && region(to) && from != to && time(now_ms),
            }
    }
}

/// The epoch of the next grant after `current` (`None`: there is none).
fn next_epoch(current: Option<&Lease>) -> Option<u64> {
    current.map_or(Some(1), |l| l.epoch.checked_add(1))
}

/// The lease table: the Raft state machine's data.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseTable {
    shards: BTreeMap<ShardId, Lease>,
    /// `max_clock_offset` in milliseconds: part of the rules, so part of the state.
    max_offset_ms: u64,
}

impl LeaseTable {
    pub fn new(max_offset_ms: u64) -> Self {
        Self {
            shards: BTreeMap::new(),
            max_offset_ms,
        }
    }

    pub fn get(&self, shard: ShardId) -> Option<&Lease> {
        self.shards.get(&shard)
    }

    /// Applies one command (deterministic: no clock is read).
    pub fn apply(&mut self, command: &Command) -> Outcome {
        let shard = command.shard();
        let current = self.shards.get(&shard).cloned();
        let decided = match command {
            Command::Read { .. } => return Outcome::Current(current),
            Command::Acquire {
                region,
                now_ms,
                duration_ms,
                ..
            } => self.acquire(shard, current.as_ref(), region, *now_ms, *duration_ms),
            Command::Renew {
                region,
                epoch,
                now_ms,
                duration_ms,
                ..
            } => renew(current.as_ref(), region, *epoch, *now_ms, *duration_ms),
            Command::Release {
                region,
                epoch,
                now_ms,
                ..
            } => self.release(current.as_ref(), region, *epoch, *now_ms),
            Command::Transfer {
                from,
                to,
                epoch,
                now_ms,
                ..
            } => self.transfer(current.as_ref(), from, to, *epoch, *now_ms),
        };
        match decided {
            Ok(next) => {
                self.shards.insert(shard, next.clone());
                Outcome::Granted(next)
            }
            Err(reason) => Outcome::Refused { reason, current },
        }
    }

    /// The lease a [`Command::Acquire`] by `region` leaves on `shard`, whose row is
    /// `current`, or why it is refused. A refusal because another region holds the shard
    /// still records `region` as wanting it.
    fn acquire(
        &mut self,
        shard: ShardId,
        current: Option<&Lease>,
        region: &RegionId,
        now_ms: u64,
        duration_ms: u64,
    ) -> Result<Lease, Refusal> {
        match current {
            Some(l) if &l.holder == region && now_ms < l.last_ms => Err(Refusal::Superseded),
            // a renewal of a lease still in force keeps its epoch
            Some(l) if &l.holder == region && now_ms < l.expires_at_ms => Ok(Lease {
                expires_at_ms: l.expires_at_ms.max(now_ms.saturating_add(duration_ms)),
                last_ms: now_ms,
                ..l.clone()
            }),
            Some(l) if &l.holder != region && now_ms < l.expires_at_ms => {
                // remembered (deterministically) so the holder can hand it over
                let mut wanted = l.clone();
                wanted.wanted_by = Some(region.clone());
                wanted.wanted_at_ms = now_ms;
                self.shards.insert(shard, wanted);
                Err(Refusal::HeldElsewhere)
            }
            _ => Ok(Lease {
                holder: region.clone(),
                epoch: next_epoch(current).ok_or(Refusal::EpochsExhausted)?,
                expires_at_ms: now_ms.saturating_add(duration_ms),
                last_ms: now_ms,
                wanted_by: None,
                wanted_at_ms: 0,
            }),
        }
    }

    /// The lease a [`Command::Release`] leaves, or why it is refused: it ends a clock
    /// offset after the proposal, if not before.
    fn release(
        &self,
        current: Option<&Lease>,
        region: &RegionId,
        epoch: u64,
        now_ms: u64,
    ) -> Result<Lease, Refusal> {
        match current {
            Some(l) if &l.holder == region && l.epoch == epoch && now_ms < l.last_ms => {
                Err(Refusal::Superseded)
            }
            Some(l) if &l.holder == region && l.epoch == epoch => Ok(Lease {
                expires_at_ms: l
                    .expires_at_ms
                    .min(now_ms.saturating_add(self.max_offset_ms)),
                last_ms: now_ms,
                ..l.clone()
            }),
            Some(l) if &l.holder == region => Err(Refusal::StaleEpoch),
            _ => Err(Refusal::NotHolder),
        }
    }

    /// The lease a [`Command::Transfer`] leaves (held by `to` at the next epoch), or why
    /// it is refused.
    fn transfer(
        &self,
        current: Option<&Lease>,
        from: &RegionId,
        to: &RegionId,
        epoch: u64,
        now_ms: u64,
    ) -> Result<Lease, Refusal> {
        match current {
            Some(l) if &l.holder == from && l.epoch == epoch && now_ms < l.last_ms => {
                Err(Refusal::Superseded)
            }
            Some(l) if &l.holder == from && l.epoch == epoch => Ok(Lease {
                holder: to.clone(),
                epoch: next_epoch(Some(l)).ok_or(Refusal::EpochsExhausted)?,
                // the new holder's renewals extend this; nobody else takes it before
                expires_at_ms: l
                    .expires_at_ms
                    .max(now_ms.saturating_add(self.max_offset_ms)),
                // the new holder's clock starts counting from its first renewal
                last_ms: 0,
                wanted_by: None,
                wanted_at_ms: 0,
            }),
            Some(l) if &l.holder == from => Err(Refusal::StaleEpoch),
            _ => Err(Refusal::NotHolder),
        }
    }
}

/// The lease a [`Command::Renew`] by `region` at `epoch` leaves, or why it is refused.
fn renew(
    current: Option<&Lease>,
    region: &RegionId,
    epoch: u64,
    now_ms: u64,
    duration_ms: u64,
) -> Result<Lease, Refusal> {
    match current {
        Some(l) if &l.holder == region && l.epoch == epoch && now_ms < l.last_ms => {
            Err(Refusal::Superseded)
        }
        Some(l) if &l.holder == region && l.epoch == epoch => Ok(Lease {
            expires_at_ms: l.expires_at_ms.max(now_ms.saturating_add(duration_ms)),
            last_ms: now_ms,
            ..l.clone()
        }),
        Some(l) if &l.holder == region => Err(Refusal::StaleEpoch),
        _ => Err(Refusal::NotHolder),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regions outside the group, shards that do not exist, durations of zero or over an
    /// hour, and times outside 2020..2200 are refused, whoever sends them.
    #[test]
    fn bounds_refuse_what_no_member_proposes() {
        let bounds = Bounds::new(BTreeSet::from([r("eu-west-1"), r("us-east-1")]), 8);
        let now_ms = 1_800_000_000_000;
        let acquire = |region: &str, shard, now_ms, duration_ms| Command::Acquire {
            shard,
            region: r(region),
            now_ms,
            duration_ms,
        };
        assert!(bounds.admit(&acquire("eu-west-1", 7, now_ms, 2000)));
        assert!(!bounds.admit(&acquire("ap-south-1", 7, now_ms, 2000)));
        assert!(!bounds.admit(&acquire("eu-west-1", 8, now_ms, 2000)));
        assert!(!bounds.admit(&acquire("eu-west-1", 7, now_ms, 0)));
        assert!(!bounds.admit(&acquire("eu-west-1", 7, now_ms, MAX_DURATION_MS + 1)));
        assert!(!bounds.admit(&acquire("eu-west-1", 7, 1000, 2000)));
        assert!(!bounds.admit(&acquire("eu-west-1", 7, u64::MAX - 1, 2000)));
        let transfer = |from: &str, to: &str| Command::Transfer {
            shard: 1,
            from: r(from),
            to: r(to),
            epoch: 3,
            now_ms,
        };
        assert!(bounds.admit(&transfer("eu-west-1", "us-east-1")));
        assert!(!bounds.admit(&transfer("eu-west-1", "eu-west-1")));
        assert!(!bounds.admit(&transfer("eu-west-1", "mallory")));
        assert!(bounds.admit(&Command::Read { shard: 7 }));
        assert!(!bounds.admit(&Command::Read { shard: 9 }));
    }

    fn r(name: &str) -> RegionId {
        RegionId::new(name).unwrap()
    }

    fn acquire(region: &str, now_ms: u64) -> Command {
        Command::Acquire {
            shard: 0,
            region: r(region),
            now_ms,
            duration_ms: 1000,
        }
    }

    /// A read answers the shard's row as the commands before it left it, and changes
    /// nothing (a later command decides as if it had not been applied).
    #[test]
    fn a_read_answers_the_row_and_changes_nothing() {
        let mut t = LeaseTable::new(100);
        assert_eq!(t.apply(&Command::Read { shard: 0 }), Outcome::Current(None));
        let Outcome::Granted(a) = t.apply(&acquire("us-east-1", 10)) else {
            panic!()
        };
        assert_eq!(
            t.apply(&Command::Read { shard: 0 }),
            Outcome::Current(Some(a.clone()))
        );
        assert_eq!(t.apply(&Command::Read { shard: 1 }), Outcome::Current(None));
        assert_eq!(t.get(0), Some(&a));
        // still held by us-east-1 at its time: the read did not touch `last_ms`
        assert!(matches!(
            t.apply(&acquire("us-east-1", 10)),
            Outcome::Granted(Lease { epoch: 1, .. })
        ));
    }

    /// Whatever times and epochs a command or a restored table holds, applying never
    /// panics (a panic in the state machine is replayed by every member: a group-wide crash
    /// loop), and no grant reuses an epoch.
    #[test]
    fn extreme_times_and_epochs_never_panic_and_never_reuse_an_epoch() {
        let mut t = LeaseTable::new(u64::MAX);
        let far = Command::Acquire {
            shard: 0,
            region: r("us-east-1"),
            now_ms: u64::MAX - 1,
            duration_ms: u64::MAX,
        };
        let Outcome::Granted(a) = t.apply(&far) else {
            panic!()
        };
        assert_eq!(a.expires_at_ms, u64::MAX);
        let renew = Command::Renew {
            shard: 0,
            region: r("us-east-1"),
            epoch: 1,
            now_ms: u64::MAX - 1,
            duration_ms: u64::MAX,
        };
        assert!(matches!(t.apply(&renew), Outcome::Granted(_)));
        let release = Command::Release {
            shard: 0,
            region: r("us-east-1"),
            epoch: 1,
            now_ms: u64::MAX,
        };
        assert!(matches!(t.apply(&release), Outcome::Granted(_)));

        // a table whose shard reached the last epoch grants it to nobody else
        t.shards.insert(
            0,
            Lease {
                holder: r("us-east-1"),
                epoch: u64::MAX,
                expires_at_ms: 0,
                last_ms: 0,
                wanted_by: None,
                wanted_at_ms: 0,
            },
        );
        assert!(matches!(
            t.apply(&acquire("eu-west-1", 10)),
            Outcome::Refused {
                reason: Refusal::EpochsExhausted,
                ..
            }
        ));
        let transfer = Command::Transfer {
            shard: 0,
            from: r("us-east-1"),
            to: r("eu-west-1"),
            epoch: u64::MAX,
            now_ms: u64::MAX,
        };
        assert!(matches!(
            t.apply(&transfer),
            Outcome::Refused {
                reason: Refusal::EpochsExhausted,
                ..
            }
        ));
    }

    #[test]
    fn a_shard_moves_only_after_expiry_and_every_new_grant_raises_the_epoch() {
        let mut t = LeaseTable::new(100);
        let Outcome::Granted(a) = t.apply(&acquire("us-east-1", 0)) else {
            panic!()
        };
        assert_eq!((a.epoch, a.expires_at_ms), (1, 1000));
        // in force: the other region is refused, the holder renews at the same epoch
        assert!(matches!(
            t.apply(&acquire("eu-west-1", 999)),
            Outcome::Refused {
                reason: Refusal::HeldElsewhere,
                ..
            }
        ));
        let Outcome::Granted(renewed) = t.apply(&acquire("us-east-1", 500)) else {
            panic!()
        };
        assert_eq!((renewed.epoch, renewed.expires_at_ms), (1, 1500));
        // after expiry the other region takes it with a higher epoch
        let Outcome::Granted(b) = t.apply(&acquire("eu-west-1", 1500)) else {
            panic!()
        };
        assert_eq!((b.holder.as_str(), b.epoch), ("eu-west-1", 2));
        // the old holder's delayed renewal is refused
        let late = Command::Renew {
            shard: 0,
            region: r("us-east-1"),
            epoch: 1,
            now_ms: 600,
            duration_ms: 1000,
        };
        assert!(matches!(
            t.apply(&late),
            Outcome::Refused {
                reason: Refusal::NotHolder,
                ..
            }
        ));
    }

    #[test]
    fn release_and_transfer_end_the_lease_a_clock_offset_after_the_proposal() {
        let mut t = LeaseTable::new(100);
        t.apply(&acquire("us-east-1", 0));
        let release = Command::Release {
            shard: 0,
            region: r("us-east-1"),
            epoch: 1,
            now_ms: 200,
        };
        let Outcome::Granted(released) = t.apply(&release) else {
            panic!()
        };
        assert_eq!(released.expires_at_ms, 300);
        assert!(matches!(
            t.apply(&acquire("eu-west-1", 299)),
            Outcome::Refused { .. }
        ));
        let Outcome::Granted(b) = t.apply(&acquire("eu-west-1", 300)) else {
            panic!()
        };
        assert_eq!(b.epoch, 2);
        let transfer = Command::Transfer {
            shard: 0,
            from: r("eu-west-1"),
            to: r("us-east-1"),
            epoch: 2,
            now_ms: 400,
        };
        let Outcome::Granted(moved) = t.apply(&transfer) else {
            panic!()
        };
        assert_eq!((moved.holder.as_str(), moved.epoch), ("us-east-1", 3));
        // applied twice, the transfer is stale
        assert!(matches!(t.apply(&transfer), Outcome::Refused { .. }));
    }

    #[test]
    fn shards_are_stable_and_spread() {
        assert_eq!(shard_of("surge/9q8yy", 64), shard_of("surge/9q8yy", 64));
        let used: std::collections::BTreeSet<_> = (0..1000)
            .map(|i| shard_of(&format!("surge/{i}"), 16))
            .collect();
        assert_eq!(used.len(), 16);
    }
}
