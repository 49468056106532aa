//! Process control of the local cluster (`regions/local/cluster.py` and signals), shared
//! by the `jepsen` harness and the `chaos` drills. Nothing here looks inside geostate: it
//! reads `cluster.json`, starts and stops processes, and asks the public Admin API who
//! holds a lease.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use geostate::pb;
use geostate::pb::admin_client::AdminClient;
use geostate::pb::state_client::StateClient;
use serde::Deserialize;
use tonic::transport::Channel;

#[derive(Deserialize, Clone)]
pub struct ClusterFile {
    pub regions: BTreeMap<String, RegionFile>,
    #[serde(default)]
    pub tools: Tools,
}

#[derive(Deserialize, Clone, Default)]
pub struct Tools {
    /// The `cluster.py` that started the cluster (older files do not name it).
    pub cluster_py: Option<PathBuf>,
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
    cluster_script_output(cluster_json, args).await.map(drop)
}

/// [`cluster_script`], returning what it printed.
pub async fn cluster_script_output(cluster_json: &Path, args: &[&str]) -> anyhow::Result<String> {
    // the script that made the cluster: the folder compiled in may be another checkout's
    // (one target directory serves several)
    let script = match read_cluster(cluster_json)?.tools.cluster_py {
        Some(script) => script,
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../regions/local/cluster.py"),
    };
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
    Ok(String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr))
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

/// A `State` client of `addr` that connects when first used (so it outlives a node's
/// restart) and gives up on a call after 5 s.
pub fn state_client(addr: &str) -> anyhow::Result<StateClient<Channel>> {
    let endpoint = tonic::transport::Endpoint::from_shared(addr.to_string())?
        .connect_timeout(Duration::from_secs(1))
        .timeout(Duration::from_secs(5));
    Ok(StateClient::new(endpoint.connect_lazy()))
}

/// How many hash shards owned keys spread over, from `region`'s public lease listing.
pub async fn hash_shards(region: &RegionFile) -> anyhow::Result<u32> {
    let mut admin = AdminClient::connect(grpc(region)?).await?;
    let leases = admin.leases(pb::LeasesRequest {}).await?.into_inner();
    Ok(leases.shards.iter().filter(|s| s.prefix.is_empty()).count() as u32)
}

/// Kills `region`'s Kafka broker, keeps it down for `down`, starts it again, and restarts
/// a node that gave up on it meanwhile.
pub async fn broker_outage(
    cluster_json: &Path,
    region: &str,
    down: Duration,
) -> anyhow::Result<()> {
    cluster_script(cluster_json, &["kafka", "kill", region]).await?;
    tokio::time::sleep(down).await;
    cluster_script(cluster_json, &["kafka", "start", region]).await?;
    cluster_script(cluster_json, &["up", "--no-build"]).await
}

/// SIGKILLs `region`'s node, deletes its data dir and restarts it: it restores from the
/// newest S3 checkpoint and its own deltas topic. The lease group's Raft log
/// (`<data-dir>.raft`) stays: a member must not forget its votes.
pub async fn wipe_node(
    cluster_json: &Path,
    cluster: &ClusterFile,
    region: &str,
) -> anyhow::Result<()> {
    let r = &cluster.regions[region];
    let pid = r.pid.context("node pid")?;
    let dir = r.data_dir.clone().context("node data_dir")?;
    signal("-KILL", pid).await;
    while Path::new(&format!("/proc/{pid}")).exists() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::fs::remove_dir_all(&dir)
        .await
        .with_context(|| format!("wiping {}", dir.display()))?;
    cluster_script(cluster_json, &["up", "--no-build"]).await
}

/// Cuts `region` off the other sites (`direction`: both, out or in) for `down`, then
/// removes every cut.
pub async fn isolate(
    cluster_json: &Path,
    region: &str,
    direction: &str,
    down: Duration,
) -> anyhow::Result<()> {
    cluster_script(
        cluster_json,
        &["net", "isolate", region, "--direction", direction],
    )
    .await?;
    tokio::time::sleep(down).await;
    cluster_script(cluster_json, &["net", "heal"]).await
}

/// Delays every packet between `region` and the other sites by `ms` ± `jitter_ms` (WAN
/// latency, `cluster.py net delay`) for `down`, then heals; returns how many packets were
/// delayed.
pub async fn wan_delay(
    cluster_json: &Path,
    region: &str,
    ms: u64,
    jitter_ms: u64,
    down: Duration,
) -> anyhow::Result<u64> {
    let (ms, jitter) = (ms.to_string(), jitter_ms.to_string());
    cluster_script(
        cluster_json,
        &["net", "delay", region, "--ms", &ms, "--jitter", &jitter],
    )
    .await?;
    tokio::time::sleep(down).await;
    let healed = cluster_script_output(cluster_json, &["net", "heal"]).await?;
    // "network healed (N packets had been delayed)"
    healed
        .split_once("healed (")
        .and_then(|(_, rest)| rest.split_whitespace().next()?.parse().ok())
        .with_context(|| format!("net heal printed no count: {healed}"))
}

/// Restarts `region`'s node with its wall clock `offset_ms` ahead for `down`, then
/// restarts it with the clock right.
pub async fn clock_offset(
    cluster_json: &Path,
    region: &str,
    offset_ms: u64,
    down: Duration,
) -> anyhow::Result<()> {
    let offset = offset_ms.to_string();
    let restart = ["node", "restart", region];
    cluster_script(
        cluster_json,
        &[&restart[..], &["--clock-offset", &offset]].concat(),
    )
    .await?;
    tokio::time::sleep(down).await;
    cluster_script(cluster_json, &restart).await
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
