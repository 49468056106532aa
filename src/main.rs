//! The `geostate` binary: a region node (`run`), its offline restore (`restore`), and an
//! operator client (`get`, `update`, `scan`, `status`, `checkpoint`, `savepoint`) over the
//! public gRPC API. The command line and every subcommand live in `geostate::cli`; this
//! entry parses it, sets up the log and the tokio runtime, and turns the result into the
//! exit code.

use std::io::Write;

use anyhow::Context;
use clap::Parser;
use geostate::cli::{Cli, LogFormat};

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let log = tracing_subscriber::fmt()
        .with_env_filter(
            // openraft narrates every election at info
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,openraft=warn".into()),
        )
        .with_writer(std::io::stderr)
        // a log line that cannot be written (a full disk, a closed pipe) is lost, never
        // reported with `eprintln!`, which panics when stderr cannot be written either
        .log_internal_errors(false)
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
        .and_then(|runtime| runtime.block_on(geostate::cli::dispatch(cli.command)));
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            let mut stderr = std::io::stderr();
            // the exit code says it failed, whether or not the reason can be written
            let _ = match e.downcast_ref::<tonic::Status>() {
                Some(status) => {
                    writeln!(stderr, "error: {:?}: {}", status.code(), status.message())
                }
                None => writeln!(stderr, "error: {e:#}"),
            };
            std::process::ExitCode::FAILURE
        }
    }
}
