//! One member of the lease group as a running process part: Raft storage in its own
//! folder (`<data-dir>.raft`), the `LeaseRaft` gRPC service on `lease.listen`, and the group
//! initialized from the configured members the first time any of them starts (every
//! member proposes the same first membership entry, so it does not matter which wins).
//!
//! A region added to a running group (`lease.join = true`) does not form it: its member
//! asks the members to add it, and the leader adds it as a learner, waits until it holds
//! the log, and makes it a voter. The group's regions are its voters' regions as the log
//! has them (`raft_store::regions_of`), so every member starts counting the region at the
//! same entry; `geostate remove-region` takes one out the same way.
//!
//! A region's further node (`lease.learner = n`) runs learner n instead: it asks the members
//! to add it (again until the leader does), then receives the table like a member and
//! proposes through the leader, but votes in nothing, so nodes come and go without
//! changing the group's majority; it asks to be removed when it stops. A learner killed
//! never asks: the leader probes every learner's port, and removes one whose port refuses
//! connections [`LEARNER_REFUSALS`] times in a row (its process is gone; it is added again
//! when it starts, which binds the port before it asks to join).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use openraft::{ChangeMembers, Raft};
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};

use super::election::Election;
use super::network::{self, Channels, GroupChange, Handover, Network, Proposer, Service};
use super::placement::{Placement, RoundTrips};
use super::raft_store::{self, GroupNode, LeaseRaft, LogStore, StateMachine, TableView};
use crate::clock::Clock;
use crate::config::LeaseConfig;
use crate::pb::lease_raft_server::LeaseRaftServer;
use crate::peers::refuses;
use crate::security::{Guard, Listener, MemberPolicy, Tls};

#[derive(Debug, thiserror::Error)]
pub enum MemberError {
    #[error("lease storage: {0}")]
    Storage(String),
    #[error("lease group: {0}")]
    Raft(String),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error("tls: {0}")]
    Tls(String),
}

/// A running member.
pub struct Member {
    pub raft: Raft<LeaseRaft>,
    pub view: TableView,
    pub proposer: Proposer,
    /// New connections to the other members are made with it (`None`: plaintext).
    pub tls: Option<Tls>,
    /// Set once this node is in the group: at once for a member (0), for a learner once
    /// the leader added it, to the leader's last log index then. Until then it proposes
    /// nothing: a region's release or transfer is refused only while its learners are
    /// listed, so a learner not listed yet must not hold a lease.
    pub joined: watch::Receiver<Option<u64>>,
    stop: Option<oneshot::Sender<()>>,
    server: tokio::task::JoinHandle<()>,
    /// A learner's way back out: its id and the members to ask.
    learner: Option<(u64, Vec<String>)>,
    joining: Option<tokio::task::JoinHandle<()>>,
    pruning: tokio::task::JoinHandle<()>,
    /// Pre-vote ([`Election`]).
    electing: tokio::task::JoinHandle<()>,
    /// A voter's round trips and leader handover ([`Placement`]).
    placing: Option<tokio::task::JoinHandle<()>>,
}

/// How long one ask of a member to change the learners may take.
const LEARNER_ASK: Duration = Duration::from_secs(2);
/// Between rounds of asking the members to add this learner.
const JOIN_RETRY: Duration = Duration::from_millis(500);
/// How often the leader probes each learner's port.
const LEARNER_PROBE: Duration = Duration::from_millis(500);
/// Refusals in a row after which the leader removes a learner.
pub const LEARNER_REFUSALS: u32 = 3;

impl Member {
    /// Opens the storage in `dir`, serves Raft on `config.listen`, and joins (or forms)
    /// the group.
    pub async fn start(
        config: &LeaseConfig,
        dir: &Path,
        max_offset_ms: u64,
        wall: Arc<dyn Clock>,
        tls: Option<Tls>,
    ) -> Result<Self, MemberError> {
        let listener =
            TcpListener::bind(config.listen)
                .await
                .map_err(|source| MemberError::Listen {
                    addr: config.listen,
                    source,
                })?;
        let (log, machine, view) = open_storage(config, dir, max_offset_ms).await?;
        let election = Election::new(config.election_timeout);
        let (handover, trips) = (Handover::default(), RoundTrips::default());
        let raft = Raft::new(
            config.raft_id(),
            Arc::new(raft_config(config)?),
            Network {
                handover: handover.clone(),
                tls: tls.clone(),
            },
            log,
            machine,
        )
        .await
        .map_err(|e| MemberError::Raft(e.to_string()))?;
        let (stop, stopped) = oneshot::channel::<()>();
        let service = Service::server(raft.clone(), wall, election.clone(), trips.clone(), config);
        let server = serve(config, listener, service, tls.clone(), stopped);
        // each part its own connections, as without TLS
        let channels = || Channels::new(tls.clone());
        let initialized = raft
            .is_initialized()
            .await
            .map_err(|e| MemberError::Raft(e.to_string()))?;
        let members: Vec<String> = config.members.values().map(|m| m.addr.clone()).collect();
        let forms = forms_group(config, &raft);
        let (joined_tx, joined) = watch::channel(forms.then_some(0));
        let (learner, joining) = if !forms {
            let joining = ask_to_join(config, &members, channels(), joined_tx);
            let learner = (config.learner > 0).then(|| (config.raft_id(), members));
            (learner, Some(joining))
        } else {
            (None, None)
        };
        if !initialized && forms {
            form_group(&raft, config).await;
        }
        let placing = (config.learner == 0).then(|| {
            tokio::spawn(placement(config, trips, handover.clone()).run(raft.clone(), channels()))
        });
        Ok(Self {
            placing,
            pruning: tokio::spawn(prune_learners(raft.clone())),
            electing: tokio::spawn(election.run(raft.clone(), channels())),
            joined,
            proposer: Proposer::new(raft.clone(), channels(), config.duration, handover),
            tls,
            raft,
            view,
            stop: Some(stop),
            server,
            learner,
            joining,
        })
    }

    /// Waits, at most `within`, until this node's table is current as of its joining the
    /// group: it applied the log as far as the leader had it when the leader listed it (a
    /// learner added to a long log, or restarted with an old copy of it, receives the rest
    /// first); answers whether it is. Until then its view of the table is behind, and
    /// renewals planned from it are refused.
    pub async fn caught_up(&self, within: Duration) -> bool {
        let (mut joined, mut metrics) = (self.joined.clone(), self.raft.metrics());
        let current = async move {
            let index = (*joined.wait_for(Option::is_some).await.ok()?)?;
            let applied = metrics
                .wait_for(|m| m.last_applied.is_some_and(|a| a.index >= index))
                .await;
            applied.ok().map(drop)
        };
        matches!(tokio::time::timeout(within, current).await, Ok(Some(_)))
    }

    /// Leaves the group's traffic (a learner asks to be removed first) and stops serving.
    pub async fn stop(mut self) {
        self.pruning.abort();
        self.electing.abort();
        if let Some(placing) = self.placing.take() {
            placing.abort();
        }
        if let Some(joining) = self.joining.take() {
            joining.abort();
        }
        if let Some((id, members)) = self.learner.take() {
            let leave = GroupChange::Leave { id };
            let channels = Channels::new(self.tls.clone());
            match network::change_group(&channels, &members, &leave, LEARNER_ASK).await {
                Ok(_) => tracing::info!("left the lease group"),
                Err(e) => tracing::warn!(error = %e, "leaving the lease group as a learner"),
            }
        }
        let _ = self.raft.shutdown().await;
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = self.server.await;
    }
}

/// While this member leads: removes every learner whose port refused connections
/// [`LEARNER_REFUSALS`] probes in a row. A learner left listed would keep its region from
/// releasing or transferring leases (`SeveralNodes`) for good.
async fn prune_learners(raft: Raft<LeaseRaft>) {
    let mut refused: BTreeMap<u64, u32> = BTreeMap::new();
    loop {
        tokio::time::sleep(LEARNER_PROBE).await;
        let metrics = raft.metrics().borrow().clone();
        if metrics.current_leader != Some(metrics.id) {
            refused.clear();
            continue;
        }
        let membership = metrics.membership_config.membership().clone();
        let learners: BTreeMap<u64, String> = membership
            .learner_ids()
            .filter_map(|id| Some((id, membership.get_node(&id)?.addr.clone())))
            .collect();
        refused.retain(|id, _| learners.contains_key(id));
        for (id, addr) in learners {
            let refusals = refused.entry(id).or_default();
            *refusals = if refuses(&addr, LEARNER_PROBE).await {
                *refusals + 1
            } else {
                0
            };
            if *refusals < LEARNER_REFUSALS {
                continue;
            }
            refused.remove(&id);
            let gone = ChangeMembers::RemoveNodes(BTreeSet::from([id]));
            match raft.change_membership(gone, true).await {
                Ok(_) => {
                    tracing::warn!(learner = id, %addr, "a learner's port refuses connections: removed it from the lease group (it is added again when it starts)")
                }
                Err(e) => {
                    tracing::debug!(learner = id, error = %e, "removing a learner that refuses connections")
                }
            }
        }
    }
}

/// Opens the Raft storage in `dir`, creating the folder if missing; RocksDB opens off the
/// async threads.
async fn open_storage(
    config: &LeaseConfig,
    dir: &Path,
    max_offset_ms: u64,
) -> Result<(LogStore, StateMachine, TableView), MemberError> {
    let dir = dir.to_owned();
    let configured = config.configured_regions();
    let shards = config.all_shards().end;
    std::fs::create_dir_all(&dir).map_err(|e| MemberError::Storage(e.to_string()))?;
    tokio::task::spawn_blocking(move || {
        raft_store::open(&dir, max_offset_ms, configured, shards).map_err(|e| e.to_string())
    })
    .await
    .map_err(|e| MemberError::Storage(e.to_string()))?
    .map_err(MemberError::Storage)
}

/// Serves the `LeaseRaft` service on `listener` until `stopped` fires.
fn serve(
    config: &LeaseConfig,
    listener: TcpListener,
    service: LeaseRaftServer<Service>,
    tls: Option<Tls>,
    stopped: oneshot::Receiver<()>,
) -> tokio::task::JoinHandle<()> {
    // with TLS, only the members' certificates are let in
    let members = config.members.values().map(|m| m.name().to_owned());
    let guard = match tls {
        Some(_) => Guard::new(MemberPolicy {
            members: members.collect(),
            operators: config.operators.iter().cloned().collect(),
        }),
        None => Guard::none(),
    };
    let incoming = crate::security::tls::incoming(listener, tls, Listener::Lease);
    tokio::spawn(async move {
        if let Err(e) = tonic::transport::Server::builder()
            .layer(guard)
            .add_service(service)
            .serve_with_incoming_shutdown(incoming, async {
                let _ = stopped.await;
            })
            .await
        {
            tracing::error!(error = %e, "lease group service failed");
        }
    })
}

/// Whether this node starts as a member, forming the group if nobody did yet, rather than
/// asking the members to add it.
fn forms_group(config: &LeaseConfig, raft: &Raft<LeaseRaft>) -> bool {
    // a region that joined votes from its own log on: it starts as a member then
    let votes = (raft.metrics().borrow().membership_config.membership())
        .voter_ids()
        .any(|v| v == config.raft_id());
    config.learner == 0 && (!config.join || votes)
}

/// Asks the `members` (other than this node) to add it — as a voter for a region joining
/// a running group, as a learner otherwise — round after round until the leader does;
/// then sends the leader's last log index at that moment on `joined_tx`.
fn ask_to_join(
    config: &LeaseConfig,
    members: &[String],
    channels: Channels,
    joined_tx: watch::Sender<Option<u64>>,
) -> tokio::task::JoinHandle<()> {
    let join = match config.members.get(&config.member_id) {
        Some(me) if config.join => GroupChange::AddRegion {
            id: config.member_id,
            node: group_node(me),
        },
        _ => GroupChange::Join {
            id: config.raft_id(),
            addr: config.listen.to_string(),
        },
    };
    let own = config.listen.to_string();
    let asked: Vec<String> = members.iter().filter(|a| **a != own).cloned().collect();
    tokio::spawn(async move {
        loop {
            match network::change_group(&channels, &asked, &join, LEARNER_ASK).await {
                Ok(index) => {
                    joined_tx.send_replace(Some(index));
                    break match join {
                        GroupChange::AddRegion { .. } => {
                            tracing::info!("joined the lease group as a voter")
                        }
                        _ => tracing::info!("joined the lease group as a learner"),
                    };
                }
                Err(e) => tracing::debug!(error = %e, "joining the lease group"),
            }
            tokio::time::sleep(JOIN_RETRY).await;
        }
    })
}

/// Proposes the first membership: the configured members.
async fn form_group(raft: &Raft<LeaseRaft>, config: &LeaseConfig) {
    let nodes: BTreeMap<u64, GroupNode> = (config.members.values())
        .map(|m| (m.id, group_node(m)))
        .collect();
    match raft.initialize(nodes).await {
        Ok(()) => tracing::info!(members = config.members.len(), "lease group formed"),
        // another member formed it first: this one learns it from the leader
        Err(e) => tracing::info!(reason = %e, "lease group already formed"),
    }
}

/// A voter's [`Placement`] from the configured members.
fn placement(config: &LeaseConfig, trips: RoundTrips, handover: Handover) -> Placement {
    Placement {
        me: config.member_id,
        voters: (config.members.values())
            .map(|m| (m.id, m.addr.clone()))
            .collect(),
        regions: (config.members.values())
            .filter(|m| m.region.is_some())
            .map(|m| m.id)
            .collect(),
        leader_lease: 2 * config.election_timeout,
        heartbeat: config.heartbeat,
        trips,
        handover,
    }
}

/// A configured member as the group's membership lists it.
fn group_node(member: &crate::config::Member) -> GroupNode {
    GroupNode {
        addr: member.addr.clone(),
        region: member.region.clone(),
        api: member.api.clone(),
    }
}

/// openraft's configuration from the `[lease]` timings.
fn raft_config(config: &LeaseConfig) -> Result<openraft::Config, MemberError> {
    openraft::Config {
        cluster_name: "geostate-leases".into(),
        heartbeat_interval: config.heartbeat.as_millis() as u64,
        election_timeout_min: config.election_timeout.as_millis() as u64,
        election_timeout_max: 2 * config.election_timeout.as_millis() as u64,
        ..Default::default()
    }
    .validate()
    .map_err(|e| MemberError::Raft(e.to_string()))
}
