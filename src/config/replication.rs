//! The `[replication]` section: which other regions' deltas this region merges and where
//! it reads them, and how it ships its own (outbox bound, pacing, compression, standbys).

use std::time::Duration;

use serde::Deserialize;

use super::kafka::RawKafka;
use super::{ConfigError, KafkaConfig, invalid, parse_duration};
use crate::crdt::RegionId;

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

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(super) struct RawReplication {
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

impl RawReplication {
    /// The outbox bound, then the remote regions: none is `region` itself or listed
    /// twice, and each reads, unless told otherwise, its mirror of the deltas topic on
    /// this region's `kafka`. Checked before the other sections; the rest of the section
    /// is validated later, by [`Self::validate`].
    pub(super) fn validate_remotes(
        &self,
        region: &RegionId,
        kafka: &RawKafka,
    ) -> Result<Vec<RemoteConfig>, ConfigError> {
        if self.max_outbox_keys == 0 {
            return Err(invalid("replication.max-outbox-keys", "must be at least 1"));
        }
        let mut remotes: Vec<RemoteConfig> = Vec::new();
        for raw in &self.remotes {
            let remote = RegionId::new(raw.region.as_str())
                .map_err(|e| invalid("replication.remote.region", e.to_string()))?;
            if remote == *region {
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
                    .clone()
                    .unwrap_or_else(|| format!("{remote}.{}", kafka.deltas_topic)),
                bootstrap: raw
                    .bootstrap
                    .clone()
                    .unwrap_or_else(|| kafka.bootstrap.clone()),
                region: remote,
            });
        }
        Ok(remotes)
    }

    /// The section, with the `remotes` that [`Self::validate_remotes`] made of it.
    pub(super) fn validate(
        self,
        remotes: Vec<RemoteConfig>,
    ) -> Result<ReplicationConfig, ConfigError> {
        Ok(ReplicationConfig {
            remotes,
            max_outbox_keys: self.max_outbox_keys,
            ship_every: parse_ship_every(&self.ship_every)?,
            compression: COMPRESSIONS
                .into_iter()
                .find(|&c| c == self.compression)
                .ok_or_else(|| {
                    invalid(
                        "replication.compression",
                        format!(
                            "{:?} is not one of {}",
                            self.compression,
                            COMPRESSIONS.join(", ")
                        ),
                    )
                })?,
            standby_replicas: self.standby_replicas,
        })
    }
}
