//! The peers measured beside the node: Kafka Streams (exactly-once and at-least-once) and a Redis `INCRBY` consumer.

use super::*;

/// The Kafka Streams peer at `guarantee` over `data`'s topic.
pub(crate) async fn kafka_streams(
    kafka: &str,
    data: &Dataset,
    guarantee: &str,
    dir: &Path,
) -> anyhow::Result<Option<Rate>> {
    let Ok(cp) = std::env::var("KSTREAMS_CP") else {
        return Ok(None);
    };
    let app = common::unique(&format!("kstreams-{guarantee}"));
    let output = format!("{app}.counts");
    create_topic(kafka, &output, PARTITIONS).await?;
    let log = std::fs::File::create(dir.join(format!("{app}.log")))?;
    let java = std::env::var("JAVA_HOME").map_or("java".into(), |h| format!("{h}/bin/java"));
    let child = on_sut_core(&java)
        .args(["-Xms512m", "-Xmx1g", "-cp", &cp, "GroupByKeyCount", kafka])
        .args([&data.topic.updates, &output, &app, guarantee])
        .arg(dir.join(&app))
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("starting the Kafka Streams peer")?;
    let peer = Peer(child);
    let probe = Probe::group(kafka, &app, &data.topic.updates, PARTITIONS)?;
    let rate = probe
        .follow(&[peer.0.id()], EVENTS, Duration::from_secs(300))
        .await;
    drop(peer);
    rate.map(Some)
        .with_context(|| format!("Kafka Streams ({guarantee}); see {}", dir.display()))
}

/// The Redis baseline over `data`'s topic: a Redis server with AOF `everysec` and a
/// consumer (this benchmark's binary again) applying pipelined `INCRBY`s, committing the
/// offsets after each pipeline's replies (at least once).
pub(crate) async fn redis(kafka: &str, data: &Dataset, dir: &Path) -> anyhow::Result<Option<Rate>> {
    let Ok(server) = std::env::var("REDIS_SERVER") else {
        return Ok(None);
    };
    let port = common::free_port();
    let log = std::fs::File::create(dir.join("redis.log"))?;
    let redis_dir = dir.join(common::unique("redis"));
    std::fs::create_dir_all(&redis_dir)?;
    let server = Peer(
        on_sut_core(&server)
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args([
                "--appendonly",
                "yes",
                "--appendfsync",
                "everysec",
                "--save",
                "",
            ])
            .arg("--dir")
            .arg(&redis_dir)
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting redis-server")?,
    );
    let addr = format!("127.0.0.1:{port}");
    let until = Instant::now() + Duration::from_secs(10);
    while tokio::net::TcpStream::connect(&addr).await.is_err() {
        if Instant::now() > until {
            bail!("redis-server did not listen on {addr}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let group = common::unique("redis-consumer");
    let spec = format!("{kafka},{},{group},{addr}", data.topic.updates);
    let consumer = Peer(
        on_sut_core(std::env::current_exe()?.to_str().context("exe path")?)
            .env("GEOSTATE_BENCH_REDIS_CONSUMER", spec)
            .stderr(std::fs::File::create(dir.join("redis-consumer.log"))?)
            .spawn()?,
    );
    let probe = Probe::group(kafka, &group, &data.topic.updates, PARTITIONS)?;
    let rate = probe
        .follow(
            &[server.0.id(), consumer.0.id()],
            EVENTS,
            Duration::from_secs(300),
        )
        .await?;
    // every counter must hold what the events added, or the rate means nothing
    let mut sums: BTreeMap<String, i64> = (data.records.iter().take(2000))
        .map(|(key, _)| (key.clone(), 0))
        .collect();
    for (key, payload) in &data.records {
        if let Some(sum) = sums.get_mut(key)
            && let Ok(Update { op: Op::Add(n), .. }) = Update::decode(RecordFormat::Json, payload)
        {
            *sum += n;
        }
    }
    tokio::task::spawn_blocking(move || check_redis(&addr, &sums)).await??;
    Ok(Some(rate))
}

/// Every counter in `expected` holds its sum in the Redis server at `addr`.
pub(crate) fn check_redis(addr: &str, expected: &BTreeMap<String, i64>) -> anyhow::Result<()> {
    let mut conn = TcpStream::connect(addr)?;
    let mut reader = BufReader::new(conn.try_clone()?);
    for (key, expected) in expected {
        conn.write_all(&resp(&["GET", key]))?;
        let mut header = String::new();
        reader.read_line(&mut header)?;
        let got = if header.starts_with("$-1") {
            0
        } else {
            let mut value = String::new();
            reader.read_line(&mut value)?;
            value.trim().parse::<i64>()?
        };
        anyhow::ensure!(
            got == *expected,
            "redis baseline: {key} is {got}, the events add {expected}"
        );
    }
    Ok(())
}

/// A Redis command in RESP.
pub(crate) fn resp(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
    }
    out
}

/// The Redis baseline's consumer (`GEOSTATE_BENCH_REDIS_CONSUMER=kafka,topic,group,redis`):
/// up to `BATCH` records per pipeline, one `INCRBY` each, offsets committed after the
/// replies. Runs until killed.
pub(crate) fn redis_consumer(spec: &str) -> anyhow::Result<()> {
    let [kafka, topic, group, addr] = spec.split(',').collect::<Vec<_>>()[..] else {
        bail!("GEOSTATE_BENCH_REDIS_CONSUMER={spec}: want kafka,topic,group,redis");
    };
    let consumer: BaseConsumer = geostate_jepsen::control::kafka_config(kafka)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .create()?;
    consumer.subscribe(&[topic])?;
    let mut conn = TcpStream::connect(addr)?;
    conn.set_nodelay(true)?;
    let mut replies = BufReader::new(conn.try_clone()?);
    let mut line = String::new();
    loop {
        let mut pipeline = Vec::new();
        let mut n = 0;
        while n < BATCH {
            let wait = if n == 0 {
                Duration::from_millis(100)
            } else {
                Duration::ZERO
            };
            let Some(message) = consumer.poll(wait) else {
                break;
            };
            let message = message?;
            let update = Update::decode(RecordFormat::Json, message.payload().unwrap_or(&[]));
            if let Ok(Update {
                key,
                op: Op::Add(add),
                ..
            }) = update
            {
                pipeline.extend(resp(&["INCRBY", &key, &add.to_string()]));
                n += 1;
            }
        }
        if n == 0 {
            continue;
        }
        conn.write_all(&pipeline)?;
        for _ in 0..n {
            line.clear();
            replies.read_line(&mut line)?;
            anyhow::ensure!(line.starts_with(':'), "redis answered {line:?}");
        }
        consumer.commit_consumer_state(CommitMode::Sync)?;
    }
}
