//! A region's side of the leases: every `renew-every` it renews what it holds, takes the
//! shards whose lease has ended (its preferred home's first, any other after expiry), asks
//! for its home shards back and hands a shard home when its home asks. The answers go into
//! [`Holdings`], which owned writes consult: a write is accepted only while the holding
//! is valid on this process's monotonic clock, and carries its epoch.
//!
//! ```text
//!  tick ─► plan::round: per shard Renew (held) | Acquire (ended, or home)
//!          | Transfer (home wants it) ─► one Proposal (one Raft entry) ─► Proposer (local leader, or forwarded)
//!        ─► an Outcome per command ─► Holdings::granted
//!  Update(owned key) ─► Leases::epoch_for(key) ─► epoch | FAILED_PRECONDITION (holder)
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::clock_check::{ClockCheck, SHARE, Verdict};
use super::holdings::Holdings;
use super::network::{Channels, ProposeError, Proposer};
use super::plan::{self, Policy, ShardView};
use super::raft_store::TableView;
use super::table::{Command, Lease, Outcome, Refusal, ShardId};
use crate::clock::Clock;
use crate::config::LeaseConfig;
use crate::crdt::RegionId;
use crate::metrics as m;
use crate::shutdown::stopped;

/// Why an owned write cannot be accepted here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key:?} is owned (shard {shard}); {}", match (lapsed, holder) {
    (Some(Lapsed::Renewing), _) => "this region's lease lapsed before a renewal was granted; it is renewing it: retry".to_string(),
    (Some(Lapsed::NotRenewing), _) => "this region's lease lapsed, and it proposes no renewal while its clock is not known to be within max-clock-offset of the lease group's".to_string(),
    (None, Some(h)) => format!("its lease is held by {} at epoch {}; ask the holder region", h.holder, h.epoch),
    (None, None) => "no region holds its lease yet".to_string(),
})]
pub struct NotHolder {
    pub key: String,
    pub shard: ShardId,
    /// The holder, while its lease has not ended on this region's wall clock (never this
    /// region: see `lapsed`).
    pub holder: Option<Lease>,
    /// This region is the last holder on its table, and its own clock-safe validity ended
    /// before a renewal arrived.
    pub lapsed: Option<Lapsed>,
}

/// Whether a region whose own lease lapsed is renewing it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lapsed {
    /// Its clock is within the bound, so it keeps proposing: the refusal is transient
    /// (`UNAVAILABLE`), not a redirection to another region.
    Renewing,
    /// Its clock is off or not known: it proposes nothing (`FAILED_PRECONDITION`).
    NotRenewing,
}

/// Why a transfer was not done.
#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    #[error("shard {shard} does not exist (0..{shards})")]
    NoShard { shard: ShardId, shards: ShardId },
    #[error("{0} is not a region of the lease group")]
    NoRegion(RegionId),
    #[error("this region holds no valid lease on shard {0}")]
    NotHeld(ShardId),
    #[error("refused: {0:?}")]
    Refused(Refusal),
    #[error(transparent)]
    Propose(#[from] ProposeError),
    #[error("the lease group applied the transfer without an outcome")]
    NoOutcome,
}

/// One shard as `Admin/Leases` shows it.
#[derive(Debug, Clone)]
pub struct ShardStatus {
    pub shard: ShardId,
    pub home: Option<RegionId>,
    /// The explicit prefix of the shard, if it has one.
    pub prefix: Option<String>,
    pub lease: Option<Lease>,
    /// Milliseconds until the table's expiry, on this region's wall clock (negative: ended).
    pub expires_in_ms: i64,
    /// This region's own valid holding's epoch.
    pub held_here: Option<u64>,
}

pub struct Leases {
    config: LeaseConfig,
    region: RegionId,
    view: TableView,
    proposer: Proposer,
    holdings: Mutex<Holdings>,
    /// The origin of this process's monotonic milliseconds.
    started: Instant,
    /// Home shards this region handed away on purpose (`transfer`), with the monotonic
    /// time of the handoff and the epoch handed off: not renewed or asked back until a
    /// grant asked for after it returns one (a renewal in flight during the handoff may be
    /// applied before the transfer), or until the table gives it back to this region at a
    /// later epoch (transferred back, or renewed by another node of this region).
    handed_off: Mutex<BTreeMap<ShardId, (u64, u64)>>,
    /// Per shard held here: the epoch, and this region's wall-clock milliseconds when it
    /// learnt it holds that epoch (after the grant, so after every earlier holder's lease
    /// had ended).
    began: Mutex<BTreeMap<ShardId, (u64, u64)>>,
    /// Per shard, the row the last answer to one of this node's commands returned: rounds
    /// plan from it where it is newer than this member's copy of the table
    /// ([`plan::fresher`]).
    answered: Mutex<BTreeMap<ShardId, Lease>>,
    /// The other members' clocks as read from here.
    clock: ClockCheck,
    /// This region's wall clock.
    wall: Arc<dyn Clock>,
    /// How long after its sending a round's answer can still extend a holding
    /// (`duration − max-clock-offset`).
    useful_for: Duration,
}

/// Milliseconds as a signed number (a time from the table can be anything).
fn signed_ms(ms: u64) -> i64 {
    i64::try_from(ms).unwrap_or(i64::MAX)
}

impl Leases {
    pub fn new(
        config: LeaseConfig,
        region: RegionId,
        max_clock_offset: Duration,
        view: TableView,
        proposer: Proposer,
        channels: Channels,
        wall: Arc<dyn Clock>,
    ) -> Self {
        let peers = config
            .members
            .iter()
            .filter(|(id, _)| **id != config.raft_id())
            .map(|(id, m)| (*id, m.addr.clone()))
            .collect();
        Self {
            clock: ClockCheck::new(peers, max_clock_offset, wall.clone(), channels),
            wall,
            holdings: Mutex::new(Holdings::new(
                region.clone(),
                max_clock_offset.as_millis() as u64,
            )),
            useful_for: config.duration.saturating_sub(max_clock_offset),
            config,
            region,
            view,
            proposer,
            started: Instant::now(),
            handed_off: Mutex::default(),
            began: Mutex::default(),
            answered: Mutex::default(),
        }
    }

    /// When (wall-clock milliseconds here) this region learnt it holds `shard` at `epoch`.
    pub fn holding_since(&self, shard: ShardId, epoch: u64) -> Option<u64> {
        let began = self.began.lock().unwrap_or_else(|p| p.into_inner());
        began
            .get(&shard)
            .filter(|(e, _)| *e == epoch)
            .map(|(_, at)| *at)
    }

    pub fn config(&self) -> &LeaseConfig {
        &self.config
    }

    fn wall_ms(&self) -> u64 {
        self.wall.now_nanos() / 1_000_000
    }

    fn mono_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    fn holdings(&self) -> std::sync::MutexGuard<'_, Holdings> {
        self.holdings.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The shard of an owned key and the epoch to stamp its write with, if this region
    /// holds a valid lease on it now.
    pub fn epoch_for(&self, key: &str) -> Result<(ShardId, u64), NotHolder> {
        let shard = self.config.shard_of_key(key);
        match self.holdings().valid(shard, self.mono_ms()) {
            Some(epoch) => Ok((shard, epoch)),
            None => {
                let lease = self.view.lease(shard);
                let lapsed = lease
                    .as_ref()
                    .filter(|l| l.holder == self.region)
                    .map(|_| match self.clock.verdict() {
                        Verdict::Within => Lapsed::Renewing,
                        Verdict::Unknown | Verdict::Off(_) => Lapsed::NotRenewing,
                    });
                Err(NotHolder {
                    key: key.to_owned(),
                    shard,
                    holder: lease
                        .filter(|l| l.holder != self.region && l.expires_at_ms > self.wall_ms()),
                    lapsed,
                })
            }
        }
    }

    /// Every shard, for `Admin/Leases`.
    /// The group's regions as its applied log has them, sorted: a region added or removed
    /// at runtime counts from the membership entry on.
    pub fn regions(&self) -> Vec<RegionId> {
        self.view.regions().into_keys().collect()
    }

    /// The gRPC API entry addresses of `region`: as its member joined the group with them,
    /// else as configured.
    pub fn api_of(&self, region: &RegionId) -> Vec<String> {
        match self.view.regions().remove(region) {
            Some(joined) if !joined.api.is_empty() => joined.api,
            _ => self.config.api_of(region).to_vec(),
        }
    }

    pub fn status(&self) -> Vec<ShardStatus> {
        let now = self.mono_ms();
        let regions = self.regions();
        let holdings = self.holdings();
        self.config
            .all_shards()
            .map(|shard| {
                let (lease, held_here) = (self.view.lease(shard), holdings.valid(shard, now));
                self.shard_status(shard, &regions, lease, held_here)
            })
            .collect()
    }

    fn shard_status(
        &self,
        shard: ShardId,
        regions: &[RegionId],
        lease: Option<Lease>,
        held_here: Option<u64>,
    ) -> ShardStatus {
        ShardStatus {
            shard,
            home: self.config.home_among(shard, regions),
            prefix: shard
                .checked_sub(self.config.shards)
                .and_then(|i| self.config.homes.get(i as usize))
                .map(|(p, _)| p.clone()),
            expires_in_ms: lease.as_ref().map_or(0, |l| {
                signed_ms(l.expires_at_ms) - signed_ms(self.wall_ms())
            }),
            lease,
            held_here,
        }
    }

    /// Keeps this region's leases until `stop`, while this region's clock is within the
    /// bound of the other members' (`clock_check`).
    ///
    /// A round starts every `renew-every`, whether or not the ones before it were
    /// answered: an answer counts from its request's sending, so a round answered late
    /// still extends the holdings, and rounds in flight together keep them valid while
    /// proposals take up to `duration − max-clock-offset − renew-every` (waiting for one
    /// round before sending the next lapsed them at half that). A round is given up once
    /// its answer could extend nothing; one that failed is followed as soon as the
    /// member knows another leader, not a whole `renew-every` later (a leader that died
    /// takes an election; the lease must not lapse waiting on the timer too).
    ///
    /// While `kafka` says this region's Kafka is unreachable (`log::reach`), the region
    /// cannot write: it stops writing owned keys, releases every lease it holds once (the
    /// rounds in flight given up first), and proposes nothing until Kafka answers again,
    /// so the other regions take its shards a clock offset later instead of never.
    pub async fn run(
        self: Arc<Self>,
        mut stop: watch::Receiver<bool>,
        mut kafka: watch::Receiver<bool>,
    ) {
        self.clock.probe().await;
        let probing = {
            let (me, mut stop) = (self.clone(), stop.clone());
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        () = stopped(&mut stop) => break,
                        () = tokio::time::sleep(me.config.renew_every) => {}
                    }
                    me.clock.probe().await;
                }
            })
        };
        let first_round = Instant::now();
        let mut off = false;
        let mut cut_off = false;
        let mut rounds = tokio::task::JoinSet::new();
        // releases while cut off from Kafka: never given up with the rounds
        let mut releases = tokio::task::JoinSet::new();
        // the leader known when a round's proposal failed
        let mut failed_under: Option<Option<u64>> = None;
        'rounds: loop {
            let next = tokio::time::Instant::now() + self.config.renew_every;
            let reachable = *kafka.borrow_and_update();
            cut_off = self.follow_kafka(reachable, cut_off, &mut rounds, &mut releases);
            match self.clock.verdict() {
                _ if cut_off => {}
                Verdict::Within => {
                    if off {
                        tracing::info!(
                            "this region's clock is within the bound again; proposing lease commands"
                        );
                        metrics::gauge!(m::CLOCK_OFF).set(0.0);
                        off = false;
                    }
                    let (me, leader) = (self.clone(), self.leader());
                    rounds.spawn(async move {
                        let failed = me.round(first_round.elapsed()).await.is_err();
                        failed.then_some(leader)
                    });
                }
                // no other member's clock read yet (or none reachable): not known safe
                Verdict::Unknown => {}
                Verdict::Off(offsets) => {
                    if !off {
                        tracing::error!(
                            ?offsets,
                            "this region's clock is off from most lease group members by more than {:.0} % of max-clock-offset: it stops writing owned keys and proposes no lease command until it is back within",
                            SHARE * 100.0
                        );
                        metrics::gauge!(m::CLOCK_OFF).set(1.0);
                        off = true;
                    }
                    self.relinquish_all();
                }
            }
            let held = self
                .config
                .all_shards()
                .filter(|&s| self.holdings().valid(s, self.mono_ms()).is_some())
                .count();
            metrics::gauge!(m::LEASES_HELD).set(held as f64);
            loop {
                tokio::select! {
                    () = stopped(&mut stop) => break 'rounds,
                    () = tokio::time::sleep_until(next) => break,
                    Some(done) = rounds.join_next(), if !rounds.is_empty() => {
                        if let Ok(Some(leader)) = done {
                            failed_under = Some(leader);
                        }
                    }
                    () = self.another_leader(failed_under.flatten()), if failed_under.is_some() => {
                        failed_under = None;
                        break;
                    }
                    // the lease group's leader is handing the lead over
                    () = self.proposer.handover().renewal_asked() => break,
                    Ok(()) = kafka.changed() => break,
                }
            }
        }
        rounds.abort_all();
        probing.abort();
        // a release on its way ends first (each is bounded by `duration`)
        while releases.join_next().await.is_some() {}
        self.release_all().await;
    }

    /// Answers whether this region is cut off from its Kafka now (`reachable` false), having
    /// been so before if `was`. While it is: the first time, gives up the rounds in flight;
    /// every time, releases what it holds (a round answered as it was given up may have
    /// made it a holder again). The releases run on their own, never given up with the
    /// rounds.
    fn follow_kafka(
        self: &Arc<Self>,
        reachable: bool,
        was: bool,
        rounds: &mut tokio::task::JoinSet<Option<Option<u64>>>,
        releases: &mut tokio::task::JoinSet<()>,
    ) -> bool {
        if !reachable {
            if !was {
                rounds.abort_all();
            }
            while releases.try_join_next().is_some() {}
            let me = self.clone();
            releases.spawn(async move { me.release_all().await });
        } else if was {
            tracing::info!(
                "this region can write again (its Kafka answers, this node owns its partitions): proposing lease commands"
            );
        }
        !reachable
    }

    /// Stops writing every shard held here (nothing is proposed for them).
    fn relinquish_all(&self) {
        let now = self.mono_ms();
        let mut holdings = self.holdings();
        for shard in self.config.all_shards() {
            if holdings.holding(shard).is_some() {
                holdings.relinquish(shard, now);
            }
        }
    }

    /// On shutdown, or while this region's Kafka is unreachable: stops writing every shard
    /// held here, then releases them in one entry, so other regions take them a clock
    /// offset later instead of at expiry (nothing is proposed if none is held).
    async fn release_all(&self) {
        let now = self.mono_ms();
        let releases: Vec<Command> = {
            let mut holdings = self.holdings();
            self.config
                .all_shards()
                .filter_map(|shard| {
                    let epoch = holdings.valid(shard, now)?;
                    holdings.relinquish(shard, now);
                    Some(Command::Release {
                        shard,
                        region: self.region.clone(),
                        epoch,
                        now_ms: self.wall_ms(),
                    })
                })
                .collect()
        };
        if releases.is_empty() {
            return;
        }
        let count = releases.len();
        match tokio::time::timeout(self.config.duration, self.proposer.propose(releases)).await {
            Ok(Ok(outcomes)) => {
                // refused while the region has other nodes (`SeveralNodes`): those shards
                // move at expiry
                let refused: Vec<Refusal> = outcomes
                    .iter()
                    .filter_map(|o| match o {
                        Outcome::Refused { reason, .. } => Some(*reason),
                        _ => None,
                    })
                    .collect();
                tracing::info!(
                    shards = count,
                    released = count - refused.len(),
                    ?refused,
                    "released the leases held here"
                );
            }
            Ok(Err(e)) => tracing::warn!(error = %e, "releasing leases failed; they end at expiry"),
            Err(_) => tracing::warn!("releasing leases timed out; they end at expiry"),
        }
    }

    /// Returns once the lease group has a leader other than `stale`.
    async fn another_leader(&self, stale: Option<u64>) {
        let mut metrics = self.proposer.raft().metrics();
        let another = metrics.wait_for(|m| m.current_leader.is_some() && m.current_leader != stale);
        if another.await.is_err() {
            // the member stopped: only the timer or the stop signal ends the wait
            std::future::pending::<()>().await;
        }
    }

    /// One round: the commands `plan::round` decides, all in one log entry. A shard
    /// handed home stops being written here before its transfer is proposed. An error
    /// when the round's proposal got no answer.
    async fn round(&self, running_for: Duration) -> Result<(), ProposeError> {
        // sent from the round's start: a transfer that relinquishes a shard after the
        // round read the table makes the round's answer for it count for nothing
        let sent = self.mono_ms();
        let duration_ms = self.config.duration.as_millis() as u64;
        let policy = Policy {
            region: self.region.clone(),
            duration_ms,
            take_back: self.config.take_back,
        };
        let commands = {
            let handed_off = self.handed_off.lock().unwrap_or_else(|p| p.into_inner());
            let answered = self.answered.lock().unwrap_or_else(|p| p.into_inner());
            let regions = self.regions();
            let shards = self.config.all_shards().map(|shard| {
                let lease = plan::fresher(self.view.lease(shard), answered.get(&shard).cloned());
                let back = |epoch| {
                    lease
                        .as_ref()
                        .is_some_and(|l| l.holder == self.region && l.epoch > epoch)
                };
                ShardView {
                    shard,
                    home: self.config.home_among(shard, &regions),
                    handed_off: handed_off.get(&shard).is_some_and(|&(_, e)| !back(e)),
                    lease,
                }
            });
            let running_for_ms = running_for.as_millis() as u64;
            plan::round(&policy, shards, self.wall_ms(), running_for_ms)
        };
        for command in &commands {
            if let Command::Transfer {
                shard, to, epoch, ..
            } = command
            {
                self.holdings().relinquish(*shard, self.mono_ms());
                tracing::info!(shard, to = %to, epoch, "handing a shard back to its home region");
            }
        }
        if commands.is_empty() {
            return Ok(());
        }
        self.propose(commands, sent, duration_ms).await
    }

    /// Proposes one round's commands (planned at `sent`) as one log entry and records the
    /// answers in the holdings; gives up once an answer could extend nothing.
    async fn propose(
        &self,
        commands: Vec<Command>,
        sent: u64,
        duration_ms: u64,
    ) -> Result<(), ProposeError> {
        let shards: Vec<ShardId> = commands.iter().map(Command::shard).collect();
        let asked = Instant::now();
        metrics::counter!(m::LEASE_ENTRIES).increment(1);
        let proposed = self.proposer.propose(commands);
        let answer = tokio::time::timeout(self.useful_for, proposed)
            .await
            .unwrap_or(Err(ProposeError::TimedOut(self.useful_for)));
        match answer {
            Ok(outcomes) => {
                metrics::histogram!(m::LEASE_RENEW_SECONDS).record(asked.elapsed().as_secs_f64());
                for (shard, outcome) in shards.into_iter().zip(&outcomes) {
                    self.record(shard, outcome, sent, duration_ms);
                }
                Ok(())
            }
            Err(e) => {
                metrics::counter!(m::LEASE_PROPOSALS, "outcome" => "failed")
                    .increment(shards.len() as u64);
                tracing::debug!(error = %e, "lease proposal failed");
                Err(e)
            }
        }
    }

    /// Records one command's outcome (asked at `sent`) in the holdings.
    fn record(&self, shard: ShardId, outcome: &Outcome, sent: u64, duration_ms: u64) {
        if let Outcome::Granted(row)
        | Outcome::Refused {
            current: Some(row), ..
        } = outcome
        {
            let mut answered = self.answered.lock().unwrap_or_else(|p| p.into_inner());
            answered.insert(shard, row.clone());
        }
        let lease = match outcome {
            Outcome::Granted(lease) => {
                metrics::counter!(m::LEASE_PROPOSALS, "outcome" => "granted").increment(1);
                lease
            }
            Outcome::Refused { current, .. } => {
                metrics::counter!(m::LEASE_PROPOSALS, "outcome" => "refused").increment(1);
                // a refusal renews nothing (another node of this region may have renewed,
                // on a clock of its own): it only tells of another region's lease
                match current {
                    Some(current) if current.holder != self.region => current,
                    _ => return,
                }
            }
            // not an answer to a lease command
            Outcome::Current(_) => return,
        };
        if lease.holder == self.region {
            let mut handed_off = self.handed_off.lock().unwrap_or_else(|p| p.into_inner());
            if handed_off.get(&shard).is_some_and(|&(at, _)| sent > at) {
                handed_off.remove(&shard);
            }
        }
        let mut holdings = self.holdings();
        let before = holdings.holding(shard).map(|h| h.epoch);
        holdings.granted(shard, lease, sent, duration_ms);
        let after = holdings.holding(shard).map(|h| h.epoch);
        drop(holdings);
        if let Some(epoch) = after {
            let mut began = self.began.lock().unwrap_or_else(|p| p.into_inner());
            if began.get(&shard).is_none_or(|(e, _)| *e != epoch) {
                began.insert(shard, (epoch, self.wall_ms()));
            }
        }
        if before != after {
            tracing::info!(shard, epoch = ?after, holder = %lease.holder, "lease changed");
        }
    }

    /// Planned handoff: stops writing `shard` here, then transfers it to `to`, which
    /// renews it (and starts writing) on its next round. A home region does not ask for a
    /// shard it handed off back until it has held it again (or restarted). A refused
    /// transfer moved nothing: the shard is renewed here again from the next round.
    pub async fn transfer(
        &self,
        shard: ShardId,
        to: RegionId,
    ) -> Result<ShardStatus, TransferError> {
        let shards = self.config.all_shards().end;
        if shard >= shards {
            return Err(TransferError::NoShard { shard, shards });
        }
        if !self.regions().contains(&to) {
            return Err(TransferError::NoRegion(to));
        }
        let now = self.mono_ms();
        let epoch = {
            // marked handed off as it is relinquished: a round planned from here on does
            // not renew it, one planned before counts as sent before the relinquish
            let mut handed_off = self.handed_off.lock().unwrap_or_else(|p| p.into_inner());
            let mut holdings = self.holdings();
            let epoch = holdings
                .valid(shard, now)
                .ok_or(TransferError::NotHeld(shard))?;
            holdings.relinquish(shard, now);
            handed_off.insert(shard, (now, epoch));
            epoch
        };
        let outcomes = self
            .proposer
            .propose(vec![Command::Transfer {
                shard,
                from: self.region.clone(),
                to,
                epoch,
                now_ms: self.wall_ms(),
            }])
            .await?;
        match outcomes
            .into_iter()
            .next()
            .ok_or(TransferError::NoOutcome)?
        {
            // the leader's outcome: this member's own table may apply it a moment later
            Outcome::Granted(lease) => {
                Ok(self.shard_status(shard, &self.regions(), Some(lease), None))
            }
            Outcome::Refused { reason, .. } => {
                // nothing moved: the shard is renewed again from the next round (left
                // handed off, it would never be renewed here while another node of this
                // region keeps the region's lease alive)
                let mut handed_off = self.handed_off.lock().unwrap_or_else(|p| p.into_inner());
                if handed_off.get(&shard) == Some(&(now, epoch)) {
                    handed_off.remove(&shard);
                }
                Err(TransferError::Refused(reason))
            }
            Outcome::Current(_) => Err(TransferError::NoOutcome),
        }
    }

    /// An epoch of `shard` the lease group has granted, as far as this region knows now:
    /// the highest of its own holdings' (granted to it; the member's table may apply the
    /// grant a moment later) and of the table as this member applied it. Every lower
    /// epoch was granted too.
    pub fn known_epoch(&self, shard: ShardId) -> u64 {
        let held = self.holdings().holding(shard).map_or(0, |h| h.epoch);
        let table = self.view.lease(shard).map_or(0, |l| l.epoch);
        held.max(table)
    }

    /// The epoch of `shard` in the lease group's table now, read through the Raft log: it
    /// includes every grant made before the call (0: never granted).
    pub async fn read_epoch(&self, shard: ShardId) -> Result<u64, ProposeError> {
        let outcomes = self.proposer.propose(vec![Command::Read { shard }]).await?;
        match outcomes.into_iter().next() {
            Some(Outcome::Current(lease)) => Ok(lease.map_or(0, |l| l.epoch)),
            other => Err(ProposeError::Raft(format!(
                "a read of shard {shard} answered {other:?}"
            ))),
        }
    }

    /// The lease group's leader, as this region's member knows it.
    pub fn leader(&self) -> Option<u64> {
        self.proposer.raft().metrics().borrow().current_leader
    }

    /// This member's fresh readings of the other members' clocks: member id → reading.
    pub fn clock_readings(&self) -> BTreeMap<u64, super::clock_check::Reading> {
        self.clock.fresh()
    }

    /// The lease group's term as this region's member knows it.
    pub fn term(&self) -> u64 {
        self.proposer.raft().metrics().borrow().current_term
    }
}
