//! Simulation of the lease protocol without I/O: regions with wall clocks up to
//! `max_clock_offset` apart send acquire / renew / release / transfer commands at random
//! moments, and run rounds of the real policy (`plan::round`, us-east-1 the home); each is applied to one table (the Raft log's order) after a random delay,
//! possibly twice, and answered after another delay. Every span of real time in which a
//! region believed it held the shard is recorded and judged by `invariants::check`.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use proptest::prelude::*;

use super::holdings::Holdings;
use super::invariants::{Validity, Violation, check};
use super::plan::{self, Policy, ShardView};
use super::table::{Command, LeaseTable, Outcome};
use crate::crdt::RegionId;

const DURATION: u64 = 1_000;
const MAX_OFFSET: u64 = 100;
const REGIONS: [&str; 3] = ["us-east-1", "eu-west-1", "ap-south-1"];

#[derive(Clone, Copy, Debug)]
enum Kind {
    Acquire,
    Renew,
    Release,
    Transfer,
    /// One round of the region's lease manager.
    Round,
}

/// One region's intent: at real time `at`, send `kind`; the command reaches the log after
/// `apply_delay`, again after `duplicate` if set, and each answer takes `answer_delay`.
#[derive(Clone, Debug)]
struct Intent {
    region: usize,
    kind: Kind,
    at: u64,
    apply_delay: u64,
    answer_delay: u64,
    duplicate: Option<u64>,
}

enum Event {
    Send(Intent),
    Apply {
        region: usize,
        command: Command,
        sent: u64,
        answer_delay: u64,
    },
    Answer {
        region: usize,
        command: Command,
        outcome: Outcome,
        sent: u64,
    },
}

/// Runs the intents with per-region wall-clock offsets; returns every validity span.
fn simulate(offsets: [u64; 3], mut intents: Vec<Intent>) -> Vec<Validity> {
    let regions: Vec<RegionId> = REGIONS.iter().map(|r| RegionId::new(*r).unwrap()).collect();
    let mut table = LeaseTable::new(MAX_OFFSET);
    let mut holdings: Vec<Holdings> = regions
        .iter()
        .map(|r| Holdings::new(r.clone(), MAX_OFFSET))
        .collect();
    let mut spans: Vec<Validity> = Vec::new();
    // per region: when it last handed the shard away on purpose, until it holds it again
    let mut handed_off: Vec<Option<u64>> = vec![None; regions.len()];
    let mut queue = BinaryHeap::new();
    let mut events = Vec::new();
    intents.sort_by_key(|i| i.at);
    for intent in intents {
        events.push(Event::Send(intent.clone()));
        queue.push(Reverse((intent.at, events.len() - 1)));
    }
    while let Some(Reverse((now, id))) = queue.pop() {
        // monotonic clocks run at real time; wall clocks are offset
        match std::mem::replace(&mut events[id], Event::Send(dummy())) {
            Event::Send(intent) => {
                let region = &regions[intent.region];
                let wall = now + offsets[intent.region];
                let held = holdings[intent.region].valid(0, now);
                let known = table.get(0).cloned();
                let command = match intent.kind {
                    Kind::Acquire => Command::Acquire {
                        shard: 0,
                        region: region.clone(),
                        now_ms: wall,
                        duration_ms: DURATION,
                    },
                    // renew the epoch the region holds, or the one the table names it for
                    Kind::Renew => match (held, &known) {
                        (Some(epoch), _) => renew(region, epoch, wall),
                        (None, Some(l)) if &l.holder == region => renew(region, l.epoch, wall),
                        _ => continue,
                    },
                    Kind::Round => {
                        let policy = Policy {
                            region: region.clone(),
                            duration_ms: DURATION,
                            take_back: true,
                        };
                        let view = ShardView {
                            shard: 0,
                            home: Some(regions[0].clone()),
                            lease: known,
                            handed_off: handed_off[intent.region].is_some(),
                        };
                        let Some(command) = plan::round(&policy, [view], wall, now).pop() else {
                            continue;
                        };
                        if let Command::Transfer { .. } = command {
                            // stop writing first
                            holdings[intent.region].relinquish(0, now);
                            end_spans(&mut spans, region, now);
                        }
                        command
                    }
                    Kind::Release | Kind::Transfer => {
                        let Some(epoch) = held else { continue };
                        // stop writing first
                        holdings[intent.region].relinquish(0, now);
                        end_spans(&mut spans, region, now);
                        if let Kind::Release = intent.kind {
                            Command::Release {
                                shard: 0,
                                region: region.clone(),
                                epoch,
                                now_ms: wall,
                            }
                        } else {
                            handed_off[intent.region] = Some(now);
                            Command::Transfer {
                                shard: 0,
                                from: region.clone(),
                                to: regions[(intent.region + 1) % regions.len()].clone(),
                                epoch,
                                now_ms: wall,
                            }
                        }
                    }
                };
                let mut applies = vec![intent.apply_delay];
                applies.extend(intent.duplicate);
                for delay in applies {
                    events.push(Event::Apply {
                        region: intent.region,
                        command: command.clone(),
                        sent: now,
                        answer_delay: intent.answer_delay,
                    });
                    queue.push(Reverse((now + delay, events.len() - 1)));
                }
            }
            Event::Apply {
                region,
                command,
                sent,
                answer_delay,
            } => {
                let outcome = table.apply(&command);
                events.push(Event::Answer {
                    region,
                    command,
                    outcome,
                    sent,
                });
                queue.push(Reverse((now + answer_delay, events.len() - 1)));
            }
            Event::Answer {
                region,
                command,
                outcome,
                sent,
            } => {
                let renewal = matches!(command, Command::Acquire { .. } | Command::Renew { .. });
                if let (true, Outcome::Granted(lease)) = (renewal, outcome) {
                    if lease.holder == regions[region]
                        && handed_off[region].is_some_and(|at| sent > at)
                    {
                        handed_off[region] = None;
                    }
                    holdings[region].granted(0, &lease, sent, DURATION);
                    if let Some(h) = holdings[region].holding(0).filter(|h| now < h.valid_until) {
                        spans.push(Validity {
                            shard: 0,
                            region: regions[region].clone(),
                            epoch: h.epoch,
                            from: now,
                            until: h.valid_until,
                        });
                    }
                }
            }
        }
    }
    spans
}

fn renew(region: &RegionId, epoch: u64, wall: u64) -> Command {
    Command::Renew {
        shard: 0,
        region: region.clone(),
        epoch,
        now_ms: wall,
        duration_ms: DURATION,
    }
}

/// A region that stops writing at `now` ends its open spans there.
fn end_spans(spans: &mut [Validity], region: &RegionId, now: u64) {
    for s in spans.iter_mut().filter(|s| &s.region == region) {
        s.until = s.until.min(now);
    }
}

fn dummy() -> Intent {
    Intent {
        region: 0,
        kind: Kind::Acquire,
        at: 0,
        apply_delay: 0,
        answer_delay: 0,
        duplicate: None,
    }
}

fn intent() -> impl Strategy<Value = Intent> {
    (
        0..3usize,
        prop_oneof![
            4 => Just(Kind::Acquire),
            4 => Just(Kind::Renew),
            1 => Just(Kind::Release),
            1 => Just(Kind::Transfer),
            6 => Just(Kind::Round),
        ],
        0..20_000u64,
        0..400u64,
        0..400u64,
        proptest::option::weighted(0.2, 0..3_000u64),
    )
        .prop_map(
            |(region, kind, at, apply_delay, answer_delay, duplicate)| Intent {
                region,
                kind,
                at,
                apply_delay,
                answer_delay,
                duplicate,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1_000))]

    /// Clocks up to `max_clock_offset` apart in either direction, delayed and duplicated
    /// commands and answers: never two valid holders of a shard at one instant, never one
    /// epoch for two holders, epochs rising from holder to holder.
    #[test]
    fn never_two_valid_holders(
        offsets in [0..=MAX_OFFSET, 0..=MAX_OFFSET, 0..=MAX_OFFSET],
        intents in proptest::collection::vec(intent(), 1..120),
    ) {
        let spans = simulate(offsets, intents);
        prop_assert_eq!(check(&spans), Ok(()));
    }
}

/// The simulation and the checker can fail: with one clock three offsets ahead, the
/// ahead region takes the shard while the holder still believes it holds it.
#[test]
fn clocks_further_apart_than_the_offset_give_two_holders() {
    let at = |region, kind, at| Intent {
        region,
        kind,
        at,
        apply_delay: 0,
        answer_delay: 0,
        duplicate: None,
    };
    let spans = simulate(
        [0, 3 * MAX_OFFSET, 0],
        vec![
            at(0, Kind::Acquire, 0),
            at(1, Kind::Acquire, DURATION - 2 * MAX_OFFSET),
        ],
    );
    assert!(
        matches!(check(&spans), Err(Violation::TwoHolders(..))),
        "{spans:?}"
    );
}

/// The real policy keeps the shard with its home: regions running rounds every quarter
/// duration give us-east-1 one epoch that it holds without a gap, and nobody else a span.
#[test]
fn rounds_of_the_policy_keep_the_shard_at_its_home() {
    let mut intents = Vec::new();
    for (region, start) in [(0, 0), (1, 10), (2, 20)] {
        for round in 0..40 {
            intents.push(Intent {
                region,
                kind: Kind::Round,
                at: start + round * DURATION / 4,
                apply_delay: 5,
                answer_delay: 5,
                duplicate: None,
            });
        }
    }
    let spans = simulate([0, MAX_OFFSET, MAX_OFFSET / 2], intents);
    assert_eq!(check(&spans), Ok(()));
    assert!(spans.len() > 30, "{spans:?}");
    assert!(
        spans
            .iter()
            .all(|s| s.region.as_str() == "us-east-1" && s.epoch == 1),
        "{spans:?}"
    );
    for pair in spans.windows(2) {
        assert!(pair[1].from < pair[0].until, "a gap: {pair:?}");
    }
}

#[test]
fn the_checker_flags_a_shared_epoch_and_a_falling_epoch() {
    let v = |region: &str, epoch, from, until| Validity {
        shard: 0,
        region: RegionId::new(region).unwrap(),
        epoch,
        from,
        until,
    };
    assert!(matches!(
        check(&[v("us-east-1", 3, 0, 10), v("eu-west-1", 3, 20, 30)]),
        Err(Violation::SharedEpoch(..))
    ));
    assert!(matches!(
        check(&[v("us-east-1", 3, 0, 10), v("eu-west-1", 2, 20, 30)]),
        Err(Violation::EpochWentBack(..))
    ));
    assert_eq!(
        check(&[v("us-east-1", 3, 0, 10), v("eu-west-1", 4, 10, 30)]),
        Ok(())
    );
}
