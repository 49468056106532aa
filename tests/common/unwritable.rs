//! A Kafka topic made to refuse every write for a while: `max.message.bytes` = 90, below
//! any batch geostate writes (a heartbeat batch is over 100 bytes) and above a transaction
//! marker (about 80), which must still get through or the coordinator can never finish
//! aborting a failed round, and no producer of the transactional id starts again. Shipping
//! rounds to it fail and are retried. Not `min.insync.replicas` above the replica count:
//! Kafka 4 bounds it by the replica count and takes the writes (KAFKA-21110).

use anyhow::{Context, anyhow};
use rdkafka::admin::{AdminClient, AdminOptions, AlterConfig, ConfigSource, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;

/// A topic that takes no writes of geostate's (`max.message.bytes` = 90) until dropped;
/// its other settings are kept.
pub struct Unwritable {
    bootstrap: String,
    topic: String,
    kept: Vec<(String, String)>,
}

impl Unwritable {
    pub async fn new(bootstrap: &str, topic: &str) -> anyhow::Result<Self> {
        let described = admin(bootstrap)?
            .describe_configs(&[ResourceSpecifier::Topic(topic)], &AdminOptions::new())
            .await?;
        let resource = described
            .into_iter()
            .next()
            .context("no answer describing the topic")?
            .map_err(|e| anyhow!("describing {topic}: {e:?}"))?;
        let kept = resource
            .entries
            .into_iter()
            .filter(|e| e.source == ConfigSource::DynamicTopic && e.name != MAX_BYTES)
            .filter_map(|e| Some((e.name, e.value?)))
            .collect();
        let this = Self {
            bootstrap: bootstrap.into(),
            topic: topic.into(),
            kept,
        };
        alter(&this.bootstrap, &this.topic, &this.kept, Some(LIMIT)).await?;
        // the broker applies the change a moment after the controller took it
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while max_bytes(bootstrap, topic).await?.as_deref() != Some(LIMIT) {
            anyhow::ensure!(
                std::time::Instant::now() < deadline,
                "{topic} never showed {MAX_BYTES} = {LIMIT}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        Ok(this)
    }
}

/// The topic's `max.message.bytes` as a broker describes it.
pub async fn max_bytes(bootstrap: &str, topic: &str) -> anyhow::Result<Option<String>> {
    let described = admin(bootstrap)?
        .describe_configs(&[ResourceSpecifier::Topic(topic)], &AdminOptions::new())
        .await?;
    Ok(described
        .into_iter()
        .next()
        .context("no answer describing the topic")?
        .map_err(|e| anyhow!("describing {topic}: {e:?}"))?
        .entries
        .into_iter()
        .find(|e| e.name == MAX_BYTES)
        .and_then(|e| e.value))
}

impl Drop for Unwritable {
    fn drop(&mut self) {
        let (bootstrap, topic, kept) = (
            self.bootstrap.clone(),
            self.topic.clone(),
            self.kept.clone(),
        );
        let restored = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?
                .block_on(alter(&bootstrap, &topic, &kept, None))
        })
        .join();
        match restored {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("making {} writable again: {e}", self.topic),
            Err(_) => eprintln!("making {} writable again panicked", self.topic),
        }
    }
}

const MAX_BYTES: &str = "max.message.bytes";
pub const LIMIT: &str = "90";

fn admin(bootstrap: &str) -> anyhow::Result<AdminClient<DefaultClientContext>> {
    Ok(super::kafka_config(bootstrap).create()?)
}

/// Sets `topic`'s configuration to `kept` plus, if given, `max.message.bytes`.
async fn alter(
    bootstrap: &str,
    topic: &str,
    kept: &[(String, String)],
    max_bytes: Option<&str>,
) -> anyhow::Result<()> {
    let mut config = AlterConfig::new(ResourceSpecifier::Topic(topic));
    for (name, value) in kept {
        config = config.set(name, value);
    }
    if let Some(n) = max_bytes {
        config = config.set(MAX_BYTES, n);
    }
    for result in admin(bootstrap)?
        .alter_configs(&[config], &AdminOptions::new())
        .await?
    {
        result.map_err(|(_, e)| anyhow!("altering {topic}: {e:?}"))?;
    }
    Ok(())
}
