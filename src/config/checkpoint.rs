//! The `[checkpoint]` section: how often the store is checkpointed, how many checkpoints
//! are kept, and where they go (a local folder or an S3-compatible bucket).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::{ConfigError, Secret, invalid, parse_duration};
use crate::crdt::RegionId;

/// Incremental checkpoints of the store to object storage.
#[derive(Clone, Debug)]
pub struct CheckpointConfig {
    /// How often a checkpoint is taken; zero switches periodic checkpoints off
    /// (`Admin/Checkpoint` still takes one).
    pub interval: Duration,
    /// Newest checkpoints kept; older manifests and files only they reference are deleted.
    pub keep: usize,
    /// Upload pacing in bytes per second; 0 is unlimited.
    pub upload_bytes_per_second: u64,
    /// A node that starts on an empty data dir restores the newest checkpoint first.
    pub restore_on_empty: bool,
    pub target: CheckpointTarget,
}

/// Where checkpoints and savepoints are stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CheckpointTarget {
    /// A local folder (the default: `<data-dir>.checkpoints`).
    Local(PathBuf),
    S3(S3Target),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct S3Target {
    pub bucket: String,
    /// Prepended to every object key; default `<region>/`.
    pub prefix: String,
    /// An S3-compatible endpoint; default AWS.
    pub endpoint: Option<String>,
    pub region: String,
    pub path_style: bool,
    /// Static credentials; default the standard AWS environment and profile chain.
    pub access_key: Option<String>,
    pub secret_key: Option<Secret>,
    /// Longest wait for a connection, and for the first byte of an answer, per attempt: a
    /// server that accepts and never answers fails the attempt instead of stalling.
    pub timeout: Duration,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(super) struct RawCheckpoint {
    #[serde(default = "default_checkpoint_interval")]
    interval: String,
    #[serde(default = "default_checkpoint_keep")]
    keep: usize,
    #[serde(default = "default_upload_rate")]
    upload_bytes_per_second: u64,
    #[serde(default)]
    restore_on_empty: bool,
    local_dir: Option<PathBuf>,
    s3: Option<RawS3>,
}

impl Default for RawCheckpoint {
    fn default() -> Self {
        Self {
            interval: default_checkpoint_interval(),
            keep: default_checkpoint_keep(),
            upload_bytes_per_second: default_upload_rate(),
            restore_on_empty: false,
            local_dir: None,
            s3: None,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawS3 {
    bucket: String,
    prefix: Option<String>,
    endpoint: Option<String>,
    #[serde(default = "default_s3_region")]
    region: String,
    #[serde(default)]
    path_style: bool,
    access_key: Option<String>,
    secret_key: Option<Secret>,
    #[serde(default = "default_s3_timeout")]
    timeout: String,
}

fn default_s3_timeout() -> String {
    "60s".into()
}

fn default_checkpoint_interval() -> String {
    "15s".into()
}
fn default_checkpoint_keep() -> usize {
    3
}
fn default_upload_rate() -> u64 {
    64 * 1024 * 1024
}
fn default_s3_region() -> String {
    "us-east-1".into()
}

impl RawCheckpoint {
    /// Validates the section; by default checkpoints go to `<data_dir>.checkpoints`, and
    /// into an S3 bucket under the prefix `<region>/`.
    pub(super) fn validate(
        self,
        region: &RegionId,
        data_dir: &Path,
    ) -> Result<CheckpointConfig, ConfigError> {
        if self.keep == 0 {
            return Err(invalid("checkpoint.keep", "must be at least 1"));
        }
        let target = match (self.s3, self.local_dir) {
            (Some(_), Some(_)) => {
                return Err(invalid(
                    "checkpoint.local-dir",
                    "set either local-dir or [checkpoint.s3], not both",
                ));
            }
            (Some(s3), None) => {
                if s3.bucket.is_empty() {
                    return Err(invalid("checkpoint.s3.bucket", "must not be empty"));
                }
                if s3.access_key.is_some() != s3.secret_key.is_some() {
                    return Err(invalid(
                        "checkpoint.s3.access-key",
                        "set both access-key and secret-key, or neither",
                    ));
                }
                CheckpointTarget::S3(S3Target {
                    bucket: s3.bucket,
                    prefix: s3.prefix.unwrap_or_else(|| format!("{region}/")),
                    endpoint: s3.endpoint,
                    region: s3.region,
                    path_style: s3.path_style,
                    access_key: s3.access_key,
                    secret_key: s3.secret_key,
                    timeout: parse_duration("checkpoint.s3.timeout", &s3.timeout)?,
                })
            }
            (None, Some(dir)) => CheckpointTarget::Local(dir),
            (None, None) => {
                let mut dir = data_dir.as_os_str().to_owned();
                dir.push(".checkpoints");
                CheckpointTarget::Local(PathBuf::from(dir))
            }
        };
        Ok(CheckpointConfig {
            interval: parse_duration("checkpoint.interval", &self.interval)?,
            keep: self.keep,
            upload_bytes_per_second: self.upload_bytes_per_second,
            restore_on_empty: self.restore_on_empty,
            target,
        })
    }
}
