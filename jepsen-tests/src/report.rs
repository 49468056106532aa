//! The verdict and the run's outputs. [`verdict`] is pure: the history, the faults and the
//! final reads in, the anomalies out; [`write`] records everything and prints the summary.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use geostate_jepsen::history::{Event, EventType};
use geostate_jepsen::{append, availability, counter, fencing, lww, register, windowed};
use serde::Serialize;

use crate::converge::{FinalRead, Finals};
use crate::nemesis::Fault;
use crate::{Args, Nemesis, Workload};

/// What the checkers found.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Verdict {
    pub(crate) anomalies: Vec<String>,
    /// Keys whose owned-register history (leaseholder reads, writes, compare-and-sets)
    /// has no linearization; each is also an anomaly.
    pub(crate) not_linearizable: Vec<String>,
}

impl Verdict {
    pub(crate) fn valid(&self) -> bool {
        self.anomalies.is_empty()
    }
}

/// Every check the workload calls for: each requested fault fired, the regions agree on
/// every key, and the workload's own checkers.
pub(crate) fn verdict(
    workload: Workload,
    requested: &[Nemesis],
    history: &[Event],
    faults: &[Fault],
    finals: &Finals,
) -> Verdict {
    let mut v = Verdict::default();
    for requested in requested {
        if !faults.iter().any(|f| f.nemesis == *requested) {
            v.anomalies
                .push(format!("coverage: {requested:?} never fired"));
        }
    }
    for (key, by_region) in finals {
        let mut values = by_region.values();
        let first = values.next();
        if !values.all(|r| Some(r) == first) {
            v.anomalies
                .push(format!("{key}: regions disagree: {by_region:?}"));
        }
    }
    if workload.counter() {
        v.anomalies.extend(counters(history, finals));
    }
    if workload.windowed() {
        if finals.is_empty() {
            v.anomalies
                .push("coverage: no window was final in every region: nothing checked".into());
        }
        v.anomalies
            .extend(windowed::check(history, &values(finals), crate::WINDOW_MS));
    }
    if workload.owned() {
        for f in fencing::check(history) {
            v.anomalies
                .push(format!("shard {}: {:?}: {}", f.shard, f.kind, f.detail));
        }
    }
    v.anomalies.extend(registers(workload, history, finals));
    if workload == Workload::OwnedRegister {
        v.not_linearizable = register::check(history)
            .into_iter()
            .map(|n| format!("{} ({} operations)", n.key, n.operations))
            .collect();
        let keys = v.not_linearizable.iter();
        let found: Vec<String> = keys.map(|k| format!("not linearizable: {k}")).collect();
        v.anomalies.extend(found);
    }
    v
}

/// Every final read's counter value: key → region → value.
pub(crate) fn values(finals: &Finals) -> BTreeMap<String, BTreeMap<String, i64>> {
    finals
        .iter()
        .map(|(k, by)| {
            let reads = by.iter().map(|(r, f)| (r.clone(), f.value.unwrap_or(0)));
            (k.clone(), reads.collect())
        })
        .collect()
}

fn counters(history: &[Event], finals: &Finals) -> Vec<String> {
    counter::check(history, &values(finals))
        .into_iter()
        .flat_map(|verdict| {
            let key = verdict.key;
            verdict
                .problems
                .into_iter()
                .map(move |p| format!("{key}: {p}"))
        })
        .collect()
}

/// The register checkers: last writer wins, and for lists every acknowledged append kept.
fn registers(workload: Workload, history: &[Event], finals: &Finals) -> Vec<String> {
    // every region agrees (checked first), so one region's read stands for all
    let agreed: Vec<(&String, &FinalRead)> = finals
        .iter()
        .filter_map(|(k, by)| Some((k, by.values().next()?)))
        .collect();
    // each register's final value (as the checker reads it) and order stamp
    let finals_of = |value: fn(&FinalRead) -> Option<i64>| -> BTreeMap<String, lww::Final> {
        agreed
            .iter()
            .map(|(k, r)| ((*k).clone(), (value(r), r.stamp.clone())))
            .collect()
    };
    match workload {
        Workload::SharedRegister | Workload::OwnedRegister => {
            lww::check(history, &finals_of(|r| r.value))
        }
        Workload::OwnedAppend => {
            // a list's stamps, not its value: the elements are checked by append::check
            let mut found = lww::check(history, &finals_of(|_| None));
            let lists = agreed
                .iter()
                .map(|(k, r)| ((*k).clone(), r.list.clone()))
                .collect();
            found.extend(append::check(history, &lists));
            found
        }
        Workload::PnCounter | Workload::GCounter | Workload::WindowedCounter => Vec::new(),
    }
}

#[derive(Serialize)]
struct Results<'a> {
    workload: Workload,
    nemesis: &'a [Nemesis],
    seed: u64,
    seconds: u64,
    operations: usize,
    ok: usize,
    fail: usize,
    info: usize,
    faults: &'a [Fault],
    /// Per fault, in order: what it cost each region's writes and writes anywhere.
    availability: Vec<Vec<availability::Window>>,
    anomalies: &'a [String],
    not_linearizable: &'a [String],
    valid: bool,
}

/// Writes `history.jsonl`, `nemesis.jsonl`, `results.json` and `summary.md` to the run's
/// folder and prints the summary; answers whether the run was valid.
pub(crate) fn write(
    args: &Args,
    history: &[Event],
    faults: &[Fault],
    finals: &Finals,
    outputs: Vec<String>,
) -> anyhow::Result<bool> {
    // the history first: a checker may take long
    json_lines(&args.out.join("history.jsonl"), history)?;
    json_lines(&args.out.join("nemesis.jsonl"), faults)?;
    let mut verdict = verdict(args.workload, &args.nemesis, history, faults, finals);
    // the outputs topics' check (`windowed::check_outputs`), done where they were read
    verdict.anomalies.extend(outputs);
    let regions: Vec<String> = finals
        .values()
        .flat_map(|by_region| by_region.keys().cloned())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let windows: Vec<Vec<availability::Window>> = faults
        .iter()
        .map(|f| availability::during(history, &regions, f.start_ns, f.end_ns))
        .collect();
    let count = |k: EventType| history.iter().filter(|e| e.kind == k).count();
    let table = availability_table(faults, &windows);
    let results = Results {
        workload: args.workload,
        nemesis: &args.nemesis,
        seed: args.seed,
        seconds: args.seconds,
        operations: count(EventType::Invoke),
        ok: count(EventType::Ok),
        fail: count(EventType::Fail),
        info: count(EventType::Info),
        faults,
        availability: windows,
        anomalies: &verdict.anomalies,
        not_linearizable: &verdict.not_linearizable,
        valid: verdict.valid(),
    };
    std::fs::write(
        args.out.join("results.json"),
        serde_json::to_string_pretty(&results)? + "\n",
    )?;
    let mut summary = summary(args, &results, &verdict, faults);
    if args.workload.windowed() {
        summary += &format!(
            "windows final in every region, checked: {} (key, window) pairs\n\n",
            finals.len()
        );
    }
    let summary = summary + &table;
    std::fs::write(args.out.join("summary.md"), &summary)?;
    print!("{summary}");
    Ok(verdict.valid())
}

fn json_lines<T: Serialize>(path: &Path, items: &[T]) -> anyhow::Result<()> {
    let mut lines = String::new();
    for item in items {
        lines.push_str(&serde_json::to_string(item)?);
        lines.push('\n');
    }
    Ok(std::fs::write(path, lines)?)
}

fn summary(args: &Args, results: &Results<'_>, verdict: &Verdict, faults: &[Fault]) -> String {
    let faults = faults
        .iter()
        .map(|f| {
            let lasted = (f.end_ns - f.start_ns) as f64 / 1e9;
            format!("{:?} on {} ({lasted:.1} s)", f.nemesis, f.target)
        })
        .collect::<Vec<_>>()
        .join(", ");
    let anomalies: String = verdict
        .anomalies
        .iter()
        .map(|a| format!("- {a}\n"))
        .collect();
    let linearizability = match (args.workload, verdict.not_linearizable.is_empty()) {
        (Workload::OwnedRegister, true) => {
            "\nowned-register linearizability: every key linearizable\n".to_string()
        }
        (Workload::OwnedRegister, false) => format!(
            "\nowned-register linearizability: no linearization for {}\n",
            verdict.not_linearizable.join(", ")
        ),
        _ => String::new(),
    };
    format!(
        "# jepsen run: {:?} workload, nemesis {:?}, seed {}, {} s\n\n\
         {} operations: {} ok, {} fail, {} info (indeterminate)\n\n\
         faults: {faults}\n\n\
         verdict: **{}**\n\n{anomalies}{linearizability}",
        args.workload,
        args.nemesis,
        args.seed,
        args.seconds,
        results.operations,
        results.ok,
        results.fail,
        results.info,
        if verdict.valid() {
            "valid"
        } else {
            "ANOMALIES"
        },
    )
}

/// Per fault and scope: the longest stretch without an acknowledged write.
fn availability_table(faults: &[Fault], windows: &[Vec<availability::Window>]) -> String {
    if faults.is_empty() {
        return String::new();
    }
    let mut table = String::from(
        "\n| fault | target | at | lasted | scope | longest stretch without an acknowledged write | writes during the fault ok / fail / info |\n|---|---|---:|---:|---|---:|---|\n",
    );
    for (f, ws) in faults.iter().zip(windows) {
        for w in ws {
            table.push_str(&format!(
                "| {:?} | {} | {:.1} s | {:.1} s | {} | {:.0} ms | {} / {} / {} |\n",
                f.nemesis,
                f.target,
                f.start_ns as f64 / 1e9,
                (f.end_ns - f.start_ns) as f64 / 1e9,
                w.scope,
                w.longest_gap_ms,
                w.ok,
                w.fail,
                w.info
            ));
        }
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(value: i64) -> FinalRead {
        FinalRead {
            value: Some(value),
            list: Vec::new(),
            stamp: None,
        }
    }

    fn finals(by_region: &[(&str, i64)]) -> Finals {
        let reads = by_region.iter().map(|(r, v)| (r.to_string(), read(*v)));
        BTreeMap::from([("trips/k".to_string(), reads.collect())])
    }

    fn fault(nemesis: Nemesis) -> Fault {
        Fault {
            nemesis,
            target: "us-east-1".into(),
            start_ns: 0,
            end_ns: 1,
        }
    }

    #[test]
    fn a_quiet_run_that_agrees_is_valid() {
        let agreed = finals(&[("eu-west-1", 0), ("us-east-1", 0)]);
        let v = verdict(
            Workload::PnCounter,
            &[Nemesis::Kill],
            &[],
            &[fault(Nemesis::Kill)],
            &agreed,
        );
        assert_eq!(v, Verdict::default());
        assert!(v.valid());
    }

    #[test]
    fn regions_that_disagree_and_a_fault_that_never_fired_are_anomalies() {
        let split = finals(&[("eu-west-1", 1), ("us-east-1", 2)]);
        let v = verdict(
            Workload::PnCounter,
            &[Nemesis::Kill, Nemesis::Mirror],
            &[],
            &[fault(Nemesis::Kill)],
            &split,
        );
        assert!(!v.valid());
        assert!(
            v.anomalies
                .iter()
                .any(|a| a == "coverage: Mirror never fired"),
            "{v:?}"
        );
        assert!(
            v.anomalies
                .iter()
                .any(|a| a.starts_with("trips/k: regions disagree")),
            "{v:?}"
        );
    }
}
