//! Wiring only: open the store, choose the incarnation, restore the clock, build the Kafka
//! clients, spawn the ingest task, serve gRPC and metrics, and shut down in order
//! (stop serving, stop ingest, close the store).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::api::{self, Api};
use crate::checkpoint::objects::Objects;
use crate::checkpoint::{self, CheckpointError, CheckpointStatus, Checkpointer};
use crate::clock::{Clock, Hlc, ShiftedClock, SystemClock};
use crate::config::Config;
use crate::crdt::Actor;
use crate::ingest::pump::{IngestError, IngestShared, Ingestor};
use crate::lease::manager::Leases;
use crate::lease::member::{Member, MemberError};
use crate::log::{self, LogError};
use crate::metrics as m;
use crate::replication::bootstrap::{self, BootstrapError};
use crate::replication::inbound::Merger;
use crate::replication::outbound::{ShipError, Shipper};
use crate::replication::{Freshness, RemoteProgress};
use crate::shutdown::stopped;
use crate::store::{Store, StoreError};
use crate::supervise::Essential;

/// How long shutdown waits for gRPC clients to finish and disconnect.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);
/// A shipping transaction left open longer (its node died) is aborted by Kafka.
const SHIP_TRANSACTION_TIMEOUT: Duration = Duration::from_secs(30);

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
    #[error(transparent)]
    Ingest(#[from] IngestError),
    #[error(transparent)]
    Ship(#[from] ShipError),
    #[error("bootstrap from the deltas topics: {0}")]
    Bootstrap(#[from] BootstrapError),
    #[error("restore: {0}")]
    Checkpoint(#[from] CheckpointError),
    #[error("grpc server: {0}")]
    Grpc(#[from] tonic::transport::Error),
    #[error("task failed: {0}")]
    Join(#[from] tokio::task::JoinError),
    #[error(transparent)]
    Lease(#[from] MemberError),
    #[error("{0}")]
    TaskEnded(String),
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

/// Runs one region node until `shutdown` completes or a part fails.
pub async fn run(
    config: Config,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), NodeError> {
    let config = Arc::new(config);
    std::fs::create_dir_all(&config.data_dir).map_err(|source| NodeError::DataDir {
        path: config.data_dir.display().to_string(),
        source,
    })?;
    let clock: Arc<dyn Clock> = match config.clock_offset_nanos {
        0 => Arc::new(SystemClock),
        offset_nanos => {
            tracing::warn!(
                offset_ms = offset_nanos / 1_000_000,
                "clock-offset: this node's wall clock is shifted on purpose"
            );
            Arc::new(ShiftedClock { offset_nanos })
        }
    };
    let objects = Objects::connect(&config.checkpoint.target).await;
    if config.checkpoint.restore_on_empty && checkpoint::is_empty_dir(&config.data_dir)? {
        let started = std::time::Instant::now();
        match checkpoint::restore(&config, &objects, None).await {
            Ok(manifest) => {
                let bytes: u64 = manifest.files.iter().map(|f| f.bytes).sum();
                tracing::info!(checkpoint = %manifest.id, files = manifest.files.len(), bytes, took_ms = started.elapsed().as_millis() as u64, "empty data dir: restored the newest checkpoint")
            }
            Err(CheckpointError::NoCheckpoint(at)) => {
                tracing::info!(%at, "empty data dir and no checkpoint: rebuilding from the deltas topics")
            }
            Err(e) => return Err(e.into()),
        }
    }
    let data_dir = config.data_dir.clone();
    let store = Arc::new(tokio::task::spawn_blocking(move || Store::open(&data_dir)).await??);
    let hlc = Arc::new(Hlc::new(clock.clone(), config.max_clock_offset));
    if let Some(high_water) = store.hlc_high_water()? {
        hlc.advance_past(high_water);
    }

    // The shipping producer first: its init fences any older node of this region and
    // aborts its open transaction, so what bootstrap reads next is final.
    let ship_source = log::TransactionalSpec {
        kafka: config.kafka.clone(),
        transactional_id: format!("geostate.{}.{}", config.region, config.kafka.deltas_topic),
        transaction_timeout: SHIP_TRANSACTION_TIMEOUT,
    };
    let ship_producer = ship_source.start().await?;

    let (incarnation, bootstrapping) = match store.incarnation()? {
        Some(i) => (i, false),
        None => {
            let started = std::time::Instant::now();
            let recovered = bootstrap::recover_own_past(&config, &hlc, &store).await?;
            let last = recovered.resume.as_ref().map_or(0, |r| r.incarnation);
            let i = new_incarnation(clock.as_ref()).max(last.saturating_add(1));
            tracing::info!(
                deltas = recovered.deltas,
                superseded = recovered.superseded,
                keys = recovered.keys,
                resume = ?recovered.resume.as_ref().map(|r| &r.updates_offsets),
                last_incarnation = last,
                incarnation = i,
                took_ms = started.elapsed().as_millis() as u64,
                "no incarnation (empty or restored data dir): merged this region's own deltas topic"
            );
            // last: a crash before this line bootstraps again (merging is idempotent)
            store.set_incarnation(i)?;
            (i, true)
        }
    };
    let actor = Actor::new(config.region.clone(), incarnation);
    let checkpoint_status = Arc::new(CheckpointStatus {
        restored_from: store.restored_from()?,
        target: objects.describe(""),
        ..Default::default()
    });

    let topic = config.kafka.updates_topic.clone();
    let partitions = log::partitions(&config.kafka, &topic).await?;
    let applied = store.source_offsets(&topic)?;
    let source = log::ConsumerSpec {
        kafka: config.kafka.clone(),
        group: format!("geostate-ingest-{}", config.region),
        report_end: false,
        topic: topic.clone(),
        partitions: partitions.clone(),
    };
    // What an earlier node of the region may have applied and acknowledged: every record
    // the topic holds now (that node is gone). No heartbeat leaves before it is applied.
    let replay_to = log::watermarks(&config.kafka, &topic, partitions.clone())
        .await?
        .into_iter()
        .filter(|(p, (first, end))| applied.get(p).map_or(*first, |o| o + 1).max(*first) < *end)
        .map(|(p, (_, end))| (p, end))
        .collect();
    let consumer = source.start(&applied)?;
    let shared = Arc::new(IngestShared::new(applied));
    tracing::info!(region = %config.region, incarnation, partitions = partitions.len(), "node starting");

    let (stop_tx, stop_rx) = watch::channel(false);
    let mut essential = Essential::default();
    // The lease group member and this region's leases run from here on, bootstrap or not.
    let (member, leases) = match &config.lease {
        None => (None, None),
        Some(lease) => {
            let member = Member::start(
                lease,
                &raft_dir(&config.data_dir),
                config.max_clock_offset.as_millis() as u64,
                clock.clone(),
            )
            .await?;
            let leases = Arc::new(Leases::new(
                lease.clone(),
                config.region.clone(),
                config.max_clock_offset,
                member.view.clone(),
                member.proposer.clone(),
                clock.clone(),
            ));
            let run = leases.clone().run(stop_rx.clone());
            essential.spawn("the lease manager", returns(run));
            tracing::info!(member = lease.member_id, listen = %lease.listen, shards = lease.all_shards().end, "lease group member started");
            (Some(member), Some(leases))
        }
    };
    let freshness = Arc::new(Freshness::new(store.remote_applied()?));
    let mut remotes = Vec::new();
    for remote in &config.replication.remotes {
        let progress = Arc::new(RemoteProgress::new(
            remote.clone(),
            store.source_offsets(&Merger::offsets_id(remote))?,
        ));
        remotes.push(progress.clone());
        let merger = Merger {
            config: config.clone(),
            hlc: hlc.clone(),
            store: store.clone(),
            shared: shared.clone(),
            freshness: freshness.clone(),
            progress,
        };
        essential.spawn(
            format!("merging {}'s deltas", remote.region),
            merger.run(stop_rx.clone()),
        );
    }

    let ingest = Ingestor {
        config: config.clone(),
        actor: actor.clone(),
        hlc: hlc.clone(),
        store: store.clone(),
        consumer,
        source,
        dlq: log::RenewingProducer::new(&config.kafka, Duration::from_secs(30))?,
        shared: shared.clone(),
        replay_to,
        leases: leases.clone(),
        grants: Default::default(),
    };
    // A node that rebuilt itself replays its updates topic only once it holds every remote
    // delta the lost node could have seen: a compare-and-set replayed on less than the
    // lost node had merged could fail where the lost node's succeeded (and was
    // acknowledged).
    let remotes_read = all_caught_up(&remotes);
    let mut ingest_stop = stop_rx.clone();
    let mut ingest_task = tokio::spawn(async move {
        if bootstrapping {
            tokio::select! {
                () = remotes_read => {}
                () = stopped(&mut ingest_stop) => return Ok(()),
            }
        }
        ingest.run(ingest_stop).await
    });
    let shipper = Shipper {
        store: store.clone(),
        producer: ship_producer,
        source: ship_source,
        topic: config.kafka.deltas_topic.clone(),
        updates_topic: config.kafka.updates_topic.clone(),
        actor,
        wake: shared.committed.clone(),
        shipped: shared.shipped.clone(),
        clock: hlc.physical().clone(),
        replayed: shared.replayed.subscribe(),
    };
    let mut shipper_task = tokio::spawn(shipper.run(stop_rx.clone()));

    let (checkpoints, requests) = tokio::sync::mpsc::channel(4);
    let checkpointer = Checkpointer {
        config: config.clone(),
        store: store.clone(),
        objects: objects.clone(),
        incarnation,
        wall: hlc.physical().clone(),
        status: checkpoint_status.clone(),
        requests,
    };
    let checkpoint_task = essential.spawn(
        "the checkpointer",
        returns(checkpointer.run(stop_rx.clone())),
    );

    let handle = m::install();
    let metrics_task = essential.spawn(
        "the metrics server",
        returns(m::serve(listeners.metrics, handle)),
    );
    let lag_task = tokio::spawn(report_lag(
        config.clone(),
        partitions.clone(),
        shared.clone(),
        stop_rx.clone(),
    ));

    // A node that rebuilt itself serves nothing before it holds what the other regions
    // wrote: every remote deltas topic read to its end.
    let mut shutdown = std::pin::pin!(shutdown);
    if bootstrapping && !remotes.is_empty() {
        tracing::info!(
            remotes = remotes.len(),
            "reading every remote deltas topic before serving"
        );
        let failed = tokio::select! {
            () = all_caught_up(&remotes) => {
                tracing::info!("bootstrap done: serving");
                None
            }
            () = &mut shutdown => Some(None),
            Some(ended) = essential.next_ended() => Some(Some(Failed::Task(Essential::failure(ended)))),
        };
        if let Some(failed) = failed {
            let _ = stop_tx.send(true);
            metrics_task.abort();
            checkpoint_task.abort();
            lag_task.abort();
            stop_tasks(essential, member).await;
            return stop(ingest_task, shipper_task, failed).await;
        }
    }

    let api = Arc::new(Api {
        config: config.clone(),
        incarnation,
        hlc,
        store: store.clone(),
        // a write Kafka cannot take within 10 s is answered UNAVAILABLE
        producer: log::RenewingProducer::new(&config.kafka, Duration::from_secs(10))?,
        shared,
        partitions,
        stop: stop_rx.clone(),
        freshness,
        remotes,
        checkpoints,
        checkpoint_status,
        objects,
        leases,
        peers: Default::default(),
        ends: Default::default(),
    });
    let mut grpc_stop = stop_rx.clone();
    let mut grpc_task = tokio::spawn(api::serve(listeners.grpc, api, async move {
        stopped(&mut grpc_stop).await;
    }));

    // Wait for the shutdown signal, or for ingest, shipping or an essential task to end.
    let failed = tokio::select! {
        () = &mut shutdown => None,
        result = &mut ingest_task => Some(Failed::Ingest(result)),
        result = &mut shipper_task => Some(Failed::Shipper(result)),
        Some(ended) = essential.next_ended() => Some(Failed::Task(Essential::failure(ended))),
    };
    tracing::info!("node stopping");
    let _ = stop_tx.send(true);
    // Graceful: in-flight calls finish and clients are told to go away; a client that
    // keeps its connection open past the grace period is cut off.
    let grpc_result = match tokio::time::timeout(SHUTDOWN_GRACE, &mut grpc_task).await {
        Ok(result) => result,
        Err(_) => {
            tracing::warn!(grace = ?SHUTDOWN_GRACE, "grpc clients still connected; closing");
            grpc_task.abort();
            Ok(Ok(()))
        }
    };
    tracing::info!("grpc stopped");
    metrics_task.abort();
    lag_task.abort();
    // a checkpoint cut short is harmless: its manifest is never written
    checkpoint_task.abort();
    stop_tasks(essential, member).await;
    let result = stop(ingest_task, shipper_task, failed).await;
    grpc_result??;
    result
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

/// Waits for the essential tasks (told to stop: the mergers finish their batch, the lease
/// manager releases what it holds through the group), then stops the lease group member.
async fn stop_tasks(essential: Essential, member: Option<Member>) {
    essential.finish().await;
    if let Some(member) = member {
        member.stop().await;
    }
}

/// A task that returns nothing: ending at all, before shutdown, is its failure.
async fn returns(task: impl Future<Output = ()>) -> Result<(), std::convert::Infallible> {
    task.await;
    Ok(())
}

/// A task that ended before shutdown was asked for.
enum Failed {
    Ingest(Result<Result<(), IngestError>, tokio::task::JoinError>),
    Shipper(Result<Result<(), ShipError>, tokio::task::JoinError>),
    /// An essential task, and how it ended.
    Task(String),
}

/// Waits for the pipeline tasks (already told to stop) and reports the first failure.
async fn stop(
    ingest_task: JoinHandle<Result<(), IngestError>>,
    shipper_task: JoinHandle<Result<(), ShipError>>,
    failed: Option<Failed>,
) -> Result<(), NodeError> {
    let (ingest_result, shipper_result, task) = match failed {
        Some(Failed::Ingest(r)) => (r, shipper_task.await, None),
        Some(Failed::Shipper(r)) => (ingest_task.await, r, None),
        Some(Failed::Task(why)) => (ingest_task.await, shipper_task.await, Some(why)),
        None => (ingest_task.await, shipper_task.await, None),
    };
    tracing::info!("ingest and shipping stopped");
    tracing::info!("node stopped");
    ingest_result??;
    shipper_result??;
    match task {
        Some(why) => Err(NodeError::TaskEnded(why)),
        None => Ok(()),
    }
}

/// Publishes the consumer lag per partition every few seconds.
async fn report_lag(
    config: Arc<Config>,
    partitions: Vec<i32>,
    shared: Arc<IngestShared>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            () = stopped(&mut stop) => return,
            () = tokio::time::sleep(Duration::from_secs(5)) => {}
        }
        let Ok(ends) = log::end_offsets(
            &config.kafka,
            &config.kafka.updates_topic,
            partitions.clone(),
        )
        .await
        else {
            continue;
        };
        let applied = shared.applied.borrow().clone();
        for (p, end) in ends {
            let lag = end - applied.get(&p).copied().unwrap_or(-1) - 1;
            metrics::gauge!(m::CONSUMER_LAG, "partition" => p.to_string()).set(lag.max(0) as f64);
        }
    }
}
