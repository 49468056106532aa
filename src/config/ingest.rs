//! The `[ingest]` section: how the write path batches updates into RocksDB write batches,
//! and the size limits every key, value and idempotency id must keep.

use std::time::Duration;

use serde::Deserialize;

use super::{ConfigError, invalid, parse_duration};

#[derive(Clone, Debug)]
pub struct IngestConfig {
    /// Most events applied in one RocksDB write batch.
    pub batch_max_events: usize,
    /// Longest a batch waits to fill before it is applied anyway; zero takes only what
    /// has already arrived.
    pub batch_max_wait: Duration,
    pub max_key_bytes: usize,
    pub max_value_bytes: usize,
    /// Longer idempotency ids are refused (at most 65535: how long a stored id can be).
    pub max_id_bytes: usize,
    /// Idempotency ids remembered per key: a record whose id is among them is skipped.
    pub dedup_window: usize,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(super) struct RawIngest {
    #[serde(default = "default_batch_max_events")]
    batch_max_events: usize,
    #[serde(default = "default_batch_max_wait")]
    batch_max_wait: String,
    #[serde(default = "default_max_key_bytes")]
    max_key_bytes: usize,
    #[serde(default = "default_max_value_bytes")]
    max_value_bytes: usize,
    #[serde(default = "default_max_id_bytes")]
    max_id_bytes: usize,
    #[serde(default = "default_dedup_window")]
    dedup_window: usize,
}

impl Default for RawIngest {
    fn default() -> Self {
        Self {
            batch_max_events: default_batch_max_events(),
            batch_max_wait: default_batch_max_wait(),
            max_key_bytes: default_max_key_bytes(),
            max_value_bytes: default_max_value_bytes(),
            max_id_bytes: default_max_id_bytes(),
            dedup_window: default_dedup_window(),
        }
    }
}

fn default_batch_max_events() -> usize {
    1000
}
fn default_batch_max_wait() -> String {
    "0ms".into()
}
fn default_max_key_bytes() -> usize {
    1024
}
fn default_max_value_bytes() -> usize {
    64 * 1024
}
fn default_max_id_bytes() -> usize {
    256
}
fn default_dedup_window() -> usize {
    64
}

impl RawIngest {
    /// The batch size and the size limits. Checked before the other sections; the batch
    /// wait is parsed later, by [`Self::validate`].
    pub(super) fn check_limits(&self) -> Result<(), ConfigError> {
        if self.batch_max_events == 0 {
            return Err(invalid("ingest.batch-max-events", "must be at least 1"));
        }
        if self.max_key_bytes == 0 || self.max_value_bytes == 0 {
            return Err(invalid(
                "ingest.max-key-bytes",
                "size limits must be positive",
            ));
        }
        if !(1..=usize::from(u16::MAX)).contains(&self.max_id_bytes) {
            return Err(invalid(
                "ingest.max-id-bytes",
                "must be 1 to 65535 (ids are stored with a 16-bit length)",
            ));
        }
        Ok(())
    }

    /// The section, its batch wait parsed (its limits were checked by
    /// [`Self::check_limits`]).
    pub(super) fn validate(self) -> Result<IngestConfig, ConfigError> {
        Ok(IngestConfig {
            batch_max_events: self.batch_max_events,
            batch_max_wait: parse_duration("ingest.batch-max-wait", &self.batch_max_wait)?,
            max_key_bytes: self.max_key_bytes,
            max_value_bytes: self.max_value_bytes,
            max_id_bytes: self.max_id_bytes,
            dedup_window: self.dedup_window,
        })
    }
}
