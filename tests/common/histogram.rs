//! Quantiles of a node's Prometheus histograms between two scrapes of its metrics
//! endpoint, for the benchmarks' per-stage figures.

use std::collections::BTreeMap;

/// Cumulative bucket counts of one series: (upper bound in seconds, count), +Inf last.
pub type Buckets = Vec<(f64, u64)>;

/// Per value of `label`, the cumulative buckets of histogram `metric` in `text`
/// (Prometheus text format), of the series whose other labels include every `(name,
/// value)` of `only`.
pub fn buckets(
    text: &str,
    metric: &str,
    label: &str,
    only: &[(&str, &str)],
) -> BTreeMap<String, Buckets> {
    let prefix = format!("{metric}_bucket{{");
    let mut series: BTreeMap<String, Buckets> = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(&prefix) else {
            continue;
        };
        let value = |name: &str| {
            rest.split(&format!("{name}=\"")[..])
                .nth(1)
                .and_then(|v| v.split('"').next())
        };
        if only.iter().any(|&(name, want)| value(name) != Some(want)) {
            continue;
        }
        let (Some(key), Some(le)) = (value(label), value("le")) else {
            continue;
        };
        let le = le.parse().unwrap_or(f64::INFINITY);
        let count = line
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0) as u64;
        series.entry(key.to_string()).or_default().push((le, count));
    }
    series
}

/// What was recorded between the `before` and `after` readings of one series.
pub fn since(before: Option<&Buckets>, after: &Buckets) -> Buckets {
    after
        .iter()
        .map(|&(le, n)| {
            let was = before
                .and_then(|b| b.iter().find(|(l, _)| *l == le))
                .map_or(0, |&(_, c)| c);
            (le, n.saturating_sub(was))
        })
        .collect()
}

/// How many observations `buckets` holds.
pub fn count(buckets: &Buckets) -> u64 {
    buckets.last().map_or(0, |&(_, n)| n)
}

/// The `p` quantile, interpolated linearly within its bucket (the last finite bound when
/// it falls in +Inf); 0 without observations.
pub fn quantile(buckets: &Buckets, p: f64) -> f64 {
    let total = count(buckets);
    if total == 0 {
        return 0.0;
    }
    let rank = p * total as f64;
    let (mut lower, mut below) = (0.0, 0u64);
    for &(le, n) in buckets {
        if n as f64 >= rank {
            if le.is_infinite() {
                return lower;
            }
            let inside = (n - below).max(1) as f64;
            return lower + (le - lower) * ((rank - below as f64) / inside).clamp(0.0, 1.0);
        }
        (lower, below) = (le, n);
    }
    lower
}

#[cfg(test)]
mod tests {
    #[test]
    fn quantiles_come_from_the_difference_of_two_scrapes() {
        let text = |a: u64, b: u64| {
            format!(
                "x_bucket{{stage=\"s\",le=\"0.01\"}} {a}\nx_bucket{{stage=\"s\",le=\"0.02\"}} {b}\nx_bucket{{stage=\"s\",le=\"+Inf\"}} {b}\n"
            )
        };
        let (before, after) = (
            super::buckets(&text(10, 10), "x", "stage", &[]),
            super::buckets(&text(10, 110), "x", "stage", &[]),
        );
        let run = super::since(before.get("s"), &after["s"]);
        assert_eq!(super::count(&run), 100);
        // every new observation is between 10 and 20 ms
        assert!((super::quantile(&run, 0.5) - 0.015).abs() < 1e-9);
        assert!((super::quantile(&run, 0.99) - 0.0199).abs() < 1e-9);
    }
}
