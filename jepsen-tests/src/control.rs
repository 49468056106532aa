//! Process control of the local cluster (`regions/local/cluster.py` and signals), shared
//! by the `jepsen` harness and the `chaos` drills. Nothing here looks inside geostate: it
//! reads `cluster.json`, starts and stops processes, and asks the public Admin API who
//! holds a lease.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use geostate_proto::pb;
use geostate_proto::pb::admin_client::AdminClient;
use geostate_proto::pb::state_client::StateClient;
use serde::Deserialize;
use tonic::transport::Channel;

/// `cluster.json`: what `regions/local/cluster.py up` started and where. The one model of
/// the file, for the harness, the drills, the integration tests and the benchmarks.
#[derive(Deserialize, Clone)]
pub struct ClusterFile {
    pub s3: S3Endpoint,
    pub regions: BTreeMap<String, RegionFile>,
    #[serde(default)]
    pub tools: Tools,
    /// The lease group's third member.
    pub witness: Option<WitnessFile>,
    /// The outputs table's database (clusters started before it have none).
    pub postgres: Option<PostgresFile>,
    /// The Prometheus scraping every node (clusters started before it have none).
    pub prometheus: Option<PrometheusFile>,
}

/// The cluster's Prometheus, evaluating `deploy/prometheus/rules.yml`.
#[derive(Deserialize, Clone)]
pub struct PrometheusFile {
    /// `http://127.0.0.1:<port>`.
    pub url: String,
    pub pid: Option<u32>,
}

/// The cluster's PostgreSQL, which each region's sink writes its outputs into.
#[derive(Deserialize, Clone)]
pub struct PostgresFile {
    /// A libpq connection string.
    pub url: String,
    pub port: u16,
    pub pid: Option<u32>,
}

#[derive(Deserialize, Clone, Default)]
pub struct Tools {
    /// The `cluster.py` that started the cluster (older files do not name it).
    pub cluster_py: Option<PathBuf>,
    #[serde(default)]
    pub grpcurl: String,
    /// The S3-compatible server binary, for tests that need one of their own.
    #[serde(default)]
    pub s3s_fs: String,
    #[serde(default)]
    pub geostate: String,
}

#[derive(Deserialize, Clone)]
pub struct S3Endpoint {
    pub endpoint: String,
    pub bucket: String,
    pub access_key: String,
    pub secret_key: String,
    pub region: String,
}

/// One region: its Kafka broker and its node.
#[derive(Deserialize, Clone)]
pub struct RegionFile {
    pub kafka: String,
    pub kafka_pid: u32,
    pub grpc: Option<String>,
    pub metrics: Option<String>,
    pub pid: Option<u32>,
    pub data_dir: Option<PathBuf>,
    /// The node's region file and its `--set KEY=VALUE` overrides.
    pub config: Option<PathBuf>,
    #[serde(default)]
    pub set: Vec<String>,
    /// The node's lease group address.
    pub lease: Option<String>,
    /// The region's further nodes by index (`make up NODES=N`, `cluster.py node add`).
    #[serde(default)]
    pub nodes: std::collections::BTreeMap<String, NodeFile>,
    /// What a Kafka client of this region's broker sets besides the bootstrap address
    /// (SASL_SSL on a `make up SECURE=1` cluster; empty: plaintext).
    #[serde(default)]
    pub kafka_client: BTreeMap<String, String>,
    /// The region's `geostate pricer` process.
    pub pricer: Option<ProcessFile>,
}

/// A process beside a region's nodes (its pricer).
#[derive(Deserialize, Clone)]
pub struct ProcessFile {
    pub pid: Option<u32>,
}

/// One of a region's further nodes.
#[derive(Deserialize, Clone)]
pub struct NodeFile {
    pub grpc: Option<String>,
    pub metrics: Option<String>,
    pub pid: Option<u32>,
}

#[derive(Deserialize, Clone)]
pub struct WitnessFile {
    pub grpc: Option<String>,
    pub pid: Option<u32>,
}

/// A Kafka client configuration for the broker at `bootstrap`, with [`kafka_client_of`].
pub fn kafka_config(bootstrap: &str) -> rdkafka::ClientConfig {
    let mut config = rdkafka::ClientConfig::new();
    config.set("bootstrap.servers", bootstrap);
    for (k, v) in kafka_client_of(bootstrap) {
        config.set(k, v);
    }
    config
}

/// The client properties the region of the broker at `bootstrap` sets in the cluster file
/// `$GEOSTATE_CLUSTER` (SASL_SSL on a `make up SECURE=1` cluster; none for a broker it
/// does not list).
pub fn kafka_client_of(bootstrap: &str) -> BTreeMap<String, String> {
    let cluster =
        std::env::var_os("GEOSTATE_CLUSTER").and_then(|p| read_cluster(Path::new(&p)).ok());
    let region = cluster
        .into_iter()
        .flat_map(|c| c.regions.into_values())
        .find(|r| r.kafka == bootstrap);
    region.map(|r| r.kafka_client).unwrap_or_default()
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

/// Every node of the region, its first node first.
pub fn node_grpcs(r: &RegionFile) -> anyhow::Result<Vec<String>> {
    let further = r.nodes.values().filter_map(|n| n.grpc.as_ref());
    Ok(std::iter::once(grpc(r)?)
        .chain(further.map(|a| format!("http://{a}")))
        .collect())
}

/// Wall-clock nanoseconds since the Unix epoch: the nodes' clock (one machine).
pub fn now_nanos() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// The nodes of `regions` that have not heard from some other region since `barrier`
/// (`Admin/Status`: that region's heartbeats on every partition the node merges were
/// sent at or after it), each as "NODE has not heard from REGION since the clients
/// stopped". A node that owns no partition, or takes no connection (an exited one), holds
/// no key and is left out; one that does not answer within 5 s (a frozen one) is behind.
const STATUS_WAIT: Duration = Duration::from_secs(5);

pub async fn not_heard_since(
    cluster: &ClusterFile,
    regions: &[String],
    barrier: u64,
) -> anyhow::Result<Vec<String>> {
    let mut behind = Vec::new();
    for region in regions {
        for node in node_grpcs(&cluster.regions[region])? {
            let asked = tokio::time::timeout(STATUS_WAIT, async {
                let mut admin = AdminClient::connect(node.clone()).await.ok()?;
                Some(admin.status(pb::StatusRequest {}).await)
            });
            let status = match asked.await {
                Ok(None) => continue,
                Ok(Some(Ok(s))) => s.into_inner(),
                Ok(Some(Err(e))) => {
                    behind.push(format!("{node} answers no status ({})", e.message()));
                    continue;
                }
                Err(_) => {
                    behind.push(format!("{node} answers no status within {STATUS_WAIT:?}"));
                    continue;
                }
            };
            if status.owned_partitions.is_empty() {
                continue;
            }
            behind.extend(
                status
                    .remotes
                    .iter()
                    .filter(|r| r.heard_from_all_since_nanos < barrier)
                    .map(|r| {
                        format!(
                            "{node} ({region}) has not heard from {} since the clients stopped",
                            r.region
                        )
                    }),
            );
        }
    }
    Ok(behind)
}

/// A `State` client of `addr` that connects when first used (so it outlives a node's
/// restart) and gives up on a call after 5 s.
pub fn state_client(addr: &str) -> anyhow::Result<StateClient<Channel>> {
    let endpoint = tonic::transport::Endpoint::from_shared(addr.to_string())?
        .connect_timeout(Duration::from_secs(1))
        .timeout(Duration::from_secs(5));
    Ok(StateClient::new(endpoint.connect_lazy()))
}

/// The ownership shard of each of `keys`, as `region`'s node maps keys to shards (`None`:
/// the key is in no owned namespace, or the node has no lease group).
pub async fn shards_of(
    region: &RegionFile,
    keys: &[String],
) -> anyhow::Result<BTreeMap<String, Option<u32>>> {
    let mut admin = AdminClient::connect(grpc(region)?).await?;
    let mut shards = BTreeMap::new();
    for key in keys {
        let request = pb::LeasesRequest { key: key.clone() };
        let shard = match admin.leases(request).await {
            Ok(r) => r.into_inner().shards.first().map(|s| s.shard),
            Err(s) if s.code() == tonic::Code::FailedPrecondition => None,
            Err(s) => return Err(s.into()),
        };
        shards.insert(key.clone(), shard);
    }
    Ok(shards)
}

/// Freezes `pid` (SIGSTOP) for `down`, then lets it run again (SIGCONT).
pub async fn pause(pid: u32, down: Duration) {
    signal("-STOP", pid).await;
    tokio::time::sleep(down).await;
    signal("-CONT", pid).await;
}

/// Stops MirrorMaker 2 for `down`, then starts it again: the regions keep running, and
/// what they ship meanwhile waits in their own deltas topics.
pub async fn mirror_outage(cluster_json: &Path, down: Duration) -> anyhow::Result<()> {
    cluster_script(cluster_json, &["mirror", "stop"]).await?;
    tokio::time::sleep(down).await;
    cluster_script(cluster_json, &["mirror", "start"]).await
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
/// Adds a node to `region` (`cluster.py node add`); answers its name, `REGION/i`.
pub async fn add_node(cluster_json: &Path, region: &str) -> anyhow::Result<String> {
    let before: Vec<String> = read_cluster(cluster_json)?.regions[region]
        .nodes
        .keys()
        .cloned()
        .collect();
    cluster_script(cluster_json, &["node", "add", region]).await?;
    let after = read_cluster(cluster_json)?;
    let added = after.regions[region]
        .nodes
        .keys()
        .find(|i| !before.contains(i))
        .context("`node add` added no node")?;
    Ok(format!("{region}/{added}"))
}

pub fn target_region(cluster: &ClusterFile, round: usize) -> String {
    let names: Vec<&String> = cluster.regions.keys().collect();
    names[round % names.len()].clone()
}

/// The region (and node pid) holding `key`'s lease, or the first region for a key no
/// region holds (a shared key, or a shard never granted).
pub async fn holder(cluster: &ClusterFile, key: &str) -> anyhow::Result<(String, u32)> {
    let (first, r) = cluster.regions.iter().next().context("no region")?;
    let mut admin = AdminClient::connect(grpc(r)?).await?;
    let request = pb::LeasesRequest {
        key: key.to_owned(),
    };
    let holder = match admin.leases(request).await {
        Ok(r) => r
            .into_inner()
            .shards
            .into_iter()
            .map(|s| s.holder)
            .find(|h| !h.is_empty()),
        Err(s) if s.code() == tonic::Code::FailedPrecondition => None,
        Err(s) => return Err(s.into()),
    };
    let pick = holder.unwrap_or_else(|| first.clone());
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
