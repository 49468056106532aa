//! Wiring only, in four steps:
//!
//! ```text
//!  open   data dir ─► restore if empty ─► store ─► clock ─► incarnation (none: merge
//!         this region's own deltas topic first)
//!  spawn  lease member + manager, the region's group member and the partition keeper
//!         (it takes the partitions the group assigns: fence, catch up, ship), then a
//!         merger per remote, ingest, checkpointer, metrics, lag ─► one task set
//!         (`supervise::Tasks`) ─► the API's parts
//!  serve  (rebuilt node: every remote topic read first) gRPC until shutdown or a task ends
//!  stop   signal ─► gRPC drains (grace) ─► the node leaves the group (its partitions
//!         handed off; first, before the drain, where other nodes share the region)
//!         ─► tasks finish or abort ─► lease member stops
//! ```

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::api::{self, Api};
use crate::checkpoint::objects::Objects;
use crate::checkpoint::{self, CheckpointError, CheckpointStatus, Checkpointer};
use crate::clock::{Clock, Hlc, ShiftedClock, SystemClock};
use crate::config::Config;
use crate::crdt::Actor;
use crate::ingest::idle::IdleWatermarks;
use crate::ingest::ingestor::Ingestor;
use crate::keeper::{Copies, Keeper, Standby, group_id};
use crate::lease::leases::Leases;
use crate::lease::member::{Member, MemberError};
use crate::lease::network::Channels;
use crate::log::membership::{Membership, MembershipSpec};
use crate::log::{self, LogError};
use crate::metrics as m;
use crate::partition::Partitions;
use crate::replication::bootstrap::{self, BootstrapError};
use crate::replication::merger::Merger;
use crate::replication::{Freshness, RemoteProgress};
use crate::security::tls::incoming;
use crate::security::{ApiPolicy, Guard, Listener, Tls};
use crate::shutdown::stopped;
use crate::store::{Store, StoreError};
use crate::supervise::{OnStop, Tasks};

/// How long shutdown waits for gRPC clients to finish and disconnect.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);
/// Longest a learner waits for its lease table to be current before it joins the
/// region's group.
const LEARNER_CATCH_UP: Duration = Duration::from_secs(30);
/// How long the region's group waits for a silent node before it moves its partitions.
const GROUP_SESSION_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest shutdown waits for the node to leave the group (its partitions handed off).
const LEAVE_WAIT: Duration = Duration::from_secs(20);

/// The node's bound sockets; tests bind port 0 and read the addresses back.
pub struct Listeners {
    pub grpc: TcpListener,
    pub metrics: TcpListener,
}

impl Listeners {
    pub async fn bind(config: &Config) -> std::io::Result<Self> {
        Ok(Self {
            grpc: TcpListener::bind(config.api.grpc_listen).await?,
            metrics: TcpListener::bind(config.api.metrics_listen).await?,
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("cannot create data dir {path}: {source}")]
    DataDir {
        path: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Log(#[from] LogError),
    #[error("bootstrap from the deltas topics: {0}")]
    Bootstrap(#[from] BootstrapError),
    #[error("restore: {0}")]
    Checkpoint(#[from] CheckpointError),
    #[error("grpc server: {0}")]
    Grpc(#[from] tonic::transport::Error),
    #[error("grpc listener: {0}")]
    Listener(std::io::Error),
    #[error("task failed: {0}")]
    Join(#[from] tokio::task::JoinError),
    #[error(transparent)]
    Lease(#[from] MemberError),
    #[error("tls: {0}")]
    Tls(#[from] crate::security::TlsError),
    #[error("api.auth: {0}")]
    Auth(String),
    #[error("pricing.function: {0}")]
    Function(String),
    #[error("{0}")]
    TaskEnded(String),
    #[error(
        "{topic} has {found} partitions, the updates topic {expected}: a region's updates and deltas topics and every mirrored deltas topic need the same partition count (a key's partition is the same in all of them)"
    )]
    PartitionCounts {
        topic: String,
        found: usize,
        expected: usize,
    },
}

/// Where the lease group member keeps its Raft log: beside the data dir, not in it (the
/// data dir is RocksDB's, and restores replace it).
pub fn raft_dir(data_dir: &std::path::Path) -> std::path::PathBuf {
    let mut dir = data_dir.as_os_str().to_owned();
    dir.push(".raft");
    dir.into()
}

/// The incarnation a node with no incarnation of its own takes: seconds since the Unix
/// epoch when its state was created. A region's later incarnations are therefore greater
/// than its earlier ones (unless the clock went back across a disk loss), and none reuses
/// an old actor whose entries would absorb new increments.
pub fn new_incarnation(clock: &dyn Clock) -> u32 {
    u32::try_from(clock.now_nanos() / 1_000_000_000)
        .unwrap_or(u32::MAX)
        .max(1)
}

/// Runs one region node until `shutdown` completes or a part fails: open its state, spawn
/// its tasks, serve until asked to stop or a task ends, then stop in one sequence.
pub async fn run(
    config: Config,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), NodeError> {
    // first: a metric recorded before the recorder exists is lost (a gauge set once on a
    // change, such as the clock check's, would never show)
    let recorder = m::install(&crate::ingest::event::Rejection::DEAD_LETTER_CODES);
    let address = match &config.api.advertise {
        Some(a) => a.clone(),
        None => listeners
            .grpc
            .local_addr()
            .map_err(NodeError::Listener)?
            .to_string(),
    };
    let opened = open(Arc::new(config)).await?;
    let running = opened.spawn(listeners.metrics, recorder, address).await?;
    running.serve(listeners.grpc, shutdown).await
}

/// A node's state, opened: the store (restored first if empty and so configured), its
/// clocks, and the incarnation it writes under.
struct Opened {
    config: Arc<Config>,
    clock: Arc<dyn Clock>,
    objects: Objects,
    store: Arc<Store>,
    /// The updates topic's partitions.
    partitions: Vec<i32>,
    hlc: Arc<Hlc>,
    incarnation: u32,
    /// The node had no incarnation: it rebuilt itself from its own deltas topic, and
    /// serves only once it holds what the other regions wrote.
    bootstrapping: bool,
    /// Its listeners' and clients' TLS (`None`: plaintext).
    tls: Option<Tls>,
}

async fn open(config: Arc<Config>) -> Result<Opened, NodeError> {
    // first: a certificate that does not load stops the node before it touches anything
    let tls = config.tls.as_ref().map(Tls::load).transpose()?;
    std::fs::create_dir_all(&config.data_dir).map_err(|source| NodeError::DataDir {
        path: config.data_dir.display().to_string(),
        source,
    })?;
    let clock = wall_clock(&config);
    let objects = Objects::connect(&config.checkpoint.target).await;
    if config.checkpoint.restore_on_empty && checkpoint::is_empty_dir(&config.data_dir)? {
        restore_newest(&config, &objects).await?;
    }
    // a key's partition depends on the count: the store has one instance per partition
    let partitions = log::partitions(&config.kafka, &config.kafka.updates_topic).await?;
    let (data_dir, count) = (config.data_dir.clone(), partitions.len());
    let store =
        Arc::new(tokio::task::spawn_blocking(move || Store::open(&data_dir, count)).await??);
    let remotes = config.replication.remotes.iter().map(|r| r.region.clone());
    store.expire_with(remotes.collect(), config.namespaces.expiry());
    let hlc = Arc::new(Hlc::new(clock.clone(), config.max_clock_offset));
    if let Some(high_water) = store.hlc_high_water()? {
        hlc.advance_past(high_water);
    }
    let (incarnation, bootstrapping) = match store.incarnation()? {
        Some(i) => (i, false),
        None => (
            bootstrap_own_past(&config, &clock, &hlc, &store).await?,
            true,
        ),
    };
    Ok(Opened {
        config,
        clock,
        objects,
        store,
        partitions,
        hlc,
        incarnation,
        bootstrapping,
        tls,
    })
}

/// The node's wall clock: the system's, shifted if `clock-offset` is set.
fn wall_clock(config: &Config) -> Arc<dyn Clock> {
    match config.clock_offset_nanos {
        0 => Arc::new(SystemClock),
        offset_nanos => {
            tracing::warn!(
                offset_ms = offset_nanos / 1_000_000,
                "clock-offset: this node's wall clock is shifted on purpose"
            );
            Arc::new(ShiftedClock { offset_nanos })
        }
    }
}

/// An empty data dir takes the newest checkpoint, if there is one.
async fn restore_newest(config: &Config, objects: &Objects) -> Result<(), NodeError> {
    let started = std::time::Instant::now();
    match checkpoint::restore(config, objects, None, None).await {
        Ok(manifest) => {
            let bytes: u64 = manifest.files.iter().map(|f| f.bytes).sum();
            tracing::info!(checkpoint = %manifest.id, files = manifest.files.len(), bytes, took_ms = started.elapsed().as_millis() as u64, "empty data dir: restored the newest checkpoint");
            Ok(())
        }
        Err(CheckpointError::NoCheckpoint(at)) => {
            tracing::info!(%at, "empty data dir and no checkpoint: rebuilding from the deltas topics");
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

/// A store with no incarnation (empty or restored) merges its region's own deltas topic,
/// then takes an incarnation above every earlier one. What it read is a consistent prefix
/// (each round's deltas and resume point commit together); each partition this node is
/// assigned is caught up again after its shipping producer fenced the previous owner
/// (`keeper`).
async fn bootstrap_own_past(
    config: &Arc<Config>,
    clock: &Arc<dyn Clock>,
    hlc: &Arc<Hlc>,
    store: &Arc<Store>,
) -> Result<u32, NodeError> {
    let started = std::time::Instant::now();
    let recovered = bootstrap::recover_own_past(config, hlc, store).await?;
    let last = recovered.writers.last().copied().unwrap_or(0);
    let incarnation = new_incarnation(clock.as_ref()).max(last.saturating_add(1));
    tracing::info!(
        deltas = recovered.deltas,
        superseded = recovered.superseded,
        keys = recovered.keys,
        resume = ?recovered.resume.as_ref().map(|r| &r.updates_offsets),
        last_incarnation = last,
        incarnation,
        took_ms = started.elapsed().as_millis() as u64,
        "no incarnation (empty or restored data dir): merged this region's own deltas topic"
    );
    // a node that bootstraps after this one must take a greater incarnation: two nodes
    // of one actor defeat the discard rule (`bootstrap::catch_up`), and the wall clock
    // gives the same second to both (capped, for a clock far behind `last`)
    let waited = std::time::Instant::now();
    while new_incarnation(clock.as_ref()) <= incarnation && waited.elapsed() < INCARNATION_WAIT {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // last: a crash before this line bootstraps again (merging is idempotent)
    store.set_incarnation(incarnation)?;
    Ok(incarnation)
}

/// Longest a bootstrapping node waits for the wall clock to pass its incarnation's second.
const INCARNATION_WAIT: Duration = Duration::from_secs(2);

/// A node whose tasks run: what it serves, and what stopping it takes.
struct Running {
    api: Api,
    tasks: Tasks,
    stop: watch::Sender<bool>,
    member: Option<Member>,
    group: Membership,
    bootstrapping: bool,
}

impl Opened {
    /// Starts the lease group member and every long-running task, and builds the API.
    async fn spawn(
        self,
        metrics: TcpListener,
        recorder: Option<PrometheusHandle>,
        address: String,
    ) -> Result<Running, NodeError> {
        let Opened {
            config,
            store,
            partitions,
            ..
        } = &self;
        self.check_topics().await?;
        let owned = Arc::new(Partitions::default());
        tracing::info!(region = %config.region, incarnation = self.incarnation, partitions = partitions.len(), "node starting");
        let (stop, stop_rx) = watch::channel(false);
        let mut tasks = Tasks::default();
        // The lease group member and this region's leases run from here on, bootstrap or
        // not.
        let (member, leases, kafka) = self.start_leases(&mut tasks, &owned, &stop_rx).await?;
        self.learner_catches_up(member.as_ref()).await;
        crate::keeper::warm_copies(config, &self.hlc, store, partitions).await?;
        let freshness = Arc::new(Freshness::default());
        let group = self
            .join_group(&mut tasks, &owned, &freshness, &address, &stop_rx)
            .await?;
        let remotes =
            self.spawn_mergers(&mut tasks, &owned, &freshness, partitions.len(), &stop_rx)?;
        self.spawn_ingest(&mut tasks, &owned, &remotes, &leases, &stop_rx)?;
        let (checkpoints, checkpoint_status) =
            self.spawn_checkpointer(&mut tasks, &owned, &stop_rx)?;
        // the API's and the metrics' (other regions' APIs are served alike)
        let tls = self.tls.clone().filter(|_| !config.api.plaintext);
        self.spawn_reporting(&mut tasks, metrics, recorder, &tls, &stop_rx);
        let gauges = report_gauges(
            config.clone(),
            self.store.clone(),
            owned.clone(),
            remotes.clone(),
            self.clock.clone(),
            stop_rx.clone(),
        );
        tasks.spawn("the gauge reporter", OnStop::Abort, returns(gauges));
        let members = config.lease.iter().flat_map(|l| l.members.values());
        let members = members.map(|m| m.name().to_owned()).collect();
        let limits = config.api.limits.clone();
        let policy =
            ApiPolicy::new(config.api.auth.clone(), members, limits).map_err(NodeError::Auth)?;
        let functions = self.spawn_function_checks(&mut tasks)?;
        let bootstrapping = self.bootstrapping;
        let api = Api {
            functions,
            // a write Kafka cannot take within 10 s is answered UNAVAILABLE
            producer: log::RenewingProducer::new(&config.kafka, Duration::from_secs(10))?,
            config: config.clone(),
            incarnation: self.incarnation,
            hlc: self.hlc.clone(),
            store: store.clone(),
            owned: owned.clone(),
            partitions: partitions.clone(),
            address,
            stop: stop_rx.clone(),
            freshness,
            remotes,
            checkpoints,
            checkpoint_status,
            objects: self.objects.clone(),
            leases,
            kafka,
            peers: Channels::new(tls.clone()),
            guard: Guard::new(policy),
            tls,
            entries: Default::default(),
            ends: Default::default(),
            routes: Default::default(),
        };
        Ok(Running {
            api,
            tasks,
            stop,
            member,
            group,
            bootstrapping,
        })
    }

    /// Checks the topics the node writes to exist, now rather than at the first record
    /// that needs one; the deltas topic must have the updates topic's partition count.
    async fn check_topics(&self) -> Result<(), NodeError> {
        let (kafka, partitions) = (&self.config.kafka, self.partitions.len());
        let deltas = &kafka.deltas_topic;
        let shipped_to = log::partitions(kafka, deltas).await?.len();
        if shipped_to != partitions {
            return Err(NodeError::PartitionCounts {
                topic: deltas.clone(),
                found: shipped_to,
                expected: partitions,
            });
        }
        // refused events go to these (dead letters before their batch commits, late events
        // in the shipping rounds): a missing one is a setup error to name now, not at the
        // first refused event, when a late one would stop its partition's shipping
        for topic in [&kafka.dlq_topic, &kafka.late_topic] {
            log::partitions(kafka, topic).await?;
        }
        // final windows go out in the shipping rounds too
        if self
            .config
            .namespaces
            .iter()
            .any(|ns| ns.outputs_final_windows)
        {
            log::partitions(kafka, &kafka.outputs_topic).await?;
        }
        Ok(())
    }

    /// A learner takes partitions once its table is current, so that it renews the region's
    /// leases, and writes the partitions' owned keys, from its first rounds.
    async fn learner_catches_up(&self, member: Option<&Member>) {
        let (Some(member), Some(lease)) = (member, &self.config.lease) else {
            return;
        };
        if lease.learner == 0 {
            return;
        }
        let waiting = Instant::now();
        if member.caught_up(LEARNER_CATCH_UP).await {
            tracing::info!(
                took_ms = waiting.elapsed().as_millis() as u64,
                "this learner's lease table is current"
            );
        } else {
            tracing::warn!(within = ?LEARNER_CATCH_UP, "this learner's lease table is not current yet; it joins the region's group anyway, and refuses owned keys until it holds their leases");
        }
    }

    /// The TLS reloader and the metrics server.
    fn spawn_reporting(
        &self,
        tasks: &mut Tasks,
        metrics: TcpListener,
        recorder: Option<PrometheusHandle>,
        tls: &Option<Tls>,
        stop: &watch::Receiver<bool>,
    ) {
        if let Some(reloading) = &self.tls {
            let reload = reloading.clone().watch(stop.clone());
            tasks.spawn("the TLS reloader", OnStop::Abort, returns(reload));
        }
        let metrics = incoming(metrics, tls.clone(), Listener::Metrics);
        tasks.spawn(
            "the metrics server",
            OnStop::Abort,
            returns(m::serve(metrics, recorder)),
        );
    }

    /// The health check of the pricing function's sidecar, if one is configured.
    fn spawn_function_checks(
        &self,
        tasks: &mut Tasks,
    ) -> Result<Vec<crate::function::Health>, NodeError> {
        let Some(f) = (self.config.pricing.as_ref()).and_then(|p| p.function.as_ref()) else {
            return Ok(Vec::new());
        };
        let sidecar = crate::function::Sidecar::new(crate::pricer::SURGE, &f.addr, f.timeout)
            .map_err(|e| NodeError::Function(e.to_string()))?;
        let health = crate::function::Health::new(sidecar);
        let checks = health.clone().run();
        tasks.spawn("the function health check", OnStop::Abort, returns(checks));
        Ok(vec![health])
    }

    /// Joins the region's group and starts the partition keeper; returns once it took
    /// the first assignment (a node that stops or fails first: an error).
    async fn join_group(
        &self,
        tasks: &mut Tasks,
        owned: &Arc<Partitions>,
        freshness: &Arc<Freshness>,
        address: &str,
        stop: &watch::Receiver<bool>,
    ) -> Result<Membership, NodeError> {
        let config = &self.config;
        let spec = MembershipSpec {
            kafka: config.kafka.clone(),
            group: group_id(config),
            topic: config.kafka.updates_topic.clone(),
            address: address.to_string(),
            session_timeout: GROUP_SESSION_TIMEOUT,
        };
        let (group, changes) = Membership::join(&spec)?;
        tasks.spawn(
            "the peer prober",
            OnStop::Finish,
            crate::peers::Peers { spec }.run(stop.clone()),
        );
        let (first_taken, taken) = tokio::sync::oneshot::channel();
        let copies = Arc::new(Copies::new(self.partitions.iter().copied()));
        let keeper = Keeper {
            config: config.clone(),
            store: self.store.clone(),
            hlc: self.hlc.clone(),
            partitions: owned.clone(),
            actor: Actor::new(config.region.clone(), self.incarnation),
            changes,
            first_taken: Some(first_taken),
            copies: copies.clone(),
            freshness: freshness.clone(),
            outputs: crate::replication::outputs::Outputs::new(config).map(Arc::new),
        };
        tasks.spawn(
            "the partition keeper",
            OnStop::Finish,
            keeper.run(stop.clone()),
        );
        if config.replication.standby_replicas > 0 {
            let standby = Standby {
                config: config.clone(),
                store: self.store.clone(),
                hlc: self.hlc.clone(),
                copies,
                partitions: owned.clone(),
                address: address.to_string(),
            };
            tasks.spawn(
                "the standby refresher",
                OnStop::Finish,
                standby.run(stop.clone()),
            );
        }
        tokio::select! {
            _ = taken => {}
            Some(ended) = tasks.next_ended() => return Err(NodeError::TaskEnded(Tasks::failure(ended))),
        }
        tracing::info!(owned = ?owned.owned(), "joined the region's group");
        Ok(group)
    }

    async fn start_leases(
        &self,
        tasks: &mut Tasks,
        owned: &Arc<Partitions>,
        stop: &watch::Receiver<bool>,
    ) -> Result<
        (
            Option<Member>,
            Option<Arc<Leases>>,
            Option<watch::Receiver<bool>>,
        ),
        NodeError,
    > {
        let config = &self.config;
        let Some(lease) = &config.lease else {
            return Ok((None, None, None));
        };
        let member = Member::start(
            lease,
            &raft_dir(&config.data_dir),
            config.max_clock_offset.as_millis() as u64,
            self.clock.clone(),
            self.tls.clone(),
        )
        .await?;
        let leases = Arc::new(Leases::new(
            lease.clone(),
            config.region.clone(),
            config.max_clock_offset,
            member.view.clone(),
            member.proposer.clone(),
            Channels::new(member.tls.clone()),
            self.clock.clone(),
        ));
        // whether this region's Kafka answers: a region that cannot write lets its leases go
        let (reachable, kafka) = watch::channel(true);
        let reach = crate::log::reach::follow(
            config.kafka.clone(),
            config.kafka.updates_topic.clone(),
            lease.kafka_down_after,
            reachable,
            stop.clone(),
        );
        tasks.spawn("the Kafka reach probe", OnStop::Finish, returns(reach));
        let (writable, can_write) = watch::channel(true);
        let follow = follow_writable(kafka.clone(), owned.clone(), writable, stop.clone());
        tasks.spawn("the writability follower", OnStop::Abort, returns(follow));
        let (mut joined, mut stopping) = (member.joined.clone(), stop.clone());
        let run = leases.clone().run(stop.clone(), can_write);
        let run = async move {
            // a learner holds no lease before the group lists it (`Member::joined`)
            let listed = tokio::select! {
                listed = joined.wait_for(Option::is_some) => listed.is_ok(),
                () = stopped(&mut stopping) => false,
            };
            if listed {
                run.await;
            }
        };
        // it finishes by releasing what it holds, through the member (stopped after it)
        tasks.spawn("the lease manager", OnStop::Finish, returns(run));
        tracing::info!(member = lease.member_id, learner = lease.learner, listen = %lease.listen, shards = lease.all_shards().end, "lease group member started");
        Ok((Some(member), Some(leases), Some(kafka)))
    }

    /// One merger per remote region, feeding `freshness`.
    fn spawn_mergers(
        &self,
        tasks: &mut Tasks,
        owned: &Arc<Partitions>,
        freshness: &Arc<Freshness>,
        partitions: usize,
        stop: &watch::Receiver<bool>,
    ) -> Result<Vec<Arc<RemoteProgress>>, NodeError> {
        let mut remotes = Vec::new();
        for remote in &self.config.replication.remotes {
            let progress = Arc::new(RemoteProgress::new(
                remote.clone(),
                self.store.source_offsets(&Merger::offsets_id(remote))?,
            ));
            remotes.push(progress.clone());
            let merger = Merger {
                partitions,
                config: self.config.clone(),
                hlc: self.hlc.clone(),
                store: self.store.clone(),
                owned: owned.clone(),
                freshness: freshness.clone(),
                progress,
            };
            let name = format!("merging {}'s deltas", remote.region);
            tasks.spawn(name, OnStop::Finish, merger.run(stop.clone()));
        }
        Ok(remotes)
    }

    fn spawn_ingest(
        &self,
        tasks: &mut Tasks,
        owned: &Arc<Partitions>,
        remotes: &[Arc<RemoteProgress>],
        leases: &Option<Arc<Leases>>,
        stop: &watch::Receiver<bool>,
    ) -> Result<(), NodeError> {
        let config = &self.config;
        let source = log::ConsumerSpec {
            kafka: config.kafka.clone(),
            group: format!("geostate-ingest-reader-{}", config.region),
            report_end: false,
            topic: config.kafka.updates_topic.clone(),
            partitions: Vec::new(),
            role: "ingest",
        };
        let ingest = Ingestor {
            config: config.clone(),
            actor: Actor::new(config.region.clone(), self.incarnation),
            hlc: self.hlc.clone(),
            store: self.store.clone(),
            source,
            dlq: log::RenewingProducer::new(&config.kafka, Duration::from_secs(30))?,
            owned: owned.clone(),
            leases: leases.clone(),
            granted: Default::default(),
            partition_count: i32::try_from(self.partitions.len()).unwrap_or(i32::MAX),
        };
        // A node that rebuilt itself replays its updates topic only once it holds every
        // remote delta the lost node could have seen: a compare-and-set replayed on less
        // than the lost node had merged could fail where the lost node's succeeded (and
        // was acknowledged).
        let (bootstrapping, remotes_read) = (self.bootstrapping, all_caught_up(remotes));
        let mut ingest_stop = stop.clone();
        tasks.spawn("ingest", OnStop::Finish, async move {
            if bootstrapping {
                tokio::select! {
                    () = remotes_read => {}
                    () = stopped(&mut ingest_stop) => return Ok(()),
                }
            }
            ingest.run(ingest_stop).await
        });
        if config.namespaces.any_windowed() {
            let idle = IdleWatermarks {
                config: config.clone(),
                store: self.store.clone(),
                owned: owned.clone(),
                producer: Arc::new(log::RenewingProducer::new(
                    &config.kafka,
                    Duration::from_secs(10),
                )?),
            };
            tasks.spawn(
                "the idle partitions' watermarks",
                OnStop::Abort,
                idle.run(stop.clone()),
            );
        }
        Ok(())
    }

    /// The checkpointer, and how the API asks it for a checkpoint and reads its status.
    fn spawn_checkpointer(
        &self,
        tasks: &mut Tasks,
        owned: &Arc<Partitions>,
        stop: &watch::Receiver<bool>,
    ) -> Result<(mpsc::Sender<checkpoint::Request>, Arc<CheckpointStatus>), NodeError> {
        let status = Arc::new(CheckpointStatus {
            restored_from: self.store.restored_from()?,
            target: self.objects.describe(""),
            ..Default::default()
        });
        let (checkpoints, requests) = mpsc::channel(4);
        let checkpointer = Checkpointer {
            config: self.config.clone(),
            store: self.store.clone(),
            objects: self.objects.clone(),
            incarnation: self.incarnation,
            wall: self.hlc.physical().clone(),
            status: status.clone(),
            requests,
            owned: owned.clone(),
        };
        // a checkpoint cut short is harmless: its manifest is never written
        let run = returns(checkpointer.run(stop.clone()));
        tasks.spawn("the checkpointer", OnStop::Abort, run);
        Ok((checkpoints, status))
    }
}

impl Running {
    /// Serves gRPC until `shutdown` completes or a task ends, then stops. A node that
    /// rebuilt itself serves nothing before it holds what the other regions wrote: every
    /// remote deltas topic read to its end.
    async fn serve(
        self,
        grpc: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), NodeError> {
        let Running {
            api,
            mut tasks,
            stop,
            member,
            group,
            bootstrapping,
        } = self;
        let mut shutdown = std::pin::pin!(shutdown);
        if bootstrapping && !api.remotes.is_empty() {
            tracing::info!(
                remotes = api.remotes.len(),
                "reading every remote deltas topic before serving"
            );
            tokio::select! {
                () = all_caught_up(&api.remotes) => tracing::info!("bootstrap done: serving"),
                () = &mut shutdown => return stop_in_order(stop, tasks, member, group, None, None, false).await,
                Some(ended) = tasks.next_ended() => {
                    let failed = Some(Tasks::failure(ended));
                    return stop_in_order(stop, tasks, member, group, None, failed, false).await;
                }
            }
        }
        let (owned, partitions) = (api.owned.clone(), api.partitions.len());
        let mut grpc_stop = stop.subscribe();
        let mut grpc_task = tokio::spawn(api::serve(grpc, Arc::new(api), async move {
            stopped(&mut grpc_stop).await;
        }));
        let failed = tokio::select! {
            () = &mut shutdown => None,
            Some(ended) = tasks.next_ended() => Some(Tasks::failure(ended)),
            result = &mut grpc_task => Some(match result {
                Ok(Ok(())) => "the grpc server returned while the node was running".into(),
                Ok(Err(e)) => format!("the grpc server failed while the node was running: {e}"),
                Err(e) => format!("the grpc server {e} while the node was running"),
            }),
        };
        let grpc = (!grpc_task.is_finished()).then_some(grpc_task);
        // other nodes own part of the region: they take this one's partitions at once
        let shared_out = owned.owned().len() < partitions;
        stop_in_order(stop, tasks, member, group, grpc, failed, shared_out).await
    }
}

/// The one shutdown sequence: tell every task to stop; let gRPC calls in flight finish
/// (clients are told to go away; one still connected after the grace period is cut off);
/// leave the region's group (the keeper hands each partition off: ingest commits, the
/// shipper ships the outbox; not after a failure, when a task may be gone); abort what
/// may be cut short and wait for the rest (the lease manager releases through the
/// group); stop the lease group member; report the first failure.
///
/// With `shared_out` (other nodes own part of the region) the node leaves the group
/// first, its tasks still running so the keeper hands each partition off, then drains:
/// the grace runs out whenever another node keeps a channel to this one, and its
/// partitions would be unserved meanwhile. A call in flight for a partition handed off
/// answers as a call to a moved partition does.
async fn stop_in_order(
    stop: watch::Sender<bool>,
    tasks: Tasks,
    member: Option<Member>,
    group: Membership,
    grpc: Option<JoinHandle<Result<(), tonic::transport::Error>>>,
    failed: Option<String>,
    shared_out: bool,
) -> Result<(), NodeError> {
    tracing::info!("node stopping");
    let mut group = Some(group);
    if shared_out && failed.is_none() {
        leave_group(group.take()).await;
    }
    let mut grpc_result = Ok(Ok(()));
    if let Some(mut grpc) = grpc {
        let _ = stop.send(true);
        match tokio::time::timeout(SHUTDOWN_GRACE, &mut grpc).await {
            Ok(result) => grpc_result = result,
            Err(_) => {
                tracing::warn!(grace = ?SHUTDOWN_GRACE, "grpc clients still connected; closing");
                grpc.abort();
            }
        }
        tracing::info!("grpc stopped");
    }
    if failed.is_none() {
        leave_group(group.take()).await;
    }
    let _ = stop.send(true);
    let finished = tasks.finish().await;
    tracing::info!("ingest, shipping, merging and leases stopped");
    if let Some(member) = member {
        member.stop().await;
    }
    tracing::info!("node stopped");
    grpc_result??;
    match failed.or(finished.err()) {
        Some(why) => Err(NodeError::TaskEnded(why)),
        None => Ok(()),
    }
}

/// Leaves the region's group (if not left yet), off the async threads: the member revokes
/// its partitions first, which waits for a running keeper to hand them off.
async fn leave_group(group: Option<Membership>) {
    let Some(group) = group else { return };
    let leaving = tokio::task::spawn_blocking(move || group.leave());
    if tokio::time::timeout(LEAVE_WAIT, leaving).await.is_err() {
        tracing::warn!(wait = ?LEAVE_WAIT, "leaving the region's group took too long; stopping anyway");
    } else {
        tracing::info!("left the region's group");
    }
}

/// Completes once every remote's merger has read its topic to the end (owns what it
/// watches, so a spawned task can wait on it).
fn all_caught_up(remotes: &[Arc<RemoteProgress>]) -> impl Future<Output = ()> + Send + 'static {
    let receivers: Vec<_> = remotes.iter().map(|r| r.caught_up.subscribe()).collect();
    async move {
        for mut done in receivers {
            let _ = done.wait_for(|&done| done).await;
        }
    }
}

/// How long after its Kafka answers again a node that owned partitions before waits to
/// own as many again before its region takes leases again (the group may have given them
/// to other nodes meanwhile).
const REJOIN_AT_MOST: Duration = Duration::from_secs(30);

/// Whether this region may hold leases, as this node sees it, into `writable`: its Kafka
/// answers (`reachable`, `log::reach`), and after Kafka did not, this node owns again as
/// many partitions as when Kafka stopped answering (its writes need them; taking its home
/// shards back before would refuse their writes as moving), or [`REJOIN_AT_MOST`] passed.
async fn follow_writable(
    mut reachable: watch::Receiver<bool>,
    partitions: Arc<Partitions>,
    writable: watch::Sender<bool>,
    mut stop: watch::Receiver<bool>,
) {
    let mut owned = partitions.subscribe();
    // the partitions owned as Kafka stopped answering; when to stop waiting for them again
    let (mut before, mut until) = (0, None);
    loop {
        let up = *reachable.borrow_and_update();
        let now = owned.borrow_and_update().len();
        if !up {
            if *writable.borrow() {
                before = now;
            }
            until = None;
            writable.send_if_modified(|w| std::mem::replace(w, false));
        } else if !*writable.borrow() {
            let deadline =
                *until.get_or_insert_with(|| tokio::time::Instant::now() + REJOIN_AT_MOST);
            if now >= before || tokio::time::Instant::now() >= deadline {
                until = None;
                writable.send_replace(true);
            }
        }
        let waiting = until.unwrap_or_else(tokio::time::Instant::now);
        tokio::select! {
            () = stopped(&mut stop) => return,
            changed = reachable.changed() => if changed.is_err() { return },
            _ = owned.changed() => {}
            () = tokio::time::sleep_until(waiting), if until.is_some() => {}
        }
    }
}

/// A task that returns nothing: ending at all, before shutdown, is its failure.
async fn returns(task: impl Future<Output = ()>) -> Result<(), std::convert::Infallible> {
    task.await;
    Ok(())
}

/// Publishes every second the remote regions' silence (an alert's threshold is a few
/// seconds of it), and every five the bytes of state and the consumer lag per owned
/// partition (which ask Kafka).
async fn report_gauges(
    config: Arc<Config>,
    store: Arc<Store>,
    owned: Arc<Partitions>,
    remotes: Vec<Arc<RemoteProgress>>,
    clock: Arc<dyn Clock>,
    mut stop: watch::Receiver<bool>,
) {
    for tick in 1u64.. {
        tokio::select! {
            () = stopped(&mut stop) => return,
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
        for r in &remotes {
            if let Some(since) = r.heard_from_all_since() {
                let silence = clock.now_nanos().saturating_sub(since) as f64 / 1e9;
                metrics::gauge!(m::REMOTE_SILENCE_SECONDS, "region" => r.remote.region.to_string())
                    .set(silence);
            }
        }
        if tick % 5 != 0 {
            continue;
        }
        metrics::gauge!(m::STATE_BYTES).set(store.state_bytes() as f64);
        let applied = owned.applied();
        let owned: Vec<i32> = owned.owned().into_iter().collect();
        let Ok(ends) = log::end_offsets(&config.kafka, &config.kafka.updates_topic, owned).await
        else {
            continue;
        };
        for (p, end) in ends {
            let lag = end - applied.get(&p).copied().unwrap_or(-1) - 1;
            metrics::gauge!(m::CONSUMER_LAG, "partition" => p.to_string()).set(lag.max(0) as f64);
        }
    }
}
