//! The partition keeper: takes and gives up updates partitions as the region's group
//! decides ([`crate::log::membership`]), so several nodes share a region.
//!
//! ```text
//!  Assigned(p…) ─► p's shipping producer (fences p's previous owner, aborts its round)
//!               ─► catch up p from the region's own deltas (bootstrap::catch_up)
//!               ─► p's shipper ─► owned += p (ingest, the mergers and the API follow)
//!  Revoked(p…)  ─► owned −= p ─► ingest commits its batch and reads p no more
//!               ─► p's shipper ships what the outbox holds and ends ─► the group moves p
//!  a shipper fenced by another node ─► owned −= p (the group's revoke follows)
//! ```
//!
//! Every partition is taken and given up alone: its state, offsets, outbox and fences are
//! its own RocksDB instance, and its shipping producer its own transactional id.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

use crate::clock::Hlc;
use crate::config::Config;
use crate::crdt::Actor;
use crate::ingest::ingestor::IngestShared;
use crate::log::membership::{Change, REVOKE_WAIT};
use crate::log::{self, LogError};
use crate::replication::bootstrap::{self, BootstrapError};
use crate::replication::shipper::{ShipError, Shipper};
use crate::shutdown::stopped;
use crate::store::Store;

/// A shipping transaction left open longer (its node died) is aborted by Kafka.
const SHIP_TRANSACTION_TIMEOUT: Duration = Duration::from_secs(30);
const RETRY_PAUSE: Duration = Duration::from_millis(500);

#[derive(Debug, thiserror::Error)]
pub enum KeeperError {
    #[error("the region's group member stopped")]
    MemberGone,
    #[error("catching up partition {partition}: {source}")]
    CatchUp {
        partition: i32,
        source: BootstrapError,
    },
    #[error("{0}")]
    Shipper(String),
}

/// The transactional producer shipping `partition`, initialised: its
/// `init_transactions` fenced every earlier producer of the partition's id
/// (`geostate.<region>.<deltas topic>.p<partition>`) and aborted its open transaction.
pub async fn ship_producer(
    config: &Config,
    partition: i32,
) -> Result<log::Transactional, LogError> {
    log::TransactionalSpec {
        kafka: config.kafka.clone(),
        transactional_id: format!(
            "geostate.{}.{}.p{partition}",
            config.region, config.kafka.deltas_topic
        ),
        transaction_timeout: SHIP_TRANSACTION_TIMEOUT,
    }
    .start()
    .await
}

/// Errors worth retrying: Kafka's. A storage failure is not (`Retry::Fatal`).
trait Retry {
    type Fatal;
    fn fatal(self) -> Result<Self, Self::Fatal>
    where
        Self: Sized;
}

impl Retry for LogError {
    type Fatal = std::convert::Infallible;
    fn fatal(self) -> Result<Self, Self::Fatal> {
        Ok(self)
    }
}

impl Retry for BootstrapError {
    type Fatal = BootstrapError;
    fn fatal(self) -> Result<Self, Self::Fatal> {
        match self {
            BootstrapError::Store(e) => Err(BootstrapError::Store(e)),
            other => Ok(other),
        }
    }
}

/// Runs `attempt` until it succeeds, logging each failure and pausing before the next;
/// `Ok(None)` if asked to stop meanwhile, `Err` on a failure no retry cures.
async fn retried<T, E, F>(
    what: &str,
    partition: i32,
    stop: &mut watch::Receiver<bool>,
    mut attempt: impl FnMut() -> F,
) -> Result<Option<T>, E::Fatal>
where
    E: Retry + std::fmt::Display,
    F: std::future::Future<Output = Result<T, E>>,
{
    loop {
        let error = match attempt().await {
            Ok(done) => return Ok(Some(done)),
            Err(e) => e.fatal()?,
        };
        tracing::warn!(partition, %error, "taking the partition: {what} failed; retrying");
        tokio::select! {
            () = stopped(stop) => return Ok(None),
            () = tokio::time::sleep(RETRY_PAUSE) => {}
        }
    }
}

/// One running shipper.
struct Shipping {
    hand_off: watch::Sender<bool>,
    task: tokio::task::AbortHandle,
}

pub struct Keeper {
    pub config: Arc<Config>,
    pub store: Arc<Store>,
    pub hlc: Arc<Hlc>,
    pub shared: Arc<IngestShared>,
    pub actor: Actor,
    pub changes: mpsc::UnboundedReceiver<Change>,
    /// Told once the first assignment was taken (empty or not).
    pub first_taken: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Keeper {
    /// Runs until `stop`; ends early only if the group member stops or a partition
    /// cannot be caught up from the store.
    pub async fn run(mut self, mut stop: watch::Receiver<bool>) -> Result<(), KeeperError> {
        let mut shippers: BTreeMap<i32, Shipping> = BTreeMap::new();
        let mut running: JoinSet<(i32, Result<(), ShipError>)> = JoinSet::new();
        loop {
            tokio::select! {
                () = stopped(&mut stop) => break,
                change = self.changes.recv() => match change {
                    None => return Err(KeeperError::MemberGone),
                    Some(Change::Assigned(partitions)) => {
                        for p in partitions {
                            if shippers.contains_key(&p) {
                                continue;
                            }
                            let Some(shipping) = self.take(p, &mut running, &mut stop).await? else {
                                break;
                            };
                            shippers.insert(p, shipping);
                        }
                        if let Some(first) = self.first_taken.take() {
                            let _ = first.send(());
                        }
                    }
                    Some(Change::Revoked { partitions, lost, done }) => {
                        self.give_up(&partitions, lost, &mut shippers, &mut running).await;
                        let _ = done.send(());
                    }
                },
                Some(ended) = running.join_next() => {
                    let Ok((p, result)) = ended else { continue };
                    shippers.remove(&p);
                    match result {
                        // a shipper ends on its own only when handed off or stopped
                        Ok(()) => {}
                        Err(ShipError::Fatal(why)) => {
                            tracing::error!(partition = p, %why, "another node ships this partition now: this node stops writing it");
                            self.shared.disown(&[p]);
                        }
                        Err(e) => return Err(KeeperError::Shipper(format!("the shipper of partition {p}: {e}"))),
                    }
                }
            }
        }
        // the node stops: every shipper sees the same signal and ends
        while running.join_next().await.is_some() {}
        Ok(())
    }

    /// Takes `partition`: fences its previous owner, catches its copy up, starts its
    /// shipper, then owns it. `None` if asked to stop meanwhile.
    async fn take(
        &self,
        partition: i32,
        running: &mut JoinSet<(i32, Result<(), ShipError>)>,
        stop: &mut watch::Receiver<bool>,
    ) -> Result<Option<Shipping>, KeeperError> {
        let started = std::time::Instant::now();
        let producer = retried("starting its shipping producer", partition, stop, || {
            ship_producer(&self.config, partition)
        });
        let Some(producer) = producer.await.unwrap_or_else(|never| match never {}) else {
            return Ok(None);
        };
        let caught_up = retried("catching it up", partition, stop, || {
            bootstrap::catch_up(&self.config, &self.hlc, &self.store, partition)
        });
        let caught_up = match caught_up.await {
            Ok(Some(caught_up)) => caught_up,
            Ok(None) => return Ok(None),
            Err(source) => return Err(KeeperError::CatchUp { partition, source }),
        };
        let topic = &self.config.kafka.updates_topic;
        // what the previous owner may have applied and acknowledged: up to the end now
        let ends = retried("reading its end", partition, stop, || {
            log::end_offsets(&self.config.kafka, topic, vec![partition])
        });
        let Some(ends) = ends.await.unwrap_or_else(|never| match never {}) else {
            return Ok(None);
        };
        let end = ends.get(&partition).copied().unwrap_or(0);
        let applied = self
            .store
            .source_offsets(topic)
            .map_err(|e| KeeperError::CatchUp {
                partition,
                source: e.into(),
            })?;
        self.shared
            .applied
            .send_modify(|at| match applied.get(&partition) {
                Some(&o) => {
                    at.insert(partition, o);
                }
                None => {
                    at.remove(&partition);
                }
            });
        let (hand_off, handing_off) = watch::channel(false);
        let shipper = Shipper {
            store: self.store.clone(),
            partition,
            producer,
            topic: self.config.kafka.deltas_topic.clone(),
            updates_topic: topic.clone(),
            actor: self.actor.clone(),
            wake: self.shared.committed.subscribe(),
            shipped: self.shared.shipped.clone(),
            clock: self.hlc.physical().clone(),
            replayed: self.shared.replayed.subscribe(),
            hand_off: handing_off,
        };
        let run = shipper.run(stop.clone());
        let task = running.spawn(async move { (partition, run.await) });
        self.shared.own(partition, end);
        let recovered = &caught_up.recovered;
        tracing::info!(
            partition,
            deltas = recovered.deltas,
            keys = recovered.keys,
            discarded = caught_up.discarded,
            resume = ?recovered.resume.as_ref().map(|r| &r.updates_offsets),
            applied = ?applied.get(&partition),
            end,
            took_ms = started.elapsed().as_millis() as u64,
            "took the partition"
        );
        Ok(Some(Shipping { hand_off, task }))
    }

    /// Gives up `partitions`: ingest stops reading them (its batch committed), then each
    /// shipper ships what is left (unless the group already moved them: `lost`) and ends.
    async fn give_up(
        &self,
        partitions: &[i32],
        lost: bool,
        shippers: &mut BTreeMap<i32, Shipping>,
        running: &mut JoinSet<(i32, Result<(), ShipError>)>,
    ) {
        let started = std::time::Instant::now();
        self.shared.disown(partitions);
        let gone: BTreeSet<i32> = partitions.iter().copied().collect();
        let mut reading = self.shared.reading.subscribe();
        let ingest_done = reading.wait_for(|r| r.is_disjoint(&gone));
        if tokio::time::timeout(REVOKE_WAIT / 2, ingest_done)
            .await
            .is_err()
        {
            tracing::warn!(
                ?partitions,
                "ingest did not stop reading the revoked partitions in time"
            );
        }
        let mut handed: Vec<(i32, Shipping)> = partitions
            .iter()
            .filter_map(|p| shippers.remove(p).map(|s| (*p, s)))
            .collect();
        if lost {
            // another node owns them already: nothing of theirs may ship from here
            for (_, shipping) in handed.drain(..) {
                shipping.task.abort();
            }
        }
        for (_, shipping) in &handed {
            let _ = shipping.hand_off.send(true);
        }
        let deadline = tokio::time::Instant::now() + REVOKE_WAIT / 2;
        while !handed.is_empty() {
            let Ok(Some(ended)) = tokio::time::timeout_at(deadline, running.join_next()).await
            else {
                break;
            };
            let Ok((p, result)) = ended else { continue };
            match result {
                Err(ShipError::Fatal(_)) if !handed.iter().any(|(q, _)| *q == p) => {
                    shippers.remove(&p);
                    self.shared.disown(&[p]);
                }
                Err(e) => {
                    tracing::warn!(partition = p, error = %e, "the partition's last round failed")
                }
                Ok(()) => {}
            }
            handed.retain(|(q, _)| *q != p);
        }
        for (p, shipping) in handed {
            tracing::warn!(
                partition = p,
                "the partition's last round did not finish in time"
            );
            shipping.task.abort();
        }
        tracing::info!(
            ?partitions,
            lost,
            took_ms = started.elapsed().as_millis() as u64,
            "gave up the partitions"
        );
    }
}
