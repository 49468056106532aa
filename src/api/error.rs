//! The one place errors become gRPC statuses: every domain error reaches it as a type
//! (a failed lease proposal is not a Kafka error), and `Watch`'s in-stream errors too.

use tonic::{Code, Status};

use crate::checkpoint::CheckpointError;
use crate::ingest::event::Rejection;
use crate::lease::leases::{Lapsed, NotHolder, TransferError};
use crate::log::LogError;
use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    Refused(Rejection),
    /// An owned write at a region without a valid lease on the key's shard.
    #[error(transparent)]
    NotHolder(NotHolder),
    #[error("{0}")]
    Precondition(String),
    /// A linearizable operation at a new holder that has not yet merged what the shard's
    /// earlier holders applied.
    #[error(
        "shard {shard} changed hands (epoch {epoch} began here) and {region}'s writes from before have not all arrived yet; retry, or write the key first"
    )]
    Settling {
        shard: u32,
        epoch: u64,
        region: String,
    },
    /// An owned write applied after this region's lease on its shard ended.
    #[error(
        "the lease on shard {shard} ended before the write was applied: it may or may not take effect"
    )]
    LeaseEnded { shard: u32 },
    /// The answer of the node of this region a request was routed to (it owns the key's
    /// partition).
    #[error("routed to {node}: {}", status.message())]
    Routed { node: String, status: tonic::Status },
    /// The holder region's answer to a forwarded owned write.
    #[error("forwarded to the lease holder: {}", .0.message())]
    Forwarded(tonic::Status),
    #[error("{key:?} has no value: the register was never set")]
    NotFound { key: String },
    /// A window of a windowed key past the namespace's retention: its slices are gone.
    #[error(
        "{key:?}: the window starting at {start_ms} ms was final longer than the namespace's retention, and is deleted"
    )]
    WindowExpired { key: String, start_ms: u64 },
    #[error("{0}")]
    InvalidArgument(String),
    /// A request or stream over a configured limit (named in the message).
    #[error("{0}")]
    TooMuch(String),
    /// Kafka did not take or answer a request.
    #[error(transparent)]
    Kafka(#[from] LogError),
    /// The node is stopping: what was asked may or may not have been done.
    #[error("the node is stopping")]
    Stopping,
    /// `Admin/TransferLease` was not done.
    #[error("lease transfer: {0}")]
    Transfer(#[from] TransferError),
    /// A checkpoint or savepoint was asked for and failed.
    #[error("{what} failed: {source}")]
    Checkpoint {
        what: &'static str,
        source: CheckpointError,
    },
    /// A `Watch` fell so far behind the changes that some are gone for it.
    #[error("watcher fell {batches} batches behind; scan and watch again")]
    WatcherBehind { batches: u64 },
    /// Partitions moved between the region's nodes while a `Watch` was open: a moving
    /// partition's changes may have been missed.
    #[error(
        "the region's partitions moved between its nodes while this Watch was open (a moving partition's changes may be missed); scan and watch again"
    )]
    WatchMoved,
    /// So many records were refused since this one that its own outcome is forgotten.
    #[error(
        "appended at {partition}/{offset} and passed by ingest, but so many records were refused since that this node no longer knows whether it was applied: outcome unknown"
    )]
    OutcomeForgotten { partition: i32, offset: i64 },
    /// The write's partition moved to another node of the region before this node
    /// applied it.
    #[error(
        "appended at {partition}/{offset}, but the partition moved to another node of this region before this node applied it: that node applies it (once, by its id); outcome unknown here, retry with the same id"
    )]
    MovedBeforeApplied { partition: i32, offset: i64 },
    #[error(
        "appended at {partition}/{offset} but not applied within {seconds}s (applied up to {applied:?} on that partition){}",
        outbox_full.map_or(String::new(), |(keys, max)| format!("; ingest waits for shipping: the outbox holds {keys} keys, replication.max-outbox-keys is {max}"))
    )]
    NotApplied {
        partition: i32,
        offset: i64,
        seconds: u64,
        applied: Option<i64>,
        /// The outbox's keys and its bound, when it is full (why ingest did not go on).
        outbox_full: Option<(usize, usize)>,
    },
    /// The key's partition is owned by another node of this region, or by none while it
    /// moves.
    #[error("partition {partition} (of key {key:?}) is {}", owner.as_ref().map_or("moving between this region's nodes; retry".to_string(), |o| format!("owned by the node at {o}; ask it (Admin/Route)")))]
    NotOwner {
        key: String,
        partition: i32,
        owner: Option<String>,
    },
    #[error("storage failure: {0}")]
    Store(#[from] StoreError),
    #[error("internal error: {0}")]
    Internal(String),
}

impl ApiError {
    pub fn code(&self) -> Code {
        match self {
            // its own lapsed lease, renewing: transient; any other: ask the holder
            ApiError::NotHolder(n) => match n.lapsed {
                Some(Lapsed::Renewing) => Code::Unavailable,
                Some(Lapsed::NotRenewing) | None => Code::FailedPrecondition,
            },
            ApiError::Refused(
                Rejection::OwnedWithoutLease { .. }
                | Rejection::Fenced { .. }
                | Rejection::CompareFailed { .. }
                | Rejection::Late { .. },
            )
            | ApiError::Precondition(_)
            | ApiError::Transfer(TransferError::NotHeld(_) | TransferError::Refused(_)) => {
                Code::FailedPrecondition
            }
            ApiError::Transfer(TransferError::NoShard { .. } | TransferError::NoRegion(_)) => {
                Code::InvalidArgument
            }
            ApiError::Refused(Rejection::Overflow(_) | Rejection::EventTimeAhead { .. })
            | ApiError::WindowExpired { .. } => Code::OutOfRange,
            ApiError::Refused(_) | ApiError::InvalidArgument(_) => Code::InvalidArgument,
            ApiError::NotFound { .. } => Code::NotFound,
            ApiError::TooMuch(_) => Code::ResourceExhausted,
            ApiError::Kafka(_)
            | ApiError::Stopping
            | ApiError::Transfer(TransferError::Propose(_))
            | ApiError::Checkpoint { .. }
            | ApiError::Settling { .. }
            | ApiError::LeaseEnded { .. }
            | ApiError::NotOwner { .. }
            | ApiError::WatchMoved
            | ApiError::OutcomeForgotten { .. }
            | ApiError::MovedBeforeApplied { .. } => Code::Unavailable,
            ApiError::NotApplied { .. } => Code::DeadlineExceeded,
            ApiError::WatcherBehind { .. } => Code::DataLoss,
            ApiError::Store(_)
            | ApiError::Internal(_)
            | ApiError::Transfer(TransferError::NoOutcome) => Code::Internal,
            // the connection to the other node failed or broke on the way (tonic made the
            // status here, from its cause): the request may or may not have arrived
            ApiError::Forwarded(s) | ApiError::Routed { status: s, .. }
                if std::error::Error::source(s).is_some() =>
            {
                Code::Unavailable
            }
            ApiError::Forwarded(s) | ApiError::Routed { status: s, .. } => s.code(),
        }
    }
}

impl From<ApiError> for Status {
    fn from(e: ApiError) -> Status {
        Status::new(e.code(), e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::network::ProposeError;
    use crate::lease::table::Refusal;

    /// Each domain error keeps its own code and its own words: a lease group that does
    /// not answer is not "kafka".
    #[test]
    fn domain_errors_map_to_their_codes_and_name_their_cause() {
        let cases = [
            (
                ApiError::Transfer(TransferError::Propose(ProposeError::NoLeader)),
                Code::Unavailable,
                "lease transfer: no leader of the lease group is known",
            ),
            (
                ApiError::Transfer(TransferError::Refused(Refusal::StaleEpoch)),
                Code::FailedPrecondition,
                "lease transfer: refused: StaleEpoch",
            ),
            (
                ApiError::Transfer(TransferError::NoShard {
                    shard: 9,
                    shards: 8,
                }),
                Code::InvalidArgument,
                "lease transfer: shard 9 does not exist (0..8)",
            ),
            (
                ApiError::Transfer(TransferError::NoOutcome),
                Code::Internal,
                "lease transfer: the lease group applied the transfer without an outcome",
            ),
            (
                ApiError::Stopping,
                Code::Unavailable,
                "the node is stopping",
            ),
            (
                ApiError::NotApplied {
                    partition: 2,
                    offset: 41,
                    seconds: 30,
                    applied: Some(7),
                    outbox_full: Some((500, 500)),
                },
                Code::DeadlineExceeded,
                "appended at 2/41 but not applied within 30s (applied up to Some(7) on that partition); ingest waits for shipping: the outbox holds 500 keys, replication.max-outbox-keys is 500",
            ),
            (
                ApiError::Checkpoint {
                    what: "savepoint",
                    source: CheckpointError::Io {
                        what: "writing the savepoint".into(),
                        source: std::io::Error::other("disk full"),
                    },
                },
                Code::Unavailable,
                "savepoint failed: writing the savepoint: disk full",
            ),
            (
                ApiError::NotOwner {
                    key: "drivers/9q8yy".into(),
                    partition: 3,
                    owner: Some("127.0.0.1:7001".into()),
                },
                Code::Unavailable,
                "partition 3 (of key \"drivers/9q8yy\") is owned by the node at 127.0.0.1:7001; ask it (Admin/Route)",
            ),
            (
                ApiError::MovedBeforeApplied {
                    partition: 2,
                    offset: 41,
                },
                Code::Unavailable,
                "appended at 2/41, but the partition moved to another node of this region before this node applied it: that node applies it (once, by its id); outcome unknown here, retry with the same id",
            ),
            (
                ApiError::WatcherBehind { batches: 3 },
                Code::DataLoss,
                "watcher fell 3 batches behind; scan and watch again",
            ),
            (
                ApiError::Kafka(LogError::NoPartitions {
                    topic: "geostate.updates".into(),
                }),
                Code::Unavailable,
                "topic geostate.updates does not exist or has no partitions",
            ),
        ];
        for (error, code, message) in cases {
            let status = Status::from(error);
            assert_eq!((status.code(), status.message()), (code, message));
        }
    }

    /// A routed request whose connection broke on the way is UNAVAILABLE (to retry), not
    /// the UNKNOWN tonic gives it; the other node's own answer keeps its code.
    #[test]
    fn a_broken_connection_to_the_routed_node_is_unavailable() {
        let routed = |status| ApiError::Routed {
            node: "127.0.0.1:7001".into(),
            status,
        };
        let broken = Status::from_error(Box::new(std::io::Error::other("connection reset")));
        assert_eq!(broken.code(), Code::Unknown);
        let status = Status::from(routed(broken));
        assert_eq!(status.code(), Code::Unavailable);
        assert_eq!(
            status.message(),
            "routed to 127.0.0.1:7001: connection reset"
        );
        let answered = Status::from(routed(Status::unknown("the node's own answer")));
        assert_eq!(answered.code(), Code::Unknown);
        let forwarded = ApiError::Forwarded(Status::from_error(Box::new(std::io::Error::other(
            "broken pipe",
        ))));
        assert_eq!(Status::from(forwarded).code(), Code::Unavailable);
    }
}
