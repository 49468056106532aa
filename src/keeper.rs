//! The partition keeper: takes and gives up updates partitions as the region's group
//! decides ([`crate::log::membership`]), so several nodes share a region.
//!
//! ```text
//!  Assigned(p…) ─► for every new p at once: p's shipping producer (fences p's previous
//!                  owner, aborts its round), while a standby refresh of p in progress ends
//!               ─► catch up p from the region's own deltas (bootstrap::catch_up), while
//!                  reading the end of p's updates
//!               ─► p's shipper ─► owned += p (ingest, the mergers and the API follow),
//!                  each p as soon as it is ready
//!  Revoked(p…)  ─► owned −= p ─► ingest commits its batch and reads p no more
//!               ─► p's shipper ships what the outbox holds and ends ─► the group moves p
//!  a shipper fenced by another node ─► owned −= p (the group's revoke follows; if none
//!    came within RETAKE_AFTER, the fencer holds no assignment of p: take p again)
//!  every second, with standby-replicas = n: each partition another node owns, if this
//!  node is among the n chosen for it ─► catch its copy up (bootstrap::catch_up), one
//!  region's deltas at a time, stopping early when the keeper takes it
//! ```
//!
//! Every partition is taken and given up alone: its state, offsets, outbox and fences are
//! its own RocksDB instance, and its shipping producer its own transactional id. A warm
//! standby's copy is caught up exactly as a take catches it up (the same discard rule),
//! only more often, so the take that follows merges only what was shipped since; the two
//! never run on one partition at once ([`Copies`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

use crate::clock::Hlc;
use crate::config::Config;
use crate::crdt::Actor;
use crate::log::membership::{self, Change, REVOKE_WAIT};
use crate::log::{self, LogError};
use crate::metrics as m;
use crate::partition::{PartitionHandle, Partitions};
use crate::replication::Freshness;
use crate::replication::bootstrap::{self, BootstrapError};
use crate::replication::outputs::Outputs;
use crate::replication::shipper::{ShipError, Shipper};
use crate::shutdown::stopped;
use crate::store::Store;

/// How often a warm standby's copies are caught up.
const STANDBY_EVERY: Duration = Duration::from_secs(1);
/// How long after another node fenced this one out of a partition the group still
/// assigning it here makes this node take it again. A node the group gave the partition
/// to fences this one only after this one's revoke (cooperative rebalancing) or after its
/// session expired, and the member learns of either within a heartbeat or two; a node
/// that fenced it while no longer assigned it (its take finished after it lost the
/// partition) never gets a revoke here, and the partition would stay unowned.
const RETAKE_AFTER: Duration = Duration::from_secs(2);

/// What the keeper and the standby refresher share: the partitions the keeper takes, owns
/// or hands off (never refreshed as standbys), and one lock per partition that a
/// catch-up holds.
pub struct Copies {
    busy: std::sync::Mutex<BTreeSet<i32>>,
    locks: BTreeMap<i32, tokio::sync::Mutex<()>>,
}

impl Copies {
    pub fn new(partitions: impl IntoIterator<Item = i32>) -> Self {
        Self {
            busy: std::sync::Mutex::default(),
            locks: partitions
                .into_iter()
                .map(|p| (p, tokio::sync::Mutex::new(())))
                .collect(),
        }
    }

    fn busy(&self) -> std::sync::MutexGuard<'_, BTreeSet<i32>> {
        self.busy.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits for a standby refresh of `partition` to end; the keeper's from then on.
    async fn take(&self, partition: i32) -> Option<tokio::sync::MutexGuard<'_, ()>> {
        self.busy().insert(partition);
        Some(self.locks.get(&partition)?.lock().await)
    }

    /// Whether the keeper takes or owns `partition`.
    fn taking(&self, partition: i32) -> bool {
        self.busy().contains(&partition)
    }

    /// The keeper is busy with exactly these partitions (its shippers).
    fn keep<V>(&self, shippers: &BTreeMap<i32, V>) {
        *self.busy() = shippers.keys().copied().collect();
    }

    /// `partition`'s lock, unless the keeper is busy with it or a refresh holds it.
    fn refresh(&self, partition: i32) -> Option<tokio::sync::MutexGuard<'_, ()>> {
        let guard = self.locks.get(&partition)?.try_lock().ok()?;
        (!self.taking(partition)).then_some(guard)
    }
}

/// The region's group: its nodes share the updates topic's partitions. Named after the
/// topic too, so deployments sharing a Kafka cluster never share (and rebalance) a group.
pub fn group_id(config: &Config) -> String {
    format!(
        "geostate-ingest-{}-{}",
        config.region, config.kafka.updates_topic
    )
}

/// The partitions the node at `me` keeps warm standby copies of: for each partition
/// another node owns, the `replicas` nodes other than its owner (among the owners and
/// `me`) that rank first by a hash of the partition and the node's address (rendezvous
/// hashing: a node that comes or goes moves only its own share).
pub fn standbys(owners: &BTreeMap<i32, String>, me: &str, replicas: usize) -> BTreeSet<i32> {
    let mut nodes: BTreeSet<&str> = owners.values().map(String::as_str).collect();
    nodes.insert(me);
    owners
        .iter()
        .filter(|(_, owner)| owner.as_str() != me)
        .filter(|&(&p, owner)| {
            let mut ranked: Vec<&str> = nodes
                .iter()
                .copied()
                .filter(|n| *n != owner.as_str())
                .collect();
            ranked.sort_by_key(|n| log::murmur2(format!("{p}/{n}").as_bytes()));
            ranked.iter().take(replicas).any(|n| *n == me)
        })
        .map(|(&p, _)| p)
        .collect()
}

/// Keeps this node's warm standby copies current (`replication.standby-replicas`): the
/// region's own deltas, then every remote region's.
pub struct Standby {
    pub config: Arc<Config>,
    pub store: Arc<Store>,
    pub hlc: Arc<Hlc>,
    pub copies: Arc<Copies>,
    /// The node's partitions: a copy refreshed is no longer one this node let go.
    pub partitions: Arc<Partitions>,
    /// This node's address in the region's group.
    pub address: String,
}

impl Standby {
    /// Runs until `stop`; ends early only on a storage failure.
    pub async fn run(self, mut stop: watch::Receiver<bool>) -> Result<(), KeeperError> {
        let (config, replicas) = (&self.config, self.config.replication.standby_replicas);
        let group = group_id(config);
        let mut owners = BTreeMap::new();
        loop {
            tokio::select! {
                () = stopped(&mut stop) => return Ok(()),
                () = tokio::time::sleep(STANDBY_EVERY) => {}
            }
            // while the group rebalances, the owners it last had stand
            let topic = &config.kafka.updates_topic;
            let read = membership::owners(&config.kafka, &group, topic, log::METADATA_TIMEOUT);
            if let Ok(Some(read)) = read.await {
                owners = read;
            }
            let mine = standbys(&owners, &self.address, replicas);
            metrics::gauge!(m::STANDBY_PARTITIONS).set(mine.len() as f64);
            for p in mine {
                if *stop.borrow() {
                    return Ok(());
                }
                let Some(_refreshing) = self.copies.refresh(p) else {
                    continue;
                };
                self.partitions.forget_copy(p);
                match self.refresh(p).await {
                    Ok(()) => {}
                    Err(e) => match e.fatal() {
                        Ok(e) => {
                            tracing::warn!(partition = p, error = %e, "refreshing a standby copy failed; retrying")
                        }
                        Err(source) => {
                            return Err(KeeperError::CatchUp {
                                partition: p,
                                source,
                            });
                        }
                    },
                }
            }
        }
    }

    /// One refresh of the copy of `p`: the region's own deltas, then each remote's, until
    /// the keeper takes `p` (it waits for the step in progress).
    async fn refresh(&self, p: i32) -> Result<(), BootstrapError> {
        let (config, hlc, store) = (&self.config, &self.hlc, &self.store);
        let caught_up = bootstrap::catch_up(config, hlc, store, p, &|| {}).await?;
        metrics::counter!(m::CATCH_UP_DELTAS, "by" => "standby")
            .increment(caught_up.recovered.deltas as u64);
        for remote in &config.replication.remotes {
            if self.copies.taking(p) {
                // the keeper's merger goes on from the copy's positions
                return Ok(());
            }
            let merged = bootstrap::catch_up_remote(config, hlc, store, remote, p).await?;
            metrics::counter!(m::CATCH_UP_DELTAS, "by" => "standby", "region" => remote.region.to_string())
                .increment(merged as u64);
        }
        Ok(())
    }
}

/// How many partitions [`warm_copies`] catches up at once (each reads with its own
/// Kafka client).
const WARM_AT_ONCE: usize = 4;

/// Catches every copy of `partitions` up with the region's own deltas before the node
/// joins its region's group (it owns none of them yet): its copies went stale while it
/// was down, and while a learner waited for its lease table, so a partition it is then
/// assigned catches up only what was shipped since, after its previous owner stopped
/// writing it. A copy that cannot be caught up now (Kafka slow or down) is caught up at
/// its take, as without this. The remote regions' deltas are left to the mergers (a
/// mirrored topic may not exist yet, or be refused for its partition count).
pub async fn warm_copies(
    config: &Arc<Config>,
    hlc: &Arc<Hlc>,
    store: &Arc<Store>,
    partitions: &[i32],
) -> Result<(), BootstrapError> {
    let started = std::time::Instant::now();
    let mut warming = futures_util::stream::iter(partitions.iter().copied())
        .map(|p| async move { (p, bootstrap::catch_up(config, hlc, store, p, &|| {}).await) })
        .buffer_unordered(WARM_AT_ONCE);
    while let Some((partition, caught_up)) = warming.next().await {
        match caught_up.map_err(Retry::fatal) {
            Ok(caught_up) => metrics::counter!(m::CATCH_UP_DELTAS, "by" => "join")
                .increment(caught_up.recovered.deltas as u64),
            Err(Ok(e)) => {
                tracing::warn!(partition, error = %e, "catching a copy up before joining failed; its take catches it up")
            }
            Err(Err(fatal)) => return Err(fatal),
        }
    }
    tracing::info!(
        partitions = partitions.len(),
        took_ms = started.elapsed().as_millis() as u64,
        "caught this node's copies up before joining the region's group"
    );
    Ok(())
}

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
        compression: config.replication.compression,
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

/// `work`'s outcome and how long it took.
async fn timed<T>(work: impl std::future::Future<Output = T>) -> (T, Duration) {
    let started = std::time::Instant::now();
    (work.await, started.elapsed())
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

/// A partition caught up and fenced, its shipper not started yet.
struct Ready {
    partition: i32,
    producer: log::Transactional,
    caught_up: bootstrap::CaughtUp,
    /// How far the store applied its updates.
    applied: Option<i64>,
    /// Its updates' end when it was readied.
    end: i64,
    started: std::time::Instant,
    /// How long its producer's `init_transactions` (the fencing) took.
    fenced: Duration,
    /// How long until a standby refresh of it in progress ended (meanwhile fencing).
    waited: Duration,
    /// How long catching its copy up took, and (meanwhile) reading its end.
    caught: Duration,
    read_end: Duration,
}

/// A shipper task's partition and how it ended.
type Ended = (i32, Result<(), ShipError>);

/// One running shipper, of the partition's term `handle`.
struct Shipping {
    hand_off: watch::Sender<bool>,
    task: tokio::task::AbortHandle,
    handle: Arc<PartitionHandle>,
}

pub struct Keeper {
    pub config: Arc<Config>,
    pub store: Arc<Store>,
    pub hlc: Arc<Hlc>,
    /// The node's partitions: a take creates a partition's handle, a give-up cuts it.
    pub partitions: Arc<Partitions>,
    pub actor: Actor,
    pub changes: mpsc::UnboundedReceiver<Change>,
    /// Told once the first assignment was taken (empty or not).
    pub first_taken: Option<tokio::sync::oneshot::Sender<()>>,
    pub copies: Arc<Copies>,
    /// What each partition's copy holds of the remote regions: loaded at each take.
    pub freshness: Arc<Freshness>,
    /// The final windows the shippers produce, if any namespace outputs them.
    pub outputs: Option<Arc<Outputs>>,
}

impl Keeper {
    /// Runs until `stop`; ends early only if the group member stops or a partition
    /// cannot be caught up from the store.
    pub async fn run(mut self, mut stop: watch::Receiver<bool>) -> Result<(), KeeperError> {
        let mut shippers: BTreeMap<i32, Shipping> = BTreeMap::new();
        let mut running: JoinSet<Ended> = JoinSet::new();
        // what the group assigns this node (a partition fenced by another node stays in
        // it until the group revokes it)
        let mut assigned: BTreeSet<i32> = BTreeSet::new();
        // partitions to take again, once RETAKE_AFTER passed without a revoke
        let mut retakes: JoinSet<i32> = JoinSet::new();
        loop {
            tokio::select! {
                () = stopped(&mut stop) => break,
                change = self.changes.recv() => match change {
                    None => return Err(KeeperError::MemberGone),
                    // the node stops: it handed every partition off before it left
                    Some(Change::Left) => break,
                    Some(Change::Assigned(partitions)) => {
                        assigned.extend(&partitions);
                        self.take(partitions, &mut shippers, &mut running, &stop).await?;
                        if let Some(first) = self.first_taken.take() {
                            let _ = first.send(());
                        }
                    }
                    Some(Change::Revoked { partitions, lost, done }) => {
                        assigned.retain(|p| !partitions.contains(p));
                        let others = self.give_up(&partitions, lost, &mut shippers, &mut running).await;
                        self.copies.keep(&shippers);
                        let _ = done.send(());
                        for (p, result) in others {
                            self.shipper_ended(p, result, &mut shippers, &mut retakes).await?;
                        }
                    }
                },
                Some(ended) = running.join_next_with_id() => {
                    if let Some((p, result)) = shipper_outcome(ended, shippers.iter()) {
                        self.shipper_ended(p, result, &mut shippers, &mut retakes).await?;
                    }
                }
                Some(Ok(p)) = retakes.join_next() => {
                    // still assigned here, unrevoked: the node that fenced this one holds
                    // no assignment of it (it lost it while taking it): take it back
                    if assigned.contains(&p) && !shippers.contains_key(&p) {
                        tracing::warn!(partition = p, after = ?RETAKE_AFTER, "the group still assigns this node a partition another node fenced it out of: taking it again");
                        metrics::counter!(m::PARTITIONS_RETAKEN).increment(1);
                        self.take(vec![p], &mut shippers, &mut running, &stop).await?;
                    }
                }
            }
        }
        // the node stops: every shipper sees the same signal and ends
        while running.join_next().await.is_some() {}
        Ok(())
    }

    /// Takes every partition of `partitions` not running here yet, all at once: each
    /// partition has its own instance and producer, and serves once it is ready.
    async fn take(
        &self,
        partitions: Vec<i32>,
        shippers: &mut BTreeMap<i32, Shipping>,
        running: &mut JoinSet<Ended>,
        stop: &watch::Receiver<bool>,
    ) -> Result<(), KeeperError> {
        let new: Vec<i32> = partitions
            .into_iter()
            .filter(|p| !shippers.contains_key(p))
            .collect();
        let mut readying: futures_util::stream::FuturesUnordered<_> =
            new.iter().map(|&p| self.ready(p, stop.clone())).collect();
        // each partition is owned as soon as it is ready
        while let Some(ready) = readying.next().await {
            let Some(ready) = ready.inspect_err(|_| self.copies.keep(shippers))? else {
                continue;
            };
            let (p, shipping) = self.start(ready, running, stop);
            shippers.insert(p, shipping);
        }
        self.copies.keep(shippers);
        Ok(())
    }

    /// Readies `partition` to be taken: fences its previous owner and catches its copy
    /// up. `None` if asked to stop meanwhile.
    async fn ready(
        &self,
        partition: i32,
        mut stop: watch::Receiver<bool>,
    ) -> Result<Option<Ready>, KeeperError> {
        let started = std::time::Instant::now();
        let fencing = retried(
            "starting its shipping producer",
            partition,
            &mut stop,
            || ship_producer(&self.config, partition),
        );
        // a standby refresh of the partition in progress ends meanwhile
        let copying = self.copies.take(partition);
        let ((producer, fenced), (copy, waited)) = tokio::join!(timed(fencing), timed(copying));
        let Some(producer) = producer.unwrap_or_else(|never| match never {}) else {
            return Ok(None);
        };
        let topic = &self.config.kafka.updates_topic;
        let mut also_stop = stop.clone();
        // reads go on from the copy while it catches up (merges only add to it), and stop
        // before it is discarded
        let discarding = || self.partitions.forget_copy(partition);
        let caught_up = retried("catching it up", partition, &mut stop, || {
            bootstrap::catch_up(&self.config, &self.hlc, &self.store, partition, &discarding)
        });
        // what the previous owner may have applied and acknowledged: up to the end now
        let ends = retried("reading its end", partition, &mut also_stop, || {
            log::end_offsets(&self.config.kafka, topic, vec![partition])
        });
        let ((caught_up, caught), (ends, read_end)) = tokio::join!(timed(caught_up), timed(ends));
        let caught_up = match caught_up {
            Ok(Some(caught_up)) => caught_up,
            Ok(None) => return Ok(None),
            Err(source) => return Err(KeeperError::CatchUp { partition, source }),
        };
        drop(copy);
        let Some(ends) = ends.unwrap_or_else(|never| match never {}) else {
            return Ok(None);
        };
        metrics::counter!(m::CATCH_UP_DELTAS, "by" => "take")
            .increment(caught_up.recovered.deltas as u64);
        let held = self.store.remote_applied(partition);
        let held = held.map_err(|e| KeeperError::CatchUp {
            partition,
            source: e.into(),
        })?;
        let now = self.hlc.physical().now_nanos();
        self.freshness.taken(partition, held, now);
        let end = ends.get(&partition).copied().unwrap_or(0);
        let applied = self
            .store
            .source_offsets(topic)
            .map_err(|e| KeeperError::CatchUp {
                partition,
                source: e.into(),
            })?
            .get(&partition)
            .copied();
        Ok(Some(Ready {
            partition,
            producer,
            caught_up,
            applied,
            end,
            started,
            fenced,
            waited,
            caught,
            read_end,
        }))
    }

    /// Takes a readied partition: starts its shipper, then owns it.
    fn start(
        &self,
        ready: Ready,
        running: &mut JoinSet<Ended>,
        stop: &watch::Receiver<bool>,
    ) -> (i32, Shipping) {
        let Ready {
            partition,
            producer,
            caught_up,
            applied,
            end,
            started,
            fenced,
            waited,
            caught,
            read_end,
        } = ready;
        let (hand_off, handing_off) = watch::channel(false);
        let handle = self.partitions.take(partition, applied, end);
        let shipper = Shipper {
            store: self.store.clone(),
            partition,
            producer,
            kafka: self.config.kafka.clone(),
            actor: self.actor.clone(),
            wake: handle.commits(),
            shipped: self.partitions.shipped.clone(),
            clock: self.hlc.physical().clone(),
            replayed: handle.replay(),
            hand_off: handing_off,
            handle: handle.clone(),
            outputs: self.outputs.clone(),
            ship_every: self.config.replication.ship_every,
        };
        let run = shipper.run(stop.clone());
        let task = running.spawn(async move { (partition, run.await) });
        let recovered = &caught_up.recovered;
        tracing::info!(
            partition,
            deltas = recovered.deltas,
            keys = recovered.keys,
            discarded = caught_up.discarded,
            resume = ?recovered.resume.as_ref().map(|r| &r.updates_offsets),
            applied = ?applied,
            end,
            fenced_ms = fenced.as_millis() as u64,
            waited_ms = waited.as_millis() as u64,
            caught_up_ms = caught.as_millis() as u64,
            read_end_ms = read_end.as_millis() as u64,
            took_ms = started.elapsed().as_millis() as u64,
            "took the partition"
        );
        (
            partition,
            Shipping {
                hand_off,
                task,
                handle,
            },
        )
    }

    /// What the keeper does when the shipper of `p` ended with `result` on its own (not
    /// handed off): after a fence, it stops writing `p` and takes it again later if the
    /// group still assigns it here; after any other failure the node stops (a partition
    /// owned with no shipper would acknowledge writes nobody ships).
    async fn shipper_ended(
        &self,
        p: i32,
        result: Result<(), ShipError>,
        shippers: &mut BTreeMap<i32, Shipping>,
        retakes: &mut JoinSet<i32>,
    ) -> Result<(), KeeperError> {
        let shipping = shippers.remove(&p);
        self.copies.keep(shippers);
        match result {
            // a shipper ends on its own only when handed off or stopped
            Ok(()) => Ok(()),
            Err(ShipError::Fatal(why)) => {
                tracing::error!(partition = p, %why, "another node ships this partition now: this node stops writing it");
                let handles = self.partitions.let_go(&[p]);
                for handle in handles.iter().chain(shipping.as_ref().map(|s| &s.handle)) {
                    handle.cut();
                }
                retakes.spawn(async move {
                    tokio::time::sleep(RETAKE_AFTER).await;
                    p
                });
                Ok(())
            }
            Err(e) => Err(KeeperError::Shipper(format!(
                "the shipper of partition {p}: {e}"
            ))),
        }
    }

    /// Gives up `partitions`: ingest stops reading them (its batch committed), then each
    /// shipper ships what is left (unless the group already moved them: `lost`) and ends.
    /// From the wait's end, nothing of ingest's commits to them ([`PartitionHandle::cut`]).
    /// Answers how the other shippers that ended meanwhile ended (for
    /// [`Keeper::shipper_ended`]).
    async fn give_up(
        &self,
        partitions: &[i32],
        lost: bool,
        shippers: &mut BTreeMap<i32, Shipping>,
        running: &mut JoinSet<Ended>,
    ) -> Vec<Ended> {
        let started = std::time::Instant::now();
        let handles = self.partitions.let_go(partitions);
        let ingest_done = futures_util::future::join_all(handles.iter().map(|h| h.not_read()));
        if tokio::time::timeout(REVOKE_WAIT / 2, ingest_done)
            .await
            .is_err()
        {
            tracing::warn!(
                ?partitions,
                "ingest did not stop reading the revoked partitions in time: its batch of them is not committed"
            );
        }
        for handle in &handles {
            handle.cut();
        }
        let mut others = Vec::new();
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
            let Ok(Some(ended)) =
                tokio::time::timeout_at(deadline, running.join_next_with_id()).await
            else {
                break;
            };
            let shipping = handed.iter().map(|(p, s)| (p, s)).chain(shippers.iter());
            let Some((p, result)) = shipper_outcome(ended, shipping) else {
                continue;
            };
            if !handed.iter().any(|(q, _)| *q == p) {
                others.push((p, result));
                continue;
            }
            if let Err(e) = result {
                tracing::warn!(partition = p, error = %e, "the partition's last round failed");
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
        others
    }
}

/// The partition of a shipper task that ended, found by its task among `shipping`, and
/// how it ended (a panic as a failure of its shipper); `None` for a task the keeper
/// aborted or no longer tracks (a partition taken again since has another task).
fn shipper_outcome<'a>(
    ended: Result<(tokio::task::Id, Ended), tokio::task::JoinError>,
    mut shipping: impl Iterator<Item = (&'a i32, &'a Shipping)>,
) -> Option<Ended> {
    let (id, result) = match ended {
        Ok((id, (_, result))) => (id, result),
        Err(e) if e.is_cancelled() => return None,
        Err(e) => (e.id(), Err(ShipError::Panicked)),
    };
    let (&p, _) = shipping.find(|(_, s)| s.task.id() == id)?;
    Some((p, result))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::store::StoreError;

    /// A keeper of a region whose Kafka is never reached, on a store in `dir`.
    fn keeper(dir: &std::path::Path) -> Keeper {
        let config = Arc::new(Config::load(&crate::repo_file("regions/us-east-1.toml")).unwrap());
        let clock = Arc::new(ManualClock::new(1_000_000_000));
        let (_changes, changes) = mpsc::unbounded_channel();
        Keeper {
            store: Arc::new(Store::open(dir, 2).unwrap()),
            hlc: Arc::new(Hlc::new(clock, Duration::from_millis(500))),
            partitions: Arc::new(Partitions::default()),
            actor: Actor::new(config.region.clone(), 1),
            changes,
            first_taken: None,
            copies: Arc::new(Copies::new([0, 1])),
            freshness: Arc::new(Freshness::default()),
            outputs: None,
            config,
        }
    }

    /// A shipper of `p` that ends with `ends` once handed off (`None`: at once).
    fn shipper(
        running: &mut JoinSet<Ended>,
        p: i32,
        handed: bool,
        ends: Result<(), ShipError>,
        handle: Arc<PartitionHandle>,
    ) -> Shipping {
        let (hand_off, mut handing_off) = watch::channel(false);
        let task = running.spawn(async move {
            if handed {
                let _ = handing_off.wait_for(|&h| h).await;
            }
            (p, ends)
        });
        Shipping {
            hand_off,
            task,
            handle,
        }
    }

    /// Another partition's shipper that ends while a revoke hands one off is not lost:
    /// a storage failure stops the node (a partition owned with no shipper would
    /// acknowledge writes nobody ships), a fence lets the partition go and takes it again
    /// later.
    #[tokio::test]
    async fn a_shipper_that_ends_during_a_hand_off_is_dealt_with_as_at_any_time() {
        let dir = tempfile::tempdir().unwrap();
        let keeper = keeper(dir.path());
        for (failure, stops) in [
            (ShipError::Store(StoreError::Task("disk gone".into())), true),
            (ShipError::Fatal("fenced".into()), false),
        ] {
            let mut running = JoinSet::new();
            let mut shippers = BTreeMap::new();
            let (zero, one) = (
                keeper.partitions.take(0, None, 0),
                keeper.partitions.take(1, None, 0),
            );
            shippers.insert(0, shipper(&mut running, 0, true, Ok(()), zero));
            shippers.insert(1, shipper(&mut running, 1, false, Err(failure), one));
            // the other shipper ends first
            tokio::task::yield_now().await;
            let others = keeper
                .give_up(&[0], false, &mut shippers, &mut running)
                .await;
            assert_eq!(others.len(), 1, "partition 1's end is reported");
            let (p, result) = others.into_iter().next().unwrap();
            assert_eq!(p, 1);
            let mut retakes = JoinSet::new();
            let ended = keeper
                .shipper_ended(p, result, &mut shippers, &mut retakes)
                .await;
            assert_eq!(ended.is_err(), stops, "{ended:?}");
            if !stops {
                assert!(!keeper.partitions.owns(1));
                assert_eq!(retakes.len(), 1);
            }
            assert!(shippers.is_empty());
        }
    }

    fn owners(pairs: &[(i32, &str)]) -> BTreeMap<i32, String> {
        pairs.iter().map(|(p, n)| (*p, n.to_string())).collect()
    }

    /// Every partition gets exactly `replicas` standbys (as many as there are other nodes
    /// at most), never its owner.
    #[test]
    fn each_partition_has_its_standbys_on_other_nodes() {
        let owned = owners(&[(0, "a"), (1, "a"), (2, "b"), (3, "c"), (4, "c"), (5, "b")]);
        for replicas in [0, 1, 2] {
            let per_node: BTreeMap<&str, BTreeSet<i32>> = ["a", "b", "c"]
                .into_iter()
                .map(|n| (n, standbys(&owned, n, replicas)))
                .collect();
            for (&p, owner) in &owned {
                let keeping: Vec<&str> = per_node
                    .iter()
                    .filter(|(_, s)| s.contains(&p))
                    .map(|(n, _)| *n)
                    .collect();
                assert_eq!(keeping.len(), replicas, "partition {p}: {keeping:?}");
                assert!(!keeping.contains(&owner.as_str()));
            }
        }
        // two nodes: each keeps the other's partitions
        let two = owners(&[(0, "a"), (1, "b"), (2, "a"), (3, "b")]);
        assert_eq!(standbys(&two, "a", 1), BTreeSet::from([1, 3]));
        assert_eq!(standbys(&two, "b", 5), BTreeSet::from([0, 2]));
    }
}
