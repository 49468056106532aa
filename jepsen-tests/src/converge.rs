//! After the faults are healed: every key read in every region until the regions agree and
//! each has heard from every other since the clients stopped (`Admin/Status`: a remote's
//! heartbeats on every partition sent after that moment were merged), so an agreement is
//! never a coincidence of writes still on their way in both directions.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use geostate_jepsen::control::{grpc, not_heard_since, now_nanos, read_cluster};
use geostate_jepsen::history::Stamp;
use geostate_jepsen::windowed;
use geostate_proto::pb;
use geostate_proto::pb::state_client::StateClient;

use crate::client::{list_value, register_value, stamp};

/// One key's final read in one region.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct FinalRead {
    /// A counter, or a register holding an integer.
    pub(crate) value: Option<i64>,
    /// A register holding a list (`owned-append`).
    pub(crate) list: Vec<i64>,
    pub(crate) stamp: Option<Stamp>,
}

/// The final read of every key in every region: key → region → read.
pub(crate) type Finals = BTreeMap<String, BTreeMap<String, FinalRead>>;

/// Whether every key reads the same in every region.
fn agreed(finals: &Finals) -> bool {
    finals.values().all(|by_region| {
        let mut seen = by_region.values();
        let first = seen.next();
        seen.all(|v| Some(v) == first)
    })
}

/// Windowed workload: every window starting in `[from, to)` of every key that is final in
/// every region, read in every region until every such window is final everywhere and
/// the regions agree on each (or `within` passes), under [`windowed::window_key`]. The
/// run's closing adds move every watermark past the range, so a window still open in a
/// region only waits for replication (MirrorMaker 2 restarted late in the run, say).
pub(crate) async fn windows(
    cluster_json: &Path,
    regions: &[String],
    keys: &[String],
    (from_ms, to_ms): (u64, u64),
    within: Duration,
) -> anyhow::Result<Finals> {
    let cluster = read_cluster(cluster_json)?;
    let deadline = Instant::now() + within;
    loop {
        let mut finals: Finals = BTreeMap::new();
        let mut not_final: BTreeMap<String, usize> = BTreeMap::new();
        for region in regions {
            let mut state = StateClient::connect(grpc(&cluster.regions[region])?).await?;
            let values = state
                .batch_get(pb::BatchGetRequest {
                    keys: keys.to_vec(),
                    window: Some(pb::WindowSelector {
                        which: Some(pb::window_selector::Which::Range(pb::WindowRange {
                            from_ms,
                            to_ms,
                        })),
                    }),
                })
                .await?
                .into_inner();
            for v in values.values {
                let Some(w) = v.window else { continue };
                let key = windowed::window_key(&v.key, w.start_ms);
                if !w.is_final {
                    *not_final.entry(key).or_default() += 1;
                    continue;
                }
                let value = match v.value {
                    Some(pb::value::Value::Counter(n)) => Some(n),
                    _ => None,
                };
                let read = FinalRead {
                    value,
                    list: Vec::new(),
                    stamp: None,
                };
                finals.entry(key).or_default().insert(region.clone(), read);
            }
        }
        // judged only where final in every region, once no region holds one open
        let open = !not_final.is_empty();
        finals.retain(|k, by| !not_final.contains_key(k) && by.len() == regions.len());
        if (!open && agreed(&finals)) || Instant::now() > deadline {
            return Ok(finals);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Reads every key in every region until all regions agree (or `within` passes).
pub(crate) async fn converge(
    cluster_json: &Path,
    regions: &[String],
    keys: &[String],
    within: Duration,
) -> anyhow::Result<(Finals, Vec<String>)> {
    let cluster = read_cluster(cluster_json)?;
    let deadline = Instant::now() + within;
    // every acknowledged write was applied before now: a region holds all of another's
    // once it merged that region's heartbeats sent since (equal reads alone can be a
    // coincidence of writes still on their way in both directions)
    let barrier = now_nanos();
    let (mut reads, mut early) = (0, None);
    loop {
        let mut finals: Finals = BTreeMap::new();
        for region in regions {
            let mut state = StateClient::connect(grpc(&cluster.regions[region])?).await?;
            let values = state
                .batch_get(pb::BatchGetRequest {
                    keys: keys.to_vec(),
                    window: None,
                })
                .await?
                .into_inner();
            for v in values.values {
                let read = FinalRead {
                    value: match &v.value {
                        Some(pb::value::Value::Counter(n)) => Some(*n),
                        _ => register_value(&v),
                    },
                    list: list_value(&v),
                    stamp: v.stamp.as_ref().map(stamp),
                };
                finals
                    .entry(v.key.clone())
                    .or_default()
                    .insert(region.clone(), read);
            }
            for missing in values.missing {
                let read = FinalRead {
                    value: None,
                    list: Vec::new(),
                    stamp: None,
                };
                finals
                    .entry(missing)
                    .or_default()
                    .insert(region.clone(), read);
            }
        }
        reads += 1;
        let agreed = agreed(&finals);
        // read after the values: what they heard of each other by then, at least
        let behind = if agreed {
            not_heard_since(&cluster, regions, barrier).await?
        } else {
            Vec::new()
        };
        if agreed && behind.is_empty() {
            println!(
                "converged: read {reads} times, {} ms after the clients stopped",
                now_nanos().saturating_sub(barrier) / 1_000_000
            );
            if let Some((at, early)) = early.filter(|(_, e)| *e != finals) {
                println!("the regions had agreed at read {at} on other values: {early:?}");
            }
            return Ok((finals, Vec::new()));
        }
        if agreed && early.is_none() {
            println!(
                "read {reads}: the regions agree, but not on everything yet: {}",
                behind.join("; ")
            );
            early = Some((reads, finals.clone()));
        }
        if Instant::now() > deadline {
            // disagreeing reads are the checker's to report
            let problems = behind
                .into_iter()
                .map(|b| format!("{b} within {} s of the run's end", within.as_secs()))
                .collect();
            return Ok((finals, problems));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The outputs topic every region's nodes produce final windows to (the region files').
const OUTPUTS_TOPIC: &str = "geostate.outputs";

/// Per region, the records of its outputs topic for keys starting with `prefix`, read
/// `read_committed` from the beginning to the end of every partition, once at least
/// `wanted` are there (a window final at the end goes out in the next shipping round) or
/// `within` passed.
pub(crate) async fn outputs(
    cluster_json: &Path,
    regions: &[String],
    prefix: &str,
    wanted: usize,
    within: Duration,
) -> anyhow::Result<BTreeMap<String, Vec<windowed::Output>>> {
    use rdkafka::Message;
    use rdkafka::consumer::{Consumer, StreamConsumer};
    use rdkafka::error::KafkaError;
    let cluster = read_cluster(cluster_json)?;
    let until = Instant::now() + within;
    let mut all = BTreeMap::new();
    for region in regions {
        let kafka = &cluster.regions[region].kafka;
        let partitions = {
            let probe: StreamConsumer = crate::control::kafka_config(kafka).create()?;
            let metadata = probe.fetch_metadata(Some(OUTPUTS_TOPIC), Duration::from_secs(10))?;
            metadata
                .topics()
                .first()
                .map_or(0, |t| t.partitions().len())
        };
        let consumer: StreamConsumer = crate::control::kafka_config(kafka)
            .set("group.id", format!("jepsen-outputs-{}", std::process::id()))
            .set("auto.offset.reset", "earliest")
            .set("isolation.level", "read_committed")
            .set("enable.partition.eof", "true")
            .create()?;
        consumer.subscribe(&[OUTPUTS_TOPIC])?;
        let (mut found, mut at_end) = (Vec::new(), std::collections::BTreeSet::new());
        while (found.len() < wanted || at_end.len() < partitions) && Instant::now() < until {
            let left = until.saturating_duration_since(Instant::now());
            let Ok(next) = tokio::time::timeout(left, consumer.recv()).await else {
                break;
            };
            match next {
                Ok(message) => {
                    at_end.remove(&message.partition());
                    let Some(payload) = message.payload() else {
                        continue;
                    };
                    // other namespaces' outputs (a price is no count) are not the run's
                    let record: serde_json::Value = serde_json::from_slice(payload)?;
                    let key = record.get("key").and_then(|k| k.as_str()).unwrap_or("");
                    if key.starts_with(prefix) {
                        found.push(serde_json::from_value(record)?);
                    }
                }
                Err(KafkaError::PartitionEOF(p)) => {
                    at_end.insert(p);
                }
                Err(e) => return Err(e.into()),
            }
        }
        all.insert(region.clone(), found);
    }
    Ok(all)
}

/// The rows of the cluster's PostgreSQL table (`geostate_outputs`, written by each
/// region's `geostate sink postgres`) for keys starting with `prefix`, once at least
/// `wanted` are there or `within` passed; `None` if the cluster runs no PostgreSQL.
pub(crate) async fn table(
    cluster_json: &Path,
    prefix: &str,
    wanted: usize,
    within: Duration,
) -> anyhow::Result<Option<Vec<windowed::Output>>> {
    let cluster = read_cluster(cluster_json)?;
    let Some(pg) = cluster.postgres else {
        return Ok(None);
    };
    let (client, connection) = tokio_postgres::connect(&pg.url, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    let until = Instant::now() + within;
    loop {
        let rows = client
            .query(
                "SELECT key, window_start_ms, window_end_ms, value::int8, region
                 FROM geostate_outputs WHERE starts_with(key, $1)",
                &[&prefix],
            )
            .await?;
        if rows.len() >= wanted || Instant::now() > until {
            return Ok(Some(
                rows.iter()
                    .map(|r| windowed::Output {
                        key: r.get(0),
                        start_ms: r.get::<_, i64>(1) as u64,
                        end_ms: r.get::<_, i64>(2) as u64,
                        value: r.get(3),
                        region: r.get(4),
                    })
                    .collect(),
            ));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
