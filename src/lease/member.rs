//! One member of the lease group as a running process part: Raft storage in its own
//! folder (`<data-dir>.raft`), the `LeaseRaft` gRPC service on `lease.listen`, and the group
//! initialized from the configured members the first time any of them starts (every
//! member proposes the same first membership entry, so it does not matter which wins).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use openraft::{BasicNode, Raft};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio_stream::wrappers::TcpListenerStream;

use super::network::{Network, Proposer, Service};
use super::raft_store::{self, LeaseRaft, TableView};
use crate::clock::Clock;
use crate::config::LeaseConfig;

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
}

/// A running member.
pub struct Member {
    pub raft: Raft<LeaseRaft>,
    pub view: TableView,
    pub proposer: Proposer,
    stop: Option<oneshot::Sender<()>>,
    server: tokio::task::JoinHandle<()>,
}

impl Member {
    /// Opens the storage in `dir`, serves Raft on `config.listen`, and joins (or forms)
    /// the group.
    pub async fn start(
        config: &LeaseConfig,
        dir: &Path,
        max_offset_ms: u64,
        wall: Arc<dyn Clock>,
    ) -> Result<Self, MemberError> {
        let listener =
            TcpListener::bind(config.listen)
                .await
                .map_err(|source| MemberError::Listen {
                    addr: config.listen,
                    source,
                })?;
        let dir = dir.to_owned();
        std::fs::create_dir_all(&dir).map_err(|e| MemberError::Storage(e.to_string()))?;
        let (log, machine, view) = tokio::task::spawn_blocking(move || {
            raft_store::open(&dir, max_offset_ms).map_err(|e| e.to_string())
        })
        .await
        .map_err(|e| MemberError::Storage(e.to_string()))?
        .map_err(MemberError::Storage)?;
        let raft = Raft::new(
            config.member_id,
            Arc::new(raft_config(config)?),
            Network,
            log,
            machine,
        )
        .await
        .map_err(|e| MemberError::Raft(e.to_string()))?;
        let (stop, stopped) = oneshot::channel::<()>();
        let service = Service::server(raft.clone(), wall);
        let server = tokio::spawn(async move {
            if let Err(e) = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                    let _ = stopped.await;
                })
                .await
            {
                tracing::error!(error = %e, "lease group service failed");
            }
        });
        let initialized = raft
            .is_initialized()
            .await
            .map_err(|e| MemberError::Raft(e.to_string()))?;
        if !initialized {
            let nodes: BTreeMap<u64, BasicNode> = config
                .members
                .values()
                .map(|m| (m.id, BasicNode::new(m.addr.clone())))
                .collect();
            match raft.initialize(nodes).await {
                Ok(()) => tracing::info!(members = config.members.len(), "lease group formed"),
                // another member formed it first: this one learns it from the leader
                Err(e) => tracing::info!(reason = %e, "lease group already formed"),
            }
        }
        Ok(Self {
            proposer: Proposer::new(raft.clone(), config.renew_every.max(config.heartbeat * 5)),
            raft,
            view,
            stop: Some(stop),
            server,
        })
    }

    /// Leaves the group's traffic and stops serving.
    pub async fn stop(mut self) {
        let _ = self.raft.shutdown().await;
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = self.server.await;
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
