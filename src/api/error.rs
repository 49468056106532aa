//! The one place errors become gRPC statuses.

use tonic::{Code, Status};

use crate::ingest::event::Rejection;
use crate::lease::manager::NotHolder;
use crate::log::LogError;
use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    Refused(Rejection),
    /// An owned write at a region without a valid lease on the key's shard.
    #[error("{0}; ask the holder region")]
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
    /// The holder region's answer to a forwarded owned write.
    #[error("forwarded to the lease holder: {}", .0.message())]
    Forwarded(tonic::Status),
    #[error("{key:?} has no value: the register was never set")]
    NotFound { key: String },
    #[error("{0}")]
    InvalidArgument(String),
    /// A request or stream over a configured limit (named in the message).
    #[error("{0}")]
    TooMuch(String),
    #[error("kafka is unreachable: {0}")]
    Unavailable(String),
    /// The checkpoint store failed or the node is stopping.
    #[error("{0}")]
    NotNow(String),
    /// So many records were refused since this one that its own outcome is forgotten.
    #[error(
        "appended at {partition}/{offset} and passed by ingest, but so many records were refused since that this node no longer knows whether it was applied: outcome unknown"
    )]
    OutcomeForgotten { partition: i32, offset: i64 },
    #[error(
        "appended at {partition}/{offset} but not applied within {seconds}s (applied up to {applied:?} on that partition)"
    )]
    NotApplied {
        partition: i32,
        offset: i64,
        seconds: u64,
        applied: Option<i64>,
    },
    #[error("storage failure: {0}")]
    Store(#[from] StoreError),
    #[error("internal error: {0}")]
    Internal(String),
}

impl From<LogError> for ApiError {
    fn from(e: LogError) -> Self {
        ApiError::Unavailable(e.to_string())
    }
}

impl ApiError {
    pub fn code(&self) -> Code {
        match self {
            ApiError::Refused(
                Rejection::OwnedWithoutLease { .. }
                | Rejection::Fenced { .. }
                | Rejection::CompareFailed { .. },
            )
            | ApiError::NotHolder(_)
            | ApiError::Precondition(_) => Code::FailedPrecondition,
            ApiError::Refused(Rejection::Overflow(_)) => Code::OutOfRange,
            ApiError::Refused(_) | ApiError::InvalidArgument(_) => Code::InvalidArgument,
            ApiError::NotFound { .. } => Code::NotFound,
            ApiError::TooMuch(_) => Code::ResourceExhausted,
            ApiError::Unavailable(_)
            | ApiError::NotNow(_)
            | ApiError::Settling { .. }
            | ApiError::LeaseEnded { .. }
            | ApiError::OutcomeForgotten { .. } => Code::Unavailable,
            ApiError::NotApplied { .. } => Code::DeadlineExceeded,
            ApiError::Store(_) | ApiError::Internal(_) => Code::Internal,
            ApiError::Forwarded(s) => s.code(),
        }
    }
}

impl From<ApiError> for Status {
    fn from(e: ApiError) -> Status {
        Status::new(e.code(), e.to_string())
    }
}
