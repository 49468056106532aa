//! Checkpoints and savepoints: `checkpoint` and `savepoint` ask a running node to take
//! one; `restore` fills a stopped node's empty data dir from one, offline.

use super::{ConfigArgs, Node};
use crate::pb;

pub(super) async fn checkpoint(node: Node) -> anyhow::Result<()> {
    let mut client = node.admin().await?;
    let c = client
        .checkpoint(pb::CheckpointRequest {})
        .await?
        .into_inner();
    println!(
        "checkpoint {} ({} files, {} bytes, {} uploaded, {} ms): {}",
        c.id, c.files, c.bytes_total, c.bytes_uploaded, c.duration_ms, c.manifest
    );
    Ok(())
}

pub(super) async fn savepoint(node: Node) -> anyhow::Result<()> {
    let mut client = node.admin().await?;
    let s = client
        .savepoint(pb::SavepointRequest {})
        .await?
        .into_inner();
    println!(
        "savepoint {} ({} entries, {} bytes): {}",
        s.id, s.entries, s.bytes, s.location
    );
    Ok(())
}

pub(super) async fn restore(
    config: ConfigArgs,
    checkpoint: Option<String>,
    savepoint: Option<String>,
    seed: bool,
    partition: Option<usize>,
    list: bool,
) -> anyhow::Result<()> {
    use crate::checkpoint::{self, objects::Objects};
    let config = crate::config::Config::load_with(&config.config, &config.set)?;
    let objects = Objects::connect(&config.checkpoint.target).await;
    if list {
        for id in checkpoint::list(&objects).await? {
            println!("{id}");
        }
        return Ok(());
    }
    let into = config.data_dir.display();
    match savepoint {
        Some(savepoint) => {
            let header =
                checkpoint::savepoint::restore(&config, &objects, &savepoint, seed).await?;
            println!(
                "restored savepoint {savepoint} (region {}, written by geostate {}) into {into}",
                header.region, header.writer_version,
            );
        }
        None => {
            let manifest =
                checkpoint::restore(&config, &objects, checkpoint.as_deref(), partition).await?;
            let what = partition.map_or(String::new(), |p| format!("partition {p} of "));
            println!("restored {what}checkpoint {} into {into}", manifest.id);
        }
    }
    Ok(())
}
