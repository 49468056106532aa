//! The `geostate` binary: a region node (`run`), its offline restore (`restore`), and an
//! operator client (`get`, `update`, `scan`, `status`, `checkpoint`, `savepoint`) over the
//! public gRPC API.

use std::io::Read;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
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
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Role {
    Region,
    Witness,
}

#[derive(Subcommand)]
enum Command {
    /// Run one region node, or (`--role witness`) the lease group's third member.
    Run {
        #[arg(long)]
        config: PathBuf,
        #[arg(long, value_enum, default_value_t = Role::Region)]
        role: Role,
    },
    /// List the ownership shards: holder, epoch, time to expiry.
    Leases {
        #[arg(long, default_value = "http://127.0.0.1:50051")]
        addr: String,
    },
    /// Hand a shard this region holds to another region (planned handoff).
    TransferLease {
        #[arg(long, default_value = "http://127.0.0.1:50051")]
        addr: String,
        #[arg(long)]
        shard: u32,
        #[arg(long)]
        to: String,
    },
    /// Read one key.
    Get {
        #[arg(long, default_value = "http://127.0.0.1:50051")]
        addr: String,
        key: String,
    },
    /// Write one key: `--add N` for counters, `--set VALUE` for registers.
    Update {
        #[arg(long, default_value = "http://127.0.0.1:50051")]
        addr: String,
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
        #[arg(long, default_value = "http://127.0.0.1:50051")]
        addr: String,
        prefix: String,
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
    /// Show the node's region, incarnation and per-partition progress.
    Status {
        #[arg(long, default_value = "http://127.0.0.1:50051")]
        addr: String,
    },
    /// Take a checkpoint now; prints its id and what was uploaded.
    Checkpoint {
        #[arg(long, default_value = "http://127.0.0.1:50051")]
        addr: String,
    },
    /// Write a savepoint (a logical dump of the node's store) to the checkpoint store.
    Savepoint {
        #[arg(long, default_value = "http://127.0.0.1:50051")]
        addr: String,
    },
    /// Restore a stopped node's empty data dir from a checkpoint (default: the newest) or
    /// a savepoint; the next `run` replays the log from there.
    Restore {
        #[arg(long)]
        config: PathBuf,
        /// A checkpoint id (see `--list`).
        #[arg(long, conflicts_with = "savepoint")]
        checkpoint: Option<String>,
        /// A savepoint id in the checkpoint store, or the path of a `.gsp` file.
        #[arg(long)]
        savepoint: Option<String>,
        /// Seed this region from another region's savepoint: state only.
        #[arg(long, requires = "savepoint")]
        seed: bool,
        /// List the checkpoints in the store and exit.
        #[arg(long)]
        list: bool,
    },
    /// Decode one `geostate.deltas` record value (protobuf `geostate.v1.Delta`) from stdin.
    DecodeDelta,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            // openraft narrates every election at info
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,openraft=warn".into()),
        )
        .with_writer(std::io::stderr)
        // colours only for a terminal: log files stay greppable
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
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
        Command::Run {
            config,
            role: Role::Witness,
        } => {
            let config = geostate::config::WitnessConfig::load(&config)?;
            geostate::lease::witness::run(config, shutdown_signal()).await?;
        }
        Command::Leases { addr } => {
            let mut client = AdminClient::connect(addr).await?;
            let r = client.leases(pb::LeasesRequest {}).await?.into_inner();
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
        }
        Command::TransferLease { addr, shard, to } => {
            let mut client = AdminClient::connect(addr).await?;
            let r = client
                .transfer_lease(pb::TransferLeaseRequest {
                    shard,
                    to_region: to,
                })
                .await?
                .into_inner();
            let l = r.lease.unwrap_or_default();
            println!(
                "shard {} now held by {} at epoch {}",
                l.shard, l.holder, l.epoch
            );
        }
        Command::Run { config, .. } => {
            let config = geostate::config::Config::load(&config)?;
            let listeners = geostate::node::Listeners::bind(&config)
                .await
                .context("binding the gRPC and metrics addresses")?;
            geostate::node::run(config, listeners, shutdown_signal()).await?;
        }
        Command::Get { addr, key } => {
            let mut client = StateClient::connect(addr).await?;
            let value = client
                .get(pb::GetRequest {
                    key,
                    ..Default::default()
                })
                .await?
                .into_inner();
            println!("{}", show(&value));
        }
        Command::Update {
            addr,
            key,
            add,
            set,
            id,
        } => {
            let op = match (add, set) {
                (Some(n), None) => pb::update_request::Op::Add(n),
                (None, Some(v)) => pb::update_request::Op::Set(v.into_bytes()),
                _ => anyhow::bail!("give exactly one of --add or --set"),
            };
            let mut client = StateClient::connect(addr).await?;
            let reply = client
                .update(pb::UpdateRequest {
                    key,
                    op: Some(op),
                    id: id.unwrap_or_default(),
                })
                .await?
                .into_inner();
            let at = reply.position.unwrap_or_default();
            println!("applied at partition {} offset {}", at.partition, at.offset);
        }
        Command::Scan {
            addr,
            prefix,
            limit,
        } => {
            let mut client = StateClient::connect(addr).await?;
            let mut page_token = String::new();
            loop {
                let page = client
                    .scan(pb::ScanRequest {
                        prefix: prefix.clone(),
                        page_token,
                        limit,
                    })
                    .await?
                    .into_inner();
                for value in &page.values {
                    println!("{}", show(value));
                }
                if page.next_page_token.is_empty() {
                    break;
                }
                page_token = page.next_page_token;
            }
        }
        Command::Status { addr } => {
            let mut client = AdminClient::connect(addr).await?;
            let s = client.status(pb::StatusRequest {}).await?.into_inner();
            println!(
                "region {} incarnation {} topic {} applied {} dead-lettered {}",
                s.region, s.incarnation, s.updates_topic, s.events_applied, s.events_dead_lettered
            );
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
                println!(
                    "checkpoints to {}: last {} ({} ms ago, took {} ms, uploaded {} bytes), taken {} failed {}{}",
                    c.target,
                    if c.last_id.is_empty() {
                        "-"
                    } else {
                        &c.last_id
                    },
                    c.last_age_ms,
                    c.last_duration_ms,
                    c.last_bytes_uploaded,
                    c.taken,
                    c.failures,
                    if c.restored_from.is_empty() {
                        String::new()
                    } else {
                        format!("; restored from {}", c.restored_from)
                    }
                );
            }
        }
        Command::Checkpoint { addr } => {
            let mut client = AdminClient::connect(addr).await?;
            let c = client
                .checkpoint(pb::CheckpointRequest {})
                .await?
                .into_inner();
            println!(
                "checkpoint {} ({} files, {} bytes, {} uploaded, {} ms): {}",
                c.id, c.files, c.bytes_total, c.bytes_uploaded, c.duration_ms, c.manifest
            );
        }
        Command::Savepoint { addr } => {
            let mut client = AdminClient::connect(addr).await?;
            let s = client
                .savepoint(pb::SavepointRequest {})
                .await?
                .into_inner();
            println!(
                "savepoint {} ({} entries, {} bytes): {}",
                s.id, s.entries, s.bytes, s.location
            );
        }
        Command::Restore {
            config,
            checkpoint,
            savepoint,
            seed,
            list,
        } => {
            use geostate::checkpoint::{self, objects::Objects};
            let config = geostate::config::Config::load(&config)?;
            let objects = Objects::connect(&config.checkpoint.target).await;
            if list {
                for id in checkpoint::list(&objects).await? {
                    println!("{id}");
                }
                return Ok(());
            }
            match savepoint {
                Some(savepoint) => {
                    let header =
                        checkpoint::savepoint::restore(&config, &objects, &savepoint, seed).await?;
                    println!(
                        "restored savepoint {savepoint} (region {}, written by geostate {}) into {}",
                        header.region,
                        header.writer_version,
                        config.data_dir.display()
                    );
                }
                None => {
                    let manifest =
                        checkpoint::restore(&config, &objects, checkpoint.as_deref()).await?;
                    println!(
                        "restored checkpoint {} ({} files) into {}",
                        manifest.id,
                        manifest.files.len(),
                        config.data_dir.display()
                    );
                }
            }
        }
        Command::DecodeDelta => {
            let mut bytes = Vec::new();
            std::io::stdin()
                .read_to_end(&mut bytes)
                .context("reading stdin")?;
            let delta = geostate::crdt::Delta::decode(&bytes).context("decoding delta")?;
            println!("{delta:#?}");
        }
    }
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
