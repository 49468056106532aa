//! The regional gRPC API (package `geostate.v1`): `State` for reads and writes, `Admin`
//! for operators, plus server reflection and the standard health service. Thin: writes go
//! to Kafka through the producer and are awaited on the ingest task's applied positions;
//! reads come from the store. Every error becomes a status in `error.rs`.
//!
//! This file holds what every path shares: [`Api`] (what the handlers use), the handler
//! type the services are implemented on, and the per-method metrics. The paths:
//!
//! ```text
//!  service.rs ── serve; the tonic State/Admin impls: metadata, metrics, statuses
//!      │
//!      ├─► update.rs ── Update: lease admission, forwarding, append, wait for applied
//!      ├─► read.rs ──── Get, BatchGet, Scan: store reads with freshness (windows.rs)
//!      ├─► watch.rs ─── Watch: local changes, fan-in from other owners, moves
//!      └─► admin.rs ─── Status, Checkpoint, Savepoint, Leases, TransferLease
//!  route.rs ── which node of the region owns a key's partition; requests routed there
//! ```

mod admin;
mod convert;
mod error;
mod read;
mod route;
mod service;
mod update;
mod watch;
mod windows;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

use tonic::Status;

pub use error::ApiError;
pub use service::serve;

use crate::checkpoint;
use crate::clock::Hlc;
use crate::config::Config;
use crate::crdt::RegionId;
use crate::lease::leases::Leases;
use crate::lease::network::Channels;
use crate::metrics as m;
use crate::partition::Partitions;
use crate::security::{Guard, Tls};
use crate::store::Store;

/// Marks an `Update` forwarded by a non-holder region: it is never forwarded again.
const FORWARDED: &str = "x-geostate-forwarded-by";
/// Marks a request routed to the node owning its key's partition: it is never routed
/// again (a node that does not own it either answers UNAVAILABLE).
const ROUTED: &str = "x-geostate-routed-by";

/// What the API handlers use.
pub struct Api {
    pub config: Arc<Config>,
    pub incarnation: u32,
    pub hlc: Arc<Hlc>,
    pub store: Arc<Store>,
    pub producer: crate::log::RenewingProducer,
    /// The node's partitions: the owned ones answer here.
    pub owned: Arc<Partitions>,
    pub partitions: Vec<i32>,
    /// The gRPC address clients reach this node at.
    pub address: String,
    /// Turns true when the node stops; ends `Watch` streams so shutdown can complete.
    pub stop: tokio::sync::watch::Receiver<bool>,
    /// Per remote region, how current this node's state is.
    pub freshness: Arc<crate::replication::Freshness>,
    /// Per remote region, how far its merger has read.
    pub remotes: Vec<Arc<crate::replication::RemoteProgress>>,
    /// Asks the checkpointer for a checkpoint now.
    pub checkpoints: tokio::sync::mpsc::Sender<checkpoint::Request>,
    pub checkpoint_status: Arc<checkpoint::CheckpointStatus>,
    /// The checkpoint store (savepoints go there too).
    pub objects: checkpoint::objects::Objects,
    /// This region's leases on owned shards (`None`: no `[lease]` section).
    pub leases: Option<Arc<Leases>>,
    /// Whether the region's Kafka answers (`log::reach`; `None`: not followed, without a
    /// `[lease]` section): while it does not, a route waits for the group briefly.
    pub kafka: Option<tokio::sync::watch::Receiver<bool>>,
    /// Connections to other regions' APIs, for forwarded owned writes.
    pub peers: Channels,
    /// Per other region, which of its entry addresses answered last.
    pub entries: Entries,
    /// End offsets `Admin/Status` read lately, per topic (see [`Api::end_offsets`]).
    pub ends: EndOffsets,
    /// The region's routing table as last read from its group, and when.
    pub routes: Routes,
    /// Who may call what ([`crate::security::ApiPolicy`]).
    pub guard: Guard,
    /// The listener's TLS (`None`: plaintext).
    pub tls: Option<Tls>,
    /// The region's user function sidecars, as this node checks them.
    pub functions: Vec<crate::function::Health>,
}

/// Per region, the index of its entry address (`lease.member.api`) that answered last:
/// where the next forwarded write goes first.
#[derive(Default)]
pub struct Entries(std::sync::Mutex<HashMap<RegionId, usize>>);

impl Entries {
    fn first(&self, region: &RegionId) -> usize {
        let entries = self.0.lock().unwrap_or_else(|p| p.into_inner());
        entries.get(region).copied().unwrap_or(0)
    }

    fn answered(&self, region: &RegionId, at: usize) {
        let mut entries = self.0.lock().unwrap_or_else(|p| p.into_inner());
        entries.insert(region.clone(), at);
    }
}

/// Per partition, the gRPC address of the node of this region owning it, as read from the
/// region's Kafka group.
pub type Routes = tokio::sync::Mutex<RouteTable>;

pub struct RouteTable {
    /// When the owners were read (`None`: never, or to be read again at the next route).
    pub read_at: Option<Instant>,
    /// When the group was last asked, answered or not (`None`: ask at the next route).
    pub asked_at: Option<Instant>,
    /// Whether an ask is on its way (one at a time).
    pub asking: bool,
    /// Counts the asks that ended, answered or not (routes wait on it).
    pub asked: tokio::sync::watch::Sender<u64>,
    pub owners: BTreeMap<i32, String>,
}

impl Default for RouteTable {
    fn default() -> Self {
        Self {
            read_at: None,
            asked_at: None,
            asking: false,
            asked: tokio::sync::watch::Sender::new(0),
            owners: BTreeMap::new(),
        }
    }
}

/// The last end offsets `Admin/Status` read per topic, and when that reading started. One
/// reading at a time, shared by every call that was waiting for it, however often Status
/// is called (each reading creates a Kafka client and can block a thread for seconds when
/// Kafka is slow); never one that started before the call (a caller waiting for "caught
/// up" must see the end as of its call).
pub type EndOffsets = tokio::sync::Mutex<HashMap<String, (Instant, Option<BTreeMap<i32, i64>>)>>;

impl Api {
    /// The end offsets of `topic` on `kafka`, read after this call began (`None`: Kafka did
    /// not answer).
    async fn end_offsets(
        &self,
        kafka: &crate::config::KafkaConfig,
        topic: &str,
        partitions: Vec<i32>,
    ) -> Option<BTreeMap<i32, i64>> {
        let asked = Instant::now();
        // held while reading: callers queue behind one reading instead of each making one
        let mut ends = self.ends.lock().await;
        if let Some((started, read)) = ends.get(topic)
            && *started >= asked
        {
            return read.clone();
        }
        let started = Instant::now();
        let read = crate::log::end_offsets(kafka, topic, partitions).await.ok();
        ends.insert(topic.to_owned(), (started, read.clone()));
        read
    }
}

/// What the `State` and `Admin` services are implemented on: the shared [`Api`], its
/// methods spread over this module's files by path.
#[derive(Clone)]
struct Handler(Arc<Api>);

/// Records a method's latency and error code.
fn observe<T>(
    method: &'static str,
    started: Instant,
    result: Result<T, ApiError>,
) -> Result<T, Status> {
    metrics::histogram!(m::GRPC_SECONDS, "method" => method)
        .record(started.elapsed().as_secs_f64());
    result.map_err(|e| failed(method, e))
}

/// The status of a failed call or stream, counted by method and code.
fn failed(method: &'static str, e: ApiError) -> Status {
    let status = Status::from(e);
    metrics::counter!(m::GRPC_ERRORS, "method" => method, "code" => format!("{:?}", status.code()))
        .increment(1);
    status
}

impl Handler {
    /// This region's leases on owned shards, or FAILED_PRECONDITION where the node has none.
    fn leases(&self) -> Result<&Arc<Leases>, ApiError> {
        self.0.leases.as_ref().ok_or_else(|| {
            ApiError::Precondition("this node has no [lease] section: no owned shards".into())
        })
    }
}
