//! The steady load: clients of each kind in every region through the public gRPC API,
//! every operation recorded with its outcome; the convergence marker after the heal; the
//! final counters once the regions agree.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use geostate_jepsen::control::{ClusterFile, grpc, not_heard_since, state_client};
use geostate_proto::pb;
use geostate_proto::workload::Rng;
use serde::Serialize;
use tokio::sync::Mutex;
use tonic::Code;

use crate::SETTLE;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Kind {
    /// `add 1` to a shared g-counter with a unique idempotency id.
    Write,
    /// `set` of an owned register (refused outside the holder's region).
    OwnedWrite,
    Read,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Outcome {
    Ok,
    /// Certainly not applied (refused).
    Fail,
    /// Indeterminate: timed out or unavailable; may have been applied.
    Info,
}

#[derive(Clone, Debug, Serialize)]
pub(crate) struct Op {
    pub(crate) kind: Kind,
    pub(crate) region: String,
    pub(crate) key: String,
    pub(crate) start_ns: u64,
    pub(crate) end_ns: u64,
    pub(crate) outcome: Outcome,
    /// The refusal's or error's status message.
    pub(crate) error: Option<String>,
    /// Where an acknowledged write entered its region's updates topic (partition, offset).
    pub(crate) position: Option<(i32, i64)>,
}

pub(crate) struct Load {
    pub(crate) started: Instant,
    pub(crate) ops: Mutex<Vec<Op>>,
    pub(crate) stop: tokio::sync::watch::Receiver<bool>,
}

impl Load {
    pub(crate) fn now_ns(&self) -> u64 {
        self.started.elapsed().as_nanos() as u64
    }
}

/// The key of a client's `n`-th operation. Writes take the keys in turn: their RTO is
/// judged per key (owned) and per partition (counters, where a partition may hold one key
/// of 8), and a key drawn at random goes unwritten for seconds by chance: measured, one
/// counter key of 8 not drawn by either of a region's two writers for 5.4 s of a loaded
/// drill, which then failed as if its partition had stopped. Reads draw at random.
fn next_key<'k>(kind: Kind, keys: &'k [String], n: u64, rng: &mut Rng) -> &'k str {
    let i = match kind {
        Kind::Write | Kind::OwnedWrite => n % keys.len() as u64,
        Kind::Read => rng.below(keys.len() as u64),
    };
    &keys[i as usize]
}

/// One client loop of one kind in one region until the load stops.
pub(crate) async fn run_client(
    load: Arc<Load>,
    kind: Kind,
    region: String,
    addr: String,
    keys: Vec<String>,
    seed: u64,
) -> anyhow::Result<()> {
    let mut state = state_client(&addr)?;
    let mut rng = Rng(seed);
    let mut n = 0u64;
    let mut stop = load.stop.clone();
    while !*stop.borrow() {
        n += 1;
        // a kind's two clients (consecutive seeds) start half the keys apart
        let turn = n + seed * (keys.len() as u64 / 2);
        let key = next_key(kind, &keys, turn, &mut rng).to_string();
        let start_ns = load.now_ns();
        let result = match kind {
            Kind::Write => state
                .update(pb::UpdateRequest {
                    key: key.clone(),
                    op: Some(pb::update_request::Op::Add(1)),
                    id: format!("{region}-{seed}-{n}"),
                    event_time_ms: 0,
                })
                .await
                .map(|r| r.into_inner().position),
            Kind::OwnedWrite => state
                .update(pb::UpdateRequest {
                    key: key.clone(),
                    op: Some(pb::update_request::Op::Set(n.to_string().into_bytes())),
                    id: String::new(),
                    event_time_ms: 0,
                })
                .await
                .map(|r| r.into_inner().position),
            Kind::Read => match state
                .get(pb::GetRequest {
                    key: key.clone(),
                    ..Default::default()
                })
                .await
            {
                Err(s) if s.code() == Code::NotFound => Ok(None),
                other => other.map(|_| None),
            },
        };
        let outcome = match &result {
            Ok(_) => Outcome::Ok,
            Err(s)
                if matches!(
                    s.code(),
                    Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange
                ) =>
            {
                Outcome::Fail
            }
            Err(_) => Outcome::Info,
        };
        let op = Op {
            kind,
            region: region.clone(),
            key,
            start_ns,
            end_ns: load.now_ns(),
            outcome,
            position: result
                .as_ref()
                .ok()
                .and_then(|p| p.as_ref().map(|p| (p.partition, p.offset))),
            error: result
                .err()
                .map(|s| format!("{:?}: {}", s.code(), s.message())),
        };
        load.ops.lock().await.push(op);
        tokio::select! {
            _ = stop.changed() => {}
            () = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
    }
    Ok(())
}

/// Right after the heal, every region adds 1 to one marker key (retrying until it is
/// acknowledged); the time until every region reads the full count.
pub(crate) async fn converge_marker(
    cluster: &ClusterFile,
    regions: &[String],
    tag: &str,
) -> anyhow::Result<Option<Duration>> {
    let healed = Instant::now();
    let key = format!("trips/{tag}-marker");
    for region in regions {
        let mut state = state_client(&grpc(&cluster.regions[region])?)?;
        let add = pb::UpdateRequest {
            key: key.clone(),
            op: Some(pb::update_request::Op::Add(1)),
            id: format!("marker-{region}"),
            event_time_ms: 0,
        };
        while state.update(add.clone()).await.is_err() {
            if healed.elapsed() > SETTLE {
                return Ok(None);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    for region in regions {
        let mut state = state_client(&grpc(&cluster.regions[region])?)?;
        loop {
            let read = state
                .get(pb::GetRequest {
                    key: key.clone(),
                    ..Default::default()
                })
                .await;
            if read.is_ok_and(|v| counter(&v.into_inner()) == regions.len() as i64) {
                break;
            }
            if healed.elapsed() > SETTLE {
                return Ok(None);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(Some(healed.elapsed()))
}

pub(crate) fn counter(v: &pb::Value) -> i64 {
    match v.value {
        Some(pb::value::Value::Counter(n)) => n,
        _ => 0,
    }
}

/// Every counter in every region once they agree and every node has heard from every
/// other region since `barrier`, when the writers stopped (or after [`SETTLE`]): key →
/// region → value. Equal reads alone can be a coincidence of writes still on their way in
/// both directions.
pub(crate) async fn settle(
    cluster: &ClusterFile,
    regions: &[String],
    keys: &[String],
    barrier: u64,
) -> anyhow::Result<BTreeMap<String, BTreeMap<String, i64>>> {
    let deadline = Instant::now() + SETTLE;
    loop {
        let mut finals: BTreeMap<String, BTreeMap<String, i64>> = BTreeMap::new();
        for region in regions {
            let mut state = state_client(&grpc(&cluster.regions[region])?)?;
            if let Ok(values) = state
                .batch_get(pb::BatchGetRequest {
                    keys: keys.to_vec(),
                    window: None,
                })
                .await
            {
                for v in values.into_inner().values {
                    finals
                        .entry(v.key.clone())
                        .or_default()
                        .insert(region.clone(), counter(&v));
                }
            }
        }
        let equal = finals.len() == keys.len()
            && finals.values().all(|by| {
                by.len() == regions.len() && by.values().all(|v| Some(v) == by.values().next())
            });
        // read after the values: what they heard of each other by then, at least
        let behind = if equal {
            not_heard_since(cluster, regions, barrier).await?
        } else {
            Vec::new()
        };
        if equal && behind.is_empty() {
            return Ok(finals);
        }
        if Instant::now() > deadline {
            if !behind.is_empty() {
                println!("settled after {SETTLE:?} with {}", behind.join("; "));
            }
            return Ok(finals);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every key, so every partition, is written once in any run of as many writes as
    /// there are keys.
    #[test]
    fn writes_take_every_key_in_turn() {
        let keys: Vec<String> = (0..8).map(|i| format!("trips/k{i}")).collect();
        let mut rng = Rng(17);
        for kind in [Kind::Write, Kind::OwnedWrite] {
            let picked: Vec<&str> = (1..=200)
                .map(|n| next_key(kind, &keys, n + 17, &mut rng))
                .collect();
            for run in picked.windows(keys.len()) {
                let distinct: std::collections::BTreeSet<&&str> = run.iter().collect();
                assert_eq!(distinct.len(), keys.len(), "{kind:?}: {run:?}");
            }
        }
    }
}
