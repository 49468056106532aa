//! `dlq replay`: late or dead-lettered records back into the updates topic (the work is
//! `crate::replay`'s).

use super::ConfigArgs;

pub(super) async fn replay(
    config: ConfigArgs,
    topic: Option<String>,
    event_time: Option<u64>,
    dry_run: bool,
) -> anyhow::Result<()> {
    let config = crate::config::Config::load_with(&config.config, &config.set)?;
    let topic = topic.unwrap_or_else(|| config.kafka.late_topic.clone());
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
    let event_time = event_time.unwrap_or(now.as_millis() as u64);
    let done = crate::replay::replay(&config.kafka, &topic, event_time, dry_run).await?;
    let verb = if dry_run { "would replay" } else { "replayed" };
    println!(
        "{verb} {} records of {topic} into {} at event time {event_time} ms; {} skipped (not update records)",
        done.appended, config.kafka.updates_topic, done.skipped
    );
    Ok(())
}
