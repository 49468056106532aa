//! Leader placement: the lease group's leader sits where the regions' renewals commit
//! soonest.
//!
//! Every region's renewals go through the leader, which commits an entry once a majority
//! has it: a renewal from region `r` takes `r`'s round trip to the leader plus the
//! leader's round trip to the nearest majority. A leader at a site whose links turned
//! slow (a WAN link at 100 ± 50 ms a packet) still commits, so it keeps leading
//! (`runtime.rs`), but then every renewal pays for its slow links, twice for the other
//! regions, and one answered after the lease's validity extends nothing.
//!
//! So every voter measures its round trip to each other voter every half second (a
//! `LeaseRaft/Clock` call; the median of the last [`SAMPLES`]), and answers its own
//! medians in every `Clock` reply. The leader thus knows every pair, and rates each voter
//! by its worst region's renewal path ([`cost`]). When another voter's is under
//! three quarters of its own and at least [`MIN_GAIN`] shorter for [`SUSTAIN`] probes in a
//! row (not necessarily the same voter: two equally placed take turns at being the
//! best), the leader hands over as Raft's leadership transfer does: it stops sending to the
//! other voters (their `AppendEntries` fail as unreachable) while it keeps the successor's
//! log current; once their leader lease (openraft refuses votes for it after a leader's
//! message) ran out, its own region proposed a renewal and the successor holds every entry
//! of its log (entries only the old leader has are lost with the lead), it tells the
//! successor to stand (`LeaseRaft/Stand`), which wins their votes with a log at least as
//! long as theirs; the old leader's proposals then go to the successor until it knows
//! the new leader. Lease holdings and epochs are not touched:
//! the table is the same under any leader. Meanwhile entries still commit (the leader and
//! the successor are a majority of three), and the election takes a round trip between
//! voters with fast links.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use openraft::{Raft, RaftMetrics};
use tonic::Request;

use super::network::{Channels, Handover};
use super::raft_store::{GroupNode, LeaseRaft};
use crate::metrics as m;
use crate::pb;
use crate::pb::lease_raft_client::LeaseRaftClient;

/// How often a voter measures its round trips.
const PROBE: Duration = Duration::from_millis(500);
/// Round trips kept per peer; their median is the one used.
pub const SAMPLES: usize = 5;
/// Probes in a row that must find a voter better placed before the leader hands over.
pub const SUSTAIN: u32 = 3;
/// The least a handover must shorten the worst renewal path by.
pub const MIN_GAIN: Duration = Duration::from_millis(50);
/// After a handover, whether it worked or not, the leader waits this long before another.
const COOLDOWN: Duration = Duration::from_secs(30);
/// Longest a handover waits for the successor to have every entry of the leader's log:
/// two round trips on links slow enough to hand over (an entry appended while a call is
/// on the way goes with the next), with room for a retransmission.
const CATCH_UP: Duration = Duration::from_secs(2);
/// Longest a probe's answer may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// Round trips between voters: this member's own medians, and those the others answered.
#[derive(Clone, Default)]
pub struct RoundTrips(Arc<Mutex<Trips>>);

#[derive(Default)]
struct Trips {
    /// Peer → this member's last round trips to it.
    own: BTreeMap<u64, VecDeque<Duration>>,
    /// Peer → its medians to the voters it measured, and when they were answered.
    reported: BTreeMap<u64, (BTreeMap<u64, Duration>, Instant)>,
}

impl RoundTrips {
    fn lock(&self) -> std::sync::MutexGuard<'_, Trips> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// This member's median round trip to each peer it reached (what `Clock` answers).
    pub fn medians(&self) -> BTreeMap<u64, Duration> {
        self.lock()
            .own
            .iter()
            .filter_map(|(&peer, samples)| Some((peer, median(samples)?)))
            .collect()
    }

    fn sampled(&self, peer: u64, round_trip: Duration, theirs: BTreeMap<u64, Duration>) {
        let mut trips = self.lock();
        let samples = trips.own.entry(peer).or_default();
        if samples.len() == SAMPLES {
            samples.pop_front();
        }
        samples.push_back(round_trip);
        trips.reported.insert(peer, (theirs, Instant::now()));
    }

    /// A peer that did not answer: its samples go, so a dead peer is no successor.
    fn missed(&self, peer: u64) {
        let mut trips = self.lock();
        trips.own.remove(&peer);
        trips.reported.remove(&peer);
    }

    /// The round trip between `a` and `b` as known here (`me` measures its own; a pair of
    /// others is what either of them answered within the last few probes).
    fn between(&self, me: u64, a: u64, b: u64) -> Option<Duration> {
        if a == b {
            return Some(Duration::ZERO);
        }
        let trips = self.lock();
        let own = |peer| median(trips.own.get(&peer)?);
        let told = |from, to| {
            let (theirs, at) = trips.reported.get(&from)?;
            (at.elapsed() < PROBE * SAMPLES as u32)
                .then(|| theirs.get(&to).copied())
                .flatten()
        };
        match (a == me, b == me) {
            (true, _) => own(b),
            (_, true) => own(a),
            _ => told(a, b).or_else(|| told(b, a)),
        }
    }
}

fn median(samples: &VecDeque<Duration>) -> Option<Duration> {
    let mut sorted: Vec<Duration> = samples.iter().copied().collect();
    sorted.sort();
    sorted.get(sorted.len() / 2).copied()
}

/// How long the slowest region's renewal takes with `leader` leading: that region's round
/// trip to it, plus the leader's round trip to the nearest majority of `voters`. `None`
/// while a round trip it needs is unknown.
pub fn cost(
    leader: u64,
    voters: &BTreeSet<u64>,
    regions: &BTreeSet<u64>,
    rtt: impl Fn(u64, u64) -> Option<Duration>,
) -> Option<Duration> {
    let mut to_others = voters
        .iter()
        .filter(|&&v| v != leader)
        .map(|&v| rtt(leader, v))
        .collect::<Option<Vec<_>>>()?;
    to_others.sort();
    // the leader plus the (voters / 2) nearest others are a majority
    let commit = match voters.len() / 2 {
        0 => Duration::ZERO,
        k => *to_others.get(k - 1)?,
    };
    let slowest = regions
        .iter()
        .map(|&r| rtt(r, leader))
        .collect::<Option<Vec<_>>>()?
        .into_iter()
        .max()
        .unwrap_or_default();
    Some(slowest + commit)
}

/// The voter `me` (leading) should hand the lead to: the one with the least [`cost`],
/// when that is under three quarters of `me`'s and at least [`MIN_GAIN`] less.
pub fn successor(
    me: u64,
    voters: &BTreeSet<u64>,
    regions: &BTreeSet<u64>,
    rtt: impl Fn(u64, u64) -> Option<Duration>,
) -> Option<u64> {
    let mine = cost(me, voters, regions, &rtt)?;
    let (best, theirs) = voters
        .iter()
        .filter(|&&v| v != me)
        .filter_map(|&v| Some((v, cost(v, voters, regions, &rtt)?)))
        .min_by_key(|&(v, c)| (c, v))?;
    (4 * theirs < 3 * mine && mine.saturating_sub(theirs) >= MIN_GAIN).then_some(best)
}

/// One voter's placement task: measures its round trips, and while it leads hands the
/// lead to a voter better placed ([`successor`]). Runs until dropped.
pub struct Placement {
    pub me: u64,
    /// Every voter's id and Raft address.
    pub voters: BTreeMap<u64, String>,
    /// The voters of regions (whose renewals go through the leader): all but the witness.
    pub regions: BTreeSet<u64>,
    /// openraft's leader lease (twice the election timeout) and the heartbeat.
    pub leader_lease: Duration,
    pub heartbeat: Duration,
    pub trips: RoundTrips,
    pub handover: Handover,
}

impl Placement {
    pub async fn run(self, raft: Raft<LeaseRaft>, channels: Channels) {
        let ids: BTreeSet<u64> = self.voters.keys().copied().collect();
        // probes in a row that found a voter better placed (not always the same one: two
        // equally placed voters take turns at being the best)
        let mut rounds = 0;
        let mut last_handover: Option<Instant> = None;
        loop {
            tokio::time::sleep(PROBE).await;
            self.probe(&channels).await;
            let leads = raft.metrics().borrow().current_leader == Some(self.me);
            let better = leads
                .then(|| {
                    successor(self.me, &ids, &self.regions, |a, b| {
                        self.trips.between(self.me, a, b)
                    })
                })
                .flatten();
            rounds = if better.is_some() { rounds + 1 } else { 0 };
            if let Some(to) = better
                && rounds >= SUSTAIN
                && last_handover.is_none_or(|at| at.elapsed() >= COOLDOWN)
            {
                self.hand_over(&raft, &channels, to).await;
                (rounds, last_handover) = (0, Some(Instant::now()));
            }
        }
    }

    /// Measures the round trip to every other voter once.
    async fn probe(&self, channels: &Channels) {
        let calls =
            self.voters
                .iter()
                .filter(|&(&id, _)| id != self.me)
                .map(|(_, addr)| async move {
                    let mut client = LeaseRaftClient::new(channels.get(addr).ok()?);
                    let mut request = Request::new(pb::ClockReading::default());
                    request.set_timeout(PROBE_TIMEOUT);
                    let started = Instant::now();
                    let reply = client.clock(request).await.ok()?.into_inner();
                    Some((started.elapsed(), reply.round_trip_nanos))
                });
        let answers = futures_util::future::join_all(calls).await;
        let peers = self.voters.keys().filter(|&&id| id != self.me);
        for (&peer, answer) in peers.zip(answers) {
            match answer {
                Some((round_trip, theirs)) => {
                    metrics::gauge!(m::LEASE_ROUND_TRIP, "member" => peer.to_string())
                        .set(round_trip.as_secs_f64());
                    let theirs = theirs
                        .into_iter()
                        .map(|(id, nanos)| (id, Duration::from_nanos(nanos)))
                        .collect();
                    self.trips.sampled(peer, round_trip, theirs);
                }
                None => self.trips.missed(peer),
            }
        }
    }

    /// Hands the lead to `to`: stops sending to the other voters, keeps `to`'s log
    /// current, and once their leader lease ran out, this member's region proposed a
    /// renewal and `to` has every entry this leader had then, asks `to` to stand. This
    /// member's proposals go to `to` from then until it knows the new leader, starting
    /// with a renewal at once. Sending resumes when another member leads or the handover
    /// is given up.
    async fn hand_over(&self, raft: &Raft<LeaseRaft>, channels: &Channels, to: u64) {
        let others: BTreeSet<u64> = self
            .voters
            .keys()
            .copied()
            .filter(|&v| v != self.me && v != to)
            .collect();
        tracing::info!(
            successor = to,
            "another voter is better placed to lead the lease group (its slowest region's renewal path is shorter): handing the lead to it"
        );
        self.handover.quiet(others);
        tokio::time::sleep(self.leader_lease + self.heartbeat).await;
        self.fresh_renewal(raft).await;
        let outcome =
            if self.caught_up(raft, to).await && self.ask_to_stand(raft, channels, to).await {
                self.handover.standing(self.voters.get(&to).cloned());
                self.handover.renew_now();
                let mut metrics = raft.metrics();
                let moved = metrics.wait_for(|m| m.current_leader != Some(self.me));
                let outcome = match tokio::time::timeout(self.leader_lease * 2, moved).await {
                    Ok(Ok(_)) => "moved",
                    _ => "failed",
                };
                if outcome == "moved" {
                    // the new leader's first message takes a round trip on this member's links
                    let known = metrics.wait_for(|m| m.current_leader.is_some());
                    let _ = tokio::time::timeout(self.leader_lease * 4, known).await;
                }
                outcome
            } else {
                "failed"
            };
        self.handover.standing(None);
        self.handover.quiet(BTreeSet::new());
        metrics::counter!(m::LEASE_HANDOVERS, "outcome" => outcome).increment(1);
        tracing::info!(successor = to, outcome, "lease group handover");
    }

    /// Has this member's region propose a lease round now, and waits (a little) until it
    /// is in the log: the successor then gets a renewal of that region's leases that
    /// leaves them the longest to be renewed through it.
    async fn fresh_renewal(&self, raft: &Raft<LeaseRaft>) {
        let mut metrics = raft.metrics();
        let before = metrics.borrow().last_log_index;
        self.handover.renew_now();
        let appended = metrics.wait_for(|m| m.last_log_index > before);
        let _ = tokio::time::timeout(self.heartbeat * 2, appended).await;
    }

    /// Whether `to` got every entry this member's log has now within [`CATCH_UP`], and
    /// this member still leads: as etcd waits before `MsgTimeoutNow`, since the entries
    /// the successor lacks when it stands are lost with the lead (among them renewals of
    /// this member's region's leases, which would then lapse).
    async fn caught_up(&self, raft: &Raft<LeaseRaft>, to: u64) -> bool {
        let mut metrics = raft.metrics();
        let last = metrics.borrow().last_log_index;
        let matched = |m: &RaftMetrics<u64, GroupNode>| {
            m.replication.as_ref()?.get(&to)?.as_ref().map(|l| l.index)
        };
        let done = metrics.wait_for(|m| m.current_leader != Some(self.me) || matched(m) >= last);
        let done = tokio::time::timeout(CATCH_UP, done).await;
        matches!(done, Ok(Ok(_))) && raft.metrics().borrow().current_leader == Some(self.me)
    }

    async fn ask_to_stand(&self, raft: &Raft<LeaseRaft>, channels: &Channels, to: u64) -> bool {
        let Some(addr) = self.voters.get(&to) else {
            return false;
        };
        let Ok(channel) = channels.get(addr) else {
            return false;
        };
        let term = raft.metrics().borrow().current_term;
        let mut request = Request::new(pb::StandRequest {
            leader: self.me,
            term,
        });
        request.set_timeout(PROBE_TIMEOUT);
        match LeaseRaftClient::new(channel).stand(request).await {
            Ok(reply) => reply.into_inner().standing,
            Err(refused) => {
                let why = refused.message();
                tracing::warn!(successor = to, term, why, "the successor did not stand");
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// Round trips between the three members of the local cluster (1 and 2 regions, 3 the
    /// witness), symmetric.
    fn trips(pairs: [((u64, u64), u64); 3]) -> impl Fn(u64, u64) -> Option<Duration> {
        move |a, b| {
            if a == b {
                return Some(Duration::ZERO);
            }
            pairs
                .iter()
                .find(|((x, y), _)| (*x, *y) == (a, b) || (*y, *x) == (a, b))
                .map(|(_, ms)| *ms as u32 * MS)
        }
    }

    fn group() -> (BTreeSet<u64>, BTreeSet<u64>) {
        (BTreeSet::from([1, 2, 3]), BTreeSet::from([1, 2]))
    }

    #[test]
    fn a_leader_whose_links_turned_slow_hands_over_and_its_successor_keeps_the_lead() {
        let (voters, regions) = group();
        // member 1's links are 200 ms round trips, 2 and 3 are 1 ms apart
        let rtt = trips([((1, 2), 200), ((1, 3), 200), ((2, 3), 1)]);
        // led from 1, region 2's renewal crosses the slow link twice
        assert_eq!(cost(1, &voters, &regions, &rtt), Some(400 * MS));
        assert_eq!(cost(2, &voters, &regions, &rtt), Some(201 * MS));
        assert_eq!(cost(3, &voters, &regions, &rtt), Some(201 * MS));
        assert_eq!(successor(1, &voters, &regions, &rtt), Some(2));
        assert_eq!(successor(2, &voters, &regions, &rtt), None);
        assert_eq!(successor(3, &voters, &regions, &rtt), None);
    }

    #[test]
    fn evenly_far_members_keep_their_leader_and_small_gains_move_nothing() {
        let (voters, regions) = group();
        let even = trips([((1, 2), 100), ((1, 3), 100), ((2, 3), 100)]);
        for me in 1..=3 {
            assert_eq!(successor(me, &voters, &regions, &even), None, "{me}");
        }
        // a witness next to region 2 makes 2 the better leader, by a wide margin
        let near = trips([((1, 2), 80), ((1, 3), 85), ((2, 3), 10)]);
        assert_eq!(successor(1, &voters, &regions, &near), Some(2));
        assert_eq!(successor(2, &voters, &regions, &near), None);
        // a gain under MIN_GAIN moves nothing, even by more than a quarter
        let close = trips([((1, 2), 40), ((1, 3), 40), ((2, 3), 1)]);
        assert_eq!(cost(1, &voters, &regions, &close), Some(80 * MS));
        assert_eq!(successor(1, &voters, &regions, &close), None);
    }

    #[test]
    fn an_unmeasured_voter_is_no_successor_and_an_unmeasured_leader_stays() {
        let (voters, regions) = group();
        let unknown_pair = |a: u64, b: u64| match (a.min(b), a.max(b)) {
            (1, 2) | (1, 3) => Some(200 * MS),
            (x, y) if x == y => Some(Duration::ZERO),
            _ => None,
        };
        assert_eq!(successor(1, &voters, &regions, unknown_pair), None);
        let slow_but_unknown = |a: u64, b: u64| (a != 1 && b != 1).then_some(MS);
        assert_eq!(successor(1, &voters, &regions, slow_but_unknown), None);
    }

    #[test]
    fn round_trips_are_the_median_of_the_last_samples_and_a_silent_peer_is_forgotten() {
        let trips = RoundTrips::default();
        for ms in [900, 5, 6, 7, 8, 9] {
            trips.sampled(2, ms * MS, BTreeMap::from([(3, 4 * MS)]));
        }
        // the 900 ms outlier was pushed out; the median of 5..9
        assert_eq!(trips.between(1, 1, 2), Some(7 * MS));
        assert_eq!(trips.between(1, 2, 1), Some(7 * MS));
        // what 2 answered about 3, either way round
        assert_eq!(trips.between(1, 2, 3), Some(4 * MS));
        assert_eq!(trips.between(1, 3, 2), Some(4 * MS));
        assert_eq!(trips.medians(), BTreeMap::from([(2, 7 * MS)]));
        trips.missed(2);
        assert_eq!(trips.between(1, 1, 2), None);
        assert_eq!(trips.between(1, 2, 3), None);
    }
}
