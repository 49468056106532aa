//! Region configuration: one TOML file per region, parsed into raw structs, then
//! validated once at start-up into the typed [`Config`] that is passed down. Nothing reads
//! configuration from a global. Unknown fields, bad durations, bad addresses and
//! overlapping namespaces are errors that name the field.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::crdt::{CrdtType, RegionId};
mod describe;
mod fields;
mod lease;
mod pricing;
mod security;
mod settings;
mod window;

pub use fields::{ConfigError, Secret, invalid, parse_addr, parse_duration};
use lease::RawLease;
pub use lease::{LeaseConfig, Member, WitnessConfig};
use pricing::RawPricing;
pub use pricing::{Formula, FunctionConfig, PricingConfig};
pub use security::{AuthConfig, KafkaSecurity, Role, TlsConfig, TlsVersion};
use security::{RawAuth, RawKafkaSecurity, RawTls};
pub use settings::Setting;
pub use window::WatermarkConfig;
use window::{RawWatermark, RawWindow};

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

/// Where this region reads the other regions' deltas.
#[derive(Clone, Debug, Default)]
pub struct ReplicationConfig {
    pub remotes: Vec<RemoteConfig>,
    /// Ingest waits while the outbox holds this many keys: a shipping round (one Kafka
    /// transaction) never carries more than this plus one batch.
    pub max_outbox_keys: usize,
    /// Shortest time between two shipping rounds of a partition that carry deltas:
    /// updates of one key meanwhile coalesce into one delta. Zero ships after every batch.
    pub ship_every: Duration,
    /// Compression of the shipping producer's records (librdkafka's `compression.type`):
    /// what crosses to the other regions is the deltas topic's batches as stored.
    pub compression: &'static str,
    /// How many other nodes of the region keep a copy of each partition current from the
    /// region's deltas (warm standbys): a move then merges only what was shipped since.
    pub standby_replicas: usize,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteConfig {
    pub region: RegionId,
    /// Default `<region>.<deltas-topic>`: the copy MirrorMaker 2 keeps in this region.
    pub topic: String,
    /// Default: this region's own Kafka. Set it (and `topic = "geostate.deltas"`) to read
    /// the remote cluster directly, without a mirror.
    pub bootstrap: String,
}

impl RemoteConfig {
    /// How to reach the remote's deltas topic: `own` client settings at its bootstrap.
    pub fn kafka(&self, own: &KafkaConfig) -> KafkaConfig {
        KafkaConfig {
            bootstrap: self.bootstrap.clone(),
            ..own.clone()
        }
    }
}

#[derive(Clone)]
pub struct KafkaConfig {
    pub bootstrap: String,
    pub updates_topic: String,
    pub deltas_topic: String,
    pub dlq_topic: String,
    /// Where events refused because their window had closed go, exactly once.
    pub late_topic: String,
    /// Where final windows go, each exactly once, in the shipping round that saw it final.
    pub outputs_topic: String,
    pub format: RecordFormat,
    /// Extra librdkafka properties for every client.
    pub client: BTreeMap<String, String>,
    /// TLS and SASL to the brokers (`None`: plaintext, or whatever `client` sets).
    pub security: Option<KafkaSecurity>,
}

/// Shows every field, and of `client` only the names of properties that may hold a
/// secret (`*password*`, `*secret*`, `*jaas*`, `*.key.pem`).
impl std::fmt::Debug for KafkaConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let secret = |k: &str| {
            ["password", "secret", "jaas", "key.pem"]
                .iter()
                .any(|s| k.contains(s))
        };
        let client: BTreeMap<&str, &str> = (self.client.iter())
            .map(|(k, v)| {
                (
                    k.as_str(),
                    if secret(k) { "<redacted>" } else { v.as_str() },
                )
            })
            .collect();
        f.debug_struct("KafkaConfig")
            .field("bootstrap", &self.bootstrap)
            .field("updates_topic", &self.updates_topic)
            .field("deltas_topic", &self.deltas_topic)
            .field("dlq_topic", &self.dlq_topic)
            .field("late_topic", &self.late_topic)
            .field("outputs_topic", &self.outputs_topic)
            .field("format", &self.format)
            .field("client", &client)
            .field("security", &self.security)
            .finish()
    }
}

/// How records of the updates topic are encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordFormat {
    /// `{"key":"drivers/9q8yy","add":3}` or `{"key":"surge/9q8yy","set":"1.8"}`.
    Json,
    /// Protobuf `geostate.v1.Update`.
    Protobuf,
}

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

#[derive(Clone, Debug)]
pub struct ApiConfig {
    pub grpc_listen: SocketAddr,
    /// The gRPC address clients reach this node at (`Admin/Route` answers it); `None`:
    /// the address the listener is bound to.
    pub advertise: Option<String>,
    pub metrics_listen: SocketAddr,
    /// Most keys one `BatchGet` may ask for.
    pub max_batch_keys: usize,
    /// Most `Watch` streams open at once.
    pub max_watchers: usize,
    /// Who may call what.
    pub auth: AuthConfig,
    /// The API and metrics listeners serve plaintext even with `[tls]` (loopback only):
    /// a process whose lease group runs on TLS behind a local proxy or sidecar.
    pub plaintext: bool,
}

/// Whether any region may write a namespace, or only the holder of the key's lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Ownership {
    Shared,
    Owned,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Namespace {
    pub prefix: String,
    pub crdt: CrdtType,
    pub ownership: Ownership,
    /// A windowed counter's windows (`None`: a total since the beginning).
    pub window: Option<crate::window::WindowSpec>,
    /// Each window that becomes final is produced to `kafka.outputs-topic`, in the
    /// shipping round that sees it final (`output = "final-windows"`).
    pub outputs_final_windows: bool,
    /// Each accepted write of this owned register is produced to `kafka.outputs-topic`
    /// with the lease epoch, in the shipping round of the state it wrote (`output =
    /// "register-changes"`); its value must be a window result
    /// ([`crate::replication::outputs::WindowResult`]).
    pub outputs_register_changes: bool,
}

impl Namespace {
    /// Whether some key under `prefix` can be in this namespace.
    pub fn overlaps(&self, prefix: &str) -> bool {
        self.prefix.starts_with(prefix) || prefix.starts_with(&self.prefix)
    }
}

impl Namespaces {
    /// Whether some namespace is windowed.
    pub fn any_windowed(&self) -> bool {
        self.0.iter().any(|ns| ns.window.is_some())
    }

    /// Whether a stored slice of a windowed key expired, by the lowest watermark over
    /// every region on its partition (the store's retention rule).
    pub fn expiry(&self) -> crate::store::Expiry {
        let namespaces = self.clone();
        std::sync::Arc::new(move |key: &str, slice: u64, lowest: u64| {
            namespaces
                .lookup(key)
                .and_then(|ns| ns.window)
                .is_some_and(|spec| spec.slice_expired(slice, lowest))
        })
    }
}

/// Key namespaces; no prefix is a prefix of another, so a key has at most one namespace.
#[derive(Clone, Debug, Default)]
pub struct Namespaces(Vec<Namespace>);

impl Namespaces {
    pub fn new(mut namespaces: Vec<Namespace>) -> Result<Self, ConfigError> {
        namespaces.sort_by(|a, b| a.prefix.cmp(&b.prefix));
        for ns in &namespaces {
            if ns.prefix.is_empty() {
                return Err(invalid("namespace.prefix", "must not be empty"));
            }
            if ns.prefix.starts_with('\0') {
                // keys starting with NUL are geostate's own records (resume points)
                return Err(invalid(
                    "namespace.prefix",
                    "must not start with a NUL byte",
                ));
            }
        }
        for pair in namespaces.windows(2) {
            // sorted: if any prefix is a prefix of another, it is of its successor
            if pair[1].prefix.starts_with(&pair[0].prefix) {
                return Err(invalid(
                    "namespace.prefix",
                    format!(
                        "namespaces {:?} and {:?} overlap: a key must belong to one namespace",
                        pair[0].prefix, pair[1].prefix
                    ),
                ));
            }
        }
        Ok(Self(namespaces))
    }

    /// The namespace a key belongs to, if any.
    pub fn lookup(&self, key: &str) -> Option<&Namespace> {
        // the last prefix <= key is the only candidate in a prefix-free sorted list
        let i = self.0.partition_point(|ns| ns.prefix.as_str() <= key);
        self.0[..i].last().filter(|ns| key.starts_with(&ns.prefix))
    }

    pub fn iter(&self) -> impl Iterator<Item = &Namespace> {
        self.0.iter()
    }
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawCheckpoint {
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawReplication {
    #[serde(default, rename = "remote")]
    remotes: Vec<RawRemote>,
    #[serde(default = "default_max_outbox_keys")]
    max_outbox_keys: usize,
    #[serde(default = "default_ship_every")]
    ship_every: String,
    #[serde(default = "default_compression")]
    compression: String,
    #[serde(default)]
    standby_replicas: usize,
}

impl Default for RawReplication {
    fn default() -> Self {
        Self {
            remotes: Vec::new(),
            max_outbox_keys: default_max_outbox_keys(),
            ship_every: default_ship_every(),
            compression: default_compression(),
            standby_replicas: 0,
        }
    }
}

fn default_max_outbox_keys() -> usize {
    100_000
}

fn default_ship_every() -> String {
    "0ms".into()
}

fn default_compression() -> String {
    "zstd".into()
}

/// The longest `replication.ship-every`: a partition's heartbeat goes out with its next
/// round (every second otherwise), and a new lease holder, the remote regions'
/// freshness and their silence alarm wait on it.
const MAX_SHIP_EVERY: Duration = Duration::from_secs(1);

fn parse_ship_every(text: &str) -> Result<Duration, ConfigError> {
    let every = parse_duration("replication.ship-every", text)?;
    if every > MAX_SHIP_EVERY {
        return Err(invalid(
            "replication.ship-every",
            format!("{text:?} is longer than 1s, the heartbeat interval"),
        ));
    }
    Ok(every)
}

/// The shipping producer's compressions (librdkafka's `compression.type`).
const COMPRESSIONS: [&str; 5] = ["none", "gzip", "snappy", "lz4", "zstd"];

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawRemote {
    region: String,
    topic: Option<String>,
    bootstrap: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawKafka {
    bootstrap: String,
    #[serde(default = "default_updates_topic")]
    updates_topic: String,
    #[serde(default = "default_deltas_topic")]
    deltas_topic: String,
    #[serde(default = "default_dlq_topic")]
    dlq_topic: String,
    #[serde(default = "default_late_topic")]
    late_topic: String,
    #[serde(default = "default_outputs_topic")]
    outputs_topic: String,
    #[serde(default = "default_format")]
    format: RecordFormat,
    #[serde(default)]
    client: BTreeMap<String, String>,
    security: Option<RawKafkaSecurity>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawIngest {
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawApi {
    grpc_listen: String,
    #[serde(default)]
    advertise: Option<String>,
    metrics_listen: String,
    #[serde(default = "default_max_batch_keys")]
    max_batch_keys: usize,
    #[serde(default = "default_max_watchers")]
    max_watchers: usize,
    auth: Option<RawAuth>,
    #[serde(default)]
    plaintext: bool,
}

fn default_max_batch_keys() -> usize {
    1000
}
fn default_max_watchers() -> usize {
    1024
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawNamespace {
    prefix: String,
    #[serde(rename = "type")]
    crdt: CrdtType,
    ownership: Ownership,
    window: Option<RawWindow>,
    /// `"final-windows"`: every final window of the namespace goes to the outputs topic.
    output: Option<String>,
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
fn default_max_clock_offset() -> String {
    "500ms".into()
}
fn default_updates_topic() -> String {
    "geostate.updates".into()
}
fn default_deltas_topic() -> String {
    "geostate.deltas".into()
}
fn default_dlq_topic() -> String {
    "geostate.dlq".into()
}
fn default_late_topic() -> String {
    "geostate.late".into()
}
fn default_outputs_topic() -> String {
    "geostate.outputs".into()
}
fn default_format() -> RecordFormat {
    RecordFormat::Json
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

impl RawConfig {
    fn validate(self) -> Result<Config, ConfigError> {
        let region = RegionId::new(self.region).map_err(|e| invalid("region", e.to_string()))?;
        let max_clock_offset = parse_duration("max-clock-offset", &self.max_clock_offset)?;
        let clock_offset_nanos = match self.clock_offset.as_deref().map(str::trim) {
            None => 0,
            Some(text) => {
                let (sign, magnitude) = match text.strip_prefix('-') {
                    Some(rest) => (-1, rest),
                    None => (1, text),
                };
                let d = parse_duration("clock-offset", magnitude)?;
                sign * i64::try_from(d.as_nanos())
                    .map_err(|_| invalid("clock-offset", "must be within 292 years"))?
            }
        };
        for (field, topic) in [
            ("kafka.updates-topic", &self.kafka.updates_topic),
            ("kafka.deltas-topic", &self.kafka.deltas_topic),
            ("kafka.dlq-topic", &self.kafka.dlq_topic),
            ("kafka.late-topic", &self.kafka.late_topic),
            ("kafka.outputs-topic", &self.kafka.outputs_topic),
        ] {
            if topic.is_empty() {
                return Err(invalid(field, "must not be empty"));
            }
        }
        if self.kafka.bootstrap.is_empty() {
            return Err(invalid("kafka.bootstrap", "must not be empty"));
        }
        if self.ingest.batch_max_events == 0 {
            return Err(invalid("ingest.batch-max-events", "must be at least 1"));
        }
        if self.ingest.max_key_bytes == 0 || self.ingest.max_value_bytes == 0 {
            return Err(invalid(
                "ingest.max-key-bytes",
                "size limits must be positive",
            ));
        }
        if !(1..=usize::from(u16::MAX)).contains(&self.ingest.max_id_bytes) {
            return Err(invalid(
                "ingest.max-id-bytes",
                "must be 1 to 65535 (ids are stored with a 16-bit length)",
            ));
        }
        if self.api.max_batch_keys == 0 || self.api.max_watchers == 0 {
            return Err(invalid(
                "api.max-batch-keys",
                "request limits must be at least 1",
            ));
        }
        let max_outbox_keys = self.replication.max_outbox_keys;
        if max_outbox_keys == 0 {
            return Err(invalid("replication.max-outbox-keys", "must be at least 1"));
        }
        let mut remotes: Vec<RemoteConfig> = Vec::new();
        for raw in self.replication.remotes {
            let remote = RegionId::new(raw.region)
                .map_err(|e| invalid("replication.remote.region", e.to_string()))?;
            if remote == region {
                return Err(invalid(
                    "replication.remote.region",
                    format!("{remote} is this region itself"),
                ));
            }
            if remotes.iter().any(|r| r.region == remote) {
                return Err(invalid(
                    "replication.remote.region",
                    format!("{remote} is listed twice"),
                ));
            }
            remotes.push(RemoteConfig {
                topic: raw
                    .topic
                    .unwrap_or_else(|| format!("{remote}.{}", self.kafka.deltas_topic)),
                bootstrap: raw
                    .bootstrap
                    .unwrap_or_else(|| self.kafka.bootstrap.clone()),
                region: remote,
            });
        }
        let namespaces = Namespaces::new(
            self.namespaces
                .into_iter()
                .map(|ns| {
                    let window = ns.window.map(|w| w.validate(ns.crdt)).transpose()?;
                    let (mut outputs_final_windows, mut outputs_register_changes) = (false, false);
                    match ns.output.as_deref() {
                        None => {}
                        Some("final-windows") if window.is_some() => outputs_final_windows = true,
                        Some("final-windows") => {
                            return Err(invalid(
                                "namespace.output",
                                format!("{:?} has no window: only a windowed namespace outputs final windows", ns.prefix),
                            ));
                        }
                        Some("register-changes")
                            if ns.crdt == CrdtType::LwwRegister
                                && ns.ownership == Ownership::Owned =>
                        {
                            outputs_register_changes = true
                        }
                        Some("register-changes") => {
                            return Err(invalid(
                                "namespace.output",
                                format!("{:?} is not an owned lww_register: only an owned register outputs its changes (with the lease epoch)", ns.prefix),
                            ));
                        }
                        Some(other) => {
                            return Err(invalid(
                                "namespace.output",
                                format!("{other:?} is not an output kind (known: \"final-windows\", \"register-changes\")"),
                            ));
                        }
                    }
                    Ok(Namespace {
                        window,
                        outputs_final_windows,
                        outputs_register_changes,
                        prefix: ns.prefix,
                        crdt: ns.crdt,
                        ownership: ns.ownership,
                    })
                })
                .collect::<Result<_, ConfigError>>()?,
        )?;
        let checkpoint = self.checkpoint.validate(&region, &self.data_dir)?;
        let pricing = self.pricing.map(|p| p.validate(&namespaces)).transpose()?;
        let lease = self
            .lease
            .map(|l| l.validate(Some(&region), max_clock_offset))
            .transpose()?;
        let tls = self.tls.map(RawTls::validate);
        let kafka_security = self
            .kafka
            .security
            .map(RawKafkaSecurity::validate)
            .transpose()?;
        let grpc_listen = parse_addr("api.grpc-listen", &self.api.grpc_listen)?;
        let metrics_listen = parse_addr("api.metrics-listen", &self.api.metrics_listen)?;
        let mut listeners = vec![
            ("api.grpc-listen", grpc_listen),
            ("api.metrics-listen", metrics_listen),
        ];
        listeners.extend(lease.as_ref().map(|l| ("lease.listen", l.listen)));
        security::check_plaintext(tls.as_ref(), self.allow_plaintext, &listeners)?;
        let api_tls = tls.as_ref().filter(|_| !self.api.plaintext);
        if self.api.plaintext {
            security::check_plaintext(None, self.allow_plaintext, &listeners[..2])?;
        }
        let auth = security::api_auth(self.api.auth, api_tls, grpc_listen)?;
        Ok(Config {
            lease,
            pricing,
            tls,
            checkpoint,
            region,
            data_dir: self.data_dir,
            max_clock_offset,
            clock_offset_nanos,
            kafka: KafkaConfig {
                bootstrap: self.kafka.bootstrap,
                updates_topic: self.kafka.updates_topic,
                deltas_topic: self.kafka.deltas_topic,
                dlq_topic: self.kafka.dlq_topic,
                late_topic: self.kafka.late_topic,
                outputs_topic: self.kafka.outputs_topic,
                format: self.kafka.format,
                client: self.kafka.client,
                security: kafka_security,
            },
            ingest: IngestConfig {
                batch_max_events: self.ingest.batch_max_events,
                batch_max_wait: parse_duration(
                    "ingest.batch-max-wait",
                    &self.ingest.batch_max_wait,
                )?,
                max_key_bytes: self.ingest.max_key_bytes,
                max_value_bytes: self.ingest.max_value_bytes,
                max_id_bytes: self.ingest.max_id_bytes,
                dedup_window: self.ingest.dedup_window,
            },
            api: ApiConfig {
                grpc_listen,
                advertise: self.api.advertise.filter(|a| !a.is_empty()),
                metrics_listen,
                max_batch_keys: self.api.max_batch_keys,
                max_watchers: self.api.max_watchers,
                auth,
                plaintext: self.api.plaintext,
            },
            namespaces,
            watermark: self.watermark.validate()?,
            replication: ReplicationConfig {
                remotes,
                max_outbox_keys,
                ship_every: parse_ship_every(&self.replication.ship_every)?,
                compression: COMPRESSIONS
                    .into_iter()
                    .find(|&c| c == self.replication.compression)
                    .ok_or_else(|| {
                        invalid(
                            "replication.compression",
                            format!(
                                "{:?} is not one of {}",
                                self.replication.compression,
                                COMPRESSIONS.join(", ")
                            ),
                        )
                    })?,
                standby_replicas: self.replication.standby_replicas,
            },
        })
    }
}

impl RawCheckpoint {
    fn validate(self, region: &RegionId, data_dir: &Path) -> Result<CheckpointConfig, ConfigError> {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Regions must agree on what decides a key's fate everywhere (namespaces, the limits
    /// a merge checks, the clock bound) and on the lease group; the repository's region
    /// files and the witness's are checked here.
    #[test]
    fn the_region_files_agree_on_namespaces_limits_and_the_lease_group() {
        let load = |region: &str| {
            Config::load(&crate::repo_file(&format!("regions/{region}.toml"))).unwrap()
        };
        let (us, eu) = (load("us-east-1"), load("eu-west-1"));
        let witness = WitnessConfig::load(&crate::repo_file("regions/witness.toml"), &[]).unwrap();
        let shared = |c: &Config| {
            let i = &c.ingest;
            // and the formula: whichever region holds a geohash prices it alike
            format!(
                "{:?} {:?} {} {} {} {:?}",
                c.namespaces,
                c.max_clock_offset,
                i.max_key_bytes,
                i.max_value_bytes,
                i.max_id_bytes,
                c.pricing
            )
        };
        assert_eq!(shared(&us), shared(&eu));
        // the group as a whole: everything but which member this file is
        let group = |l: &LeaseConfig| {
            format!(
                "{:?}",
                LeaseConfig {
                    member_id: 0,
                    listen: "0.0.0.0:0".parse().unwrap(),
                    ..l.clone()
                }
            )
        };
        let (us_group, eu_group) = (
            group(us.lease.as_ref().unwrap()),
            group(eu.lease.as_ref().unwrap()),
        );
        assert_eq!(us_group, eu_group);
        assert_eq!(us_group, group(&witness.lease));
        assert_eq!(us.max_clock_offset, witness.max_clock_offset);
        // and each file is the member it says it is
        for (config, region) in [(&us, "us-east-1"), (&eu, "eu-west-1")] {
            let lease = config.lease.as_ref().unwrap();
            let me = &lease.members[&lease.member_id];
            assert_eq!(me.region.as_ref().map(|r| r.as_str()), Some(region));
            assert_eq!(me.addr, lease.listen.to_string());
        }
    }

    /// A region's further node is learner `n` under its region's member (Raft id in the
    /// member's high half); the witness cannot be one.
    #[test]
    fn a_further_node_is_a_learner_under_its_regions_member() {
        let set = |s: &str| vec![s.parse::<Setting>().unwrap()];
        let us = crate::repo_file("regions/us-east-1.toml");
        let node = Config::load_with(&us, &set("lease.learner=3")).unwrap();
        let lease = node.lease.unwrap();
        assert_eq!((lease.member_id, lease.learner), (2, 3));
        assert_eq!(lease.raft_id(), (2 << 32) | 3);
        let first = Config::load(&us).unwrap().lease.unwrap();
        assert_eq!(first.raft_id(), 2);
        let witness = crate::repo_file("regions/witness.toml");
        let e = WitnessConfig::load(&witness, &set("lease.learner=1")).unwrap_err();
        assert!(e.to_string().contains("lease.learner"), "{e}");
        let anywhere = [
            "lease.learner=1".parse::<Setting>().unwrap(),
            "lease.listen=\"0.0.0.0:7400\"".parse().unwrap(),
        ];
        let e = Config::load_with(&us, &anywhere).unwrap_err();
        assert!(e.to_string().contains("lease.listen"), "{e}");
    }

    const MINIMAL: &str = r#"
        region = "us-east-1"
        data-dir = "/tmp/x"
        [kafka]
        bootstrap = "127.0.0.1:9092"
        [api]
        grpc-listen = "127.0.0.1:0"
        metrics-listen = "127.0.0.1:0"
        [[namespace]]
        prefix = "trips/"
        type = "g_counter"
        ownership = "shared"
        [[namespace]]
        prefix = "surge/"
        type = "lww_register"
        ownership = "owned"
    "#;

    #[test]
    fn a_minimal_config_gets_defaults() {
        let c = Config::parse(MINIMAL).unwrap();
        assert_eq!(c.region.as_str(), "us-east-1");
        assert_eq!(c.max_clock_offset, Duration::from_millis(500));
        assert_eq!(c.kafka.updates_topic, "geostate.updates");
        assert_eq!(c.kafka.format, RecordFormat::Json);
        assert_eq!(c.ingest.batch_max_events, 1000);
        let ns = c.namespaces.lookup("surge/9q8yy").unwrap();
        assert_eq!(
            (ns.crdt, ns.ownership),
            (CrdtType::LwwRegister, Ownership::Owned)
        );
        assert!(c.namespaces.lookup("nothing/here").is_none());
        assert!(c.namespaces.lookup("surge").is_none());
        assert!(c.replication.remotes.is_empty());
    }

    /// `Debug` of a configuration (what a log line or a panic would print) never shows
    /// a password or a secret key.
    #[test]
    fn the_debug_of_a_config_hides_its_secrets() {
        let text = MINIMAL.replace(
            "[api]",
            "[kafka.client]\n\"sasl.password\" = \"kafka-pw-1234\"\n\"ssl.key.pem\" = \"pem-9876\"\n\"linger.ms\" = \"5\"\n[api]",
        );
        let text = format!(
            "{text}\n[checkpoint.s3]\nbucket = \"b\"\naccess-key = \"AKID\"\nsecret-key = \"s3-secret-5678\"\n"
        );
        let c = Config::parse(&text).unwrap();
        let shown = format!("{c:?}");
        for secret in ["kafka-pw-1234", "pem-9876", "s3-secret-5678"] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
        assert!(
            shown.contains("linger.ms") && shown.contains("AKID"),
            "{shown}"
        );
    }

    #[test]
    fn remotes_default_to_the_mirrored_topic_on_the_own_cluster() {
        let text = format!(
            "{MINIMAL}\n[[replication.remote]]\nregion = \"eu-west-1\"\n[[replication.remote]]\nregion = \"ap-south-1\"\ntopic = \"geostate.deltas\"\nbootstrap = \"10.0.0.1:9092\"\n"
        );
        let c = Config::parse(&text).unwrap();
        assert_eq!(c.replication.remotes[0].topic, "eu-west-1.geostate.deltas");
        assert_eq!(c.replication.remotes[0].bootstrap, "127.0.0.1:9092");
        assert_eq!(c.replication.remotes[1].bootstrap, "10.0.0.1:9092");
        let itself = format!("{MINIMAL}\n[[replication.remote]]\nregion = \"us-east-1\"\n");
        assert!(Config::parse(&itself).is_err());
    }

    #[test]
    fn the_example_region_files_are_valid() {
        for region in ["us-east-1", "eu-west-1"] {
            let path = crate::repo_file(&format!("regions/{region}.toml"));
            let c = Config::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert_eq!(c.region.as_str(), region);
            for (prefix, crdt, ownership) in [
                ("trips/", CrdtType::GCounter, Ownership::Shared),
                ("drivers/", CrdtType::PnCounter, Ownership::Shared),
                ("zones/", CrdtType::LwwRegister, Ownership::Shared),
                ("surge/", CrdtType::LwwRegister, Ownership::Owned),
            ] {
                let ns = c.namespaces.lookup(&format!("{prefix}9q8yy")).unwrap();
                assert_eq!((ns.crdt, ns.ownership), (crdt, ownership), "{prefix}");
            }
        }
    }

    #[test]
    fn only_a_windowed_namespace_outputs_its_final_windows() {
        let windowed = format!(
            "{MINIMAL}\n[[namespace]]\nprefix = \"requests/\"\ntype = \"g_counter\"\nownership = \"shared\"\noutput = \"final-windows\"\n[namespace.window]\nsize = \"1m\"\n"
        );
        let c = Config::parse(&windowed).unwrap();
        let outputs = |key| c.namespaces.lookup(key).unwrap().outputs_final_windows;
        assert!(outputs("requests/9q8yy") && !outputs("trips/9q8yy"));
        assert_eq!(c.kafka.outputs_topic, "geostate.outputs");
        let plain = MINIMAL.replace(
            "ownership = \"shared\"",
            "ownership = \"shared\"\noutput = \"final-windows\"",
        );
        let err = Config::parse(&plain).unwrap_err().to_string();
        assert!(
            err.contains("namespace.output") && err.contains("no window"),
            "{err}"
        );
        let owned = MINIMAL.replace(
            "ownership = \"owned\"",
            "ownership = \"owned\"\noutput = \"register-changes\"",
        );
        let c = Config::parse(&owned).unwrap();
        assert!(
            c.namespaces
                .lookup("surge/9q8yy")
                .unwrap()
                .outputs_register_changes
        );
        let shared = owned.replace("\"owned\"", "\"shared\"");
        let err = Config::parse(&shared).unwrap_err().to_string();
        assert!(err.contains("not an owned lww_register"), "{err}");
        let unknown = windowed.replace("\"final-windows\"", "\"every-change\"");
        let err = Config::parse(&unknown).unwrap_err().to_string();
        assert!(err.contains("not an output kind"), "{err}");
    }

    #[test]
    fn pricing_needs_demand_and_supply_windowed_alike_and_an_owned_register_that_outputs() {
        let counter = |prefix: &str, size: &str| {
            format!(
                "[[namespace]]\nprefix = \"{prefix}\"\ntype = \"g_counter\"\nownership = \"shared\"\n[namespace.window]\nsize = \"{size}\"\n"
            )
        };
        let text = |supply_size: &str, prices_output: &str| {
            format!(
                "{MINIMAL}\n{}{}[[namespace]]\nprefix = \"prices/\"\ntype = \"lww_register\"\nownership = \"owned\"\n{prices_output}\n[pricing]\ndemand = \"requests/\"\nsupply = \"supply/\"\nprices = \"prices/\"\n",
                counter("requests/", "1m"),
                counter("supply/", supply_size)
            )
        };
        let outputs = "output = \"register-changes\"";
        let c = Config::parse(&text("1m", outputs)).unwrap();
        let pricing = c.pricing.unwrap();
        assert_eq!(pricing.formula.hundredths(30, 10), 200);
        assert_eq!(pricing.window.size_ms, 60_000);
        let err = Config::parse(&text("2m", outputs)).unwrap_err().to_string();
        assert!(err.contains("must have the windows of"), "{err}");
        let err = Config::parse(&text("1m", "")).unwrap_err().to_string();
        assert!(err.contains("pricing.prices"), "{err}");
        let err = Config::parse(
            &text("1m", outputs).replace("supply = \"supply/\"", "supply = \"trips/\""),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("not a windowed namespace"), "{err}");
    }

    #[test]
    fn unknown_fields_are_refused() {
        let text = MINIMAL.replace("[kafka]", "[kafka]\nbootstrapp = \"x\"");
        let err = Config::parse(&text).unwrap_err().to_string();
        assert!(err.contains("unknown field `bootstrapp`"), "{err}");
    }

    #[test]
    fn overlapping_namespaces_are_refused() {
        let text = format!(
            "{MINIMAL}\n[[namespace]]\nprefix = \"trips/vip/\"\ntype = \"g_counter\"\nownership = \"shared\"\n"
        );
        let err = Config::parse(&text).unwrap_err().to_string();
        assert!(err.contains("overlap"), "{err}");
    }

    #[test]
    fn bad_types_durations_and_addresses_are_refused() {
        let bad_type = MINIMAL.replace("\"g_counter\"", "\"counter\"");
        assert!(Config::parse(&bad_type).is_err());
        let bad_duration =
            MINIMAL.replace("region =", "max-clock-offset = \"5 parsecs\"\nregion =");
        let err = Config::parse(&bad_duration).unwrap_err().to_string();
        assert!(err.contains("max-clock-offset"), "{err}");
        assert!(parse_duration("interval", "87600h").is_ok());
        let err = parse_duration("interval", "87601h")
            .unwrap_err()
            .to_string();
        assert!(err.contains("longer than 10 years"), "{err}");
        let shifted = |offset: &str| {
            Config::parse(&MINIMAL.replace(
                "region =",
                &format!("clock-offset = \"{offset}\"\nregion ="),
            ))
            .map(|c| c.clock_offset_nanos)
        };
        assert_eq!(shifted("2s").unwrap(), 2_000_000_000);
        assert_eq!(shifted("-250ms").unwrap(), -250_000_000);
        assert_eq!(Config::parse(MINIMAL).unwrap().clock_offset_nanos, 0);
        assert!(shifted("--1s").is_err());
        let replication = |setting: &str| {
            Config::parse(&format!("{MINIMAL}\n[replication]\n{setting}\n"))
                .map(|c| (c.replication.ship_every, c.replication.compression))
        };
        assert_eq!(
            replication("ship-every = \"250ms\"").unwrap(),
            (Duration::from_millis(250), "zstd")
        );
        let err = replication("ship-every = \"2s\"").unwrap_err().to_string();
        assert!(err.contains("heartbeat interval"), "{err}");
        let err = replication("compression = \"brotli\"")
            .unwrap_err()
            .to_string();
        assert!(err.contains("replication.compression"), "{err}");
        assert_eq!(replication("compression = \"lz4\"").unwrap().1, "lz4");
        let bad_addr =
            MINIMAL.replace("grpc-listen = \"127.0.0.1:0\"", "grpc-listen = \"nowhere\"");
        let err = Config::parse(&bad_addr).unwrap_err().to_string();
        assert!(err.contains("api.grpc-listen"), "{err}");
    }

    #[test]
    fn durations_parse() {
        let d = |s| parse_duration("f", s);
        assert_eq!(d("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(d("15s").unwrap(), Duration::from_secs(15));
        assert_eq!(d("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(d("1h").unwrap(), Duration::from_secs(3600));
        for bad in ["", "ms", "5", "5 s", "-1s", "1.5s", "3d"] {
            assert!(d(bad).is_err(), "{bad:?}");
        }
    }
}
