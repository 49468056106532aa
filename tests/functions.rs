//! User functions (`geostate.v1.Function`) run as real sidecars, the surge examples of
//! the Python SDK (`clients/python`, grpcio) and the Go SDK (`clients/go`, grpc-go):
//!
//! - each, on a Unix socket and on loopback TCP, answers the conformance suite
//!   (`clients/conformance/surge.json`) as the built-in formula does, through the
//!   pricer's own client ([`geostate::function::Sidecar`]);
//! - a sidecar that is slow, answers garbage, fails its batches or is killed fails the
//!   call with its outcome (`timeout`, `invalid`, `refused`, `unavailable`), counted in
//!   `geostate_function_calls_total`;
//! - a node checks its region's sidecar: `Admin/Status` shows it down, healthy once it
//!   serves (its runtime and version), down again once killed;
//! - on the cluster, with the region's pricers stopped, a `geostate pricer` whose sidecar
//!   is not running yet leaves a final window's price pending (its failed calls counted
//!   on its metrics endpoint), then writes it once the Go sidecar serves: the built-in
//!   formula's value, one row in PostgreSQL.

mod common;

use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use common::failover::{Frozen, regions};
use common::sidecars::{Case, Process, Runs, conformance, go_surge, python, ready};
use common::{Node, Topics, add_at, cluster, node_config, now_ms, unique};
use geostate::function::{FunctionError, Sidecar};
use geostate::pb;
use geostate::pb::admin_client::AdminClient;
use geostate::sink::postgres::connect;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_and_go_sidecars_answer_the_conformance_suite_as_the_builtin_formula_does()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let python = python()?;
    let runs = [
        ("python", Runs::python_example(&python)),
        ("go", Runs::Go(go_surge(dir.path())?)),
    ];
    let suite = conformance()?;
    for (runtime, run) in &runs {
        let sock = dir.path().join(format!("{runtime}.sock"));
        let port = common::free_port();
        let listens = [
            (
                format!("unix://{}", sock.display()),
                format!("unix://{}", sock.display()),
            ),
            (
                format!("127.0.0.1:{port}"),
                format!("http://127.0.0.1:{port}"),
            ),
        ];
        for (listen, addr) in listens {
            let _sidecar = run.start(&listen, &[])?;
            let (sidecar, described) = ready(&addr, Duration::from_secs(5)).await?;
            ensure!(
                described.runtime == *runtime,
                "{addr} says it runs {:?}",
                described.runtime
            );
            let mut inputs = 0;
            for Case {
                formula,
                inputs: batch,
                expected,
            } in &suite
            {
                let builtin: Vec<i64> = batch
                    .iter()
                    .map(|i| formula.hundredths(i.values["demand"], i.values["supply"]))
                    .collect();
                ensure!(
                    &builtin == expected,
                    "the built-in formula {formula:?} gives {builtin:?}, the suite {expected:?}"
                );
                let got = sidecar
                    .compute(&formula.params(), batch.clone(), |h| formula.in_range(h))
                    .await?;
                ensure!(
                    &got == expected,
                    "{runtime} at {addr}, {formula:?}: {got:?}, expected {expected:?}"
                );
                inputs += batch.len();
            }
            println!("{runtime} at {addr}: {inputs} inputs as the built-in formula");
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_garbled_failing_or_killed_sidecar_fails_the_call_and_it_is_counted()
-> anyhow::Result<()> {
    let recorder =
        geostate::metrics::install(&geostate::ingest::event::Rejection::DEAD_LETTER_CODES)
            .context("the metrics recorder")?;
    let dir = tempfile::tempdir()?;
    let python = python()?;
    let Case {
        formula,
        inputs: batch,
        ..
    } = conformance()?.swap_remove(0);
    let faulty = Runs::faulty(&python);
    let call = |sidecar: Sidecar| {
        let batch = batch.clone();
        async move {
            let started = Instant::now();
            let result = sidecar
                .compute(&formula.params(), batch, |h| formula.in_range(h))
                .await;
            (result, started.elapsed())
        }
    };
    for mode in ["slow", "garbage", "raise"] {
        let addr = format!("unix://{}/{mode}.sock", dir.path().display());
        let _sidecar = faulty.start(&addr, &["--mode", mode])?;
        let (sidecar, _) = ready(&addr, Duration::from_secs(1)).await?;
        let (result, took) = call(sidecar).await;
        match (mode, &result) {
            ("slow", Err(FunctionError::Timeout { .. })) => {
                ensure!(took < Duration::from_secs(3), "a 1 s timeout took {took:?}")
            }
            ("garbage", Err(FunctionError::Invalid { reason, .. })) => {
                ensure!(reason.contains("out of range"), "{reason}")
            }
            ("raise", Err(FunctionError::Refused { reason, .. })) => {
                ensure!(reason.contains("fails every batch"), "{reason}")
            }
            _ => bail!("a {mode} sidecar: {result:?}"),
        }
        println!("{mode}: {}", result.unwrap_err());
    }
    // a sidecar killed between two calls
    let addr = format!("unix://{}/killed.sock", dir.path().display());
    let mut sidecar = Runs::python_example(&python).start(&addr, &[])?;
    let (client, _) = ready(&addr, Duration::from_secs(1)).await?;
    ensure!(call(client.clone()).await.0.is_ok(), "the first call");
    sidecar.0.kill()?;
    sidecar.0.wait()?;
    let (result, _) = call(client).await;
    ensure!(
        matches!(result, Err(FunctionError::Unavailable { .. })),
        "a killed sidecar: {result:?}"
    );
    let text = recorder.render();
    for outcome in ["ok", "timeout", "invalid", "refused", "unavailable"] {
        let line =
            format!("geostate_function_calls_total{{function=\"surge\",outcome=\"{outcome}\"}} 1");
        ensure!(text.contains(&line), "no {line:?} in the metrics:\n{text}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_shows_its_sidecar_s_health_in_status() -> anyhow::Result<()> {
    let cluster = cluster()?;
    let kafka = cluster.regions["us-east-1"].kafka.clone();
    let topics = Topics::create(&kafka, "function-health", 1).await?;
    let dir = tempfile::tempdir()?;
    let sock = dir.path().join("surge.sock");
    let addr = format!("unix://{}", sock.display());
    let mut node = Node::configure(dir.path(), &kafka, &topics)?;
    node.set("pricing.function", &format!("{addr:?}"));
    node.start().await?;
    let mut admin = AdminClient::connect(node.grpc.clone()).await?;
    let mut health = async || -> anyhow::Result<pb::FunctionStatus> {
        let status = admin.status(pb::StatusRequest {}).await?.into_inner();
        status
            .functions
            .into_iter()
            .next()
            .context("no function in Status")
    };
    let down = health().await?;
    ensure!(
        !down.healthy && down.addr == addr,
        "before the sidecar runs: {down:?}"
    );
    let sidecar = Runs::Go(go_surge(dir.path())?).start(&addr, &[])?;
    let deadline = Instant::now() + Duration::from_secs(10);
    let up = loop {
        let now = health().await?;
        if now.healthy {
            break now;
        }
        ensure!(
            Instant::now() < deadline,
            "10 s after the sidecar started: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    ensure!(
        (up.name.as_str(), up.runtime.as_str(), up.version.as_str()) == ("surge", "go", "1"),
        "{up:?}"
    );
    drop(sidecar);
    let deadline = Instant::now() + Duration::from_secs(10);
    let gone = loop {
        let now = health().await?;
        if !now.healthy {
            break now;
        }
        ensure!(
            Instant::now() < deadline,
            "10 s after the sidecar was killed: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    println!("down: {}; up: {up:?}; killed: {}", down.error, gone.error);
    node.terminate(Duration::from_secs(30)).await
}

const MIN: u64 = 60_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_price_stays_pending_while_the_sidecar_is_down_then_is_written_once_by_it()
-> anyhow::Result<()> {
    let cluster = cluster()?;
    let pg = cluster
        .postgres
        .clone()
        .context("the cluster runs PostgreSQL")?;
    let (mut regions, lease) = regions(&cluster).await?;
    let name = regions[0].name.clone();
    let config = node_config(&cluster.regions[&name])?;
    let pricing = config.pricing.clone().context("the region files price")?;
    // the region's own pricers stand still meanwhile: this test's pricer alone prices
    let _frozen = cluster
        .regions
        .values()
        .map(|r| {
            let pid = r
                .pricer
                .as_ref()
                .and_then(|p| p.pid)
                .context("a pricer pid")?;
            Frozen::new(pid)
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let dir = tempfile::tempdir()?;
    let go = go_surge(dir.path())?;
    let addr = format!("unix://{}/surge.sock", dir.path().display());
    // a geohash whose price this region holds
    let label = unique("udf");
    let gh = (0..)
        .map(|i| format!("{label}-{i}"))
        .find(|gh| {
            let shard = lease.shard_of_key(&format!("{}{gh}", pricing.prices));
            lease.home_of(shard).is_some_and(|h| h.as_str() == name)
        })
        .expect("every region is some shard's home");
    let (demand, supply, price) = (
        format!("{}{gh}", pricing.demand),
        format!("{}{gh}", pricing.supply),
        format!("{}{gh}", pricing.prices),
    );
    if now_ms() % MIN > MIN - 20_000 {
        tokio::time::sleep(Duration::from_millis(MIN - now_ms() % MIN + 1_000)).await;
    }
    let start = now_ms() / MIN * MIN;
    for (key, n) in [(&demand, 17), (&supply, 10)] {
        for _ in 0..n {
            regions[0].state.update(add_at(key, now_ms())).await?;
        }
    }
    // `geostate pricer` as the cluster runs it, with the function and a metrics endpoint
    let region = &cluster.regions[&name];
    let metrics = format!("127.0.0.1:{}", common::free_port());
    let _pricer = Process(
        std::process::Command::new(env!("CARGO_BIN_EXE_geostate"))
            .arg("pricer")
            .arg("--config")
            .arg(region.config.as_ref().context("the region's config")?)
            .args(common::set_args(&region.set))
            .args(["--set", &format!("pricing.function={addr:?}")])
            .args([
                "--addr",
                &format!("http://{}", region.grpc.as_ref().context("grpc")?),
            ])
            .args(["--metrics-listen", &metrics])
            .stdin(std::process::Stdio::null())
            .spawn()?,
    );
    let calls = |outcome: &str| {
        let line =
            format!("geostate_function_calls_total{{function=\"surge\",outcome=\"{outcome}\"}}");
        common::metric(&metrics, &line).map(|v| v.unwrap_or(0.0))
    };
    // after the window, a trickle moves event time on until the window is final: the
    // pricer then calls the sidecar, which is not running
    let final_at = loop {
        let t = now_ms();
        if t >= start + MIN {
            // in every region: a window is final once event time passed it in each
            for region in regions.iter_mut() {
                for key in [&demand, &supply] {
                    let _ = region.state.update(add_at(key, t)).await;
                }
            }
            let latest = regions[0]
                .state
                .get(pb::GetRequest {
                    key: demand.clone(),
                    leaseholder: false,
                    window: Some(pb::WindowSelector {
                        which: Some(pb::window_selector::Which::LatestFinal(true)),
                    }),
                })
                .await;
            if latest.is_ok_and(|v| v.into_inner().window.is_some_and(|w| w.start_ms >= start)) {
                break Instant::now();
            }
        }
        ensure!(
            now_ms() < start + 4 * MIN,
            "the window not final 3 min after its end"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let get_price = async |regions: &mut Vec<common::failover::Region>| {
        regions[0]
            .state
            .get(pb::GetRequest {
                key: price.clone(),
                leaseholder: true,
                window: None,
            })
            .await
    };
    // pending while the sidecar is down: once the pricer counted a failed call for the
    // final window (its calls fail, retried with a backoff)
    let deadline = Instant::now() + Duration::from_secs(30);
    let failed = loop {
        let failed = calls("unavailable")?;
        if failed >= 1.0 || Instant::now() > deadline {
            break failed;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    ensure!(
        failed >= 1.0,
        "no failed call counted while the sidecar was down"
    );
    let before = get_price(&mut regions).await;
    ensure!(
        before
            .as_ref()
            .is_err_and(|s| s.code() == tonic::Code::NotFound),
        "priced with no sidecar running: {before:?}"
    );
    let _sidecar = Runs::Go(go).start(&addr, &[])?;
    let started = Instant::now();
    let value = loop {
        if let Ok(v) = get_price(&mut regions).await
            && let Some(pb::value::Value::Register(bytes)) = v.into_inner().value
        {
            break serde_json::from_slice::<serde_json::Value>(&bytes)?;
        }
        ensure!(
            started.elapsed() < Duration::from_secs(60),
            "no price 60 s after the sidecar started"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let want = pricing.formula.hundredths(17, 10);
    ensure!(
        value["start_ms"] == start
            && (value["value"].as_f64().unwrap_or(0.0) * 100.0).round() as i64 == want,
        "{price} = {value}, expected window {start} at {want} hundredths"
    );
    println!(
        "{price}: {value}, {:?} after the window was final, {:?} after the sidecar started",
        final_at.elapsed(),
        started.elapsed()
    );
    // one row, the formula's value, written by the region's sink
    let db = connect(&pg.url, "tests/functions").await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let rows = db
            .query(
                "SELECT value::float8 FROM geostate_outputs WHERE key = $1 AND window_start_ms = $2",
                &[&price, &(start as i64)],
            )
            .await?;
        if let [row] = rows.as_slice() {
            let v: f64 = row.get(0);
            ensure!((v * 100.0).round() as i64 == want, "the row holds {v}");
            break;
        }
        ensure!(rows.len() < 2, "{} rows for one window", rows.len());
        ensure!(Instant::now() < deadline, "no row 60 s after the price");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    ensure!(calls("ok")? >= 1.0, "no call counted ok");
    println!(
        "calls: {failed} unavailable while the sidecar was down, {} ok; {} geohashes pending at the end",
        calls("ok")?,
        common::metric(&metrics, "geostate_pricer_pending_geohashes ")?.unwrap_or(0.0)
    );
    Ok(())
}
