//! The verdict of a drill: what the run recorded ([`DrillRun`]) measured per scope (RTO,
//! RPO, duplicates, agreement, convergence, latency) and judged against the budgets, then
//! written as `<drill>.json` and `<drill>.md`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use serde::Serialize;

use crate::alerts::Alerts;
use crate::fault::Fault;
use crate::load::{Kind, Op, Outcome};
use crate::{Args, Drill, MOVE_BUDGET, RECOVERY_BUDGET, SETTLE, UNAFFECTED_BUDGET};

/// One scope's longest stretch without a success, from the fault to the end of the load.
#[derive(Serialize)]
struct Rto {
    scope: String,
    longest_gap_ms: f64,
    /// When that stretch began (seconds from the start of the load).
    gap_from_s: f64,
    budget_ms: f64,
    pass: bool,
    /// What the scope's operations answered within that stretch: each distinct status
    /// message and how often, most frequent first.
    answers_in_gap: Vec<(String, usize)>,
}

/// Latency of successful operations in one phase.
#[derive(Serialize)]
struct Latency {
    scope: String,
    phase: &'static str,
    count: usize,
    p50_ms: f64,
    p99_ms: f64,
}

#[derive(Serialize)]
pub(crate) struct Report {
    drill: Drill,
    target: String,
    fault_at_s: f64,
    fault_lasted_s: f64,
    operations: usize,
    ok: usize,
    fail: usize,
    info: usize,
    rto: Vec<Rto>,
    /// Acknowledged increments missing from the final counters.
    rpo_lost_writes: i64,
    /// Increments counted beyond every acknowledged and indeterminate one.
    duplicates: i64,
    regions_agree: bool,
    /// Lease epochs granted during a fault that must move no lease (`wan-delay`).
    failovers: Option<u64>,
    /// From the heal until a write made in every region right after it was read back in
    /// every region; `None` if that took longer than two minutes.
    convergence_ms: Option<f64>,
    latency: Vec<Latency>,
    /// The longest operations, longest first.
    slowest: Vec<Slow>,
    /// What the cluster's Prometheus fired, against what the drill must fire.
    alerts: Option<Alerts>,
    failures: Vec<String>,
    pub(crate) pass: bool,
    /// Per counter that is off, its ledger read back from the regions' topics.
    ledger: Vec<String>,
}

/// The longest time between successes at `times` (sorted) from `from_ns` to `to_ns`:
/// (its length, its start, its end).
fn longest_gap(times: &[u64], from_ns: u64, to_ns: u64) -> (u64, u64, u64) {
    let mut previous = times
        .iter()
        .rev()
        .find(|&&t| t < from_ns)
        .copied()
        .unwrap_or(from_ns);
    let mut longest = (0, previous, previous);
    for &t in times
        .iter()
        .filter(|&&t| t >= from_ns && t <= to_ns)
        .chain([&to_ns])
    {
        if t - previous > longest.0 {
            longest = (t - previous, previous, t);
        }
        previous = t;
    }
    longest
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// One operation, how long it took and what it answered ("ok" or the status).
#[derive(Serialize)]
struct Slow {
    kind: Kind,
    region: String,
    key: String,
    at_s: f64,
    took_ms: f64,
    answer: String,
}

/// How many of the longest operations a report lists.
const SLOWEST: usize = 5;

/// What one drill recorded, from the start of the load to its end.
pub(crate) struct DrillRun<'a> {
    pub(crate) regions: &'a [String],
    pub(crate) fault: &'a Fault,
    pub(crate) ops: &'a [Op],
    /// Every counter in every region at the end: key → region → value.
    pub(crate) finals: &'a BTreeMap<String, BTreeMap<String, i64>>,
    pub(crate) convergence: Option<Duration>,
    pub(crate) fault_ns: u64,
    pub(crate) heal_ns: u64,
    pub(crate) end_ns: u64,
    /// The alerts the cluster's Prometheus fired (`None`: the cluster runs none).
    pub(crate) alerts: Option<&'a Alerts>,
    /// The ledger of each counter whose final count is off ([`crate::ledger`]).
    pub(crate) ledger: Vec<String>,
}

impl<'a> DrillRun<'a> {
    /// The counters whose final count is off: below their acknowledged increments, or
    /// above those and the indeterminate ones.
    pub(crate) fn counters_off(&self) -> Vec<&'a str> {
        let finals: &'a BTreeMap<String, BTreeMap<String, i64>> = self.finals;
        (finals.iter())
            .filter(|(key, by_region)| {
                let (lost, duplicated) = self.tally(key, by_region);
                lost + duplicated > 0
            })
            .map(|(key, _)| key.as_str())
            .collect()
    }

    /// A counter's (lost, duplicated) increments, and its (acknowledged, indeterminate)
    /// adds: every add is +1, so acknowledged ≤ final ≤ acknowledged + indeterminate.
    fn tally(&self, key: &str, by_region: &BTreeMap<String, i64>) -> (i64, i64) {
        let (acked, info) = self.adds(key);
        let last = by_region.values().copied().max().unwrap_or(0);
        ((acked - last).max(0), (last - acked - info).max(0))
    }

    /// A counter's acknowledged and indeterminate adds.
    fn adds(&self, key: &str) -> (i64, i64) {
        let count = |outcome| {
            let ops = self.ops.iter();
            ops.filter(|o| o.kind == Kind::Write && o.key == key && o.outcome == outcome)
                .count() as i64
        };
        (count(Outcome::Ok), count(Outcome::Info))
    }

    /// The end times of the successful operations `pick` selects, sorted.
    fn successes(&self, pick: impl Fn(&Op) -> bool) -> Vec<u64> {
        let mut t: Vec<u64> = self
            .ops
            .iter()
            .filter(|o| o.outcome == Outcome::Ok && pick(o))
            .map(|o| o.end_ns)
            .collect();
        t.sort_unstable();
        t
    }

    /// Per scope, the longest stretch without a success from the fault on, against its
    /// budget: the fault's length plus the recovery budget where it hit, a few seconds
    /// where it did not.
    fn rto(&self, drill: Drill) -> Vec<Rto> {
        let fault_budget = Duration::from_nanos(self.heal_ns - self.fault_ns) + RECOVERY_BUDGET;
        let judge = |scope: String, pick: &dyn Fn(&Op) -> bool, budget: Duration| {
            let times = self.successes(pick);
            let (gap_ns, from, to) = longest_gap(&times, self.fault_ns, self.end_ns);
            let mut answers: BTreeMap<&str, usize> = BTreeMap::new();
            let within = |o: &&Op| o.end_ns > from && o.end_ns < to && o.outcome != Outcome::Ok;
            for o in self.ops.iter().filter(|o| pick(o)).filter(within) {
                *answers.entry(o.error.as_deref().unwrap_or("")).or_default() += 1;
            }
            let mut answers: Vec<(String, usize)> = answers
                .into_iter()
                .map(|(a, n)| (a.to_string(), n))
                .collect();
            answers.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
            let gap_ms = gap_ns as f64 / 1e6;
            let budget_ms = budget.as_secs_f64() * 1e3;
            Rto {
                scope,
                longest_gap_ms: gap_ms,
                gap_from_s: from as f64 / 1e9,
                budget_ms,
                pass: gap_ms <= budget_ms,
                answers_in_gap: answers,
            }
        };
        let mut rto = Vec::new();
        for region in self.regions {
            let hit = self.fault.affected.contains(region);
            for (kind, label) in [(Kind::Write, "writes"), (Kind::Read, "reads")] {
                // broker loss leaves reads (served from the node's own store) untouched
                let spared = kind == Kind::Read && drill == Drill::BrokerLoss;
                let budget = if hit && !spared {
                    fault_budget
                } else {
                    UNAFFECTED_BUDGET
                };
                rto.push(judge(
                    format!("{label} in {region}"),
                    &|o| o.kind == kind && o.region == *region,
                    budget,
                ));
            }
            let partitions: BTreeSet<i32> = self.fault.partitions.values().copied().collect();
            for p in partitions {
                rto.push(judge(
                    format!("writes in {region}, partition {p}"),
                    &|o| {
                        o.kind == Kind::Write
                            && o.region == *region
                            && self.fault.partitions.get(&o.key) == Some(&p)
                    },
                    MOVE_BUDGET,
                ));
            }
        }
        let owned_keys: BTreeSet<&str> = self
            .ops
            .iter()
            .filter(|o| o.kind == Kind::OwnedWrite)
            .map(|o| o.key.as_str())
            .collect();
        let budget = self.fault.owned_budget.unwrap_or(fault_budget);
        let worst = owned_keys
            .iter()
            .map(|key| {
                judge(
                    "owned-key writes (any region, worst key)".into(),
                    &|o| o.kind == Kind::OwnedWrite && o.key == *key,
                    budget,
                )
            })
            .max_by(|a, b| a.longest_gap_ms.total_cmp(&b.longest_gap_ms));
        rto.push(worst.unwrap_or_else(|| {
            judge(
                "owned-key writes (any region, worst key)".into(),
                &|o| o.kind == Kind::OwnedWrite,
                budget,
            )
        }));
        rto
    }

    /// Every add is +1: per key, acknowledged ≤ final ≤ acknowledged + indeterminate.
    /// Answers (lost, duplicated) increments and, per key where either happened, what
    /// its writes were answered and what the regions read.
    fn accounting(&self) -> (i64, i64, Vec<String>) {
        let (mut lost, mut duplicates, mut keys) = (0, 0, Vec::new());
        for (key, by_region) in self.finals {
            let (acked, info) = self.adds(key);
            let (key_lost, key_duplicated) = self.tally(key, by_region);
            if key_lost + key_duplicated > 0 {
                // where each acknowledged write entered the log: set against the nodes'
                // "took the partition" lines (resume, end), they show which one is missing
                let positions: Vec<String> = self
                    .ops
                    .iter()
                    .filter(|o| o.kind == Kind::Write && o.key == *key && o.outcome == Outcome::Ok)
                    .filter_map(|o| o.position.map(|(p, at)| format!("{}:{p}/{at}", o.region)))
                    .collect();
                keys.push(format!(
                    "{key}: {acked} acknowledged, {info} indeterminate, read {by_region:?}; acknowledged at {}",
                    positions.join(" ")
                ));
            }
            lost += key_lost;
            duplicates += key_duplicated;
        }
        (lost, duplicates, keys)
    }

    fn regions_agree(&self) -> bool {
        self.finals.values().all(|by| {
            by.len() == self.regions.len() && by.values().all(|v| Some(v) == by.values().next())
        })
    }

    /// Latency of successful operations per kind, before, during and after the fault.
    fn latency(&self) -> Vec<Latency> {
        let mut latency = Vec::new();
        for (kind, label) in [
            (Kind::Write, "writes"),
            (Kind::OwnedWrite, "owned-key writes"),
            (Kind::Read, "reads"),
        ] {
            for (phase, from, to) in [
                ("before", 0, self.fault_ns),
                ("during", self.fault_ns, self.heal_ns),
                ("after", self.heal_ns, self.end_ns),
            ] {
                let mut ms: Vec<f64> = self
                    .ops
                    .iter()
                    .filter(|o| {
                        o.kind == kind
                            && o.outcome == Outcome::Ok
                            && (from..to).contains(&o.start_ns)
                    })
                    .map(|o| (o.end_ns - o.start_ns) as f64 / 1e6)
                    .collect();
                ms.sort_by(f64::total_cmp);
                latency.push(Latency {
                    scope: label.into(),
                    phase,
                    count: ms.len(),
                    p50_ms: percentile(&ms, 0.5),
                    p99_ms: percentile(&ms, 0.99),
                });
            }
        }
        latency
    }

    /// The [`SLOWEST`] longest operations, whatever they answered (a slow call holds its
    /// client's next ones back: the first thing to read when an RTO fails).
    fn slowest(&self) -> Vec<Slow> {
        let mut ops: Vec<&Op> = self.ops.iter().collect();
        ops.sort_by_key(|o| std::cmp::Reverse(o.end_ns - o.start_ns));
        ops.into_iter()
            .take(SLOWEST)
            .map(|o| Slow {
                kind: o.kind,
                region: o.region.clone(),
                key: o.key.clone(),
                at_s: o.start_ns as f64 / 1e9,
                took_ms: (o.end_ns - o.start_ns) as f64 / 1e6,
                answer: o.error.clone().unwrap_or_else(|| "ok".into()),
            })
            .collect()
    }
}

impl Report {
    /// Measures `run` and judges every figure against its budget.
    pub(crate) fn new(args: &Args, run: &DrillRun<'_>) -> Self {
        let rto = run.rto(args.drill);
        let (lost, duplicates, keys) = run.accounting();
        let regions_agree = run.regions_agree();
        let mut failures: Vec<String> = rto
            .iter()
            .filter(|r| !r.pass)
            .map(|r| {
                let answers: Vec<String> = r
                    .answers_in_gap
                    .iter()
                    .map(|(a, n)| format!("{n} × {a}"))
                    .collect();
                format!(
                    "RTO of {}: {:.0} ms from {:.1} s, budget {:.0} ms; answered within it: {}",
                    r.scope,
                    r.longest_gap_ms,
                    r.gap_from_s,
                    r.budget_ms,
                    if answers.is_empty() {
                        "nothing (no call ended)".to_string()
                    } else {
                        answers.join("; ")
                    }
                )
            })
            .collect();
        if lost > 0 {
            failures.push(format!("RPO: {lost} acknowledged increments lost"));
        }
        if duplicates > 0 {
            failures.push(format!("{duplicates} increments applied twice"));
        }
        if !keys.is_empty() {
            failures.push(format!("counters off: {}", keys.join("; ")));
        }
        if !regions_agree {
            failures.push(format!(
                "regions disagree {} s after the load stopped",
                SETTLE.as_secs()
            ));
        }
        if run.convergence.is_none() {
            failures.push("no convergence within two minutes of the heal".into());
        }
        let failovers = run.fault.failovers;
        if let Some(n @ 1..) = failovers {
            failures.push(format!(
                "{n} lease epochs granted during a fault that must move no lease"
            ));
        }
        if let Some(alerts) = run.alerts {
            for missing in alerts.missing() {
                failures.push(format!("alert {missing} did not fire"));
            }
        }
        let count = |outcome| run.ops.iter().filter(|o| o.outcome == outcome).count();
        Report {
            drill: args.drill,
            target: run.fault.target.clone(),
            fault_at_s: run.fault_ns as f64 / 1e9,
            fault_lasted_s: (run.heal_ns - run.fault_ns) as f64 / 1e9,
            operations: run.ops.len(),
            ok: count(Outcome::Ok),
            fail: count(Outcome::Fail),
            info: count(Outcome::Info),
            rto,
            rpo_lost_writes: lost,
            duplicates,
            regions_agree,
            failovers,
            convergence_ms: run.convergence.map(|d| d.as_secs_f64() * 1e3),
            latency: run.latency(),
            slowest: run.slowest(),
            alerts: run.alerts.cloned(),
            pass: failures.is_empty(),
            failures,
            ledger: run.ledger.clone(),
        }
    }

    pub(crate) fn write(&self, out: &Path, drill: Drill) -> anyhow::Result<()> {
        std::fs::create_dir_all(out)?;
        let name = serde_json::to_value(drill)?
            .as_str()
            .unwrap_or("drill")
            .to_string();
        std::fs::write(
            out.join(format!("{name}.json")),
            serde_json::to_string_pretty(self)? + "\n",
        )?;
        let mut md = format!(
            "# Drill `{name}`: **{}**\n\n\
             Fault: {} at {:.1} s, healed after {:.1} s. {} operations: {} ok, {} refused, \
             {} indeterminate.\n\n\
             | check | figure | budget | |\n|---|---:|---:|---|\n",
            if self.pass { "pass" } else { "FAIL" },
            self.target,
            self.fault_at_s,
            self.fault_lasted_s,
            self.operations,
            self.ok,
            self.fail,
            self.info,
        );
        for r in &self.rto {
            md.push_str(&format!(
                "| RTO, {} | {:.0} ms | {:.0} ms | {} |\n",
                r.scope,
                r.longest_gap_ms,
                r.budget_ms,
                if r.pass { "pass" } else { "FAIL" }
            ));
        }
        let mark = |ok: bool| if ok { "pass" } else { "FAIL" };
        md.push_str(&format!(
            "| RPO, acknowledged increments lost | {} | 0 | {} |\n\
             | duplicate applications | {} | 0 | {} |\n\
             | regions agree once the load stops | {} | yes | {} |\n\
             | convergence after the heal | {} | {} s | {} |\n",
            self.rpo_lost_writes,
            mark(self.rpo_lost_writes == 0),
            self.duplicates,
            mark(self.duplicates == 0),
            if self.regions_agree { "yes" } else { "no" },
            mark(self.regions_agree),
            self.convergence_ms
                .map_or("none".into(), |ms| format!("{ms:.0} ms")),
            SETTLE.as_secs(),
            mark(self.convergence_ms.is_some()),
        ));
        if let Some(n) = self.failovers {
            md.push_str(&format!(
                "| lease failovers (epochs granted) during the fault | {n} | 0 | {} |\n",
                mark(n == 0)
            ));
        }
        match &self.alerts {
            None => md.push_str("| alerts | not checked: the cluster runs no Prometheus | | |\n"),
            Some(alerts) => {
                for (name, place, hit) in &alerts.expected {
                    md.push_str(&format!(
                        "| alert {name} ({place:?}) | {} | fires | {} |\n",
                        if *hit { "fired" } else { "silent" },
                        mark(*hit)
                    ));
                }
                let fired: Vec<String> = alerts
                    .fired
                    .iter()
                    .map(|(name, regions)| {
                        let regions: Vec<&str> = regions.iter().map(String::as_str).collect();
                        format!("{name} ({})", regions.join(", "))
                    })
                    .collect();
                md.push_str(&format!(
                    "\nAlerts that fired from the fault on: {}.\n",
                    if fired.is_empty() {
                        "none".to_string()
                    } else {
                        fired.join("; ")
                    }
                ));
            }
        }
        md.push_str(
            "\nLatency of successful operations (ms):\n\n\
             | operation | phase | count | p50 | p99 |\n|---|---|---:|---:|---:|\n",
        );
        for l in &self.latency {
            md.push_str(&format!(
                "| {} | {} | {} | {:.1} | {:.1} |\n",
                l.scope, l.phase, l.count, l.p50_ms, l.p99_ms
            ));
        }
        md.push_str(
            "\nLongest operations:\n\n\
             | operation | region | key | at (s) | took (ms) | answer |\n|---|---|---|---:|---:|---|\n",
        );
        for o in &self.slowest {
            md.push_str(&format!(
                "| {:?} | {} | {} | {:.1} | {:.0} | {} |\n",
                o.kind,
                o.region,
                o.key,
                o.at_s,
                o.took_ms,
                o.answer.replace('|', "/")
            ));
        }
        if !self.failures.is_empty() {
            md.push_str("\nFailed checks:\n\n");
            for f in &self.failures {
                md.push_str(&format!("- {f}\n"));
            }
        }
        if !self.ledger.is_empty() {
            md.push_str("\nLedger of the counters that are off (rounds whose entries did not rise by their records):\n\n```\n");
            for line in &self.ledger {
                md.push_str(&format!("{line}\n"));
            }
            md.push_str("```\n");
        }
        std::fs::write(out.join(format!("{name}.md")), &md)?;
        print!("{md}");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn the_longest_gap_spans_the_fault_and_runs_to_the_end_without_recovery() {
        // successes at 1, 2, then 10 and 11 s; the fault starts at 3 s
        let s = 1_000_000_000;
        let times = [s, 2 * s, 10 * s, 11 * s];
        assert_eq!(longest_gap(&times, 3 * s, 12 * s).0, 8 * s);
        // nothing after the fault: the gap runs to the end
        assert_eq!(longest_gap(&times[..2], 3 * s, 12 * s).0, 10 * s);
        // no success at all before or after: the whole window
        assert_eq!(longest_gap(&[], 3 * s, 12 * s).0, 9 * s);
    }

    #[test]
    fn percentiles_of_a_sorted_sample() {
        let sample: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&sample, 0.5), 51.0);
        assert_eq!(percentile(&sample, 0.99), 99.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
    }

    fn op(kind: Kind, region: &str, key: &str, at_s: u64, outcome: Outcome) -> Op {
        let s = 1_000_000_000;
        Op {
            kind,
            region: region.into(),
            key: key.into(),
            start_ns: at_s * s,
            end_ns: at_s * s + 1_000_000,
            outcome,
            error: None,
            position: None,
        }
    }

    /// Two regions, writes and reads every second in both; the fault at 10 s hits
    /// us-east-1 (healed at 12 s); owned writes every second.
    fn steady(lost_at: Option<u64>) -> (Vec<Op>, BTreeMap<String, BTreeMap<String, i64>>) {
        let mut ops = Vec::new();
        for t in 0..30 {
            for region in ["eu-west-1", "us-east-1"] {
                ops.push(op(Kind::Write, region, "trips/k", t, Outcome::Ok));
                ops.push(op(Kind::Read, region, "trips/k", t, Outcome::Ok));
            }
            ops.push(op(Kind::OwnedWrite, "eu-west-1", "surge/k", t, Outcome::Ok));
        }
        let acked = ops.iter().filter(|o| o.kind == Kind::Write).count() as i64;
        let last = acked - i64::from(lost_at.is_some());
        let finals = BTreeMap::from([(
            "trips/k".to_string(),
            BTreeMap::from([
                ("eu-west-1".to_string(), last),
                ("us-east-1".to_string(), last),
            ]),
        )]);
        (ops, finals)
    }

    fn judged(ops: &[Op], finals: &BTreeMap<String, BTreeMap<String, i64>>) -> Report {
        judged_with(ops, finals, None)
    }

    fn judged_with(
        ops: &[Op],
        finals: &BTreeMap<String, BTreeMap<String, i64>>,
        failovers: Option<u64>,
    ) -> Report {
        judged_alerted(ops, finals, failovers, None)
    }

    fn judged_alerted(
        ops: &[Op],
        finals: &BTreeMap<String, BTreeMap<String, i64>>,
        failovers: Option<u64>,
        alerts: Option<&Alerts>,
    ) -> Report {
        let args = Args::parse_from(["chaos", "kill-region"]);
        let regions = ["eu-west-1".to_string(), "us-east-1".to_string()];
        let fault = Fault {
            target: "us-east-1".into(),
            affected: vec!["us-east-1".into()],
            owned_budget: None,
            partitions: BTreeMap::new(),
            failovers,
        };
        let s = 1_000_000_000;
        let run = DrillRun {
            regions: &regions,
            fault: &fault,
            ops,
            finals,
            convergence: Some(Duration::from_millis(300)),
            fault_ns: 10 * s,
            heal_ns: 12 * s,
            end_ns: 30 * s,
            alerts,
            ledger: Vec::new(),
        };
        Report::new(&args, &run)
    }

    /// An alert the drill must fire that stayed silent fails it.
    #[test]
    fn an_expected_alert_that_did_not_fire_fails_the_drill() {
        let (ops, finals) = steady(None);
        let silent = Alerts::judge(Drill::WanDelay, "us-east-1", BTreeMap::new());
        assert!(judged_alerted(&ops, &finals, Some(0), Some(&silent)).pass);
        let mut missing = silent.clone();
        missing.expected.push((
            "GeostateNodeDown".into(),
            crate::alerts::Where::Target,
            false,
        ));
        let report = judged_alerted(&ops, &finals, Some(0), Some(&missing));
        assert_eq!(
            report.failures,
            ["alert GeostateNodeDown (Target) did not fire"]
        );
    }

    /// A fault that must move no lease fails the drill for any epoch granted during it.
    #[test]
    fn a_lease_epoch_granted_during_a_wan_delay_fails_the_drill() {
        let (ops, finals) = steady(None);
        assert!(judged_with(&ops, &finals, Some(0)).pass);
        let moved = judged_with(&ops, &finals, Some(2));
        assert!(!moved.pass);
        assert_eq!(
            moved.failures,
            ["2 lease epochs granted during a fault that must move no lease"]
        );
    }

    /// Where partitions move, each partition's writes are judged alone: one stopped for
    /// longer than a move's budget fails the drill while the region's writes as a whole
    /// never stopped.
    #[test]
    fn a_partition_that_stops_longer_than_a_move_fails_the_drill() {
        let mut ops = Vec::new();
        for t in 0..30 {
            for key in ["trips/a", "trips/b"] {
                if key == "trips/b" && (11..18).contains(&t) {
                    let mut refused = op(Kind::Write, "us-east-1", key, t, Outcome::Info);
                    refused.error = Some("Unavailable: partition 1 is moving".into());
                    ops.push(refused);
                } else {
                    ops.push(op(Kind::Write, "us-east-1", key, t, Outcome::Ok));
                }
            }
            ops.push(op(Kind::OwnedWrite, "us-east-1", "surge/k", t, Outcome::Ok));
            ops.push(op(Kind::Read, "us-east-1", "trips/a", t, Outcome::Ok));
        }
        let acked = |key: &str| {
            let writes = ops.iter().filter(|o| o.kind == Kind::Write && o.key == key);
            writes.filter(|o| o.outcome == Outcome::Ok).count() as i64
        };
        let finals = ["trips/a", "trips/b"]
            .map(|k| {
                (
                    k.to_string(),
                    BTreeMap::from([("us-east-1".to_string(), acked(k))]),
                )
            })
            .into_iter()
            .collect();
        let args = Args::parse_from(["chaos", "scale-out-under-load"]);
        let fault = Fault {
            target: "us-east-1".into(),
            affected: vec![],
            owned_budget: None,
            partitions: BTreeMap::from([("trips/a".into(), 0), ("trips/b".into(), 1)]),
            failovers: None,
        };
        let s = 1_000_000_000;
        let regions = ["us-east-1".to_string()];
        let run = DrillRun {
            regions: &regions,
            fault: &fault,
            ops: &ops,
            finals: &finals,
            convergence: Some(Duration::from_millis(300)),
            fault_ns: 10 * s,
            heal_ns: 25 * s,
            end_ns: 30 * s,
            alerts: None,
            ledger: Vec::new(),
        };
        let report = Report::new(&args, &run);
        assert_eq!(
            report.failures,
            // its last write before the stop at 10 s, the next at 18 s; what the seven
            // calls in between answered
            vec![
                "RTO of writes in us-east-1, partition 1: 8000 ms from 10.0 s, budget 5000 ms; answered within it: 7 × Unavailable: partition 1 is moving"
                    .to_string()
            ]
        );
    }

    #[test]
    fn a_drill_without_loss_gap_or_disagreement_passes() {
        let (ops, finals) = steady(None);
        let report = judged(&ops, &finals);
        assert!(report.pass, "{:?}", report.failures);
        assert_eq!(report.rpo_lost_writes, 0);
    }

    #[test]
    fn a_lost_increment_and_a_gap_where_the_fault_did_not_hit_fail_the_drill() {
        let (mut ops, finals) = steady(Some(5));
        // eu-west-1, which the fault left alone, stops writing for 5 s
        ops.retain(|o| {
            !(o.kind == Kind::Write
                && o.region == "eu-west-1"
                && (11..16).contains(&(o.start_ns / 1_000_000_000)))
        });
        let finals = finals
            .into_iter()
            .map(|(k, by)| (k, by.into_iter().map(|(r, v)| (r, v - 5)).collect()))
            .collect();
        let report = judged(&ops, &finals);
        assert!(!report.pass);
        assert!(
            report
                .failures
                .iter()
                .any(|f| f.starts_with("RPO: 1 acknowledged")),
            "{:?}",
            report.failures
        );
        assert!(
            report
                .failures
                .iter()
                .any(|f| f.starts_with("counters off: trips/k: 55 acknowledged")),
            "the key is named: {:?}",
            report.failures
        );
        assert!(
            report
                .failures
                .iter()
                .any(|f| f.starts_with("RTO of writes in eu-west-1")),
            "{:?}",
            report.failures
        );
    }
}
