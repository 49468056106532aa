//! PURE: a region's lease round policy. Given what the region knows of each shard (its
//! home, the table's row, whether the region handed it off on purpose), its wall clock and
//! how long its lease manager has run, [`round`] decides the commands of one round. It
//! reads no clock and changes nothing; the manager ([`super::manager`]) carries them out.
//!
//! ```text
//!  per shard:  held here ──► Transfer (its home asked, within two durations) | Renew
//!              held elsewhere, in force ──► Acquire if this is its home and take-back is on
//!                                           (and it was not handed off on purpose)
//!              held, ended ──► Acquire
//!              never granted ──► Acquire by its home; by any region after two durations
//! ```
//!
//! A `Transfer` in the plan means: stop writing the shard first, then propose it.

use super::table::{Command, Lease, ShardId};
use crate::crdt::RegionId;

/// The region's standing rules.
#[derive(Clone, Debug)]
pub struct Policy {
    pub region: RegionId,
    pub duration_ms: u64,
    /// A preferred home region takes its shards back once it is up again.
    pub take_back: bool,
}

/// One shard as this region sees it at the start of a round.
#[derive(Clone, Debug)]
pub struct ShardView {
    pub shard: ShardId,
    pub home: Option<RegionId>,
    /// The shard's row as this node knows it ([`fresher`]).
    pub lease: Option<Lease>,
    /// This region handed the shard away on purpose and has not held it since: it neither
    /// asks for it back nor renews it while the table still shows it here (the transfer
    /// may be in flight; a renewal applied before it would make this region write again).
    pub handed_off: bool,
}

/// What a region knows of a shard's row: its member's copy of the table (`view`), or the
/// row the last answer to one of its own commands returned (`answered`), whichever is
/// newer. A member's copy can lag the group's log by many seconds (a learner catching up
/// under load) while its proposals are answered from the current table: planned from the
/// copy alone, such a node would go on renewing a shard whose home asked for it back,
/// while the region's other nodes hand it over (and a renewal by any of them keeps it).
/// A later epoch is newer; within one epoch, the expiry of the later command (`last_ms`)
/// and the later ask (`wanted_at_ms`) stand.
pub fn fresher(view: Option<Lease>, answered: Option<Lease>) -> Option<Lease> {
    let (view, answered) = match (view, answered) {
        (Some(v), Some(a)) => (v, a),
        (view, answered) => return view.or(answered),
    };
    if view.epoch != answered.epoch || view.holder != answered.holder {
        return Some(if answered.epoch > view.epoch {
            answered
        } else {
            view
        });
    }
    let (mut newer, older) = if answered.last_ms > view.last_ms {
        (answered, view)
    } else {
        (view, answered)
    };
    if older.wanted_at_ms > newer.wanted_at_ms {
        (newer.wanted_by, newer.wanted_at_ms) = (older.wanted_by, older.wanted_at_ms);
    }
    Some(newer)
}

/// The commands of one round, at most one per shard, in shard order.
pub fn round(
    policy: &Policy,
    shards: impl IntoIterator<Item = ShardView>,
    now_wall_ms: u64,
    running_for_ms: u64,
) -> Vec<Command> {
    shards
        .into_iter()
        .filter_map(|view| step(policy, view, now_wall_ms, running_for_ms))
        .collect()
}

fn step(policy: &Policy, view: ShardView, now_ms: u64, running_for_ms: u64) -> Option<Command> {
    let ShardView {
        shard,
        home,
        lease,
        handed_off,
    } = view;
    let region = policy.region.clone();
    let duration_ms = policy.duration_ms;
    let two_durations = duration_ms.saturating_mul(2);
    let at_home = home.as_ref() == Some(&region);
    let acquire = Command::Acquire {
        shard,
        region: region.clone(),
        now_ms,
        duration_ms,
    };
    match lease {
        Some(l) if l.holder == region && handed_off => None,
        Some(l) if l.holder == region => {
            let home_wants_it = policy.take_back
                && !at_home
                && l.wanted_by.is_some()
                && l.wanted_by == home
                && now_ms < l.wanted_at_ms.saturating_add(two_durations);
            Some(match home {
                Some(to) if home_wants_it => Command::Transfer {
                    shard,
                    from: region,
                    to,
                    epoch: l.epoch,
                    now_ms,
                },
                _ => Command::Renew {
                    shard,
                    region,
                    epoch: l.epoch,
                    now_ms,
                    duration_ms,
                },
            })
        }
        // held elsewhere and in force: only the home asks (which records that it wants
        // it back)
        Some(l) if now_ms < l.expires_at_ms => {
            (at_home && policy.take_back && !handed_off).then_some(acquire)
        }
        Some(_) => Some(acquire),
        // never granted: its home takes it; another region only once the home has had
        // two lease durations to do so
        None => (at_home || running_for_ms >= two_durations).then_some(acquire),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DURATION: u64 = 1_000;

    fn region(name: &str) -> RegionId {
        RegionId::new(name).unwrap()
    }

    fn policy(name: &str) -> Policy {
        Policy {
            region: region(name),
            duration_ms: DURATION,
            take_back: true,
        }
    }

    fn lease(holder: &str, epoch: u64, expires_at_ms: u64) -> Lease {
        Lease {
            holder: region(holder),
            epoch,
            expires_at_ms,
            last_ms: 0,
            wanted_by: None,
            wanted_at_ms: 0,
        }
    }

    fn view(home: &str, lease: Option<Lease>) -> ShardView {
        ShardView {
            shard: 0,
            home: Some(region(home)),
            lease,
            handed_off: false,
        }
    }

    /// A learner's copy still shows the home's old lease, ended; the answer to its last
    /// command shows its own region holding a newer epoch, asked back by the home: it
    /// hands the shard over rather than take it (which the table applies as a renewal).
    #[test]
    fn a_lagging_copy_does_not_outvote_a_newer_answer() {
        let stale = lease("us-east-1", 1, 500);
        let mut held = lease("eu-west-1", 2, 3_000);
        (held.wanted_by, held.wanted_at_ms) = (Some(region("us-east-1")), 1_900);
        let now = 2_000;
        let eu = policy("eu-west-1");
        let from_copy = one(&eu, view("us-east-1", Some(stale.clone())), now, 10_000);
        assert!(matches!(from_copy, Some(Command::Acquire { .. })));
        let known = fresher(Some(stale), Some(held.clone()));
        assert_eq!(known.as_ref(), Some(&held));
        let planned = one(&eu, view("us-east-1", known), now, 10_000);
        assert!(
            matches!(planned, Some(Command::Transfer { epoch: 2, .. })),
            "{planned:?}"
        );
        // and a copy newer than the answer stands
        let moved = lease("us-east-1", 3, 5_000);
        assert_eq!(fresher(Some(moved.clone()), Some(held)), Some(moved));
    }

    /// Within one epoch: the expiry of the later command, the later ask.
    #[test]
    fn within_an_epoch_the_later_command_and_the_later_ask_stand() {
        let mut copy = lease("eu-west-1", 2, 3_000);
        copy.last_ms = 1_000;
        (copy.wanted_by, copy.wanted_at_ms) = (Some(region("us-east-1")), 1_500);
        let mut answer = lease("eu-west-1", 2, 2_200);
        answer.last_ms = 1_800; // a release after the copy's renewal
        let merged = fresher(Some(copy), Some(answer)).unwrap();
        assert_eq!((merged.expires_at_ms, merged.last_ms), (2_200, 1_800));
        assert_eq!(merged.wanted_by, Some(region("us-east-1")));
        assert_eq!(merged.wanted_at_ms, 1_500);
        assert_eq!(fresher(None, Some(merged.clone())), Some(merged));
    }

    fn one(policy: &Policy, view: ShardView, now: u64, running_for: u64) -> Option<Command> {
        let mut commands = round(policy, [view], now, running_for);
        assert!(commands.len() <= 1);
        commands.pop()
    }

    #[test]
    fn a_holder_renews_the_epoch_it_holds() {
        let us = policy("us-east-1");
        let held = lease("us-east-1", 4, 5_000);
        assert_eq!(
            one(&us, view("us-east-1", Some(held)), 4_500, 60_000),
            Some(Command::Renew {
                shard: 0,
                region: region("us-east-1"),
                epoch: 4,
                now_ms: 4_500,
                duration_ms: DURATION,
            })
        );
    }

    #[test]
    fn a_holder_hands_a_shard_back_when_its_home_asked_within_two_durations() {
        let eu = policy("eu-west-1");
        let mut held = lease("eu-west-1", 7, 5_000);
        held.wanted_by = Some(region("us-east-1"));
        held.wanted_at_ms = 4_000;
        let transfer = one(&eu, view("us-east-1", Some(held.clone())), 4_500, 60_000);
        assert_eq!(
            transfer,
            Some(Command::Transfer {
                shard: 0,
                from: region("eu-west-1"),
                to: region("us-east-1"),
                epoch: 7,
                now_ms: 4_500,
            })
        );
        // the ask is stale after two durations: renew
        let stale = one(&eu, view("us-east-1", Some(held.clone())), 6_000, 60_000);
        assert!(matches!(stale, Some(Command::Renew { epoch: 7, .. })));
        // without take-back the holder keeps it
        let keep = Policy {
            take_back: false,
            ..eu
        };
        let kept = one(&keep, view("us-east-1", Some(held)), 4_500, 60_000);
        assert!(matches!(kept, Some(Command::Renew { .. })));
    }

    #[test]
    fn an_ask_by_a_region_that_is_not_home_is_ignored() {
        let eu = policy("eu-west-1");
        let mut held = lease("eu-west-1", 7, 5_000);
        held.wanted_by = Some(region("ap-south-1"));
        held.wanted_at_ms = 4_000;
        let step = one(&eu, view("us-east-1", Some(held)), 4_500, 60_000);
        assert!(matches!(step, Some(Command::Renew { .. })));
    }

    /// A shard the operator transferred away is not renewed while the table still shows
    /// it here (the transfer in flight): a renewal applied first would let this region
    /// write again beside the new holder.
    #[test]
    fn a_shard_handed_off_is_not_renewed_while_its_transfer_is_in_flight() {
        let us = policy("us-east-1");
        let mut handed = view("us-east-1", Some(lease("us-east-1", 4, 5_000)));
        handed.handed_off = true;
        assert_eq!(one(&us, handed, 4_500, 60_000), None);
    }

    #[test]
    fn a_home_region_asks_back_a_shard_held_elsewhere_unless_it_handed_it_off() {
        let us = policy("us-east-1");
        let elsewhere = lease("eu-west-1", 7, 5_000);
        let ask = one(
            &us,
            view("us-east-1", Some(elsewhere.clone())),
            4_500,
            60_000,
        );
        assert!(matches!(ask, Some(Command::Acquire { now_ms: 4_500, .. })));
        let mut handed = view("us-east-1", Some(elsewhere.clone()));
        handed.handed_off = true;
        assert_eq!(one(&us, handed, 4_500, 60_000), None);
        let no_take_back = Policy {
            take_back: false,
            ..us
        };
        let waits = one(
            &no_take_back,
            view("us-east-1", Some(elsewhere)),
            4_500,
            60_000,
        );
        assert_eq!(waits, None);
    }

    #[test]
    fn another_region_leaves_a_lease_in_force_alone_and_takes_it_once_ended() {
        let ap = policy("ap-south-1");
        let elsewhere = lease("eu-west-1", 7, 5_000);
        let in_force = one(
            &ap,
            view("us-east-1", Some(elsewhere.clone())),
            4_999,
            60_000,
        );
        assert_eq!(in_force, None);
        let ended = one(&ap, view("us-east-1", Some(elsewhere)), 5_000, 60_000);
        assert!(matches!(ended, Some(Command::Acquire { .. })));
    }

    #[test]
    fn a_shard_never_granted_goes_to_its_home_and_to_others_after_two_durations() {
        let us = policy("us-east-1");
        let eu = policy("eu-west-1");
        let home_now = one(&us, view("us-east-1", None), 100, 0);
        assert!(matches!(home_now, Some(Command::Acquire { .. })));
        assert_eq!(
            one(&eu, view("us-east-1", None), 100, 2 * DURATION - 1),
            None
        );
        let later = one(&eu, view("us-east-1", None), 100, 2 * DURATION);
        assert!(matches!(later, Some(Command::Acquire { .. })));
    }

    #[test]
    fn a_round_covers_every_shard_that_needs_a_command_in_shard_order() {
        let us = policy("us-east-1");
        let shards = (0..4).map(|shard| ShardView {
            shard,
            home: Some(region(if shard % 2 == 0 {
                "us-east-1"
            } else {
                "eu-west-1"
            })),
            lease: None,
            handed_off: false,
        });
        let commands = round(&us, shards, 100, 0);
        let shards: Vec<ShardId> = commands.iter().map(Command::shard).collect();
        assert_eq!(shards, vec![0, 2]);
    }
}
