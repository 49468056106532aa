//! The node's ingest of a pre-loaded topic, and the ceilings it is compared with.

use super::*;

/// The geostate node over `data`'s topic, exactly-once into RocksDB, on the system under
/// test's core.
pub(crate) async fn geostate(
    kafka: &str,
    data: &Dataset,
    dir: &Path,
) -> anyhow::Result<(Rate, f64)> {
    geostate_on(kafka, data, dir, SUT_CORE, None).await
}

/// The geostate node over `data`'s topic on `cores` (a `taskset` list) from its start, so
/// that its runtime has a worker thread per core; `binary` instead of this build's.
pub(crate) async fn geostate_on(
    kafka: &str,
    data: &Dataset,
    dir: &Path,
    cores: &str,
    binary: Option<&Path>,
) -> anyhow::Result<(Rate, f64)> {
    // the run's own deltas topic (and the rest): a node on an empty data dir restores from
    // its region's deltas topic, so on the dataset's it would start where the last run ended
    let topics = Topics {
        updates: data.topic.updates.clone(),
        ..Topics::create(kafka, "bench-node-run", PARTITIONS).await?
    };
    let mut node = Node::configure(dir, kafka, &topics)?;
    if let Some(binary) = binary {
        node.binary = binary.to_owned();
    }
    if pinning() {
        node.cores = Some(cores.to_owned());
    }
    let pid = node.start().await?;
    pin(pid, cores)?;
    let rate = Probe::Node(&node)
        .follow(&[pid], EVENTS, Duration::from_secs(600))
        .await?;
    let metrics = common::http_get(&node.metrics, "/metrics")?;
    let shipped = metrics
        .lines()
        .find(|l| l.starts_with("geostate_deltas_shipped_total"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0);
    node.kill9();
    Ok((rate, shipped / EVENTS as f64))
}

/// The CRDT core alone: decode, check, apply and delta extraction in batches of `BATCH`,
/// state in a map.
pub(crate) fn apply_in_memory(
    state: &mut BTreeMap<String, CrdtValue>,
    records: Vec<Record>,
    config: &Config,
    actor: &Actor,
) {
    let ctx = BatchContext {
        actor,
        format: RecordFormat::Json,
        namespaces: &config.namespaces,
        limits: &config.ingest,
        origin_time: geostate::clock::HlcTimestamp::new(1, 0),
        lease: None,
        max_clock_offset: config.max_clock_offset,
        grants: None,
        partitions: None,
        out_of_orderness_ms: config.watermark.out_of_orderness.as_millis() as u64,
    };
    let applied = apply_batch(records, state, &ctx).unwrap_or_else(|e| match e {});
    state.extend(applied.states);
}

pub(crate) fn record(i: usize, payload: &[u8]) -> Record {
    Record {
        partition: (i % PARTITIONS as usize) as i32,
        offset: i as i64,
        timestamp_ms: Some(1_700_000_000_000),
        key: None,
        payload: Some(payload.to_vec()),
    }
}

/// Ceilings on the system under test's core: raw consume, the CRDT core in memory, and
/// consume + apply in memory (nothing durable: the path without exactly-once).
pub(crate) async fn ceilings(
    kafka: &str,
    data: &Dataset,
    config: &Config,
) -> anyhow::Result<[Rate; 3]> {
    let me = std::process::id();
    pin(me, SUT_CORE)?;
    let actor = Actor::new(RegionId::new("us-east-1")?, 1);
    let result = async {
        let consumer = |label: &str| -> anyhow::Result<StreamConsumer> {
            let consumer: StreamConsumer = geostate_jepsen::control::kafka_config(kafka)
                .set("group.id", common::unique(label))
                .set("enable.auto.commit", "false")
                .set("fetch.wait.max.ms", "10")
                .create()?;
            let mut tpl = TopicPartitionList::new();
            for p in 0..PARTITIONS {
                tpl.add_partition_offset(&data.topic.updates, p, Offset::Beginning)?;
            }
            consumer.assign(&tpl)?;
            Ok(consumer)
        };

        let raw = consumer("bench-raw")?;
        let (started, cpu) = (Instant::now(), cpu_seconds(me));
        for _ in 0..EVENTS {
            raw.recv().await?;
        }
        let raw_rate = Rate::of(EVENTS, started.elapsed(), cpu_seconds(me) - cpu);
        drop(raw);

        let records: Vec<Record> = (data.records.iter().enumerate())
            .map(|(i, (_, p))| record(i, p))
            .collect();
        let mut state = BTreeMap::new();
        let (started, cpu) = (Instant::now(), cpu_seconds(me));
        let mut records = records.into_iter();
        loop {
            let batch: Vec<Record> = records.by_ref().take(BATCH).collect();
            if batch.is_empty() {
                break;
            }
            apply_in_memory(&mut state, batch, config, &actor);
        }
        let core = Rate::of(EVENTS, started.elapsed(), cpu_seconds(me) - cpu);

        let consume = consumer("bench-memory")?;
        let mut state = BTreeMap::new();
        let (started, cpu) = (Instant::now(), cpu_seconds(me));
        let mut done = 0;
        while done < EVENTS {
            let mut batch = Vec::with_capacity(BATCH);
            while batch.len() < BATCH && done + batch.len() < EVENTS {
                batch.push(Record::from_message(&consume.recv().await?));
            }
            done += batch.len();
            apply_in_memory(&mut state, batch, config, &actor);
        }
        let no_durability = Rate::of(EVENTS, started.elapsed(), cpu_seconds(me) - cpu);
        anyhow::Ok([raw_rate, core, no_durability])
    }
    .await;
    pin(me, "0")?;
    result
}
