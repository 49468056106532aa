//! `Update` ack latency at shares of the node's maximum next to Kafka's floor, and `Get` throughput and latency.

use super::*;

/// Open-loop latencies at `rate`/s for `LEVEL_SECONDS`: geostate `Update` acks.
pub(crate) async fn update_latencies(
    clients: &[pb::state_client::StateClient<tonic::transport::Channel>],
    rate: u64,
) -> anyhow::Result<(Vec<Duration>, usize)> {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..rate * LEVEL_SECONDS {
        let scheduled = schedule(started, rate, i);
        let mut client = clients[i as usize % clients.len()].clone();
        tokio::time::sleep_until(scheduled.into()).await;
        tasks.push(tokio::spawn(async move {
            let request = pb::UpdateRequest {
                key: format!("trips/lat{:04}", i % 1000),
                op: Some(pb::update_request::Op::Add(1)),
                id: String::new(),
                event_time_ms: 0,
            };
            client.update(request).await.map(|_| scheduled.elapsed())
        }));
    }
    let mut latencies = Vec::new();
    let mut errors = 0;
    for t in tasks {
        match t.await? {
            Ok(d) => latencies.push(d),
            Err(_) => errors += 1,
        }
    }
    latencies.sort();
    Ok((latencies, errors))
}

/// The node's maximum `Update` rate: 64 requests in flight for `LEVEL_SECONDS`.
pub(crate) async fn max_update_rate(
    clients: &[pb::state_client::StateClient<tonic::transport::Channel>],
) -> anyhow::Result<f64> {
    let deadline = Instant::now() + Duration::from_secs(LEVEL_SECONDS);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..64 {
        let mut client = clients[w % clients.len()].clone();
        tasks.push(tokio::spawn(async move {
            let mut acked = 0u64;
            while Instant::now() < deadline {
                let request = pb::UpdateRequest {
                    key: format!("trips/lat{:04}", (w as u64 * 7919 + acked) % 1000),
                    op: Some(pb::update_request::Op::Add(1)),
                    id: String::new(),
                    event_time_ms: 0,
                };
                if client.update(request).await.is_ok() {
                    acked += 1;
                }
            }
            acked
        }));
    }
    let mut acked = 0;
    for t in tasks {
        acked += t.await?;
    }
    Ok(acked as f64 / started.elapsed().as_secs_f64())
}

/// When request `i` of an open loop at `rate`/s starting at `started` is due.
pub(crate) fn schedule(started: Instant, rate: u64, i: u64) -> Instant {
    started + Duration::from_micros(i * 1_000_000 / rate)
}

/// Kafka's own floor on the same broker: open-loop produce (idempotent, acks=all) to a
/// fresh topic at `rate`/s, latency to the consumer's receipt.
pub(crate) async fn kafka_latencies(kafka: &str, rate: u64) -> anyhow::Result<Vec<Duration>> {
    let topic = common::unique("bench-floor");
    create_topic(kafka, &topic, 1).await?;
    let producer: ThreadedProducer<DefaultProducerContext> =
        geostate_jepsen::control::kafka_config(kafka)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", "0")
            .create()?;
    let consumer: BaseConsumer = geostate_jepsen::control::kafka_config(kafka)
        .set("group.id", common::unique("bench-floor"))
        .set("enable.auto.commit", "false")
        .set("fetch.wait.max.ms", "10")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&topic, 0, Offset::Beginning)?;
    consumer.assign(&tpl)?;
    // A thread of its own polls the consumer. The clock starts once a warm-up record went
    // through: a new topic's metadata and the first fetch are not part of the floor.
    let total = rate * LEVEL_SECONDS;
    let (warm_tx, warm_rx) = std::sync::mpsc::channel::<()>();
    let (start_tx, start_rx) = std::sync::mpsc::channel::<Instant>();
    let receiver = std::thread::spawn(move || {
        let next = || loop {
            if let Some(message) = consumer.poll(Duration::from_millis(100)) {
                return message.map(|m| m.detach());
            }
        };
        while next()?.payload() != Some(b"warm-up") {}
        let _ = warm_tx.send(());
        let started = start_rx.recv()?;
        let mut latencies = Vec::with_capacity(total as usize);
        while (latencies.len() as u64) < total {
            let message = next()?;
            let i: u64 = std::str::from_utf8(message.payload().unwrap_or(b""))?.parse()?;
            latencies.push(schedule(started, rate, i).elapsed());
        }
        anyhow::Ok(latencies)
    });
    // The producer runs on a thread of its own too, sleeping until each send is due.
    let sender = std::thread::spawn(move || {
        let send = |payload: &str| {
            producer
                .send(BaseRecord::to(&topic).key(payload).payload(payload))
                .map_err(|(e, _)| e)
        };
        send("warm-up")?;
        producer.flush(Duration::from_secs(30))?;
        warm_rx
            .recv_timeout(Duration::from_secs(30))
            .context("the floor's consumer got no warm-up record within 30 s")?;
        let started = Instant::now();
        let _ = start_tx.send(started);
        for i in 0..total {
            let due = schedule(started, rate, i);
            std::thread::sleep(due.saturating_duration_since(Instant::now()));
            send(&i.to_string())?;
        }
        producer.flush(Duration::from_secs(30))?;
        anyhow::Ok(())
    });
    tokio::task::spawn_blocking(move || sender.join())
        .await?
        .map_err(|_| anyhow::anyhow!("the floor's producer thread panicked"))??;
    let mut latencies = tokio::task::spawn_blocking(move || receiver.join())
        .await?
        .map_err(|_| anyhow::anyhow!("the floor's consumer thread panicked"))??;
    latencies.sort();
    Ok(latencies)
}

/// `Get`s of random latency keys on `streams` concurrent streams for `GET_SECONDS`.
pub(crate) async fn gets(node: &Node, streams: usize) -> anyhow::Result<Vec<Duration>> {
    let mut channels = Vec::new();
    for _ in 0..streams.min(10) {
        channels.push(node.state().await?);
    }
    let deadline = Instant::now() + Duration::from_secs(GET_SECONDS);
    let mut tasks = Vec::new();
    for s in 0..streams {
        let mut client = channels[s % channels.len()].clone();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut rng = Rng(0x2545_f491_4f6c_dd1d ^ s as u64);
            while Instant::now() < deadline {
                let key = format!("trips/lat{:04}", rng.below(1000));
                let t = Instant::now();
                if client
                    .get(pb::GetRequest {
                        key,
                        ..Default::default()
                    })
                    .await
                    .is_ok()
                {
                    latencies.push(t.elapsed());
                }
            }
            latencies
        }));
    }
    let mut latencies = Vec::new();
    for t in tasks {
        latencies.extend(t.await?);
    }
    latencies.sort();
    Ok(latencies)
}

/// Ingest load for the `Get` runs: `rate` events/s into the node's updates topic until
/// `stop` is set; answers the events produced.
pub(crate) async fn ingest_load(
    kafka: String,
    topic: String,
    rate: u64,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> anyhow::Result<u64> {
    let producer = common::producer(&kafka)?;
    let started = Instant::now();
    let mut rng = Rng(7);
    let mut sent = 0u64;
    let mut deliveries = Vec::new();
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        tokio::time::sleep_until(schedule(started, rate, sent).into()).await;
        let key = format!("trips/load/cell-{:05}", rng.below(10_000));
        let payload = format!(r#"{{"key":"{key}","add":1}}"#);
        deliveries.push(
            producer
                .send_result(FutureRecord::to(&topic).key(&key).payload(&payload))
                .map_err(|(e, _)| e)?,
        );
        sent += 1;
    }
    for d in deliveries {
        d.await?.map_err(|(e, _)| e)?;
    }
    Ok(sent)
}

pub(crate) fn ms_of(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e5).round() / 100.0
}

pub(crate) fn ratio(a: f64, b: f64) -> String {
    format!("{:.2}", a / b.max(1e-9))
}

/// Sections 3 and 4 on a fresh node: `Update` latency at shares of the node's own maximum
/// next to Kafka's floor, then `Get`s without and with `load_rate` events/s of ingest.
pub(crate) async fn latency_and_gets(
    kafka: &str,
    work: &Path,
    load_rate: u64,
) -> anyhow::Result<Value> {
    // 3. Update latency at shares of the node's own maximum, next to Kafka's floor
    let dir = work.join("latency");
    std::fs::create_dir_all(&dir)?;
    let topics = Topics::create(kafka, "bench-latency", PARTITIONS).await?;
    let mut node = Node::configure(&dir, kafka, &topics)?;
    // another build's node instead of this one's, to compare builds run by run
    if let Some(binary) = std::env::var_os("GEOSTATE_BENCH_NODE") {
        node.binary = binary.into();
    }
    let pid = node.start().await?;
    pin(pid, SUT_CORE)?;
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(node.state().await?);
    }
    let max = max_update_rate(&clients).await?;
    println!(
        "## Update ack latency, open loop ({LEVEL_SECONDS} s per level; the node's maximum: {max:.0} acknowledged Updates/s with 64 in flight)"
    );
    println!();
    println!(
        "Latency is counted from each request's scheduled send time (no coordinated omission). The Kafka floor: an idempotent acks=all producer (linger 0) to a consumer on the same broker, same rates, same schedule, both clients on the node's core while the node is idle (on core 0 beside the brokers they fell seconds behind)."
    );
    println!();
    println!(
        "| load | rate/s | geostate p50 | p99 | p99.9 | errors | Kafka produce→consume p50 | p99 | p99.9 |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let (mut ours_points, mut floor_points) = (Vec::new(), Vec::new());
    let (mut stages, mut half) = (None, 10);
    for level in LEVELS {
        let rate = (max * level as f64 / 100.0).max(10.0) as u64;
        let before = common::http_get(&node.metrics, "/metrics")?;
        let (lat, errors) = update_latencies(&clients, rate).await?;
        if level == STAGES_AT {
            let after = common::http_get(&node.metrics, "/metrics")?;
            stages = Some(stage_quantiles(&before, &after));
            half = rate;
        }
        // the floor's clients run where the node runs (it is idle meanwhile)
        let me = std::process::id();
        pin(me, SUT_CORE)?;
        let floor = kafka_latencies(kafka, rate).await;
        pin(me, "0")?;
        let floor = floor?;
        let q = |l: &[Duration], p: f64| ms_of(percentile(l, p));
        println!(
            "| {level} % | {rate} | {:.2} ms | {:.2} ms | {:.2} ms | {errors} | {:.2} ms | {:.2} ms | {:.2} ms |",
            q(&lat, 0.5),
            q(&lat, 0.99),
            q(&lat, 0.999),
            q(&floor, 0.5),
            q(&floor, 0.99),
            q(&floor, 0.999)
        );
        ours_points.push(
            json!({"load_percent": level, "rate": rate, "errors": errors,
            "p50_ms": q(&lat, 0.5), "p99_ms": q(&lat, 0.99), "p99_9_ms": q(&lat, 0.999)}),
        );
        floor_points.push(json!({"load_percent": level, "rate": rate,
            "p50_ms": q(&floor, 0.5), "p99_ms": q(&floor, 0.99), "p99_9_ms": q(&floor, 0.999)}));
    }
    println!();
    let stages = stages.unwrap_or_default();
    println!(
        "Where an `Update`'s time goes at {STAGES_AT} % (the node's `geostate_write_stage_seconds`, quantiles interpolated within its buckets; `fetch` is from the record's millisecond timestamp; `applied` spans `fetch` to `commit` as each request waited for them):"
    );
    println!();
    println!("| stage | count | p50 | p99 |");
    println!("|---|---:|---:|---:|");
    for s in &stages {
        println!(
            "| {} | {} | {:.2} ms | {:.2} ms |",
            s.stage, s.count, s.p50_ms, s.p99_ms
        );
    }
    println!();

    // 4. Get at 1/10/100 streams, without and with ingest load
    println!(
        "## Get ({GET_SECONDS} s per run; keys written by the latency runs; ingest load: {load_rate} events/s into the node's updates topic, a quarter of its measured ingest rate)"
    );
    println!();
    println!(
        "| streams | ingest load | reads/s | p50 | p99 | node CPU | core 0 busy (brokers, clients, load) |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|");
    let mut get_json = Vec::new();
    for loaded in [false, true] {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let load = loaded.then(|| {
            tokio::spawn(ingest_load(
                kafka.to_owned(),
                topics.updates.clone(),
                load_rate,
                stop.clone(),
            ))
        });
        for streams in GET_STREAMS {
            let (started, cpu, core0) = (Instant::now(), cpu_seconds(pid), core_jiffies(0));
            let lat = gets(&node, streams).await?;
            let busy = (cpu_seconds(pid) - cpu) / started.elapsed().as_secs_f64();
            let core0_after = core_jiffies(0);
            let core0 = (core0_after.0 - core0.0) as f64 / (core0_after.1 - core0.1).max(1) as f64;
            let rate = lat.len() as f64 / GET_SECONDS as f64;
            println!(
                "| {streams} | {} | {rate:.0} | {:.2} ms | {:.2} ms | {:.0} % | {:.0} % |",
                if loaded { "yes" } else { "no" },
                ms_of(percentile(&lat, 0.5)),
                ms_of(percentile(&lat, 0.99)),
                busy * 100.0,
                core0 * 100.0
            );
            get_json.push(
                json!({"streams": streams, "ingest_load": loaded, "reads_per_second": rate.round(),
                "p50_ms": ms_of(percentile(&lat, 0.5)), "p99_ms": ms_of(percentile(&lat, 0.99)),
                "node_cpu_share": (busy * 100.0).round() / 100.0,
                "core0_busy_share": (core0 * 100.0).round() / 100.0}),
            );
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(load) = load {
            load.await??;
        }
    }
    // 3b. TLS at half the maximum, beside this node
    let tls = super::tls::tls_cost(kafka, work, half, &clients).await?;
    // 3c. one caller flooding beside another, with and without per-caller limits
    let limits = super::limits::flood_cost(kafka, work, max, &node.grpc, &clients).await?;
    node.kill9();

    Ok(json!({
        "tls": tls,
        "limits": limits,
        "latency": [
            {"name": "geostate Update ack", "max_rate": max.round(), "points": ours_points},
            {"name": "Kafka produce→consume", "points": floor_points},
        ],
        "get": get_json,
        "update_stages": stages.iter().map(|s| json!({"load_percent": STAGES_AT, "stage": s.stage,
            "count": s.count, "p50_ms": s.p50_ms, "p99_ms": s.p99_ms})).collect::<Vec<_>>(),
    }))
}

/// The load level whose write stages are reported.
const STAGES_AT: u32 = 50;

/// One write stage's figures between two scrapes of the node's metrics.
pub(crate) struct StageFigures {
    stage: String,
    count: u64,
    p50_ms: f64,
    p99_ms: f64,
}

/// Per stage of `geostate_write_stage_seconds`, in the path's order, the p50 and p99 of
/// what was recorded between the `before` and `after` scrapes.
pub(crate) fn stage_quantiles(before: &str, after: &str) -> Vec<StageFigures> {
    use common::histogram;
    const ORDER: [&str; 6] = ["produce", "fetch", "batch", "apply", "commit", "applied"];
    let metric = "geostate_write_stage_seconds";
    let before = histogram::buckets(before, metric, "stage", &[]);
    let after = histogram::buckets(after, metric, "stage", &[]);
    ORDER
        .iter()
        .filter_map(|&stage| {
            let run = histogram::since(before.get(stage), after.get(stage)?);
            Some(StageFigures {
                stage: stage.to_string(),
                count: histogram::count(&run),
                p50_ms: histogram::quantile(&run, 0.5) * 1000.0,
                p99_ms: histogram::quantile(&run, 0.99) * 1000.0,
            })
        })
        .collect()
}
