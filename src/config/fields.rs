//! The building blocks every configuration section shares: the error that names the
//! field, and the parsers of addresses and durations.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Not `source`: the message is part of this error's own text, once.
    #[error("{path}: {error}")]
    Parse {
        path: PathBuf,
        error: Box<toml::de::Error>,
    },
    #[error("--set {setting}: {reason}")]
    Set { setting: String, reason: String },
    #[error("invalid `{field}`: {reason}")]
    Invalid { field: &'static str, reason: String },
}

/// A password or key: its `Debug` and `Display` never show it.
#[derive(Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(text: String) -> Self {
        Self(text)
    }

    /// The secret itself, for the one place that needs it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

impl std::fmt::Display for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

pub fn invalid(field: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field,
        reason: reason.into(),
    }
}

pub fn parse_addr(field: &'static str, text: &str) -> Result<SocketAddr, ConfigError> {
    text.parse().map_err(|_| {
        invalid(
            field,
            format!("{text:?} is not an address like \"127.0.0.1:7000\""),
        )
    })
}

/// Parses `"250ms"`, `"15s"`, `"2m"`, `"1h"`, `"500us"`: a whole number and a unit.
pub fn parse_duration(field: &'static str, text: &str) -> Result<Duration, ConfigError> {
    let bad = || {
        invalid(
            field,
            format!("{text:?} is not a duration like \"250ms\", \"15s\", \"2m\" or \"1h\""),
        )
    };
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
    let (number, unit) = text.split_at(split);
    let n: u64 = number.parse().map_err(|_| bad())?;
    let d = match unit {
        "us" => Duration::from_micros(n),
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.checked_mul(60).ok_or_else(bad)?),
        "h" => Duration::from_secs(n.checked_mul(3600).ok_or_else(bad)?),
        _ => return Err(bad()),
    };
    // timers add durations to the monotonic clock: bounded, no sum overflows
    if d > MAX_DURATION {
        return Err(invalid(field, format!("{text:?} is longer than 10 years")));
    }
    Ok(d)
}

/// The longest duration a setting may have.
const MAX_DURATION: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
