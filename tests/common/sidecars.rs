//! User function sidecars for the tests and the benchmark: the SDK examples (and a faulty
//! sidecar) started as processes, and the pricer's client of one once it serves.
#![allow(dead_code)] // each user its part

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use geostate::config::Formula;
use geostate::function::Sidecar;
use geostate::pb;

use super::repo_file;

/// A sidecar process, killed when dropped.
pub struct Process(pub Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The Python virtualenv with the SDK installed (`clients/python/check.py --install`).
pub fn python() -> anyhow::Result<PathBuf> {
    let out = Command::new("python3")
        .arg(repo_file("clients/python/check.py"))
        .arg("--install")
        .stderr(Stdio::inherit())
        .output()?;
    ensure!(out.status.success(), "check.py --install: {}", out.status);
    Ok(PathBuf::from(String::from_utf8(out.stdout)?.trim()))
}

/// The Go surge example, built into `dir`.
pub fn go_surge(dir: &Path) -> anyhow::Result<PathBuf> {
    let bin = dir.join("surgefunction");
    let status = Command::new("go")
        .args(["build", "-o"])
        .arg(&bin)
        .arg("./examples/surgefunction")
        .current_dir(repo_file("clients/go"))
        .status()?;
    ensure!(status.success(), "go build: {status}");
    Ok(bin)
}

/// How to start one sidecar listening at an address.
pub enum Runs {
    Python(PathBuf, PathBuf),
    Go(PathBuf),
}

impl Runs {
    pub fn python_example(python: &Path) -> Self {
        Self::Python(
            python.to_owned(),
            repo_file("clients/python/examples/surge_function.py"),
        )
    }

    pub fn faulty(python: &Path) -> Self {
        Self::Python(
            python.to_owned(),
            repo_file("clients/python/tests/faulty_function.py"),
        )
    }

    /// Starts it at `listen` (`unix:///path` or `host:port`) with `args`.
    pub fn start(&self, listen: &str, args: &[&str]) -> anyhow::Result<Process> {
        let mut command = match self {
            Self::Python(python, script) => {
                let mut c = Command::new(python);
                c.arg(script).arg("--listen").arg(listen);
                c
            }
            Self::Go(bin) => {
                let mut c = Command::new(bin);
                c.arg("-listen").arg(listen);
                c
            }
        };
        let child = command.args(args).stdin(Stdio::null()).spawn()?;
        Ok(Process(child))
    }
}

/// The pricer's client of the sidecar at `addr` (`unix:///path` or `http://host:port`),
/// once it answers `Describe` (within 30 s).
pub async fn ready(
    addr: &str,
    timeout: Duration,
) -> anyhow::Result<(Sidecar, pb::DescribeResponse)> {
    let sidecar = Sidecar::new("surge", addr, timeout)?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match sidecar.describe().await {
            Ok(described) => return Ok((sidecar, described)),
            Err(e) if Instant::now() > deadline => bail!("{addr} not serving after 30 s: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// One case of the conformance suite (`clients/conformance/surge.json`): the formula's
/// parameters, one call's inputs, the values every implementation answers.
pub struct Case {
    pub formula: Formula,
    pub inputs: Vec<pb::FunctionInput>,
    pub expected: Vec<i64>,
}

pub fn conformance() -> anyhow::Result<Vec<Case>> {
    let text = std::fs::read_to_string(repo_file("clients/conformance/surge.json"))?;
    let suite: serde_json::Value = serde_json::from_str(&text)?;
    let cases = suite["cases"].as_array().context("cases")?;
    let number = |v: &serde_json::Value| v.as_f64().context("a number");
    cases
        .iter()
        .map(|case| {
            let p = &case["params"];
            let formula = Formula {
                threshold: number(&p["threshold"])?,
                slope: number(&p["slope"])?,
                max: number(&p["max"])?,
                step: number(&p["step"])?,
            };
            let inputs = serde_json::from_value::<Vec<serde_json::Value>>(case["inputs"].clone())?
                .into_iter()
                .map(|i| pb::FunctionInput {
                    key: i["key"].as_str().unwrap_or_default().to_owned(),
                    window_start_ms: i["window_start_ms"].as_u64().unwrap_or_default(),
                    window_end_ms: i["window_end_ms"].as_u64().unwrap_or_default(),
                    values: serde_json::from_value(i["values"].clone()).unwrap_or_default(),
                })
                .collect();
            let expected = serde_json::from_value(case["expected"].clone())?;
            Ok(Case {
                formula,
                inputs,
                expected,
            })
        })
        .collect()
}
