//! The write path of `Update`: an owned key's write admitted under its lease (or
//! forwarded to the holder region), checked, stamped and appended to the updates topic,
//! and acknowledged once ingest applied it; and the wait a linearizable operation (a
//! compare-and-set, a `leaseholder` read) makes at a new holder for earlier holders' writes.
//!
//! ```text
//!  UpdateRequest ──admit──► Unowned | Stamp(epoch) ──checked──► append ──► applied ──► ack
//!                             └─ Forward ──► holder region's API (once)
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use tonic::Request;
use tracing::Span;
use tracing::field::Empty;

use super::{ApiError, FORWARDED, Handler, convert};
use crate::config::{Ownership, RecordFormat};
use crate::crdt::CrdtType;
use crate::ingest::batch::event_time_within;
use crate::ingest::event::{Op, Update};
use crate::lease::leases::NotHolder;
use crate::log::Made;
use crate::metrics as m;
use crate::partition::{Outcome, PartitionHandle};
use crate::pb;

/// How a write of an owned key is admitted here.
enum Admit {
    /// Not owned: any region writes it.
    Unowned,
    /// This region holds the key's lease at this epoch.
    Stamp(u64),
    /// Another region holds it (or none does).
    Forward(NotHolder),
}

/// How long `Update` waits for its record to be applied.
const APPLY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a linearizable operation at a new lease holder waits for the earlier holders'
/// writes before it is answered UNAVAILABLE.
const SETTLE_WAIT: Duration = Duration::from_secs(2);

impl Handler {
    /// A write: admitted under the key's lease if it is owned (or forwarded to the
    /// holder), checked, stamped and appended to the updates topic, acknowledged once
    /// ingest applied it (and, if owned, while the lease it was stamped under holds).
    /// Its span (debug: `RUST_LOG=info,geostate::api=debug`) names the key, epoch,
    /// partition and offset; the log has a line for it when it ends, with its time.
    // target: the API module's, as the operations docs show it (this file is part of it)
    #[tracing::instrument(name = "update", target = "geostate::api", level = "debug", skip_all,
        fields(key = %req.key, epoch = Empty, partition = Empty, offset = Empty))]
    pub(super) async fn update(
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
        // before the record exists: the term of its partition here (a take after this
        // starts another)
        let term = api.owned.get(self.partition_of(&update.key));
        let (partition, offset) = self.append(&mut update, crdt).await?;
        Span::current()
            .record("partition", partition)
            .record("offset", offset);
        let acked = Instant::now();
        m::write_stage("produce", acked - produced);
        self.applied(term, partition, offset).await?;
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

    /// Waits (at most [`SETTLE_WAIT`]) until a linearizable operation on `key`, held here
    /// at `epoch`, sees every write acknowledged before it: the key's value was written at
    /// this epoch (no older write can win over it), or every other region's heartbeats on
    /// every partition have passed the moment this region learnt of the epoch plus the
    /// clock offset. Those regions' leases on the shard had ended by then, and they
    /// acknowledge an owned write only if it was applied while their lease was valid, so
    /// everything they acknowledged was shipped before those heartbeats.
    pub(super) async fn settled(&self, key: &str, shard: u32, epoch: u64) -> Result<(), ApiError> {
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

    /// Refuses what ingest would refuse, before it enters the log; answers the key's
    /// type.
    fn checked(&self, update: &Update) -> Result<CrdtType, ApiError> {
        let config = &self.0.config;
        let ns = update
            .check(&config.namespaces, &config.ingest)
            .map_err(ApiError::Refused)?;
        // the record's timestamp will be this clock's now, or later
        if let Some(t) = update.event_time_ms.filter(|_| ns.window.is_some()) {
            let now_ms =
                i64::try_from(self.0.hlc.physical().now_nanos() / 1_000_000).unwrap_or(i64::MAX);
            event_time_within(&update.key, t, now_ms, config.max_clock_offset)
                .map_err(ApiError::Refused)?;
        }
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

    /// Waits until ingest applied the record at `partition`/`offset`, appended in the
    /// partition's term `term` here, and answers how it was decided.
    async fn applied(
        &self,
        term: Option<Arc<PartitionHandle>>,
        partition: i32,
        offset: i64,
    ) -> Result<(), ApiError> {
        // let go before the record was appended: the partition's next owner decides it
        let Some(term) = term.filter(|t| t.partition == partition) else {
            return self.decided(Outcome::Moved, partition, offset);
        };
        let Ok(outcome) = tokio::time::timeout(APPLY_TIMEOUT, term.passed(offset)).await else {
            let (keys, max) = (
                self.0.store.outbox_len_in(&self.0.owned.owned()),
                self.0.config.replication.max_outbox_keys,
            );
            return Err(ApiError::NotApplied {
                partition,
                offset,
                seconds: APPLY_TIMEOUT.as_secs(),
                applied: term.applied(),
                outbox_full: (keys >= max).then_some((keys, max)),
            });
        };
        self.decided(outcome, partition, offset)
    }

    /// The answer to a write whose record at `partition`/`offset` was decided so.
    fn decided(&self, outcome: Outcome, partition: i32, offset: i64) -> Result<(), ApiError> {
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
}
