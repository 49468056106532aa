//! CPU accounting (/proc) and pinning (`taskset`): rates per CPU-second, progress probes,
//! peer processes.
//! Shared by the benchmarks that measure a system beside its peers (`benches/node`,
//! `benches/windows.rs`).
#![allow(dead_code)] // each benchmark uses its part

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use serde_json::{Value, json};

use crate::common::Node;

/// The core the system under test runs on where there are two or more; the rest runs on
/// core 0 (`scripts/bench.sh` pins the cluster).
pub(crate) const SUT_CORE: &str = "1";

/// A rate measured by following a system's progress: from the first sample that shows
/// progress to the first that shows all of it, so start-up is left out.
#[derive(Clone, Copy, Default)]
pub(crate) struct Rate {
    pub(crate) events_per_second: f64,
    pub(crate) per_cpu_second: f64,
}

impl Rate {
    pub(crate) fn of(events: usize, took: Duration, cpu: f64) -> Self {
        Self {
            events_per_second: events as f64 / took.as_secs_f64().max(1e-9),
            per_cpu_second: events as f64 / cpu.max(1e-9),
        }
    }
    pub(crate) fn json(&self) -> Value {
        json!({
            "events_per_second": self.events_per_second.round(),
            "events_per_cpu_second": self.per_cpu_second.round(),
        })
    }
}

pub(crate) use crate::common::cpu_seconds;

/// A child process killed when dropped.
pub(crate) struct Peer(pub(crate) Child);

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Whether process `pid` exists and has not exited (a child nobody waited for yet stays a
/// zombie: state `Z`).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        let state = stat
            .rsplit(')')
            .next()
            .and_then(|rest| rest.split_whitespace().next());
        !matches!(state, Some("Z" | "X"))
    })
}

/// The machine's online cores (not this process's affinity: `scripts/bench.sh` starts the
/// benchmark on core 0 alone).
pub(crate) fn cores() -> usize {
    std::fs::read_to_string("/proc/cpuinfo")
        .map(|c| c.lines().filter(|l| l.starts_with("processor")).count())
        .unwrap_or(1)
        .max(1)
}

/// (busy, total) jiffies of core `n` so far, from /proc/stat.
pub(crate) fn core_jiffies(n: usize) -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = stat
        .lines()
        .find(|l| l.split_whitespace().next() == Some(&format!("cpu{n}")))
    else {
        return (0, 0);
    };
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    (total - idle, total)
}

/// Whether the system under test gets a core of its own.
pub(crate) fn pinning() -> bool {
    cores() >= 2
        && Command::new("taskset")
            .arg("-V")
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
}

/// Moves every thread of `pid` to `cores` (a `taskset` list).
pub(crate) fn pin(pid: u32, cores: &str) -> anyhow::Result<()> {
    if !pinning() {
        return Ok(());
    }
    // `taskset -a` fails where a thread exits while it walks them (a starting node spawns
    // short-lived ones): walk again.
    for _ in 0..20 {
        let status = Command::new("taskset")
            .args(["-a", "-p", "-c", cores, &pid.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()?;
        if status.success() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("taskset -a -p -c {cores} {pid} kept failing")
}

/// A command that runs on the system under test's core.
pub(crate) fn on_sut_core(program: &str) -> Command {
    if pinning() {
        let mut c = Command::new("taskset");
        c.args(["-c", SUT_CORE, program]);
        c
    } else {
        Command::new(program)
    }
}

/// How far a system got through a topic.
pub(crate) enum Probe<'a> {
    /// The node's applied offsets (its offsets live in RocksDB, not in Kafka).
    Node(&'a Node),
    /// The offsets a consumer group committed.
    Group(Arc<BaseConsumer>, TopicPartitionList),
}

impl Probe<'_> {
    pub(crate) fn group(
        kafka: &str,
        group: &str,
        topic: &str,
        partitions: i32,
    ) -> anyhow::Result<Self> {
        let consumer: BaseConsumer = geostate_jepsen::control::kafka_config(kafka)
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .create()?;
        let mut tpl = TopicPartitionList::new();
        for p in 0..partitions {
            tpl.add_partition(topic, p);
        }
        Ok(Probe::Group(Arc::new(consumer), tpl))
    }

    pub(crate) async fn progress(&self) -> anyhow::Result<usize> {
        match self {
            Probe::Node(node) => Ok(node
                .status()
                .await?
                .partitions
                .iter()
                .map(|p| (p.applied_offset + 1).max(0) as usize)
                .sum()),
            Probe::Group(consumer, tpl) => {
                let (consumer, tpl) = (consumer.clone(), tpl.clone());
                tokio::task::spawn_blocking(move || {
                    let committed = consumer.committed_offsets(tpl, Duration::from_secs(10))?;
                    Ok(committed
                        .elements()
                        .iter()
                        .map(|e| match e.offset() {
                            Offset::Offset(o) => o.max(0) as usize,
                            _ => 0,
                        })
                        .sum())
                })
                .await?
            }
        }
    }

    /// Follows progress until all `events` records are done; `pids` are the processes whose
    /// CPU time is counted. A process that exits before fails the measurement.
    pub(crate) async fn follow(
        &self,
        pids: &[u32],
        events: usize,
        deadline: Duration,
    ) -> anyhow::Result<Rate> {
        Ok(self.follow_beside(pids, &[], events, deadline).await?.0)
    }

    /// [`Self::follow`], and the CPU-seconds per event the `beside` processes (those
    /// serving the system, such as its Kafka broker) took over the same span.
    pub(crate) async fn follow_beside(
        &self,
        pids: &[u32],
        beside: &[u32],
        events: usize,
        deadline: Duration,
    ) -> anyhow::Result<(Rate, f64)> {
        let cpu = |pids: &[u32]| pids.iter().map(|&p| cpu_seconds(p)).sum::<f64>();
        let until = Instant::now() + deadline;
        let mut first: Option<(Instant, usize, f64, f64)> = None;
        loop {
            let done = self.progress().await.unwrap_or(0);
            let now = (Instant::now(), done, cpu(pids), cpu(beside));
            if done > 0 && first.is_none() {
                first = Some(now);
            }
            if done >= events {
                let (t0, done0, cpu0, beside0) = first.unwrap_or(now);
                let measured = done - done0;
                let rate = Rate::of(measured, now.0 - t0, now.2 - cpu0);
                return Ok((rate, (now.3 - beside0) / measured.max(1) as f64));
            }
            if let Some(gone) = pids.iter().find(|&&p| !running(p)) {
                bail!("process {gone} exited after {done} of {events} records");
            }
            if Instant::now() > until {
                bail!("{done} of {events} records done within {deadline:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The cluster's processes but `keep` (their names in its `pids/` folder) stopped while
/// this lives (SIGSTOP), continued when it is dropped: a measurement's core is then
/// shared only with what serves the system under test.
pub(crate) struct Paused(Vec<u32>);

impl Paused {
    pub(crate) fn cluster_but(keep: &[&str]) -> anyhow::Result<Self> {
        let mut paused = Self(Vec::new());
        for entry in std::fs::read_dir(crate::common::run_dir()?.join("pids"))? {
            let entry = entry?;
            if keep.contains(&entry.file_name().to_string_lossy().as_ref()) {
                continue;
            }
            let Ok(pid) = std::fs::read_to_string(entry.path())?.trim().parse::<u32>() else {
                continue;
            };
            if running(pid) {
                signal(pid, "STOP")?;
                paused.0.push(pid);
            }
        }
        Ok(paused)
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        for pid in &self.0 {
            let _ = signal(*pid, "CONT");
        }
    }
}

fn signal(pid: u32, signal: &str) -> anyhow::Result<()> {
    let status = Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()?;
    if !status.success() {
        bail!("kill -{signal} {pid}: {status}");
    }
    Ok(())
}
