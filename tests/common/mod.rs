//! Shared by the integration tests: the running local cluster (`cluster.json`), unique
//! names, Kafka topic creation, and region node processes of the real binary.

#![allow(dead_code)] // each test binary uses a different part

pub mod failover;
pub mod histogram;
pub mod pki;
pub mod sidecars;
pub mod unwritable;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use geostate::pb;
use geostate::pb::admin_client::AdminClient;
use geostate::pb::state_client::StateClient;
use geostate_proto::outputs::OutputRecord;
use rdkafka::admin::{AdminClient as KafkaAdmin, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{FutureProducer, FutureRecord};
use tonic::transport::Channel;

/// `cluster.json`, as the harness and the drills read it.
pub use geostate_jepsen::control::{ClusterFile as Cluster, RegionFile, S3Endpoint, kafka_config};

/// An `Update` adding `n` to the counter `key`, without an id or event time.
pub fn add(key: &str, n: i64) -> pb::UpdateRequest {
    pb::UpdateRequest {
        key: key.into(),
        op: Some(pb::update_request::Op::Add(n)),
        id: String::new(),
        event_time_ms: 0,
    }
}

/// An `Update` adding 1 to the counter `key` at event time `event_time_ms`.
pub fn add_at(key: &str, event_time_ms: u64) -> pb::UpdateRequest {
    pb::UpdateRequest {
        event_time_ms,
        ..add(key, 1)
    }
}

/// The configuration a node of `cluster.json` runs with: its region file and overrides.
pub fn node_config(r: &RegionFile) -> anyhow::Result<geostate::config::Config> {
    config_with(r.config.as_ref().context("no node config")?, &r.set)
}

/// The configuration in `path` with `set` (`--set KEY=VALUE`) applied.
pub fn config_with(path: &Path, set: &[String]) -> anyhow::Result<geostate::config::Config> {
    let settings = set
        .iter()
        .map(|s| s.parse().map_err(anyhow::Error::msg))
        .collect::<anyhow::Result<Vec<geostate::config::Setting>>>()?;
    Ok(geostate::config::Config::load_with(path, &settings)?)
}

/// A secure cluster's broker at `bootstrap` (`make up SECURE=1`): the `--set` of its
/// SASL_SSL client properties (`kafka.client`); `None` for a plaintext one.
pub fn kafka_client_setting(bootstrap: &str) -> Option<String> {
    let client = geostate_jepsen::control::kafka_client_of(bootstrap);
    let table: Vec<String> = client
        .iter()
        .map(|(k, v)| format!("{k:?} = {v:?}"))
        .collect();
    (!client.is_empty()).then(|| format!("kafka.client={{ {} }}", table.join(", ")))
}

/// `--set` arguments for the binary.
pub fn set_args(set: &[String]) -> Vec<String> {
    set.iter()
        .flat_map(|s| ["--set".to_owned(), s.clone()])
        .collect()
}

pub fn cluster() -> anyhow::Result<Cluster> {
    geostate_jepsen::control::read_cluster(&cluster_json())
        .context("no cluster: run `make test` (or `make up` first)")
}

pub fn cluster_json() -> PathBuf {
    std::env::var_os("GEOSTATE_CLUSTER")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_file("regions/local/run/cluster.json"))
}

/// The cluster's run folder (its `cluster.json`, `logs/`, data).
pub fn run_dir() -> anyhow::Result<PathBuf> {
    Ok(cluster_json()
        .parent()
        .context("cluster.json has no folder")?
        .to_path_buf())
}

/// One record of a dead-letter topic: its key, its value's length and its headers.
pub struct DeadLetter {
    pub key: Option<String>,
    pub len: usize,
    pub headers: BTreeMap<String, String>,
}

impl DeadLetter {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }
}

/// The first `wanted` dead letters of `topic` that `keep` accepts, in log order; an error
/// if they are not there within `within`.
pub async fn dead_letters(
    kafka: &str,
    topic: &str,
    wanted: usize,
    within: Duration,
    keep: impl Fn(&DeadLetter) -> bool,
) -> anyhow::Result<Vec<DeadLetter>> {
    use rdkafka::Message;
    use rdkafka::consumer::{Consumer, StreamConsumer};
    use rdkafka::message::Headers;
    let consumer: StreamConsumer = kafka_config(kafka)
        .set("group.id", unique("dlq-reader"))
        .set("auto.offset.reset", "earliest")
        .create()?;
    consumer.subscribe(&[topic])?;
    let mut out = Vec::new();
    let until = Instant::now() + within;
    while out.len() < wanted {
        let left = until.saturating_duration_since(Instant::now());
        let message = tokio::time::timeout(left, consumer.recv())
            .await
            .with_context(|| {
                format!("{} of {wanted} dead letters within {within:?}", out.len())
            })??;
        let headers = message.headers().map_or_else(BTreeMap::new, |h| {
            h.iter()
                .map(|h| {
                    let value = h.value.map(String::from_utf8_lossy).unwrap_or_default();
                    (h.key.to_owned(), value.into_owned())
                })
                .collect()
        });
        let letter = DeadLetter {
            key: message
                .key()
                .map(|k| String::from_utf8_lossy(k).into_owned()),
            len: message.payload().map_or(0, <[u8]>::len),
            headers,
        };
        if keep(&letter) {
            out.push(letter);
        }
    }
    Ok(out)
}

/// An idempotent producer for feeding topics in tests.
pub fn producer(bootstrap: &str) -> anyhow::Result<FutureProducer> {
    Ok(kafka_config(bootstrap)
        // the Java producer's partitioner, as the node's own producers use
        .set("partitioner", "murmur2_random")
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "5")
        .set("queue.buffering.max.messages", "1000000")
        .create()?)
}

/// Produces every `(key, payload)` to `topic` and waits until Kafka acknowledged all.
pub async fn produce_all(
    producer: &FutureProducer,
    topic: &str,
    records: &[(String, Vec<u8>)],
) -> anyhow::Result<()> {
    let mut pending = Vec::with_capacity(records.len());
    for (key, payload) in records {
        let record = FutureRecord::to(topic).key(key).payload(payload);
        pending.push(producer.send_result(record).map_err(|(e, _)| e)?);
    }
    for delivery in pending {
        delivery.await?.map_err(|(e, _)| e)?;
    }
    Ok(())
}

/// An update record adding 1 to `key` at event time `t`, as `(key, payload)`.
pub fn add_one_at(key: &str, t: u64, format: geostate::config::RecordFormat) -> (String, Vec<u8>) {
    let update = geostate::ingest::event::Update {
        key: key.to_owned(),
        op: geostate::ingest::event::Op::Add(1),
        id: None,
        event_time_ms: Some(t),
        hlc: None,
        epoch: None,
    };
    (key.to_owned(), update.encode(format))
}

pub fn counter(v: &pb::Value) -> i64 {
    match v.value {
        Some(pb::value::Value::Counter(n)) => n,
        ref other => panic!("{} is not a counter: {other:?}", v.key),
    }
}

/// CPU seconds (user + system) a process has used, from /proc (benchmarks).
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0 // utime, stime; USER_HZ is 100 on Linux
}

/// Runs a benchmark's body on a two-thread runtime (benchmarks have no test harness).
pub fn block_on<T>(
    body: impl std::future::Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?
        .block_on(body)
}

/// The `p` quantile (0..=1) of sorted durations.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// A duration in milliseconds for a report.
pub fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

/// A plain HTTP/1.1 GET (the metrics endpoint); returns the whole response.
pub fn http_get(addr: &str, path: &str) -> anyhow::Result<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr)?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes())?;
    let mut body = String::new();
    stream.read_to_string(&mut body)?;
    Ok(body)
}

/// The value of the first line of the node's metrics at `addr` that starts with `line`
/// (a name, with its labels' opening brace or a space after it), if there is one.
pub fn metric(addr: &str, line: &str) -> anyhow::Result<Option<f64>> {
    Ok(http_get(addr, "/metrics")?
        .lines()
        .find(|l| l.starts_with(line))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok()))
}

/// Starts MirrorMaker 2 again however the test that stopped it ends.
pub struct RestartMirror;

impl Drop for RestartMirror {
    fn drop(&mut self) {
        if let Err(e) = cluster_script(&["mirror", "start"]) {
            eprintln!("restarting mirrormaker 2: {e}");
        }
    }
}

/// A file of this repository: under the `CARGO_MANIFEST_DIR` cargo sets when it runs the
/// test, not the one compiled in (cargo reuses a test binary built in another checkout
/// that shares the target directory; the compiled-in folder is then that checkout's).
pub fn repo_file(relative: &str) -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| env!("CARGO_MANIFEST_DIR").into(), PathBuf::from)
        .join(relative)
}

/// Runs `regions/local/cluster.py <args>` against the cluster the tests use; returns what
/// it printed.
pub fn cluster_script(args: &[&str]) -> anyhow::Result<String> {
    cluster_script_env(args, &[])
}

/// [`cluster_script`] with extra environment variables.
pub fn cluster_script_env(args: &[&str], env: &[(&str, &str)]) -> anyhow::Result<String> {
    cluster_script_in(&run_dir()?, args, env)
}

/// `regions/local/cluster.py <args>` against the cluster of the run folder `run`.
fn cluster_script_in(run: &Path, args: &[&str], env: &[(&str, &str)]) -> anyhow::Result<String> {
    let out = Command::new("python3")
        .arg(repo_file("regions/local/cluster.py"))
        .args(args)
        .env("GEOSTATE_RUN_DIR", run)
        .envs(env.iter().copied())
        .output()?;
    if !out.status.success() {
        bail!(
            "cluster.py {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A local cluster of `regions` of its own (`cluster.py up` with `REGIONS`), in a run
/// folder next to the suite's named `<run>-<label>`; stopped when dropped. Its nodes run
/// the build `GEOSTATE_PROFILE` names, as the suite's do.
pub struct PrivateCluster {
    run: PathBuf,
    regions: String,
}

impl PrivateCluster {
    pub fn up(label: &str, regions: &[&str]) -> anyhow::Result<Self> {
        let suite = run_dir()?;
        let name = suite.file_name().context("run dir")?.to_string_lossy();
        let cluster = PrivateCluster {
            run: suite.with_file_name(format!("{name}-{label}")),
            regions: regions.join(","),
        };
        cluster.script(&["up", "--no-build"])?;
        Ok(cluster)
    }

    /// `regions/local/cluster.py <args>` against this cluster.
    pub fn script(&self, args: &[&str]) -> anyhow::Result<String> {
        cluster_script_in(&self.run, args, &[("REGIONS", &self.regions)])
    }

    pub fn cluster(&self) -> anyhow::Result<Cluster> {
        geostate_jepsen::control::read_cluster(&self.run.join("cluster.json"))
    }
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        let _ = self.script(&["down"]);
    }
}

/// An `aws-sdk-s3` client for the cluster's S3 server (or another at `endpoint`).
pub fn s3_client(s3: &S3Endpoint, endpoint: &str) -> aws_sdk_s3::Client {
    use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};
    let conf = aws_sdk_s3::config::Builder::new()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new(s3.region.clone()))
        .endpoint_url(endpoint)
        .force_path_style(true)
        .credentials_provider(Credentials::new(
            &s3.access_key,
            &s3.secret_key,
            None,
            None,
            "cluster.json",
        ))
        .build();
    aws_sdk_s3::Client::from_conf(conf)
}

/// Every key under `prefix` in `bucket`.
pub async fn s3_keys(
    client: &aws_sdk_s3::Client,
    bucket: &str,
    prefix: &str,
) -> anyhow::Result<Vec<String>> {
    let mut keys = Vec::new();
    let mut token = None;
    loop {
        let page = client
            .list_objects_v2()
            .bucket(bucket)
            .prefix(prefix)
            .set_continuation_token(token)
            .send()
            .await?;
        keys.extend(
            page.contents()
                .iter()
                .filter_map(|o| o.key().map(str::to_owned)),
        );
        token = page.next_continuation_token().map(str::to_owned);
        if token.is_none() {
            return Ok(keys);
        }
    }
}

/// This machine's wall clock, milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A name no other test run uses.
pub fn unique(label: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{label}-{nanos}-{}", std::process::id())
}

pub async fn create_topic(bootstrap: &str, name: &str, partitions: i32) -> anyhow::Result<()> {
    create_topic_with(bootstrap, &[], name, partitions).await
}

/// [`create_topic`] with further client properties (security).
pub async fn create_topic_with(
    bootstrap: &str,
    properties: &[(&str, String)],
    name: &str,
    partitions: i32,
) -> anyhow::Result<()> {
    let mut config = kafka_config(bootstrap);
    for (k, v) in properties {
        config.set(*k, v);
    }
    let admin: KafkaAdmin<DefaultClientContext> = config.create()?;
    let results = admin
        .create_topics(
            &[NewTopic::new(name, partitions, TopicReplication::Fixed(1))],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await?;
    for r in results {
        r.map_err(|(topic, code)| anyhow::anyhow!("creating {topic}: {code}"))?;
    }
    Ok(())
}

/// A free loopback port. The node is a separate process, so it cannot hand back a port-0
/// listener; the window between this probe and the node's bind is tiny.
/// A port for a listener a test starts (and may restart on the same port): free now, below
/// the kernel's ephemeral range (so no outgoing connection takes it meanwhile, which
/// `bind(0)` ports are exposed to: a restarted node then failed with "Address already in
/// use"), above the local cluster's range (20000–24999, `cluster.py`), and not handed to any
/// other test process (a lock file per port, held until this process exits).
pub fn free_port() -> u16 {
    static HELD: std::sync::Mutex<Vec<std::fs::File>> = std::sync::Mutex::new(Vec::new());
    const LOW: u32 = 25_000;
    let high = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32_768)
        .max(LOW + 1000);
    let span = high - LOW;
    let dir = std::env::temp_dir().join("geostate-test-ports");
    std::fs::create_dir_all(&dir).expect("a directory for port locks");
    let mut held = HELD.lock().unwrap_or_else(|p| p.into_inner());
    let start = std::process::id()
        .wrapping_mul(7919)
        .wrapping_add(held.len() as u32 * 31)
        % span;
    for i in 0..span {
        let port = (LOW + (start + i) % span) as u16;
        let Ok(lock) = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(port.to_string()))
        else {
            continue;
        };
        if lock.try_lock().is_err() {
            continue;
        }
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            held.push(lock);
            return port;
        }
    }
    panic!("no free port in {LOW}..{high}");
}

/// Topics of one test's private node.
pub struct Topics {
    pub updates: String,
    pub deltas: String,
    pub dlq: String,
    pub late: String,
    pub outputs: String,
}

impl Topics {
    pub async fn create(bootstrap: &str, label: &str, partitions: i32) -> anyhow::Result<Self> {
        Self::create_with(bootstrap, &[], label, partitions).await
    }

    /// [`Topics::create`] with further client properties (security).
    pub async fn create_with(
        bootstrap: &str,
        properties: &[(&str, String)],
        label: &str,
        partitions: i32,
    ) -> anyhow::Result<Self> {
        let base = unique(label);
        let topics = Topics {
            updates: format!("{base}.updates"),
            deltas: format!("{base}.deltas"),
            dlq: format!("{base}.dlq"),
            late: format!("{base}.late"),
            outputs: format!("{base}.outputs"),
        };
        for (topic, count) in [
            (&topics.updates, partitions),
            (&topics.deltas, partitions),
            (&topics.dlq, 1),
            (&topics.late, 1),
            (&topics.outputs, partitions),
        ] {
            create_topic_with(bootstrap, properties, topic, count).await?;
        }
        Ok(topics)
    }
}

/// A region node running the real `geostate` binary with its own data dir and topics:
/// `regions/<region>.toml` with `--set` overrides.
pub struct Node {
    /// The region file the node runs with.
    pub config: PathBuf,
    /// Its `--set KEY=VALUE` overrides, in order.
    pub set: Vec<String>,
    pub grpc: String,
    /// host:port of the Prometheus endpoint.
    pub metrics: String,
    pub log: PathBuf,
    /// How to reach a node with `[tls]` and `[api.auth]` (`None`: plaintext, open).
    pub secure: Option<Secure>,
    /// Environment variables the node starts with, besides the test's own.
    pub env: Vec<(String, String)>,
    /// The executable (this build's `geostate` unless set: a benchmark compares builds).
    pub binary: PathBuf,
    /// The cores the node runs on from its start (a `taskset` list; `None`: the caller's),
    /// so that its runtime sizes its worker threads to them.
    pub cores: Option<String>,
    child: Option<Child>,
}

/// A TLS client of a secure node and an admin token it takes.
#[derive(Clone)]
pub struct Secure {
    pub client: std::sync::Arc<rustls::ClientConfig>,
    pub admin_token: String,
}

impl Secure {
    /// `request` with the admin token.
    pub fn admin<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        let header = format!("Bearer {}", self.admin_token)
            .parse()
            .expect("ASCII");
        request.metadata_mut().insert("authorization", header);
        request
    }
}

impl Node {
    /// A node of region `us-east-1` over `kafka` and `topics`, data in `dir`, merging no
    /// remote region.
    pub fn configure(dir: &Path, kafka: &str, topics: &Topics) -> anyhow::Result<Self> {
        Self::configure_region(dir, "us-east-1", kafka, topics, &[])
    }

    /// A node of `region` (`regions/<region>.toml`) over `kafka` and `topics`, data in
    /// `dir`, in no lease group, merging each `(remote region, deltas topic)` directly
    /// from `kafka`.
    pub fn configure_region(
        dir: &Path,
        region: &str,
        kafka: &str,
        topics: &Topics,
        remotes: &[(&str, &str)],
    ) -> anyhow::Result<Self> {
        let grpc = format!("127.0.0.1:{}", free_port());
        let metrics = format!("127.0.0.1:{}", free_port());
        let remotes: Vec<String> = remotes
            .iter()
            .map(|(remote, topic)| {
                format!("{{ region = {remote:?}, topic = {topic:?}, bootstrap = {kafka:?} }}")
            })
            .collect();
        let set = vec![
            format!("data-dir={:?}", dir.join("data")),
            format!("checkpoint.local-dir={:?}", dir.join("checkpoints")),
            format!("kafka.bootstrap={kafka:?}"),
            format!("kafka.updates-topic={:?}", topics.updates),
            format!("kafka.deltas-topic={:?}", topics.deltas),
            format!("kafka.dlq-topic={:?}", topics.dlq),
            format!("kafka.late-topic={:?}", topics.late),
            format!("kafka.outputs-topic={:?}", topics.outputs),
            format!("api.grpc-listen={grpc:?}"),
            format!("api.metrics-listen={metrics:?}"),
            "lease=".to_owned(),
            format!("replication.remote=[{}]", remotes.join(", ")),
        ];
        let mut set = set;
        set.extend(kafka_client_setting(kafka));
        Ok(Self {
            config: repo_file(&format!("regions/{region}.toml")),
            set,
            grpc: format!("http://{grpc}"),
            metrics,
            log: dir.join("node.log"),
            secure: None,
            env: Vec::new(),
            binary: PathBuf::from(env!("CARGO_BIN_EXE_geostate")),
            cores: None,
            child: None,
        })
    }

    /// Two direct-mode nodes, `us-east-1` over `ta` and `eu-west-1` over `tb`, each
    /// merging the other's deltas topic.
    pub fn pair(
        kafka: &str,
        (ta, tb): (&Topics, &Topics),
        (dir_a, dir_b): (&Path, &Path),
    ) -> anyhow::Result<(Node, Node)> {
        Ok((
            Node::configure_region(dir_a, "us-east-1", kafka, ta, &[("eu-west-1", &tb.deltas)])?,
            Node::configure_region(dir_b, "eu-west-1", kafka, tb, &[("us-east-1", &ta.deltas)])?,
        ))
    }

    /// Sets `key` (dotted) to `value` (TOML; empty removes the key) from the next start.
    pub fn set(&mut self, key: &str, value: &str) {
        self.set.push(format!("{key}={value}"));
    }

    /// The node's configuration, as it starts with it.
    pub fn config(&self) -> anyhow::Result<geostate::config::Config> {
        config_with(&self.config, &self.set)
    }

    /// The `--set` arguments.
    pub fn set_args(&self) -> Vec<String> {
        set_args(&self.set)
    }

    /// Checkpoints to `endpoint` (an S3-compatible server) under `prefix` instead of the
    /// local folder.
    pub fn checkpoint_to_s3(&mut self, s3: &S3Endpoint, endpoint: &str, prefix: &str) {
        self.set("checkpoint.local-dir", "");
        self.set(
            "checkpoint.s3",
            &format!(
                "{{ bucket = {:?}, prefix = {prefix:?}, endpoint = {endpoint:?}, region = {:?}, path-style = true, access-key = {:?}, secret-key = {:?} }}",
                s3.bucket, s3.region, s3.access_key, s3.secret_key
            ),
        );
    }

    /// Starts the node and waits until its gRPC API answers; returns its pid.
    pub async fn start(&mut self) -> anyhow::Result<u32> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let mut command = match &self.cores {
            Some(cores) => {
                let mut taskset = Command::new("taskset");
                taskset.args(["-c", cores]).arg(&self.binary);
                taskset
            }
            None => Command::new(&self.binary),
        };
        let child = command
            .arg("run")
            .arg("--config")
            .arg(&self.config)
            .args(self.set_args())
            .envs(self.env.iter().cloned())
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        let pid = child.id();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if self.ready().await {
                return Ok(pid);
            }
            if let Some(status) = self.exit_status() {
                bail!("node exited with {status}; log: {}", self.log_tail());
            }
            if Instant::now() > deadline {
                bail!("node not ready within 60 s; log: {}", self.log_tail());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Whether the node answers `Admin/Status`.
    async fn ready(&self) -> bool {
        let Some(secure) = &self.secure else {
            let Ok(mut admin) = AdminClient::connect(self.grpc.clone()).await else {
                return false;
            };
            return admin.status(pb::StatusRequest {}).await.is_ok();
        };
        let connecting = geostate::security::tls::connect_with(
            &self.grpc,
            secure.client.clone(),
            Duration::from_secs(1),
        );
        let Ok(channel) = connecting.await else {
            return false;
        };
        let mut admin = AdminClient::new(channel);
        admin
            .status(secure.admin(pb::StatusRequest {}))
            .await
            .is_ok()
    }

    /// SIGTERM, then waits for a clean exit; fails if the node takes longer than `grace`
    /// or exits with an error.
    pub async fn terminate(&mut self, grace: Duration) -> anyhow::Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        Command::new("kill")
            .arg("-TERM")
            .arg(child.id().to_string())
            .status()?;
        let until = Instant::now() + grace;
        loop {
            if let Some(status) = child.try_wait()? {
                if !status.success() {
                    bail!("node exited with {status}; log: {}", self.log_tail());
                }
                return Ok(());
            }
            if Instant::now() > until {
                let _ = child.kill();
                bail!(
                    "node still running {grace:?} after SIGTERM; log: {}",
                    self.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits (at most `within`) for the node to exit by itself; its exit status.
    pub async fn exited(&mut self, within: Duration) -> anyhow::Result<std::process::ExitStatus> {
        let child = self.child.as_mut().context("the node was not started")?;
        let until = Instant::now() + within;
        loop {
            if let Some(status) = child.try_wait()? {
                self.child = None;
                return Ok(status);
            }
            if Instant::now() > until {
                bail!(
                    "node still running after {within:?}; log: {}",
                    self.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGKILL: no shutdown code runs.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub async fn state(&self) -> anyhow::Result<StateClient<Channel>> {
        Ok(StateClient::connect(self.grpc.clone()).await?)
    }

    pub async fn status(&self) -> anyhow::Result<pb::StatusResponse> {
        let mut admin = AdminClient::connect(self.grpc.clone()).await?;
        Ok(admin.status(pb::StatusRequest {}).await?.into_inner())
    }

    /// Waits until every partition is applied up to its end offset.
    pub async fn caught_up(&self, deadline: Duration) -> anyhow::Result<pb::StatusResponse> {
        let until = Instant::now() + deadline;
        loop {
            let status = self.status().await?;
            if status
                .partitions
                .iter()
                .all(|p| p.end_offset >= 0 && p.applied_offset + 1 >= p.end_offset)
            {
                return Ok(status);
            }
            if Instant::now() > until {
                bail!("not caught up within {deadline:?}: {status:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The value of `field` (`name=`) in each line of the node's log from line `from` on
    /// that contains `what`; and the log's line count.
    pub fn log_values(&self, what: &str, field: &str, from: usize) -> (Vec<u64>, usize) {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        let values = lines[from.min(lines.len())..]
            .iter()
            .filter(|l| l.contains(what))
            .filter_map(|l| {
                l.split(field)
                    .nth(1)?
                    .split_whitespace()
                    .next()?
                    .parse()
                    .ok()
            })
            .collect();
        (values, lines.len())
    }

    /// How the node process ended, if it did.
    pub fn exit_status(&mut self) -> Option<std::process::ExitStatus> {
        (self.child.as_mut()).and_then(|c| c.try_wait().ok().flatten())
    }

    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// One record of the outputs topic as the tests compare it, read as the record's one
/// definition ([`OutputRecord`]) and then narrowed: its value a count (a price is none:
/// read those with [`read_output_records`]), without the write's `version` (a stamp no
/// test can know beforehand), and ordered, so a test sorts what it found.
#[derive(Debug, serde::Deserialize, PartialEq, Eq, PartialOrd, Ord, Clone)]
#[serde(try_from = "OutputRecord")]
pub struct Output {
    pub key: String,
    pub start_ms: u64,
    pub end_ms: u64,
    pub value: i64,
    pub region: String,
    /// The lease epoch of an owned register's output (0 for a final window).
    pub epoch: u64,
}

impl TryFrom<OutputRecord> for Output {
    type Error = String;

    fn try_from(record: OutputRecord) -> Result<Self, String> {
        let value = record
            .value
            .as_i64()
            .ok_or_else(|| format!("{}: the value {} is no count", record.key, record.value))?;
        Ok(Output {
            key: record.key,
            start_ms: record.start_ms,
            end_ms: record.end_ms,
            value,
            region: record.region,
            epoch: record.epoch,
        })
    }
}

/// Every record of `topic` a `read_committed` reader finds, once at least `wanted` are
/// there and it reached the end of each of its `partitions` (at most `within`).
pub async fn read_outputs(
    kafka: &str,
    topic: &str,
    partitions: i32,
    wanted: usize,
    within: Duration,
) -> anyhow::Result<Vec<Output>> {
    read_output_records(kafka, topic, partitions, wanted, within)
        .await?
        .into_iter()
        .map(|r| Ok(serde_json::from_value(r)?))
        .collect()
}

/// As [`read_outputs`], each record as the JSON it is (a price's value is no count).
pub async fn read_output_records(
    kafka: &str,
    topic: &str,
    partitions: i32,
    wanted: usize,
    within: Duration,
) -> anyhow::Result<Vec<serde_json::Value>> {
    use rdkafka::Message;
    use rdkafka::consumer::{Consumer, StreamConsumer};
    use rdkafka::error::KafkaError;
    let consumer: StreamConsumer = kafka_config(kafka)
        .set("group.id", unique("outputs-reader"))
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true")
        .create()?;
    consumer.subscribe(&[topic])?;
    let until = Instant::now() + within;
    let (mut out, mut at_end) = (Vec::new(), std::collections::BTreeSet::new());
    loop {
        if out.len() >= wanted && at_end.len() == partitions as usize {
            return Ok(out);
        }
        let left = until.saturating_duration_since(Instant::now());
        let Ok(next) = tokio::time::timeout(left, consumer.recv()).await else {
            bail!(
                "{} of {wanted} outputs within {within:?}: {out:?}",
                out.len()
            );
        };
        match next {
            Ok(message) => {
                at_end.remove(&message.partition());
                let payload = message.payload().context("an output without a payload")?;
                out.push(serde_json::from_slice(payload)?);
            }
            Err(KafkaError::PartitionEOF(p)) => {
                at_end.insert(p);
            }
            Err(e) => return Err(e.into()),
        }
    }
}
