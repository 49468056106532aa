//! The `window` section of a counter namespace, and the `[watermark]` section.

use std::time::Duration;

use serde::Deserialize;

use super::fields::{ConfigError, invalid, parse_duration};
use crate::crdt::CrdtType;
use crate::window::WindowSpec;

/// `[namespace.window]`: the namespace counts per event-time window.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(super) struct RawWindow {
    size: String,
    /// Hopping windows start every `slide`; tumbling (`slide = size`) when absent.
    slide: Option<String>,
    #[serde(default = "no_lateness")]
    allowed_lateness: String,
    #[serde(default = "default_retention")]
    retention: String,
}

fn no_lateness() -> String {
    "0s".into()
}
fn default_retention() -> String {
    "1h".into()
}

/// Whole milliseconds, at least one.
fn millis(field: &'static str, text: &str) -> Result<u64, ConfigError> {
    let d = parse_duration(field, text)?;
    if d.subsec_nanos() % 1_000_000 != 0 {
        return Err(invalid(
            field,
            format!("{text:?} is not whole milliseconds"),
        ));
    }
    Ok(d.as_millis() as u64)
}

impl RawWindow {
    pub(super) fn validate(&self, crdt: CrdtType) -> Result<WindowSpec, ConfigError> {
        if !matches!(crdt, CrdtType::GCounter | CrdtType::PnCounter) {
            return Err(invalid(
                "namespace.window",
                format!("only g_counter and pn_counter namespaces are windowed, not {crdt}"),
            ));
        }
        let size_ms = millis("namespace.window.size", &self.size)?;
        let slide_ms = match &self.slide {
            Some(s) => millis("namespace.window.slide", s)?,
            None => size_ms,
        };
        if size_ms == 0 || slide_ms == 0 {
            return Err(invalid(
                "namespace.window",
                "size and slide must be at least 1ms",
            ));
        }
        if slide_ms > size_ms {
            return Err(invalid(
                "namespace.window.slide",
                format!(
                    "{slide_ms}ms is longer than the size ({size_ms}ms): events between windows would count nowhere"
                ),
            ));
        }
        Ok(WindowSpec {
            size_ms,
            slide_ms,
            allowed_lateness_ms: millis(
                "namespace.window.allowed-lateness",
                &self.allowed_lateness,
            )?,
            retention_ms: millis("namespace.window.retention", &self.retention)?,
        })
    }
}

/// How a partition's watermark follows its windowed records' event times.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WatermarkConfig {
    /// The watermark is the largest event time seen less this: how far out of order
    /// events may arrive and still count in their window without lateness.
    pub out_of_orderness: Duration,
    /// A partition whose watermark has not moved for this long is idle: its owner moves
    /// it to what the region's other partitions and the other regions' watermarks for it
    /// say (`ingest::idle`).
    pub idle_after: Duration,
}

impl Default for WatermarkConfig {
    fn default() -> Self {
        Self {
            out_of_orderness: Duration::from_secs(5),
            idle_after: Duration::from_secs(10),
        }
    }
}

/// `[watermark]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(super) struct RawWatermark {
    #[serde(default = "default_out_of_orderness")]
    out_of_orderness: String,
    #[serde(default = "default_idle_after")]
    idle_after: String,
}

fn default_out_of_orderness() -> String {
    "5s".into()
}
fn default_idle_after() -> String {
    "10s".into()
}

impl Default for RawWatermark {
    fn default() -> Self {
        Self {
            out_of_orderness: default_out_of_orderness(),
            idle_after: default_idle_after(),
        }
    }
}

impl RawWatermark {
    pub(super) fn validate(&self) -> Result<WatermarkConfig, ConfigError> {
        Ok(WatermarkConfig {
            out_of_orderness: Duration::from_millis(millis(
                "watermark.out-of-orderness",
                &self.out_of_orderness,
            )?),
            idle_after: Duration::from_millis(millis("watermark.idle-after", &self.idle_after)?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(size: &str, slide: Option<&str>) -> RawWindow {
        RawWindow {
            size: size.into(),
            slide: slide.map(Into::into),
            allowed_lateness: "10s".into(),
            retention: "1h".into(),
        }
    }

    #[test]
    fn a_window_section_is_checked() {
        let tumbling = raw("1m", None).validate(CrdtType::GCounter).unwrap();
        assert_eq!(
            (
                tumbling.size_ms,
                tumbling.slide_ms,
                tumbling.allowed_lateness_ms
            ),
            (60_000, 60_000, 10_000)
        );
        let hopping = raw("5m", Some("1m")).validate(CrdtType::PnCounter).unwrap();
        assert_eq!((hopping.size_ms, hopping.slide_ms), (300_000, 60_000));
        for (window, crdt, field) in [
            (raw("1m", None), CrdtType::LwwRegister, "namespace.window"),
            (
                raw("1m", Some("2m")),
                CrdtType::GCounter,
                "namespace.window.slide",
            ),
            (raw("0s", None), CrdtType::GCounter, "namespace.window"),
            (
                raw("1500us", None),
                CrdtType::GCounter,
                "namespace.window.size",
            ),
        ] {
            let e = window.validate(crdt).unwrap_err().to_string();
            assert!(e.contains(field), "{e}");
        }
    }
}
