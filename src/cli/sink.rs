//! `sink postgres` (the outputs topic into PostgreSQL exactly once, until SIGTERM) and
//! `sink reconcile` (the table compared with every region's outputs topic); the work is
//! `crate::sink`'s.

use anyhow::Context;

use super::ConfigArgs;
use super::serve::shutdown_signal;

pub(super) async fn postgres(config: ConfigArgs, postgres: String) -> anyhow::Result<()> {
    let config = crate::config::Config::load_with(&config.config, &config.set)?;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        let _ = stop.send(true);
    });
    let sink = crate::sink::postgres::SinkConfig {
        region: config.region.to_string(),
        kafka: config.kafka,
        postgres,
    };
    let written = crate::sink::postgres::run(sink, stopped).await?;
    println!(
        "wrote {} records in {} PostgreSQL transactions ({} rejected)",
        written.records, written.transactions, written.rejected
    );
    Ok(())
}

pub(super) async fn reconcile(
    config: ConfigArgs,
    postgres: String,
    regions: Vec<String>,
    wait: u64,
) -> anyhow::Result<()> {
    let wait = std::time::Duration::from_secs(wait);
    use crate::sink::reconcile::Source;
    let config = crate::config::Config::load_with(&config.config, &config.set)?;
    let mut sources = vec![Source {
        region: config.region.to_string(),
        kafka: config.kafka.clone(),
    }];
    for region in regions {
        let (name, bootstrap) = region
            .split_once('=')
            .with_context(|| format!("--region {region:?}: expected REGION=BOOTSTRAP"))?;
        let mut kafka = config.kafka.clone();
        kafka.bootstrap = bootstrap.to_owned();
        sources.push(Source {
            region: name.to_owned(),
            kafka,
        });
    }
    let found = crate::sink::reconcile::reconcile(&postgres, &sources, wait).await?;
    for difference in &found.differences {
        println!("DIFFERENCE {difference}");
    }
    for rewritten in &found.rewritten {
        println!("REWRITTEN {rewritten}: more than one owned result (the highest epoch stands)");
    }
    println!(
        "reconciled {} windows of {} regions' outputs with {} rows: {} differences, {} owned results rewritten",
        found.windows,
        sources.len(),
        found.rows,
        found.differences.len(),
        found.rewritten.len()
    );
    anyhow::ensure!(
        found.differences.is_empty(),
        "the table and the topics differ"
    );
    Ok(())
}
