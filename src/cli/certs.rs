//! `certs`: a development CA and a certificate per name, written to a folder (made by
//! `crate::security::certs`).

use std::path::PathBuf;

use anyhow::Context;

/// Writes the files and prints each one's path; `valid_days` is a number of days, like
/// `365d`.
pub(super) fn make(
    out: PathBuf,
    hosts: Vec<String>,
    valid_days: String,
    names: Vec<String>,
) -> anyhow::Result<()> {
    let days: u64 = valid_days
        .trim_end_matches('d')
        .parse()
        .context("--valid-days is a number of days, like 365d")?;
    let valid_for = std::time::Duration::from_secs(days * 86_400);
    for file in crate::security::certs::make(&out, &names, &hosts, valid_for)? {
        println!("{}", file.display());
    }
    Ok(())
}
