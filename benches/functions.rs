//! User functions (`cargo bench --bench functions`, part of `make bench`): prints
//! Markdown, asserts nothing.
//!
//! The pricer's call of the surge function for one batch of final windows, side by side
//! in one run: the built-in formula in-process, and the Python (grpcio) and Go (grpc-go)
//! SDK examples as sidecars on a Unix socket and on loopback TCP, through the pricer's
//! own client ([`geostate::function::Sidecar`]). Per placement: the per-batch call time
//! p50 and p99 over [`CALLS`] calls of [`BATCH`] windows (after [`WARMUP`] calls), and
//! windows per CPU-second of the caller and the sidecar together (`/proc`). The inputs are
//! the conformance suite's, repeated; every answer is checked against the formula.

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use anyhow::ensure;
use common::sidecars::{Runs, conformance, go_surge, python, ready};
use common::{cpu_seconds, percentile};
use geostate::config::Formula;
use geostate::pb;

/// Windows per call (a sweep after a failover prices many geohashes at once; a window
/// closing prices one per geohash with demand).
const BATCH: usize = 100;
const CALLS: usize = 2_000;
const WARMUP: usize = 200;

fn main() -> anyhow::Result<()> {
    common::block_on(run())
}

/// The first case of the conformance suite, its inputs repeated to `BATCH`.
fn batch() -> anyhow::Result<(Formula, Vec<pb::FunctionInput>)> {
    let case = conformance()?.swap_remove(0);
    let inputs = case.inputs.iter().cycle().take(BATCH).cloned().collect();
    Ok((case.formula, inputs))
}

/// One placement's figures: call times (sorted) and CPU-seconds used.
struct Measured {
    name: String,
    calls: Vec<Duration>,
    cpu: f64,
}

impl Measured {
    fn row(&self) -> String {
        let windows = (self.calls.len() * BATCH) as f64;
        format!(
            "| {} | {} | {} | {:.0} |",
            self.name,
            us(percentile(&self.calls, 0.5)),
            us(percentile(&self.calls, 0.99)),
            windows / self.cpu.max(1e-9),
        )
    }
}

fn us(d: Duration) -> String {
    format!("{:.1} µs", d.as_secs_f64() * 1e6)
}

fn formula_values(formula: &Formula, inputs: &[pb::FunctionInput]) -> Vec<i64> {
    inputs
        .iter()
        .map(|i| formula.hundredths(i.values["demand"], i.values["supply"]))
        .collect()
}

async fn run() -> anyhow::Result<()> {
    let (formula, inputs) = batch()?;
    let expected = formula_values(&formula, &inputs);
    let me = std::process::id();
    let mut rows = Vec::new();

    // in-process: the built-in formula, as the pricer runs it without a sidecar
    let mut calls = Vec::with_capacity(CALLS);
    for i in 0..WARMUP + CALLS {
        let started = Instant::now();
        let values = formula_values(&formula, std::hint::black_box(&inputs));
        let took = started.elapsed();
        ensure!(values == expected, "the formula changed its mind");
        if i >= WARMUP {
            calls.push(took);
        }
    }
    calls.sort();
    // a few ms in all, under /proc's 10 ms tick: the calls' own time (busy, no I/O)
    let cpu = calls.iter().sum::<Duration>().as_secs_f64();
    rows.push(Measured {
        name: "in-process (built-in formula)".into(),
        calls,
        cpu,
    });

    let dir = tempfile::tempdir()?;
    let python = python()?;
    let sidecars = [
        ("Python sidecar", Runs::python_example(&python)),
        ("Go sidecar", Runs::Go(go_surge(dir.path())?)),
    ];
    for (name, runs) in &sidecars {
        let sock = dir.path().join("bench.sock");
        let port = common::free_port();
        let places = [
            (
                "Unix socket",
                format!("unix://{}", sock.display()),
                format!("unix://{}", sock.display()),
            ),
            (
                "loopback TCP",
                format!("127.0.0.1:{port}"),
                format!("http://127.0.0.1:{port}"),
            ),
        ];
        for (place, listen, addr) in places {
            let process = runs.start(&listen, &[])?;
            let pid = process.0.id();
            let (sidecar, _) = ready(&addr, Duration::from_secs(5)).await?;
            let mut calls = Vec::with_capacity(CALLS);
            let mut cpu_before = (cpu_seconds(me), cpu_seconds(pid));
            for i in 0..WARMUP + CALLS {
                if i == WARMUP {
                    cpu_before = (cpu_seconds(me), cpu_seconds(pid));
                }
                let started = Instant::now();
                let values = sidecar
                    .compute(&formula.params(), inputs.clone(), |h| formula.in_range(h))
                    .await?;
                let took = started.elapsed();
                ensure!(values == expected, "{name} on {place} answered otherwise");
                if i >= WARMUP {
                    calls.push(took);
                }
            }
            let cpu = (cpu_seconds(me) - cpu_before.0) + (cpu_seconds(pid) - cpu_before.1);
            calls.sort();
            rows.push(Measured {
                name: format!("{name}, {place}"),
                calls,
                cpu,
            });
            drop(process);
        }
    }

    println!("## User functions: the surge function per batch of {BATCH} windows");
    println!();
    println!(
        "{CALLS} calls one after another (after {WARMUP} to warm up), each answer checked against the formula; CPU of the caller and the sidecar together (/proc, 10 ms ticks; in-process: the calls' own time)."
    );
    println!();
    println!("| placement | call p50 | call p99 | windows per CPU-second |");
    println!("|---|---|---|---|");
    for row in &rows {
        println!("{}", row.row());
    }
    Ok(())
}
