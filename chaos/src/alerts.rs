//! The alerts a drill provokes, as the cluster's Prometheus (`make up` starts one, with
//! `deploy/prometheus/rules.yml`) evaluated them: each drill names the alerts an operator
//! must get from its fault, and the verdict fails if one did not fire.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use geostate_jepsen::prometheus;
use serde::Serialize;

use crate::Drill;

/// The alerts `drill` must fire, each in the region its fault hits (`target`) or in
/// another region (`Elsewhere`), or anywhere (`Any`).
pub(crate) fn expected(drill: Drill) -> &'static [(&'static str, Where)] {
    use Where::*;
    match drill {
        Drill::KillRegion => &[
            ("GeostateNodeDown", Target),
            ("GeostateReplicationStalled", Elsewhere),
        ],
        Drill::BrokerLoss => &[
            ("GeostateConsumerRestarts", Target),
            ("GeostateKafkaUnreachable", Target),
        ],
        // every region checkpoints to the one local S3 server
        Drill::S3Outage => &[
            ("GeostateCheckpointsFailing", Target),
            ("GeostateCheckpointsFailing", Elsewhere),
        ],
        // (not GeostateReplicationLagHigh: the lag is the newest merged delta's, and the
        // backlog is merged in batches whose newest deltas are fresh)
        Drill::MirrorBacklog => &[("GeostateReplicationStalled", Any)],
        // killed and restored within seconds: restarted, not down for long
        Drill::RegionWipe => &[("GeostateNodeRestarted", Target)],
        Drill::IsolateRegion => &[
            ("GeostateReplicationStalled", Target),
            ("GeostateReplicationStalled", Elsewhere),
        ],
        Drill::ClockSkew => &[
            ("GeostateClockOff", Target),
            ("GeostateNodeRestarted", Target),
        ],
        // the paused holder is wherever the first owned key's lease was
        Drill::PauseHolder => &[("GeostateLeasesLost", Any)],
        Drill::ScaleOutUnderLoad | Drill::WanDelay => &[],
    }
}

#[derive(Clone, Copy, Debug, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Where {
    Target,
    Elsewhere,
    Any,
}

impl Where {
    /// Whether an alert in `region` is where this says, for a fault on `target`.
    fn holds(self, region: &str, target: &str) -> bool {
        match self {
            Where::Target => region == target,
            Where::Elsewhere => region != target,
            Where::Any => true,
        }
    }
}

/// What the drill's alerts came to.
#[derive(Clone, Serialize)]
pub(crate) struct Alerts {
    /// Each expected alert, where, and whether it fired there.
    pub(crate) expected: Vec<(String, Where, bool)>,
    /// Every alert that fired from the fault on: name → the regions it fired in.
    pub(crate) fired: BTreeMap<String, BTreeSet<String>>,
}

impl Alerts {
    /// Judges what fired (name → regions) against what `drill` must fire at `target`.
    pub(crate) fn judge(
        drill: Drill,
        target: &str,
        fired: BTreeMap<String, BTreeSet<String>>,
    ) -> Self {
        let expected = expected(drill)
            .iter()
            .map(|&(name, place)| {
                let hit = fired
                    .get(name)
                    .is_some_and(|rs| rs.iter().any(|r| place.holds(r, target)));
                (name.to_string(), place, hit)
            })
            .collect();
        Alerts { expected, fired }
    }

    pub(crate) fn missing(&self) -> Vec<String> {
        self.expected
            .iter()
            .filter(|(_, _, hit)| !hit)
            .map(|(name, place, _)| format!("{name} ({place:?})"))
            .collect()
    }
}

/// Waits until none of the alerts `drill` must fire is pending or firing where it must
/// fire (an alert still firing from an earlier fault would prove nothing about this one);
/// an error after `within`.
pub(crate) async fn wait_quiet(
    url: &str,
    drill: Drill,
    target: &str,
    within: Duration,
) -> anyhow::Result<()> {
    let until = std::time::Instant::now() + within;
    let mut said = false;
    loop {
        let mut active = Vec::new();
        for series in query(url, "ALERTS".into()).await? {
            let labels = &series["metric"];
            let name = labels["alertname"].as_str().unwrap_or_default();
            let region = labels["geostate_region"].as_str().unwrap_or_default();
            let hit = expected(drill)
                .iter()
                .any(|&(n, place)| n == name && place.holds(region, target));
            if hit {
                active.push(format!("{name} ({region})"));
            }
        }
        if active.is_empty() {
            return Ok(());
        }
        if !said {
            println!(
                "{drill:?}: waiting until {} no longer fire (from an earlier fault)",
                active.join(", ")
            );
            said = true;
        }
        anyhow::ensure!(
            std::time::Instant::now() < until,
            "{} still active {within:?} after the drill began: it could not tell this fault's alerts from an earlier one's",
            active.join(", ")
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Every alert Prometheus at `url` had firing at some point in the last `window`: name →
/// the regions (`geostate_region`) it fired in.
pub(crate) async fn fired(
    url: &str,
    window: Duration,
) -> anyhow::Result<BTreeMap<String, BTreeSet<String>>> {
    let promql = format!(
        "max_over_time(ALERTS{{alertstate=\"firing\"}}[{}s])",
        window.as_secs().max(1)
    );
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for series in query(url, promql).await? {
        let labels = &series["metric"];
        let name = labels["alertname"].as_str().unwrap_or("?").to_string();
        let region = labels["geostate_region"].as_str().unwrap_or("").to_string();
        out.entry(name).or_default().insert(region);
    }
    Ok(out)
}

/// `prometheus::query` (a blocking HTTP call) on the blocking pool.
async fn query(url: &str, promql: String) -> anyhow::Result<Vec<serde_json::Value>> {
    let url = url.to_string();
    tokio::task::spawn_blocking(move || prometheus::query(&url, &promql)).await?
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fired(pairs: &[(&str, &str)]) -> BTreeMap<String, BTreeSet<String>> {
        let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (name, region) in pairs {
            out.entry(name.to_string())
                .or_default()
                .insert(region.to_string());
        }
        out
    }

    #[test]
    fn an_expected_alert_must_fire_where_the_drill_says() {
        let ok = Alerts::judge(
            Drill::KillRegion,
            "us-east-1",
            fired(&[
                ("GeostateNodeDown", "us-east-1"),
                ("GeostateReplicationStalled", "eu-west-1"),
            ]),
        );
        assert!(ok.missing().is_empty(), "{:?}", ok.missing());
        // down, but in the wrong region; and stalled only in the killed one
        let wrong = Alerts::judge(
            Drill::KillRegion,
            "us-east-1",
            fired(&[
                ("GeostateNodeDown", "eu-west-1"),
                ("GeostateReplicationStalled", "us-east-1"),
            ]),
        );
        assert_eq!(wrong.missing().len(), 2, "{:?}", wrong.missing());
        assert!(
            Alerts::judge(Drill::WanDelay, "us-east-1", fired(&[]))
                .missing()
                .is_empty()
        );
    }
}
