//! The `geostate` command line: its clap types (every subcommand, its flags and their
//! help) and `dispatch`, which hands each subcommand to the module of its family. The
//! binary (`src/main.rs`) only parses, sets up logging and the runtime, and maps the
//! result to an exit code.
//!
//! ```text
//!  serve        run (a region node or the witness), check-config, probe
//!  keys         get, update, scan, route, decode-delta
//!  status       status, top
//!  checkpoints  checkpoint, savepoint, restore
//!  leases       leases, transfer-lease, remove-region
//!  dlq          dlq replay
//!  sink         sink postgres, sink reconcile
//!  pricer       pricer
//!  certs        certs
//!  client       the gRPC channel a client command opens to `--addr`
//! ```

mod certs;
mod checkpoints;
mod client;
mod dlq;
mod keys;
mod leases;
mod pricer;
mod serve;
mod sink;
mod status;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::config::Setting;

#[derive(Parser)]
#[command(
    name = "geostate",
    version,
    about = "Geo-replicated active-active state service"
)]
pub struct Cli {
    /// How the log (on stderr) is written: `text` lines, or one JSON object per line
    /// (`timestamp`, `level`, `target`, `fields`, and the spans it happened in, such as a
    /// write's `update` span with its key, epoch, partition and offset, logged at debug).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "GEOSTATE_LOG_FORMAT")]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Role {
    Region,
    Witness,
}

/// The node a client command talks to, and how.
#[derive(clap::Args, Clone)]
pub struct Node {
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

/// A configuration file and its overrides.
#[derive(clap::Args)]
pub struct ConfigArgs {
    #[arg(long)]
    config: PathBuf,
    /// Override a setting of the file: `KEY=VALUE`, a dotted key and a TOML value (a bare
    /// word is a string; an empty value removes the key). Validated with the file.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<Setting>,
}

#[derive(Subcommand)]
pub enum Command {
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
pub enum DlqAction {
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
pub enum SinkAction {
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

/// Runs one parsed command to its end: what `geostate <command>` does.
pub async fn dispatch(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Run { config, role } => serve::run(config, role).await,
        Command::CheckConfig { config, role } => serve::check_config(config, role),
        Command::RemoveRegion {
            region,
            config,
            role,
        } => leases::remove_region(region, config, role).await,
        Command::Probe {
            node,
            ready,
            timeout,
        } => serve::probe(node, ready, timeout).await,
        Command::Certs {
            out,
            hosts,
            valid_days,
            names,
        } => certs::make(out, hosts, valid_days, names),
        Command::Restore {
            config,
            checkpoint,
            savepoint,
            seed,
            partition,
            list,
        } => checkpoints::restore(config, checkpoint, savepoint, seed, partition, list).await,
        Command::DecodeDelta => keys::decode_delta(),
        Command::Get { node, key } => keys::get(node, key).await,
        Command::Update {
            node,
            key,
            add,
            set,
            id,
        } => keys::update(node, key, add, set, id).await,
        Command::Scan {
            node,
            prefix,
            limit,
        } => keys::scan(node, prefix, limit).await,
        Command::Status { node } => status::status(node).await,
        Command::Top {
            node,
            peers,
            interval,
            once,
        } => status::top(node, peers, interval, once).await,
        Command::Checkpoint { node } => checkpoints::checkpoint(node).await,
        Command::Savepoint { node } => checkpoints::savepoint(node).await,
        Command::Leases { node, key } => leases::leases(node, key).await,
        Command::Route { node, key } => keys::route(node, key).await,
        Command::TransferLease { node, shard, to } => leases::transfer_lease(node, shard, to).await,
        Command::Dlq {
            action:
                DlqAction::Replay {
                    config,
                    topic,
                    event_time,
                    dry_run,
                },
        } => dlq::replay(config, topic, event_time, dry_run).await,
        Command::Sink {
            action: SinkAction::Postgres { config, postgres },
        } => sink::postgres(config, postgres).await,
        Command::Pricer {
            config,
            addr,
            metrics_listen,
        } => pricer::run(config, addr, metrics_listen).await,
        Command::Sink {
            action:
                SinkAction::Reconcile {
                    config,
                    postgres,
                    regions,
                    wait,
                },
        } => sink::reconcile(config, postgres, regions, wait).await,
    }
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
