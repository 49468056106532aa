//! The work of the `Admin` service: the node's status (how far ingest and every remote
//! region's merger have read, checkpoints, sidecars), checkpoints and savepoints on
//! request, and the region's leases on owned shards.

use std::collections::BTreeMap;

use super::{ApiError, Handler, convert};
use crate::checkpoint;
use crate::config::Ownership;
use crate::lease::leases::ShardStatus;
use crate::pb;

impl Handler {
    /// `Status`: how far ingest and every remote region's merger have read against the
    /// topics' ends, how fresh the state is, the last checkpoint and the user functions.
    pub(super) async fn status(&self) -> Result<pb::StatusResponse, ApiError> {
        let api = &self.0;
        let applied = api.owned.applied();
        let ends = api
            .end_offsets(
                &api.config.kafka,
                &api.config.kafka.updates_topic,
                api.partitions.clone(),
            )
            .await;
        let owned: Vec<i32> = api.owned.owned().into_iter().collect();
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
                .owned
                .events_applied
                .load(std::sync::atomic::Ordering::Relaxed),
            events_dead_lettered: api
                .owned
                .events_dead_lettered
                .load(std::sync::atomic::Ordering::Relaxed),
            remotes,
            checkpoint: Some(self.checkpoint_status()),
            owned_partitions: owned,
            node: api.address.clone(),
            functions: api.functions.iter().map(|f| f.status()).collect(),
        })
    }

    /// The last checkpoint taken here, the one the node restored from, and the
    /// checkpointer's counts.
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

    /// `Checkpoint`: asks the checkpointer for one now and answers it once taken.
    pub(super) async fn checkpoint(&self) -> Result<pb::CheckpointResponse, ApiError> {
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

    /// Every shard, or (`key` set) the shard of an owned key.
    pub(super) async fn list_leases(
        &self,
        req: pb::LeasesRequest,
    ) -> Result<pb::LeasesResponse, ApiError> {
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

    /// `TransferLease`: moves a shard's lease to another region.
    pub(super) async fn transfer_lease(
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

    /// `Savepoint`: writes the state to the checkpoint store now.
    pub(super) async fn savepoint(&self) -> Result<pb::SavepointResponse, ApiError> {
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

/// A shard and its lease as `Leases` and `TransferLease` answer them.
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
