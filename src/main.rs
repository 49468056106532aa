//! The `geostate` binary: parses the command line and hands over to the library.

use std::io::Read;

use anyhow::Context;
use clap::{Parser, Subcommand};

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

#[derive(Subcommand)]
enum Command {
    /// Decode one `geostate.deltas` record value (protobuf `geostate.v1.Delta`) from
    /// stdin and print it, e.g. `kcat -C -t geostate.deltas -c1 -D '' | geostate decode-delta`.
    DecodeDelta,
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
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
