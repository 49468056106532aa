//! The regional gRPC API (package `geostate.v1`): `State` for reads and writes, `Admin`
//! for operators, plus server reflection and the standard health service. Thin: writes go
//! to Kafka through the producer and are awaited on the ingest task's applied positions;
//! reads come from the store. Every error becomes a status in `error.rs`.

mod convert;
mod error;
mod windows;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::log::Made;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};
use tracing::Span;
use tracing::field::Empty;

pub use error::ApiError;

use crate::checkpoint;
use crate::clock::Hlc;
use crate::config::{Config, Ownership, RecordFormat};
use crate::crdt::{CrdtType, CrdtValue, RegionId};
use crate::ingest::event::{Op, Update};
use crate::ingest::ingestor::{IngestShared, Outcome, Terms};
use crate::lease::leases::{Leases, NotHolder, ShardStatus};
use crate::lease::network::Channels;
use crate::metrics as m;
use crate::pb;
use crate::pb::admin_server::{Admin, AdminServer};
use crate::pb::state_server::{State, StateServer};
use crate::security::tls::incoming;
use crate::security::{Guard, Listener, Tls};
use crate::shutdown::stopped;
use crate::store::Store;
use crate::window;

/// How a write of an owned key is admitted here.
enum Admit {
    /// Not owned: any region writes it.
    Unowned,
    /// This region holds the key's lease at this epoch.
    Stamp(u64),
    /// Another region holds it (or none does).
    Forward(NotHolder),
}

/// Marks an `Update` forwarded by a non-holder region: it is never forwarded again.
const FORWARDED: &str = "x-geostate-forwarded-by";
/// Marks a request routed to the node owning its key's partition: it is never routed
/// again (a node that does not own it either answers UNAVAILABLE).
const ROUTED: &str = "x-geostate-routed-by";
/// How long a read of the region's group (which node owns which partition) is used.
const ROUTES_FOR: Duration = Duration::from_secs(1);

/// How long `Update` waits for its record to be applied.
const APPLY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a linearizable operation at a new lease holder waits for the earlier holders'
/// writes before it is answered UNAVAILABLE.
const SETTLE_WAIT: Duration = Duration::from_secs(2);
const SCAN_DEFAULT_LIMIT: usize = 100;
const SCAN_MAX_LIMIT: usize = 1000;

/// What the API handlers use.
pub struct Api {
    pub config: Arc<Config>,
    pub incarnation: u32,
    pub hlc: Arc<Hlc>,
    pub store: Arc<Store>,
    pub producer: crate::log::RenewingProducer,
    pub shared: Arc<IngestShared>,
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
/// region's Kafka group at the instant kept with it.
pub type Routes = tokio::sync::Mutex<(Option<Instant>, BTreeMap<i32, String>)>;

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

/// Serves the API on `listener` until `shutdown` completes.
pub async fn serve(
    listener: TcpListener,
    api: Arc<Api>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<StateServer<Handler>>().await;
    health.set_serving::<AdminServer<Handler>>().await;
    // stopping (asked to, or a part failed): health says so to clients still connected
    let shutdown = async move {
        shutdown.await;
        health.set_not_serving::<StateServer<Handler>>().await;
        health.set_not_serving::<AdminServer<Handler>>().await;
    };
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(|e| {
            tracing::error!(error = %e, "reflection descriptors are invalid");
            e
        });
    let incoming = incoming(listener, api.tls.clone(), Listener::Api);
    let guard = api.guard.clone();
    let handler = Handler(api);
    let mut router = tonic::transport::Server::builder()
        .layer(guard)
        .add_service(health_service)
        .add_service(StateServer::new(handler.clone()))
        .add_service(AdminServer::new(handler));
    if let Ok(reflection) = reflection {
        router = router.add_service(reflection);
    }
    router
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
}

#[derive(Clone)]
struct Handler(Arc<Api>);

/// Values a `Watch` stream may have queued unread before the watcher is cut off.
const WATCH_QUEUE: usize = 256;
/// How often a `Watch` checks that no partition moved between the region's nodes.
const WATCH_OWNERS_EVERY: Duration = Duration::from_secs(1);

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
    /// A `leaseholder` read is served only where the key's lease is held, after checking
    /// it: the holder has applied every write it acknowledged, so the read sees them.
    async fn read_at_holder(&self, key: &str) -> Result<pb::Value, ApiError> {
        let owned = self
            .0
            .config
            .namespaces
            .lookup(key)
            .is_some_and(|ns| ns.ownership == Ownership::Owned);
        if !owned {
            return Err(ApiError::InvalidArgument(format!(
                "a leaseholder read needs a key in an owned namespace; {key:?} is not"
            )));
        }
        let (shard, epoch) = self.leases()?.epoch_for(key).map_err(ApiError::NotHolder)?;
        self.settled(key, shard, epoch).await?;
        self.read(key, None)
    }

    /// Waits (at most [`SETTLE_WAIT`]) until a linearizable operation on `key`, held here
    /// at `epoch`, sees every write acknowledged before it: the key's value was written at
    /// this epoch (no older write can win over it), or every other region's heartbeats on
    /// every partition have passed the moment this region learnt of the epoch plus the
    /// clock offset. Those regions' leases on the shard had ended by then, and they
    /// acknowledge an owned write only if it was applied while their lease was valid, so
    /// everything they acknowledged was shipped before those heartbeats.
    async fn settled(&self, key: &str, shard: u32, epoch: u64) -> Result<(), ApiError> {
        let api = &self.0;
        let offset_ms = api.config.max_clock_offset.as_millis() as u64;
        let deadline = Instant::now() + SETTLE_WAIT;
        loop {
            if api.store.get(key)?.is_some_and(|v| v.epoch() == epoch) {
                return Ok(());
            }
            let since = self.leases()?.holding_since(shard, epoch);
            let behind = match since {
                None => Some(api.config.region.to_string()),
                Some(ms) => api
                    .remotes
                    .iter()
                    .find(|r| !r.passed((ms + offset_ms) * 1_000_000))
                    .map(|r| r.remote.region.to_string()),
            };
            let Some(region) = behind else {
                return Ok(());
            };
            if Instant::now() >= deadline {
                metrics::counter!(m::NOT_SETTLED).increment(1);
                return Err(ApiError::Settling {
                    shard,
                    epoch,
                    region,
                });
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The key's partition of the updates topic.
    fn partition_of(&self, key: &str) -> i32 {
        let partitions = i32::try_from(self.0.partitions.len()).unwrap_or(i32::MAX);
        crate::log::partition_of(key.as_bytes(), partitions)
    }

    /// The node of this region owning `partition`: this one (`None`), or another's address
    /// from the region's group (read at most every [`ROUTES_FOR`], and again when it names
    /// no owner or this node, or a routed request was answered `UNAVAILABLE`; while the
    /// group rebalances, the routes it last read stand:
    /// a node that no longer owns the partition answers so).
    async fn owner_of(&self, partition: i32) -> Option<String> {
        let api = &self.0;
        if api.shared.owned.borrow().contains(&partition) {
            return None;
        }
        let mut routes = api.routes.lock().await;
        let known = routes
            .1
            .get(&partition)
            .filter(|owner| **owner != api.address);
        let fresh = routes.0.is_some_and(|at| at.elapsed() < ROUTES_FOR);
        if known.is_none() || !fresh {
            let group = crate::node::group_id(&api.config);
            let topic = &api.config.kafka.updates_topic;
            if let Ok(Some(read)) =
                crate::log::membership::owners(&api.config.kafka, &group, topic).await
            {
                *routes = (Some(Instant::now()), read);
            }
        }
        routes
            .1
            .get(&partition)
            .filter(|owner| **owner != api.address)
            .cloned()
    }

    /// Where a request for `key` is answered: here (`Ok(None)`), or at the address of the
    /// node owning its partition (a request routed once already is never routed again).
    async fn route(&self, key: &str, routed: bool) -> Result<Option<String>, ApiError> {
        let partition = self.partition_of(key);
        if self.0.shared.owned.borrow().contains(&partition) {
            return Ok(None);
        }
        let owner = self.owner_of(partition).await;
        match owner {
            Some(owner) if !routed => Ok(Some(owner)),
            owner => Err(ApiError::NotOwner {
                key: key.to_string(),
                partition,
                owner,
            }),
        }
    }

    /// The answer of the node at `node` to a routed request. An `UNAVAILABLE` one (the
    /// partition moved, or the node is gone) makes the next route read the group again
    /// rather than trust routes up to [`ROUTES_FOR`] old.
    async fn routed_answer<T>(
        &self,
        node: String,
        answer: Result<Response<T>, Status>,
    ) -> Result<T, ApiError> {
        match answer {
            Ok(answer) => Ok(answer.into_inner()),
            Err(status) => {
                if status.code() == tonic::Code::Unavailable {
                    self.0.routes.lock().await.0 = None;
                }
                Err(ApiError::Routed { node, status })
            }
        }
    }

    /// A client of the region's node at `addr`, and a request to it marked routed.
    fn node_client<T>(
        &self,
        addr: &str,
        req: T,
    ) -> Result<
        (
            pb::state_client::StateClient<tonic::transport::Channel>,
            Request<T>,
        ),
        ApiError,
    > {
        let channel = self.0.peers.get(addr).map_err(ApiError::Internal)?;
        let mut request = Request::new(req);
        if let Ok(node) = self.0.address.parse() {
            request.metadata_mut().insert(ROUTED, node);
        }
        Ok((pb::state_client::StateClient::new(channel), request))
    }

    /// A key's values: one, or for a windowed key one per window `window` names.
    fn read_values(
        &self,
        key: &str,
        window: Option<&pb::WindowSelector>,
    ) -> Result<Vec<pb::Value>, ApiError> {
        let ns =
            self.0.config.namespaces.lookup(key).ok_or_else(|| {
                ApiError::InvalidArgument(format!("key {key:?} is in no namespace"))
            })?;
        if let Some(spec) = &ns.window {
            return self.read_windows(key, spec, ns.crdt, window);
        }
        let mut value = convert::value(key, ns.crdt, self.0.store.get(key)?.as_ref())?;
        self.fill_freshness(&mut value, self.partition_of(key));
        Ok(vec![value])
    }

    /// One value of `key`: a windowed key's one window, not a range.
    fn read(&self, key: &str, window: Option<&pb::WindowSelector>) -> Result<pb::Value, ApiError> {
        if let Some(pb::WindowSelector {
            which: Some(pb::window_selector::Which::Range(_)),
        }) = window
        {
            return Err(ApiError::InvalidArgument(
                "a range of windows is read with BatchGet or Scan, one value per window".into(),
            ));
        }
        self.read_values(key, window)?
            .pop()
            .ok_or_else(|| ApiError::Internal(format!("no value read for {key:?}")))
    }

    /// What the key's partition holds of each remote region.
    fn fill_freshness(&self, value: &mut pb::Value, partition: i32) {
        if let Some(f) = value.freshness.as_mut() {
            f.remotes = self
                .0
                .freshness
                .of(partition)
                .into_iter()
                .map(|(region, r)| pb::RemoteFreshness {
                    region: region.to_string(),
                    applied: Some(convert::hlc(r.applied)),
                    lag_ms: r.lag.as_millis() as u64,
                })
                .collect();
        }
    }

    /// An owned write this region may not make, sent to the holder's API when
    /// `lease.forward-writes` is on (once: a forwarded write is never forwarded again):
    /// to the holder's entry address that last answered, and on to its next while a
    /// connection is refused (the request never left), so one node of the holder region
    /// down does not stop forwarding.
    async fn forward(
        &self,
        req: pb::UpdateRequest,
        refusal: NotHolder,
        forwarded: bool,
    ) -> Result<pb::UpdateResponse, ApiError> {
        let api = &self.0;
        let target = api
            .leases
            .as_ref()
            .filter(|l| l.config().forward_writes && !forwarded)
            // this member's table may lag the leader's for a moment: never to itself
            .zip(
                refusal
                    .holder
                    .as_ref()
                    .filter(|h| h.holder != api.config.region),
            )
            .map(|(l, holder)| (l.api_of(&holder.holder), holder.holder.clone()))
            .filter(|(addrs, _)| !addrs.is_empty());
        let Some((addrs, region)) = target else {
            metrics::counter!(m::OWNED_WRITES_REFUSED).increment(1);
            return Err(ApiError::NotHolder(refusal));
        };
        let (mut at, mut left) = (api.entries.first(&region) % addrs.len(), addrs.len());
        loop {
            let channel = api.peers.get(&addrs[at]).map_err(ApiError::Internal)?;
            let mut client = pb::state_client::StateClient::new(channel);
            let mut request = Request::new(req.clone());
            if let Ok(by) = api.config.region.as_str().parse() {
                request.metadata_mut().insert(FORWARDED, by);
            }
            match client.update(request).await {
                Ok(r) => {
                    api.entries.answered(&region, at);
                    return Ok(r.into_inner());
                }
                Err(s) if left > 1 && geostate_proto::never_sent(&s) => {
                    tracing::debug!(addr = %addrs[at], %s, "a holder entry address refused; trying its next");
                    (at, left) = ((at + 1) % addrs.len(), left - 1);
                }
                Err(s) => return Err(ApiError::Forwarded(s)),
            }
        }
    }

    /// A write: admitted under the key's lease if it is owned (or forwarded to the
    /// holder), checked, stamped and appended to the updates topic, acknowledged once
    /// ingest applied it (and, if owned, while the lease it was stamped under holds).
    /// Its span (debug: `RUST_LOG=info,geostate::api=debug`) names the key, epoch,
    /// partition and offset; the log has a line for it when it ends, with its time.
    #[tracing::instrument(name = "update", level = "debug", skip_all,
        fields(key = %req.key, epoch = Empty, partition = Empty, offset = Empty))]
    async fn update(
        &self,
        req: pb::UpdateRequest,
        forwarded: bool,
        routed: bool,
    ) -> Result<pb::UpdateResponse, ApiError> {
        let api = &self.0;
        if let Some(node) = self.route(&req.key, routed).await? {
            let (mut client, mut request) = self.node_client(&node, req)?;
            if forwarded && let Ok(by) = api.config.region.as_str().parse() {
                request.metadata_mut().insert(FORWARDED, by);
            }
            return self.routed_answer(node, client.update(request).await).await;
        }
        let mut update = convert::update_from_pb(req)?;
        match self.admit(&update).await? {
            Admit::Unowned => {}
            Admit::Stamp(epoch) => {
                Span::current().record("epoch", epoch);
                update.epoch = Some(epoch);
            }
            Admit::Forward(refusal) => {
                let request = convert::update_to_pb(update);
                return self.forward(request, refusal, forwarded).await;
            }
        }
        let crdt = self.checked(&update)?;
        let produced = Instant::now();
        // before the record exists: a take of its partition after this is noticed
        let terms = api.shared.terms();
        let (partition, offset) = self.append(&mut update, crdt).await?;
        Span::current()
            .record("partition", partition)
            .record("offset", offset);
        let acked = Instant::now();
        m::write_stage("produce", acked - produced);
        self.applied(partition, offset, &terms).await?;
        m::write_stage("applied", acked.elapsed());
        // acknowledged only if applied under the lease it was accepted with (what a new
        // holder waits for, see `settled`)
        if let (Some(epoch), Some(leases)) = (update.epoch, &api.leases) {
            match leases.epoch_for(&update.key) {
                Ok((_, now)) if now == epoch => {}
                Ok((shard, _)) | Err(NotHolder { shard, .. }) => {
                    return Err(ApiError::LeaseEnded { shard });
                }
            }
        }
        let stamp = update.hlc.map(|hlc| crate::crdt::OrderStamp {
            epoch: update.epoch.unwrap_or(0),
            hlc,
            origin: api.config.region.clone(),
        });
        Ok(pb::UpdateResponse {
            position: Some(pb::Position { partition, offset }),
            stamp: stamp.as_ref().map(convert::stamp),
        })
    }

    /// An owned key is written only at its holder, stamped with its epoch; a
    /// compare-and-set first waits until what earlier holders wrote has arrived.
    async fn admit(&self, update: &Update) -> Result<Admit, ApiError> {
        let api = &self.0;
        let owned = api
            .config
            .namespaces
            .lookup(&update.key)
            .is_some_and(|ns| ns.ownership == Ownership::Owned);
        let Some(leases) = api.leases.as_ref().filter(|_| owned) else {
            return Ok(Admit::Unowned);
        };
        match leases.epoch_for(&update.key) {
            Ok((shard, epoch)) => {
                if matches!(update.op, Op::Cas { .. }) {
                    self.settled(&update.key, shard, epoch).await?;
                }
                Ok(Admit::Stamp(epoch))
            }
            Err(refusal) => Ok(Admit::Forward(refusal)),
        }
    }

    /// Refuses what ingest would refuse, before it enters the log; answers the key's
    /// type.
    fn checked(&self, update: &Update) -> Result<CrdtType, ApiError> {
        let config = &self.0.config;
        let ns = update
            .check(&config.namespaces, &config.ingest)
            .map_err(ApiError::Refused)?;
        let texts: &[&[u8]] = match &update.op {
            Op::Add(_) => &[],
            Op::Set(v) => &[v],
            Op::Cas { expected, value } => &[value, expected.as_deref().unwrap_or_default()],
        };
        if config.kafka.format == RecordFormat::Json
            && texts.iter().any(|v| std::str::from_utf8(v).is_err())
        {
            return Err(ApiError::InvalidArgument(
                "register values must be UTF-8 text while kafka.format = \"json\"".into(),
            ));
        }
        Ok(ns.crdt)
    }

    /// Stamps a register write and appends the write to the updates topic; answers its
    /// position. The order stamp is fixed here, before the write enters the log, and
    /// under the producer's lock: concurrent writes enter the log in stamp order, so the
    /// log's order (which decides a compare-and-set) and the stamps' (which decide the
    /// register) agree.
    async fn append(&self, update: &mut Update, crdt: CrdtType) -> Result<(i32, i64), ApiError> {
        let api = &self.0;
        let queued = api
            .producer
            .queue_made(&api.config.kafka.updates_topic, || {
                if crdt == CrdtType::LwwRegister {
                    update.hlc = Some(api.hlc.now());
                }
                Made {
                    key: update.key.clone(),
                    payload: update.encode(api.config.kafka.format),
                    // from the clock that stamped it (ingest bounds the stamp by it)
                    timestamp_ms: i64::try_from(api.hlc.physical().now_nanos() / 1_000_000)
                        .unwrap_or(i64::MAX),
                }
            })
            .map_err(|e| ApiError::Kafka(e.into()))?;
        let delivery = queued.await.map_err(|e| ApiError::Kafka(e.into()))?;
        Ok((delivery.partition, delivery.offset))
    }

    /// Waits until ingest applied the record at `partition`/`offset`, and answers how
    /// it was decided.
    async fn applied(&self, partition: i32, offset: i64, terms: &Terms) -> Result<(), ApiError> {
        let shared = &self.0.shared;
        let Ok(outcome) =
            tokio::time::timeout(APPLY_TIMEOUT, shared.passed(partition, offset, terms)).await
        else {
            let (keys, max) = (
                self.0.store.outbox_len_in(&shared.owned.borrow()),
                self.0.config.replication.max_outbox_keys,
            );
            return Err(ApiError::NotApplied {
                partition,
                offset,
                seconds: APPLY_TIMEOUT.as_secs(),
                applied: shared.applied.borrow().get(&partition).copied(),
                outbox_full: (keys >= max).then_some((keys, max)),
            });
        };
        match outcome {
            Outcome::Applied => Ok(()),
            Outcome::Refused(why) => Err(ApiError::Refused(why)),
            Outcome::Forgotten => Err(ApiError::OutcomeForgotten { partition, offset }),
            Outcome::Moved => {
                tracing::info!(
                    partition,
                    offset,
                    "a write's partition moved to another node before this node applied it"
                );
                Err(ApiError::MovedBeforeApplied { partition, offset })
            }
        }
    }

    /// `BatchGet`: the keys of this node's partitions read here, the others asked of their
    /// owners (one request per owner).
    async fn batch_get_routed(
        &self,
        keys: Vec<String>,
        window: Option<pb::WindowSelector>,
        routed: bool,
    ) -> Result<pb::BatchGetResponse, ApiError> {
        let mut here = Vec::new();
        let mut elsewhere: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for key in keys {
            match self.route(&key, routed).await? {
                None => here.push(key),
                Some(node) => elsewhere.entry(node).or_default().push(key),
            }
        }
        // RocksDB reads: off the async threads (the lease group's Raft runs there)
        let handler = self.clone();
        let selector = window;
        let mut out = tokio::task::spawn_blocking(move || {
            let mut out = pb::BatchGetResponse::default();
            for key in here {
                match handler.read_values(&key, selector.as_ref()) {
                    Ok(v) => out.values.extend(v),
                    Err(ApiError::NotFound { .. }) => out.missing.push(key),
                    Err(e) => return Err(e),
                }
            }
            Ok(out)
        })
        .await
        .unwrap_or_else(|e| Err(ApiError::Internal(e.to_string())))?;
        for (node, keys) in elsewhere {
            let request = pb::BatchGetRequest { keys, window };
            let (mut client, request) = self.node_client(&node, request)?;
            let answer = self
                .routed_answer(node, client.batch_get(request).await)
                .await?;
            out.values.extend(answer.values);
            out.missing.extend(answer.missing);
        }
        Ok(out)
    }

    /// The other nodes of this region owning some partition, each once; a partition no
    /// node owns (it moves) fails the call: a page without its keys would look complete.
    async fn other_owners(&self, key: &str) -> Result<BTreeSet<String>, ApiError> {
        let mut nodes = BTreeSet::new();
        for &partition in &self.0.partitions {
            if self.0.shared.owned.borrow().contains(&partition) {
                continue;
            }
            match self.owner_of(partition).await {
                Some(node) => {
                    nodes.insert(node);
                }
                None => {
                    return Err(ApiError::NotOwner {
                        key: key.to_string(),
                        partition,
                        owner: None,
                    });
                }
            }
        }
        Ok(nodes)
    }

    /// A page of `Scan`: this node's partitions read here; unless the request was routed
    /// here, the same page asked of every other owner, the pages merged in key order and
    /// cut to the limit (each owner's first `limit` keys after the token hold the merged
    /// page's).
    async fn scan(&self, req: pb::ScanRequest, routed: bool) -> Result<pb::ScanResponse, ApiError> {
        let limit = match req.limit as usize {
            0 => SCAN_DEFAULT_LIMIT,
            n => n.min(SCAN_MAX_LIMIT),
        };
        // a token is the last key of the page before: under the prefix, or not ours
        if !req.page_token.is_empty()
            && (!req.page_token.starts_with(&req.prefix)
                || req.page_token.len() > self.0.config.ingest.max_key_bytes)
        {
            return Err(ApiError::InvalidArgument(format!(
                "page_token {:?} is not a key under prefix {:?}: pass back the next_page_token of the page before",
                req.page_token.chars().take(64).collect::<String>(),
                req.prefix
            )));
        }
        let others = if routed {
            BTreeSet::new()
        } else {
            self.other_owners(&req.prefix).await?
        };
        // never from a copy of a partition this node does not own
        let owned = self.0.shared.owned.borrow().clone();
        let (handler, request, read) = (self.clone(), req.clone(), owned.clone());
        let mut values =
            tokio::task::spawn_blocking(move || handler.scan_here(&read, &request, limit))
                .await
                .map_err(|e| ApiError::Internal(e.to_string()))??;
        let mut covered = owned;
        for node in others {
            let (mut client, request) = self.node_client(&node, req.clone())?;
            let theirs = self.routed_answer(node, client.scan(request).await).await?;
            values.extend(theirs.values);
            covered.extend(theirs.partitions);
        }
        // routes a moment old may miss a partition that just moved: a page without its
        // keys would look complete
        if !routed && let Some(&partition) = self.0.partitions.iter().find(|p| !covered.contains(p))
        {
            return Err(ApiError::NotOwner {
                key: req.prefix,
                partition,
                owner: None,
            });
        }
        // by key, a windowed key's windows oldest first: the first `limit` keys
        values.sort_by(|a, b| a.key.cmp(&b.key));
        let values = first_keys(values, limit);
        let next_page_token = if count_keys(&values) == limit {
            values.last().map(|v| v.key.clone()).unwrap_or_default()
        } else {
            String::new()
        };
        Ok(pb::ScanResponse {
            values,
            next_page_token,
            partitions: covered.into_iter().collect(),
        })
    }

    /// This node's part of a `Scan` page: the first `limit` keys under the prefix after
    /// the token in `partitions`, each read as a `Get` reads it (a windowed key once, from
    /// its slices, with the request's windows).
    fn scan_here(
        &self,
        partitions: &BTreeSet<i32>,
        req: &pb::ScanRequest,
        limit: usize,
    ) -> Result<Vec<pb::Value>, ApiError> {
        let namespaces = &self.0.config.namespaces;
        let windowed = |key: &str| namespaces.lookup(key).and_then(|ns| ns.window).is_some();
        // after a windowed key: after every slice of it
        let mut after = match req.page_token.as_str() {
            "" => None,
            token if windowed(token) => Some(window::slice_key(token, u64::MAX)),
            token => Some(token.to_owned()),
        };
        let mut keys: Vec<(String, Option<CrdtValue>)> = Vec::new();
        loop {
            let page = self
                .0
                .store
                .scan_in(partitions, &req.prefix, after.as_deref(), limit)?;
            let full = page.len() == limit;
            after = page.last().map(|(k, _)| k.clone());
            for (stored, value) in page {
                let (home, slice) = window::split_slice_key(&stored);
                if slice.is_some() && windowed(home) {
                    if keys.last().is_none_or(|(k, _)| k != home) {
                        keys.push((home.to_owned(), None));
                    }
                } else {
                    keys.push((stored, Some(value)));
                }
            }
            if !full || keys.len() >= limit {
                break;
            }
        }
        keys.truncate(limit);
        let mut values = Vec::with_capacity(keys.len());
        for (key, stored) in keys {
            match stored {
                Some(v) => values.push(convert::value(&key, v.crdt_type(), Some(&v))?),
                None => values.extend(self.read_values(&key, req.window.as_ref())?),
            }
        }
        Ok(values)
    }

    async fn status(&self) -> Result<pb::StatusResponse, ApiError> {
        let api = &self.0;
        let applied = api.shared.applied.borrow().clone();
        let ends = api
            .end_offsets(
                &api.config.kafka,
                &api.config.kafka.updates_topic,
                api.partitions.clone(),
            )
            .await;
        let owned: Vec<i32> = api.shared.owned.borrow().iter().copied().collect();
        let partitions = partition_status(&owned, &applied, ends.as_ref());
        let freshness = api.freshness.newest(&owned.iter().copied().collect());
        let mut remotes = Vec::with_capacity(api.remotes.len());
        for progress in &api.remotes {
            let remote = &progress.remote;
            let kafka = remote.kafka(&api.config.kafka);
            let parts = progress.partitions.borrow().clone();
            let ends = api.end_offsets(&kafka, &remote.topic, parts.clone()).await;
            let fresh = freshness.get(&remote.region);
            remotes.push(pb::RemoteStatus {
                region: remote.region.to_string(),
                topic: remote.topic.clone(),
                partitions: partition_status(&parts, &progress.offsets.borrow(), ends.as_ref()),
                applied: fresh.map(|f| convert::hlc(f.applied)),
                lag_ms: fresh.map_or(0, |f| f.lag.as_millis() as u64),
                deltas_merged: progress.merged.load(std::sync::atomic::Ordering::Relaxed),
                deltas_refused: progress.refused.load(std::sync::atomic::Ordering::Relaxed),
                caught_up: *progress.caught_up.borrow(),
                heard_from_all_since_nanos: progress.heard_from_all_since().unwrap_or(0),
            });
        }
        Ok(pb::StatusResponse {
            region: api.config.region.to_string(),
            incarnation: api.incarnation,
            updates_topic: api.config.kafka.updates_topic.clone(),
            partitions,
            events_applied: api
                .shared
                .events_applied
                .load(std::sync::atomic::Ordering::Relaxed),
            events_dead_lettered: api
                .shared
                .events_dead_lettered
                .load(std::sync::atomic::Ordering::Relaxed),
            remotes,
            checkpoint: Some(self.checkpoint_status()),
            owned_partitions: owned,
            node: api.address.clone(),
            functions: api.functions.iter().map(|f| f.status()).collect(),
        })
    }

    fn checkpoint_status(&self) -> pb::CheckpointStatus {
        let status = &self.0.checkpoint_status;
        let last = status
            .last
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        pb::CheckpointStatus {
            last_id: last.as_ref().map(|l| l.id.clone()).unwrap_or_default(),
            last_age_ms: last.as_ref().map_or(0, |l| {
                (self.0.hlc.physical().now_nanos() / 1_000_000).saturating_sub(l.unix_ms)
            }),
            last_duration_ms: last.as_ref().map_or(0, |l| l.duration.as_millis() as u64),
            last_bytes_uploaded: last.as_ref().map_or(0, |l| l.bytes_uploaded),
            taken: status.taken.load(std::sync::atomic::Ordering::Relaxed),
            failures: status.failures.load(std::sync::atomic::Ordering::Relaxed),
            restored_from: status.restored_from.clone().unwrap_or_default(),
            target: status.target.clone(),
        }
    }

    async fn checkpoint(&self) -> Result<pb::CheckpointResponse, ApiError> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.0
            .checkpoints
            .send(reply)
            .await
            .map_err(|_| ApiError::Stopping)?;
        let taken = answer
            .await
            .map_err(|_| ApiError::Stopping)?
            .map_err(|source| ApiError::Checkpoint {
                what: "checkpoint",
                source,
            })?;
        Ok(pb::CheckpointResponse {
            id: taken.id,
            manifest: taken.manifest,
            files: taken.files as u64,
            bytes_total: taken.bytes_total,
            bytes_uploaded: taken.bytes_uploaded,
            duration_ms: taken.duration.as_millis() as u64,
        })
    }

    fn leases(&self) -> Result<&Arc<Leases>, ApiError> {
        self.0.leases.as_ref().ok_or_else(|| {
            ApiError::Precondition("this node has no [lease] section: no owned shards".into())
        })
    }

    /// The key's partition and the node of this region owning it (UNAVAILABLE while it
    /// moves and no node owns it).
    async fn locate(&self, req: pb::RouteRequest) -> Result<pb::RouteResponse, ApiError> {
        if req.key.is_empty() {
            return Err(ApiError::InvalidArgument("key is empty".into()));
        }
        let api = &self.0;
        let partition = self.partition_of(&req.key);
        let node = match self.owner_of(partition).await {
            None if api.shared.owned.borrow().contains(&partition) => api.address.clone(),
            Some(owner) => owner,
            None => {
                return Err(ApiError::NotOwner {
                    key: req.key,
                    partition,
                    owner: None,
                });
            }
        };
        Ok(pb::RouteResponse {
            partition,
            key: req.key,
            partitions: i32::try_from(api.partitions.len()).unwrap_or(i32::MAX),
            region: api.config.region.to_string(),
            node,
        })
    }

    /// Every shard, or (`key` set) the shard of an owned key.
    async fn list_leases(&self, req: pb::LeasesRequest) -> Result<pb::LeasesResponse, ApiError> {
        let leases = self.leases()?;
        let mut shards = leases.status();
        if !req.key.is_empty() {
            let owned = self
                .0
                .config
                .namespaces
                .lookup(&req.key)
                .is_some_and(|ns| ns.ownership == Ownership::Owned);
            let shard = leases.config().shard_of_key(&req.key);
            shards.retain(|s| owned && s.shard == shard);
        }
        Ok(pb::LeasesResponse {
            region: self.0.config.region.to_string(),
            shards: shards.iter().map(shard_lease).collect(),
            leader: leases.leader().unwrap_or(0),
            term: leases.term(),
            clocks: leases
                .clock_readings()
                .into_iter()
                .map(|(member, r)| pb::MemberClock {
                    member,
                    offset_micros: r.offset / 1_000,
                    uncertainty_micros: r.uncertainty / 1_000,
                })
                .collect(),
        })
    }

    async fn transfer_lease(
        &self,
        req: pb::TransferLeaseRequest,
    ) -> Result<pb::TransferLeaseResponse, ApiError> {
        let leases = self.leases()?;
        let to = crate::crdt::RegionId::new(req.to_region)
            .map_err(|e| ApiError::InvalidArgument(format!("to_region: {e}")))?;
        let moved = leases.transfer(req.shard, to).await?;
        Ok(pb::TransferLeaseResponse {
            lease: Some(shard_lease(&moved)),
        })
    }

    async fn savepoint(&self) -> Result<pb::SavepointResponse, ApiError> {
        let api = &self.0;
        let written = checkpoint::savepoint::write(
            &api.config,
            &api.store,
            &api.objects,
            api.incarnation,
            api.hlc.physical().as_ref(),
        )
        .await
        .map_err(|source| ApiError::Checkpoint {
            what: "savepoint",
            source,
        })?;
        Ok(pb::SavepointResponse {
            id: written.id,
            location: written.location,
            entries: written.entries,
            bytes: written.bytes,
        })
    }
}

/// Applied and end offsets per partition (`-1` where unknown).
/// The values of the first `limit` keys of `values` (sorted by key; a windowed key may
/// have several).
fn first_keys(mut values: Vec<pb::Value>, limit: usize) -> Vec<pb::Value> {
    let mut keys = 0;
    let mut end = values.len();
    for (i, v) in values.iter().enumerate() {
        if i == 0 || values[i - 1].key != v.key {
            keys += 1;
        }
        if keys > limit {
            end = i;
            break;
        }
    }
    values.truncate(end);
    values
}

/// How many keys `values` (sorted by key) hold.
fn count_keys(values: &[pb::Value]) -> usize {
    values
        .iter()
        .enumerate()
        .filter(|(i, v)| *i == 0 || values[i - 1].key != v.key)
        .count()
}

fn partition_status(
    partitions: &[i32],
    applied: &BTreeMap<i32, i64>,
    ends: Option<&BTreeMap<i32, i64>>,
) -> Vec<pb::PartitionStatus> {
    partitions
        .iter()
        .map(|&p| {
            let applied_offset = applied.get(&p).copied().unwrap_or(-1);
            let end_offset = ends.and_then(|e| e.get(&p).copied()).unwrap_or(-1);
            pb::PartitionStatus {
                partition: p,
                applied_offset,
                end_offset,
                lag: if end_offset < 0 {
                    -1
                } else {
                    (end_offset - applied_offset - 1).max(0)
                },
            }
        })
        .collect()
}

#[tonic::async_trait]
impl State for Handler {
    async fn update(
        &self,
        req: Request<pb::UpdateRequest>,
    ) -> Result<Response<pb::UpdateResponse>, Status> {
        let started = Instant::now();
        let forwarded = req.metadata().contains_key(FORWARDED);
        let routed = req.metadata().contains_key(ROUTED);
        observe(
            "update",
            started,
            Handler::update(self, req.into_inner(), forwarded, routed).await,
        )
        .map(Response::new)
    }

    async fn get(&self, req: Request<pb::GetRequest>) -> Result<Response<pb::Value>, Status> {
        let started = Instant::now();
        let routed = req.metadata().contains_key(ROUTED);
        let req = req.into_inner();
        let read = match self.route(&req.key, routed).await {
            Ok(Some(node)) => match self.node_client(&node, req) {
                Ok((mut client, request)) => {
                    let answer = client.get(request).await;
                    self.routed_answer(node, answer).await
                }
                Err(e) => Err(e),
            },
            Ok(None) if req.leaseholder => self.read_at_holder(&req.key).await,
            Ok(None) => self.read(&req.key, req.window.as_ref()),
            Err(e) => Err(e),
        };
        observe("get", started, read).map(Response::new)
    }

    async fn batch_get(
        &self,
        req: Request<pb::BatchGetRequest>,
    ) -> Result<Response<pb::BatchGetResponse>, Status> {
        let started = Instant::now();
        let routed = req.metadata().contains_key(ROUTED);
        let pb::BatchGetRequest { keys, window } = req.into_inner();
        let max = self.0.config.api.max_batch_keys;
        let result = if keys.len() > max {
            Err(ApiError::TooMuch(format!(
                "BatchGet asks for {} keys; api.max-batch-keys is {max}",
                keys.len()
            )))
        } else {
            self.batch_get_routed(keys, window, routed).await
        };
        observe("batch_get", started, result).map(Response::new)
    }

    async fn scan(
        &self,
        req: Request<pb::ScanRequest>,
    ) -> Result<Response<pb::ScanResponse>, Status> {
        let started = Instant::now();
        let routed = req.metadata().contains_key(ROUTED);
        let page = Handler::scan(self, req.into_inner(), routed).await;
        observe("scan", started, page).map(Response::new)
    }

    type WatchStream = ReceiverStream<Result<pb::Value, Status>>;

    /// This node's changes under the prefix and, unless the request was routed here, every
    /// other owner's (a routed `Watch` to each, merged). Partitions moving between the
    /// region's nodes end the stream with `UNAVAILABLE` (this node's owned set or the other
    /// owners changed, or another owner's stream ended): a moving partition's changes may
    /// be missed, so the client scans and watches again rather than miss them silently.
    async fn watch(
        &self,
        req: Request<pb::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let routed = req.metadata().contains_key(ROUTED);
        let prefix = req.into_inner().prefix;
        let max = self.0.config.api.max_watchers;
        // the count includes this node's own internal receivers: none today
        if self.0.shared.changes.receiver_count() >= max {
            return Err(ApiError::TooMuch(format!(
                "{max} Watch streams are open; api.max-watchers is {max}"
            ))
            .into());
        }
        let mut changes = self.0.shared.changes.subscribe();
        let mut stop = self.0.stop.clone();
        let owned = self.0.shared.owned.borrow().clone();
        let others = if routed {
            BTreeSet::new()
        } else {
            self.other_owners(&prefix).await?
        };
        // every other owner's values, and an error when its stream ends
        let (theirs, mut from_others) = mpsc::channel(WATCH_QUEUE);
        let mut upstreams = tokio::task::JoinSet::new();
        for node in &others {
            let (mut client, request) = self
                .node_client(
                    node,
                    pb::WatchRequest {
                        prefix: prefix.clone(),
                    },
                )
                .map_err(Status::from)?;
            let mut stream = client
                .watch(request)
                .await
                .map_err(|status| {
                    Status::from(ApiError::Routed {
                        node: node.clone(),
                        status,
                    })
                })?
                .into_inner();
            let theirs = theirs.clone();
            upstreams.spawn(async move {
                while let Ok(Some(value)) = stream.message().await {
                    if theirs.send(Ok(value)).await.is_err() {
                        return;
                    }
                }
                let _ = theirs
                    .send(Err(failed("Watch", ApiError::WatchMoved)))
                    .await;
            });
        }
        drop(theirs);
        let handler = self.clone();
        let mut check = tokio::time::interval(WATCH_OWNERS_EVERY);
        // per owned partition, the lowest watermark over the regions when last looked:
        // windows that close as it rises are reported final
        let windowed =
            (self.0.config.namespaces.iter()).any(|ns| ns.window.is_some() && ns.overlaps(&prefix));
        // RocksDB reads: off the async threads
        let (reader, partitions) = (self.clone(), owned.clone());
        let mut lowest = tokio::task::spawn_blocking(move || {
            let mut lowest: BTreeMap<i32, Option<u64>> = BTreeMap::new();
            for p in partitions.into_iter().filter(|_| windowed) {
                lowest.insert(p, reader.watermarks(p)?.lowest);
            }
            Ok::<_, ApiError>(lowest)
        })
        .await
        .map_err(|e| Status::from(ApiError::Internal(e.to_string())))??;
        // one slot more than the queue: the reason a watcher is cut off always fits
        let (tx, rx) = mpsc::channel(WATCH_QUEUE + 1);
        tokio::spawn(async move {
            let _upstreams = upstreams;
            loop {
                let next = tokio::select! {
                    () = stopped(&mut stop) => return,
                    next = changes.recv() => next,
                    Some(value) = from_others.recv() => {
                        let ended = value.is_err();
                        if !watched(&tx, value) || ended {
                            return;
                        }
                        continue;
                    }
                    _ = check.tick() => {
                        let now_others = if routed {
                            Ok(BTreeSet::new())
                        } else {
                            handler.other_owners(&prefix).await
                        };
                        let moved = *handler.0.shared.owned.borrow() != owned
                            || now_others.is_ok_and(|now| now != others);
                        if moved {
                            let _ = tx.try_send(Err(failed("Watch", ApiError::WatchMoved)));
                            return;
                        }
                        if lowest.is_empty() {
                            continue;
                        }
                        let (reader, prefix, seen) = (handler.clone(), prefix.clone(), lowest.clone());
                        let closed = tokio::task::spawn_blocking(move || reader.windows_closed_since(&prefix, seen))
                            .await
                            .unwrap_or_else(|e| windows::Closed {
                                risen: BTreeMap::new(),
                                values: vec![Err(ApiError::Internal(e.to_string()))],
                            });
                        lowest.extend(closed.risen);
                        for value in closed.values {
                            if !watched(&tx, value.map_err(|e| failed("Watch", e))) {
                                return;
                            }
                        }
                        continue;
                    }
                };
                let batch = match next {
                    Ok(batch) => batch,
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                        let behind = ApiError::WatcherBehind { batches: n };
                        let _ = tx.send(Err(failed("Watch", behind))).await;
                        return;
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                };
                let mut windows = Vec::new();
                for (key, state) in batch.iter().filter(|(k, _)| k.starts_with(&prefix)) {
                    if let (home, Some(slice)) = window::split_slice_key(key) {
                        windows.push((home.to_owned(), slice));
                        continue;
                    }
                    let value = convert::value(key, state.crdt_type(), Some(state))
                        .map_err(|e| failed("Watch", e));
                    if !watched(&tx, value) {
                        return;
                    }
                }
                if windows.is_empty() {
                    continue;
                }
                // a slice changed: its key's newest window holding it, read whole
                let reader = handler.clone();
                let values = tokio::task::spawn_blocking(move || reader.changed_windows(windows))
                    .await
                    .unwrap_or_else(|e| vec![Err(ApiError::Internal(e.to_string()))]);
                for value in values {
                    if !watched(&tx, value.map_err(|e| failed("Watch", e))) {
                        return;
                    }
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// Queues `value` for a watcher; false once the stream is over: the client went away, or
/// it left the queue full and is cut off (never buffered for), told why.
fn watched(tx: &mpsc::Sender<Result<pb::Value, Status>>, value: Result<pb::Value, Status>) -> bool {
    if tx.capacity() <= 1 {
        metrics::counter!(m::WATCHERS_DROPPED).increment(1);
        let unread = ApiError::TooMuch(format!(
            "this watcher left {WATCH_QUEUE} values unread; scan and watch again"
        ));
        let _ = tx.try_send(Err(failed("Watch", unread)));
        return false;
    }
    tx.try_send(value).is_ok()
}

#[tonic::async_trait]
impl Admin for Handler {
    async fn status(
        &self,
        _req: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusResponse>, Status> {
        let started = Instant::now();
        observe("status", started, Handler::status(self).await).map(Response::new)
    }

    async fn checkpoint(
        &self,
        _req: Request<pb::CheckpointRequest>,
    ) -> Result<Response<pb::CheckpointResponse>, Status> {
        let started = Instant::now();
        observe("checkpoint", started, Handler::checkpoint(self).await).map(Response::new)
    }

    async fn savepoint(
        &self,
        _req: Request<pb::SavepointRequest>,
    ) -> Result<Response<pb::SavepointResponse>, Status> {
        let started = Instant::now();
        observe("savepoint", started, Handler::savepoint(self).await).map(Response::new)
    }

    async fn leases(
        &self,
        req: Request<pb::LeasesRequest>,
    ) -> Result<Response<pb::LeasesResponse>, Status> {
        let started = Instant::now();
        let listed = Handler::list_leases(self, req.into_inner()).await;
        observe("leases", started, listed).map(Response::new)
    }

    async fn route(
        &self,
        req: Request<pb::RouteRequest>,
    ) -> Result<Response<pb::RouteResponse>, Status> {
        let started = Instant::now();
        observe(
            "route",
            started,
            Handler::locate(self, req.into_inner()).await,
        )
        .map(Response::new)
    }

    async fn transfer_lease(
        &self,
        req: Request<pb::TransferLeaseRequest>,
    ) -> Result<Response<pb::TransferLeaseResponse>, Status> {
        let started = Instant::now();
        observe(
            "transfer_lease",
            started,
            Handler::transfer_lease(self, req.into_inner()).await,
        )
        .map(Response::new)
    }
}

fn shard_lease(s: &ShardStatus) -> pb::ShardLease {
    pb::ShardLease {
        shard: s.shard,
        home: s.home.as_ref().map(|r| r.to_string()).unwrap_or_default(),
        prefix: s.prefix.clone().unwrap_or_default(),
        holder: s
            .lease
            .as_ref()
            .map(|l| l.holder.to_string())
            .unwrap_or_default(),
        epoch: s.lease.as_ref().map_or(0, |l| l.epoch),
        expires_in_ms: s.expires_in_ms,
        held_here: s.held_here.is_some(),
    }
}
