//! The `[pricing]` section: which windowed namespaces `geostate pricer` reads demand and
//! supply from, which owned register namespace it writes multipliers to, and the formula.

use std::time::Duration;

use serde::Deserialize;

use super::fields::{ConfigError, invalid, parse_duration};
use super::{Namespaces, Ownership};
use crate::crdt::CrdtType;
use crate::window::WindowSpec;

/// Surge multipliers from final windows (`geostate pricer`).
#[derive(Clone, Debug, PartialEq)]
pub struct PricingConfig {
    /// Requests per geohash: `<demand><geohash>`, a windowed counter.
    pub demand: String,
    /// Available drivers per geohash: `<supply><geohash>`, a windowed counter with the
    /// same windows.
    pub supply: String,
    /// The multiplier per geohash: `<prices><geohash>`, an owned register whose changes are
    /// outputs.
    pub prices: String,
    /// The windows of `demand` (and `supply`).
    pub window: WindowSpec,
    pub formula: Formula,
    /// How often every geohash is looked at, besides the windows `Watch` reports final
    /// (what a failover or a broken stream left unpriced).
    pub sweep_every: Duration,
    /// The multipliers come from this user function sidecar instead of the built-in
    /// formula (with the formula's parameters).
    pub function: Option<FunctionConfig>,
}

/// A `geostate.v1.Function` sidecar serving `surge`.
#[derive(Clone, Debug, PartialEq)]
pub struct FunctionConfig {
    /// `unix:///path/to.sock` or `http://host:port`.
    pub addr: String,
    /// Longest a `Compute` or `Describe` call may take.
    pub timeout: Duration,
}

/// `multiplier = clamp(1 + slope × (demand / max(supply, 1) − threshold), 1, max)`,
/// rounded to the nearest `step`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Formula {
    pub threshold: f64,
    pub slope: f64,
    pub max: f64,
    pub step: f64,
}

impl Formula {
    /// The parameters a user function computing it gets, by name.
    pub fn params(&self) -> [(&'static str, f64); 4] {
        [
            ("threshold", self.threshold),
            ("slope", self.slope),
            ("max", self.max),
            ("step", self.step),
        ]
    }

    /// Whether `hundredths` is a multiplier the formula can give: 1 to `max`.
    pub fn in_range(&self, hundredths: i64) -> bool {
        (100..=(self.max * 100.0).round() as i64).contains(&hundredths)
    }

    /// The multiplier in hundredths (1.25 → 125): the same integers in every region.
    pub fn hundredths(&self, demand: i64, supply: i64) -> i64 {
        let ratio = demand as f64 / supply.max(1) as f64;
        let raw = (1.0 + self.slope * (ratio - self.threshold)).clamp(1.0, self.max);
        let stepped = (raw / self.step).round() * self.step;
        (stepped.clamp(1.0, self.max) * 100.0).round() as i64
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(super) struct RawPricing {
    demand: String,
    supply: String,
    prices: String,
    #[serde(default = "default_threshold")]
    threshold: f64,
    #[serde(default = "default_slope")]
    slope: f64,
    #[serde(default = "default_max")]
    max_multiplier: f64,
    #[serde(default = "default_step")]
    step: f64,
    #[serde(default = "default_sweep_every")]
    sweep_every: String,
    function: Option<String>,
    #[serde(default = "default_function_timeout")]
    function_timeout: String,
}

fn default_function_timeout() -> String {
    "2s".into()
}

fn default_threshold() -> f64 {
    1.0
}
fn default_slope() -> f64 {
    0.5
}
fn default_max() -> f64 {
    3.0
}
fn default_step() -> f64 {
    0.05
}
fn default_sweep_every() -> String {
    "1m".into()
}

impl RawPricing {
    pub(super) fn validate(self, namespaces: &Namespaces) -> Result<PricingConfig, ConfigError> {
        let windowed = |field: &'static str, prefix: &str| {
            let ns = namespaces
                .iter()
                .find(|ns| ns.prefix == prefix)
                .ok_or_else(|| invalid(field, format!("{prefix:?} is no namespace's prefix")))?;
            ns.window
                .ok_or_else(|| invalid(field, format!("{prefix:?} is not a windowed namespace")))
        };
        let window = windowed("pricing.demand", &self.demand)?;
        if windowed("pricing.supply", &self.supply)? != window {
            return Err(invalid(
                "pricing.supply",
                format!(
                    "{:?} must have the windows of {:?} (size, slide, lateness, retention)",
                    self.supply, self.demand
                ),
            ));
        }
        let prices = namespaces.iter().find(|ns| ns.prefix == self.prices);
        if !prices.is_some_and(|ns| {
            ns.crdt == CrdtType::LwwRegister
                && ns.ownership == Ownership::Owned
                && ns.outputs_register_changes
        }) {
            return Err(invalid(
                "pricing.prices",
                format!(
                    "{:?} must be an owned lww_register namespace with output = \"register-changes\"",
                    self.prices
                ),
            ));
        }
        let positive = |field: &'static str, v: f64| {
            if v.is_finite() && v > 0.0 {
                Ok(v)
            } else {
                Err(invalid(field, format!("{v} is not a positive number")))
            }
        };
        let formula = Formula {
            threshold: positive("pricing.threshold", self.threshold)?,
            slope: positive("pricing.slope", self.slope)?,
            max: positive("pricing.max-multiplier", self.max_multiplier)?,
            step: positive("pricing.step", self.step)?,
        };
        if formula.max < 1.0 || formula.max > 100.0 {
            return Err(invalid(
                "pricing.max-multiplier",
                format!("{} is not between 1 and 100", formula.max),
            ));
        }
        if formula.step < 0.01
            || ((formula.step * 100.0).round() - formula.step * 100.0).abs() > 1e-9
        {
            return Err(invalid(
                "pricing.step",
                format!("{} is not a whole number of hundredths", formula.step),
            ));
        }
        let sweep_every = parse_duration("pricing.sweep-every", &self.sweep_every)?;
        if sweep_every.is_zero() {
            return Err(invalid("pricing.sweep-every", "must be more than 0"));
        }
        let function = match self.function {
            None => None,
            Some(addr) if addr.starts_with("unix:///") || addr.starts_with("http://") => {
                let timeout = parse_duration("pricing.function-timeout", &self.function_timeout)?;
                if timeout.is_zero() {
                    return Err(invalid("pricing.function-timeout", "must be more than 0"));
                }
                Some(FunctionConfig { addr, timeout })
            }
            Some(addr) => {
                return Err(invalid(
                    "pricing.function",
                    format!("{addr:?} is neither unix:///path nor http://host:port"),
                ));
            }
        };
        Ok(PricingConfig {
            function,
            demand: self.demand,
            supply: self.supply,
            prices: self.prices,
            window,
            formula,
            sweep_every,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The conformance suite every surge function passes (the SDK examples too).
    #[test]
    fn the_formula_gives_the_conformance_suite_s_values() {
        let suite: serde_json::Value =
            serde_json::from_str(include_str!("../../clients/conformance/surge.json")).unwrap();
        let mut checked = 0;
        for case in suite["cases"].as_array().unwrap() {
            let p = &case["params"];
            let f = Formula {
                threshold: p["threshold"].as_f64().unwrap(),
                slope: p["slope"].as_f64().unwrap(),
                max: p["max"].as_f64().unwrap(),
                step: p["step"].as_f64().unwrap(),
            };
            let inputs = case["inputs"].as_array().unwrap();
            let expected = case["expected"].as_array().unwrap();
            assert_eq!(inputs.len(), expected.len());
            for (input, want) in inputs.iter().zip(expected) {
                let v = &input["values"];
                let (d, s) = (v["demand"].as_i64().unwrap(), v["supply"].as_i64().unwrap());
                assert_eq!(f.hundredths(d, s), want.as_i64().unwrap(), "{f:?} {d}/{s}");
                assert!(f.in_range(f.hundredths(d, s)));
                checked += 1;
            }
        }
        assert!(checked >= 60, "{checked} inputs");
    }

    #[test]
    fn the_formula_clamps_and_rounds_to_its_step() {
        let f = Formula {
            threshold: 1.0,
            slope: 0.5,
            max: 3.0,
            step: 0.05,
        };
        // at or under the threshold: no surge
        assert_eq!(f.hundredths(0, 0), 100);
        assert_eq!(f.hundredths(10, 10), 100);
        assert_eq!(f.hundredths(5, 10), 100);
        // 1 + 0.5 × (3 − 1) = 2
        assert_eq!(f.hundredths(30, 10), 200);
        // 1 + 0.5 × (13/10 − 1) = 1.15
        assert_eq!(f.hundredths(13, 10), 115);
        // 1 + 0.5 × (1.17 − 1) = 1.085 → 1.10 (nearest 0.05)
        assert_eq!(f.hundredths(117, 100), 110);
        // no drivers counts as one
        assert_eq!(f.hundredths(2, 0), 150);
        // capped
        assert_eq!(f.hundredths(1000, 1), 300);
    }
}
