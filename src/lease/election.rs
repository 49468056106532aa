//! Pre-vote for the lease group, which openraft 0.9 lacks.
//!
//! openraft's own elections are off for a voter. A voter that has not heard from a leader
//! for an election timeout (openraft's own: the leader lease plus a random
//! `election-timeout` to twice that) first asks the other voters (`PreVote`) whether they
//! would vote for it, and starts an election only when a majority would. A voter would
//! when it has not heard from a leader for a leader lease (`election-timeout` × 2, the
//! time openraft itself refuses votes after a leader's message) and the candidate's log is
//! as up to date as its own. So a member that was frozen, cut off or starved comes back
//! without a higher term: it no longer deposes a leader the others still follow
//! (openraft's leader steps down on any higher term).
//!
//! A leader whose links turn slower than a heartbeat keeps leading: its calls may take up
//! to `runtime::RPC_TIMEOUT_FLOOR`, so the others still hear it and it still commits. One
//! whose calls take longer than that is replaced: each call runs out of time and remakes
//! its connection (`network::Peer`), the others stop hearing from it and elect. A slow
//! leader that still commits hands the lead over itself (`placement.rs`).

use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use openraft::{LogId, Raft, ServerState};
use serde::{Deserialize, Serialize};
use tonic::Request;

use super::network::Channels;
use super::raft_store::LeaseRaft;
use crate::metrics as m;
use crate::pb;
use crate::pb::lease_raft_client::LeaseRaftClient;

/// How often a voter looks at its timers.
const TICK: Duration = Duration::from_millis(20);

/// What a candidate asks in `PreVote`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PreVote {
    /// The candidate's last log id (term, then index: Raft's "at least as up to date").
    pub last_log: Option<LogId<u64>>,
}

/// One member's election state, shared by its Raft service (which notes each leader's
/// message and answers `PreVote`) and its election task.
#[derive(Clone)]
pub struct Election(Arc<Inner>);

struct Inner {
    origin: Instant,
    /// When a leader's message was last accepted, ms since `origin`.
    heard_ms: AtomicU64,
    /// When this member last said it would vote for another, ms since `origin`: it then
    /// waits a whole election timeout before it stands itself, so that two members that
    /// lost their leader at once do not split the vote.
    granted_ms: AtomicU64,
    /// The configured `election-timeout` (openraft draws between it and twice it).
    timeout_min: Duration,
}

impl Election {
    /// `election_timeout`: the configured minimum (openraft draws between it and twice it).
    pub fn new(election_timeout: Duration) -> Self {
        Self(Arc::new(Inner {
            origin: Instant::now(),
            heard_ms: AtomicU64::new(0),
            granted_ms: AtomicU64::new(0),
            timeout_min: election_timeout,
        }))
    }

    /// openraft's leader lease: `election_timeout_max`, twice the setting.
    fn lease(&self) -> Duration {
        2 * self.0.timeout_min
    }

    fn now_ms(&self) -> u64 {
        self.0.origin.elapsed().as_millis() as u64
    }

    /// A message from a leader at this member's vote or a later one arrived.
    pub fn heard(&self) {
        self.0.heard_ms.fetch_max(self.now_ms(), Ordering::Relaxed);
    }

    fn since_heard(&self) -> Duration {
        // (heard may move past the now read first)
        let heard = self.0.heard_ms.load(Ordering::Relaxed);
        Duration::from_millis(self.now_ms().saturating_sub(heard))
    }

    /// The answer to a `PreVote`: yes only from a member that is no leader, has not heard
    /// from one for a leader lease, and whose log is not more up to date than the
    /// candidate's (the last entry's term, then its index).
    pub fn would_vote(&self, raft: &Raft<LeaseRaft>, ask: &PreVote) -> bool {
        let leads = raft.metrics().borrow().state == ServerState::Leader;
        let last_log = raft.data_metrics().borrow().last_log;
        let yes = !leads && self.since_heard() >= self.lease() && ask.last_log >= last_log;
        if yes {
            self.0
                .granted_ms
                .fetch_max(self.now_ms(), Ordering::Relaxed);
        }
        yes
    }

    /// A random election timeout after a leader was heard: the lease plus the minimum
    /// to twice it.
    fn draw_timeout(&self) -> Duration {
        let spread = self.0.timeout_min.as_millis() as u64;
        let random = std::collections::hash_map::RandomState::new().hash_one(self.now_ms());
        self.lease() + self.0.timeout_min + Duration::from_millis(random % spread.max(1))
    }

    /// Runs the voter's elections (openraft's own are turned off here) until the task is
    /// dropped.
    pub async fn run(self, raft: Raft<LeaseRaft>, channels: Channels) {
        raft.runtime_config().elect(false);
        let mut timeout = self.draw_timeout();
        let mut tried_ms = 0;
        loop {
            tokio::time::sleep(TICK).await;
            let now = self.now_ms();
            let granted = self.0.granted_ms.load(Ordering::Relaxed);
            let waited = self.since_heard().min(Duration::from_millis(
                now.saturating_sub(tried_ms.max(granted)),
            ));
            if waited < timeout {
                continue;
            }
            // the other voters' addresses, unless this member leads or does not vote
            let (term, others) = {
                let receiver = raft.metrics();
                let metrics = receiver.borrow();
                let membership = metrics.membership_config.membership();
                if metrics.state == ServerState::Leader
                    || !membership.voter_ids().any(|v| v == metrics.id)
                {
                    continue;
                }
                let others: Vec<String> = membership
                    .voter_ids()
                    .filter(|&id| id != metrics.id)
                    .filter_map(|id| Some(membership.get_node(&id)?.addr.clone()))
                    .collect();
                (metrics.current_term, others)
            };
            tried_ms = now;
            timeout = self.draw_timeout();
            let ask = PreVote {
                last_log: raft.data_metrics().borrow().last_log,
            };
            let voters = others.len() + 1;
            let yes = 1 + self.ask_all(&channels, &others, &ask).await;
            let won = 2 * yes > voters;
            let outcome = if won { "won" } else { "lost" };
            metrics::counter!(m::LEASE_PRE_VOTES, "outcome" => outcome).increment(1);
            tracing::info!(
                term,
                yes,
                voters,
                outcome,
                "no leader heard from: asked the other voters whether they would vote for this member (won: it stands for election)"
            );
            if won && let Err(e) = raft.trigger().elect().await {
                tracing::warn!(error = %e, "starting an election");
            }
        }
    }

    /// Asks `others` at once; counts the yeses that came within a leader lease.
    async fn ask_all(&self, channels: &Channels, others: &[String], ask: &PreVote) -> usize {
        let Ok(json) = serde_json::to_vec(ask) else {
            return 0;
        };
        let asks = others.iter().map(|addr| {
            let json = json.clone();
            async move {
                let mut client = LeaseRaftClient::new(channels.get(addr).ok()?);
                let mut request = Request::new(pb::RaftMessage { json });
                request.set_timeout(self.lease());
                let reply = client.pre_vote(request).await.ok()?.into_inner();
                serde_json::from_slice::<bool>(&reply.json).ok()
            }
        });
        futures_util::future::join_all(asks)
            .await
            .into_iter()
            .filter(|yes| *yes == Some(true))
            .count()
    }
}
