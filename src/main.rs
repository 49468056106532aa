//! The `geostate` binary: a region node (`run`), its offline restore (`restore`), and an
//! operator client (`get`, `update`, `scan`, `status`, `checkpoint`, `savepoint`) over the
//! public gRPC API.

use std::io::{Read, Write};
use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use geostate::config::Setting;
use geostate::pb;
use geostate::pb::admin_client::AdminClient;
use geostate::pb::state_client::StateClient;

#[derive(Parser)]
#[command(
    name = "geostate",
    version,
    about = "Geo-replicated active-active state service"
)]
struct Cli {
    /// How the log (on stderr) is written: `text` lines, or one JSON object per line
    /// (`timestamp`, `level`, `target`, `fields`, and the spans it happened in, such as a
    /// write's `update` span with its key, epoch, partition and offset, logged at debug).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "GEOSTATE_LOG_FORMAT")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Role {
    Region,
    Witness,
}

/// The node a client command talks to, and how.
#[derive(clap::Args, Clone)]
struct Node {
    /// The node's gRPC address.
    #[arg(long = "addr", default_value = "http://127.0.0.1:50051")]
    addr: String,
    /// Connect over TLS, checking the node's certificate against this CA file (PEM).
    #[arg(long, env = "GEOSTATE_CA")]
    ca: Option<PathBuf>,
    /// Present this client certificate (PEM; with `--cert-key`): its common name is the
    /// identity `[api.auth] identities` gives a role.
    #[arg(long, env = "GEOSTATE_CERT", requires = "cert_key", requires = "ca")]
    cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, env = "GEOSTATE_KEY", requires = "cert")]
    cert_key: Option<PathBuf>,
    /// Send the bearer token in this file (its first line) with every call.
    #[arg(long, env = "GEOSTATE_TOKEN_FILE")]
    token_file: Option<PathBuf>,
}

/// Adds `authorization: Bearer <token>` to every call of a client.
#[derive(Clone)]
struct Bearer(Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>);

impl tonic::service::Interceptor for Bearer {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(token) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", token.clone());
        }
        Ok(request)
    }
}

type Channel = tonic::codegen::InterceptedService<tonic::transport::Channel, Bearer>;

impl Node {
    /// A channel to the node, over TLS with `--ca`, carrying the token of `--token-file`.
    async fn channel(&self) -> anyhow::Result<Channel> {
        let channel = match &self.ca {
            None => {
                tonic::transport::Endpoint::from_shared(self.addr.clone())?
                    .connect()
                    .await?
            }
            Some(ca) => {
                let identity = self.cert.as_deref().zip(self.cert_key.as_deref());
                let tls = geostate::security::tls::client(ca, identity)?;
                let timeout = std::time::Duration::from_secs(10);
                geostate::security::tls::connect_with(&self.addr, tls, timeout).await?
            }
        };
        let token = match &self.token_file {
            None => None,
            Some(file) => {
                let text = std::fs::read_to_string(file)
                    .with_context(|| format!("reading the token file {}", file.display()))?;
                let token = text.lines().next().unwrap_or_default().trim();
                // the token itself is never part of an error
                let header = format!("Bearer {token}").parse().map_err(|_| {
                    anyhow::anyhow!("the token in {} is not ASCII text", file.display())
                })?;
                Some(header)
            }
        };
        Ok(tonic::codegen::InterceptedService::new(
            channel,
            Bearer(token),
        ))
    }

    async fn state(&self) -> anyhow::Result<StateClient<Channel>> {
        Ok(StateClient::new(self.channel().await?))
    }

    async fn admin(&self) -> anyhow::Result<AdminClient<Channel>> {
        Ok(AdminClient::new(self.channel().await?))
    }
}

/// A configuration file and its overrides.
#[derive(clap::Args)]
struct ConfigArgs {
    #[arg(long)]
    config: PathBuf,
    /// Override a setting of the file: `KEY=VALUE`, a dotted key and a TOML value (a bare
    /// word is a string; an empty value removes the key). Validated with the file.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<Setting>,
}

#[derive(Subcommand)]
enum Command {
    /// Run one region node, or (`--role witness`) the lease group's third member.
    Run {
        #[command(flatten)]
        config: ConfigArgs,
        #[arg(long, value_enum, default_value_t = Role::Region)]
        role: Role,
    },
    /// Validate a configuration file with its overrides (a region node's, or with `--role
    /// witness` the witness's) and print what it would run: listeners, Kafka topics, the
    /// regions it merges, the lease group, checkpoints, namespaces. Exits 1 naming the
    /// first invalid setting. Nothing is contacted.
    CheckConfig {
        #[command(flatten)]
        config: ConfigArgs,
        #[arg(long, value_enum, default_value_t = Role::Region)]
        role: Role,
    },
    /// Exit 0 when the node serves (its gRPC health service answers SERVING), else 1 with
    /// the reason: a liveness probe. With `--ready`, also only once it has caught up (it
    /// answers `Admin/Status`, and has read every remote region's deltas to their end at
    /// least once since it started): a readiness probe.
    Probe {
        #[command(flatten)]
        node: Node,
        #[arg(long)]
        ready: bool,
        /// Give up (exit 1) after this long.
        #[arg(long, default_value = "5s")]
        timeout: String,
    },
    /// Restore a stopped node's empty data dir from a checkpoint (default: the newest) or
    /// a savepoint; the next `run` replays the log from there.
    Restore {
        #[command(flatten)]
        config: ConfigArgs,
        /// A checkpoint id (see `--list`).
        #[arg(long, conflicts_with = "savepoint")]
        checkpoint: Option<String>,
        /// A savepoint id in the checkpoint store, or the path of a `.gsp` file.
        #[arg(long)]
        savepoint: Option<String>,
        /// Seed this region from another region's savepoint: state only.
        #[arg(long, requires = "savepoint")]
        seed: bool,
        /// Restore only this partition's instance from the checkpoint, into a data dir
        /// that lost it (the other partitions keep theirs).
        #[arg(long, conflicts_with = "savepoint")]
        partition: Option<usize>,
        /// List the checkpoints in the store and exit.
        #[arg(long)]
        list: bool,
    },
    /// Decode one `geostate.deltas` record value (protobuf `geostate.v1.Delta`) from stdin.
    DecodeDelta,
    /// Read one key.
    Get {
        #[command(flatten)]
        node: Node,
        key: String,
    },
    /// Write one key: `--add N` for counters, `--set VALUE` for registers.
    Update {
        #[command(flatten)]
        node: Node,
        key: String,
        #[arg(long, allow_hyphen_values = true, conflicts_with = "set")]
        add: Option<i64>,
        #[arg(long)]
        set: Option<String>,
        /// Idempotency id.
        #[arg(long)]
        id: Option<String>,
    },
    /// List keys with a prefix.
    Scan {
        #[command(flatten)]
        node: Node,
        prefix: String,
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
    /// Show the node's region, incarnation and per-partition progress.
    Status {
        #[command(flatten)]
        node: Node,
    },
    /// The whole cluster on one screen, redrawn in place: every node of the regions asked
    /// (each region's other nodes are found through `Route`), partitions, ingest lag,
    /// events applied per second, dead letters, checkpoints, replication lag and backlog
    /// per pair of regions, leases and the lease group's clock offsets. Ctrl-C quits.
    Top {
        #[command(flatten)]
        node: Node,
        /// A node of another region (repeatable), reached like `--addr`.
        #[arg(long = "peer", value_name = "URL")]
        peers: Vec<String>,
        /// Seconds between refreshes.
        #[arg(long, default_value_t = 2.0)]
        interval: f64,
        /// Print one frame as plain text and exit (for scripts and tests).
        #[arg(long)]
        once: bool,
    },
    /// Take a checkpoint now; prints its id and what was uploaded.
    Checkpoint {
        #[command(flatten)]
        node: Node,
    },
    /// Write a savepoint (a logical dump of the node's store) to the checkpoint store.
    Savepoint {
        #[command(flatten)]
        node: Node,
    },
    /// List the ownership shards: holder, epoch, time to expiry.
    Leases {
        #[command(flatten)]
        node: Node,
        /// Only the shard of this owned key.
        #[arg(long, default_value = "")]
        key: String,
    },
    /// Take a region out of the running lease group (a membership change through its
    /// log): its member stops voting, its further nodes leave with it, and from that entry
    /// on the table refuses its commands, so its leases lapse and the other regions take
    /// its shards at a higher epoch. Asks the members of a region file's `[lease]` (any
    /// region's, or the witness's with `--role witness`), over its TLS when it has one.
    RemoveRegion {
        region: String,
        #[command(flatten)]
        config: ConfigArgs,
        #[arg(long, value_enum, default_value_t = Role::Region)]
        role: Role,
    },
    /// Where a key lives: its partition and the node serving it.
    Route {
        #[command(flatten)]
        node: Node,
        #[arg(long)]
        key: String,
    },
    /// Dead-lettered and late records.
    Dlq {
        #[command(subcommand)]
        action: DlqAction,
    },
    /// The outputs topic into PostgreSQL, and the two compared.
    Sink {
        #[command(subcommand)]
        action: SinkAction,
    },
    /// Surge multipliers from final windows (the region file's `[pricing]`): for each
    /// geohash whose lease this region holds, every window final in every region is
    /// priced once, by a compare-and-set of its owned register from the previous
    /// window's result. Runs until SIGTERM.
    Pricer {
        #[command(flatten)]
        config: ConfigArgs,
        /// The region's gRPC address (default: the config's `api.advertise`, else
        /// `api.grpc-listen`).
        #[arg(long)]
        addr: Option<String>,
        /// Serve the pricer's metrics (Prometheus text, plaintext: keep it on loopback)
        /// at this address: its function calls and pending geohashes.
        #[arg(long)]
        metrics_listen: Option<std::net::SocketAddr>,
    },
    /// Make a development CA and a certificate per name in a folder: `ca.pem`, `ca.key`,
    /// `<name>.pem`, `<name>.key`. A node's certificate is named after its region (the
    /// witness's `witness`); a client's after the identity `[api.auth]` gives a role.
    Certs {
        /// Where to write the files.
        #[arg(long)]
        out: PathBuf,
        /// Further DNS names or IP addresses the certificates are valid for (each also
        /// has its name, `localhost` and `127.0.0.1`).
        #[arg(long = "host")]
        hosts: Vec<String>,
        /// How long they are valid.
        #[arg(long, default_value = "365d")]
        valid_days: String,
        names: Vec<String>,
    },
    /// Hand a shard this region holds to another region (planned handoff).
    TransferLease {
        #[command(flatten)]
        node: Node,
        #[arg(long)]
        shard: u32,
        #[arg(long)]
        to: String,
    },
}

#[derive(Subcommand)]
enum DlqAction {
    /// Re-ingest every record of the late topic (or `--topic`, e.g. the dead-letter topic)
    /// into the updates topic at the event time given (windowed keys: into that window),
    /// each under the id `replay:<topic>/<partition>/<offset>`, so a second replay into
    /// the same window counts it once.
    Replay {
        #[command(flatten)]
        config: ConfigArgs,
        /// The topic to read (default: `kafka.late-topic`).
        #[arg(long)]
        topic: Option<String>,
        /// The event time to give each record, ms since the Unix epoch: a window still
        /// open (default: now).
        #[arg(long)]
        event_time: Option<u64>,
        /// Count what would be replayed; append nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

#[derive(Subcommand)]
enum SinkAction {
    /// Write every record of the region's outputs topic (`kafka.outputs-topic`, read
    /// committed) into the PostgreSQL table `geostate_outputs` exactly once: rows and the
    /// consumed offsets commit in one PostgreSQL transaction, and a restart reads on after
    /// the offsets PostgreSQL holds. Creates its tables; runs until SIGTERM.
    Postgres {
        #[command(flatten)]
        config: ConfigArgs,
        /// The database: a libpq connection string or URL.
        #[arg(long, env = "GEOSTATE_POSTGRES")]
        postgres: String,
    },
    /// Compare the outputs topics of this region and of every `--region` with the table,
    /// window by window (count and digest); print every difference, and fail if any.
    Reconcile {
        #[command(flatten)]
        config: ConfigArgs,
        #[arg(long, env = "GEOSTATE_POSTGRES")]
        postgres: String,
        /// Another region's outputs topic (same name, same client settings):
        /// `REGION=BOOTSTRAP`.
        #[arg(long = "region", value_name = "REGION=BOOTSTRAP")]
        regions: Vec<String>,
        /// How long to wait for each region's sink to reach the end of its topic.
        #[arg(long = "wait-seconds", default_value_t = 60)]
        wait: u64,
    },
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let log = tracing_subscriber::fmt()
        .with_env_filter(
            // openraft narrates every election at info
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,openraft=warn".into()),
        )
        .with_writer(std::io::stderr)
        // a span the filter lets through (`geostate::api=debug`: every write's) is logged
        // as it ends, with its fields and how long it was busy and idle
        .with_span_events(tracing_subscriber::fmt::format::FmtSpan::CLOSE);
    match cli.log_format {
        LogFormat::Json => log
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .init(),
        // colours only for a terminal: log files stay greppable
        LogFormat::Text => log
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
    }
    let result = tokio::runtime::Runtime::new()
        .context("starting the tokio runtime")
        .and_then(|runtime| runtime.block_on(dispatch(cli.command)));
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            match e.downcast_ref::<tonic::Status>() {
                Some(status) => eprintln!("error: {:?}: {}", status.code(), status.message()),
                None => eprintln!("error: {e:#}"),
            }
            std::process::ExitCode::FAILURE
        }
    }
}

async fn dispatch(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Run { config, role } => run(config, role).await,
        Command::CheckConfig { config, role } => check_config(config, role),
        Command::RemoveRegion {
            region,
            config,
            role,
        } => remove_region(region, config, role).await,
        Command::Probe {
            node,
            ready,
            timeout,
        } => probe(node, ready, timeout).await,
        Command::Certs {
            out,
            hosts,
            valid_days,
            names,
        } => {
            let days: u64 = valid_days
                .trim_end_matches('d')
                .parse()
                .context("--valid-days is a number of days, like 365d")?;
            let valid_for = std::time::Duration::from_secs(days * 86_400);
            for file in geostate::security::certs::make(&out, &names, &hosts, valid_for)? {
                println!("{}", file.display());
            }
            Ok(())
        }
        Command::Restore {
            config,
            checkpoint,
            savepoint,
            seed,
            partition,
            list,
        } => restore(config, checkpoint, savepoint, seed, partition, list).await,
        Command::DecodeDelta => decode_delta(),
        Command::Get { node, key } => get(node, key).await,
        Command::Update {
            node,
            key,
            add,
            set,
            id,
        } => update(node, key, add, set, id).await,
        Command::Scan {
            node,
            prefix,
            limit,
        } => scan(node, prefix, limit).await,
        Command::Status { node } => status(node).await,
        Command::Top {
            node,
            peers,
            interval,
            once,
        } => top(node, peers, interval, once).await,
        Command::Checkpoint { node } => checkpoint(node).await,
        Command::Savepoint { node } => savepoint(node).await,
        Command::Leases { node, key } => leases(node, key).await,
        Command::Route { node, key } => route(node, key).await,
        Command::TransferLease { node, shard, to } => transfer_lease(node, shard, to).await,
        Command::Dlq {
            action:
                DlqAction::Replay {
                    config,
                    topic,
                    event_time,
                    dry_run,
                },
        } => dlq_replay(config, topic, event_time, dry_run).await,
        Command::Sink {
            action: SinkAction::Postgres { config, postgres },
        } => sink_postgres(config, postgres).await,
        Command::Pricer {
            config,
            addr,
            metrics_listen,
        } => pricer(config, addr, metrics_listen).await,
        Command::Sink {
            action:
                SinkAction::Reconcile {
                    config,
                    postgres,
                    regions,
                    wait,
                },
        } => sink_reconcile(config, postgres, regions, wait).await,
    }
}

async fn pricer(
    config: ConfigArgs,
    addr: Option<String>,
    metrics_listen: Option<std::net::SocketAddr>,
) -> anyhow::Result<()> {
    let config = geostate::config::Config::load_with(&config.config, &config.set)?;
    if let Some(listen) = metrics_listen {
        let recorder = geostate::metrics::install();
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("--metrics-listen {listen}"))?;
        let connections = geostate::security::tls::incoming(
            listener,
            None,
            geostate::security::tls::Listener::Metrics,
        );
        tokio::spawn(geostate::metrics::serve(connections, recorder));
    }
    let pricing = config
        .pricing
        .context("the region file has no [pricing] section")?;
    let lease = config
        .lease
        .context("the region file has no [lease] section: no region can hold a price")?;
    let addr = addr.unwrap_or_else(|| {
        let own = config.api.advertise.clone();
        format!(
            "http://{}",
            own.unwrap_or_else(|| config.api.grpc_listen.to_string())
        )
    });
    let (stop, stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        let _ = stop.send(true);
    });
    let function = pricing.function.as_ref().map(|f| f.addr.clone());
    tracing::info!(%addr, demand = %pricing.demand, supply = %pricing.supply, prices = %pricing.prices, function = function.as_deref().unwrap_or("the built-in formula"), "pricing");
    let priced = geostate::pricer::run(pricing, lease, addr, stopped).await?;
    println!(
        "wrote {} multipliers ({} compare-and-sets found the value moved on)",
        priced.windows, priced.moved_on
    );
    Ok(())
}

async fn sink_postgres(config: ConfigArgs, postgres: String) -> anyhow::Result<()> {
    let config = geostate::config::Config::load_with(&config.config, &config.set)?;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        let _ = stop.send(true);
    });
    let sink = geostate::sink::postgres::SinkConfig {
        region: config.region.to_string(),
        kafka: config.kafka,
        postgres,
    };
    let written = geostate::sink::postgres::run(sink, stopped).await?;
    println!(
        "wrote {} records in {} PostgreSQL transactions ({} rejected)",
        written.records, written.transactions, written.rejected
    );
    Ok(())
}

async fn sink_reconcile(
    config: ConfigArgs,
    postgres: String,
    regions: Vec<String>,
    wait: u64,
) -> anyhow::Result<()> {
    let wait = std::time::Duration::from_secs(wait);
    use geostate::sink::reconcile::Source;
    let config = geostate::config::Config::load_with(&config.config, &config.set)?;
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
    let found = geostate::sink::reconcile::reconcile(&postgres, &sources, wait).await?;
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

async fn dlq_replay(
    config: ConfigArgs,
    topic: Option<String>,
    event_time: Option<u64>,
    dry_run: bool,
) -> anyhow::Result<()> {
    let config = geostate::config::Config::load_with(&config.config, &config.set)?;
    let topic = topic.unwrap_or_else(|| config.kafka.late_topic.clone());
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
    let event_time = event_time.unwrap_or(now.as_millis() as u64);
    let done = geostate::replay::replay(&config.kafka, &topic, event_time, dry_run).await?;
    let verb = if dry_run { "would replay" } else { "replayed" };
    println!(
        "{verb} {} records of {topic} into {} at event time {event_time} ms; {} skipped (not update records)",
        done.appended, config.kafka.updates_topic, done.skipped
    );
    Ok(())
}

async fn run(config: ConfigArgs, role: Role) -> anyhow::Result<()> {
    let ConfigArgs { config, set } = config;
    if role == Role::Witness {
        let config = geostate::config::WitnessConfig::load(&config, &set)?;
        geostate::lease::witness::run(config, shutdown_signal()).await?;
        return Ok(());
    }
    let config = geostate::config::Config::load_with(&config, &set)?;
    let listeners = geostate::node::Listeners::bind(&config)
        .await
        .context("binding the gRPC and metrics addresses")?;
    geostate::node::run(config, listeners, shutdown_signal()).await?;
    Ok(())
}

fn check_config(config: ConfigArgs, role: Role) -> anyhow::Result<()> {
    let ConfigArgs { config: path, set } = config;
    let described = match role {
        Role::Witness => geostate::config::WitnessConfig::load(&path, &set)?.describe(),
        Role::Region => geostate::config::Config::load_with(&path, &set)?.describe(),
    };
    println!("{}: valid", path.display());
    print!("{described}");
    Ok(())
}

async fn remove_region(region: String, config: ConfigArgs, role: Role) -> anyhow::Result<()> {
    use geostate::lease::network::{Channels, GroupChange, change_group_within};
    let ConfigArgs { config: path, set } = config;
    let (lease, tls) = match role {
        Role::Witness => {
            let c = geostate::config::WitnessConfig::load(&path, &set)?;
            (c.lease, c.tls)
        }
        Role::Region => {
            let c = geostate::config::Config::load_with(&path, &set)?;
            let lease = c
                .lease
                .context("the configuration has no [lease] section")?;
            (lease, c.tls)
        }
    };
    let tls = tls
        .as_ref()
        .map(geostate::security::Tls::load)
        .transpose()?;
    let region = geostate::crdt::RegionId::new(region)?;
    let members: Vec<String> = lease.members.values().map(|m| m.addr.clone()).collect();
    let change = GroupChange::RemoveRegion {
        region: region.clone(),
    };
    let wait = std::time::Duration::from_secs(30);
    let index = change_group_within(&Channels::new(tls), &members, &change, wait)
        .await
        .map_err(|e| anyhow::anyhow!("removing {region} from the lease group: {e}"))?;
    println!("{region} is no region of the lease group (log index {index})");
    Ok(())
}

async fn probe(node: Node, ready: bool, timeout: String) -> anyhow::Result<()> {
    use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus};
    let timeout = geostate::config::parse_duration("--timeout", &timeout)?;
    let check = async {
        let channel = node.channel().await?;
        let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
        let service = "geostate.v1.State".to_owned();
        let answer = health.check(HealthCheckRequest { service }).await?;
        let status = answer.into_inner().status();
        anyhow::ensure!(status == ServingStatus::Serving, "not serving ({status:?})");
        if !ready {
            return Ok(());
        }
        let s = AdminClient::new(channel)
            .status(pb::StatusRequest {})
            .await?
            .into_inner();
        let behind: Vec<&str> = s
            .remotes
            .iter()
            .filter(|r| !r.caught_up)
            .map(|r| r.region.as_str())
            .collect();
        anyhow::ensure!(
            behind.is_empty(),
            "has not yet read the deltas of {} to their end",
            behind.join(", ")
        );
        Ok(())
    };
    match tokio::time::timeout(timeout, check).await {
        // the address first: a probe's output is all a pod's events show
        Ok(done) => done.map_err(|e| anyhow::anyhow!("{}: {e:#}", node.addr)),
        Err(_) => anyhow::bail!("{}: no answer within {timeout:?}", node.addr),
    }
}

async fn restore(
    config: ConfigArgs,
    checkpoint: Option<String>,
    savepoint: Option<String>,
    seed: bool,
    partition: Option<usize>,
    list: bool,
) -> anyhow::Result<()> {
    use geostate::checkpoint::{self, objects::Objects};
    let config = geostate::config::Config::load_with(&config.config, &config.set)?;
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

fn decode_delta() -> anyhow::Result<()> {
    let mut bytes = Vec::new();
    std::io::stdin()
        .read_to_end(&mut bytes)
        .context("reading stdin")?;
    let delta = geostate::crdt::Delta::decode(&bytes).context("decoding delta")?;
    println!("{delta:#?}");
    Ok(())
}

async fn get(node: Node, key: String) -> anyhow::Result<()> {
    let mut client = node.state().await?;
    let request = pb::GetRequest {
        key,
        ..Default::default()
    };
    let value = client.get(request).await?.into_inner();
    println!("{}", show(&value));
    Ok(())
}

async fn update(
    node: Node,
    key: String,
    add: Option<i64>,
    set: Option<String>,
    id: Option<String>,
) -> anyhow::Result<()> {
    let op = match (add, set) {
        (Some(n), None) => pb::update_request::Op::Add(n),
        (None, Some(v)) => pb::update_request::Op::Set(v.into_bytes()),
        _ => anyhow::bail!("give exactly one of --add or --set"),
    };
    let mut client = node.state().await?;
    let request = pb::UpdateRequest {
        key,
        op: Some(op),
        id: id.unwrap_or_default(),
        event_time_ms: 0,
    };
    let reply = client.update(request).await?.into_inner();
    let at = reply.position.unwrap_or_default();
    println!("applied at partition {} offset {}", at.partition, at.offset);
    Ok(())
}

async fn scan(node: Node, prefix: String, limit: u32) -> anyhow::Result<()> {
    let mut client = node.state().await?;
    let mut page_token = String::new();
    loop {
        let request = pb::ScanRequest {
            prefix: prefix.clone(),
            page_token,
            limit,
            window: None,
        };
        let page = client.scan(request).await?.into_inner();
        for value in &page.values {
            println!("{}", show(value));
        }
        if page.next_page_token.is_empty() {
            return Ok(());
        }
        page_token = page.next_page_token;
    }
}

async fn status(node: Node) -> anyhow::Result<()> {
    let mut client = node.admin().await?;
    let s = client.status(pb::StatusRequest {}).await?.into_inner();
    println!(
        "region {} incarnation {} topic {} applied {} dead-lettered {}",
        s.region, s.incarnation, s.updates_topic, s.events_applied, s.events_dead_lettered
    );
    println!("node {} owns partitions {:?}", s.node, s.owned_partitions);
    for p in s.partitions {
        println!(
            "  partition {} applied {} end {} lag {}",
            p.partition, p.applied_offset, p.end_offset, p.lag
        );
    }
    for r in s.remotes {
        println!(
            "remote {} topic {} merged {} refused {} lag {} ms caught-up {}",
            r.region, r.topic, r.deltas_merged, r.deltas_refused, r.lag_ms, r.caught_up
        );
        for p in r.partitions {
            println!(
                "  partition {} merged {} end {} lag {}",
                p.partition, p.applied_offset, p.end_offset, p.lag
            );
        }
    }
    if let Some(c) = s.checkpoint {
        let last = if c.last_id.is_empty() {
            "-"
        } else {
            &c.last_id
        };
        let restored = match c.restored_from.as_str() {
            "" => String::new(),
            from => format!("; restored from {from}"),
        };
        println!(
            "checkpoints to {}: last {last} ({} ms ago, took {} ms, uploaded {} bytes), taken {} failed {}{restored}",
            c.target, c.last_age_ms, c.last_duration_ms, c.last_bytes_uploaded, c.taken, c.failures,
        );
    }
    Ok(())
}

async fn top(node: Node, peers: Vec<String>, interval: f64, once: bool) -> anyhow::Result<()> {
    use std::collections::BTreeMap;
    use std::time::{Duration, Instant};
    anyhow::ensure!(
        interval.is_finite() && interval >= 0.2,
        "--interval must be at least 0.2 seconds"
    );
    let seeds: Vec<String> = std::iter::once(node.addr.clone()).chain(peers).collect();
    let mut previous: BTreeMap<String, (u64, Instant)> = BTreeMap::new();
    loop {
        let mut frame = gather(&node, &seeds).await;
        for (addr, status) in &frame.nodes {
            let Ok(s) = status else { continue };
            let now = Instant::now();
            if let Some((applied, at)) = previous.get(addr) {
                let seconds = now.duration_since(*at).as_secs_f64();
                let rate = s.events_applied.saturating_sub(*applied) as f64 / seconds;
                frame.applied_per_second.insert(addr.clone(), rate);
            }
            previous.insert(addr.clone(), (s.events_applied, now));
        }
        let regions: std::collections::BTreeSet<&str> = frame
            .nodes
            .values()
            .filter_map(|s| s.as_ref().ok().map(|s| s.region.as_str()))
            .collect();
        let title = format!(
            "geostate top: {} nodes, {} regions, {} (every {interval} s; Ctrl-C quits)",
            frame.nodes.len(),
            regions.len(),
            time::OffsetDateTime::now_utc()
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap_or_default(),
        );
        let text = geostate::top::render(&frame, &title);
        // written, not printed: a closed pipe (`| head`) ends the command, not a panic
        let mut out = std::io::stdout().lock();
        if once {
            out.write_all(text.as_bytes())?;
            return Ok(());
        }
        // home, clear the screen, draw
        out.write_all(format!("\x1b[H\x1b[2J{text}").as_bytes())?;
        out.flush()?;
        drop(out);
        tokio::select! {
            _ = tokio::signal::ctrl_c() => return Ok(()),
            () = tokio::time::sleep(Duration::from_secs_f64(interval)) => {}
        }
    }
}

/// One refresh of `geostate top`: the status of every node reachable from `seeds` (each
/// region's nodes found by asking where every partition lives) and each region's leases.
async fn gather(node: &Node, seeds: &[String]) -> geostate::top::Frame {
    use std::collections::{BTreeSet, VecDeque};
    let mut frame = geostate::top::Frame::default();
    let scheme = |url: &str| url.split_once("://").map_or("http", |(s, _)| s).to_string();
    let bare = |url: &str| url.split_once("://").map_or(url, |(_, a)| a).to_string();
    let mut queue: VecDeque<(String, String)> =
        seeds.iter().map(|s| (scheme(s), bare(s))).collect();
    let mut seen: BTreeSet<String> = BTreeSet::new();
    let mut explored: BTreeSet<String> = BTreeSet::new();
    while let Some((scheme, addr)) = queue.pop_front() {
        if !seen.insert(addr.clone()) {
            continue;
        }
        let at = Node {
            addr: format!("{scheme}://{addr}"),
            ..node.clone()
        };
        let answer = async {
            let mut client = at.admin().await?;
            let status = client.status(pb::StatusRequest {}).await?.into_inner();
            anyhow::Ok((client, status))
        };
        let (mut client, status) =
            match tokio::time::timeout(std::time::Duration::from_secs(3), answer).await {
                Ok(Ok(answered)) => answered,
                Ok(Err(e)) => {
                    frame.nodes.insert(addr, Err(format!("{e:#}")));
                    continue;
                }
                Err(_) => {
                    frame.nodes.insert(addr, Err("no answer within 3 s".into()));
                    continue;
                }
            };
        if explored.insert(status.region.clone()) {
            if let Ok(leases) = client.leases(pb::LeasesRequest::default()).await {
                frame
                    .leases
                    .insert(status.region.clone(), leases.into_inner());
            }
            // the region's other nodes: whoever serves each partition (a key of each,
            // placed as every geostate topic places keys)
            let count = client
                .route(pb::RouteRequest { key: "top".into() })
                .await
                .map_or(0, |r| r.into_inner().partitions);
            for p in 0..count {
                let Some(key) = (0u32..100_000)
                    .map(|i| format!("top/{i}"))
                    .find(|k| geostate::log::partition_of(k.as_bytes(), count) == p)
                else {
                    continue;
                };
                if let Ok(route) = client.route(pb::RouteRequest { key }).await {
                    queue.push_back((scheme.clone(), route.into_inner().node));
                }
            }
        }
        frame.nodes.insert(addr, Ok(status));
    }
    frame
}

async fn checkpoint(node: Node) -> anyhow::Result<()> {
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

async fn savepoint(node: Node) -> anyhow::Result<()> {
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

async fn leases(node: Node, key: String) -> anyhow::Result<()> {
    let mut client = node.admin().await?;
    let r = client.leases(pb::LeasesRequest { key }).await?.into_inner();
    println!(
        "region {} (lease group leader: member {})",
        r.region, r.leader
    );
    println!(
        "{:>5}  {:<12} {:<12} {:>6} {:>10}  {:<5} prefix",
        "shard", "home", "holder", "epoch", "expires", "here"
    );
    for s in r.shards {
        println!(
            "{:>5}  {:<12} {:<12} {:>6} {:>8}ms  {:<5} {}",
            s.shard, s.home, s.holder, s.epoch, s.expires_in_ms, s.held_here, s.prefix
        );
    }
    Ok(())
}

async fn route(node: Node, key: String) -> anyhow::Result<()> {
    let mut client = node.admin().await?;
    let r = client.route(pb::RouteRequest { key }).await?.into_inner();
    println!(
        "{}: partition {} of {}, served in {} by {}",
        r.key, r.partition, r.partitions, r.region, r.node
    );
    Ok(())
}

async fn transfer_lease(node: Node, shard: u32, to: String) -> anyhow::Result<()> {
    let mut client = node.admin().await?;
    let request = pb::TransferLeaseRequest {
        shard,
        to_region: to,
    };
    let r = client.transfer_lease(request).await?.into_inner();
    let l = r.lease.unwrap_or_default();
    println!(
        "shard {} now held by {} at epoch {}",
        l.shard, l.holder, l.epoch
    );
    Ok(())
}

fn show(v: &pb::Value) -> String {
    match &v.value {
        Some(pb::value::Value::Counter(n)) => format!("{} = {n}", v.key),
        Some(pb::value::Value::Register(bytes)) => {
            format!("{} = {:?}", v.key, String::from_utf8_lossy(bytes))
        }
        None => format!("{} (no value)", v.key),
    }
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(term) => term,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

#[cfg(test)]
mod tests {
    /// clap checks a command line's definition (unique argument names, …) only in debug
    /// builds and only for the subcommand parsed: every subcommand is checked here.
    #[test]
    fn the_command_line_is_well_formed() {
        use clap::CommandFactory;
        super::Cli::command().debug_assert();
    }
}
