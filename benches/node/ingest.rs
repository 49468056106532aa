//! The node's ingest of a pre-loaded topic, and the ceilings it is compared with.

use super::*;

/// The geostate node over `data`'s topic, exactly-once into RocksDB, on the system under
/// test's core.
pub(crate) async fn geostate(
    kafka: &str,
    data: &Dataset,
    dir: &Path,
) -> anyhow::Result<(Rate, f64)> {
    let run = geostate_on(kafka, data, dir, SUT_CORE, None).await?;
    Ok((run.rate, run.deltas_per_event))
}

/// A node's run over a dataset.
pub(crate) struct NodeRun {
    pub(crate) rate: Rate,
    pub(crate) deltas_per_event: f64,
    /// CPU-seconds the region's Kafka broker took over the same span (serving the node's
    /// fetches, taking its deltas and their transactions), per event.
    pub(crate) broker_cpu_per_event: f64,
    pub(crate) parts: Parts,
}

/// How a node's partitions applied what they read, from its metrics at the end of a run.
#[derive(Clone, Copy, Default)]
pub(crate) struct Parts {
    /// Events per part a partition applied and committed at once (one RocksDB write batch).
    pub(crate) events: f64,
    /// Seconds per part from its first record's arrival to its partition's writer: the
    /// wait behind the parts before it.
    pub(crate) wait: f64,
    /// Seconds per part applying and committing it.
    pub(crate) work: f64,
    /// Seconds applying and committing over all partitions, per second of the run: how
    /// many partitions were at work at once, on average.
    pub(crate) busy: f64,
}

/// The geostate node over `data`'s topic on `cores` (a `taskset` list) from its start, so
/// that its runtime has a worker thread per core; `binary` instead of this build's.
pub(crate) async fn geostate_on(
    kafka: &str,
    data: &Dataset,
    dir: &Path,
    cores: &str,
    binary: Option<&Path>,
) -> anyhow::Result<NodeRun> {
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
    let broker = common::cluster()?.regions["us-east-1"].kafka_pid;
    let (rate, broker_cpu_per_event) = Probe::Node(&node)
        .follow_beside(&[pid], &[broker], EVENTS, Duration::from_secs(600))
        .await
        .map_err(|e| {
            let status = node.exit_status();
            if let Some(keep) = std::env::var_os("GEOSTATE_BENCH_KEEP_METRICS") {
                let _ = std::fs::copy(&node.log, Path::new(&keep).join("failed-node.log"));
            }
            e.context(format!(
                "the node ({status:?}); its log: {}",
                node.log_tail()
            ))
        })?;
    let metrics = common::http_get(&node.metrics, "/metrics")?;
    // the value of one series (a name and its labels, as exposed)
    let value = |series: &str| {
        (metrics.lines())
            .filter_map(|l| l.rsplit_once(' '))
            .find(|(s, _)| *s == series)
            .and_then(|(_, v)| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    if let Some(keep) = std::env::var_os("GEOSTATE_BENCH_KEEP_METRICS") {
        // the node's metrics at the end of each run, for a closer look
        let name = dir
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        std::fs::create_dir_all(&keep)?;
        std::fs::write(Path::new(&keep).join(format!("{name}.prom")), &metrics)?;
    }
    let shipped = value("geostate_deltas_shipped_total");
    let count = value("geostate_batch_events_count").max(1.0);
    let stage = |stage: &str| {
        value(&format!(
            "geostate_write_stage_seconds_sum{{stage=\"{stage}\"}}"
        ))
    };
    let work = stage("apply") + stage("commit");
    let parts = Parts {
        events: value("geostate_batch_events_sum") / count,
        wait: stage("batch") / count,
        work: work / count,
        busy: work / (EVENTS as f64 / rate.events_per_second.max(1e-9)),
    };
    node.kill9();
    // a run over 1M keys leaves hundreds of MB: the cores section makes 24 of them
    let _ = std::fs::remove_dir_all(dir.join("data"));
    let _ = std::fs::remove_dir_all(dir.join("checkpoints"));
    Ok(NodeRun {
        rate,
        deltas_per_event: shipped / EVENTS as f64,
        broker_cpu_per_event,
        parts,
    })
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
