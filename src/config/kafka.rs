//! The `[kafka]` section: the cluster this region reads and writes, its topics, the
//! record format of the updates topic, and the client properties. `Debug` never shows a
//! client property that may hold a secret.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::security::RawKafkaSecurity;
use super::{ConfigError, KafkaSecurity, invalid};

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

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(super) struct RawKafka {
    /// Read by `[replication]` too: a remote's default bootstrap.
    pub(super) bootstrap: String,
    #[serde(default = "default_updates_topic")]
    updates_topic: String,
    /// Read by `[replication]` too: a remote's default topic is its mirror of this one.
    #[serde(default = "default_deltas_topic")]
    pub(super) deltas_topic: String,
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

impl RawKafka {
    /// The topic names and the bootstrap must not be empty. Checked before the other
    /// sections; the security settings are validated later, by [`Self::validate`].
    pub(super) fn check_names(&self) -> Result<(), ConfigError> {
        for (field, topic) in [
            ("kafka.updates-topic", &self.updates_topic),
            ("kafka.deltas-topic", &self.deltas_topic),
            ("kafka.dlq-topic", &self.dlq_topic),
            ("kafka.late-topic", &self.late_topic),
            ("kafka.outputs-topic", &self.outputs_topic),
        ] {
            if topic.is_empty() {
                return Err(invalid(field, "must not be empty"));
            }
        }
        if self.bootstrap.is_empty() {
            return Err(invalid("kafka.bootstrap", "must not be empty"));
        }
        Ok(())
    }

    /// The section, its security settings validated (its names were checked by
    /// [`Self::check_names`]).
    pub(super) fn validate(self) -> Result<KafkaConfig, ConfigError> {
        let security = self.security.map(RawKafkaSecurity::validate).transpose()?;
        Ok(KafkaConfig {
            bootstrap: self.bootstrap,
            updates_topic: self.updates_topic,
            deltas_topic: self.deltas_topic,
            dlq_topic: self.dlq_topic,
            late_topic: self.late_topic,
            outputs_topic: self.outputs_topic,
            format: self.format,
            client: self.client,
            security,
        })
    }
}
