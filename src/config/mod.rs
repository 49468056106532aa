//! Region configuration: one TOML file per region, parsed into raw structs, then
//! validated once at start-up into the typed [`Config`] that is passed down. Nothing reads
//! configuration from a global. Unknown fields, bad durations, bad addresses and
//! overlapping namespaces are errors that name the field.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::crdt::RegionId;
mod api;
mod checkpoint;
mod describe;
mod fields;
mod ingest;
mod kafka;
mod lease;
mod namespace;
mod pricing;
mod replication;
mod security;
mod settings;
#[cfg(test)]
mod tests;
mod window;

use api::RawApi;
pub use api::{ApiConfig, CallLimit};
use checkpoint::RawCheckpoint;
pub use checkpoint::{CheckpointConfig, CheckpointTarget, S3Target};
pub use fields::{ConfigError, Secret, invalid, parse_addr, parse_duration};
pub use ingest::IngestConfig;
use ingest::RawIngest;
use kafka::RawKafka;
pub use kafka::{KafkaConfig, RecordFormat};
use lease::RawLease;
pub use lease::{LeaseConfig, Member, WitnessConfig};
use namespace::RawNamespace;
pub use namespace::{Namespace, Namespaces, Ownership};
use pricing::RawPricing;
pub use pricing::{Formula, FunctionConfig, PricingConfig};
use replication::RawReplication;
pub use replication::{RemoteConfig, ReplicationConfig};
use security::RawTls;
pub use security::{AuthConfig, KafkaSecurity, Role, TlsConfig, TlsVersion};
pub use settings::Setting;
use window::RawWatermark;
pub use window::WatermarkConfig;

/// A validated region configuration.
#[derive(Clone, Debug)]
pub struct Config {
    pub region: RegionId,
    pub data_dir: PathBuf,
    /// The largest clock difference tolerated between regions: a remote stamp further
    /// ahead is refused, and leases end this much early.
    pub max_clock_offset: Duration,
    /// Drills and tests only: this node's wall clock is shifted by this many nanoseconds.
    pub clock_offset_nanos: i64,
    pub kafka: KafkaConfig,
    pub ingest: IngestConfig,
    pub api: ApiConfig,
    pub namespaces: Namespaces,
    /// How each partition's watermark follows the event times of windowed records.
    pub watermark: WatermarkConfig,
    pub replication: ReplicationConfig,
    pub checkpoint: CheckpointConfig,
    /// The lease group for owned namespaces (`None`: owned writes are refused).
    pub lease: Option<LeaseConfig>,
    /// What `geostate pricer` computes (`None`: it refuses to start).
    pub pricing: Option<PricingConfig>,
    /// TLS on every listener and client of the node (`None`: plaintext).
    pub tls: Option<TlsConfig>,
}

impl Config {
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        Self::load_with(path, &[])
    }

    /// The file at `path` with `settings` (`--set`) applied, validated.
    pub fn load_with(path: &Path, settings: &[Setting]) -> Result<Self, ConfigError> {
        settings::read::<RawConfig>(path, settings)?.validate()
    }

    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        settings::parse::<RawConfig>(text, &[])?.validate()
    }
}

// ---------------------------------------------------------------------------------------
// raw TOML

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawConfig {
    region: String,
    data_dir: PathBuf,
    #[serde(default = "default_max_clock_offset")]
    max_clock_offset: String,
    #[serde(default)]
    clock_offset: Option<String>,
    kafka: RawKafka,
    #[serde(default)]
    ingest: RawIngest,
    api: RawApi,
    #[serde(default, rename = "namespace")]
    namespaces: Vec<RawNamespace>,
    #[serde(default)]
    watermark: RawWatermark,
    #[serde(default)]
    replication: RawReplication,
    #[serde(default)]
    checkpoint: RawCheckpoint,
    lease: Option<RawLease>,
    pricing: Option<RawPricing>,
    tls: Option<RawTls>,
    #[serde(default)]
    allow_plaintext: bool,
}

fn default_max_clock_offset() -> String {
    "500ms".into()
}

impl RawConfig {
    /// Validates every section into a [`Config`]. The checks run in a fixed order, and
    /// the first that fails is the error: the names and limits of `[kafka]`, `[ingest]`,
    /// `[api]` and `[replication]` first, then the namespaces, checkpoint, pricing and
    /// lease sections, then the rest of `[kafka]`, `[api]`, `[ingest]`, `[watermark]`
    /// and `[replication]`.
    fn validate(self) -> Result<Config, ConfigError> {
        let region = RegionId::new(self.region).map_err(|e| invalid("region", e.to_string()))?;
        let max_clock_offset = parse_duration("max-clock-offset", &self.max_clock_offset)?;
        let clock_offset_nanos = parse_clock_offset(self.clock_offset.as_deref())?;
        self.kafka.check_names()?;
        self.ingest.check_limits()?;
        self.api.check_limits()?;
        let remotes = self.replication.validate_remotes(&region, &self.kafka)?;
        let namespaces = Namespaces::validate(self.namespaces)?;
        let checkpoint = self.checkpoint.validate(&region, &self.data_dir)?;
        let pricing = self.pricing.map(|p| p.validate(&namespaces)).transpose()?;
        let lease = self
            .lease
            .map(|l| l.validate(Some(&region), max_clock_offset))
            .transpose()?;
        let tls = self.tls.map(RawTls::validate);
        let kafka = self.kafka.validate()?;
        let lease_listen = lease.as_ref().map(|l| l.listen);
        let api = self
            .api
            .validate(tls.as_ref(), lease_listen, self.allow_plaintext)?;
        let ingest = self.ingest.validate()?;
        let watermark = self.watermark.validate()?;
        let replication = self.replication.validate(remotes)?;
        Ok(Config {
            lease,
            pricing,
            tls,
            checkpoint,
            region,
            data_dir: self.data_dir,
            max_clock_offset,
            clock_offset_nanos,
            kafka,
            ingest,
            api,
            namespaces,
            watermark,
            replication,
        })
    }
}

/// `clock-offset`: a duration with an optional leading `-`, in nanoseconds; 0 when absent.
fn parse_clock_offset(text: Option<&str>) -> Result<i64, ConfigError> {
    match text.map(str::trim) {
        None => Ok(0),
        Some(text) => {
            let (sign, magnitude) = match text.strip_prefix('-') {
                Some(rest) => (-1, rest),
                None => (1, text),
            };
            let d = parse_duration("clock-offset", magnitude)?;
            Ok(sign
                * i64::try_from(d.as_nanos())
                    .map_err(|_| invalid("clock-offset", "must be within 292 years"))?)
        }
    }
}
