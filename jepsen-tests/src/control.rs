//! Process control of the local cluster (`regions/local/cluster.py` and signals), shared
//! by the `jepsen` harness and the `chaos` drills. Nothing here looks inside geostate: it
//! reads `cluster.json`, starts and stops processes, and asks the public Admin API who
//! holds a lease.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use geostate::pb;
use geostate::pb::admin_client::AdminClient;
use serde::Deserialize;

#[derive(Deserialize, Clone)]
pub struct ClusterFile {
    pub regions: BTreeMap<String, RegionFile>,
}

#[derive(Deserialize, Clone)]
pub struct RegionFile {
    pub grpc: Option<String>,
    pub pid: Option<u32>,
    pub data_dir: Option<PathBuf>,
}

pub fn read_cluster(path: &Path) -> anyhow::Result<ClusterFile> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(serde_json::from_str(&text)?)
}

/// `regions/local/cluster.py <args>` for the cluster of `cluster_json` (a child process
/// awaited, not blocking the clients' threads).
pub async fn cluster_script(cluster_json: &Path, args: &[&str]) -> anyhow::Result<()> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../regions/local/cluster.py");
    let run_dir = cluster_json
        .parent()
        .context("cluster.json has no folder")?;
    let out = tokio::process::Command::new("python3")
        .arg(script)
        .args(args)
        .env("GEOSTATE_RUN_DIR", run_dir)
        .output()
        .await?;
    if !out.status.success() {
        bail!(
            "cluster.py {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// `kill <sig> <pid>`, awaited as a child process (never blocking a runtime thread).
pub async fn signal(sig: &str, pid: u32) {
    let _ = tokio::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .await;
}

pub fn grpc(r: &RegionFile) -> anyhow::Result<String> {
    Ok(format!(
        "http://{}",
        r.grpc.clone().context("region without grpc")?
    ))
}

/// The region a fault of the `round`-th round hits.
pub fn target_region(cluster: &ClusterFile, round: usize) -> String {
    let names: Vec<&String> = cluster.regions.keys().collect();
    names[round % names.len()].clone()
}

/// The region (and node pid) holding `key`'s lease, or the first region for shared keys.
pub async fn holder(
    cluster: &ClusterFile,
    key: &str,
    hash_shards: u32,
) -> anyhow::Result<(String, u32)> {
    let (first, r) = cluster.regions.iter().next().context("no region")?;
    let mut pick = first.clone();
    if hash_shards > 0 && key.starts_with("surge/") {
        let shard = geostate::lease::table::shard_of(key, hash_shards);
        let mut admin = AdminClient::connect(grpc(r)?).await?;
        let leases = admin.leases(pb::LeasesRequest {}).await?.into_inner();
        if let Some(s) = leases
            .shards
            .iter()
            .find(|s| s.shard == shard && !s.holder.is_empty())
        {
            pick = s.holder.clone();
        }
    }
    let pid = cluster.regions[&pick].pid.context("node pid")?;
    Ok((pick, pid))
}

/// Whatever a fault left behind: network cuts removed, a frozen node resumed, dead nodes,
/// brokers and MirrorMaker 2 started.
pub async fn heal(cluster_json: &Path) -> anyhow::Result<()> {
    let cluster = read_cluster(cluster_json)?;
    for r in cluster.regions.values() {
        if let Some(pid) = r.pid {
            signal("-CONT", pid).await;
        }
    }
    cluster_script(cluster_json, &["net", "heal"]).await?;
    cluster_script(cluster_json, &["mirror", "start"]).await?;
    for region in cluster.regions.keys() {
        cluster_script(cluster_json, &["kafka", "start", region]).await?;
    }
    cluster_script(cluster_json, &["up", "--no-build"]).await
}
