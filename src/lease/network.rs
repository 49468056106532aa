//! The lease group's Raft traffic over tonic gRPC (`proto/geostate/v1/raft.proto`): a
//! client per peer for the sending side, and the `LeaseRaft` service that hands incoming
//! requests to the local `Raft`. Messages are openraft's own types as JSON; a remote Raft
//! error comes back as data. A peer that cannot be reached is reported `Unreachable`, so
//! openraft backs off instead of spinning; a call that only ran out of time is a network
//! error, retried at the next heartbeat on a new connection.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::error::{
    ClientWriteError, InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError,
    Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{ChangeMembers, Raft};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tonic::transport::Channel;
use tonic::{Code, Request, Response, Status};

use super::election::{Election, PreVote};
use super::placement::RoundTrips;
use super::raft_store::{GroupNode, LeaseRaft, Proposal, Reply, regions_of};
use super::runtime::RPC_TIMEOUT_FLOOR;
use super::table::{Command, Outcome};

use crate::clock::Clock;
use crate::config::LeaseConfig;
use crate::crdt::RegionId;
use crate::pb;
use crate::pb::lease_raft_client::LeaseRaftClient;
use crate::pb::lease_raft_server::LeaseRaftServer;
use crate::security::{Caller, Tls};

type NodeId = u64;
type RpcError<E = openraft::error::Infallible> = RPCError<NodeId, GroupNode, RaftError<NodeId, E>>;

/// Largest Raft message accepted (snapshots of a big lease table).
const MAX_MESSAGE: usize = 64 * 1024 * 1024;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// Builds a client per peer.
#[derive(Clone, Default)]
pub struct Network {
    pub handover: Handover,
    pub tls: Option<Tls>,
}

impl RaftNetworkFactory<LeaseRaft> for Network {
    type Network = Peer;

    async fn new_client(&mut self, target: NodeId, node: &GroupNode) -> Peer {
        Peer {
            target,
            addr: node.addr.clone(),
            client: None,
            handover: self.handover.clone(),
            tls: self.tls.clone(),
        }
    }
}

/// A leader's handover of the lead (`placement.rs`), as this member's network and
/// proposer see it.
#[derive(Clone, Default)]
pub struct Handover(Arc<Mutex<Handing>>, Arc<tokio::sync::Notify>);

#[derive(Default)]
struct Handing {
    /// The voters sent no log: until their leader lease runs out, they would refuse the
    /// successor their votes.
    quiet: BTreeSet<NodeId>,
    /// The address of the successor once it stands: this member's proposals go there
    /// while it still takes itself for the leader (an entry appended to its own log then
    /// is lost with the lead) or knows no leader yet.
    standing: Option<String>,
}

impl Handover {
    fn lock(&self) -> std::sync::MutexGuard<'_, Handing> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn quiet(&self, voters: BTreeSet<NodeId>) {
        self.lock().quiet = voters;
    }

    fn holds_quiet(&self, voter: NodeId) -> bool {
        self.lock().quiet.contains(&voter)
    }

    pub fn standing(&self, successor: Option<String>) {
        self.lock().standing = successor;
    }

    fn successor(&self) -> Option<String> {
        self.lock().standing.clone()
    }

    /// Asks this member's region for a lease round now (`Leases::run`), so that a
    /// renewal proposed just before the successor stands, and the first one through it,
    /// are as fresh as they can be.
    pub fn renew_now(&self) {
        self.1.notify_one();
    }

    /// Returns when a round was asked for.
    pub async fn renewal_asked(&self) {
        self.1.notified().await;
    }
}

/// The connection to one peer, made on first use and remade after a failure.
pub struct Peer {
    target: NodeId,
    addr: String,
    client: Option<LeaseRaftClient<Channel>>,
    handover: Handover,
    tls: Option<Tls>,
}

impl Peer {
    async fn client(&mut self) -> Result<LeaseRaftClient<Channel>, Unreachable> {
        if let Some(client) = &self.client {
            return Ok(client.clone());
        }
        let channel = crate::security::tls::connect(&self.addr, self.tls.as_ref(), CONNECT_TIMEOUT)
            .await
            .map_err(|e| Unreachable::new(&e))?;
        let client = LeaseRaftClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE);
        self.client = Some(client.clone());
        Ok(client)
    }

    /// How a failed call is reported; the connection is remade either way (a stopped
    /// peer that resumes then finds the calls it missed on a closed connection, instead
    /// of applying them all and calling an election at once). Only a peer that cannot be
    /// reached is `Unreachable` (openraft then sends it nothing for a backoff of 500 ms).
    /// A call that ran out of time (`CANCELLED` "Timeout expired" from the client's
    /// deadline, `DEADLINE_EXCEEDED` from the server's) reached a slow peer: a backoff
    /// longer than an election timeout would starve it of heartbeats, and its election
    /// would depose the leader, so it is a `NetworkError`, retried on the next heartbeat.
    fn failed<E: std::error::Error>(&mut self, status: Status) -> RpcError<E> {
        self.client = None;
        if matches!(status.code(), Code::Cancelled | Code::DeadlineExceeded) {
            return RPCError::Network(NetworkError::new(&status));
        }
        RPCError::Unreachable(Unreachable::new(&status))
    }

    /// Sends one request; decodes the peer's `Result<Resp, RaftError<E>>`.
    async fn call<Req, Resp, E>(
        &mut self,
        method: Method,
        request: &Req,
        option: &RPCOption,
    ) -> Result<Resp, RpcError<E>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        if !matches!(method, Method::Vote) && self.handover.holds_quiet(self.target) {
            let handing_over = std::io::Error::other("handing the lead over");
            return Err(RPCError::Unreachable(Unreachable::new(&handing_over)));
        }
        let json =
            serde_json::to_vec(request).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let mut client = self.client().await?;
        let mut message = Request::new(pb::RaftMessage { json });
        message.set_timeout(option.hard_ttl().max(RPC_TIMEOUT_FLOOR));
        let reply = match method {
            Method::AppendEntries => client.append_entries(message).await,
            Method::Vote => client.vote(message).await,
            Method::InstallSnapshot => client.install_snapshot(message).await,
        };
        let reply = match reply {
            Ok(reply) => reply.into_inner(),
            Err(status) => return Err(self.failed(status)),
        };
        let result: Result<Resp, RaftError<NodeId, E>> = serde_json::from_slice(&reply.json)
            .map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        result.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

#[derive(Clone, Copy)]
enum Method {
    AppendEntries,
    Vote,
    InstallSnapshot,
}

impl RaftNetwork<LeaseRaft> for Peer {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<LeaseRaft>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RpcError> {
        self.call(Method::AppendEntries, &rpc, &option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<LeaseRaft>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<NodeId>, RpcError<InstallSnapshotError>> {
        self.call(Method::InstallSnapshot, &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RpcError> {
        self.call(Method::Vote, &rpc, &option).await
    }
}

/// The `LeaseRaft` gRPC service of one group member.
pub struct Service {
    raft: Raft<LeaseRaft>,
    /// This member's wall clock, for the other members' clock checks.
    wall: Arc<dyn Clock>,
    /// Notes each leader's message; answers `PreVote`.
    election: Election,
    /// This member's round trips to the other voters, answered with its clock.
    trips: RoundTrips,
    /// Each member's name (its certificate's common name) by id: a caller with a
    /// certificate proposes only for its own region and sends Raft messages only as itself.
    names: BTreeMap<NodeId, String>,
    /// Each configured member's region (see [`regions_of`]).
    regions: BTreeMap<NodeId, RegionId>,
    /// Certificate names that may remove any region (`lease.operators`).
    operators: BTreeSet<String>,
}

impl Service {
    pub fn server(
        raft: Raft<LeaseRaft>,
        wall: Arc<dyn Clock>,
        election: Election,
        trips: RoundTrips,
        config: &LeaseConfig,
    ) -> LeaseRaftServer<Self> {
        let names = config.members.values();
        LeaseRaftServer::new(Self {
            raft,
            wall,
            election,
            trips,
            names: names.map(|m| (m.id, m.name().to_owned())).collect(),
            regions: config.configured_regions(),
            operators: config.operators.iter().cloned().collect(),
        })
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE)
    }
}

/// A change of the group's nodes, asked of any member: the leader applies it, another
/// member refuses (unless there is nothing to change). The answer is the answering
/// member's last log index after the change: a joining node's table is current as of its
/// join once it applied that far.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum GroupChange {
    /// Add (or re-address) learner `id` (a region's further node), served at `addr`.
    Join { id: NodeId, addr: String },
    /// Remove learner `id` (a node that stops).
    Leave { id: NodeId },
    /// Add a region: its member `id` (`node` names the region) joins as a learner, and
    /// once it holds the log it becomes a voter. From that entry on, the table takes the
    /// region's commands and counts it among the shards' homes.
    AddRegion { id: NodeId, node: GroupNode },
    /// Remove a region: its member stops voting and leaves with its further nodes. From
    /// that entry on, the table refuses the region's commands (`Impossible`): its leases
    /// lapse and the other regions take its shards at a higher epoch.
    RemoveRegion { region: RegionId },
}

impl Service {
    /// Refuses a message that names member `sender` (a learner: its region's member)
    /// from a caller whose certificate names another (a plaintext caller is not checked:
    /// plaintext listens on loopback only, or where the configuration allows it).
    fn check_sender(
        caller: &Caller,
        names: &BTreeMap<NodeId, String>,
        sender: NodeId,
    ) -> Result<(), Status> {
        let Some(name) = caller.name.as_deref() else {
            return Ok(());
        };
        let member = if sender >> 32 == 0 {
            sender
        } else {
            sender >> 32
        };
        match names.get(&member) {
            Some(own) if own == name => Ok(()),
            _ => Err(Status::permission_denied(format!(
                "{name} sent a message as member {sender}"
            ))),
        }
    }

    /// Refuses to remove `region` for a caller whose certificate names neither that
    /// region nor an operator (`lease.operators`): a region leaves by its own hand or an
    /// operator's, never another member's (a plaintext caller is not checked, as in
    /// [`Self::check_sender`]).
    fn check_remover(
        caller: &Caller,
        operators: &BTreeSet<String>,
        region: &RegionId,
    ) -> Result<(), Status> {
        match caller.name.as_deref() {
            Some(name) if name != region.as_str() && !operators.contains(name) => {
                Err(Status::permission_denied(format!(
                    "{name} may not remove {region}: only the region itself or an operator (lease.operators) may"
                )))
            }
            _ => Ok(()),
        }
    }

    /// Refuses commands for a region other than the caller's: a region's certificate
    /// acquires, renews, releases and transfers only its own leases.
    fn check_proposal(caller: &Caller, commands: &[Command]) -> Result<(), Status> {
        let Some(name) = caller.name.as_deref() else {
            return Ok(());
        };
        for command in commands {
            let region = match command {
                Command::Acquire { region, .. }
                | Command::Renew { region, .. }
                | Command::Release { region, .. } => region,
                Command::Transfer { from, .. } => from,
                Command::Read { .. } => continue,
            };
            if region.as_str() != name {
                return Err(Status::permission_denied(format!(
                    "{name} proposed a lease command for {region}"
                )));
            }
        }
        Ok(())
    }

    /// A leader's message arrived: noted as heard when its sender leads at this member's
    /// vote or a later one (openraft accepts it then), before Raft handles it, so a slow
    /// answer that the sender stopped waiting for still counts.
    fn note_leader(&self, vote: &openraft::Vote<NodeId>) {
        if vote.is_committed() && *vote >= self.raft.metrics().borrow().vote {
            self.election.heard();
        }
    }

    async fn change_group(&self, change: GroupChange) -> Result<u64, String> {
        self.apply_group_change(change).await?;
        Ok(self.raft.metrics().borrow().last_log_index.unwrap_or(0))
    }

    async fn apply_group_change(&self, change: GroupChange) -> Result<(), String> {
        let membership = self.raft.metrics().borrow().membership_config.clone();
        let membership = membership.membership();
        let changed = match change {
            GroupChange::Join { id, .. } | GroupChange::Leave { id }
                if membership.voter_ids().any(|v| v == id) =>
            {
                return Err(format!("{id} is a voting member, not a learner"));
            }
            GroupChange::Join { id, addr } => match membership.get_node(&id) {
                Some(node) if node.addr == addr => return Ok(()),
                Some(_) => {
                    let node = BTreeMap::from([(id, GroupNode::at(addr))]);
                    self.raft
                        .change_membership(ChangeMembers::SetNodes(node), true)
                        .await
                }
                None => self.raft.add_learner(id, GroupNode::at(addr), false).await,
            },
            GroupChange::Leave { id } => {
                if membership.get_node(&id).is_none() {
                    return Ok(());
                }
                let ids = BTreeSet::from([id]);
                self.raft
                    .change_membership(ChangeMembers::RemoveNodes(ids), true)
                    .await
            }
            GroupChange::AddRegion { id, node } => {
                return self.add_region(membership, id, node).await;
            }
            GroupChange::RemoveRegion { region } => {
                return self.remove_region(membership, &region).await;
            }
        };
        changed.map(|_| ()).map_err(refusal)
    }

    /// Adds region member `id` as a learner, waits until it holds the log, then makes it
    /// a voter (openraft's joint consensus). Asked again, it finishes what is left.
    async fn add_region(
        &self,
        membership: &openraft::Membership<NodeId, GroupNode>,
        id: NodeId,
        node: GroupNode,
    ) -> Result<(), String> {
        let Some(region) = node.region.clone() else {
            return Err(format!("member {id} names no region"));
        };
        if id == 0 || id >> 32 != 0 {
            return Err(format!("{id} is not a member id (1..=4294967295)"));
        }
        let regions = regions_of(membership, &self.regions);
        if let Some(other) = regions.get(&region).filter(|r| r.member != id) {
            return Err(format!(
                "{region} is in the group already, as member {}",
                other.member
            ));
        }
        if membership.voter_ids().any(|v| v == id) {
            if membership.get_node(&id) != Some(&node) {
                // restarted with other addresses: the group lists the new ones
                let nodes = ChangeMembers::SetNodes(BTreeMap::from([(id, node)]));
                self.raft
                    .change_membership(nodes, true)
                    .await
                    .map_err(refusal)?;
            }
            return Ok(());
        }
        if membership.get_node(&id) != Some(&node) {
            // blocking: answers once the learner holds the leader's log
            self.raft
                .add_learner(id, node.clone(), true)
                .await
                .map_err(refusal)?;
        }
        let voter = ChangeMembers::AddVoterIds(BTreeSet::from([id]));
        self.raft
            .change_membership(voter, false)
            .await
            .map_err(refusal)?;
        tracing::info!(member = id, %region, "a region joined the lease group");
        Ok(())
    }

    /// Removes `region`'s member from the voters, and its further nodes (learners) with it.
    async fn remove_region(
        &self,
        membership: &openraft::Membership<NodeId, GroupNode>,
        region: &RegionId,
    ) -> Result<(), String> {
        let regions = regions_of(membership, &self.regions);
        let Some(member) = regions.get(region).map(|r| r.member) else {
            return Ok(());
        };
        if regions.len() <= 1 {
            return Err(format!("{region} is the group's last region"));
        }
        let voters = ChangeMembers::RemoveVoters(BTreeSet::from([member]));
        self.raft
            .change_membership(voters, false)
            .await
            .map_err(refusal)?;
        let metrics = self.raft.metrics().borrow().membership_config.clone();
        let learners: BTreeSet<NodeId> = (metrics.membership().learner_ids())
            .filter(|&id| id == member || id >> 32 == member)
            .collect();
        if !learners.is_empty() {
            let gone = ChangeMembers::RemoveNodes(learners);
            self.raft
                .change_membership(gone, false)
                .await
                .map_err(refusal)?;
        }
        tracing::info!(member, %region, "a region left the lease group");
        Ok(())
    }
}

/// What a member answers to a group change while it knows no leader (an election is
/// under way): asking again shortly may succeed.
const NO_LEADER: &str = "no leader known now (an election is under way)";

/// A membership change's refusal, as a member answers it.
fn refusal(e: RaftError<NodeId, ClientWriteError<NodeId, GroupNode>>) -> String {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(to)) if to.leader_id.is_none() => {
            NO_LEADER.to_owned()
        }
        e => e.to_string(),
    }
}

/// [`change_group`], asked again while the members know no leader (an election, after
/// members restarted), until `within` has passed.
pub async fn change_group_within(
    channels: &Channels,
    members: &[String],
    change: &GroupChange,
    within: Duration,
) -> Result<u64, String> {
    let until = tokio::time::Instant::now() + within;
    loop {
        let left = until.saturating_duration_since(tokio::time::Instant::now());
        match change_group(channels, members, change, left.max(Duration::from_secs(1))).await {
            Err(e) if e.ends_with(NO_LEADER) && tokio::time::Instant::now() < until => {
                tracing::info!(error = %e, "asking the lease group again");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            answered => return answered,
        }
    }
}

/// Asks the members at `members` in turn to apply `change` until one (the leader) does,
/// and answers its last log index then; else the last refusal.
pub async fn change_group(
    channels: &Channels,
    members: &[String],
    change: &GroupChange,
    timeout: Duration,
) -> Result<u64, String> {
    let json = serde_json::to_vec(change).map_err(|e| e.to_string())?;
    let mut last = "no member to ask".to_string();
    for addr in members {
        let mut request = Request::new(pb::RaftMessage { json: json.clone() });
        request.set_timeout(timeout);
        let answer = match channels.get(addr) {
            Ok(channel) => LeaseRaftClient::new(channel).learner(request).await,
            Err(e) => {
                last = format!("{addr}: {e}");
                continue;
            }
        };
        let result = answer
            .map_err(|s| s.message().to_owned())
            .and_then(|reply| {
                serde_json::from_slice::<Result<u64, String>>(&reply.into_inner().json)
                    .map_err(|e| e.to_string())
            })
            .and_then(|r| r);
        match result {
            Ok(index) => return Ok(index),
            Err(e) => last = format!("{addr}: {e}"),
        }
    }
    Err(last)
}

fn decode<T: DeserializeOwned>(request: Request<pb::RaftMessage>) -> Result<T, Status> {
    serde_json::from_slice(&request.into_inner().json)
        .map_err(|e| Status::invalid_argument(format!("not an openraft message: {e}")))
}

fn encode<T: Serialize>(result: &T) -> Result<Response<pb::RaftMessage>, Status> {
    serde_json::to_vec(result)
        .map(|json| Response::new(pb::RaftMessage { json }))
        .map_err(|e| Status::internal(format!("encoding the raft reply: {e}")))
}

#[tonic::async_trait]
impl pb::lease_raft_server::LeaseRaft for Service {
    async fn append_entries(
        &self,
        request: Request<pb::RaftMessage>,
    ) -> Result<Response<pb::RaftMessage>, Status> {
        let caller = Caller::of(&request);
        let request: AppendEntriesRequest<LeaseRaft> = decode(request)?;
        let sender = request.vote.leader_id().voted_for().unwrap_or_default();
        Self::check_sender(&caller, &self.names, sender)?;
        self.note_leader(&request.vote);
        encode(&self.raft.append_entries(request).await)
    }

    async fn vote(
        &self,
        request: Request<pb::RaftMessage>,
    ) -> Result<Response<pb::RaftMessage>, Status> {
        let caller = Caller::of(&request);
        let request: VoteRequest<NodeId> = decode(request)?;
        let sender = request.vote.leader_id().voted_for().unwrap_or_default();
        Self::check_sender(&caller, &self.names, sender)?;
        encode(&self.raft.vote(request).await)
    }

    async fn install_snapshot(
        &self,
        request: Request<pb::RaftMessage>,
    ) -> Result<Response<pb::RaftMessage>, Status> {
        let caller = Caller::of(&request);
        let request: InstallSnapshotRequest<LeaseRaft> = decode(request)?;
        let sender = request.vote.leader_id().voted_for().unwrap_or_default();
        Self::check_sender(&caller, &self.names, sender)?;
        self.note_leader(&request.vote);
        encode(&self.raft.install_snapshot(request).await)
    }

    async fn pre_vote(
        &self,
        request: Request<pb::RaftMessage>,
    ) -> Result<Response<pb::RaftMessage>, Status> {
        let ask: PreVote = decode(request)?;
        encode(&self.election.would_vote(&self.raft, &ask))
    }

    async fn clock(
        &self,
        _request: Request<pb::ClockReading>,
    ) -> Result<Response<pb::ClockReading>, Status> {
        let round_trip_nanos = self.trips.medians().into_iter();
        Ok(Response::new(pb::ClockReading {
            wall_nanos: self.wall.now_nanos(),
            round_trip_nanos: round_trip_nanos
                .map(|(id, rtt)| (id, rtt.as_nanos() as u64))
                .collect(),
        }))
    }

    /// Only the leader this member follows, at its term, may ask it to stand: an election
    /// started at any member's word would skip pre-vote and depose a healthy leader.
    async fn stand(
        &self,
        request: Request<pb::StandRequest>,
    ) -> Result<Response<pb::StandReply>, Status> {
        let caller = Caller::of(&request);
        let ask = request.into_inner();
        Self::check_sender(&caller, &self.names, ask.leader)?;
        let (voter, leads, followed) = {
            let metrics = self.raft.metrics();
            let metrics = metrics.borrow();
            let voter = metrics
                .membership_config
                .membership()
                .voter_ids()
                .any(|v| v == metrics.id);
            let followed = (metrics.current_leader, metrics.current_term);
            (voter, metrics.current_leader == Some(metrics.id), followed)
        };
        if followed != (Some(ask.leader), ask.term) {
            return Err(Status::failed_precondition(format!(
                "member {} at term {} asked this member to stand, and it follows {:?} at term {}",
                ask.leader, ask.term, followed.0, followed.1
            )));
        }
        let standing = voter && !leads && self.raft.trigger().elect().await.is_ok();
        tracing::info!(
            standing,
            "the lease group's leader handed the lead to this member"
        );
        Ok(Response::new(pb::StandReply { standing }))
    }

    async fn propose(
        &self,
        request: Request<pb::RaftMessage>,
    ) -> Result<Response<pb::RaftMessage>, Status> {
        let caller = Caller::of(&request);
        let proposal: Proposal = decode(request)?;
        Self::check_proposal(&caller, &proposal.0)?;
        let result: Result<Reply, String> = self
            .raft
            .client_write(proposal)
            .await
            .map(|r| r.data)
            .map_err(|e| e.to_string());
        encode(&result)
    }

    async fn learner(
        &self,
        request: Request<pb::RaftMessage>,
    ) -> Result<Response<pb::RaftMessage>, Status> {
        let caller = Caller::of(&request);
        let change: GroupChange = decode(request)?;
        // a change is asked by the member it names (a learner: by its region's member),
        // a removal by the region itself or an operator
        match &change {
            GroupChange::Join { id, .. }
            | GroupChange::Leave { id }
            | GroupChange::AddRegion { id, .. } => Self::check_sender(&caller, &self.names, *id)?,
            GroupChange::RemoveRegion { region } => {
                Self::check_remover(&caller, &self.operators, region)?;
            }
        }
        encode(&self.change_group(change).await)
    }
}

/// Connections to other processes by address, each made lazily on first use and kept
/// (a forwarded lease proposal, a forwarded owned write), over TLS when the process has
/// a `[tls]` section.
#[derive(Clone)]
pub struct Channels {
    tls: Option<Tls>,
    made: Arc<Mutex<BTreeMap<String, Channel>>>,
}

impl Channels {
    pub fn new(tls: Option<Tls>) -> Self {
        Self {
            tls,
            made: Arc::default(),
        }
    }

    pub fn get(&self, addr: &str) -> Result<Channel, String> {
        let mut channels = self.made.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(channel) = channels.get(addr) {
            return Ok(channel.clone());
        }
        let channel = crate::security::tls::channel(addr, self.tls.as_ref(), CONNECT_TIMEOUT)
            .map_err(|e| e.to_string())?;
        channels.insert(addr.to_owned(), channel.clone());
        Ok(channel)
    }
}

/// Why a lease command got no answer.
#[derive(Debug, thiserror::Error)]
pub enum ProposeError {
    #[error("no leader of the lease group is known")]
    NoLeader,
    #[error("lease group: {0}")]
    Raft(String),
    #[error("forwarding to the leader at {addr}: {reason}")]
    Forward { addr: String, reason: String },
    #[error("no answer within {0:?}")]
    TimedOut(Duration),
}

/// Proposes lease commands: to the local member if it leads, else to the leader over
/// the `Propose` call (one lazily made connection per leader address); while this member
/// hands the lead over, to the successor it told to stand ([`Handover`]).
#[derive(Clone)]
pub struct Proposer {
    raft: Raft<LeaseRaft>,
    leaders: Channels,
    timeout: Duration,
    handover: Handover,
}

impl Proposer {
    pub fn new(
        raft: Raft<LeaseRaft>,
        leaders: Channels,
        timeout: Duration,
        handover: Handover,
    ) -> Self {
        Self {
            raft,
            leaders,
            timeout,
            handover,
        }
    }

    pub fn raft(&self) -> &Raft<LeaseRaft> {
        &self.raft
    }

    pub fn handover(&self) -> &Handover {
        &self.handover
    }

    /// Proposes `commands` as one log entry and waits for the outcomes the table applied,
    /// in order.
    pub async fn propose(&self, commands: Vec<Command>) -> Result<Vec<Outcome>, ProposeError> {
        let count = commands.len();
        let proposal = Proposal(commands);
        let (me, leader) = {
            let metrics = self.raft.metrics();
            let metrics = metrics.borrow();
            (metrics.id, metrics.current_leader)
        };
        let reply = match self.handover.successor() {
            Some(successor) if leader.is_none_or(|l| l == me) => {
                self.forward(&successor, &proposal).await?
            }
            _ => self.write(&proposal).await?,
        };
        if reply.0.len() != count {
            return Err(ProposeError::Raft(format!(
                "{count} commands, {} outcomes",
                reply.0.len()
            )));
        }
        Ok(reply.0)
    }

    /// To the local member, or to the leader it names.
    async fn write(&self, proposal: &Proposal) -> Result<Reply, ProposeError> {
        Ok(match self.raft.client_write(proposal.clone()).await {
            Ok(written) => written.data,
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(to))) => {
                let node = to.leader_node.ok_or(ProposeError::NoLeader)?;
                self.forward(&node.addr, proposal).await?
            }
            Err(e) => return Err(ProposeError::Raft(e.to_string())),
        })
    }

    async fn forward(&self, addr: &str, proposal: &Proposal) -> Result<Reply, ProposeError> {
        let failed = |reason: String| ProposeError::Forward {
            addr: addr.to_owned(),
            reason,
        };
        let mut client = LeaseRaftClient::new(self.leaders.get(addr).map_err(failed)?);
        let json = serde_json::to_vec(proposal).map_err(|e| failed(e.to_string()))?;
        let mut request = Request::new(pb::RaftMessage { json });
        request.set_timeout(self.timeout);
        let reply = client
            .propose(request)
            .await
            .map_err(|s| failed(s.message().to_owned()))?
            .into_inner();
        let result: Result<Reply, String> =
            serde_json::from_slice(&reply.json).map_err(|e| failed(e.to_string()))?;
        result.map_err(ProposeError::Raft)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_call_that_ran_out_of_time_is_retried_not_backed_off() {
        let channel = tonic::transport::Endpoint::from_static("http://127.0.0.1:9").connect_lazy();
        let mut peer = Peer {
            target: 2,
            addr: "127.0.0.1:9".into(),
            client: None,
            handover: Handover::default(),
            tls: None,
        };
        for (status, slow) in [
            (Status::cancelled("Timeout expired"), true),
            (Status::deadline_exceeded("deadline"), true),
            (Status::unavailable("tcp connect error"), false),
        ] {
            peer.client = Some(LeaseRaftClient::new(channel.clone()));
            let error: RpcError = peer.failed(status);
            match slow {
                true => assert!(matches!(error, RPCError::Network(_)), "{error}"),
                false => assert!(matches!(error, RPCError::Unreachable(_)), "{error}"),
            }
            assert!(peer.client.is_none(), "the connection is remade");
        }
    }
}
