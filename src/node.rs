//! Wiring only: open the store, choose the incarnation, restore the clock, build the Kafka
//! clients, spawn the ingest task, serve gRPC and metrics, and shut down in order
//! (stop serving, stop ingest, close the store).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::api::{self, Api};
use crate::clock::{Clock, Hlc, SystemClock};
use crate::config::Config;
use crate::crdt::Actor;
use crate::ingest::pump::{IngestError, IngestShared, Ingestor};
use crate::log::{self, LogError};
use crate::metrics as m;
use crate::replication::Freshness;
use crate::replication::inbound::Merger;
use crate::replication::outbound::Shipper;
use crate::shutdown::stopped;
use crate::store::{Store, StoreError};

/// How long shutdown waits for gRPC clients to finish and disconnect.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);

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
    #[error("grpc server: {0}")]
    Grpc(#[from] tonic::transport::Error),
    #[error("task failed: {0}")]
    Join(#[from] tokio::task::JoinError),
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
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let data_dir = config.data_dir.clone();
    let store = Arc::new(tokio::task::spawn_blocking(move || Store::open(&data_dir)).await??);
    let incarnation = match store.incarnation()? {
        Some(i) => i,
        None => {
            let i = new_incarnation(clock.as_ref());
            store.set_incarnation(i)?;
            i
        }
    };
    let actor = Actor::new(config.region.clone(), incarnation);
    let hlc = Arc::new(Hlc::new(clock, config.max_clock_offset));
    if let Some(high_water) = store.hlc_high_water()? {
        hlc.advance_past(high_water);
    }

    let topic = config.kafka.updates_topic.clone();
    let partitions = log::partitions(&config.kafka, &topic).await?;
    let applied = store.source_offsets(&topic)?;
    let consumer =
        log::positioned_consumer(&config.kafka, &format!("geostate-ingest-{}", config.region))?;
    log::assign_after(&consumer, &topic, &partitions, &applied)?;
    let shared = Arc::new(IngestShared::new(applied));
    tracing::info!(region = %config.region, incarnation, partitions = partitions.len(), "node starting");

    let (stop_tx, stop_rx) = watch::channel(false);
    let ingest = Ingestor {
        config: config.clone(),
        actor,
        hlc: hlc.clone(),
        store: store.clone(),
        consumer,
        dlq: log::idempotent_producer(&config.kafka, Duration::from_secs(30))?,
        shared: shared.clone(),
    };
    let mut ingest_task = tokio::spawn(ingest.run(stop_rx.clone()));
    let shipper = Shipper {
        store: store.clone(),
        producer: log::idempotent_producer(&config.kafka, Duration::from_secs(30))?,
        topic: config.kafka.deltas_topic.clone(),
        wake: shared.committed.clone(),
    };
    let shipper_task = tokio::spawn(shipper.run(stop_rx.clone()));
    let freshness = Arc::new(Freshness::new(store.remote_applied()?));
    let mut merger_tasks = Vec::new();
    for remote in &config.replication.remotes {
        let merger = Merger {
            config: config.clone(),
            remote: remote.clone(),
            hlc: hlc.clone(),
            store: store.clone(),
            shared: shared.clone(),
            freshness: freshness.clone(),
        };
        merger_tasks.push(tokio::spawn(merger.run(stop_rx.clone())));
    }

    let handle = m::install();
    let metrics_task = tokio::spawn(m::serve(listeners.metrics, handle));
    let lag_task = tokio::spawn(report_lag(
        config.clone(),
        partitions.clone(),
        shared.clone(),
        stop_rx.clone(),
    ));

    let api = Arc::new(Api {
        config: config.clone(),
        incarnation,
        hlc,
        store: store.clone(),
        // a write Kafka cannot take within 10 s is answered UNAVAILABLE
        producer: log::idempotent_producer(&config.kafka, Duration::from_secs(10))?,
        shared,
        partitions,
        stop: stop_rx.clone(),
        freshness,
    });
    let mut grpc_stop = stop_rx.clone();
    let mut grpc_task = tokio::spawn(api::serve(listeners.grpc, api, async move {
        stopped(&mut grpc_stop).await;
    }));

    // Wait for the shutdown signal, or for ingest to fail.
    let ingest_result = tokio::select! {
        () = shutdown => None,
        result = &mut ingest_task => Some(result),
    };
    tracing::info!("node stopping");
    let _ = stop_tx.send(true);
    let ingest_result = match ingest_result {
        Some(result) => result,
        None => ingest_task.await,
    };
    tracing::info!("ingest stopped");
    if let Err(e) = shipper_task.await? {
        tracing::error!(error = %e, "outbound shipper failed");
    }
    for task in merger_tasks {
        if let Err(e) = task.await? {
            tracing::error!(error = %e, "merging remote deltas failed");
        }
    }
    // Graceful: in-flight calls finish and clients are told to go away; a client that
    // keeps its connection open past the grace period is cut off.
    match tokio::time::timeout(SHUTDOWN_GRACE, &mut grpc_task).await {
        Ok(result) => result??,
        Err(_) => {
            tracing::warn!(grace = ?SHUTDOWN_GRACE, "grpc clients still connected; closing");
            grpc_task.abort();
        }
    }
    tracing::info!("grpc stopped");
    metrics_task.abort();
    lag_task.abort();
    tracing::info!("node stopped");
    ingest_result??;
    Ok(())
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
